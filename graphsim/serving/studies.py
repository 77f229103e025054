"""Analyses of compiled plans — functions of a schedule or of a few plans, never passes.

* :func:`prefetch_report` — per host-to-device copy feeding a table lookup: how long it took and how much of
  it the lookup waited for;
* :func:`prefetch_study` — host-resident Engram tables at each prefetch distance against all-HBM tables.
"""
from __future__ import annotations

import attrs

from ..core.limits import MAX_LAYERS, check_int


@attrs.frozen
class PrefetchRow:
    """One host→device copy: its duration and how long its consumer waited for it beyond its other inputs."""

    copy: str
    consumer: str
    copy_s: float
    exposed_s: float

    @property
    def hidden(self) -> bool:
        return self.exposed_s <= 1e-12


def prefetch_report(schedule, point: int = 0) -> list[PrefetchRow]:
    """Exposure of every host_copy feeding an op, from a reference :class:`Schedule` (full graph)."""
    g = schedule.graph
    idx = g.op_index
    preds: dict[int, list[int]] = {}
    for a, b in g.schedule_edges():
        preds.setdefault(b, []).append(a)
    fin = schedule.finish[point]
    rows = []
    tables = {t.name for t in g.tensors if t.role == "table"}
    for e in g.edges:
        src = g.ops[idx[e.src]]
        if src.stream != "host_copy" or not tables & set(g.ops[idx[e.dst]].reads):
            continue  # only copies that feed a table lookup (not e.g. a prefix-cache restore)
        i, j = idx[e.src], idx[e.dst]
        others = [fin[p] for p in preds.get(j, ()) if p != i]
        ready = max(others, default=0.0)
        rows.append(PrefetchRow(e.src, e.dst, float(schedule.duration[point, i]), float(max(0.0, fin[i] - ready))))
    return rows


@attrs.frozen
class PrefetchStudy:
    """One prefetch distance: the forward with host-resident tables vs all-HBM tables, and every copy."""

    distance: int
    forward_s: float
    forward_hbm_s: float
    copies: tuple

    @property
    def exposed_s(self) -> float:
        """Time the table lookups waited for their copies (summed over copies)."""
        return sum(r.exposed_s for r in self.copies)

    @property
    def hidden(self) -> bool:
        return all(r.hidden for r in self.copies)


def prefetch_study(model, hw, requests, mapping, distances=(0, 1, 2, 4), policies=None) -> list[PrefetchStudy]:
    """Host-resident Engram at each prefetch distance against the all-HBM baseline, for one batch."""
    from ..core.plan import Plan, Policies
    from ..driver.pipeline import compile_plan

    for d in distances:
        check_int("policies.prefetch_distance", d, 0, MAX_LAYERS)
    pol = policies or Policies()
    base = compile_plan(model, Plan(requests, mapping, attrs.evolve(pol, engram="hbm")), hw).schedule()
    out = []
    for d in distances:
        s = compile_plan(model, Plan(requests, mapping, attrs.evolve(pol, engram="host", prefetch_distance=d)),
                            hw).schedule()
        rows = tuple(r for r in prefetch_report(s) if ".h2d" in r.copy)  # the Engram copies only
        out.append(PrefetchStudy(d, float(s.forward[0]), float(base.forward[0]), rows))
    return out
