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

Conventions (as DeepSeek-V4.1's vision stage, :mod:`graphsim.models.deepseek_v41_extras`): attention pairs are
``full_pairs`` over a request's patches (exact for one image, an upper bound for several in one request); the tower
is tensor-parallel like the trunk's dense parts (heads and MLP columns split, an all-reduce after ``attn.proj``,
``linear_fc2`` and each merger's ``linear_fc2``); its weights are BF16 (the FP8/NVFP4 releases keep the visual
modules unquantized) and are read once per forward that runs the stage. Not priced: the bilinear interpolation of
``pos_embed`` beyond one read-add per patch, the deepstack additions into the decoder (one add per image token and
deepstack level, inside the trunk's first layers), video inputs (several temporal patches per frame pair).
"""
from __future__ import annotations

from typing import Mapping

import attrs

from ..core.config import need
from ..core.errors import require
from ..core.ir import Tensor
from ..core.rules import activation, all_reduce_tp, residual, rmsnorm, vit_attention

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
        P = b.token_set(VIS_PATCHES, prefill="patches", decode="none")
        I = b.token_set(VIS_IMAGE, prefill="image", decode="none")
        h, f, m, hd = self.hidden, self.inter, self.merged, self.hidden // self.heads
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
                    rmsnorm(b, "norm2", P, h, reads=(f"{p}.norms",))
                    b.gemm("mlp.linear_fc1", P, h, f, weight=f"{p}.mlp.linear_fc1", split=tp)
                    b.elementwise("mlp.act", P, f, bytes_in=BF16, bytes_out=BF16, flops_per_elem=8,
                                  kind="activation", split=tp, exps=exps * f)
                    b.gemm("mlp.linear_fc2", P, f, h, weight=f"{p}.mlp.linear_fc2", split=tp,
                           comm=(all_reduce_tp(P, h, note="ViT linear_fc2"),))
                    residual(b, "mlp.residual", P, h)
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
                last = b.gemm(f"{name}.linear_fc2", I, m, self.out_hidden, weight=f"{name}.linear_fc2", split=tp,
                              comm=(all_reduce_tp(I, self.out_hidden, note="merger linear_fc2"),))
        return last



def tower(cfg: Mapping) -> VisionTower | None:
    """The vision tower graphsim models for a full config (None: none, or a layout it does not model)."""
    return VisionTower.from_config(cfg)
