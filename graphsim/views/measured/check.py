"""No table row below SOL: every row of a measured store against graphsim's SOL of the op it times.

A row is a measurement of one op at one shape on one device. The check builds that op with graphsim's own
rules (the GEMM, attention, MLA, MoE and collective rules a model composes: no second copy of a formula),
shards it on the device's descriptor through the sharding pass, and asks the OP view's mapping
(:func:`graphsim.views.measured.mapping.lookup_for`) which table row it reads: the row's family, op, identity
(dtype, kv dtype, routing distribution) and fixed coordinates must be the lookup's, and the lookup's varying
coordinates, evaluated on the row's workload, must give back the row's coordinates. Only then is the row
priced: the op's SOL by the reference evaluation (each op's cost terms, the roofline over the descriptor's
rates) at the row's workload — P rows at once, one small graph per (partition, fixed shape).

Every row gets a status: ``checked`` (priced; a violation when its latency is below the SOL), or why it
is not priced: ``no_descriptor`` (no graphsim hardware file for the device), ``unserved`` (no graphsim op
reads this row: the mapping asks for another dtype, distribution, or the family is a fused module the
views do not match), ``unmapped`` (the op built for the row's shape maps elsewhere: a mapping bug, shown).
"""
from __future__ import annotations

import functools
from typing import Callable

import attrs
import numpy as np

from graphsim.core.errors import require
from graphsim.core.ir import COMPONENTS, HBM_COMPONENTS

from .mapping import GEMM_WEIGHT_DTYPE, MOE_WEIGHT_DTYPE, PRECISION_DTYPE, Lookup, MapContext, Miss, lookup_for
from .schema import FAMILIES, LATENCY, identity_columns
from .store import Store, read_partitions

STATUSES = ("checked", "unserved", "unmapped", "no_descriptor")
#: per family: the coordinates that vary with the workload point (the rest are fixed by the op's shape)
VARYING = {"gemm": ("m",), "bmm": ("tokens",), "attention_context": ("batch", "seq"),
           "attention_generation": ("batch", "ctx"), "mla_context": ("batch", "seq"),
           "mla_generation": ("batch", "ctx"), "moe": ("tokens",), "collective": ("bytes",),
           "moe_a2a": ("tokens",)}
#: families no view matches (fused modules of another boundary, docs/measured.md "Boundaries")
UNMATCHED = {"dsv4_attention": "DeepSeek-V4 CSA/HCA attention modules: not matched by the views (another op "
                               "boundary)",
             "mhc": "mHC pre/post modules: timed as fused modules over several graphsim ops (not priced per row "
                    "yet)",
             "elementwise": "elementwise tables (graphsim collect ops): not priced by this check yet",
             "copy": "copy tables (graphsim collect ops): not priced by this check yet"}


def _invert(d: dict) -> dict:
    """table name -> graphsim name (the first graphsim name that maps to it)."""
    out: dict = {}
    for k, v in d.items():
        out.setdefault(v, k)
    return out


GEMM_FORMAT = _invert(GEMM_WEIGHT_DTYPE)
MOE_FORMAT = _invert(MOE_WEIGHT_DTYPE)
PRECISION = _invert(PRECISION_DTYPE)
KV_FORMAT = {"bfloat16": "bf16", "fp8": "fp8", "float16": "bf16"}
#: an MoE exchange's table dtype -> the expert weights whose activations graphsim dispatches in it
A2A_EXPERTS = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4"}


@attrs.frozen
class Rows:
    """The workload of P table rows, one request group each (what :func:`evaluate_reference` reads)."""

    kinds: tuple
    count: np.ndarray
    new: np.ndarray
    past: np.ndarray

    @property
    def points(self) -> int:
        return len(self.count)

    def arrays(self) -> dict:
        z = np.zeros((self.points, 1))
        from graphsim.core.workload import HOST

        return {"count": self.count[:, None], "new": self.new[:, None], "past": self.past[:, None], "image": z,
                "patches": z, "replay": z, "tier": z + HOST}


@attrs.frozen(eq=False)
class Probe:
    """One op built for a fixed shape: the sharded graph holding it alone, its lookup, and the row workload."""

    graph: object  # the sharded one-op graph
    lookup: Lookup
    ctx: MapContext
    workload: Callable  # {coordinate: (P,) array} -> Rows
    program: object = None  # the graph lowered (set by _probe)


def _one_op(sharded, name: str):
    op = sharded.op(name)
    return sharded.evolve(ops=(op,), edges=())


def _probe(logical, sharded, name: str, mapping, kinds: tuple, workload, model=None) -> Probe | str:
    op = sharded.op(name)
    ctx = MapContext(mapping, logical, sharded.tensor_map, kinds, sharded.token_set_map, model, None)
    lk = lookup_for(op, ctx)
    if isinstance(lk, Miss):
        return f"the op maps to no table ({lk.reason})"
    return _made(_one_op(sharded, name), lk, ctx, workload)


def _made(graph, lk: Lookup, ctx: MapContext, workload) -> Probe:
    from graphsim.lowering.program import lower

    return Probe(graph, lk, ctx, workload, lower(graph))


def _shard(logical, mapping, hw, policies=None):
    from graphsim.passes.sharding import apply_mapping

    return apply_mapping(logical, mapping, hw.nvlink_domain, policies=policies, hw=hw)


def _tokens(c: dict, key: str = "m", scale: float = 1.0) -> Rows:
    t = np.asarray(c[key], dtype=np.float64) * scale
    return Rows(("prefill",), np.ones_like(t), t, np.zeros_like(t))


def _prefill(c: dict) -> Rows:
    return Rows(("prefill",), c["batch"].astype(np.float64), c["seq"].astype(np.float64), np.zeros(len(c["batch"])))


def _decode(c: dict) -> Rows:
    # one new position per request, the rest of its context already cached (ctx = isl + step)
    return Rows(("decode",), c["batch"].astype(np.float64), np.ones(len(c["batch"])), c["ctx"].astype(np.float64) - 1)


def _builder():
    from graphsim.core.builder import GraphBuilder

    b = GraphBuilder("probe")
    b.token_set("all")
    return b


# ---- probes: (identity, fixed coordinates, hardware) -> Probe or why none --------------------------------

def _gemm(ident: dict, fx: dict, hw):
    from graphsim.core.plan import ParallelMapping
    from graphsim.core.rules import linear

    wf = GEMM_FORMAT.get(ident["dtype"])
    if wf is None:
        return f"no graphsim weight format for GEMM dtype {ident['dtype']!r}"
    k, n = int(fx["k"]), int(fx["n"])
    b = _builder()
    with b.stage("probe"):
        linear(b, "gemm", "all", k, n, b.weight("w", k * n, wf))
    g = b.build()
    m = ParallelMapping()
    return _probe(g, _shard(g, m, hw), "gemm", m, ("prefill",), _tokens)


def _bmm(ident: dict, fx: dict, hw):
    from graphsim.core.plan import ParallelMapping

    prec = PRECISION.get(ident["dtype"])
    if prec is None:
        return f"no graphsim precision for {ident['dtype']!r}"
    h, k, n = int(fx["heads"]), int(fx["k"]), int(fx["n"])
    b = _builder()
    with b.stage("probe"):  # MLA's absorbed per-head products (DeepSeek-V3 q_absorb / o_absorb)
        b.gemm("bmm", "all", k, n, weight_format=prec, copies=h, precision=prec, act_in=prec)
    g = b.build()
    m = ParallelMapping()
    return _probe(g, _shard(g, m, hw), "bmm", m, ("prefill",), lambda c: _tokens(c, "tokens"))


def _attention_precision(ident: dict) -> tuple:
    """(graphsim attention precision, cache format) of an attention row: the math runs at the widest of the
    row's dtype and its cache's compute precision when the cache is BF16, at FP8 over an FP8 cache — the
    rule graphsim applies to a model's own cache (``Model.attention_precision`` "auto"; the tables label
    such kernels bfloat16 / fp8, :func:`graphsim.views.measured.mapping.attention_dtypes`)."""
    from graphsim.core.ir import fmt

    kv = KV_FORMAT.get(ident["kv_dtype"])
    if kv is None:
        return None, None
    prec = fmt(kv).compute if fmt(kv).compute == "fp8" else PRECISION.get(ident["dtype"])
    return prec, kv


def _attention(phase: str):
    def probe(ident: dict, fx: dict, hw):
        from graphsim.models.base import attention_act_bytes
        from graphsim.core.plan import ParallelMapping
        from graphsim.core.rules import AttentionShape, gqa_attention

        prec, kv = _attention_precision(ident)
        if prec is None or kv is None:
            return f"no graphsim precision for dtype {ident['dtype']!r} / kv {ident['kv_dtype']!r}"
        heads, kvh, d, w = (int(fx[c]) for c in ("heads", "kv_heads", "head_dim", "window"))
        if not (heads and kvh and d):
            return "no heads"
        a = AttentionShape(heads, kvh, d, window=w)
        hidden = heads * d
        b = _builder()
        with b.stage("probe"):
            wqkv = b.weight("attn.wqkv", hidden * (heads * d + kvh * 2 * d), "bf16")
            wo = b.weight("attn.wo", heads * d * hidden, "bf16")
            cache = b.tensor("kv", "kv_cache", kv, elems_per_token=a.kv_elems, module="attn")
            gqa_attention(b, "", "all", hidden, a, weights=(wqkv, wo), cache=cache, kv_format=kv, precision=prec,
                          act_bytes=attention_act_bytes(prec))
        g = b.build()
        m = ParallelMapping()
        kinds = ("prefill",) if phase == "context" else ("decode",)
        return _probe(g, _shard(g, m, hw), "attn", m, kinds, _prefill if phase == "context" else _decode)
    return probe


@functools.lru_cache(maxsize=1)
def _v3_config() -> dict:
    from graphsim.core.config import load_config

    return dict(load_config("deepseek-v3"))


def _mla(phase: str):
    def probe(ident: dict, fx: dict, hw):
        from graphsim.models.deepseek_v3 import DeepSeekV3
        from graphsim.driver.pipeline import Policies
        from graphsim.core.plan import ParallelMapping

        prec, kv = _attention_precision(ident)
        if prec is None or kv is None:
            return f"no graphsim precision for dtype {ident['dtype']!r} / kv {ident['kv_dtype']!r}"
        heads = int(fx["heads"])
        cfg = {**_v3_config(), "num_hidden_layers": 1, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0}
        total = int(cfg["num_attention_heads"])
        tp = total // heads if heads and total % heads == 0 else 1  # the row's heads are one TP rank's
        if tp == 1:
            cfg["num_attention_heads"] = heads
        model = DeepSeekV3(cfg, kv_format=kv)
        pol = Policies()  # attention precision "auto": the model's own rule for its cache
        kinds = ("prefill",) if phase == "context" else ("decode",)
        g = model.build(kinds, policies=pol)
        m = ParallelMapping(tp=tp)
        name = "layers.0.attn_prefill" if phase == "context" else "layers.0.attn_decode"
        return _probe(g, _shard(g, m, hw, pol), name, m, kinds, _prefill if phase == "context" else _decode,
                      model)
    return probe


def _moe_graph(ident_dtype_format: str, fx: dict, hidden: int, experts: int, topk: int, inter: int,
               act: str = "silu"):
    from graphsim.core.rules import MoEShape, activation, moe

    b = _builder()
    with b.stage("probe"):
        w = b.weight("moe.experts", experts * activation(act)[0] * hidden * inter, ident_dtype_format)
        r = b.weight("router", hidden * experts, "bf16")
        moe(b, "", "all", hidden, MoEShape(experts, topk, inter, act=act), experts=w, router=r)
    return b.build()


def _moe_act(ident: dict, fixed: dict, nongated: frozenset = frozenset()) -> str:
    """The experts' activation: gated SwiGLU, unless the kernel names itself non-gated (TensorRT-LLM's
    ``moe_torch_flow_nongated``: Nemotron-3/H's ReLU² experts, two matrices instead of three) or the row's
    shape is one that a partition of the store times with such a kernel (:func:`nongated_shapes`)."""
    shape = tuple(int(fixed.get(c, 0)) for c in MOE_SHAPE)
    return "relu2" if "nongated" in ident.get("kernel_source", "") or shape in nongated else "silu"


#: an MoE row's model shape: what identifies the model (and so its experts' activation) across collectors
MOE_SHAPE = ("hidden", "inter", "topk", "experts")


def nongated_shapes(store: Store) -> frozenset:
    """MoE shapes (hidden, inter, top-k, experts) that some partition of the store times with a non-gated
    kernel. The tables carry no activation column; the collectors time each model's own experts (SGLang's
    and vLLM's switch to ReLU² for Nemotron-3/H by model name) and TensorRT-LLM names its non-gated kernel,
    so its shapes are the non-gated models'. In aiconfigurator 0.12: Nemotron-3's (2688, 1856, 6, 128),
    (1024 | 4096, 2688, 22, 512) and (2048 | 8192, 5120, 22, 512)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: set = set()
    want = ["family", "kernel_source", *MOE_SHAPE]
    for f in store.files:
        h = store.hint(f)
        if h is not None and h[1] != "moe":
            continue
        if not set(want) <= set(pq.read_schema(f).names):
            continue
        t = pq.read_table(f, columns=want)
        t = t.filter(pc.match_substring(t["kernel_source"].cast("string"), "nongated"))
        if t.num_rows:
            out |= set(zip(*(t[c].to_pylist() for c in MOE_SHAPE)))
    return frozenset(tuple(int(v) for v in s) for s in out)


def _moe(ident: dict, fx: dict, hw):
    from graphsim.core.plan import ParallelMapping

    wf = MOE_FORMAT.get(ident["dtype"])
    if wf is None:
        return f"no graphsim expert format for MoE dtype {ident['dtype']!r}"
    h, i, k, e, mtp, mep = (int(fx[c]) for c in ("hidden", "inter", "topk", "experts", "moe_tp", "moe_ep"))
    if e % mep or k > e:
        return f"{e} experts over EP {mep}"
    g = _moe_graph(wf, fx, h, e, k, i, ident.get("act", "silu"))
    m = ParallelMapping(tp=mtp * mep, ep=mep)  # the MoE side: moe_tp = world / ep
    return _probe(g, _shard(g, m, hw), "moe.experts", m, ("prefill",), lambda c: _tokens(c, "tokens"))


def _collective(ident: dict, fx: dict, hw):
    from graphsim.core.ir import Cost, Feature
    from graphsim.core.plan import ParallelMapping

    n = int(fx["gpus"])
    if n < 2:
        return "one rank"
    b = _builder()
    with b.stage("probe"):  # the payload: one byte per "token" (nccl-tests' whole buffer)
        b.collective("coll", ident["op"], "tp", Cost.of(Feature("tokens", "all"), bytes_act=1.0))
    g = b.build()
    m = ParallelMapping(tp=n)
    return _probe(g, _shard(g, m, hw), "coll", m, ("prefill",), lambda c: _tokens(c, "bytes"))


def _moe_a2a(ident: dict, fx: dict, hw):
    from graphsim.core.plan import ParallelMapping

    wf = A2A_EXPERTS.get(ident["dtype"]) if ident["op"] == "dispatch" else "fp8"
    if wf is None or (ident["op"] == "combine" and ident["dtype"] != "bfloat16"):
        return f"graphsim's {ident['op']} carries no {ident['dtype']!r} rows"
    h, k, e, ep, nodes = (int(fx[c]) for c in ("hidden", "topk", "experts", "ep", "nodes"))
    if nodes != 1 or e % ep:
        return f"{nodes} nodes"
    g = _moe_graph(wf, fx, h, e, k, 2048)
    m = ParallelMapping(tp=ep, ep=ep)
    sh = _shard(g, m, hw)
    name = next((o.name for o in sh.ops if o.kind == "collective" and o.info.role == ident["op"]), None)
    if name is None:
        return f"no {ident['op']} exchange"
    op = sh.op(name)
    ctx = MapContext(m, g, sh.tensor_map, ("prefill",), sh.token_set_map, None, None)
    lks = lookup_for(op, ctx)
    lk = next((x for x in (lks if isinstance(lks, tuple) else (lks,)) if isinstance(x, Lookup)
               and x.family == "moe_a2a"), None)
    if lk is None:
        return "the exchange maps to no moe_a2a table"
    # the table's tokens are one rank's; every EP rank sends its own 1/world of the batch
    return _made(_one_op(sh, name), lk, ctx, lambda c: _tokens(c, "tokens", float(m.world)))


PROBES: dict[str, Callable] = {"gemm": _gemm, "bmm": _bmm, "attention_context": _attention("context"),
                               "attention_generation": _attention("generation"), "mla_context": _mla("context"),
                               "mla_generation": _mla("generation"), "moe": _moe, "collective": _collective,
                               "moe_a2a": _moe_a2a}
#: identity columns a probe depends on (beyond the device): probes are shared across frameworks
PROBE_IDENTITY = {"gemm": ("dtype",), "bmm": ("dtype",), "attention_context": ("dtype", "kv_dtype"),
                  "attention_generation": ("dtype", "kv_dtype"), "mla_context": ("dtype", "kv_dtype"),
                  "mla_generation": ("dtype", "kv_dtype"), "moe": ("dtype", "act"), "collective": ("op",),
                  "moe_a2a": ("op", "dtype")}

#: families whose probe is sharded over several ranks (the descriptor's NVLink domain and links enter the
#: sharding); the others run on one rank and are built once for every device
BY_DEVICE = ("mla_context", "mla_generation", "moe", "collective", "moe_a2a")


# ---- matching and pricing --------------------------------------------------------------------------------

def _served(lk: Lookup, family: str, ident: dict, fixed: dict) -> str:
    """"" when the lookup reads rows of this identity at these fixed coordinates, else why not."""
    if lk.family != family or lk.op != ident["op"]:
        return f"the op reads {lk.family}/{lk.op}"
    for col, allowed in lk.where:
        if ident.get(col, "") not in allowed:
            return f"graphsim's op reads {col}={'|'.join(allowed)}, the row has {ident.get(col, '')!r}"
    for c, v in lk.fixed:
        if c in fixed and fixed[c] != v:
            return f"the op at the row's shape reads {c}={v}, the row has {fixed[c]}"
    return ""


def _coord_errors(probe: Probe, col: Callable, coords: dict) -> np.ndarray:
    """Per row: whether the lookup's varying coordinates, evaluated on the row's workload, give back the
    row's coordinates (the mapping reads this very row)."""
    ok = None
    for name, co in probe.lookup.varying:
        v = co.value(col, np)
        want = coords[name].astype(np.float64)
        hit = np.abs(v - want) <= 1e-6 * np.maximum(np.abs(want), 1.0)
        ok = hit if ok is None else ok & hit
    return ok


def price(probes: list, rows: Rows, which: np.ndarray, ut, coords: dict | None = None, l2_bytes: float = 0.0):
    """SOL of P rows, row p priced by ``probes[which[p]]`` (one-op programs of one family): each program's
    coefficients (features x components) stacked per row, its features evaluated over every row at once,
    then graphsim's roofline (:func:`graphsim.lowering.evaluate._durations_from_components`) over the
    descriptor's unit times — the reference evaluation's arithmetic, vectorized across shapes (a test holds
    it to :func:`graphsim.lowering.evaluate.evaluate_reference`). With ``coords``, also whether the mapping
    reads back each row's coordinates.

    ``l2_bytes`` (the descriptor's L2): a row is priced in its data identity — the collector replays one op on
    the same operands, so when an op's HBM bytes fit in L2 they are served from it, and the row is held to the
    rest of its roofline (compute, exponentials, links) with no HBM term (no sourced L2 bandwidth: the
    loosest bound, never a false violation). Returns (SOL in the row's identity, coordinates read back or None,
    SOL with every byte from HBM)."""
    from graphsim.lowering.evaluate import _durations_from_components
    from graphsim.lowering.features import feature_column

    feats: dict = {}
    token_sets: dict = {}
    for pr in probes:
        for f in pr.program.features:
            feats.setdefault(f, len(feats))
        token_sets.update(pr.graph.token_set_map)
    a = rows.arrays()
    memo: dict = {}
    cols = [feature_column(f, token_sets, rows.kinds, a, np, memo) for f in feats]
    K = probes[0].program.coef.shape[2]
    # a probe's one op may carry alternatives (a collective's algorithms x protocols): each is a cost class
    # of the program, and the op's SOL is the least of them at each row, as in the evaluation
    C = max(pr.program.coef.shape[1] for pr in probes)
    coef = np.zeros((len(probes), len(feats), C, K))
    n_classes = np.zeros(len(probes), dtype=np.int64)
    for g, pr in enumerate(probes):
        require(len(pr.program.graph.ops) == 1, "check", "a probe holds one op")
        n_classes[g] = pr.program.coef.shape[1]
        for j, f in enumerate(pr.program.features):
            coef[g, feats[f], :n_classes[g]] = pr.program.coef[j]
    comp = np.zeros((rows.points, C, K))
    for j in range(len(feats)):
        comp += cols[j][:, None, None] * coef[which, j]
    per_class = _durations_from_components(comp, np.asarray(ut)[None, None, :], 0.0, np)
    hbm_sol = np.where(np.arange(C)[None, :] < n_classes[which][:, None], per_class, np.inf).min(axis=1)
    if l2_bytes > 0:  # the row's identity: operands that fit in L2 come from it
        hbm = np.isin(np.array(COMPONENTS), HBM_COMPONENTS)
        resident = comp[..., hbm].sum(axis=-1) <= l2_bytes
        comp[..., hbm] = np.where(resident[..., None], 0.0, comp[..., hbm])
        per_class = _durations_from_components(comp, np.asarray(ut)[None, None, :], 0.0, np)
    per_class = np.where(np.arange(C)[None, :] < n_classes[which][:, None], per_class, np.inf)
    sol = per_class.min(axis=1)
    if coords is None:
        return sol, None, hbm_sol
    whole: dict = {f: cols[j] for f, j in feats.items()}

    def column(f):
        if f not in whole:
            whole[f] = feature_column(f, token_sets, rows.kinds, a, np, memo)
        return whole[f]

    ok = np.ones(rows.points, dtype=bool)
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(probes) + 1))
    for g, pr in enumerate(probes):
        sel = order[bounds[g]:bounds[g + 1]]
        ok[sel] = _coord_errors(pr, lambda f: column(f)[sel], {k: v[sel] for k, v in coords.items()})
    return sol, ok, hbm_sol


@attrs.frozen(eq=False)
class ScanResult:
    """Per row of the scanned partitions: its status, SOL and ratio; the frame of violations; counts."""

    summary: list  # dicts: device, family, op, rows, checked, unserved, unmapped, no_descriptor, violations, worst
    violations: object  # pandas DataFrame: identity, coordinates, latency_s, sol_s, ratio
    reasons: dict  # (device, family, status) -> {reason: rows}
    rows: int
    seconds: float

    @property
    def n_violations(self) -> int:
        return int(sum(s["violations"] for s in self.summary))


def scan(root, *, devices=None, families=None, hw_of: Callable | None = None, tolerance: float = 1e-9,
         log: Callable | None = None) -> ScanResult:
    """Check every row of the store at ``root`` (only ``devices`` / ``families`` if given) against SOL."""
    import time

    import pandas as pd

    t0 = time.perf_counter()
    store = root if isinstance(root, Store) else Store(root)
    want_dev = {d.lower() for d in devices} if devices else None
    want_fam = set(families) if families else None
    if want_fam:
        bad = sorted(want_fam - set(FAMILIES))
        require(not bad, "family", f"unknown {bad}; allowed: {', '.join(FAMILIES)}")
    hw_of = hw_of or _hardware
    nongated = nongated_shapes(store) if not want_fam or "moe" in want_fam else frozenset()
    probes: dict = {}
    summary: dict = {}
    reasons: dict = {}
    frames = []
    total = 0
    for f in store.files:
        h = store.hint(f)
        if h is not None and ((want_dev and h[0] not in want_dev) or (want_fam and h[1] not in want_fam)):
            continue
        for part in read_partitions(f, store.root):
            dev = part.identity["device"].lower()
            if (want_dev and dev not in want_dev) or (want_fam and part.family not in want_fam):
                continue
            total += len(part.t)
            key = (dev, part.family, part.identity["op"])
            s = summary.setdefault(key, {"device": dev, "family": part.family, "op": part.identity["op"], "rows": 0,
                                         **{st: 0 for st in STATUSES}, "violations": 0, "worst": None})
            s["rows"] += len(part.t)
            v = _scan_partition(part, hw_of(dev), probes, tolerance, lambda st, why, n: _count(
                s, reasons, key, st, why, n), nongated)
            if v is not None and len(v):
                frames.append(v)
                w = float(v["ratio"].min())
                s["worst"] = w if s["worst"] is None else min(s["worst"], w)
        if log:
            log(f"{f.relative_to(store.root)}")
    viol = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    rows = sorted(summary.values(), key=lambda s: (s["device"], s["family"], s["op"]))
    for s in rows:
        s["violations"] = int(sum(len(v[(v["device"] == s["device"]) & (v["family"] == s["family"])
                                      & (v["op"] == s["op"])]) for v in frames)) if frames else 0
    return ScanResult(rows, viol, reasons, total, time.perf_counter() - t0)


#: why a checked row below its all-HBM roofline is no violation (see :func:`price`)
L2_RESIDENT = ("faster than HBM allows, but its operands fit in L2 (the collector replays them): held to compute "
               "and links")


def _count(s: dict, reasons: dict, key: tuple, status: str, why: str, n: int) -> None:
    s[status] += n
    if why and n:
        r = reasons.setdefault((*key, status), {})
        r[why] = r.get(why, 0) + n


@functools.lru_cache(maxsize=None)
def _hardware(device: str):
    from graphsim.core.errors import GraphsimError
    from graphsim.lowering.evaluate import unit_time
    from graphsim.driver.pipeline import _shipped_hw

    try:
        hw = _shipped_hw(device)
    except GraphsimError:
        return None
    return hw, unit_time(hw.rates())


def _groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of an (N, d) integer array and each row's index among them (np.unique(axis=0),
    through one integer code per row: much faster on large tables)."""
    if x.shape[1] == 0:
        return np.zeros((1, 0), np.int64), np.zeros(len(x), np.int64)
    codes, sizes = [], []
    for j in range(x.shape[1]):
        _, c = np.unique(x[:, j], return_inverse=True)
        codes.append(c.reshape(-1))
        sizes.append(int(c.max()) + 1 if len(c) else 1)
    code = np.ravel_multi_index(codes, sizes)
    uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
    return x[first], inv.reshape(-1)


def family_efficiency(store: Store, device: str, family: str, framework: str, version: str = "") -> tuple | None:
    """How far a backend's kernels of ``family`` run from graphsim's SOL on ``device``, as a function of the
    work: over every row of its tables graphsim prices, the median measured / SOL per bin of log SOL (an op of
    a few microseconds is launch-bound, a long one near its roofline) — (bin centres in ln seconds, medians,
    rows); None when it has no priced rows. What a measured view's fallback for an op of that family (a shape
    the tables miss) is priced by."""
    memo = store.efficiency
    key = (device.lower(), family, framework, version)
    if key in memo:
        return memo[key]
    hwut = _hardware(device.lower())
    out = None
    if hwut is not None and family in PROBES:
        if family == "moe" and store.nongated is None:
            store.nongated = nongated_shapes(store)
        nongated = store.nongated if family == "moe" else frozenset()
        probes: dict = {}
        ratios: list = []
        for part in store.partitions(device, family, (framework,)):
            if version and part.identity.get("version") != version:
                continue
            _scan_partition(part, hwut, probes, 1e-9, lambda *a: None, nongated, ratios)
        if ratios:
            sol = np.concatenate([r[1] for r in ratios])
            r = np.concatenate([r[0] for r in ratios])
            out = _efficiency_curve(np.log(sol), r)
    memo[key] = out
    return out


def _efficiency_curve(lsol: np.ndarray, ratio: np.ndarray, per_bin: int = 64) -> tuple | None:
    """Median ``ratio`` per bin of ``lsol`` (equal-count bins of at least ``per_bin`` rows): (centres, medians,
    rows), the medians made non-increasing in the work (a bigger problem never runs further from its roofline
    than a smaller one of the same kernel family, up to the bins' noise)."""
    if not len(ratio):
        return None
    order = np.argsort(lsol)
    n = max(1, min(32, len(ratio) // per_bin))
    chunks = np.array_split(order, n)
    centres = np.array([float(np.median(lsol[c])) for c in chunks])
    meds = np.array([float(np.median(ratio[c])) for c in chunks])
    meds = np.minimum.accumulate(np.maximum(meds, 1.0))
    return tuple(centres.tolist()), tuple(meds.tolist()), int(len(ratio))


def _scan_partition(part, hwut, probes: dict, tol: float, count: Callable, nongated: frozenset = frozenset(),
                    ratios: list | None = None):
    """Price one partition's rows, grouped by fixed shape; the violations as a DataFrame (None if none)."""
    import pandas as pd

    n = len(part.t)
    fam = part.family
    if hwut is None:
        count("no_descriptor", f"no graphsim hardware descriptor for {part.identity['device']!r}", n)
        return None
    if fam not in PROBES:
        count("unserved", UNMATCHED.get(fam, f"no graphsim op reads {fam} rows"), n)
        return None
    hw, ut = hwut
    coords = list(part.coords)
    var = VARYING[fam]
    fixed_cols = [c for c in coords if c not in var]
    fx_idx = [coords.index(c) for c in fixed_cols]
    shapes, inv = _groups(part.x[:, fx_idx])
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(shapes) + 1))
    ident = part.identity
    where = hw.name if fam in BY_DEVICE else ""
    sol = np.full(n, np.nan)
    cold = np.full(n, np.nan)  # every byte from HBM (a forward's SOL), what an efficiency is measured against
    use: list = []  # probes that serve some rows
    which = np.full(n, -1, dtype=np.int64)
    for j, shape in enumerate(shapes):
        sel = order[bounds[j]:bounds[j + 1]]
        fixed = dict(zip(fixed_cols, (int(x) for x in shape)))
        pid = {**ident, "act": _moe_act(ident, fixed, nongated)} if fam == "moe" else ident
        key = (where, fam) + tuple(pid.get(c, "") for c in PROBE_IDENTITY[fam]) + tuple(fixed.items())
        if key not in probes:
            probes[key] = PROBES[fam](pid, fixed, hw)
        pr = probes[key]
        why = pr if isinstance(pr, str) else _served(pr.lookup, fam, ident, fixed)
        if why:
            count("unserved", why, len(sel))
            continue
        which[sel] = len(use)
        use.append(pr)
    live = np.nonzero(which >= 0)[0]
    if len(live):
        c = {name: part.x[live, coords.index(name)] for name in var}
        rows = use[0].workload(c)
        got, ok, from_hbm = price(use, rows, which[live], ut, c, getattr(hw, "l2_bytes", 0.0))
        if not ok.all():
            count("unmapped", "the lookup's coordinates at the row's workload are not the row's", int((~ok).sum()))
        sol[live[ok]] = got[ok]
        cold[live[ok]] = from_hbm[ok]
        t = part.t[live]
        l2 = ok & (t < from_hbm * (1.0 - tol)) & (t >= got * (1.0 - tol))
        count("checked", "", int((ok & ~l2).sum()))
        count("checked", L2_RESIDENT, int(l2.sum()))
    if ratios is not None:
        ok = np.isfinite(cold) & (cold > 0)
        ratios.append((part.t[ok] / cold[ok], cold[ok]))
    bad = np.isfinite(sol) & (part.t < sol * (1.0 - tol))
    if not bad.any():
        return None
    out = {c: np.full(int(bad.sum()), ident.get(c, ""), dtype=object) for c in identity_columns(fam)}
    out["family"] = np.full(int(bad.sum()), fam, dtype=object)
    for j, c in enumerate(coords):
        out[c] = part.x[bad, j]
    out[LATENCY] = part.t[bad]
    out["sol_s"] = sol[bad]
    out["ratio"] = part.t[bad] / sol[bad]
    return pd.DataFrame(out)


__all__ = ["scan", "family_efficiency", "ScanResult", "PROBES", "VARYING", "STATUSES", "price", "Rows"]
