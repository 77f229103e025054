"""Stream and overlap passes, run after sharding (they need the collectives to exist).

* :func:`two_batch_overlap` — DeepSeek/SGLang "two-batch overlap": the batch runs as two micro-batches
  whose compute and communication interleave on the compute and comm streams, so one micro-batch's
  dispatch/combine/all-reduce hides behind the other's compute.
* :func:`prefetch_engram` — host-resident Engram tables: the rows a block looks up are copied host→device
  over NVLink-C2C on the host_copy stream, up to ``distance`` blocks ahead, and the lookup waits for them.
The analyses of what a prefetch hides (per-copy exposure, studies over distances) are in
:mod:`graphsim.studies`.
"""
from __future__ import annotations

import attrs

from graphsim.ir import Cost, Edge, Graph, Op, map_cost, replace_op

from .pipeline import NO_CONTEXT, PassContext

#: Name suffixes of the two halves (pipeline micro-batch replicas use ``.mb{j}``).
HALVES = ("tbo0", "tbo1")


def scale_batch(cost: Cost, frac: float) -> Cost:
    """The cost of ``frac`` of the batch: every workload feature sees ``frac`` of the request counts (so
    nonlinear ones, e.g. experts touched, are recomputed for the smaller batch); per-forward terms
    (``one``: weight reads, collective latency hops) are paid in full by each part."""
    return cost.map_features(lambda f: f if f.kind == "one" else attrs.evolve(f, frac=f.frac * frac))


def _units(ops) -> list[list[int]]:
    """Cut program order into units [compute…, comm…]: a unit closes when compute follows communication,
    so each unit's collectives are what the next unit's compute waits for."""
    units: list[list[int]] = [[]]
    seen_comm = False
    for i, op in enumerate(ops):
        if op.stream == "comm":
            seen_comm = True
        elif seen_comm:
            units.append([])
            seen_comm = False
        units[-1].append(i)
    return [u for u in units if u]


def two_batch_overlap(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
    """Split every op into two half-batch copies (``.tbo0``, ``.tbo1``) and interleave them unit by unit:
    tbo0.u0, tbo1.u0, tbo0.u1, tbo1.u1, … Program order is stream order, so while half 0's collectives of
    unit k run on the comm stream, half 1's compute of unit k runs on the compute stream; each copy
    keeps its own data dependencies. Weights are read once per half."""
    order = [(i, h) for unit in _units(graph.ops) for h in HALVES for i in unit]
    half: dict[Cost, Cost] = {}  # each distinct cost halved once (repeated layers repeat their costs)
    for op in graph.ops:
        for c in (op.cost, *(c for _, c in op.alts)):
            if c not in half:
                half[c] = scale_batch(c, 0.5)
    src = graph.ops
    ops = tuple(map_cost(op, half.__getitem__, name=f"{op.name}.{h}", params=op.params + (("half", h),),
                         origin=op.origin or op.name)
                for op, h in ((src[i], h) for i, h in order))
    edges = tuple(Edge(f"{e.src}.{h}", f"{e.dst}.{h}", e.kind) for h in HALVES for e in graph.edges)
    return graph.evolve(ops=ops, edges=edges)


def table_readers(graph: Graph) -> list[int]:
    """Indices of ops that gather rows of a resident ``table`` tensor (Engram lookups)."""
    tensors = graph.tensor_map
    return [i for i, op in enumerate(graph.ops) if any(tensors[t].role == "table" for t in op.reads)]


def prefetch_engram(graph: Graph, ctx: PassContext) -> Graph:
    """Host-resident tables: before each table lookup in block L, copy the rows it reads host→device on the
    host_copy stream (C2C bytes = the lookup's table bytes). Row addresses depend only on token ids
    (deterministic hashing), so the copy needs no result of the forward: it may start when block
    L - ``distance`` starts (with no wait at all if that block precedes the trunk; ``distance`` 0 = on
    demand, fully exposed). Copies are issued on the host_copy stream in the order of the blocks they
    start with. The lookup then reads the staged rows from HBM as before."""
    distance = ctx.need("plan", "engram_prefetch").policies.prefetch_distance
    readers = table_readers(graph)
    if not readers:
        return graph
    ops = list(graph.ops)
    first_of_layer: dict[int, int] = {}
    for i, op in enumerate(ops):
        if op.layer is not None and op.stream == "compute":  # a block starts with its compute
            first_of_layer.setdefault(op.layer, i)
    preds: dict[str, list[str]] = {}
    for e in graph.edges:
        preds.setdefault(e.dst, []).append(e.src)
    inserts: dict[int, list[Op]] = {}
    edges = list(graph.edges)
    for i in readers:
        x = ops[i]
        rows = Cost(tuple(("bytes_c2c", f, v) for c, f, v in x.cost.terms if c == "bytes_weight"))
        start_layer = (x.layer or 0) - distance
        anchor = first_of_layer.get(start_layer)
        copy = Op(f"{x.name}.h2d", "host_copy", x.stage, rows, x.layer, "host_copy", x.token_set, "",
                  frozenset(), (), (), (), (("distance", distance), ("consumer", x.name)),
                  f"table rows for {x.name} over NVLink-C2C, issued {distance} block(s) ahead")
        # issued with the block it may start with; before the first block it waits for nothing, but is
        # still issued after copies the forward needs sooner (e.g. a prefix restore) on the same stream
        at = anchor if anchor is not None else min(first_of_layer.values(), default=0)
        inserts.setdefault(at, []).append(copy)
        if anchor is not None:
            edges += [Edge(p, copy.name, "order") for p in preds.get(ops[anchor].name, ())]
        edges.append(Edge(copy.name, x.name, "data"))
    out: list[Op] = []
    for i, op in enumerate(ops):
        out.extend(inserts.get(i, ()))
        out.append(op)
    return graph.evolve(ops=tuple(out), edges=tuple(edges),
                        meta=attrs.evolve(graph.meta, prefetch_distance=distance))
