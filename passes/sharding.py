"""apply_mapping: divide each op's work over the ranks of a parallel mapping and turn its communication
needs (CommSpec) into costed collectives on the comm stream.

Costs after this pass are those of one representative rank (SPMD: every rank runs the same program).
"""
from __future__ import annotations

import math

import attrs

from graphsim.errors import GraphsimError
from graphsim.ir import ONE, CommSpec, Cost, Edge, Graph, Op
from graphsim.plan import ParallelMapping

WORK = ("flops", "bytes_kv", "bytes_act")


def split_factors(op: Op, m: ParallelMapping) -> tuple[float, float]:
    """(work divisor, weight divisor) for an op's ``split`` axes.

    tp splits heads/columns (work and weights); dp spreads requests (work only: weights are replicated);
    ep marks routed experts, spread over all ``tp·dp`` ranks of the MoE side (work and weights).
    """
    work = weight = 1.0
    if "tp" in op.split:
        work *= m.tp
        weight *= m.tp
    if "dp" in op.split:
        work *= m.dp
    if "ep" in op.split:
        work *= m.world
        weight *= m.world
    return work, weight


def group_stride(group: str, m: ParallelMapping) -> int:
    """Rank stride between members of a group: tp innermost, then dp; ep/moe_tp span the stage; pp outermost."""
    return {"tp": 1, "dp": m.tp, "ep": 1, "world": 1, "moe_tp": 1, "pp": m.world}[group]


def members_in_domain(n: int, stride: int, domain: int) -> int:
    """How many members of an n-rank group (rank stride ``stride``) share rank 0's NVLink domain."""
    if stride >= domain:
        return 1
    return min(n, math.ceil(domain / stride))


def link_cost(spec: CommSpec, n: int, in_domain: int, payload: Cost) -> tuple[Cost, str]:
    """Link bytes and hops of one collective per rank, by algorithm. ``payload`` is the per-rank size S:
    all-reduce input, all-gather/reduce-scatter full output, all-to-all send buffer."""
    algo = spec.algorithm
    if algo == "auto":
        algo = "direct" if spec.collective in ("all_to_all", "p2p") else "ring"
    c = spec.collective
    if c == "all_reduce":
        vol, hops = (2.0 * (n - 1) / n, 2 * (n - 1)) if algo == "ring" else (2.0, 2 * math.ceil(math.log2(n)))
    elif c in ("all_gather", "reduce_scatter"):
        vol, hops = ((n - 1) / n, n - 1) if algo == "ring" else (1.0, math.ceil(math.log2(n)))
    elif c == "all_to_all":
        vol, hops = (n - 1) / n, 1
    else:  # p2p
        vol, hops = 1.0, 1
    bytes_ = payload.component("bytes_act")
    if in_domain >= n:
        terms = [("bytes_nvlink", f, v * vol) for f, v in bytes_] + [("hops_nvlink", ONE, hops)]
    elif c == "all_to_all":
        # Direct sends: peers inside the domain over NVLink, the rest over the scale-out NIC, in parallel.
        terms = [("bytes_nvlink", f, v * (in_domain - 1) / n) for f, v in bytes_]
        terms += [("bytes_scaleout", f, v * (n - in_domain) / n) for f, v in bytes_]
        terms += [("hops_scaleout", ONE, hops)]
    else:
        # A ring or tree that leaves the domain is bound by its slowest (scale-out) link.
        terms = [("bytes_scaleout", f, v * vol) for f, v in bytes_] + [("hops_scaleout", ONE, hops)]
    return Cost(tuple(terms)), f"{c}/{algo} over {n} ranks ({in_domain} in NVLink domain)"


def _group_size(group: str, m: ParallelMapping) -> int:
    return m.moe_tp if group == "moe_tp" else m.size(group)


def _payload_divisor(group: str, m: ParallelMapping) -> float:
    """Per-rank share of a batch-wide payload: TP groups hold their DP group's tokens; EP/MoE groups
    hold 1/world of the tokens (each rank dispatches its own share)."""
    return {"tp": m.dp, "dp": m.tp, "ep": m.world, "world": m.world, "moe_tp": m.world, "pp": m.world}[group]


def apply_mapping(graph: Graph, mapping: ParallelMapping, nvlink_domain: int) -> Graph:
    """Shard op costs over ``mapping`` and materialize collectives for groups with more than one rank."""
    ops: list[Op] = []
    edges = list(graph.edges)
    for op in graph.ops:
        work, weight = split_factors(op, mapping)
        cost = op.cost.scaled(lambda c: 1.0 / (weight if c == "bytes_weight" else work if c.startswith(WORK) else 1.0))
        base = attrs.evolve(op, cost=cost, comm=())
        before: list[Op] = []
        after: list[Op] = []
        for i, spec in enumerate(op.comm):
            n = _group_size(spec.group, mapping)
            if n <= 1:
                continue
            stride = group_stride(spec.group, mapping)
            payload = spec.payload * (1.0 / _payload_divisor(spec.group, mapping))
            cost_c, how = link_cost(spec, n, members_in_domain(n, stride, nvlink_domain), payload)
            name = f"{op.name}.{spec.collective}" + (f".{i}" if len(op.comm) > 1 else "")
            if op.kind == "collective" and len(op.comm) == 1:
                base = attrs.evolve(base, cost=cost_c, formula=how)
                continue
            cop = Op(name, "collective", op.stage, cost_c, op.layer, "comm", op.token_set, "",
                     frozenset(), (), (), (), (("collective", spec.collective), ("group", spec.group),
                                             ("ranks", n), ("note", spec.note)), how)
            (before if spec.where == "before" else after).append(cop)
        if op.kind == "collective" and not base.cost.terms and op.comm:
            base = attrs.evolve(base, formula="single rank: no communication")
        edges = _rewire(edges, op.name, before, after)
        ops.extend(before)
        ops.append(base)
        ops.extend(after)
    meta = dict(graph.meta)
    meta["mapping"] = str(mapping)
    return graph.evolve(ops=tuple(ops), edges=tuple(edges), meta=tuple(meta.items()))


def _rewire(edges: list[Edge], name: str, before: list[Op], after: list[Op]) -> list[Edge]:
    """Put collectives between an op and its data producers/consumers."""
    if not before and not after:
        return edges
    out = []
    head = before[0].name if before else name
    tail = after[-1].name if after else name
    for e in edges:
        if before and e.dst == name:
            out.append(Edge(e.src, head, e.kind))
        elif after and e.src == name:
            out.append(Edge(tail, e.dst, e.kind))
        else:
            out.append(e)
    chain = [o.name for o in before] + [name] + [o.name for o in after]
    out.extend(Edge(a, b, "data") for a, b in zip(chain, chain[1:]))
    return out


def check_divisible(field: str, total: int, parts: int, what: str) -> None:
    if total % parts:
        raise GraphsimError(field, f"{parts} does not divide {what} ({total}); choose a divisor of {total}")
