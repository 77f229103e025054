"""apply_mapping: divide each op's work over the ranks of a parallel mapping and turn its communication
needs (CommSpec) into costed collectives on the comm stream.

Costs after this pass are those of one representative rank (SPMD: every rank runs the same program).

Rank layout: tp innermost, then cp, then dp; the MoE side (ep × moe_tp) spans the tp·dp·cp ranks of a
pipeline stage; pp outermost. A group whose members do not all share rank 0's NVLink domain crosses the
scale-out network; how much of its traffic does is the collective algorithm's business (:func:`link_cost`).

Model-independent sharding rules enforced here (V41_FACTS §12):

* ops of kind ``indexer`` are replicated across TP (every rank scores all index heads, no reduction);
* an op reading a ``table`` tensor (Engram) must be TP-split (rows sharded) and all-reduce over TP;
* context parallelism is for prefill only, and neither CP nor PP runs with a vision stage.
"""
from __future__ import annotations


import attrs

from graphsim.core.features import QUERY_FEATURES  # context parallelism divides these (the registry's flag)
from graphsim.core.errors import GraphsimError, require
from graphsim.core.ir import CommSpec, Cost, Edge, Graph, Op, OpInfo, replace_op
from graphsim.core.plan import ParallelMapping

from .links import (_group_size, _payload_divisor, group_stride, link_alternatives, link_cost,  # noqa: F401
                    members_in_domain)
from .layout import OpLayout, plan_layout
from .pipeline import PassContext

WORK = ("flops", "exps", "bytes_kv", "bytes_act", "bytes_c2c", "bytes_disk")
#: Cache traffic: a cache with fewer KV heads than TP ranks is read (and restored) whole on every rank.
CACHE_TRAFFIC = ("bytes_kv", "bytes_c2c", "bytes_disk")
#: Op kinds that stay whole on every TP rank whatever their ``split`` says.
TP_REPLICATED_KINDS = ("indexer",)
#: Cache roles context parallelism all-gathers (SWA needs only a W-position halo: neglected).
CP_GATHERED_ROLES = ("kv_cache", "index_cache")

# the collectives' vocabulary lives with the plan's values (Policies.algorithms checks it)
from graphsim.core.collectives import (ALGORITHMS, DEFAULT_ALGORITHM, PROTOCOL_LABEL, PROTOCOLS, SIMPLE_ONLY, _allowed, check_algorithm, check_algorithms)  # noqa: E402,F401


def effective_split(op: Op) -> frozenset:
    """The op's split axes after the model-independent rules (indexers never TP-split)."""
    return op.split - {"tp"} if op.kind in TP_REPLICATED_KINDS else op.split


def split_factors(op: Op, m: ParallelMapping) -> tuple[float, float]:
    """(work divisor, weight divisor) for an op's ``split`` axes.

    tp splits heads/columns (work and weights); dp spreads requests (work only: weights are replicated);
    ep marks routed experts, spread over all ``tp·dp·cp`` ranks of the MoE side (work and weights).
    Context parallelism further divides query-proportional work of dp-split ops (see :func:`shard_cost`).
    """
    split = effective_split(op)
    work = weight = 1.0
    if "tp" in split:
        work *= m.tp
        weight *= m.tp
    if "dp" in split:
        work *= m.dp
    if "ep" in split or "world" in split:
        work *= m.world
        weight *= m.world
    return work, weight


def shard_cost(op: Op, m: ParallelMapping, ep_imbalance: float = 1.0, layout: OpLayout = OpLayout()) -> Cost:
    """One rank's share of ``op.cost``: weights by the weight divisor, work by the work divisor (times cp
    for query features of token-parallel ops, and times the layout's token divisor where the op runs on
    1/tp of the tokens); the hottest EP rank carries ``ep_imbalance`` × the mean. An op whose layout
    replicates its TP-split weights reads them whole (its tokens are split instead of its columns)."""
    work, weight = split_factors(op, m)
    split = effective_split(op)
    if layout.replicate_weights and "tp" in split:
        weight /= m.tp
    cp = (m.cp if "dp" in split and "ep" not in split else 1) * layout.token_div
    # A cache with fewer KV heads than TP ranks is replicated: each rank reads all the heads it holds
    # (one shared latent for MLA / V4.1 -> every rank reads the whole cache).
    kv_heads = op.info.kv_heads
    kv_work = work / m.tp * min(m.tp, kv_heads) if kv_heads and "tp" in split else work

    def share(c: str, f, v: float) -> float:
        if c == "bytes_weight":
            return v / weight
        if c.startswith(WORK):
            div = kv_work if c in CACHE_TRAFFIC else work
            return v / (div * (cp if f.kind in QUERY_FEATURES else 1))
        return v

    cost = Cost(tuple((c, f, share(c, f, v)) for c, f, v in op.cost.terms))
    return _imbalanced(cost, ep_imbalance) if "ep" in split else cost


def _imbalanced(cost: Cost, factor: float) -> Cost:
    """Scale the token count behind every workload feature (``frac``), so nonlinear ones (experts touched)
    see the hot rank's tokens too; per-forward terms (``one``) are untouched."""
    if factor == 1.0:
        return cost
    return cost.map_features(lambda f: f if f.kind == "one" else attrs.evolve(f, frac=f.frac * factor))


def check_mapping(graph: Graph, m: ParallelMapping) -> None:
    """Reject mappings that cannot exist for this graph (clear field names)."""
    kinds = set(graph.meta.kinds)
    if m.cp > 1 and "decode" in kinds:
        raise GraphsimError("mapping.cp", f"context parallelism (cp={m.cp}) is modelled for long prefill only; "
                            "this batch has decode requests: use cp=1 or a prefill-only batch")
    vision = any(op.stage == "vision" for op in graph.ops)
    for axis in ("pp", "cp"):
        if vision and getattr(m, axis) > 1:
            raise GraphsimError(f"mapping.{axis}", f"{axis}={getattr(m, axis)} cannot run with a vision stage "
                                "(the vision tower and its merger or aligner run before the trunk on every rank); "
                                "use 1 or text-only requests")
    tensors = graph.tensor_map
    for op in graph.ops:
        if any(tensors[t].role == "table" for t in op.reads):
            if "world" in op.split:
                require(any(s.collective == "all_to_all" and s.group == "world" for s in op.comm),
                        f"op[{op.name}].comm", "table rows sharded over every rank: the lookup needs an all-to-all")
                continue
            require("tp" in op.split, f"op[{op.name}].split",
                    "an op reading table rows must be TP- or world-split (rows sharded)")
            require(any(s.collective == "all_reduce" and s.group == "tp" for s in op.comm), f"op[{op.name}].comm",
                    "table rows are sharded across TP: the lookup needs a TP all-reduce")


def layout_of(graph: Graph, mapping: ParallelMapping, nvlink_domain: int, policies=None, hw=None):
    """The token layouts (:mod:`graphsim.passes.layout`) ``apply_mapping`` uses for this graph; ``hw`` (optional)
    weighs scale-out bytes against NVLink bytes when two layouts are compared."""
    return plan_layout(graph, mapping, nvlink_domain, sp=getattr(policies, "sp", "off") == "on",
                       residual_bytes=graph.meta.residual_bytes,
                       scaleout_cost=hw.nvlink_bw / hw.scaleout_bw if hw is not None else 1.0)


def shard(graph: Graph, ctx: PassContext) -> Graph:
    """Pass: :func:`apply_mapping` with the plan's mapping and policies on the context's hardware."""
    plan, hw = ctx.need("plan", "shard"), ctx.need("hw", "shard")
    return apply_mapping(graph, plan.mapping, hw.nvlink_domain, policies=plan.policies, hw=hw)


def apply_mapping(graph: Graph, mapping: ParallelMapping, nvlink_domain: int, *, policies=None, hw=None) -> Graph:
    """Shard op costs over ``mapping`` and materialize collectives for groups with more than one rank.
    ``policies`` (optional) supplies ``algorithms`` overrides, ``ep_imbalance`` and ``sp``; ``hw`` (optional)
    the link rates that pick a MoE block's token layout."""
    check_mapping(graph, mapping)
    algos = dict(getattr(policies, "algorithms", ()) or ())
    # NVLink bytes per in-switch byte where the switch reduces (NVLS), else 0 (unknown hardware: none)
    nvls = hw.nvlink_bw / hw.nvls_bw if hw is not None and hw.nvls_bw > 0 else 0.0
    imb = float(getattr(policies, "ep_imbalance", 1.0))
    layout = layout_of(graph, mapping, nvlink_domain, policies, hw)
    tensors = graph.tensor_map
    ops: list[Op] = []
    heads: dict[str, str] = {}  # op -> the first collective before it (its producers' edges go there)
    tails: dict[str, str] = {}  # op -> the last collective after it (its consumers' edges leave there)
    chains: list[Edge] = []
    merged: dict[tuple, int] = {}  # (layer, merge key, collective, ranks, stride) -> index of the pending one
    # Repeated layers repeat their costs: shard each distinct (cost, how it splits) and each distinct
    # collective once (hash-consing; the results are equal values, so sharing them is safe).
    shared: dict[tuple, tuple] = {}  # key -> (its share, whether that is the whole cost)
    linked: dict[tuple, tuple] = {}
    for op in graph.ops:
        lay = layout.of(op.name)
        key = (op.cost, effective_split(op), op.info.kv_heads if "tp" in op.split else 0, lay.replicate_weights,
               lay.token_div)
        hit = shared.get(key)
        if hit is None:
            cost = shard_cost(op, mapping, imb, lay)
            hit = shared[key] = cost, cost == op.cost
        cost, same = hit
        # an op whose share is its whole cost (a 1-rank axis, a replicated op) and that needs no collective
        # stays the same value: keep it (with its own cost, as sharding it would have produced)
        base = op if same and not op.comm else replace_op(op, cost=op.cost if same else cost, comm=())
        if op.kind in TP_REPLICATED_KINDS and "tp" in op.split and mapping.tp > 1:
            base = replace_op(base, formula=f"{op.formula} [replicated across TP]".strip())
        top_k = op.info.top_k
        hot = imb if "ep" in op.split else 1.0
        specs = (*(op.comm if lay.comm is None else lay.comm), *lay.before, *lay.after)
        needs = [(s.group, s) for s in specs]
        if mapping.cp > 1 and any(tensors[t].role in CP_GATHERED_ROLES for t in op.writes):
            # the new KV this op writes, gathered over the cp group (a group only the mapping knows)
            kv = Cost(tuple(("bytes_act", f, v) for c, f, v in op.cost.terms
                            if c == "bytes_kv" and f.kind in QUERY_FEATURES))
            needs.append(("cp", CommSpec("all_gather", "tp", kv, "after", note="context-parallel KV all-gather")))
        before: list[Op] = []
        after: list[Op] = []
        for i, (group, spec) in enumerate(needs):
            n = _group_size(group, mapping)
            if n <= 1:
                continue
            algo = algos.get(spec.collective, spec.algorithm)
            check_algorithm(spec.collective, algo, f"op[{op.name}].comm")
            lkey = (spec.collective, spec.payload, group, algo, hot, top_k)
            if lkey not in linked:
                payload = _imbalanced(spec.payload, hot) * (1.0 / _payload_divisor(group, mapping, top_k))
                in_domain = members_in_domain(n, group_stride(group, mapping), nvlink_domain)
                options = link_alternatives(spec.collective, n, in_domain, payload, algo, top_k, nvls)
                linked[lkey] = options, _label(spec.collective, n, in_domain, options), \
                    _link_factor(options[0][1], payload)
            options, how, factor = linked[lkey]
            cost_c, alts = options[0][1], options  # (one option: its label, no alternative classes)
            info = OpInfo(collective=spec.collective, ranks=n, link_factor=factor)
            if spec.phase:  # an MoE token exchange: its rows' shape, for measured dispatch / combine tables
                info = attrs.evolve(info, role=spec.phase, payload_format=spec.payload_format, hidden=op.info.hidden,
                                    top_k=op.info.top_k, experts=op.info.experts)
            name = f"{op.name}.{spec.collective}" + (f".{i}" if len(needs) > 1 else "")
            if op.kind == "collective" and len(needs) == 1:
                base = replace_op(base, cost=cost_c, alts=alts, formula=how, info=attrs.evolve(base.info, **{
                    k: getattr(info, k) for k in ("collective", "ranks", "link_factor", "role", "payload_format")}))
                continue
            cop = Op(name, "collective", op.stage, cost_c, op.layer, "comm", op.token_set, "",
                     frozenset(), (), (), (), (("group", group), ("note", spec.note)), how, info=info, alts=alts)
            if spec.merge:
                key = (op.layer, spec.merge, spec.collective, n, group_stride(group, mapping))
                if key in merged:  # the earlier one's data rides in this one: it costs nothing
                    j = merged[key]
                    ops[j] = replace_op(ops[j], cost=Cost(), alts=(), formula=f"merged into {name}")
                merged[key] = len(ops) + len(before) + 1 + len(after) if spec.where == "after" else len(ops) + len(before)
            (before if spec.where == "before" else after).append(cop)
        if op.kind == "collective" and not base.cost.terms and op.comm:
            base = replace_op(base, formula="single rank: no communication")
        if before or after:  # put the collectives between the op and its producers / consumers
            if before:
                heads[op.name] = before[0].name
            if after:
                tails[op.name] = after[-1].name
            chain = [o.name for o in before] + [op.name] + [o.name for o in after]
            chains.extend(Edge(a, b, "data") for a, b in zip(chain, chain[1:]))
        ops.extend(before)
        ops.append(base)
        ops.extend(after)
    meta = attrs.evolve(graph.meta, mapping=str(mapping), moe_layout=tuple(sorted(set(layout.moe.values()))))
    return graph.evolve(ops=tuple(ops), edges=(*_rewired(graph.edges, heads, tails), *chains), meta=meta)


def _label(collective: str, n: int, in_domain: int, options: tuple) -> str:
    """``all_reduce over 4 ranks (one NVLink domain): fastest of one_shot/LL, ...`` (the op's formula; reports
    name the one that ran at the evaluated point)."""
    g = min(in_domain, n)
    where = f"{g} of {n} in one NVLink domain" if g < n else "one NVLink domain"
    if len(options) == 1:
        return f"{collective}/{options[0][0]} over {n} ranks ({where})"
    return f"{collective} over {n} ranks ({where}): fastest of {', '.join(label for label, _ in options)}"


def _link_factor(cost: Cost, payload: Cost) -> float:
    """Bytes on the collective's busiest link (NVLink, else scale-out) per byte of its payload."""
    pay = sum(v for _, v in payload.component("bytes_act"))
    if pay <= 0:
        return 0.0
    for c in ("bytes_nvlink", "bytes_scaleout"):
        link = sum(v for _, v in cost.component(c))
        if link > 0:
            return link / pay
    return 0.0


def _rewired(edges, heads: dict, tails: dict) -> list[Edge]:
    """Put collectives between ops and their data producers/consumers: every edge of the graph, with
    producers feeding an op's first collective before it (``heads``) and consumers fed by its last
    collective after it (``tails``)."""
    if not heads and not tails:
        return list(edges)
    out = []
    for e in edges:
        src, dst = tails.get(e.src, e.src), heads.get(e.dst, e.dst)
        out.append(e if src is e.src and dst is e.dst else Edge(src, dst, e.kind))
    return out


def check_divisible(field: str, total: int, parts: int, what: str) -> None:
    if total % parts:
        raise GraphsimError(field, f"{parts} does not divide {what} ({total}); choose a divisor of {total}")
