"""Stream and overlap passes, run after sharding (they need the collectives to exist).

The graph's data edges are the model's dataflow (a branch such as the shared expert reads the MoE block's
input, not the routed experts' output), and the scheduler runs each stream in program order: a collective
overlaps whatever compute of the same batch does not depend on it, with no pass at all (``overlap="none"``:
one batch, its own communication and compute overlapped — the fastest schedule of that program order).

* :func:`serialize_collectives` — ``overlap="serial"``: no overlap inside the batch; every collective waits
  for the compute issued before it and the compute issued after it waits for the collective (an engine that
  launches communication and compute on one stream).
* :func:`two_batch_overlap` — DeepSeek/SGLang "two-batch overlap": the batch runs as two micro-batches
  whose compute and communication interleave on the compute and comm streams, so one micro-batch's
  dispatch/combine/all-reduce hides behind the other's compute.
* :func:`prefetch_engram` — host-resident Engram tables: the rows a block looks up are copied host→device
  over NVLink-C2C on the host_copy stream, up to ``distance`` blocks ahead, and the lookup waits for them.
The analyses of what a prefetch hides (per-copy exposure, studies over distances) are in
:mod:`graphsim.serving.studies`.
"""
from __future__ import annotations

import attrs

from graphsim.core.errors import require
from graphsim.core.ir import Cost, Edge, Graph, Op, map_cost

from .pipeline import NO_CONTEXT, PassContext

#: Name suffixes of the two halves (pipeline micro-batch replicas use ``.mb{j}``).
HALVES = ("tbo0", "tbo1")


def scale_batch(cost: Cost, frac: float) -> Cost:
    """The cost of ``frac`` of the batch: every workload feature sees ``frac`` of the request counts (so
    nonlinear ones, e.g. experts touched, are recomputed for the smaller batch); per-forward terms
    (``one``: weight reads, collective latency hops) are paid in full by each part."""
    return cost.map_features(lambda f: f if f.kind == "one" else attrs.evolve(f, frac=f.frac * frac))


def chunk_batch(cost: Cost, j: int, m: int) -> Cost:
    """The cost of causal chunk j of m of every prompt; per-forward terms (weights, hops) paid per chunk."""
    return cost.map_features(lambda f: f if f.kind == "one" else attrs.evolve(f, chunk=(j, m)))


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


def serialize_collectives(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
    """No overlap inside the batch: on each device, compute and communication take turns in program order —
    a collective starts after the compute op issued before it, and the compute op issued after it starts
    after it (order edges; host copies keep their own stream)."""
    edges = list(graph.edges)
    have = {(e.src, e.dst) for e in edges}
    last: dict = {}  # device -> (stream, name) of its last compute or comm op
    for op in graph.ops:
        if op.stream not in ("compute", "comm"):
            continue
        prev = last.get(op.device)
        if prev is not None and prev[0] != op.stream and (prev[1], op.name) not in have:
            edges.append(Edge(prev[1], op.name, "order"))
        last[op.device] = (op.stream, op.name)
    return graph.evolve(edges=tuple(edges))


def split_prompts(plan) -> bool:
    """Whether two-batch overlap splits the tokens of the prompts (fewer than two requests per DP rank, all
    prefill) rather than the requests. A decode request's one position cannot be split."""
    if plan is None:
        return False
    per_rank = sum(r.count for r in plan.requests) / plan.mapping.dp
    if per_rank >= 2:
        return False
    require(all(r.kind == "prefill" for r in plan.requests), "policies.overlap",
            f"two-batch overlap needs >= 2 requests per DP rank to split a batch with decode requests "
            f"({per_rank:g} per rank); a prefill-only batch splits its prompts' tokens instead")
    shortest = min(r.new_tokens for r in plan.requests)
    require(shortest >= 2, "policies.overlap", f"two-batch overlap splits a prompt's tokens in two: a "
            f"{shortest}-token prompt cannot be split")
    return True


def two_batch_overlap(graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
    """Split every op into two half-batch copies (``.tbo0``, ``.tbo1``) and interleave them unit by unit:
    tbo0.u0, tbo1.u0, tbo0.u1, tbo1.u1, … Program order is stream order, so while half 0's collectives of
    unit k run on the comm stream, half 1's compute of unit k runs on the compute stream; each copy
    keeps its own data dependencies. Weights are read once per half.

    The halves are half of the requests each; with fewer than two prompts per DP rank (a prefill-only
    batch), they are the two causal halves of every prompt's new tokens (SGLang's two-batch overlap splits
    one sequence's tokens): per request, half 0 is positions [0, ⌊n/2⌋), half 1 the rest, attending to half
    0's KV as cached context (``Feature.chunk``), so the second half's attention costs more."""
    tokens = split_prompts(ctx.plan)
    require(not (tokens and graph.meta.pp_split == "causal-chunks"), "policies.overlap",
            "the pipeline already splits these prompts into causal chunks: two-batch overlap cannot split them again")
    order = [(i, h) for unit in _units(graph.ops) for h in HALVES for i in unit]
    half: dict[tuple, Cost] = {}  # each distinct cost halved once (repeated layers repeat their costs)
    for op in graph.ops:
        for j, h in enumerate(HALVES):
            for c in (op.cost, *(c for _, c in op.alts)):
                if (c, h) not in half:
                    half[c, h] = chunk_batch(c, j, 2) if tokens else scale_batch(c, 0.5)
    src = graph.ops
    ops = tuple(map_cost(op, lambda c, h=h: half[c, h], name=f"{op.name}.{h}", params=op.params + (("half", h),),
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
