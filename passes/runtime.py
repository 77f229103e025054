"""Runtime passes applied after sharding (they need collectives to exist): stream overlap, pipeline
parallelism, host-resident prefetch. Each is pure and named in the result's policy identity."""
from __future__ import annotations

from graphsim.ir import Graph


def apply_runtime_passes(graph: Graph, plan, hw) -> Graph:
    """The post-mapping passes a plan's policies ask for (none yet: identity)."""
    return graph
