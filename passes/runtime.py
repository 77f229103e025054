"""Runtime passes applied after sharding (they need collectives to exist): host-resident prefetch, pipeline
parallelism, stream overlap. Each is pure and named in the graph's ``runtime_passes`` meta entry.

Order matters: prefetch copies are inserted first (every later pass treats them as ordinary ops); the
pipeline cut comes before two-batch overlap because it needs ops in layer order, and overlap then splits
each pipeline micro-batch (sends included) into two interleaved halves.
"""
from __future__ import annotations

from graphsim.ir import Graph

from .overlap import prefetch_engram, two_batch_overlap
from .pipeline_parallel import pipeline_parallel


def apply_runtime_passes(graph: Graph, plan, hw, model=None) -> Graph:
    """The post-mapping passes a plan's policies and mapping ask for."""
    p = plan.policies
    if p.engram == "host":
        graph = prefetch_engram(graph, p.prefetch_distance)
    if plan.mapping.pp > 1:
        graph = pipeline_parallel(graph, plan, hw, model)
    if p.overlap == "two-batch":
        graph = two_batch_overlap(graph)
    return graph
