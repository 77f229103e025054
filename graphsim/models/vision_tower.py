"""Vision towers of the Hugging Face multimodal families the generic decoder loads: their weights (inventory group
``vision``) and their ``vision`` stage in prefill, composed from the builder's ops like the trunk.

Qwen3-VL (dense ``qwen3_vl`` and MoE ``qwen3_vl_moe``) and Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``): the module layout
of transformers' ``modeling_qwen3_vl.py`` (``Qwen3VLVisionModel``; Qwen3.5's vision model is the same with
``deepstack_visual_indexes = []``), every size read from ``vision_config``:

* ``patch_embed.proj``: Conv3d(in_channels -> hidden, kernel = stride = (temporal_patch, patch, patch), bias) —
  a GEMM of in_channels·temporal_patch·patch² -> hidden per patch;
* ``pos_embed``: Embedding(num_position_embeddings, hidden), bilinearly interpolated to the patch grid;
* ``depth`` blocks: LayerNorm ``norm1`` -> ``attn.qkv`` Linear(h, 3h, bias) -> 2-D RoPE -> bidirectional attention
  within each image -> ``attn.proj`` Linear(h, h, bias); LayerNorm ``norm2`` -> ``mlp.linear_fc1`` Linear(h, inter,
  bias) -> GELU(tanh) -> ``mlp.linear_fc2`` Linear(inter, h, bias) (a plain two-matrix MLP, not gated);
* ``merger``: LayerNorm(h) on each patch, concatenate merge² neighbours (4h), ``linear_fc1`` Linear(4h, 4h) -> GELU
  -> ``linear_fc2`` Linear(4h, out_hidden_size): one image token per merge x merge patches;
* ``deepstack_merger_list``: one merger per ``deepstack_visual_indexes`` entry, on that block's output, with its
  LayerNorm after the concatenation (4h); their outputs are added to the first decoder layers' hidden states at the
  image positions.

Check: Qwen3-VL-8B's vision_config gives 576,388,336 parameters, the "Vision model (ViT) parameters 576.4M" counted
from the checkpoint's tensors (OpenExplorer/Qwen3-VL-8B-Instruct model card).

Kimi K2.5 (``kimi_k25``: Kimi K2.5, K2.6, K2.7-Code): MoonViT-3D and its ``patchmerger`` projector, the module layout
of vLLM's ``kimi_k25_vit.py`` (``MoonViT3dPretrainedModel``, ``KimiK25MultiModalProjector``), sizes from ``vt_*``:

* ``patch_embed.proj``: Conv2d(3 -> hidden, 14x14, bias); ``patch_embed.pos_emb.weight``: (init_pos_emb_height,
  init_pos_emb_width, hidden), interpolated to the grid;
* ``vt_num_hidden_layers`` blocks: LayerNorm ``norm0`` -> ``wqkv`` (bias) -> 2-D RoPE -> attention within each image ->
  ``wo`` (bias); LayerNorm ``norm1`` -> ``mlp.fc0`` (bias) -> GELU(tanh) -> ``mlp.fc1`` (bias): the same shapes as a
  Qwen3-VL block; then ``final_layernorm``;
* ``sd2_tpool`` merge (2x2 neighbours concatenated; an image has one frame, so the temporal mean is the identity) and
  the projector: ``pre_norm`` LayerNorm(hidden) per patch -> ``linear_1`` (4h -> 4h, bias) -> GELU -> ``linear_2``
  (4h -> text_hidden_size, bias) — Qwen's final merger, so it is priced by the same code.

Its tower (416.9 M without the projector) is the model card's "Parameters of Vision Encoder: 400M".

Llama 4 (``llama4``, ``vision_config.model_type`` ``llama4_vision_model``: Scout, Maverick): transformers'
``modeling_llama4.py`` (``Llama4VisionModel``, ``Llama4MultiModalProjector``), run on each 336² tile the processor
cuts (:class:`graphsim.core.vision.Llama4Processor`):

* ``patch_embedding``: Unfold(14x14) + Linear(3·14² -> hidden, no bias), on the tile's (336/14)² = 576 patches;
* ``class_embedding`` (hidden), appended as a 577th position; ``positional_embedding_vlm`` (577 x hidden) added;
  ``layernorm_pre``;
* ``num_hidden_layers`` blocks: LayerNorm -> q/k/v (bias) -> 2-D RoPE -> bidirectional attention within the tile's
  577 positions -> o_proj (bias); LayerNorm -> ``fc1`` (bias) -> GELU -> ``fc2`` (bias) (not gated);
* ``layernorm_post``; the class token dropped; pixel shuffle (ratio 0.5: 2x2 patches -> one 4h-wide token, a
  reshape); ``vision_adapter.mlp``: ``fc1`` (intermediate_size = 4h -> projector_input_dim, no bias) -> GELU ->
  ``fc2`` (projector_input_dim -> projector_output_dim, no bias) -> GELU;
* ``multi_modal_projector.linear_1`` (vision_output_dim -> text hidden, no bias): 144 image tokens a tile.

Check: 871,932,416 parameters, the sum of the checkpoint's ``vision_model.*`` and ``multi_modal_projector.*``
tensors (Scout's total 108.64 B is the model card's "109B total"). The ViT positions are the ``patches`` of a request
(577 a tile, so the unfold GEMM is priced on the image tokens, 4 x 588 pixels each: the same FLOPs, without the class
tokens); attention is per tile (``block_pairs`` of 577, exact for any number of tiles and images).

Gemma 3 (``gemma3``, ``siglip_vision_model``): transformers' ``modeling_siglip.py`` (``SiglipVisionModel`` without
its head) and ``modeling_gemma3.py`` (``Gemma3MultiModalProjector``), on one 896² view an image:

* ``embeddings.patch_embedding``: Conv2d(3 -> hidden, 14x14, bias); ``position_embedding``: (896/14)² = 4096 x hidden;
* ``num_hidden_layers`` blocks: LayerNorm -> q/k/v (bias) -> attention within the image (no RoPE) -> out_proj (bias);
  LayerNorm -> ``fc1`` -> GELU(tanh) -> ``fc2`` (biases); then ``post_layernorm``;
* the projector: AvgPool2d(4) (64² patches -> 16² = ``mm_tokens_per_image`` tokens), ``mm_soft_emb_norm``
  (RMSNorm, hidden), ``mm_input_projection_weight`` (hidden -> text hidden, no bias).

Check: SigLIP 416,866,032 parameters, the Gemma 3 Technical Report's "vision encoder 417M" (Table 1); with the
projector and the text model, 27.43 B for gemma-3-27b-it (the model page's "27.4B params"). Attention pairs are
``block_pairs`` of 4096 (exact for several images in a request). Pan & Scan crops are not modelled.

Gemma 4 (``gemma4``, ``gemma4_vision``): transformers' ``modeling_gemma4.py`` (``Gemma4VisionModel``,
``Gemma4MultimodalEmbedder``), on each image's aspect-preserving patch grid (:class:`graphsim.core.vision.Gemma4Processor`):

* ``patch_embedder.input_proj``: Linear(3·16² -> hidden, no bias); ``position_embedding_table`` (2 x
  position_embedding_size x hidden): one row per axis added to each patch (HF's one-hot matmul is a gather);
* ``num_hidden_layers`` blocks: RMSNorm -> q/k/v (no bias) -> per-head RMSNorms on q, k (scaled) and v (unscaled) ->
  2-D RoPE -> attention within the image -> o_proj -> RMSNorm -> residual; RMSNorm -> gated MLP (gate/up/down,
  GELU(tanh), no biases) -> RMSNorm -> residual (``num_key_value_heads`` = heads and head_dim x heads = hidden, as
  the released configs have; ``use_clipped_linears`` is refused);
* the pooler: k x k average (``pooling_kernel_size`` 3) to soft tokens, x sqrt(hidden); ``standardize``'s
  ``std_bias`` / ``std_scale`` (counted as weights: the checkpoint stores them);
* ``embed_vision``: RMSNorm without scale, ``embedding_projection`` (hidden -> text hidden, no bias).

Check: 569,550,384 tower parameters, the model card's "~550M parameter vision encoder" (within 4 %). The tower is
priced on the real patches of each image (HF pads to max_soft_tokens x 9 and masks the padding); attention is
``full_pairs`` over a request's patches. Gemma 4's text layers are not modelled yet (``families.UNSUPPORTED``), so
its checkpoints do not load; the tower is ready for when they do.

Conventions (as DeepSeek-V4.1's vision stage, :mod:`graphsim.models.deepseek_v41_extras`): attention pairs are
``full_pairs`` over a request's patches (exact for one image, an upper bound for several in one request) unless the
tower runs fixed tiles (Llama 4, Gemma 3: ``block_pairs``); the tower is tensor-parallel like the trunk's dense parts
(heads and MLP columns split, an all-reduce after the attention output, the MLP's second matrix and each merger's or
projector's last matrix); its weights are BF16 (the FP8/NVFP4 releases keep the visual modules unquantized) and are
read once per forward that runs the stage; LayerNorms are priced as the ``rmsnorm`` rule. Not priced: the bilinear
interpolation of ``pos_embed`` beyond one read-add per patch, the deepstack additions into the decoder (one add per
image token and deepstack level, inside the trunk's first layers), video inputs (several temporal patches per frame
pair), the pixel shuffle and the class-token drop (reshapes).
"""
from __future__ import annotations

import math
from typing import Mapping

import attrs

from ..core.config import need
from ..core.errors import require
from ..core.ir import Tensor
from ..core.rules import activation, all_reduce_tp, mlp, residual, rmsnorm, vit_attention

#: token sets: the ViT's patches and the image tokens the mergers emit (none in decode: the tower runs at prefill)
VIS_PATCHES, VIS_IMAGE = "vis_patches", "vis_image"
#: vision_config.model_type values with this layout (Qwen3.5's NVFP4 exports name theirs ``*_vision``)
QWEN_VIT_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_vision", "qwen3_5_moe_vision")
#: model_types whose vision_config is Kimi's MoonViT-3D with the ``patchmerger`` projector
KIMI_VIT_TYPES = ("kimi_k25",)
BF16 = 2.0


@attrs.frozen
class VisionTower:
    """A vision tower's sizes (``vision_config``): Qwen3-VL / Qwen3.5's, or Kimi K2.5's MoonViT-3D."""

    hidden: int
    inter: int
    heads: int
    depth: int
    patch: int
    temporal_patch: int
    channels: int
    merge: int
    out_hidden: int  #: the language model's hidden size
    deepstack: int  #: deepstack mergers (len(deepstack_visual_indexes))
    positions: int  #: learned position embeddings (num_position_embeddings)
    act: str = "gelu_pytorch_tanh"
    final_norm: bool = False  #: a LayerNorm after the last block (MoonViT's final_layernorm)
    family: str = "qwen3_vl"  #: whose layout: ``qwen3_vl`` or ``kimi_k25`` (its processor follows)

    @classmethod
    def from_config(cls, cfg: Mapping) -> "VisionTower | None":
        """The tower of a full model config, or None when it has no ``vision_config`` of a modelled layout."""
        v = cfg.get("vision_config")
        if not isinstance(v, Mapping):
            return None
        if cfg.get("model_type") in KIMI_VIT_TYPES:
            return cls._kimi(cfg, v)
        mt = v.get("model_type") or cfg.get("model_type") or ""
        if mt not in QWEN_VIT_TYPES and cfg.get("model_type") not in QWEN_VIT_TYPES:
            return None
        ds = v.get("deepstack_visual_indexes") or []
        depth = need(v, "depth", where="vision_config")
        require(isinstance(ds, list) and all(isinstance(i, int) and 0 <= i < depth for i in ds),
                "vision_config.deepstack_visual_indexes", f"must list block indices below depth {depth}, got {ds!r}")
        hidden, heads = need(v, "hidden_size", where="vision_config"), need(v, "num_heads", where="vision_config")
        require(hidden % heads == 0, "vision_config.num_heads", f"must divide hidden_size ({hidden}), got {heads}")
        return cls(hidden, need(v, "intermediate_size", where="vision_config"), heads, depth,
                   need(v, "patch_size", where="vision_config"),
                   need(v, "temporal_patch_size", default=2, where="vision_config"),
                   need(v, "in_channels", default=3, where="vision_config"),
                   need(v, "spatial_merge_size", default=2, where="vision_config"),
                   need(v, "out_hidden_size", where="vision_config"), len(ds),
                   need(v, "num_position_embeddings", default=0, lo=0, where="vision_config"),
                   v.get("hidden_act", "gelu_pytorch_tanh"))

    @classmethod
    def _kimi(cls, cfg: Mapping, v: Mapping) -> "VisionTower | None":
        w = "vision_config"
        if v.get("mm_projector_type", "patchmerger") != "patchmerger" or v.get("merge_type", "sd2_tpool") != "sd2_tpool":
            return None  # patchmergerv2 (RMSNorm after the projector, no biases) is not modelled
        hidden, heads = need(v, "vt_hidden_size", where=w), need(v, "vt_num_attention_heads", where=w)
        require(hidden % heads == 0, "vision_config.vt_num_attention_heads", f"must divide vt_hidden_size ({hidden})")
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
        out = need(v, "text_hidden_size", where=w, default=need(text, "hidden_size", where="text_config"))
        return cls(hidden, need(v, "vt_intermediate_size", where=w), heads, need(v, "vt_num_hidden_layers", where=w),
                   need(v, "patch_size", default=14, where=w), 1, 3, 2, out, 0,
                   need(v, "init_pos_emb_height", default=64, where=w) * need(v, "init_pos_emb_width", default=64, where=w),
                   "gelu_pytorch_tanh", final_norm=True, family="kimi_k25")

    @property
    def patch_dim(self) -> int:
        """Pixels per patch the Conv3d reads: channels x temporal_patch x patch²."""
        return self.channels * self.temporal_patch * self.patch ** 2

    @property
    def merged(self) -> int:
        """Width of one image token before the merger's MLP: merge² patch features."""
        return self.hidden * self.merge ** 2

    def mergers(self) -> list[str]:
        """Module names of the final merger, then one deepstack merger per ``deepstack_visual_indexes`` entry."""
        return ["vision.merger"] + [f"vision.deepstack_merger_list.{k}" for k in range(self.deepstack)]

    def weights(self) -> tuple[Tensor, ...]:
        """The tower's tensors (BF16, group ``vision``); each Linear's bias folded into its weight tensor."""
        h, f, m = self.hidden, self.inter, self.merged

        def t(name: str, elems: int) -> Tensor:
            return Tensor(name, "weight", "bf16", elems, module=name.rsplit(".", 1)[0], group="vision")

        out = [t("vision.patch_embed.proj", self.patch_dim * h + h)]
        if self.positions:
            out.append(t("vision.pos_embed.weight", self.positions * h))
        for i in range(self.depth):
            p = f"vision.blocks.{i}"
            out += [t(f"{p}.norms", 4 * h),  # norm1 and norm2: LayerNorm weight + bias
                    t(f"{p}.attn.qkv", h * 3 * h + 3 * h), t(f"{p}.attn.proj", h * h + h),
                    t(f"{p}.mlp.linear_fc1", h * f + f), t(f"{p}.mlp.linear_fc2", f * h + h)]
        if self.final_norm:
            out.append(t("vision.final_norm", 2 * h))
        for j, name in enumerate(self.mergers()):
            norm = 2 * (h if j == 0 else m)  # the final merger normalizes each patch, deepstack ones the concatenation
            out += [t(f"{name}.norm", norm), t(f"{name}.linear_fc1", m * m + m),
                    t(f"{name}.linear_fc2", m * self.out_hidden + self.out_hidden)]
        return tuple(out)

    def build(self, b) -> str:
        """Add the ``vision`` stage (the caller checks a prefill request carries patches); returns the last op,
        which the trunk's embedding depends on (image features fill the image positions)."""
        P, I = _vision_sets(b)
        h, f, m = self.hidden, self.inter, self.merged
        tp = ("tp", "dp")
        _, exps = activation(self.act)
        prec = b.meta.get("attention_precision", "bf16")
        with b.stage("vision"):
            b.gemm("vision.patch_embed", P, self.patch_dim, h, weight="vision.patch_embed.proj", split=("dp",),
                   deps=())
            if self.positions:  # interpolated learned position embedding, added to each patch
                b.elementwise("vision.pos_embed", P, h, bytes_in=2 * BF16, bytes_out=BF16, flops_per_elem=4,
                              split=("dp",), reads=("vision.pos_embed.weight",))
            for i in range(self.depth):
                p = f"vision.blocks.{i}"
                with b.layer(None, prefix=f"{p}."):
                    vit_attention(b, P, h, self.heads, prec, prefix=p, norm="norms", qkv="qkv", out="proj",
                                  note="ViT attn.proj", split=tp)
                    vit_mlp(b, P, h, f, exps, prefix=p, fc1="linear_fc1", fc2="linear_fc2")
            if self.final_norm:
                rmsnorm(b, "vision.final_norm", P, h, reads=("vision.final_norm",))
            last = None
            for j, name in enumerate(self.mergers()):
                # the final merger normalizes each patch (h), a deepstack merger the merge² concatenation (m)
                if j == 0:
                    rmsnorm(b, f"{name}.norm", P, h, reads=(f"{name}.norm",))
                else:
                    rmsnorm(b, f"{name}.norm", I, m, reads=(f"{name}.norm",))
                b.gemm(f"{name}.linear_fc1", I, m, m, weight=f"{name}.linear_fc1", split=tp)
                b.elementwise(f"{name}.act", I, m, bytes_in=BF16, bytes_out=BF16, flops_per_elem=8,
                              kind="activation", split=tp, exps=m)  # nn.GELU (erf): one SFU op per element
                last = _projection(b, f"{name}.linear_fc2", I, m, self.out_hidden, note="merger linear_fc2")
        return last



    def preprocessor_defaults(self) -> dict | None:
        """The processor constants the tower fixes (a ``preprocessor_config.json`` beside the config overrides them;
        Kimi's processor has its own defaults)."""
        if self.family == "kimi_k25":
            return None
        return {"patch_size": self.patch, "merge_size": self.merge, "temporal_patch_size": self.temporal_patch}


def vit_mlp(b, ts: str, h: int, f: int, exps: float, *, prefix: str, fc1: str, fc2: str) -> str:
    """A ViT block's MLP half (not gated): norm2, ``fc1`` (h -> f, column-parallel), GELU, ``fc2`` (f -> h,
    row-parallel + TP all-reduce), the residual. The norm's weight is ``prefix``.norms (both LayerNorms)."""
    tp = ("tp", "dp")
    rmsnorm(b, "norm2", ts, h, reads=(f"{prefix}.norms",))
    b.gemm(f"mlp.{fc1}", ts, h, f, weight=f"{prefix}.mlp.{fc1}", split=tp)
    b.elementwise("mlp.act", ts, f, bytes_in=BF16, bytes_out=BF16, flops_per_elem=8, kind="activation", split=tp,
                  exps=exps * f)
    b.gemm(f"mlp.{fc2}", ts, f, h, weight=f"{prefix}.mlp.{fc2}", split=tp, comm=(all_reduce_tp(ts, h, note=f"ViT {fc2}"),))
    return residual(b, "mlp.residual", ts, h)


def _vision_sets(b) -> tuple[str, str]:
    """The tower's two token sets, prefill only: the images' patches (ViT positions) and the image tokens its
    projector emits (the positions the trunk's embedding fills)."""
    return (b.token_set(VIS_PATCHES, prefill="patches", decode="none"),
            b.token_set(VIS_IMAGE, prefill="image", decode="none"))


def _projection(b, name: str, ts: str, n_in: int, n_out: int, *, note: str) -> str:
    """A row-split projection ending the tower (or its adapter): TP ranks each hold a slice of its inputs and
    all-reduce the ``n_out`` outputs (weight tensor of the same name)."""
    return b.gemm(name, ts, n_in, n_out, weight=name, split=("tp", "dp"), comm=(all_reduce_tp(ts, n_out, note=note),))


def _t(name: str, elems: int) -> Tensor:
    """A vision weight (BF16, group ``vision``; its module is the name's parent)."""
    return Tensor(name, "weight", "bf16", elems, module=name.rsplit(".", 1)[0], group="vision")


def _text_hidden(cfg: Mapping) -> int:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
    return need(text, "hidden_size", where="text_config")


def _gelu(b, name: str, ts: str, n: int, split) -> str:
    """nn.GELU (erf) on ``n`` elements a token: one SFU op per element."""
    return b.elementwise(name, ts, n, bytes_in=BF16, bytes_out=BF16, flops_per_elem=8, kind="activation", split=split,
                         exps=n)


@attrs.frozen
class Llama4Tower:
    """Llama 4's vision model and projector (transformers ``modeling_llama4.py``: ``Llama4VisionModel``,
    ``Llama4MultiModalProjector``), sizes from ``vision_config``; see the module docstring."""

    hidden: int
    inter: int
    heads: int
    depth: int
    patch: int
    channels: int
    image: int  #: tile side (image_size, 336)
    merge: int  #: 1 / pixel_shuffle_ratio: merge x merge patches become one token
    adapter_in: int  #: vision_adapter.mlp.fc1 input (intermediate_size, = hidden x merge²)
    projector_in: int  #: projector_input_dim (fc1's output)
    projector_out: int  #: projector_output_dim (fc2's output)
    out_hidden: int  #: the language model's hidden size (multi_modal_projector.linear_1's output)
    act: str = "gelu"
    family: str = "llama4"
    temporal_patch: int = 1

    @classmethod
    def from_config(cls, cfg: Mapping, v: Mapping) -> "Llama4Tower":
        w = "vision_config"
        hidden, heads = need(v, "hidden_size", where=w), need(v, "num_attention_heads", where=w)
        require(hidden % heads == 0, "vision_config.num_attention_heads", f"must divide hidden_size ({hidden})")
        ratio = v.get("pixel_shuffle_ratio", 0.5)
        merge = round(1 / ratio) if isinstance(ratio, (int, float)) and 0 < ratio <= 1 else 0
        require(merge >= 1 and abs(merge * ratio - 1) < 1e-9, "vision_config.pixel_shuffle_ratio",
                f"must be 1/n for an integer n, got {ratio!r}")
        image, patch = need(v, "image_size", where=w), need(v, "patch_size", where=w)
        require(image % (patch * merge) == 0, "vision_config.image_size",
                f"{image} must be a multiple of patch_size x 1/pixel_shuffle_ratio ({patch * merge})")
        inter = need(v, "intermediate_size", where=w)
        # the adapter's fc1 reads the pixel-shuffled features (hidden x merge² wide) with in_features = intermediate_size
        require(inter == hidden * merge ** 2, "vision_config.intermediate_size",
                f"must be hidden_size / pixel_shuffle_ratio² ({hidden * merge ** 2}) for the adapter's fc1, got {inter}")
        p_out = need(v, "projector_output_dim", where=w)
        require(need(v, "vision_output_dim", where=w) == p_out, "vision_config.vision_output_dim",
                f"must equal projector_output_dim ({p_out}): the projector reads the adapter's output")
        return cls(hidden, inter, heads, need(v, "num_hidden_layers", where=w), patch,
                   need(v, "num_channels", default=3, where=w), image, merge, inter,
                   need(v, "projector_input_dim", where=w), p_out, _text_hidden(cfg))

    @property
    def grid(self) -> int:
        return self.image // self.patch

    @property
    def tile_positions(self) -> int:
        """ViT positions a tile: grid² patches and the class token (577)."""
        return self.grid ** 2 + 1

    def weights(self) -> tuple[Tensor, ...]:
        h, f = self.hidden, self.inter
        out = [_t("vision.patch_embedding.linear", self.channels * self.patch ** 2 * h),  # Unfold + Linear, no bias
               _t("vision.class_embedding", h), _t("vision.positional_embedding_vlm", self.tile_positions * h),
               _t("vision.layernorm_pre", 2 * h), _t("vision.layernorm_post", 2 * h)]
        for i in range(self.depth):
            p = f"vision.layers.{i}"  # q/k/v/o with biases, LayerNorms with biases, fc1/fc2 with biases
            out += [_t(f"{p}.norms", 4 * h), _t(f"{p}.attn.qkv", 3 * h * h + 3 * h), _t(f"{p}.attn.o_proj", h * h + h),
                    _t(f"{p}.mlp.fc1", h * f + f), _t(f"{p}.mlp.fc2", f * h + h)]
        return tuple(out) + (_t("vision.vision_adapter.fc1", self.adapter_in * self.projector_in),
                             _t("vision.vision_adapter.fc2", self.projector_in * self.projector_out),
                             _t("vision.multi_modal_projector.linear_1", self.projector_out * self.out_hidden))

    def build(self, b) -> str:
        """The ``vision`` stage: ``vis_patches`` are the tiles' ViT positions (577 a tile), ``vis_image`` their
        ``<|patch|>`` tokens (144 a tile)."""
        P, I = _vision_sets(b)
        h, f, m2 = self.hidden, self.inter, self.merge ** 2
        tp = ("tp", "dp")
        _, exps = activation(self.act)
        prec = b.meta.get("attention_precision", "bf16")
        with b.stage("vision"):
            # the unfold patch embedding: a tile's grid² patches are the merge² patches of each of its tokens
            b.gemm("vision.patch_embedding", I, m2 * self.channels * self.patch ** 2, h,
                   weight="vision.patch_embedding.linear", split=("dp",), deps=())
            b.elementwise("vision.pos_embed", P, h, bytes_in=2 * BF16, bytes_out=BF16, flops_per_elem=1, split=("dp",),
                          reads=("vision.class_embedding", "vision.positional_embedding_vlm"))
            rmsnorm(b, "vision.layernorm_pre", P, h, reads=("vision.layernorm_pre",))
            for i in range(self.depth):
                p = f"vision.layers.{i}"
                with b.layer(None, prefix=f"{p}."):
                    vit_attention(b, P, h, self.heads, prec, prefix=p, norm="norms", qkv="qkv", out="o_proj",
                                  note="ViT o_proj", split=tp, block=self.tile_positions)
                    vit_mlp(b, P, h, f, exps, prefix=p, fc1="fc1", fc2="fc2")
            rmsnorm(b, "vision.layernorm_post", P, h, reads=("vision.layernorm_post",))
            # class tokens dropped, pixel shuffle (a reshape), then the adapter MLP (GELU after fc1 and after fc2)
            b.gemm("vision.vision_adapter.fc1", I, self.adapter_in, self.projector_in,
                   weight="vision.vision_adapter.fc1", split=tp)
            _gelu(b, "vision.vision_adapter.act1", I, self.projector_in, tp)
            _projection(b, "vision.vision_adapter.fc2", I, self.projector_in, self.projector_out,
                        note="vision_adapter fc2")
            _gelu(b, "vision.vision_adapter.act2", I, self.projector_out, ("dp",))
            return _projection(b, "vision.multi_modal_projector.linear_1", I, self.projector_out, self.out_hidden,
                               note="multi_modal_projector")

    def preprocessor_defaults(self) -> dict:
        return {"patch_size": self.patch, "merge_size": self.merge, "size": {"height": self.image, "width": self.image}}


@attrs.frozen
class SiglipTower:
    """Gemma 3's SigLIP vision model and ``Gemma3MultiModalProjector`` (transformers ``modeling_siglip.py``,
    ``modeling_gemma3.py``), sizes from ``vision_config`` and ``mm_tokens_per_image``; see the module docstring."""

    hidden: int
    inter: int
    heads: int
    depth: int
    patch: int
    channels: int
    image: int  #: image_size (896): every image is resized to it
    merge: int  #: the projector's average-pooling kernel: (image / patch) / sqrt(mm_tokens_per_image)
    out_hidden: int
    act: str = "gelu_pytorch_tanh"
    family: str = "gemma3"
    temporal_patch: int = 1

    @classmethod
    def from_config(cls, cfg: Mapping, v: Mapping) -> "SiglipTower":
        w = "vision_config"
        hidden, heads = need(v, "hidden_size", where=w), need(v, "num_attention_heads", where=w)
        require(hidden % heads == 0, "vision_config.num_attention_heads", f"must divide hidden_size ({hidden})")
        require(not v.get("vision_use_head", False), "vision_config.vision_use_head",
                "Gemma 3 runs SigLIP without its pooling head; a head is not modelled")
        image, patch = need(v, "image_size", where=w), need(v, "patch_size", where=w)
        tokens = need(cfg, "mm_tokens_per_image", default=256)
        side = math.isqrt(tokens)
        require(side * side == tokens and image % patch == 0 and (image // patch) % side == 0, "mm_tokens_per_image",
                f"must be a square whose side divides image_size / patch_size ({image // patch}), got {tokens}")
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        return cls(hidden, need(v, "intermediate_size", where=w), heads, need(v, "num_hidden_layers", where=w), patch,
                   need(v, "num_channels", default=3, where=w), image, image // patch // side, _text_hidden(cfg),
                   act if isinstance(act, str) else "gelu_pytorch_tanh")

    @property
    def positions(self) -> int:
        """Patches an image (and learned position embeddings): (image / patch)² = 4096."""
        return (self.image // self.patch) ** 2

    def weights(self) -> tuple[Tensor, ...]:
        h, f = self.hidden, self.inter
        out = [_t("vision.embeddings.patch_embedding", self.channels * self.patch ** 2 * h + h),  # Conv2d with bias
               _t("vision.embeddings.position_embedding", self.positions * h)]
        for i in range(self.depth):
            p = f"vision.layers.{i}"  # layer_norm1/2, q/k/v/out_proj and fc1/fc2, all with biases
            out += [_t(f"{p}.norms", 4 * h), _t(f"{p}.attn.qkv", 3 * h * h + 3 * h),
                    _t(f"{p}.attn.out_proj", h * h + h), _t(f"{p}.mlp.fc1", h * f + f), _t(f"{p}.mlp.fc2", f * h + h)]
        return tuple(out) + (_t("vision.post_layernorm", 2 * h), _t("vision.mm_soft_emb_norm", h),
                             _t("vision.mm_input_projection", h * self.out_hidden))

    def build(self, b) -> str:
        """The ``vision`` stage: ``vis_patches`` are the images' patches (4096 each), ``vis_image`` their soft tokens."""
        P, I = _vision_sets(b)
        h, f = self.hidden, self.inter
        tp = ("tp", "dp")
        _, exps = activation(self.act)
        prec = b.meta.get("attention_precision", "bf16")
        with b.stage("vision"):
            b.gemm("vision.patch_embedding", P, self.channels * self.patch ** 2, h,
                   weight="vision.embeddings.patch_embedding", split=("dp",), deps=())
            b.elementwise("vision.pos_embed", P, h, bytes_in=2 * BF16, bytes_out=BF16, flops_per_elem=1, split=("dp",),
                          reads=("vision.embeddings.position_embedding",))
            for i in range(self.depth):
                p = f"vision.layers.{i}"
                with b.layer(None, prefix=f"{p}."):
                    vit_attention(b, P, h, self.heads, prec, prefix=p, norm="norms", qkv="qkv", out="out_proj",
                                  note="ViT out_proj", split=tp, block=self.positions, rope=False)
                    vit_mlp(b, P, h, f, exps, prefix=p, fc1="fc1", fc2="fc2")
            rmsnorm(b, "vision.post_layernorm", P, h, reads=("vision.post_layernorm",))
            m2 = self.merge ** 2  # AvgPool2d(merge): merge² patch vectors read for each soft token
            b.elementwise("vision.avg_pool", I, h, bytes_in=m2 * BF16, bytes_out=BF16, flops_per_elem=m2, split=("dp",))
            rmsnorm(b, "vision.mm_soft_emb_norm", I, h, reads=("vision.mm_soft_emb_norm",))
            return _projection(b, "vision.mm_input_projection", I, h, self.out_hidden, note="mm_input_projection")

    def preprocessor_defaults(self) -> dict:
        return {"patch_size": self.patch, "merge_size": self.merge, "image_size": self.image}


@attrs.frozen
class Gemma4Tower:
    """Gemma 4's vision model and ``embed_vision`` (transformers ``modeling_gemma4.py``: ``Gemma4VisionModel``,
    ``Gemma4MultimodalEmbedder``), sizes from ``vision_config``; see the module docstring."""

    hidden: int
    inter: int
    heads: int
    head_dim: int
    depth: int
    patch: int
    merge: int  #: pooling_kernel_size: k x k patches averaged into one soft token
    positions: int  #: position_embedding_size (a table per axis)
    standardize: bool
    out_hidden: int
    soft_tokens: int  #: the processor's max_soft_tokens (vision_soft_tokens_per_image)
    act: str = "gelu_pytorch_tanh"
    family: str = "gemma4"
    temporal_patch: int = 1
    channels: int = 3

    @classmethod
    def from_config(cls, cfg: Mapping, v: Mapping) -> "Gemma4Tower":
        w = "vision_config"
        hidden, heads = need(v, "hidden_size", where=w), need(v, "num_attention_heads", where=w)
        hd = need(v, "head_dim", default=hidden // heads, where=w)
        require(heads * hd == hidden, "vision_config.head_dim",
                f"num_attention_heads x head_dim must equal hidden_size ({hidden}), got {heads} x {hd}")
        require(need(v, "num_key_value_heads", default=heads, where=w) == heads, "vision_config.num_key_value_heads",
                f"must equal num_attention_heads ({heads}): grouped K/V in the vision tower is not modelled")
        require(not v.get("use_clipped_linears", False), "vision_config.use_clipped_linears",
                "clipped linears (a clamp before and after every projection) are not modelled")
        act = v.get("hidden_activation", "gelu_pytorch_tanh")
        soft = need(cfg, "vision_soft_tokens_per_image", default=need(v, "default_output_length", default=280, where=w))
        return cls(hidden, need(v, "intermediate_size", where=w), heads, hd, need(v, "num_hidden_layers", where=w),
                   need(v, "patch_size", where=w), need(v, "pooling_kernel_size", where=w),
                   need(v, "position_embedding_size", where=w), bool(v.get("standardize", False)), _text_hidden(cfg),
                   soft, act if isinstance(act, str) else "gelu_pytorch_tanh")

    def weights(self) -> tuple[Tensor, ...]:
        h, f = self.hidden, self.inter
        out = [_t("vision.patch_embedder.input_proj", self.channels * self.patch ** 2 * h),  # no bias
               _t("vision.patch_embedder.position_embedding_table", 2 * self.positions * h)]
        for i in range(self.depth):
            p = f"vision.layers.{i}"  # four RMSNorms; q/k/v/o without biases; q_norm, k_norm (v_norm has no scale)
            out += [_t(f"{p}.norms", 4 * h), _t(f"{p}.attn.qkv", 3 * h * h), _t(f"{p}.attn.o_proj", h * h),
                    _t(f"{p}.attn.qk_norm", 2 * self.head_dim), _t(f"{p}.mlp.gate_up", 2 * h * f),
                    _t(f"{p}.mlp.down", f * h)]
        if self.standardize:  # std_bias and std_scale (checkpoint buffers)
            out.append(_t("vision.standardize", 2 * h))
        return tuple(out) + (_t("vision.embed_vision.embedding_projection", h * self.out_hidden),)

    def build(self, b) -> str:
        """The ``vision`` stage: ``vis_patches`` are the images' patches, ``vis_image`` their pooled soft tokens."""
        P, I = _vision_sets(b)
        h, f = self.hidden, self.inter
        tp = ("tp", "dp")
        prec = b.meta.get("attention_precision", "bf16")
        with b.stage("vision"):
            b.gemm("vision.patch_embedding", P, self.channels * self.patch ** 2, h,
                   weight="vision.patch_embedder.input_proj", split=("dp",), deps=())
            # one row of each axis' table added to the patch (the one-hot matmul of HF is a gather)
            b.elementwise("vision.pos_embed", P, h, bytes_in=3 * BF16, bytes_out=BF16, flops_per_elem=2, split=("dp",),
                          reads=("vision.patch_embedder.position_embedding_table",))
            for i in range(self.depth):
                p = f"vision.layers.{i}"
                with b.layer(None, prefix=f"{p}."):
                    vit_attention(b, P, h, self.heads, prec, prefix=p, norm="norms", qkv="qkv", out="o_proj",
                                  note="ViT o_proj", split=tp, qkv_norm="attn.qk_norm", post_norm="norms")
                    rmsnorm(b, "pre_ffw_norm", P, h, reads=(f"{p}.norms",))
                    mlp(b, "mlp.", P, h, f, weights=(f"{p}.mlp.gate_up", f"{p}.mlp.down"), act=self.act)
                    rmsnorm(b, "post_ffw_norm", P, h, reads=(f"{p}.norms",))
                    residual(b, "mlp.residual", P, h)
            k2 = self.merge ** 2  # average k x k patches, scale by sqrt(hidden), standardize: per soft token
            b.elementwise("vision.pooler", I, h, bytes_in=k2 * BF16, bytes_out=BF16,
                          flops_per_elem=k2 + 1 + 2 * self.standardize, split=("dp",),
                          reads=("vision.standardize",) if self.standardize else ())
            rmsnorm(b, "vision.embed_vision.norm", I, h)  # embedding_pre_projection_norm: no scale
            return _projection(b, "vision.embed_vision.embedding_projection", I, h, self.out_hidden,
                               note="embed_vision")

    def preprocessor_defaults(self) -> dict:
        return {"patch_size": self.patch, "pooling_kernel_size": self.merge, "max_soft_tokens": self.soft_tokens}


#: vision_config.model_type -> the tower class of that layout (Qwen's and Kimi's: :class:`VisionTower`)
TOWERS = {"llama4_vision_model": Llama4Tower, "siglip_vision_model": SiglipTower, "gemma4_vision": Gemma4Tower}
#: the full model_types whose vision_config is one of TOWERS' layouts (a SigLIP config elsewhere is not Gemma 3's)
TOWER_MODELS = {"llama4_vision_model": ("llama4",), "siglip_vision_model": ("gemma3",), "gemma4_vision": ("gemma4",)}


def tower(cfg: Mapping):
    """The vision tower graphsim models for a full config (None: none, or a layout it does not model)."""
    v = cfg.get("vision_config")
    mt = v.get("model_type") if isinstance(v, Mapping) else None
    if mt in TOWERS and cfg.get("model_type") in TOWER_MODELS[mt]:
        return TOWERS[mt].from_config(cfg, v)
    return VisionTower.from_config(cfg)
