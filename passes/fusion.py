"""Fusion passes: merge adjacent ops into one kernel whose cost keeps every FLOP and weight read of its
members but charges activation traffic once, for what the fused kernel really reads and writes.

* ``fuse_mhc(profile)`` — V41_FACTS §7. The unit is a sub-block boundary: residual update of the finished
  sub-layer, then coefficients, pre-mix and pre-norm (with FP8 conversion) of the next. Elements per token:
  unfused (4n+4)d, two-pass (3n+2)d, single-pass (2n+2)d.
* ``fuse_norm_quant`` — an RMSNorm followed by its FP8 quantization becomes one read and one write.
"""
from __future__ import annotations

import attrs

from graphsim.core.errors import GraphsimError
from graphsim.core.ir import Cost, Edge, Feature, Graph, Op, OpInfo, replace_op

from .pipeline import NO_CONTEXT, PassContext

MHC_PROFILES = ("unfused", "two-pass", "single-pass")
ROLES_PRE = ("coeff", "sinkhorn", "premix", "prenorm")


def _without_act(cost: Cost) -> Cost:
    return Cost(tuple(t for t in cost.terms if t[0] != "bytes_act"))


def _fused_cost(costs: tuple, token_set: str, act_bytes: float, memo: dict) -> Cost:
    """Members' costs without their activation traffic, plus the fused kernel's own per token; ``memo``
    (one per pass run) computes it once per distinct group of costs (repeated layers repeat them)."""
    key = (costs, token_set, act_bytes)
    out = memo.get(key)
    if out is None:
        out = memo[key] = (Cost(tuple(t for c in costs for t in _without_act(c).terms))
                           + Cost.of(Feature("tokens", token_set), bytes_act=act_bytes))
    return out


def _merge(graph: Graph, groups: list[list[int]], make) -> Graph:
    """Replace each group of op indices (adjacent in program order) with ``make(ops) -> Op``."""
    replace: dict[int, Op] = {}
    drop: set[int] = set()
    rename: dict[str, str] = {}
    for grp in groups:
        fused = make([graph.ops[i] for i in grp])
        replace[grp[0]] = fused
        drop.update(grp[1:])
        for i in grp:
            rename[graph.ops[i].name] = fused.name
    ops = [replace.get(i, op) for i, op in enumerate(graph.ops) if i not in drop]
    edges, seen = [], set()
    for e in graph.edges:
        a, b = rename.get(e.src, e.src), rename.get(e.dst, e.dst)
        if a == b or (a, b, e.kind) in seen:
            continue
        seen.add((a, b, e.kind))
        edges.append(e if a is e.src and b is e.dst else Edge(a, b, e.kind))
    return graph.evolve(ops=tuple(ops), edges=tuple(edges))


def _runs(graph: Graph, pred, key) -> list[list[int]]:
    """Maximal runs of consecutive ops (program order) satisfying ``pred`` with equal ``key``."""
    runs, cur = [], []
    for i, op in enumerate(graph.ops):
        if pred(op) and (not cur or key(graph.ops[cur[-1]]) == key(op)):
            cur.append(i)
            continue
        if len(cur) > 1:
            runs.append(cur)
        cur = [i] if pred(op) else []
    if len(cur) > 1:
        runs.append(cur)
    return runs


def fuse_mhc(profile: str, *, n: int, d: int, stream_bytes: float = 2.0, norm_out_bytes: float = 1.0):
    """Pass factory for an mHC fusion profile (``n`` streams of width ``d``)."""
    if profile not in MHC_PROFILES:
        raise GraphsimError("policies.fusion", f"unknown mHC profile {profile!r}; allowed {MHC_PROFILES}")
    sb, nb = stream_bytes, norm_out_bytes
    # (elements, bytes) per token of each fused kernel
    residual = ((2 * n + 1) * d, (2 * n + 1) * d * sb)  # read n·d streams + d output, write n·d
    pre = ((n + 1) * d, n * d * sb + d * nb)  # read n·d, write d normalized FP8
    whole = ((2 * n + 2) * d, (n + 1) * d * sb + n * d * sb + d * nb)  # both in one pass

    memo: dict = {}  # fused costs of this run

    def mhc(op: Op) -> bool:
        return op.kind == "mhc" and op.info.role in (*ROLES_PRE, "residual")

    def make(ops: list[Op]) -> Op:
        roles = [o.info.role for o in ops]
        ts = ops[0].token_set
        has_res, has_pre = "residual" in roles, all(r in roles for r in ROLES_PRE)
        elems, nbytes = whole if (has_res and has_pre) else residual if has_res else pre
        cost = _fused_cost(tuple(o.cost for o in ops), ts, nbytes, memo)
        head = ops[-1] if has_pre else ops[0]
        name = head.name.rsplit(".", 1)[0] + (".fused" if has_res and has_pre else ".pre" if has_pre else ".res")
        return Op(name, "mhc", ops[0].stage, cost, head.layer, ops[0].stream, ts, ops[0].precision,
                  ops[0].split, tuple(t for o in ops for t in o.reads), tuple(t for o in ops for t in o.writes), (),
                  (("profile", profile),), f"fused mHC ({profile}): {elems // d} d elements per token",
                  info=OpInfo(role="+".join(roles), mhc_elems=elems))

    def groups_for(graph: Graph) -> list[list[int]]:
        out = []
        for run in _runs(graph, mhc, lambda o: (o.token_set, o.stage)):
            roles = [graph.ops[i].info.role for i in run]
            if profile == "single-pass":
                out.append(run)
            else:  # two-pass: the residual update alone, the pre-trio fused
                pre_idx = [i for i, r in zip(run, roles) if r != "residual"]
                if len(pre_idx) > 1:
                    out.append(pre_idx)
        return out

    def run(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
        if profile == "unfused":
            return graph
        # a lone residual update (two-pass) keeps its op: its traffic, (2n+1)d, is already the kernel's
        try:
            return _merge(graph, groups_for(graph), make)
        finally:
            memo.clear()

    run.__doc__ = f"Fuse mHC ({profile}): residual + next coefficients/pre-mix/pre-norm charged once."
    return run


def fuse_norm_quant(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
    """RMSNorm followed by FP8 quantization of its output: one kernel, read bf16 once, write FP8 once."""
    memo: dict = {}

    def make(ops: list[Op]) -> Op:
        norm, quant = ops
        n, q = norm.info, quant.info
        fused_act = n.elems * n.bytes_in + q.elems * q.bytes_out  # read once, write FP8 once
        cost = _fused_cost((norm.cost, quant.cost), norm.token_set, fused_act, memo)
        return replace_op(norm, name=norm.name + "+quant", kind="norm", cost=cost,
                          info=attrs.evolve(n, bytes_out=q.bytes_out),
                          writes=norm.writes + quant.writes, formula=f"{norm.formula}; FP8 output fused")

    groups = []
    for i in range(len(graph.ops) - 1):
        a, b = graph.ops[i], graph.ops[i + 1]
        if a.kind == "norm" and b.kind == "quant" and a.token_set == b.token_set and a.stream == b.stream:
            groups.append([i, i + 1])
    return _merge(graph, groups, make)
