"""The collectives' vocabulary: which algorithms and NCCL protocols each collective may run with, and the check
of a user's choice (``Policies.algorithms``). The pricing of each is :mod:`graphsim.passes.sharding`'s."""
from __future__ import annotations

from .errors import GraphsimError, require

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
