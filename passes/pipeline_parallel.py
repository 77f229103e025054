"""Pipeline parallelism as a schedule transform of the sharded graph (one representative timeline).

The trunk's layers are split into ``pp`` contiguous stages (as even as possible: sizes differ by at most one,
extra layers on the earlier stages, since the last stage also carries the LM head). The batch runs as ``m``
micro-batches (``Policies.pp_micro_batches``, default ``pp``), so every op's workload features take
``frac = 1/m`` while weight reads and latencies are paid per micro-batch. Forward-only fill–drain of a
pipeline whose stage s takes t_s per micro-batch finishes at

    T = Σ_s t_s  +  (m - 1) · max_s t_s          (= (m + pp - 1) · t for equal stages)

which is exactly the critical path of: micro-batch 0 through every stage in order, with the bottleneck
stage s* repeated for micro-batches 1…m-1 right after its first pass (the last micro-batch then drains
through the later stages). This pass builds that timeline: stages in order, a p2p activation send on the
comm stream between consecutive stages (NVLink when both stages share an NVLink domain, else the NIC),
and (m-1) replicas of s*, each followed by its own send so sends overlap the next replica.

s* is chosen by evaluating the stages at the plan's own workload (SOL rates); a sweep far from that point
keeps this choice.

A batch with fewer requests than micro-batches (one long prompt, say) cannot be split by requests: it is
split into ``m`` causal chunks of every prompt (``Feature.chunk``), and chunk j attends to everything before
it, so later chunks cost more. The micro-batches then differ and the pipeline is built in full: every stage
runs every chunk on its own device (``Op.device``), chunk j enters stage s after chunk j-1 left it (the
device's stream order) and after stage s-1 sent it on — the fill-drain grid whose longest path is the
time to first token. Cross-stage cache reads (a KV owner in an earlier stage than its consumer, as CSA2
sharing allows) ride the same sends: the writer's new cache entries are added to every send they cross, and
the reading stage keeps its own copy of that cache (memory per device counts the KV as split evenly by pp).
"""
from __future__ import annotations

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError, require
from graphsim.core.ir import Cost, Edge, Feature, Graph, Op, OpInfo, map_cost

from .overlap import chunk_batch, scale_batch
from .pipeline import PassContext
from .sharding import link_cost

#: Caches a later stage may read from an earlier one's writer.
CACHE_ROLES = ("kv_cache", "index_cache", "swa_cache")
#: Sizes may differ by one layer; beyond this imbalance (slowest / mean stage) the split is rejected.
MAX_STAGE_IMBALANCE = 1.25


def trunk_layers(model, graph: Graph) -> int:
    """Number of trunk layers: the model's config, else the distinct layer ids of the graph."""
    if model is not None:
        return model.num_layers()
    return len({op.layer for op in graph.ops if op.layer is not None})


def stage_sizes(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage, validated: contiguous, sizes differing by at most one, extras first."""
    require(pp <= layers, "mapping.pp", f"pp={pp} exceeds the {layers} trunk layers: a stage would hold no layer")
    q, r = divmod(layers, pp)
    sizes = tuple(q + 1 if s < r else q for s in range(pp))
    worst = max(sizes) / (layers / pp)
    if worst > MAX_STAGE_IMBALANCE:
        divisors = [d for d in range(1, layers + 1) if layers % d == 0]
        raise GraphsimError("mapping.pp", f"pp={pp} splits {layers} trunk layers into stages of "
                            f"{min(sizes)}–{max(sizes)} layers: the slowest stage is {100 * (worst - 1):.0f} % "
                            f"above the mean (limit {100 * (MAX_STAGE_IMBALANCE - 1):.0f} %); use a divisor of "
                            f"{layers}: {divisors}")
    return sizes


def stage_of_ops(graph: Graph, sizes: tuple[int, ...]) -> np.ndarray:
    """Pipeline stage of every op: by its layer; layer-less ops follow the compute op before them (embedding
    ops land on stage 0, the head on the last); layers past the trunk (draft blocks) on the last stage.
    Copies and collectives with a layer (prefix restores issued up front) go to their layer's stage
    wherever they sit in program order; the compute stream must run in layer order."""
    bounds = np.cumsum(sizes)
    out = np.zeros(len(graph.ops), dtype=np.int64)
    cur = 0
    compute = []
    for i, op in enumerate(graph.ops):
        s = cur if op.layer is None else min(int(np.searchsorted(bounds, op.layer, side="right")), len(sizes) - 1)
        if op.stream == "compute":
            cur = s
            compute.append(i)
        out[i] = s
    require(bool(np.all(np.diff(out[compute]) >= 0)), "mapping.pp",
            "ops are not in layer order: cannot cut pipeline stages")
    return out


def residual_bytes_per_token(model) -> float:
    """Activation one token carries between stages: the residual stream(s) in BF16 (mHC keeps hc_mult)."""
    require(model is not None, "mapping.pp", "pipeline parallelism needs the model (its residual width) in the "
            "pass context")
    return float(model.residual_bytes_per_token())


def micro_batches(plan) -> int:
    m = plan.policies.pp_micro_batches or plan.mapping.pp
    decode = sum(r.count for r in plan.requests if r.kind == "decode")
    total = sum(r.count for r in plan.requests)
    require(decode == 0 or m <= total, "policies.pp_micro_batches",
            f"{m} micro-batches for a batch of {total} requests: a decode request cannot be split")
    if chunked(plan, m):
        shortest = min(r.new_tokens for r in plan.requests)
        require(m <= shortest, "policies.pp_micro_batches",
                f"{m} causal chunks of a {shortest}-token prompt: give at most {shortest} micro-batches")
    return m


def chunked(plan, m: int) -> bool:
    """Whether the micro-batches are causal chunks of the prompts (fewer requests than micro-batches)."""
    return m > 1 and sum(r.count for r in plan.requests) < m and all(r.kind == "prefill" for r in plan.requests)


def pipeline_parallel(graph: Graph, ctx: PassContext) -> Graph:
    """Pass: cut the sharded graph into ``pp`` stages with p2p sends, and either the bottleneck stage's
    replicas (micro-batches of requests) or the full grid (causal chunks of long prompts)."""
    plan, hw, model = (ctx.need(f, "pipeline_parallel") for f in ("plan", "hw", "model"))
    sizes = stage_sizes(trunk_layers(model, graph), plan.mapping.pp)
    m = micro_batches(plan)
    stage = stage_of_ops(graph, sizes)
    sends = _sends(graph, stage, plan.mapping, hw.nvlink_domain, residual_bytes_per_token(model))
    meta = attrs.evolve(graph.meta, pp_stages=sizes, pp_micro_batches=m)
    if chunked(plan, m):
        return _grid(graph, stage, sends, m).evolve(meta=attrs.evolve(meta, pp_split="causal-chunks"))
    scaled = graph.evolve(ops=tuple(map_cost(op, lambda c: scale_batch(c, 1.0 / m)) for op in graph.ops))
    sends = [attrs.evolve(s, cost=scale_batch(s.cost, 1.0 / m)) for s in sends]
    chain = _assemble(scaled, stage, sends, None, m)
    meta = attrs.evolve(meta, pp_split="requests")
    if m == 1:
        return chain.evolve(meta=meta)
    bottleneck = bottleneck_stage(chain, len(sizes), plan.workload(), hw)
    return _assemble(scaled, stage, sends, bottleneck, m).evolve(meta=attrs.evolve(meta, pp_bottleneck_stage=bottleneck))


def bottleneck_stage(chain: Graph, pp: int, workload, hw) -> int:
    """Analysis: the stage with the longest period per micro-batch (compute, or its outgoing send) when the
    one-micro-batch chain is evaluated at ``workload`` (SOL rates)."""
    from graphsim.lowering.evaluate import evaluate_reference, unit_time
    from graphsim.lowering.program import lower

    sched = evaluate_reference(lower(chain), workload, unit_time(hw.rates()))
    return int(np.argmax(_stage_periods(chain, sched, pp)))


def _sends(graph: Graph, stage: np.ndarray, mapping, domain: int, act_bytes: float) -> list[Op]:
    """One p2p op per stage boundary (``graph`` is already one rank's): the residual of the tokens entering
    the next stage (each rank sends its 1/world share; the receiving TP group re-gathers it over NVLink,
    neglected), plus the cache entries written before the boundary and read after it."""
    caches = {t.name for t in graph.tensors if t.role in CACHE_ROLES}
    writer = {t: i for i, op in enumerate(graph.ops) for t in op.writes if t in caches}
    out = []
    for s in range(mapping.pp - 1):
        first = next((op for op, st in zip(graph.ops, stage)
                      if st == s + 1 and op.token_set and op.stream == "compute"), None)
        ts = first.token_set if first is not None else ""
        # the batch's residual, 1/world of it per rank
        payload = Cost.of(Feature("tokens", ts), bytes_act=act_bytes / mapping.world) if ts else Cost()
        # caches written up to stage s and read after it (CSA2 sharing): their new entries travel too; the
        # writer's cost is already one rank's, and the TP ranks holding the same entries split the send
        carried = sorted({writer[t] for op, st in zip(graph.ops, stage) if st > s for t in op.reads
                          if t in writer and stage[writer[t]] <= s})
        for w in carried:
            payload += Cost(tuple(("bytes_act", f, v / mapping.tp) for c, f, v in graph.ops[w].cost.terms
                                  if c == "bytes_kv"))
        # rank r of stage s sends to rank r + world: same NVLink domain or across the NIC
        crossing = mapping.world >= domain or (s * mapping.world) // domain != ((s + 1) * mapping.world) // domain
        cost, how = link_cost("p2p", 2, 1 if crossing else 2, payload)
        out.append(Op(f"pp.send.{s}", "collective", (first or graph.ops[-1]).stage, cost, None, "comm", ts, "",
                      frozenset(), (), (), (),
                      (("group", "pp"), ("note", f"stage {s} -> {s + 1}")),
                      f"activation send, stage {s} -> {s + 1}: {how}", info=OpInfo(collective="p2p", ranks=2)))
    return out


def _assemble(graph: Graph, stage: np.ndarray, sends: list[Op], bottleneck: int | None, m: int) -> Graph:
    """Stages in program order with a send between consecutive ones; edges that cross a stage boundary
    are replaced by an edge from the send into that stage; the bottleneck stage (if given) is followed by
    its replicas for micro-batches 1…m-1, each with its own send."""
    idx = graph.op_index
    ops = graph.ops
    pp = len(sends) + 1
    inner = [e for e in graph.edges if stage[idx[e.src]] == stage[idx[e.dst]]]
    edges: list[Edge] = list(inner)
    has_pred = {idx[e.dst] for e in inner}
    has_succ = {idx[e.src] for e in inner}
    fed = {idx[e.dst] for e in graph.edges if stage[idx[e.src]] != stage[idx[e.dst]]}
    out: list[Op] = []
    incoming = ""
    for s in range(pp):
        members = [i for i in range(len(ops)) if stage[i] == s]
        edges += [Edge(incoming, ops[i].name, "data") for i in members if i in fed]
        prev: dict[int, str] = {}
        for j in range(m if s == bottleneck else 1):
            names = {i: ops[i].name if j == 0 else f"{ops[i].name}.mb{j}" for i in members}
            if j == 0:
                out.extend(ops[i] for i in members)
            else:
                out.extend(attrs.evolve(ops[i], name=names[i], params=ops[i].params + (("micro_batch", j),),
                                        origin=ops[i].origin or ops[i].name) for i in members)
                edges += [Edge(names[idx[e.src]], names[idx[e.dst]], e.kind) for e in inner if stage[idx[e.src]] == s]
                # micro-batch j enters the stage after micro-batch j-1 did
                edges += [Edge(prev[i], names[i], "order") for i in members if i not in has_pred]
            if s < pp - 1:  # each copy's send follows it, overlapping the next copy's compute
                send = sends[s] if s != bottleneck else attrs.evolve(sends[s], name=f"{sends[s].name}.mb{j}",
                                                                     origin=sends[s].name if j else "")
                out.append(send)
                edges += [Edge(names[i], send.name, "data") for i in members if i not in has_succ]
                incoming = send.name
            prev = names
    return graph.evolve(ops=tuple(out), edges=tuple(dict.fromkeys(edges)))


def _grid(graph: Graph, stage: np.ndarray, sends: list[Op], m: int) -> Graph:
    """Every stage runs every causal chunk on its own device: ops of (stage s, chunk j) are stage s's ops
    with chunk-j costs (``.mb{j}`` names for j > 0), in chunk-major program order; edges inside a stage copy
    keep the graph's, edges across stages go through the chunk's send; stream order per device makes chunk
    j wait for chunk j-1 on the same stage."""
    idx = graph.op_index
    pp = len(sends) + 1
    inner = [e for e in graph.edges if stage[idx[e.src]] == stage[idx[e.dst]]]
    has_succ = {idx[e.src] for e in inner}
    fed = {idx[e.dst] for e in graph.edges if stage[idx[e.src]] != stage[idx[e.dst]]}
    members = [[i for i in range(len(graph.ops)) if stage[i] == s] for s in range(pp)]
    ops: list[Op] = []
    edges: list[Edge] = []
    for j in range(m):
        suffix = "" if j == 0 else f".mb{j}"
        incoming = ""
        for s in range(pp):
            names = {i: graph.ops[i].name + suffix for i in members[s]}
            ops += [map_cost(graph.ops[i], lambda c: chunk_batch(c, j, m), name=names[i], device=s,
                             params=graph.ops[i].params + ((("micro_batch", j),) if j else ()),
                             origin=(graph.ops[i].origin or graph.ops[i].name) if j else graph.ops[i].origin)
                    for i in members[s]]
            edges += [Edge(names[idx[e.src]], names[idx[e.dst]], e.kind) for e in inner if stage[idx[e.src]] == s]
            if incoming:
                edges += [Edge(incoming, names[i], "data") for i in members[s] if i in fed]
            if s < pp - 1:
                send = attrs.evolve(sends[s], name=sends[s].name + suffix, cost=chunk_batch(sends[s].cost, j, m),
                                    device=s, params=sends[s].params + ((("micro_batch", j),) if j else ()),
                                    origin=sends[s].name if j else "")
                ops.append(send)
                edges += [Edge(names[i], send.name, "data") for i in members[s] if i not in has_succ]
                incoming = send.name
    return graph.evolve(ops=tuple(ops), edges=tuple(dict.fromkeys(edges)))


def _stage_periods(chain: Graph, sched, pp: int) -> np.ndarray:
    """Per stage, the longer of its time for one micro-batch (from the incoming send's end to its last op's
    end) and its outgoing send (which overlaps the next micro-batch's compute)."""
    fin, dur = sched.finish[0], sched.duration[0]
    t = np.zeros(pp)
    s, begin, end = 0, 0.0, 0.0
    for i, op in enumerate(chain.ops):
        if op.name.startswith("pp.send."):
            t[s] = max(end - begin, dur[i])
            s, begin, end = s + 1, fin[i], fin[i]
        else:
            end = max(end, fin[i])
    t[s] = end - begin
    return t
