"""Sweeps: a spec of axes -> one table row per what-if point.

*Structural* axes (model, hw, profile, mapping, policies, request structure) each need their own program:
one ``compile_plan`` per structural point. *Continuous* axes (lengths, batch counts, cached prefix, hardware
figures, efficiency fractions) are workload arrays and per-point unit-time rows, evaluated by one vectorized
``Compiled.evaluate`` per chunk of points — the grid is built chunk by chunk too, so memory stays bounded.

A spec (TOML, YAML or a dict)::

    name = "v3-decode"
    zip = [["decode.count", "decode.context"]]    # optional: axes that vary together
    outputs = ["stages", "kinds"]                  # optional extras: kinds, traffic
    [structure]
    model = "deepseek-v3"
    hw = ["gb200", "gb300"]
    profile = ["sol", "practitioner"]
    mapping = [{tp = 4, ep = 4}, "tp1-dp8-ep8"]
    requests = ["decode", "prefill+decode"]       # request structures (group kinds)
    [structure.policies]
    fusion = ["unfused", "two-pass"]
    [axes]
    "decode.count" = [8, 64, 256]                  # list, scalar, or a range table:
    "decode.context" = {start = 1024, stop = 131072, num = 8, scale = "log"}
    "prefill.prompt" = 8192
    "hw.hbm_bw" = [8e12, 12e12]                    # any rate field of HardwareSpec (peak_flops.fp8 too)
    "profile.hbm" = [0.8, 1.0]                     # EfficiencyProfile fields

Group axes are ``<kind>.<field>`` (every group of that kind) or ``g<i>.<field>`` (group i, which wins).
Prefill fields: count, prompt, cached, image, patches, swa_cached, tier (where the cached prefix is read from:
0 = HBM, 1 = host, 2 = disk); decode: count, context, new.

A bad point never stops a sweep: a structural error (TP not dividing heads, an unknown model) gives one row
with ``error``; a bad continuous value (negative length, HBM bandwidth <= 0) gives an error row for that
point only, naming the axis. Rows carry the full identity (model, hw, mapping, every policy, profile,
request structure, graphsim version) and ``struct_id``, the key for resuming.
"""
from __future__ import annotations

from .executors import run
from .points import (_PROGRAMS, _check_groups, _group_values, _Programs, _workload_arrays, grid_values,
                     representative_requests, structural_tables)
from .results import SweepResult, read_results, unify
from .spec import (EXTRA_OUTPUTS, GROUP_FIELDS, HW_AXES, IDENTITY_HEAD, MEMORY_COLUMNS, PROFILE_AXES, SPEC_KEYS,
                   STRUCT_KEYS, TOKEN_COLUMNS, Axis, Grid, StructuralPoint, SweepSpec, identity_columns)

__all__ = ["Axis", "SweepSpec", "Grid", "StructuralPoint", "SweepResult", "run", "structural_tables",
           "read_results", "unify"]
