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

import math

import attrs

from graphsim.core.features import QUERY_FEATURES  # context parallelism divides these (the registry's flag)
from graphsim.core.errors import GraphsimError, require
from graphsim.core.ir import ONE, CommSpec, Cost, Edge, Graph, Op, OpInfo, replace_op
from graphsim.core.plan import ParallelMapping

from .layout import OpLayout, plan_layout
from .pipeline import PassContext

WORK = ("flops", "exps", "bytes_kv", "bytes_act", "bytes_c2c", "bytes_disk")
#: Cache traffic: a cache with fewer KV heads than TP ranks is read (and restored) whole on every rank.
CACHE_TRAFFIC = ("bytes_kv", "bytes_c2c", "bytes_disk")
#: Op kinds that stay whole on every TP rank whatever their ``split`` says.
TP_REPLICATED_KINDS = ("indexer",)
#: Cache roles context parallelism all-gathers (SWA needs only a W-position halo: neglected).
CP_GATHERED_ROLES = ("kv_cache", "index_cache")

#: Algorithms per collective. Inside one NVLink domain (a full-bandwidth switch): ``ring`` and ``tree`` are
#: NCCL's; ``one_shot`` sends (or reads) every peer's whole buffer in one step and reduces locally (TensorRT-LLM /
#: vLLM custom all-reduce; for all-gather / reduce-scatter: each shard straight to its peer); ``two_shot`` is a
#: direct reduce-scatter then a direct all-gather; ``nvls`` reduces in the NVLink switch (NVLink SHARP: multimem
#: loads reduce there, multimem stores are replicated there). ``hierarchical`` all-to-all sends a routed token
#: once per remote NVLink domain and forwards it inside the domain over NVLink (DeepEP normal kernels);
#: ``direct`` sends every (token, expert) pair to its rank.
ALGORITHMS = {
    "all_reduce": ("ring", "tree", "one_shot", "two_shot", "nvls"),
    "all_gather": ("ring", "tree", "one_shot", "nvls"),
    "reduce_scatter": ("ring", "tree", "one_shot", "nvls"),
    "all_to_all": ("direct", "hierarchical"),
    "p2p": ("direct",),
}
#: NCCL's protocols: wire bytes per data byte (LL: a flag per 8 B word, 16 B on the wire; LL128: 8 B of flag
#: per 128 B line; Simple: data only, one synchronization per chunk) and the latency component of one NVLink
#: step (``HardwareSpec.nvlink_ll_latency_s`` / ``nvlink_latency_s`` / ``nvlink_simple_latency_s``).
PROTOCOLS = {"ll": (2.0, "hops_nvlink_ll"), "ll128": (128 / 120, "hops_nvlink"), "simple": (1.0, "hops_nvlink_simple")}
PROTOCOL_LABEL = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
#: In-switch reduction moves plain loads and stores (no flags in the data): Simple only.
SIMPLE_ONLY = ("nvls",)
#: What ``link_cost(..., "auto")`` prices (the bandwidth view :mod:`.layout` compares layouts by): rings,
#: deduplicated all-to-all.
DEFAULT_ALGORITHM = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
                     "all_to_all": "hierarchical", "p2p": "direct"}


def _allowed(collective: str) -> tuple:
    algos = ALGORITHMS[collective]
    return (*algos, *(f"{a}/{p}" for a in algos for p in PROTOCOLS if a not in SIMPLE_ONLY or p == "simple"))


def check_algorithm(collective: str, algo: str, field: str) -> None:
    """``auto``, an algorithm (at its fastest protocol) or ``algorithm/protocol``; else a one-line error."""
    require(algo == "auto" or algo in _allowed(collective), field,
            f"unknown algorithm {algo!r} for {collective}; allowed: auto, {', '.join(ALGORITHMS[collective])}, "
            f"each optionally /{'|/'.join(PROTOCOLS)} (e.g. ring/ll128)")


def check_algorithms(value) -> tuple:
    """Normalize a {collective: algorithm} choice to sorted pairs, rejecting unknown names."""
    if not value:
        return ()
    try:
        # protocol names in any case: reports print them as LL / LL128 / Simple
        pairs = tuple(sorted((str(k), v.lower() if isinstance(v, str) else v) for k, v in dict(value).items()))
    except (TypeError, ValueError):
        raise GraphsimError("policies.algorithms", f"must map collective -> algorithm, got {value!r}") from None
    for coll, algo in pairs:
        require(coll in ALGORITHMS, "policies.algorithms", f"unknown collective {coll!r}; known: {sorted(ALGORITHMS)}")
        check_algorithm(coll, algo, f"policies.algorithms.{coll}")
    return pairs


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


def group_stride(group: str, m: ParallelMapping) -> int:
    """Rank stride between members of a group: tp innermost, then cp, then dp; ep/moe_tp span the stage;
    pp outermost."""
    return {"tp": 1, "cp": m.tp, "dp": m.tp * m.cp, "ep": 1, "world": 1, "moe_tp": 1, "pp": m.world}[group]


def members_in_domain(n: int, stride: int, domain: int) -> int:
    """How many members of an n-rank group (rank stride ``stride``) share rank 0's NVLink domain."""
    if stride >= domain:
        return 1
    return min(n, math.ceil(domain / stride))


def _lg(x: float) -> int:
    return math.ceil(math.log2(x)) if x > 1 else 0


def _shape(collective: str, algo: str, n: int, g: int, top_k: int, nvls: float):
    """(NVLink bytes, scale-out bytes) per payload byte and (NVLink, scale-out) steps of one algorithm over n
    ranks, g of them in rank 0's NVLink domain; None where the topology does not run it. See :func:`link_cost`
    for the formulas; ``nvls``: NVLink bytes per in-switch byte (nvlink_bw / nvls_bw; 0: no in-switch reduction)."""
    N = n / g
    crossing = g < n
    if collective in ("all_reduce", "all_gather", "reduce_scatter"):
        twice = 2 if collective == "all_reduce" else 1  # an all-reduce is a reduce-scatter + an all-gather
        if crossing:  # hierarchical: NVLink inside each domain, 1/g of the data over each rank's NIC
            if algo == "ring":
                return twice * (g - 1) / g, twice * (N - 1) / N / g, twice * (g - 1), twice * (N - 1)
            if algo == "tree":
                return twice * (g - 1) / g, twice / g, twice * _lg(g), twice * _lg(N)
            return None
        if algo == "ring":
            return twice * (n - 1) / n, 0.0, twice * (n - 1), 0
        if algo == "tree":
            return float(twice), 0.0, twice * _lg(n), 0
        if algo == "one_shot":  # all-reduce: every peer's whole buffer; AG / RS: each shard once, straight
            return ((n - 1.0) if twice == 2 else (n - 1) / n), 0.0, 1, 0
        if algo == "two_shot":
            return (2 * (n - 1) / n, 0.0, 2, 0) if twice == 2 else None
        if algo == "nvls" and nvls:
            # all-reduce: each rank sends the (n-1)/n of its buffer the others reduce and its reduced 1/n to be
            # replicated, and receives the same: S each way in two steps (ld_reduce, st); AG / RS: the (n-1)/n
            # it receives (sends) — the switch replicates (reduces) the rest
            return (nvls if twice == 2 else nvls * (n - 1) / n), 0.0, twice, 0
        return None
    if collective == "all_to_all":
        if algo == "hierarchical" and top_k:
            if crossing:  # once per remote domain over the NIC, then forwarded inside it over NVLink
                return (g - 1) / g, (N - 1) * (1 - (1 - 1 / N) ** top_k) / top_k, 1, 1
            return (n - 1) * (1 - (1 - 1 / n) ** top_k) / top_k, 0.0, 1, 0  # once to each distinct remote rank
        if algo == "hierarchical":
            return None  # without routing, the same as direct
        return ((g - 1) / n, (n - g) / n, *((0, 1) if crossing else (1, 0)))
    return (0.0, 1.0, 0, 1) if crossing else (1.0, 0.0, 1, 0)  # p2p between two ranks


def _priced(payload: Cost, shape, wire: float, hop: str) -> Cost:
    nv, so, h_nv, h_so = shape
    bytes_ = payload.component("bytes_act")
    terms = [("bytes_nvlink", f, v * nv * wire) for f, v in bytes_ if nv]
    terms += [("bytes_scaleout", f, v * so * wire) for f, v in bytes_ if so]
    terms += [(k, ONE, h) for k, h in ((hop, h_nv), ("hops_scaleout", h_so)) if h]
    return Cost(tuple(terms))


def link_cost(collective: str, n: int, in_domain: int, payload: Cost, algorithm: str = "auto",
              top_k: int = 0) -> tuple[Cost, str]:
    """Link bytes and hops of one collective per rank at one algorithm (``auto``: the bandwidth-optimal
    :data:`DEFAULT_ALGORITHM`), data at full wire efficiency and steps at the LL128 latency — the bandwidth
    view that :mod:`.layout` compares layouts by and pipeline sends use. What a collective op costs is the
    fastest of :func:`link_alternatives`. ``payload`` is the per-rank size S (``bytes_act`` terms): all-reduce
    input, all-gather/reduce-scatter full output, all-to-all send buffer, p2p message.

    With all n ranks in one NVLink domain (g = ``in_domain`` ≥ n) the per-rank volumes and steps are:
    all-reduce ring 2(n-1)/n·S in 2(n-1) steps, tree 2S in 2⌈log2 n⌉, one-shot (n-1)·S in 1, two-shot
    2(n-1)/n·S in 2, in-switch (NVLS) S in 2; all-gather / reduce-scatter ring (n-1)/n·S in n-1 steps, tree S in
    ⌈log2 n⌉, one-shot and NVLS (n-1)/n·S in 1; all-to-all (n-1)/n·S in one step; p2p S.
    Across N = n/g domains, rings and trees are hierarchical — the intra-domain phase over NVLink, the
    inter-domain phase on 1/g of the data over each rank's own NIC (g NICs per domain share it):
    all-reduce ring: NVLink 2(g-1)/g·S, scale-out 2(N-1)/N·S/g; all-gather ring: (g-1)/g·S and
    (N-1)/N·S/g; trees: 2(g-1)/g·S (or (g-1)/g·S) and 2S/g (or S/g), with log2 step counts.
    All-to-all direct: (g-1)/n·S over NVLink and (n-g)/n·S over the NIC, in parallel; hierarchical (needs
    ``top_k``): each token crosses once per remote domain it is routed to, (N-1)·(1-(1-1/N)^k)·S/k over
    the NIC, and is forwarded inside the domain, (g-1)/g·S over NVLink (one step each); inside one domain it
    is sent once to each distinct remote rank holding one of its k experts, (n-1)·(1-(1-1/n)^k)·S/k (DeepEP's
    per-rank deduplication; the combine returns one locally reduced row per token and rank).
    """
    algo = DEFAULT_ALGORITHM[collective] if algorithm == "auto" else algorithm
    require(algo in ALGORITHMS[collective] and algo not in SIMPLE_ONLY, f"collective[{collective}].algorithm",
            f"unknown algorithm {algo!r}; allowed: {[a for a in ALGORITHMS[collective] if a not in SIMPLE_ONLY]}")
    g = min(in_domain, n)
    shape = _shape(collective, algo, n, g, top_k, 0.0)
    if shape is None:  # (one-shot / two-shot across domains, hierarchical without routing): direct / ring
        algo = "direct" if collective == "all_to_all" else "ring"
        shape = _shape(collective, algo, n, g, top_k, 0.0)
    where = f"{g} of {n} in one NVLink domain" if g < n else "one NVLink domain"
    return _priced(payload, shape, 1.0, "hops_nvlink"), f"{collective}/{algo} over {n} ranks ({where})"


def link_alternatives(collective: str, n: int, in_domain: int, payload: Cost, algorithm: str = "auto",
                      top_k: int = 0, nvls: float = 0.0) -> tuple[tuple[str, Cost], ...]:
    """``(label, Cost)`` for every algorithm x protocol the topology runs (``algorithm``: ``auto``, one algorithm
    at each protocol, or ``algorithm/protocol``), labelled ``ring/LL128``; the op takes the fastest at each
    evaluated point. Per algorithm, :func:`link_cost`'s volumes and steps (one-shot / two-shot / NVLS inside one
    NVLink domain only; NVLS where the switch reduces, ``nvls`` > 0, at Simple); per protocol, the volumes times
    its wire bytes per data byte and each NVLink step at its latency. Alternatives no better than another in
    every term (ring vs two-shot inside a switch: same bytes, more steps) are dropped."""
    g = min(in_domain, n)
    algo, _, proto = algorithm.partition("/")
    # a forced algorithm the topology does not run (one-shot across domains): the default one, then the plain one
    tries = (ALGORITHMS[collective],) if algo == "auto" else \
        ((algo,), (DEFAULT_ALGORITHM[collective],), ("direct" if collective == "all_to_all" else "ring",))
    out: list[tuple[str, Cost]] = []
    for algos in tries:
        for a in algos:
            shape = _shape(collective, a, n, g, top_k, nvls)
            if shape is None:
                continue
            for p, (wire, hop) in PROTOCOLS.items():
                if (proto and p != proto) or (a in SIMPLE_ONLY and p != "simple"):
                    continue
                out.append((f"{a}/{PROTOCOL_LABEL[p]}", _priced(payload, shape, wire, hop)))
        if out:
            break
    return _undominated(out)


def _undominated(alts: list) -> tuple:
    """Drop alternatives that no point can prefer: another is at most as costly in every term (the first of
    equals stays)."""
    terms = [{(c, f): v for c, f, v in cost.terms} for _, cost in alts]

    def covers(a: dict, b: dict) -> bool:  # a <= b in every term
        return all(b.get(k, 0.0) >= v for k, v in a.items())

    keep = []
    for i, t in enumerate(terms):
        if not any(covers(terms[j], t) and (j < i or not covers(t, terms[j])) for j in range(len(terms)) if j != i):
            keep.append(alts[i])
    return tuple(keep)


def _payload_divisor(group: str, m: ParallelMapping, top_k: int) -> float:
    """Per-rank share of a batch-wide payload. TP (and CP) groups hold their DP group's tokens, split over
    cp; EP ranks each send their own 1/world of the tokens; an expert-TP group reduces the tokens routed to
    its EP rank, T·(1-(1-1/ep)^k) of the T tokens (all of them without EP)."""
    if group == "moe_tp":
        k = max(top_k, 1)
        return 1.0 / (1.0 - (1.0 - 1.0 / m.ep) ** k) if m.ep > 1 else 1.0
    return {"tp": m.dp * m.cp, "cp": m.dp, "dp": m.tp * m.cp, "ep": m.world, "world": m.world,
            "pp": m.world}[group]


def _group_size(group: str, m: ParallelMapping) -> int:
    return m.moe_tp if group == "moe_tp" else m.size(group)


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
