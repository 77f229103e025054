"""DeepSeek-V4.1-Flash model semantics: config, layer roles, resident-weight inventory, KV capacity, Engram.

Everything here is derived from the HF config (``configs/deepseek-v4.1-flash.json``); facts the public
config does not carry but ``shared/spec/V41_FACTS.md`` states (storage formats, compressor precisions) are
attrs fields with a default and a comment citing the section, and anything neither states is marked
``[reconstructed]``. No layer number appears in code: roles come from ``compress_ratios``,
``kv_source_layer_ids``, ``index_source_layer_ids`` and ``candidate_source_layer_id``.

How this reading differs from the facts, and how it was resolved
----------------------------------------------------------------
* "trunk ≈ 551.6 B" (§12) includes the embedding and the LM head. Here they form their own inventory
  group ``embed``; :func:`param_summary` reports ``trunk_with_embed`` (551.57 B) for the comparison.
* "vision ≈ 0.5 B" (§12) is a one-significant-digit figure; the shapes §12 lists add up to 0.485 B
  (patch embed 0.6 M + 32 blocks × 12.85 M + aligner 73.4 M), which rounds to 0.5 B. A 1 % band cannot
  be applied to a one-digit figure, so the test checks the rounding interval instead.
* Partial-group state (§8 "an unfinished compression group holds state too", §12 "[2,512] fp32 per
  request"): the reference Compressor keeps a ``kv_state`` and a ``score_state`` buffer of [m, head_dim]
  fp32 per request ([2,512] each for m=2) — allocated for the whole group whether 0 or m-1 positions are
  pending, so cache capacity is monotone in N. Capacity charges the buffers (2 × m × 512 × 4 = 8,192 B per
  m>1 owner and request); traffic (restores, commits) moves only the pending rows. m=1 owners complete a
  group with every token and hold none. The §8 goldens (global + SWA) are unchanged.
* The talk notes (seed 003) say every Decoder layer gets its own projected KV ("每層擁有獨立 KV"); the
  public config has a single Decoder KV source. The config (and seed 000) wins: one Decoder owner.
* "active ≈ 377 M per trunk layer" counts attention + 6 routed + 1 shared expert + gate + mHC; it excludes
  the compressor and indexer that only owners/index sources carry. ``active_per_layer`` follows that
  definition; ``active_by_layer`` adds each layer's own compressor/indexer.
* Engram projections are "FP8, one scale per 32 elements" (§6, §8): format ``fp8_e8m0_32``, not the
  32×32-block format of the dense linears.
"""
from __future__ import annotations

import functools
import math
from typing import Mapping

import attrs

from graphsim.core.config import _is_int as _is_int_, field, parse, structure
from graphsim.core.errors import one_of, require
from graphsim.core.ir import FORMATS, Tensor, fmt

# --------------------------------------------------------------------------------------------------
# Parsing helpers (shared with deepseek_v4)
# --------------------------------------------------------------------------------------------------

# the one config converter (graphsim.core.config), under the names this module and deepseek_v4 use
_f = field
_is_int = _is_int_
_parse = parse


def _parse_fields(cls, section: Mapping, where: str) -> dict:
    return structure(cls, section, where)


def _section(d: Mapping, key: str, *, required: bool) -> Mapping | None:
    sec = d.get(key)
    if sec is None:
        require(not required, key, "missing required section")
        return None
    require(isinstance(sec, Mapping), key, f"must be an object, got {type(sec).__name__}")
    return sec


def _quant_formats(quant: Mapping) -> tuple[str, str]:
    """(dense weight format, routed-expert format) from an HF ``quantization_config``."""
    method = _parse(quant.get("quant_method"), "str", "quantization_config.quant_method")
    require(method == "fp8", "quantization_config.quant_method", f"only 'fp8' is modelled, got {method!r}")
    block = quant.get("weight_block_size")
    block = _parse(block, "ints", "quantization_config.weight_block_size")
    require(len(block) == 2, "quantization_config.weight_block_size", f"must have 2 entries, got {block}")
    scale = quant.get("scale_fmt")
    base = f"fp8_b{block[0]}x{block[1]}"
    # Prefer the exact ue8m0 variant; FORMATS has no ue8m0 variant of 128x128, where the fp32-scale
    # format differs by 3 B per 16,384 weights (0.02 %) - see deepseek_v4's config notes.
    candidates = ([f"{base}_ue8m0"] if scale == "ue8m0" else []) + [base]
    dense = next((c for c in candidates if c in FORMATS), None)
    require(dense is not None, "quantization_config.weight_block_size", f"no storage format for {candidates}")
    expert = quant.get("expert_dtype", "fp8")
    # V41_FACTS §12: FP4 experts carry a ue8m0 scale per 32 elements.
    experts = {"fp4": "fp4_ue8m0_32", "fp8": dense}
    require(expert in experts, "quantization_config.expert_dtype", f"must be one of {sorted(experts)}, got {expert!r}")
    return dense, experts[expert]


def _sorted_unique(ids: tuple, field: str, n: int) -> None:
    require(list(ids) == sorted(set(ids)), field, f"must be strictly increasing, got {list(ids)}")
    require(all(0 <= i < n for i in ids), field, f"layer ids must lie in [0, {n}), got {list(ids)}")


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@attrs.frozen
class VisionConfig:
    """DeepSeek-ViT + aligner (V41_FACTS §1, §12)."""

    num_hidden_layers: int = _f("int")
    hidden_size: int = _f("int")
    num_attention_heads: int = _f("int")
    intermediate_size: int = _f("int")
    patch_size: int = _f("int")
    downsample_ratio: int = _f("int")
    max_image_tokens: int = _f("int")
    min_pixels: int = _f("int")
    # §12 gives the patch embed as 588 -> 1024 = channels·14², i.e. RGB.
    image_channels: int = _f("int", 3)
    weight_format: str = _f("format", "bf16")  # [reconstructed] the vision tower's storage format

    @property
    def patch_dim(self) -> int:
        return self.image_channels * self.patch_size**2  # 3·14² = 588 (§12)

    @property
    def aligner_in(self) -> int:
        # §12: 3×3 unfold of ViT tokens -> 9216 = downsample²·hidden.
        return self.downsample_ratio**2 * self.hidden_size


@attrs.frozen
class V41Config:
    """DeepSeek-V4.1-Flash text config (+ vision, quantization). Build with :meth:`from_dict`."""

    # ---- from the public text_config (V41_FACTS §1) ---------------------------------------------
    vocab_size: int = _f("int")
    hidden_size: int = _f("int")
    moe_intermediate_size: int = _f("int")
    num_hidden_layers: int = _f("int")
    num_attention_heads: int = _f("int")
    num_key_value_heads: int = _f("int")
    head_dim: int = _f("int")
    qk_rope_head_dim: int = _f("int")
    q_lora_rank: int = _f("int")
    o_lora_rank: int = _f("int")
    o_groups: int = _f("int")
    n_routed_experts: int = _f("int")
    n_shared_experts: int = _f("int")
    num_experts_per_tok: int = _f("int")
    routed_scaling_factor: float = _f("float")
    sliding_window: int = _f("int")
    max_position_embeddings: int = _f("int")
    compress_ratios: tuple = _f("ints")
    kv_source_layer_ids: tuple = _f("ints")
    index_source_layer_ids: tuple = _f("ints")
    index_n_heads: int = _f("int")
    index_head_dim: int = _f("int")
    index_topk: int = _f("int")
    candidate_source_layer_id: int = _f("int")
    candidate_topk_blocks: int = _f("int")
    candidate_block_size: int = _f("int")
    hc_mult: int = _f("int")
    hc_sinkhorn_iters: int = _f("int")
    engram_layer_ids: tuple = _f("ints")
    engram_num_embeddings: tuple = _f("ints")
    engram_max_ngram_size: int = _f("int")
    engram_n_heads: int = _f("int")
    engram_head_dim: int = _f("int")
    engram_vocab_size: int = _f("int")
    engram_compressed_vocab_size: int = _f("int")
    num_nextn_predict_layers: int = _f("int")
    dspark_block_size: int = _f("int")
    dspark_target_layer_ids: tuple = _f("ints")
    dspark_markov_rank: int = _f("int")
    dspark_n_routed_experts: int = _f("int")
    dspark_num_experts_per_tok: int = _f("int")
    tie_word_embeddings: bool = _f("bool", False)

    # ---- from quantization_config (V41_FACTS §8) ------------------------------------------------
    dense_format: str = "fp8_b32x32_ue8m0"
    expert_format: str = "fp4_ue8m0_32"
    vision: VisionConfig | None = None

    # ---- stated by the facts, not by the public config; overridable from text_config ------------
    main_kv_format: str = _f("format", "fp4_e2m1_e4m3_16")  # §8: E2M1 + E4M3 per 16 -> 288 B/entry
    index_k_format: str = _f("format", "mxfp4")  # §8: MXFP4 groups of 32 -> 68 B/entry
    swa_kv_format: str = _f("format", "fp8")  # §8: SWA KV FP8 -> 512 B/entry
    engram_format: str = _f("format", "fp8_e8m0_32")  # §6/§8: tables and projections FP8, scale per 32
    wo_a_format: str = _f("format", "bf16")  # §12: block-diagonal wo_a is bf16
    compressor_pooled_format: str = _f("format", "fp32")  # §12: m>1 compressor wkv/wgate in fp32
    compressor_plain_format: str = _f("format", "bf16")  # §12: m=1 compressor is a plain bf16 projection
    indexer_small_format: str = _f("format", "bf16")  # §12: indexer weights_proj and wk are bf16
    mhc_format: str = _f("format", "fp32")  # §12: mHC fn is fp32
    confidence_format: str = _f("format", "fp32")  # §12: DSpark confidence head fp32
    embed_format: str = _f("format", "bf16")  # embedding and LM head
    compressor_state_format: str = _f("format", "fp32")  # §12: partial-group state is fp32
    # §12 "[2,512]": a kv plane and a score plane per group row (see module docstring).
    compressor_state_planes: int = _f("int", 2)

    # ---- [reconstructed]: in neither the public config nor the facts ----------------------------
    norm_format: str = _f("format", "bf16")  # [reconstructed] RMSNorm weights
    router_format: str = _f("format", "bf16")  # [reconstructed] router weight (bias kept fp32)
    mhc_scale_params: int = _f("int", 3)  # [reconstructed] per-sub-block scales (pre, post, res)
    engram_gate_norms: int = _f("int", 2)  # [reconstructed] key and query RMSNorm per stream copy
    dspark_n_shared_experts: int = _f("int", 1)  # [reconstructed] DSpark MoE keeps one shared expert
    dspark_has_mhc: bool = _f("bool", True)  # [reconstructed] DSpark blocks use the trunk's mHC
    dspark_head_format: str = _f("format", "bf16")  # [reconstructed] Markov head storage

    def __attrs_post_init__(self):
        _validate(self)

    # ---- parsing ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping) -> "V41Config":
        """Parse an HF config (nested ``text_config``/``vision_config``/``quantization_config``) or a
        flat dict whose text fields sit at the top level. Bad input raises :class:`GraphsimError`."""
        require(isinstance(d, Mapping), "config", f"must be a mapping, got {type(d).__name__}")
        if "text_config" in d:
            text, where = _section(d, "text_config", required=True), "text_config."
        else:
            text, where = d, ""
        kw = _parse_fields(cls, text, where)
        quant = _section(d, "quantization_config", required=True)
        kw["dense_format"], kw["expert_format"] = _quant_formats(quant)
        vis = _section(d, "vision_config", required=False)  # absent = text-only model
        if vis is not None:
            kw["vision"] = VisionConfig(**_parse_fields(VisionConfig, vis, "vision_config."))
        return cls(**kw)

    # ---- derived quantities ------------------------------------------------------------------------
    @property
    def n_dspark_blocks(self) -> int:
        # §1: the trailing compress_ratios entries beyond the trunk are the DSpark blocks.
        return self.num_nextn_predict_layers

    @property
    def trunk_ratios(self) -> tuple[int, ...]:
        return self.compress_ratios[: self.num_hidden_layers]

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim  # 64·512 = 32768 (§12)

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim  # one shared latent (MQA): 512 (§12)

    @property
    def wo_a_in_per_group(self) -> int:
        return self.num_attention_heads // self.o_groups * self.head_dim  # 4096 (§12)

    @property
    def hc_mix_rows(self) -> int:
        # §12 fn [24, 20480]: n pre-mix weights + n post weights + n×n residual mix = (2+n)·n = 24.
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def hc_mix_cols(self) -> int:
        return self.hc_mult * self.hidden_size  # all n streams flattened: 4·5120 = 20480 (§12)

    @property
    def decoder_start(self) -> int:
        """First Decoder layer (§2, §3): the Decoder's first Full layer, which is the candidate source."""
        return self.candidate_source_layer_id

    @property
    def replay_start_layer(self) -> int:
        """SGLang decoder bounded replay cut: max(kv_source_layer_ids) + 1 (§4, §12)."""
        return max(self.kv_source_layer_ids) + 1

    @property
    def engram_orders(self) -> tuple[int, ...]:
        return tuple(range(2, self.engram_max_ngram_size + 1))  # §6: 2-, 3-, 4-grams

    @property
    def engram_lookup_rows(self) -> int:
        return len(self.engram_orders) * self.engram_n_heads  # §6: 3 orders × 8 heads = 24

    @property
    def engram_lookup_dim(self) -> int:
        return self.engram_lookup_rows * self.engram_head_dim  # §6: 24 × 256 = 6144

    @property
    def engram_proj_out(self) -> int:
        # §6: keys for the hc_mult streams + 1 shared value: (4+1)·5120 = 25600.
        return (self.hc_mult + 1) * self.hidden_size

    def pooled(self, m: int) -> bool:
        """A compressor with m>1 pools m positions with a softmax gate (wkv+wgate); m=1 is a plain
        projection (§12)."""
        return m > 1


# --------------------------------------------------------------------------------------------------
# Layer roles
# --------------------------------------------------------------------------------------------------

PATHS = ("swa_only", "full", "reindex", "reuse")
STAGES = ("encoder", "decoder")


@attrs.frozen
class LayerInfo:
    """One trunk layer's role (V41_FACTS §2)."""

    layer: int
    path: str = attrs.field(validator=one_of("layer", PATHS))
    stage: str = attrs.field(validator=one_of("layer", STAGES))
    ratio: int
    kv_owner: int | None  #: latest Full layer ≤ this one whose main KV / index K it reads (itself if Full)
    topk_producer: int | None  #: whose Top-K it attends with (itself for Full/Reindex)
    engram: bool  #: an Engram module runs before this block
    candidate_source: bool  #: builds the Decoder candidate pool (§3)
    candidate_limited: bool  #: Reindex scoring limited to the candidate pool (Decoder Reindex, §3)

    @property
    def kv_source(self) -> bool:
        return self.path == "full"

    @property
    def index_source(self) -> bool:
        return self.path in ("full", "reindex")


def _latest(ids, layer: int, lo: int = 0) -> int | None:
    return max((i for i in ids if lo <= i <= layer), default=None)


def _derive_layers(cfg: V41Config) -> tuple[LayerInfo, ...]:
    n = cfg.num_hidden_layers
    ratios = cfg.trunk_ratios
    kv, idx = set(cfg.kv_source_layer_ids), set(cfg.index_source_layer_ids)
    out = []
    for layer, m in enumerate(ratios):
        field = "text_config.compress_ratios"
        if m == 0:
            path, owner, producer = "swa_only", None, None
        else:
            owner = _latest(cfg.kv_source_layer_ids, layer)
            require(owner is not None, field, f"layer {layer} has ratio {m} but no KV source at or before it")
            require(
                ratios[owner] == m, field,
                f"layer {layer} has ratio {m} but reads KV of layer {owner} compressed at ratio {ratios[owner]}",
            )
            if layer in kv:
                path, producer = "full", layer
            elif layer in idx:
                path, producer = "reindex", layer
            else:
                # Reuse: the latest Top-K produced within the same KV group (the owner is an index source).
                path, producer = "reuse", _latest(cfg.index_source_layer_ids, layer, lo=owner)
        stage = "decoder" if layer >= cfg.decoder_start else "encoder"
        out.append(
            LayerInfo(
                layer=layer, path=path, stage=stage, ratio=m, kv_owner=owner, topk_producer=producer,
                engram=layer in cfg.engram_layer_ids,
                candidate_source=layer == cfg.candidate_source_layer_id,
                candidate_limited=path == "reindex" and stage == "decoder",
            )
        )
    assert len(out) == n
    return tuple(out)


def _validate(cfg: V41Config) -> None:
    t = "text_config."
    n = cfg.num_hidden_layers
    for name in ("vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts",
                 "num_experts_per_tok", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
                 "candidate_topk_blocks", "candidate_block_size", "hc_mult", "engram_n_heads", "engram_head_dim"):
        require(getattr(cfg, name) > 0, t + name, f"must be positive, got {getattr(cfg, name)}")
    require(cfg.num_nextn_predict_layers >= 0, t + "num_nextn_predict_layers", "must be >= 0")
    require(cfg.num_experts_per_tok <= cfg.n_routed_experts, t + "num_experts_per_tok", "exceeds n_routed_experts")
    require(cfg.num_attention_heads % cfg.o_groups == 0, t + "o_groups", "must divide num_attention_heads")
    require(0 < cfg.qk_rope_head_dim <= cfg.head_dim, t + "qk_rope_head_dim", "must lie in (0, head_dim]")
    require(cfg.engram_max_ngram_size >= 2, t + "engram_max_ngram_size", "N-gram orders start at 2")
    # §1: 43 entries = 40 trunk + 3 DSpark blocks.
    want = n + cfg.num_nextn_predict_layers
    require(
        len(cfg.compress_ratios) == want, t + "compress_ratios",
        f"needs num_hidden_layers + num_nextn_predict_layers = {want} entries, got {len(cfg.compress_ratios)}",
    )
    require(all(m >= 0 for m in cfg.compress_ratios), t + "compress_ratios", "ratios must be >= 0")
    require(
        all(m == 0 for m in cfg.compress_ratios[n:]), t + "compress_ratios",
        "the trailing DSpark entries must be 0 (DSpark blocks are SWA-only, §1)",
    )
    ratios = cfg.trunk_ratios
    for name in ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids", "dspark_target_layer_ids"):
        _sorted_unique(getattr(cfg, name), t + name, n)
    require(bool(cfg.kv_source_layer_ids), t + "kv_source_layer_ids", "needs at least one KV source")
    for name in ("kv_source_layer_ids", "index_source_layer_ids"):
        zero = [i for i in getattr(cfg, name) if ratios[i] == 0]
        require(not zero, t + name, f"layers {zero} have compress ratio 0 (SWA-only) and cannot be sources")
    missing = sorted(set(cfg.kv_source_layer_ids) - set(cfg.index_source_layer_ids))
    require(not missing, t + "index_source_layer_ids", f"must contain every KV source (Full layers); missing {missing}")
    require(
        cfg.candidate_source_layer_id in cfg.kv_source_layer_ids, t + "candidate_source_layer_id",
        f"{cfg.candidate_source_layer_id} must be a KV source (the Decoder's first Full layer, §3)",
    )
    # Cross-check the Encoder/Decoder split: the Decoder's global branch is the uncompressed one (m=1, §1).
    ones = [i for i, m in enumerate(ratios) if m == 1]
    if ones:
        require(
            ones[0] == cfg.decoder_start, t + "candidate_source_layer_id",
            f"the Decoder starts at the candidate source {cfg.decoder_start} but the first m=1 layer is {ones[0]}",
        )
    require(
        len(cfg.engram_num_embeddings) == len(cfg.engram_layer_ids), t + "engram_num_embeddings",
        f"needs one table size per Engram layer ({len(cfg.engram_layer_ids)}), got {len(cfg.engram_num_embeddings)}",
    )
    require(all(r > 0 for r in cfg.engram_num_embeddings), t + "engram_num_embeddings", "must be positive")
    _derive_layers(cfg)  # raises on inconsistent roles


@functools.lru_cache(maxsize=64)
def layer_table(cfg: V41Config) -> tuple[LayerInfo, ...]:
    """Roles of the ``num_hidden_layers`` trunk layers (the DSpark entries of compress_ratios excluded)."""
    return _derive_layers(cfg)


def path_counts(cfg: V41Config) -> dict[str, int]:
    table = layer_table(cfg)
    return {p: sum(1 for li in table if li.path == p) for p in PATHS}


def kv_owners(cfg: V41Config) -> tuple[LayerInfo, ...]:
    """The Full layers: each stores one main-KV + index-K cache."""
    return tuple(li for li in layer_table(cfg) if li.path == "full")


# --------------------------------------------------------------------------------------------------
# Resident weight inventory
# --------------------------------------------------------------------------------------------------


@attrs.frozen
class WeightSpec:
    """A resident tensor with its logical shape (for FLOPs) before it becomes an IR :class:`Tensor`."""

    name: str
    shape: tuple
    format: str
    module: str
    group: str
    role: str = "weight"

    @property
    def elems(self) -> int:
        return math.prod(self.shape)

    def tensor(self) -> Tensor:
        return Tensor(self.name, self.role, self.format, elems=self.elems, module=self.module, group=self.group)


class _Inv:
    """Collects WeightSpecs; names are ``{module}.{leaf}``."""

    def __init__(self):
        self.specs: list[WeightSpec] = []

    def add(self, module: str, leaf: str, shape, format: str, group: str, role: str = "weight"):
        self.specs.append(WeightSpec(f"{module}.{leaf}", tuple(shape), format, module, group, role))


def _attention(inv: _Inv, cfg: V41Config, p: str, g: str) -> None:
    """§12 attention: wq_a + norm, wq_b, shared-latent wkv + norm, grouped wo_a (bf16), wo_b, sinks."""
    d, fp8 = cfg.hidden_size, cfg.dense_format
    m = f"{p}.attn"
    inv.add(m, "wq_a", (d, cfg.q_lora_rank), fp8, g)
    inv.add(m, "q_norm", (cfg.q_lora_rank,), cfg.norm_format, g)
    inv.add(m, "wq_b", (cfg.q_lora_rank, cfg.q_dim), fp8, g)
    inv.add(m, "wkv", (d, cfg.kv_dim), fp8, g)
    inv.add(m, "kv_norm", (cfg.kv_dim,), cfg.norm_format, g)
    inv.add(m, "wo_a", (cfg.o_groups, cfg.wo_a_in_per_group, cfg.o_lora_rank), cfg.wo_a_format, g)
    inv.add(m, "wo_b", (cfg.o_groups * cfg.o_lora_rank, d), fp8, g)
    inv.add(m, "sink", (cfg.num_attention_heads,), "fp32", g)  # per-head attention sink (§12)


def _moe(inv: _Inv, cfg: V41Config, p: str, g: str, n_experts: int, n_shared: int) -> None:
    """§12 MoE: router, stacked routed experts (FP4), shared expert(s) (dense FP8)."""
    d, f = cfg.hidden_size, cfg.moe_intermediate_size
    inv.add(f"{p}.ffn.gate", "weight", (d, n_experts), cfg.router_format, g)
    inv.add(f"{p}.ffn.gate", "bias", (n_experts,), "fp32", g)  # noaux_tc correction bias
    e = f"{p}.ffn.experts"
    inv.add(e, "w1", (n_experts, d, f), cfg.expert_format, g)
    inv.add(e, "w3", (n_experts, d, f), cfg.expert_format, g)
    inv.add(e, "w2", (n_experts, f, d), cfg.expert_format, g)
    if n_shared:
        s = f"{p}.ffn.shared_experts"
        inv.add(s, "w1", (d, n_shared * f), cfg.dense_format, g)
        inv.add(s, "w3", (d, n_shared * f), cfg.dense_format, g)
        inv.add(s, "w2", (n_shared * f, d), cfg.dense_format, g)


def _mhc(inv: _Inv, cfg: V41Config, p: str, g: str) -> None:
    """§12 mHC per sub-block (attention, FFN): fn [(2+n)n, n·d] fp32 + base + scales."""
    for sub in ("hc_attn", "hc_ffn"):
        inv.add(f"{p}.{sub}", "fn", (cfg.hc_mix_rows, cfg.hc_mix_cols), cfg.mhc_format, g)
        inv.add(f"{p}.{sub}", "base", (cfg.hc_mix_rows,), cfg.mhc_format, g)  # [reconstructed]
        inv.add(f"{p}.{sub}", "scale", (cfg.mhc_scale_params,), cfg.mhc_format, g)  # [reconstructed]


def _block_norms(inv: _Inv, cfg: V41Config, p: str, g: str) -> None:
    inv.add(p, "attn_norm", (cfg.hidden_size,), cfg.norm_format, g)
    inv.add(p, "ffn_norm", (cfg.hidden_size,), cfg.norm_format, g)


def _trunk_layer(inv: _Inv, cfg: V41Config, li: LayerInfo) -> None:
    p, g, d = f"layers.{li.layer}", "trunk", cfg.hidden_size
    _block_norms(inv, cfg, p, g)
    _attention(inv, cfg, p, g)
    if li.path == "full":
        c = f"{p}.attn.compressor"
        if cfg.pooled(li.ratio):
            inv.add(c, "wkv", (d, cfg.head_dim), cfg.compressor_pooled_format, g)
            inv.add(c, "wgate", (d, cfg.head_dim), cfg.compressor_pooled_format, g)
        else:
            inv.add(c, "wkv", (d, cfg.head_dim), cfg.compressor_plain_format, g)
    if li.index_source:
        x = f"{p}.attn.indexer"
        inv.add(x, "wq_b", (cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim), cfg.dense_format, g)
        inv.add(x, "weights_proj", (d, cfg.index_n_heads), cfg.indexer_small_format, g)
        if li.kv_source:  # index K is projected from the compressed main KV, on owners only (§2, §12)
            inv.add(x, "wk", (cfg.head_dim, cfg.index_head_dim), cfg.indexer_small_format, g)
            inv.add(x, "k_norm", (cfg.index_head_dim,), cfg.norm_format, g)
    _moe(inv, cfg, p, g, cfg.n_routed_experts, cfg.n_shared_experts)
    _mhc(inv, cfg, p, g)


def _engram(inv: _Inv, cfg: V41Config) -> None:
    """§6/§12: FP8 table [rows, 256] (+ e8m0 scale per 32), wkv 6144 -> 25600, per-copy gate norms."""
    g = "engram"
    for layer, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
        m = f"layers.{layer}.engram"
        inv.add(m, "table", (rows, cfg.engram_head_dim), cfg.engram_format, g, role="table")
        inv.add(m, "wkv", (cfg.engram_lookup_dim, cfg.engram_proj_out), cfg.engram_format, g)
        # [reconstructed] sigmoid gate σ(norm(h)·norm(k)) per stream copy: two RMSNorms per copy.
        inv.add(m, "gate_norm", (cfg.engram_gate_norms, cfg.hc_mult, cfg.hidden_size), cfg.norm_format, g)


def _dspark(inv: _Inv, cfg: V41Config) -> None:
    """§9/§12: main_proj over the target layers' inputs, SWA-only blocks with their own MoE, Markov and
    confidence heads. Embedding and LM head are the trunk's."""
    g, d = "dspark", cfg.hidden_size
    inv.add("dspark", "main_proj", (len(cfg.dspark_target_layer_ids) * d, d), cfg.dense_format, g)
    for j in range(cfg.n_dspark_blocks):
        p = f"dspark.blocks.{j}"
        _block_norms(inv, cfg, p, g)
        _attention(inv, cfg, p, g)  # SWA-only: no compressor, no indexer
        _moe(inv, cfg, p, g, cfg.dspark_n_routed_experts, cfg.dspark_n_shared_experts)
        if cfg.dspark_has_mhc:
            _mhc(inv, cfg, p, g)
    inv.add("dspark", "norm", (d,), cfg.norm_format, g)  # [reconstructed]
    # Markov head vocab -> rank -> vocab (§12).
    inv.add("dspark.markov", "embed", (cfg.vocab_size, cfg.dspark_markov_rank), cfg.dspark_head_format, g)
    inv.add("dspark.markov", "proj", (cfg.dspark_markov_rank, cfg.vocab_size), cfg.dspark_head_format, g)
    # Confidence head (hidden + rank) -> 1, fp32 (§12).
    inv.add("dspark.confidence", "proj", (d + cfg.dspark_markov_rank, 1), cfg.confidence_format, g)


def _vision(inv: _Inv, cfg: V41Config) -> None:
    """§12: patch embed, bidirectional ViT blocks with SwiGLU, aligner (3×3 unfold -> 2-layer MLP)."""
    v, g = cfg.vision, "vision"
    h, f = v.hidden_size, v.intermediate_size
    inv.add("vision.patch_embed", "weight", (v.patch_dim, h), v.weight_format, g)
    for i in range(v.num_hidden_layers):
        p = f"vision.blocks.{i}"
        inv.add(p, "norm1", (h,), cfg.norm_format, g)
        inv.add(f"{p}.attn", "wqkv", (h, 3 * h), v.weight_format, g)
        inv.add(f"{p}.attn", "wo", (h, h), v.weight_format, g)
        inv.add(p, "norm2", (h,), cfg.norm_format, g)
        inv.add(f"{p}.mlp", "w1", (h, f), v.weight_format, g)
        inv.add(f"{p}.mlp", "w3", (h, f), v.weight_format, g)
        inv.add(f"{p}.mlp", "w2", (f, h), v.weight_format, g)
    inv.add("vision", "norm", (h,), cfg.norm_format, g)  # [reconstructed] final ViT norm
    inv.add("vision.aligner", "fc1", (v.aligner_in, cfg.hidden_size), v.weight_format, g)
    inv.add("vision.aligner", "fc2", (cfg.hidden_size, cfg.hidden_size), v.weight_format, g)


@functools.lru_cache(maxsize=16)
def weight_specs(cfg: V41Config) -> tuple[WeightSpec, ...]:
    """Every resident weight/table with its shape, by physical module. Independent of any workload."""
    inv = _Inv()
    d, v = cfg.hidden_size, cfg.vocab_size
    inv.add("embed", "weight", (v, d), cfg.embed_format, "embed")
    for li in layer_table(cfg):
        _trunk_layer(inv, cfg, li)
    inv.add("norm", "weight", (d,), cfg.norm_format, "embed")  # final norm before the head (§12)
    if not cfg.tie_word_embeddings:
        inv.add("head", "weight", (d, v), cfg.embed_format, "embed")
    _engram(inv, cfg)
    if cfg.n_dspark_blocks:
        _dspark(inv, cfg)
    if cfg.vision is not None:
        _vision(inv, cfg)
    names = [s.name for s in inv.specs]
    assert len(names) == len(set(names)), "weight names must be unique"
    return tuple(inv.specs)


def weight_inventory(cfg: V41Config) -> tuple[Tensor, ...]:
    """Resident tensors (role 'weight' or 'table') with groups embed/trunk/engram/dspark/vision."""
    return tuple(s.tensor() for s in weight_specs(cfg))


# --------------------------------------------------------------------------------------------------
# Parameter summary
# --------------------------------------------------------------------------------------------------

GROUPS = ("embed", "trunk", "engram", "dspark", "vision")


@attrs.frozen
class ParamSummary:
    """Parameter counts (elements, scales excluded) and resident bytes (scales included)."""

    params: tuple  #: ((group, params), ...)
    bytes: tuple  #: ((group, bytes), ...)
    active_per_layer: int  #: attention + top-k routed + shared + router + mHC (the §12 definition)
    active_by_layer: tuple  #: per trunk layer, plus its own compressor / indexer

    def group(self, name: str) -> int:
        return dict(self.params)[name]

    def group_bytes(self, name: str) -> float:
        return dict(self.bytes)[name]

    @property
    def total(self) -> int:
        return sum(p for _, p in self.params)

    @property
    def trunk_with_embed(self) -> int:
        """What V41_FACTS §12 calls "trunk" (551.6 B): trunk layers + embedding + head."""
        return self.group("trunk") + self.group("embed")

    @property
    def active_trunk(self) -> int:
        return sum(self.active_by_layer)


def _layer_active(cfg: V41Config, specs: tuple[WeightSpec, ...], layer: int, *, own_extras: bool) -> int:
    p = f"layers.{layer}."
    frac = cfg.num_experts_per_tok / cfg.n_routed_experts
    total = 0.0
    for s in specs:
        if not s.name.startswith(p) or s.group != "trunk":
            continue
        if ".attn.compressor." in s.name or ".attn.indexer." in s.name:
            total += s.elems if own_extras else 0
        elif ".ffn.experts." in s.name:
            total += s.elems * frac  # top-k of the stacked routed experts
        else:
            total += s.elems
    return round(total)


def param_summary(cfg: V41Config) -> ParamSummary:
    specs = weight_specs(cfg)
    groups = [g for g in GROUPS if any(s.group == g for s in specs)]
    params = tuple((g, sum(s.elems for s in specs if s.group == g)) for g in groups)
    nbytes = tuple((g, sum(fmt(s.format).nbytes(s.elems) for s in specs if s.group == g)) for g in groups)
    table = layer_table(cfg)
    reuse = next((li.layer for li in table if li.path == "reuse"), table[-1].layer)
    return ParamSummary(
        params=params,
        bytes=nbytes,
        active_per_layer=_layer_active(cfg, specs, reuse, own_extras=False),
        active_by_layer=tuple(_layer_active(cfg, specs, li.layer, own_extras=True) for li in table),
    )


# --------------------------------------------------------------------------------------------------
# KV capacity (V41_FACTS §8)
# --------------------------------------------------------------------------------------------------


@attrs.frozen
class KVCapacity:
    """Cache bytes held for one request of ``n_tokens`` positions. Shared KV is stored once per owner."""

    n_tokens: int
    entries: tuple  #: ((owner layer, compressed entries), ...)
    global_entries: int
    main_kv_bytes: float
    index_k_bytes: float
    swa_bytes: float
    partial_group_bytes: float  #: fp32 compressor state buffers of the owners that pool groups
    #: the rows of those buffers that hold pending positions: what a handover or restore moves
    pending_bytes: float = 0.0

    @property
    def global_bytes(self) -> float:
        return self.main_kv_bytes + self.index_k_bytes

    @property
    def total(self) -> float:
        return self.global_bytes + self.swa_bytes + self.partial_group_bytes

    def entries_of(self, layer: int) -> int:
        return dict(self.entries)[layer]


def main_kv_entry_bytes(cfg: V41Config) -> float:
    return fmt(cfg.main_kv_format).nbytes(cfg.kv_dim)  # 512 × (0.5 + 1/16) = 288 (§8)


def index_k_entry_bytes(cfg: V41Config) -> float:
    return fmt(cfg.index_k_format).nbytes(cfg.index_head_dim)  # 128 × (0.5 + 1/32) = 68 (§8)


def swa_entry_bytes(cfg: V41Config) -> float:
    return fmt(cfg.swa_kv_format).nbytes(cfg.kv_dim)  # 512 × 1 = 512 (§8)


def compressor_state_row_bytes(cfg: V41Config) -> float:
    """fp32 kv + score planes of one group row: 2 × 512 × 4 = 4096 B (§12 "[2,512] fp32")."""
    return cfg.compressor_state_planes * fmt(cfg.compressor_state_format).nbytes(cfg.head_dim)


def compressor_state_bytes(cfg: V41Config, m: int, n_tokens: int) -> float:
    """The state buffer one pooled (m > 1) owner allocates for a request with positions: m rows of kv +
    score planes (8,192 B for m = 2), however many of them are pending — capacity is monotone in N."""
    return m * compressor_state_row_bytes(cfg) if cfg.pooled(m) and n_tokens > 0 else 0.0


def kv_capacity(cfg: V41Config, n_tokens: int, *, dspark: bool = False) -> KVCapacity:
    """Cache capacity of one request after ``n_tokens`` positions (§8): ⌊N/m⌋ entries per owner, main KV
    and index K on owners, SWA on every trunk layer (+ DSpark blocks when ``dspark``), partial groups."""
    require(_is_int(n_tokens) and n_tokens >= 0, "n_tokens", f"must be a non-negative integer, got {n_tokens!r}")
    owners = kv_owners(cfg)
    entries = tuple((li.layer, n_tokens // li.ratio) for li in owners)
    total = sum(e for _, e in entries)
    swa_layers = cfg.num_hidden_layers + (cfg.n_dspark_blocks if dspark else 0)
    state = sum(compressor_state_bytes(cfg, li.ratio, n_tokens) for li in owners)
    return KVCapacity(
        n_tokens=n_tokens,
        entries=entries,
        global_entries=total,
        main_kv_bytes=total * main_kv_entry_bytes(cfg),
        index_k_bytes=total * index_k_entry_bytes(cfg),
        swa_bytes=swa_layers * min(n_tokens, cfg.sliding_window) * swa_entry_bytes(cfg),
        partial_group_bytes=state,
        pending_bytes=sum(n_tokens % li.ratio for li in owners if cfg.pooled(li.ratio)) * compressor_state_row_bytes(cfg),
    )


def kv_bytes_per_token(cfg: V41Config) -> float:
    """Asymptotic global-cache slope: Σ_owners (main + index K) / m = 890 B/token (§8)."""
    per_entry = main_kv_entry_bytes(cfg) + index_k_entry_bytes(cfg)
    return sum(per_entry / li.ratio for li in kv_owners(cfg))


# --------------------------------------------------------------------------------------------------
# Engram (V41_FACTS §6)
# --------------------------------------------------------------------------------------------------


def engram_table_bytes(cfg: V41Config) -> float:
    """Resident bytes of all Engram tables: Σ rows × head_dim × (1 + 1/32) = 202,758,032,400 B."""
    per_row = fmt(cfg.engram_format).nbytes(cfg.engram_head_dim)
    return sum(cfg.engram_num_embeddings) * per_row


def engram_lookup_bytes_per_token(cfg: V41Config) -> float:
    """Logical row payload one module gathers per token: 24 rows × 256 × (1 + 1/32) = 6,336 B."""
    return fmt(cfg.engram_format).nbytes(cfg.engram_lookup_dim)


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_config(path) -> V41Config:
    """Read a JSON config file."""
    import json
    from pathlib import Path

    return V41Config.from_dict(json.loads(Path(path).read_text()))
