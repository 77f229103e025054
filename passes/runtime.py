"""The passes a plan's mapping and policies add after the model's own: sharding first (it materializes the
collectives), the serial schedule when asked (before anything adds ops of its own: pipeline sends and host
copies keep their overlap), then host-resident prefetch, the pipeline cut, stream overlap. Order matters: prefetch copies
are inserted before the pipeline cut (every later pass treats them as ordinary ops); the cut needs ops in
layer order, and two-batch overlap then splits each pipeline micro-batch (sends included) into halves.
"""
from __future__ import annotations

from .overlap import prefetch_engram, serialize_collectives, two_batch_overlap
from .pipeline import PassContext
from .pipeline_parallel import pipeline_parallel
from .sharding import shard


def plan_passes(ctx: PassContext) -> list:
    """(name, pass) pairs the plan in ``ctx`` needs after the model's policy passes."""
    p, m = ctx.plan.policies, ctx.plan.mapping
    out = [("shard", shard)]
    if p.overlap == "serial":
        out.append(("serialize_collectives", serialize_collectives))
    if p.engram == "host":
        out.append(("engram_prefetch", prefetch_engram))
    if m.pp > 1:
        out.append(("pipeline_parallel", pipeline_parallel))
    if p.overlap == "two-batch":
        out.append(("two_batch_overlap", two_batch_overlap))
    return out
