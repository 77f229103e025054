"""Chrome / Perfetto trace JSON of a Schedule (open in ui.perfetto.dev or chrome://tracing).

One process per representative rank; one thread (track) per stream (compute, comm, host_copy) plus a
``critical path`` track repeating the ops that set the forward time and a ``stages`` track with one slice
per stage. Ops are complete ('X') events, times in microseconds, with args: FLOPs per precision, bytes per
kind, what bounds the op (compute / sfu / hbm / nvlink / scaleout / c2c / disk / latency), formula, stage,
layer. With pipeline parallelism over one long prompt each stage's GPU is a process of its own.
"""
from __future__ import annotations

import json
from typing import Sequence

from graphsim.core.ir import COMPONENTS, STREAMS

TRACKS = (*STREAMS, "critical path", "stages")


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 6)


def _pid(pid: int, device: int) -> int:
    """Process id of a rank's pipeline-stage device (device 0 keeps the rank's own id)."""
    return pid if device == 0 else 1000 * (pid + 1) + device


def rank_events(schedule, pid: int, label: str, point: int = 0) -> list[dict]:
    """Trace events of one rank (one process)."""
    g = schedule.graph
    bounds = schedule.bound(point)
    path = set(schedule.critical_path(point))
    ev: list[dict] = []
    for d in sorted({op.device for op in g.ops}):  # pipeline stages run on their own GPUs: one process each
        p = _pid(pid, d)
        name = label if d == 0 else f"{label}: pipeline stage {d}"
        ev += [{"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": name}},
               {"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0, "args": {"sort_index": p}}]
        for tid, track in enumerate(TRACKS):
            ev.append({"name": "thread_name", "ph": "M", "pid": p, "tid": tid, "args": {"name": track}})
            ev.append({"name": "thread_sort_index", "ph": "M", "pid": p, "tid": tid, "args": {"sort_index": tid}})
    stages: dict[str, list] = {}
    for i, op in enumerate(g.ops):
        comp = schedule.components[point, i]
        start, dur = schedule.start[point, i], schedule.duration[point, i]
        args = {
            "flops": {c[6:]: float(v) for c, v in zip(COMPONENTS, comp) if c.startswith("flops_") and v},
            "bytes": {c[6:]: float(v) for c, v in zip(COMPONENTS, comp) if c.startswith("bytes_") and v},
            "hops": {c[5:]: float(v) for c, v in zip(COMPONENTS, comp) if c.startswith("hops_") and v},
            "bound": bounds[i], "formula": op.formula, "stage": op.stage, "layer": op.layer,
            "token_set": op.token_set, "precision": op.precision, "critical": i in path,
        }
        if op.alts:  # a collective: the algorithm x protocol it ran at (the fastest at this point)
            args["algorithm"] = schedule.algorithm(i, point)
        if schedule.source is not None:  # a measured view: where this duration came from
            from graphsim.driver.views import SOURCE_NAMES

            args["source"] = SOURCE_NAMES[int(schedule.source[point, i])]
            args["sol_us"] = _us(schedule.sol_duration[point, i])
        x = {"name": op.name, "cat": op.kind, "ph": "X", "ts": _us(start), "dur": _us(dur), "pid": _pid(pid, op.device),
             "tid": STREAMS.index(op.stream), "args": args}
        ev.append(x)
        if i in path:
            ev.append({**x, "tid": TRACKS.index("critical path")})
        s = stages.setdefault(op.stage, [start, start + dur, 0.0])
        s[0], s[1], s[2] = min(s[0], start), max(s[1], start + dur), s[2] + dur
    for name, (lo, hi, busy) in stages.items():
        ev.append({"name": name, "cat": "stage", "ph": "X", "ts": _us(lo), "dur": _us(hi - lo), "pid": pid,
                   "tid": TRACKS.index("stages"), "args": {"busy_us": _us(busy)}})
    return ev


def to_trace(ranks: Sequence[tuple[str, object]] | object, point: int = 0, metadata: dict | None = None) -> dict:
    """The trace dict. ``ranks``: a Schedule, or (label, Schedule) pairs — one process each."""
    if not isinstance(ranks, (list, tuple)):
        ranks = [("rank 0", ranks)]
    events: list[dict] = []
    for pid, (label, sched) in enumerate(ranks):
        events += rank_events(sched, pid, label, point)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": dict(metadata or {})}


def trace_of(compiled, point: int = 0) -> dict:
    """A compiled plan's trace: its representative rank (every rank of an SPMD mapping runs this program)."""
    m = compiled.plan.mapping
    label = f"rank 0 ({m}; represents all {m.gpus} GPUs)"
    meta = {"model": compiled.model.name, "hw": compiled.hw.name, "mapping": str(m),
            "requests": [str(r) for r in compiled.plan.requests], "policies": compiled.plan.policies.identity(),
            "profile": compiled.profile.name if compiled.profile else "SOL", "view": compiled.view_name}
    if compiled.view is not None:
        meta["backend"] = compiled.view.backend
    from ..core.version import __version__

    meta["graphsim_version"] = __version__
    return to_trace([(label, compiled.schedule())], point, meta)


def write_trace(trace: dict, path: str) -> str:
    """Write the trace JSON (strict: no NaN/Infinity), atomically."""
    from graphsim.core.outputs import write_text

    return write_text(path, json.dumps(trace, default=str, allow_nan=False))


__all__ = ["TRACKS", "rank_events", "to_trace", "trace_of", "write_trace"]
