"""What every model offers: resident weights, a graph builder for a request structure, mapping checks."""
from __future__ import annotations

from typing import Sequence

from ..builder import GraphBuilder
from ..errors import GraphsimError, require
from ..ir import ONE, CommSpec, Cost, Feature, Graph, Tensor, fmt, wider
from ..plan import ParallelMapping
#: The cache an attention kernel at this precision reads (FP8 attention reads FP8 Q/K/V and an FP8 cache;
#: FP4 attention an E2M1 cache with E4M3 scales per 16), where the checkpoint's cache is wider.
KV_FORMAT_AT = {"fp8": "fp8", "fp4": "fp4_e2m1_e4m3_16"}


class Model:
    """Base class: subclasses set ``name``/``family`` and implement ``weights``, ``_build`` and ``kv_bytes``."""

    name = "model"
    family = "model"

    def weights(self) -> tuple[Tensor, ...]:
        """Resident inventory by physical module (never depends on the workload)."""
        raise NotImplementedError

    def kv_bytes(self, context: int, policies=None) -> float:
        """KV-cache bytes one request holds at ``context`` tokens (all layers, whole model) under ``policies``
        (an FP8 attention reads, so stores, an FP8 cache)."""
        raise NotImplementedError

    #: the checkpoint's KV-cache storage format(s) the attention reads (models set it from the config)
    kv_format = "bf16"

    def kv_formats(self) -> tuple[str, ...]:
        return (self.kv_format,)

    def attention_precision(self, policies=None) -> str:
        """The precision the attention math runs at: the plan's ``attention_precision``, or ("auto") the
        widest compute precision of the caches it reads (a BF16 cache -> BF16, an FP8 cache -> FP8; a
        storage-only FP4 cache such as V4.1's main KV is dequantized first -> BF16)."""
        p = getattr(policies, "attention_precision", "auto") if policies is not None else "auto"
        if p != "auto":
            return p
        out = "fp4"
        for f in self.kv_formats():
            out = wider(out, fmt(f).compute)
        return out

    def max_context(self) -> int:
        """Longest context the model was built for (``max_position_embeddings``; the graphsim bound when the
        config has none): requests beyond it are refused unless the plan allows beyond-context what-ifs."""
        from ..limits import MAX_CONTEXT

        cfg = getattr(self, "cfg", None)
        return int(getattr(cfg, "max_position", None) or getattr(cfg, "max_position_embeddings", None) or MAX_CONTEXT)

    def residual_bytes_per_token(self) -> float:
        """The residual state one token carries from layer to layer, in BF16 (mHC keeps ``hc_mult`` streams):
        what a pipeline stage sends on and what a scattered layer gathers back."""
        cfg = getattr(self, "cfg", None)
        hidden = getattr(cfg, "hidden", None) or getattr(cfg, "hidden_size", None)
        require(isinstance(hidden, int), "model", f"{self.name}: no hidden size in its config")
        return 2.0 * hidden * getattr(cfg, "hc_mult", 1)

    def kv_cache_format(self, policies=None) -> str:
        """The KV cache as stored under ``policies``: the checkpoint's, narrowed to what an explicitly lower
        attention precision reads (FP8 attention keeps an FP8 cache)."""
        p = self.attention_precision(policies)
        if p in KV_FORMAT_AT and fmt(KV_FORMAT_AT[p]).bytes_per_elem < fmt(self.kv_format).bytes_per_elem:
            return KV_FORMAT_AT[p]
        return self.kv_format

    def validate_mapping(self, mapping: ParallelMapping) -> None:
        """Raise GraphsimError for mappings that cannot exist for this model."""

    def build(self, kinds: Sequence[str], **options) -> Graph:
        """The logical (unsharded) graph for a batch whose request groups have ``kinds``."""
        kinds = tuple(kinds)
        if not kinds:
            raise GraphsimError("requests", "give at least one request")
        b = GraphBuilder(self.name, meta={"model": self.name, "kinds": kinds,
                                          "attention_precision": self.attention_precision(options.get("policies")),
                                          "residual_bytes": self.residual_bytes_per_token()})
        for t in self.weights():
            b.tensor(t.name, t.role, t.format, elems=t.elems, module=t.module, group=t.group)
        self._build(b, kinds, **options)
        return b.build()

    def _build(self, b: GraphBuilder, kinds: tuple, **options) -> None:
        raise NotImplementedError


def divides(field: str, parts: int, total: int, what: str) -> None:
    if total % parts:
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        raise GraphsimError(field, f"{parts} does not divide {what} ({total}); allowed: {divisors}")


def tokens(ts: str) -> Feature:
    return Feature("tokens", ts)


def rmsnorm(b: GraphBuilder, name: str, ts: str, d: int, *, split=("dp",), out_bytes: float = 2.0, **kw) -> str:
    """RMSNorm: read bf16, write ``out_bytes`` (2 = bf16, 1 = fused FP8 quantization); ~4 flops/elem."""
    return b.elementwise(name, ts, d, bytes_in=2.0, bytes_out=out_bytes, flops_per_elem=4.0, kind="norm",
                         split=split, **kw)


def all_reduce_tp(ts: str, hidden: int, bytes_per: float = 2.0, note: str = "", merge: str = "") -> CommSpec:
    """TP all-reduce of a row-parallel output (batch-wide payload; the sharding pass takes the rank share)."""
    return CommSpec("all_reduce", "tp", Cost.of(tokens(ts), bytes_act=hidden * bytes_per), note=note, merge=merge)


#: Routed and shared expert outputs are summed before one all-reduce when their groups coincide.
MOE_OUT = "moe_out"


def swiglu_mlp(b: GraphBuilder, prefix: str, ts: str, hidden: int, inter: int, *, weights: tuple[str, str],
               act_in: str = "bf16", merge: str = "") -> str:
    """Dense SwiGLU MLP with TP: gate/up fused column-parallel, down row-parallel + all-reduce."""
    up, down = weights
    b.gemm(f"{prefix}gate_up", ts, hidden, 2 * inter, weight=up, act_in=act_in, split=("tp", "dp"))
    b.elementwise(f"{prefix}swiglu", ts, inter, bytes_in=4.0, bytes_out=2.0, flops_per_elem=4.0,
                  kind="activation", split=("tp", "dp"), exps=inter)  # SiLU: one exp per element
    return b.gemm(f"{prefix}down", ts, inter, hidden, weight=down, act_in=act_in, split=("tp", "dp"),
                  comm=(all_reduce_tp(ts, hidden, note="row-parallel down", merge=merge),))


def embedding(b: GraphBuilder, ts: str, hidden: int, weight: str) -> str:
    """Embedding gather: reads one row per token (never the whole table)."""
    cost = Cost.of(tokens(ts), bytes_act=hidden * 2.0 * 2)
    return b.op("embed", "embedding", cost, token_set=ts, reads=(weight,), split=("dp",),
                formula=f"gather {hidden} bf16 per token", deps=())


def lm_head(b: GraphBuilder, ts: str, hidden: int, vocab: int, weight: str) -> str:
    """Final norm + vocabulary projection on the positions that need logits."""
    rmsnorm(b, "final_norm", ts, hidden)
    return b.gemm("head", ts, hidden, vocab, weight=weight, split=("tp", "dp"), act_out="fp32",
                  comm=(CommSpec("all_gather", "tp", Cost.of(tokens(ts), bytes_act=vocab * 4.0), note="logits"),))


#: Where a prefix-cache hit is copied from, and the links its bytes cross: host memory over C2C/PCIe; local
#: NVMe, then the same host link (a GPUDirect read crosses the same PCIe/C2C port). HBM hits copy nothing.
RESTORE_LINKS = {"host": ("bytes_c2c",), "disk": ("bytes_disk", "bytes_c2c")}


def restore_sets(b: GraphBuilder, swa_window: int = 0) -> None:
    """Token sets of a prefix restore, per tier: the cached positions (``cached_<tier>``) and, for a model
    with an SWA cache, the kept window (``cached_swa_<tier>``; none when the window is replayed). Declares the
    ``restore`` stage first, so reports list it before the trunk."""
    b.declare_stage("restore")
    for tier in RESTORE_LINKS:
        b.token_set(f"cached_{tier}", prefill=f"cached@{tier}", decode="none")
        if swa_window:
            b.token_set(f"cached_swa_{tier}", prefill=f"cached_swa:{swa_window}@{tier}", decode="none")


def restore_copy(b: GraphBuilder, bytes_of, *, split=("dp",), params: dict | None = None) -> str:
    """One layer's prefix restore on the host-copy stream: ``bytes_of(tier)`` -> [(feature, bytes)] for the
    ``cached_<tier>`` sets of :func:`restore_sets`. Models issue every layer's copy up front, in layer order,
    with no data dependency (the hits are known before the forward), so later layers' copies overlap
    earlier layers' compute; the caller makes the layer's first reader of the cache wait for it."""
    terms = [(link, f, v) for tier, links in RESTORE_LINKS.items() for f, v in bytes_of(tier) for link in links]
    with b.stage("restore"):
        return b.op("restore", "host_copy", Cost(tuple(terms)), stream="host_copy", token_set="cached_host",
                    split=split, deps=(), params=params,
                    formula="cached KV of this layer: host hits over C2C/PCIe, disk hits from NVMe then C2C/PCIe")


def attention_act_bytes(precision: str) -> float:
    """Bytes per element of the Q/K/V an attention kernel at ``precision`` reads and writes (FP8 attention
    runs on FP8 operands; BF16 on BF16)."""
    return fmt(KV_FORMAT_AT.get(precision, precision)).bytes_per_elem


__all__ = ["Model", "divides", "attention_act_bytes", "restore_sets", "restore_copy", "tokens", "rmsnorm",
           "all_reduce_tp", "swiglu_mlp", "embedding", "lm_head", "ONE", "MOE_OUT"]
