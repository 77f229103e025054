"""The link costs of collectives: how a group's members sit on the NVLink domains, each collective algorithm's
bytes and steps per link at an NCCL protocol (:func:`link_cost`, :func:`link_alternatives`), and the per-rank
share of a batch-wide payload. Shared by :mod:`.sharding` (which prices every collective of a graph) and
:mod:`.layout` (which compares layouts by their link time)."""
from __future__ import annotations

import math

from graphsim.core.collectives import ALGORITHMS, DEFAULT_ALGORITHM, PROTOCOL_LABEL, PROTOCOLS, SIMPLE_ONLY
from graphsim.core.errors import require
from graphsim.core.ir import ONE, Cost
from graphsim.core.plan import ParallelMapping

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
