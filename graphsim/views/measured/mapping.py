"""Op -> measured table, in one place: for every op kind, the table family that times it, the identity its
rows must carry, the shape coordinates fixed by the op and those that vary with the workload point.

Shapes are per rank, read off the **sharded** op: a GEMM's m is its FLOPs / (2·k·n·copies) of one rank
(so micro-batch fractions, chunks, DP/CP token splits and EP imbalance are the ones the SOL view prices);
the TP-split dimension is k for a row-parallel layer (one that all-reduces over TP) and n otherwise; heads
are divided by TP. A varying coordinate is a ratio of two linear forms over workload features.

Norms, gated activations and plain cache writes are timed by the ``elementwise`` (rmsnorm, silu_mul) and
``copy`` families that a local collector writes (``graphsim collect ops``); runtime tables imported from
aiconfigurator have neither, so with a backend that has no partition of such a family on the device at all
these ops stay at SOL, labelled ``sol``, in every view (see :func:`_not_collected`). Op kinds with no table
family (other elementwise ops, quantize, embedding lookups, host copies, Engram, the V4 compressor/indexer
parts, ...) are not "missing data": no collector times them at graphsim's op boundary, so every view prices
them at SOL and labels them ``sol``. Where a table times a fused module (the mHC pre/post modules,
aiconfigurator's MLA and DeepSeek-V4 attention modules) and graphsim prices the parts, the parts are not
matched to it: the boundary differs, and the report says so.
"""
from __future__ import annotations

import re
from typing import Callable

import attrs

from graphsim.core.ir import Feature, Op, fmt

#: graphsim compute precision -> the tables' dtype names
PRECISION_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8", "fp4": "nvfp4", "fp32": "float32",
                   "tf32": "tf32", "int8": "int8"}
#: a weight format -> the GEMM tables' dtype (quantization layout): block-scaled FP8 is not per-tensor FP8
GEMM_WEIGHT_DTYPE = {"fp8_b128x128": "fp8_block", "fp8": "fp8", "bf16": "bfloat16", "fp16": "float16",
                     "nvfp4": "nvfp4", "fp32": "float32"}
#: routed-expert weight format -> the MoE tables' dtype
MOE_WEIGHT_DTYPE = {"fp8_b128x128": "fp8_block", "fp8": "fp8", "bf16": "bfloat16", "nvfp4": "nvfp4",
                    "fp4_ue8m0_32": "w4a8_mxfp4_mxfp8", "mxfp4": "w4a8_mxfp4_mxfp8", "nvfp4_w4a16": "w4a16_nvfp4",
                    "w4a16_g32": "int4_wo", "w4a16_g64": "int4_wo", "w4a16_g128": "int4_wo"}
#: an MoE exchange's row format -> the dispatch / combine tables' dtype
A2A_DTYPE = {"bf16": "bfloat16", "fp8": "fp8", "fp8_s128": "fp8", "fp8_e8m0_32": "fp8", "fp8_b128x128": "fp8",
             "nvfp4": "nvfp4"}
#: KV-cache storage format -> the attention tables' kv dtype
KV_DTYPE = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp8_s128": "fp8", "fp8_e8m0_32": "fp8"}


def attention_dtypes(precision: str, kv_dtype: str) -> tuple:
    """The table dtypes that time attention math at ``precision`` over a cache of table dtype ``kv_dtype``.

    The runtimes' tables label an attention by its activations' dtype (bfloat16) and its cache's; over an FP8
    cache their kernels attend at FP8 (TensorRT-LLM's FP8 context FMHA and FP8 MLA generation), which is
    graphsim's own rule for an FP8 cache (``Model.attention_precision`` "auto"). The rows show it: on GB300
    an MLA prefill of 32,768 tokens x 128 heads over an FP8 cache takes 16.3 ms, below the 17.6 ms its BF16
    FLOPs need at the BF16 tensor peak; on B200 an MLA decode of 512 x 32K contexts 1.60 ms < 2.08 ms. So an
    FP8 attention over an FP8 cache reads those rows (or rows that name the math dtype fp8), and a BF16
    attention over an FP8 cache has no rows (none of the tables times BF16 math over an FP8 cache)."""
    if kv_dtype == "fp8":
        return ("bfloat16", "fp8") if precision == "fp8" else ()
    return (PRECISION_DTYPE.get(precision, precision),)


@attrs.frozen
class Coord:
    """num / den, each a linear form ((feature, coefficient), ...); ``tri`` reads num/den as a causal pair
    count per request and returns the prompt length n with n(n+1)/2 pairs (an equal-work prompt); with a
    sliding ``window`` W, the length n with Σ_i min(i+1, W) pairs (W(W+1)/2 + (n-W)·W beyond the window)."""

    num: tuple
    den: tuple = ()
    tri: bool = False
    window: int = 0

    def features(self) -> tuple:
        return tuple(f for f, _ in self.num + self.den)

    def base(self) -> tuple:
        """(this coordinate at scale 1, its scale): ``c x feature`` reads the feature, so the curves of every
        scale of it (a GEMM's tokens, an all-reduce's bytes) share one knot grid (graphsim.views.measured.bank)."""
        if len(self.num) == 1 and not self.den and self.num[0][1] > 0:
            f, c = self.num[0]
            return (self if c == 1.0 else Coord(((f, 1.0),))), float(c)
        return self, 1.0

    def value(self, col: Callable, xp):
        num = sum(c * col(f) for f, c in self.num)
        if not self.den:
            return num
        den = sum(c * col(f) for f, c in self.den)
        r = xp.where(den > 0, num / xp.where(den > 0, den, 1.0), 0.0)
        if not self.tri:
            return r
        n = (xp.sqrt(8.0 * r + 1.0) - 1.0) / 2.0
        if self.window:
            w = float(self.window)
            full = w * (w + 1.0) / 2.0
            n = xp.where(r > full, w + (r - full) / w, n)
        return n


@attrs.frozen
class Lookup:
    """What an op asks of the tables."""

    family: str
    op: str
    where: tuple  # ((identity column, (allowed values...)), ...)
    fixed: tuple  # ((coordinate, value), ...)
    varying: tuple  # ((coordinate, Coord), ...)
    #: a fused module's instance (its member ops share one timing, split over them in proportion to their
    #: SOL); "" = the op alone
    module: str = ""

    def key(self) -> str:
        """The table query (module instances of one kind share it). Memoized by value: a program's ~1,000
        lookups are a few dozen distinct ones, and equal lookups have one key."""
        try:
            k = _KEYS.get(self)
        except TypeError:  # an unhashable part (a rule's list): no memo
            return repr((self.family, self.op, self.where, self.fixed, self.varying))
        if k is None:
            if len(_KEYS) >= 4096:
                _KEYS.clear()
            k = _KEYS[self] = repr((self.family, self.op, self.where, self.fixed, self.varying))
        return k


_KEYS: dict = {}  # Lookup -> its key


@attrs.frozen
class Miss:
    """Why an op has no lookup: ``family`` is "" when no table family times this kind of op."""

    family: str
    reason: str


@attrs.frozen
class MapContext:
    mapping: object  # ParallelMapping
    logical: object  # the logical Graph (for the layer's own CommSpecs)
    tensors: dict
    kinds: tuple  # request kinds of the plan's groups
    token_sets: dict
    model: object = None
    #: the backend's admitted partitions (a measured.store.Selection), when the caller has one
    selection: object = None


RULES: dict[str, Callable] = {}


def rule(*kinds: str):
    def deco(fn):
        for k in kinds:
            RULES[k] = fn
        return fn
    return deco


def lookup_for(op: Op, ctx: MapContext) -> Lookup | Miss | tuple:
    """The op's lookup, a tuple of them in order of preference (the first the tables cover serves), or why
    it has none."""
    fn = RULES.get(op.kind)
    if fn is None:
        return Miss("", f"no table family times {op.kind} ops (priced at SOL in every view)")
    return fn(op, ctx)


# ---- helpers -----------------------------------------------------------------------------------------

def _tp_split(op: Op, ctx: MapContext) -> int:
    from graphsim.passes.sharding import effective_split

    return ctx.mapping.tp if "tp" in effective_split(op) else 1


def _row_parallel(op: Op, ctx: MapContext) -> bool:
    """A TP-split layer that reduces its output over TP splits its input width k (Megatron's row-parallel)."""
    name = op.origin or op.name
    try:
        logical = ctx.logical.op(name)
    except Exception:  # noqa: BLE001 - a pass-made op has no logical twin
        return False
    return any(s.group == "tp" and s.collective in ("all_reduce", "reduce_scatter") for s in logical.comm)


def _own(op: Op, feature_kind: str) -> Feature | None:
    """The op's own feature of ``feature_kind`` on its token set (same micro-batch fraction and chunk), built
    from any feature it already uses."""
    for _, f, _ in op.cost.terms:
        if f.token_set == op.token_set and f.kind != "one":
            return attrs.evolve(f, kind=feature_kind, params=())
    return None


def _phase(op: Op, ctx: MapContext) -> str:
    ts = ctx.token_sets.get(op.token_set)
    present = {k for k in ctx.kinds if ts is not None and ts.rule(k) != "none"}
    if present == {"decode"}:
        return "generation"
    if present == {"prefill"}:
        return "context"
    return "mixed"


def _dp_div(op: Op, ctx: MapContext) -> float:
    from graphsim.passes.sharding import effective_split

    return float(ctx.mapping.dp) if "dp" in effective_split(op) else 1.0


def _not_collected(ctx: MapContext, family: str, what: str) -> Miss | None:
    """The families only a local collector writes (elementwise, copy) time ops that every runtime also runs
    but no imported table times (norms, activations, cache writes). Where the backend has no partition of
    the family at all, the op is treated like a kind no family times — ``Miss("")``: SOL in every view,
    labelled — rather than as uncovered (``Miss(family)``: an error in the strict op view, a fallback fitted
    on the GEMMs in hybrid), so the op view of imported runtime tables keeps working and prices these ops as
    before. Once the backend has the family, an op it does not cover is uncovered as usual."""
    if ctx.selection is None or ctx.selection.has(family):
        return None
    sel = ctx.selection
    return Miss("", f"{what}: no {family} tables for {sel.backend} on {sel.device} (runtime tables do not time "
                "it; `graphsim collect ops` does): priced at SOL")


def _rows(op: Op, elems: float, bytes_per_elem: float) -> Coord | None:
    """Rows of ``elems`` elements on one rank, from the op's activation bytes (per-rank coefficients: DP and
    micro-batch splits are the SOL view's)."""
    terms = [(f, v) for c, f, v in op.cost.terms if c == "bytes_act"]
    if not terms or elems <= 0 or bytes_per_elem <= 0:
        return None
    return Coord(tuple((f, v / (elems * bytes_per_elem)) for f, v in terms))


def _width(op: Op, ctx: MapContext) -> int:
    """An elementwise op's width per token on one rank (a TP-split op holds elems / tp of it)."""
    tp = _tp_split(op, ctx)
    return int(round(op.info.elems / tp))


# ---- rules ---------------------------------------------------------------------------------------------

@rule("gemm", "router", "compressor")
def _gemm(op: Op, ctx: MapContext):
    i = op.info
    if not (i.k and i.n):
        return Miss("", f"a {op.kind} op without a GEMM shape (no table family)")
    flops = [(f, v) for c, f, v in op.cost.terms if c.startswith("flops_")]
    if not flops:
        return Miss("gemm", "no FLOPs to read m from")
    tp = _tp_split(op, ctx)
    k, n, copies = i.k, i.n, max(i.copies, 1)
    if copies > 1:  # per-head products: heads split over TP
        heads = copies // tp if copies % tp == 0 else copies / tp
        per = 2.0 * k * n * heads
        m = Coord(tuple((f, v / per) for f, v in flops))
        return Lookup("bmm", "bmm", (("dtype", (PRECISION_DTYPE.get(op.precision, op.precision),)),),
                      (("heads", int(heads)), ("k", k), ("n", n)), (("tokens", m),))
    if tp > 1:
        if _row_parallel(op, ctx):
            k = k // tp
        else:
            n = n // tp
    dt = GEMM_WEIGHT_DTYPE.get(i.weight_format)
    if dt is None:
        return Miss("gemm", f"no GEMM table dtype for weight format {i.weight_format!r}")
    if op.precision == "bf16" and dt not in ("bfloat16", "float16"):  # weight-only quantization
        return Miss("gemm", f"weight-only {i.weight_format} GEMM at bf16 (no table dtype)")
    m = Coord(tuple((f, v / (2.0 * k * n)) for f, v in flops))
    return Lookup("gemm", "gemm", (("dtype", (dt,)),), (("n", n), ("k", k)), (("m", m),))


@rule("attention")
def _attention(op: Op, ctx: MapContext):
    i = op.info
    form = i.attn
    if form in ("sparse", "encoder", ""):
        what = {"sparse": "sparse (top-k selected) attention", "encoder": "bidirectional encoder attention",
                "": "this attention"}[form]
        return Miss("attention", f"no kernel table for {what} at graphsim's op boundary")
    phase = _phase(op, ctx)
    if phase == "mixed":
        return Miss("attention", "one attention op over prefill and decode requests together: the tables time "
                    "each phase on its own")
    tp = _tp_split(op, ctx)
    heads = i.heads // tp if i.heads % tp == 0 else i.heads
    req, kv = _own(op, "requests"), _own(op, "kv_len")
    pairs = next((f for _, f, _ in op.cost.terms if f.kind in ("causal_pairs", "window_pairs", "chunk_pairs")), None)
    if req is None or kv is None:
        return Miss("attention", "no request features")
    dp = _dp_div(op, ctx)
    batch = Coord(((req, 1.0 / dp),))
    kv_fmt = next((ctx.tensors[t].format for t in op.reads if t in ctx.tensors), None)
    kv_dt = KV_DTYPE.get(getattr(kv_fmt, "name", ""), "")
    if not kv_dt and form == "mla_mha":
        # MLA's prefill attends the K/V it up-projected at its own precision, not the latent cache: the
        # tables' kv dtype of such a kernel is that precision's (an FP8 attention keeps an FP8 cache)
        kv_dt = {"fp8": "fp8", "bf16": "bfloat16"}.get(op.precision, "")
    dts = attention_dtypes(op.precision, kv_dt)
    if not dts:
        return Miss("attention", f"{op.precision} attention over an FP8 cache: the tables' kernels over an FP8 cache "
                    "attend at FP8 (attention_precision auto or fp8 reads them)")
    where = (("dtype", dts), ("kv_dtype", (kv_dt,))) if kv_dt else (("dtype", dts),)
    if phase == "generation":
        second = ("ctx", Coord(((kv, 1.0),), ((req, 1.0),)))
    else:
        if pairs is None:
            return Miss("attention", "no pair feature")
        # a sliding window's pairs grow by W per position beyond the window: inverted as such (the table's
        # seq is the prompt length at that window)
        w = int(pairs.params[0]) if pairs.kind == "window_pairs" else 0
        second = ("seq", Coord(((pairs, 1.0),), ((req, 1.0),), tri=True, window=w))
    if form == "mla":
        return Lookup("mla_generation" if phase == "generation" else "mla_context", phase, where,
                      (("heads", heads),), (("batch", batch), second))
    if form == "mla_mha":
        if phase != "context":
            return Miss("attention", "MLA in MHA form is a prefill kernel")
        return Lookup("mla_context", "context", where, (("heads", heads),), (("batch", batch), second))
    kvh = max(i.kv_heads // tp, 1) if i.kv_heads else heads
    fixed = (("heads", heads), ("kv_heads", kvh), ("head_dim", i.head_dim), ("window", i.window))
    return Lookup(f"attention_{phase}", phase, where, fixed, (("batch", batch), second))


@rule("moe_experts")
def _moe(op: Op, ctx: MapContext):
    i = op.info
    dt = MOE_WEIGHT_DTYPE.get(i.weight_format)
    if dt is None:
        return Miss("moe", f"no MoE table dtype for expert weights {i.weight_format!r}")
    tok = _own(op, "tokens")
    if tok is None:
        return Miss("moe", "no token feature")
    m = ctx.mapping
    ep = m.ep
    fixed = (("hidden", i.hidden), ("inter", i.inter), ("topk", i.top_k), ("experts", i.experts),
             ("moe_tp", m.world // ep), ("moe_ep", ep))
    return Lookup("moe", "moe", (("dtype", (dt,)), ("distribution", ("balanced",))), fixed,
                  (("tokens", Coord(((tok, 1.0),))),))


@rule("collective")
def _collective(op: Op, ctx: MapContext):
    i = op.info
    if not i.collective or not op.cost.terms:
        return Miss("collective", "no communication (merged or single rank)")
    if i.collective not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        return Miss("collective", f"no table for {i.collective}")
    if any(c == "bytes_scaleout" for c, _, _ in op.cost.terms):
        return Miss("collective", "crosses NVLink domains: the tables time collectives inside one domain")
    link = [(f, v) for c, f, v in op.cost.terms if c == "bytes_nvlink"]
    if not link or i.link_factor <= 0:
        return Miss("collective", "no link bytes")
    size = Coord(tuple((f, v / i.link_factor) for f, v in link))
    generic = Lookup("collective", i.collective, (("dtype", ("bfloat16",)),), (("gpus", i.ranks),), (("bytes", size),))
    if i.role in ("dispatch", "combine") and i.hidden and i.top_k:
        # an MoE token exchange: the runtime's own dispatch / combine kernels (DeepEP, ...) or a plain
        # all-to-all, whichever is faster at the plan's point; the rows' bytes per token give the dispatch
        # tables' token count from the same payload
        row = i.top_k * fmt(i.payload_format or "bf16").nbytes(i.hidden)
        tokens = Coord(tuple((f, v / i.link_factor / row) for f, v in link))
        dt = A2A_DTYPE.get(i.payload_format, i.payload_format)
        fixed = (("hidden", i.hidden), ("topk", i.top_k), ("experts", i.experts), ("ep", i.ranks), ("nodes", 1))
        return (Lookup("moe_a2a", i.role, (("dtype", (dt,)),), fixed, (("tokens", tokens),)), generic)
    return generic


#: mHC roles -> the module that times them (DeepSeek-V4's pre and post kernels: the pre module computes the
#: coefficients, runs Sinkhorn and pre-mixes the streams; the post module mixes the residual streams back;
#: the pre-norm is a norm of its own, as the collectors time it)
MHC_MODULE = {"coeff": "pre", "sinkhorn": "pre", "premix": "pre", "residual": "post"}


@rule("mhc")
def _mhc(op: Op, ctx: MapContext):
    role = op.info.role
    if role == "prenorm":
        return Miss("", "mHC pre-norm: a norm, outside the mhc pre/post modules (priced at SOL)")
    if not role:
        return Miss("mhc", "an mHC op outside the pre/post modules (the final stream merge): no table times it")
    if role not in MHC_MODULE:  # roles joined with "+": graphsim's fused single-/two-pass kernels
        return Miss("mhc", f"fused mHC ({role}): the mhc tables time the separate pre/post kernels, another "
                    "implementation — not exchangeable samples")
    cfg = getattr(ctx.model, "cfg", None)
    hc, iters, hidden = (getattr(cfg, k, 0) or 0 for k in ("hc_mult", "hc_sinkhorn_iters", "hidden_size"))
    tok = _own(op, "tokens")
    if not (hc and iters and hidden) or tok is None:
        return Miss("mhc", "the model does not declare hc_mult, hc_sinkhorn_iters and hidden_size")
    # the module instance: the op's name without its site and role (layer and any micro-batch copy kept);
    # it covers every site of the layer (attention and FFN in DeepSeek-V4)
    instance = re.sub(r"\.hc_[^.]+\.[^.]+", "", op.name)
    sites = len({m.group(1) for o in ctx.logical.ops if o.layer == op.layer and o.kind == "mhc"
                 for m in [re.search(r"\.hc_([^.]+)\.", o.name)] if m})
    fixed = (("hidden", int(hidden)), ("hc_mult", int(hc)), ("sites", sites), ("sinkhorn", int(iters)))
    return Lookup("mhc", MHC_MODULE[role], (), fixed, (("tokens", Coord(((tok, 1.0 / _dp_div(op, ctx)),))),),
                  module=f"{op.device}:{instance}")


#: an elementwise op's bytes per element (in = out) -> the elementwise tables' dtype
ELEM_DTYPE = {2.0: "bfloat16", 4.0: "float32"}
#: a gated MLP activation (hidden_act) -> the elementwise tables' op
GATED_OP = {"silu": "silu_mul", "gelu": "gelu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul", "swigluoai": "swiglu_oai"}


def _elementwise(op: Op, ctx: MapContext, name: str, bytes_in: float):
    """An elementwise lookup over [tokens, elems] (bf16 / fp32 in and out: a fused quantizing output is
    another kernel, uncovered)."""
    i = op.info
    dt = ELEM_DTYPE.get(float(bytes_in)) if bytes_in == i.bytes_out else None
    if dt is None:
        return Miss("elementwise", f"{name} reading {bytes_in:g} and writing {i.bytes_out:g} B per element (a fused "
                    "quantizing output): the elementwise tables time the same dtype in and out")
    e = _width(op, ctx)
    tok = _rows(op, e, i.bytes_in + i.bytes_out)
    if tok is None or e <= 0:
        return Miss("elementwise", f"a {op.kind} op without a width or activation bytes")
    return Lookup("elementwise", name, (("dtype", (dt,)),), (("elems", e),), (("tokens", tok),))


@rule("norm")
def _norm(op: Op, ctx: MapContext):
    """RMSNorm over the op's width per token (a per-head norm — q/k norm — is timed as one row per token)."""
    miss = _not_collected(ctx, "elementwise", "a norm")
    return miss if miss else _elementwise(op, ctx, "rmsnorm", op.info.bytes_in)


def _act(op: Op, ctx: MapContext) -> str:
    cfg = getattr(ctx.model, "cfg", None)
    layers = getattr(cfg, "layers", None)
    if isinstance(layers, tuple) and isinstance(op.layer, int) and 0 <= op.layer < len(layers):
        return getattr(layers[op.layer], "act", "silu")
    return getattr(cfg, "hidden_act", None) or "silu"


@rule("activation")
def _activation(op: Op, ctx: MapContext):
    """A gated MLP activation act(g)·u of [tokens, 2·elems] -> [tokens, elems] (SwiGLU: silu_mul). Other
    activations (ReLU², gates, convolutions) are not what the elementwise tables time: SOL."""
    miss = _not_collected(ctx, "elementwise", "an activation")
    if miss:
        return miss
    from graphsim.core.rules import GATED

    i = op.info
    if i.role != GATED or i.bytes_in <= 0:
        return Miss("", f"{op.name.rsplit('.', 1)[-1]}: not a gated MLP activation (the elementwise tables time "
                    "silu_mul): priced at SOL")
    act = _act(op, ctx)
    return _elementwise(op, ctx, GATED_OP.get(act, f"{act}_mul"), i.bytes_in / 2.0)


@rule("cache_write")
def _cache_write(op: Op, ctx: MapContext):
    """A plain cache write (the op reads and writes nothing but the entries it stores): a copy of its bytes."""
    miss = _not_collected(ctx, "copy", "a cache write")
    if miss:
        return miss
    terms = [(c, f, v) for c, f, v in op.cost.terms if c.startswith("bytes_")]
    if not terms:
        return Miss("", "a cache write without bytes")
    if any(c != "bytes_kv" for c, _, _ in terms):
        return Miss("copy", "a converting cache write (reads activations, writes another format): the copy "
                    "tables time a plain copy")
    return Lookup("copy", "copy", (), (), (("bytes", Coord(tuple((f, v) for _, f, v in terms))),))
