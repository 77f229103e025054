"""A results row back to its plan, for pictures of one row (``graphsim plot RESULTS --kind roofline --row I``).

The identity columns name the structural point (model with its load options, hw, profile, view, mapping,
every policy, request structure): the same :class:`StructuralPoint` the sweep compiled. The input columns give
the row's requests (``decode.context``, ``g1.count``…; a group field no column sets takes its default), and its
``hw.*`` / ``profile.*`` columns the rates, through the sweep's own workload and rate code — so the schedule's
forward time is the row's ``forward_s`` (the FPM view excepted: its schedule is the SOL one its curve scales).
"""
from __future__ import annotations

import json
import math
import re
from typing import Mapping

import numpy as np

from ..core.errors import GraphsimError
from .spec import GROUP_FIELDS, ModelRef, StructuralPoint, _hashable, _mapping_fields, _policy_fields

_MODEL = re.compile(r"^(?P<name>.+?)(?:\[(?P<opts>[^\[\]]*)\])?$")


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) != ""


def _model(text: str) -> ModelRef:
    """``ModelRef.__str__`` read back: ``name`` or ``name[weights=nvfp4,redundant_experts=32]``."""
    m = _MODEL.match(str(text))
    opts = dict(o.split("=", 1) for o in (m.group("opts") or "").split(",") if "=" in o)
    return ModelRef(m.group("name"), opts.get("weights"), int(opts.get("redundant_experts", 0)))


def _policy(default, value):
    """A policy column back to its value: structured policies are JSON text (sweep.spec._typed)."""
    if not _present(value):
        return default
    if isinstance(default, (tuple, list)):  # algorithms' pairs, acceptance's numbers: tuples as the spec keeps them
        return _hashable(json.loads(value) if isinstance(value, str) else value)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    return str(value)


def row_point(row: Mapping) -> StructuralPoint:
    """The structural point a results row's identity columns name (a one-line error naming a missing one)."""
    need = ("model", "hw", "requests", "mapping")
    missing = [c for c in need if c not in row or not _present(row[c])]
    if missing:
        raise GraphsimError("row", f"the row lacks the identity column(s) {', '.join(missing)}: only rows of a "
                            "graphsim sweep can be rebuilt into a plan")
    mapping = tuple((f, int(row[f])) for f in _mapping_fields() if f in row and _present(row[f]))
    pol = {k: _policy(d, row.get(k)) for k, d in _policy_fields().items()}
    policies = tuple((k, v) for k, v in pol.items() if v != _hashable(_policy_fields()[k]))
    view = tuple(str(row[c]) if _present(row.get(c)) else d for c, d in (("view", "sol"), ("measured", ""),
                                                                         ("backend", "")))
    return StructuralPoint(_model(row["model"]), str(row["hw"]), mapping, policies,
                           tuple(str(row["requests"]).split("+")), str(row.get("profile") or "SOL"), view)


def _groups(kinds: tuple, row: Mapping) -> list[dict]:
    """Per group, field -> (one-value array, column) with the sweep's precedence (``g<i>.f`` over ``kind.f``)."""
    out = []
    for i, k in enumerate(kinds):
        g = {}
        for f, default in GROUP_FIELDS[k].items():
            for name in (f"g{i}.{f}", f"{k}.{f}"):
                if name in row and _present(row[name]):
                    g[f] = (np.array([float(row[name])]), name)
                    break
            else:
                if default is None:
                    raise GraphsimError("row", f"the row has no {k}.{f} column: its {k} group has no length")
                g[f] = (np.array([float(default)]), "")
        out.append(g)
    return out


def row_requests(kinds: tuple, row: Mapping) -> tuple:
    """The row's requests, one per group."""
    from ..core.plan import Request
    from ..core.workload import TIERS

    out = []
    for k, g in zip(kinds, _groups(kinds, row)):
        v = {f: int(a[0][0]) for f, a in g.items()}
        if k == "prefill":
            out.append(Request("prefill", v["prompt"], v["count"], v["cached"], swa_cached=bool(v["swa_cached"]),
                               image_tokens=v["image"], image_patches=v["patches"], tier=TIERS[v["tier"]]))
        else:
            out.append(Request("decode", v["context"], v["count"], new=v["new"]))
    return tuple(out)


def row_schedule(row: Mapping):
    """(Compiled plan, its reference Schedule at the row's workload and rates) of a results row. An error row
    is refused (it has no schedule), naming its error."""
    from ..hw import load_profile
    from ..lowering.evaluate import evaluate_reference
    from ..core.workload import FIELDS, Workload
    from .points import _PROGRAMS, _Rates, _workload_arrays

    if _present(row.get("error")):
        raise GraphsimError("row", f"an error row has no schedule: {row['error']}")
    sp = row_point(row).with_inputs()
    requests = row_requests(sp.kinds, row)
    compiled, _ = _PROGRAMS.get(sp, requests)
    pol = {**_policy_fields(), **dict(sp.policies)}
    wl = _workload_arrays(sp.kinds, _groups(sp.kinds, row), pol)
    hw_axes = sorted(c for c in row if str(c).startswith("hw.") and _present(row[c]))
    prof_axes = sorted(c for c in row if str(c).startswith("profile.") and _present(row[c]))
    profile = None if sp.profile == "SOL" else load_profile(sp.profile)
    ut, overhead, _, err, field = _Rates(compiled.hw, profile, hw_axes, prof_axes).row(
        tuple(float(row[c]) for c in (*hw_axes, *prof_axes)))
    if err:
        raise GraphsimError(field, err)
    schedule = evaluate_reference(compiled.program, Workload(sp.kinds, **{f: wl[f] for f in FIELDS}), ut[None],
                                  overhead, compiled.view)
    return compiled, schedule
