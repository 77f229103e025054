"""DeepSeek-V4-Flash baseline semantics (V41_FACTS §13): config, layer roles, weights, KV capacity.

The facts give hidden 4096, 43 layers, 256 routed + 1 shared top-6, q_lora 1024, CSA m=4 / HCA m=128
alternating, indexer 64 × 128 top-512, 3 hash-routed layers, FP8 128×128 and 1 MTP layer. Everything else
is an assumption recorded in ``configs/deepseek-v4-flash.json`` under ``"_assumptions"`` (with reasons);
the storage layout of the caches is a set of :class:`V4Config` fields whose defaults say what is assumed.

Unlike V4.1 nothing is shared across layers: every compressed layer owns its KV (CSA with its own
indexer and Top-K, HCA reading all of its compressed entries), and every layer keeps its own SWA window.
"""
from __future__ import annotations

import functools
from typing import Mapping

import attrs

from graphsim.core.errors import one_of, require
from graphsim.core.ir import Tensor, fmt
from graphsim.core.limits import MAX_CONTEXT

from .deepseek_v41 import (
    KVCapacity,
    WeightSpec,
    _f,
    _Inv,
    _is_int,
    _parse,
    _parse_fields,
    _quant_formats,
    _section,
)

ATTN_KINDS = ("swa_only", "csa", "hca")


@attrs.frozen
class V4Config:
    """DeepSeek-V4-Flash config (flat HF layout; a nested ``text_config`` is accepted too)."""

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
    num_hash_layers: int = _f("int")
    sliding_window: int = _f("int")
    compress_ratios: tuple = _f("ints")
    index_n_heads: int = _f("int")
    index_head_dim: int = _f("int")
    index_topk: int = _f("int")
    hc_mult: int = _f("int")
    hc_sinkhorn_iters: int = _f("int")
    num_nextn_predict_layers: int = _f("int")
    tie_word_embeddings: bool = _f("bool", False)
    max_position_embeddings: int = _f("int", MAX_CONTEXT)

    dense_format: str = "fp8_b128x128"  # from quantization_config (see _assumptions.scale_fmt)
    expert_format: str = "fp4_ue8m0_32"

    # ---- assumptions (configs/deepseek-v4-flash.json "_assumptions"); overridable from the dict -----
    indexer_ratios: tuple = _f("ints", (4,))  # CSA = the ratio that carries an indexer; others are HCA
    kv_nope_format: str = _f("format", "fp8")  # kv_format: 448 non-RoPE dims FP8
    kv_rope_format: str = _f("format", "bf16")  # kv_format: 64 RoPE dims bf16
    kv_scale_bytes: int = _f("int", 8)  # kv_format: 7 UE8M0 per-64 scales + 1 pad
    index_k_format: str = _f("format", "fp8")  # kv_format: index K FP8
    index_k_scale_bytes: int = _f("int", 4)  # kv_format: one fp32 scale per index key
    compressor_format: str = _f("format", "bf16")  # compressor: wkv/wgate bf16
    compressor_state_format: str = _f("format", "fp32")
    wo_a_format: str = _f("format", "bf16")
    norm_format: str = _f("format", "bf16")
    router_format: str = _f("format", "bf16")
    embed_format: str = _f("format", "bf16")
    mhc_format: str = _f("format", "fp32")
    mhc_scale_params: int = _f("int", 3)
    # tid2eid holds 4-byte integer expert ids; FORMATS has no int32, fp32 has the same 4 bytes.
    hash_table_format: str = _f("format", "fp32")

    def __attrs_post_init__(self):
        t = ""
        n = self.num_hidden_layers
        for name in ("vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "head_dim",
                     "num_attention_heads", "num_key_value_heads", "q_lora_rank", "o_lora_rank", "o_groups",
                     "n_routed_experts", "num_experts_per_tok", "sliding_window", "index_n_heads",
                     "index_head_dim", "index_topk", "hc_mult"):
            require(getattr(self, name) > 0, t + name, f"must be positive, got {getattr(self, name)}")
        require(0 <= self.num_hash_layers <= n, "num_hash_layers", f"must lie in [0, {n}]")
        require(self.num_nextn_predict_layers >= 0, "num_nextn_predict_layers", "must be >= 0")
        require(self.num_attention_heads % self.o_groups == 0, "o_groups", "must divide num_attention_heads")
        require(0 < self.qk_rope_head_dim < self.head_dim, "qk_rope_head_dim", "must lie in (0, head_dim)")
        want = n + self.num_nextn_predict_layers
        require(
            len(self.compress_ratios) == want, "compress_ratios",
            f"needs num_hidden_layers + num_nextn_predict_layers = {want} entries, got {len(self.compress_ratios)}",
        )
        require(all(m >= 0 for m in self.compress_ratios), "compress_ratios", "ratios must be >= 0")

    @classmethod
    def from_dict(cls, d: Mapping) -> "V4Config":
        require(isinstance(d, Mapping), "config", f"must be a mapping, got {type(d).__name__}")
        if "text_config" in d:
            text, where = _section(d, "text_config", required=True), "text_config."
        else:
            text, where = d, ""
        kw = _parse_fields(cls, text, where)
        quant = dict(_section(d, "quantization_config", required=True))
        # The public V4 config keeps expert_dtype at the top level.
        if "expert_dtype" not in quant and "expert_dtype" in text:
            quant["expert_dtype"] = _parse(text["expert_dtype"], "str", where + "expert_dtype")
        kw["dense_format"], kw["expert_format"] = _quant_formats(quant)
        return cls(**kw)

    @property
    def trunk_ratios(self) -> tuple[int, ...]:
        return self.compress_ratios[: self.num_hidden_layers]

    @property
    def mtp_ratios(self) -> tuple[int, ...]:
        return self.compress_ratios[self.num_hidden_layers :]

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def hc_mix_rows(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult  # n pre + n post + n×n residual mix

    @property
    def hc_mix_cols(self) -> int:
        return self.hc_mult * self.hidden_size

    def has_indexer(self, m: int) -> bool:
        return m in self.indexer_ratios

    def coff(self, m: int) -> int:
        """CSA compresses overlapping windows (~2m positions, V41_FACTS §2): two planes per projection."""
        return 2 if self.has_indexer(m) else 1


@attrs.frozen
class V4LayerInfo:
    layer: int
    attn: str = attrs.field(validator=one_of("layer", ATTN_KINDS))
    ratio: int
    kv_owner: int | None  #: itself for every compressed layer (no sharing in V4)
    topk_producer: int | None  #: itself for CSA; None for HCA (reads every entry) and SWA-only
    hash_routed: bool

    @property
    def path(self) -> str:
        """In CSA2 terms every compressed V4 layer is a Full layer."""
        return "swa_only" if self.ratio == 0 else "full"

    @property
    def kv_source(self) -> bool:
        """Every compressed layer owns (produces and stores) its KV."""
        return self.ratio > 0


def _attn_kind(cfg: V4Config, m: int) -> str:
    return "swa_only" if m == 0 else ("csa" if cfg.has_indexer(m) else "hca")


@functools.lru_cache(maxsize=16)
def layer_table(cfg: V4Config) -> tuple[V4LayerInfo, ...]:
    """Trunk layers only (the MTP entries of compress_ratios excluded)."""
    return tuple(
        V4LayerInfo(
            layer=i, attn=_attn_kind(cfg, m), ratio=m,
            kv_owner=i if m else None,
            topk_producer=i if cfg.has_indexer(m) else None,
            hash_routed=i < cfg.num_hash_layers,  # assumption: the first num_hash_layers layers
        )
        for i, m in enumerate(cfg.trunk_ratios)
    )


def attn_counts(cfg: V4Config) -> dict[str, int]:
    table = layer_table(cfg)
    return {k: sum(1 for li in table if li.attn == k) for k in ATTN_KINDS}


# --------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------


def _mhc(inv: _Inv, cfg: V4Config, p: str, g: str) -> None:
    for sub in ("hc_attn", "hc_ffn"):
        inv.add(f"{p}.{sub}", "fn", (cfg.hc_mix_rows, cfg.hc_mix_cols), cfg.mhc_format, g)
        inv.add(f"{p}.{sub}", "base", (cfg.hc_mix_rows,), cfg.mhc_format, g)
        inv.add(f"{p}.{sub}", "scale", (cfg.mhc_scale_params,), cfg.mhc_format, g)


def _hc_head(inv: _Inv, cfg: V4Config, p: str, g: str) -> None:
    """V4's separate mHC head collapsing the n streams before the final norm (dropped in V4.1)."""
    inv.add(p, "fn", (cfg.hc_mult, cfg.hc_mix_cols), cfg.mhc_format, g)
    inv.add(p, "base", (cfg.hc_mult,), cfg.mhc_format, g)
    inv.add(p, "scale", (1,), cfg.mhc_format, g)


def _compressor(inv: _Inv, cfg: V4Config, p: str, g: str, m: int, width: int) -> None:
    c, w = cfg.coff(m), cfg.compressor_format
    inv.add(p, "wkv", (cfg.hidden_size, c * width), w, g)
    inv.add(p, "wgate", (cfg.hidden_size, c * width), w, g)
    inv.add(p, "ape", (m, c * width), "fp32", g)  # absolute position term inside a group (§2)
    inv.add(p, "norm", (width,), cfg.norm_format, g)


def _block(inv: _Inv, cfg: V4Config, p: str, g: str, m: int, hash_routed: bool) -> None:
    d, fp8, f, e = cfg.hidden_size, cfg.dense_format, cfg.moe_intermediate_size, cfg.n_routed_experts
    inv.add(p, "attn_norm", (d,), cfg.norm_format, g)
    a = f"{p}.attn"
    inv.add(a, "wq_a", (d, cfg.q_lora_rank), fp8, g)
    inv.add(a, "q_norm", (cfg.q_lora_rank,), cfg.norm_format, g)
    inv.add(a, "wq_b", (cfg.q_lora_rank, cfg.q_dim), fp8, g)
    inv.add(a, "wkv", (d, cfg.kv_dim), fp8, g)
    inv.add(a, "kv_norm", (cfg.kv_dim,), cfg.norm_format, g)
    inv.add(a, "wo_a", (cfg.o_groups, cfg.q_dim // cfg.o_groups, cfg.o_lora_rank), cfg.wo_a_format, g)
    inv.add(a, "wo_b", (cfg.o_groups * cfg.o_lora_rank, d), fp8, g)
    inv.add(a, "sink", (cfg.num_attention_heads,), "fp32", g)
    if m:
        _compressor(inv, cfg, f"{a}.compressor", g, m, cfg.head_dim)
    if cfg.has_indexer(m):
        x = f"{a}.indexer"
        inv.add(x, "wq_b", (cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim), fp8, g)
        inv.add(x, "weights_proj", (d, cfg.index_n_heads), "bf16", g)
        _compressor(inv, cfg, f"{x}.compressor", g, m, cfg.index_head_dim)
    inv.add(p, "ffn_norm", (d,), cfg.norm_format, g)
    inv.add(f"{p}.ffn.gate", "weight", (d, e), cfg.router_format, g)
    if hash_routed:
        inv.add(f"{p}.ffn.gate", "tid2eid", (cfg.vocab_size, cfg.num_experts_per_tok), cfg.hash_table_format, g)
    else:
        inv.add(f"{p}.ffn.gate", "bias", (e,), "fp32", g)
    x = f"{p}.ffn.experts"
    inv.add(x, "w1", (e, d, f), cfg.expert_format, g)
    inv.add(x, "w3", (e, d, f), cfg.expert_format, g)
    inv.add(x, "w2", (e, f, d), cfg.expert_format, g)
    if cfg.n_shared_experts:
        s, fs = f"{p}.ffn.shared_experts", cfg.n_shared_experts * f
        inv.add(s, "w1", (d, fs), fp8, g)
        inv.add(s, "w3", (d, fs), fp8, g)
        inv.add(s, "w2", (fs, d), fp8, g)
    _mhc(inv, cfg, p, g)


@functools.lru_cache(maxsize=16)
def weight_specs(cfg: V4Config) -> tuple[WeightSpec, ...]:
    inv = _Inv()
    d, v = cfg.hidden_size, cfg.vocab_size
    inv.add("embed", "weight", (v, d), cfg.embed_format, "embed")
    for li in layer_table(cfg):
        _block(inv, cfg, f"layers.{li.layer}", "trunk", li.ratio, li.hash_routed)
    _hc_head(inv, cfg, "hc_head", "embed")
    inv.add("norm", "weight", (d,), cfg.norm_format, "embed")
    if not cfg.tie_word_embeddings:
        inv.add("head", "weight", (d, v), cfg.embed_format, "embed")
    for j, m in enumerate(cfg.mtp_ratios):
        p, g = f"mtp.{j}", "mtp"
        inv.add(p, "e_proj", (d, d), cfg.dense_format, g)
        inv.add(p, "h_proj", (d, d), cfg.dense_format, g)
        inv.add(p, "enorm", (d,), cfg.norm_format, g)
        inv.add(p, "hnorm", (d,), cfg.norm_format, g)
        _block(inv, cfg, f"{p}.block", g, m, hash_routed=False)
        inv.add(p, "norm", (d,), cfg.norm_format, g)
        _hc_head(inv, cfg, f"{p}.hc_head", g)
    names = [s.name for s in inv.specs]
    assert len(names) == len(set(names)), "weight names must be unique"
    return tuple(inv.specs)


def weight_inventory(cfg: V4Config) -> tuple[Tensor, ...]:
    """Resident weights, groups embed / trunk / mtp. Independent of any workload."""
    return tuple(s.tensor() for s in weight_specs(cfg))


def param_summary(cfg: V4Config) -> dict[str, float]:
    """Params per group, ``total`` (embed + trunk, the published-size convention: MTP excluded),
    ``active_per_layer`` (a non-hash CSA layer: attention + top-k + shared + router + mHC + own
    compressor/indexer) and ``active`` (all trunk layers + the LM head)."""
    specs = weight_specs(cfg)
    out = {g: sum(s.elems for s in specs if s.group == g) for g in ("embed", "trunk", "mtp")}
    out["total"] = out["embed"] + out["trunk"]
    frac = cfg.num_experts_per_tok / cfg.n_routed_experts

    def active(layer: int) -> float:
        p = f"layers.{layer}."
        return sum(
            s.elems * (frac if ".ffn.experts." in s.name else 1.0)
            for s in specs
            if s.name.startswith(p) and not s.name.endswith(".tid2eid")  # a lookup table, not a matmul
        )

    table = layer_table(cfg)
    csa = next(li.layer for li in table if li.attn == "csa")
    out["active_per_layer"] = round(active(csa))
    out["active"] = round(sum(active(li.layer) for li in table)) + cfg.hidden_size * cfg.vocab_size
    return out


# --------------------------------------------------------------------------------------------------
# KV capacity
# --------------------------------------------------------------------------------------------------


def main_kv_entry_bytes(cfg: V4Config) -> float:
    """448 FP8 + 64 bf16 + 8 B scales = 584 B (assumption kv_format)."""
    rope = cfg.qk_rope_head_dim
    return (fmt(cfg.kv_nope_format).nbytes(cfg.kv_dim - rope) + fmt(cfg.kv_rope_format).nbytes(rope)
            + cfg.kv_scale_bytes)


def index_k_entry_bytes(cfg: V4Config) -> float:
    """128 FP8 + one fp32 scale = 132 B (assumption kv_format)."""
    return fmt(cfg.index_k_format).nbytes(cfg.index_head_dim) + cfg.index_k_scale_bytes


def swa_entry_bytes(cfg: V4Config) -> float:
    return main_kv_entry_bytes(cfg)  # assumption: the SWA window uses the same FP8 + bf16-RoPE layout


def _state_bytes(cfg: V4Config, m: int, width: int, n_tokens: int) -> float:
    """The fp32 kv and score state buffers a compressor allocates per request: [coff·m, coff·width] each
    (the reference Compressor's ``kv_state``/``score_state``; CSA's coff = 2 holds the overlapping window),
    whatever number of positions is pending — so capacity is monotone in N."""
    if n_tokens <= 0:
        return 0.0
    c = cfg.coff(m)
    return 2 * (c * m) * fmt(cfg.compressor_state_format).nbytes(c * width)


def owner_kv_bytes(cfg: V4Config, li: V4LayerInfo, n_tokens: int) -> float:
    """One compressed layer's own global cache for one request: main KV (+ index K on CSA) per completed
    group, and its compressors' state buffers."""
    if not li.ratio:
        return 0.0
    csa = li.attn == "csa"
    entry = main_kv_entry_bytes(cfg) + (index_k_entry_bytes(cfg) if csa else 0.0)
    state = _state_bytes(cfg, li.ratio, cfg.head_dim, n_tokens)
    if csa:
        state += _state_bytes(cfg, li.ratio, cfg.index_head_dim, n_tokens)
    return (n_tokens // li.ratio) * entry + state


def kv_capacity(cfg: V4Config, n_tokens: int, *, mtp: bool = False) -> KVCapacity:
    """Every compressed layer stores ⌊N/m⌋ main-KV entries; CSA layers also index K; every trunk layer
    (+ the MTP block when ``mtp``) keeps min(N, window) SWA entries."""
    require(_is_int(n_tokens) and n_tokens >= 0, "n_tokens", f"must be a non-negative integer, got {n_tokens!r}")
    owners = [li for li in layer_table(cfg) if li.ratio]
    entries = tuple((li.layer, n_tokens // li.ratio) for li in owners)
    csa_entries = sum(n_tokens // li.ratio for li in owners if li.attn == "csa")
    total = sum(e for _, e in entries)
    partial = sum(_state_bytes(cfg, li.ratio, cfg.head_dim, n_tokens) for li in owners)
    partial += sum(_state_bytes(cfg, li.ratio, cfg.index_head_dim, n_tokens) for li in owners if li.attn == "csa")
    pending = sum((n_tokens % li.ratio) * cfg.coff(li.ratio) * 2 * fmt(cfg.compressor_state_format).nbytes(
        cfg.coff(li.ratio) * (cfg.head_dim + (cfg.index_head_dim if li.attn == "csa" else 0))) for li in owners)
    swa_layers = cfg.num_hidden_layers + (len(cfg.mtp_ratios) if mtp else 0)
    return KVCapacity(
        n_tokens=n_tokens,
        entries=entries,
        global_entries=total,
        main_kv_bytes=total * main_kv_entry_bytes(cfg),
        index_k_bytes=csa_entries * index_k_entry_bytes(cfg),
        swa_bytes=swa_layers * min(n_tokens, cfg.sliding_window) * swa_entry_bytes(cfg),
        partial_group_bytes=partial,
        pending_bytes=pending,
    )


def kv_bytes_per_token(cfg: V4Config) -> float:
    """Asymptotic global-cache slope: Σ_layers (main [+ index K on CSA]) / m."""
    main, idx = main_kv_entry_bytes(cfg), index_k_entry_bytes(cfg)
    return sum((main + (idx if li.attn == "csa" else 0)) / li.ratio for li in layer_table(cfg) if li.ratio)


def load_config(path) -> V4Config:
    import json
    from pathlib import Path

    return V4Config.from_dict(json.loads(Path(path).read_text()))


__all__ = [
    "ATTN_KINDS", "V4Config", "V4LayerInfo", "attn_counts", "index_k_entry_bytes",
    "kv_bytes_per_token", "kv_capacity", "layer_table", "load_config", "main_kv_entry_bytes",
    "param_summary", "swa_entry_bytes", "weight_inventory", "weight_specs",
]
