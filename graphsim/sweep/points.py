"""Evaluating one structural point: program cache, rates, per-point checks, workload arrays, tables."""
from __future__ import annotations

import math
from typing import Callable, Iterator, Mapping

import attrs
import numpy as np

from ..core.errors import GraphsimError
from ..core.ir import COMPONENTS
from .results import _const, _table
from .spec import (GROUP_FIELDS, MEMORY_COLUMNS, TOKEN_COLUMNS, Grid, StructuralPoint, SweepSpec,
                   _policy_fields)

class _Programs:
    """Compiled programs and models kept between structural points (a program does not depend on the
    profile, so points that differ only in profile share one)."""

    def __init__(self, keep: int = 8):
        self.keep = keep  # a decode program is a few MiB; executors run points sharing a program consecutively
        self.compiled: dict = {}
        self.failed: dict = {}  # key -> the GraphsimError its compilation raised (not compiled again)
        self.weights: dict = {}  # key -> resident weight bytes per device (profile-independent, slow to derive)
        self.models: dict = {}
        self.kv: dict = {}

    def get(self, sp: StructuralPoint, requests: tuple):
        # the input digests are part of the key: a file edited between two runs in one process is re-read
        key = (sp.model, sp.hw, sp.mapping, sp.policies, requests, sp.view, sp.inputs)
        if key in self.failed:
            raise self.failed[key].with_traceback(None)
        try:
            return self._get(key, sp, requests)
        except GraphsimError as e:
            while len(self.failed) >= 256:
                self.failed.pop(next(iter(self.failed)))
            self.failed[key] = e
            raise

    def weight_bytes(self, compiled) -> float:
        """:func:`graphsim.driver.metrics.weight_bytes` of a kept program, memoized with it."""
        from ..driver.metrics import weight_bytes

        for key, c in self.compiled.items():
            if c is compiled:
                if key not in self.weights:
                    self.weights[key] = weight_bytes(compiled)
                return self.weights[key]
        return weight_bytes(compiled)

    def _get(self, key: tuple, sp: StructuralPoint, requests: tuple):
        from .. import ParallelMapping, Plan, Policies, compile_plan
        from ..driver.metrics import KVTable

        if key not in self.compiled:
            mkey = (sp.model, dict(sp.inputs).get("model"))
            if mkey not in self.models:
                self.models[mkey] = sp.model.load()
            mapping = ParallelMapping(**dict(sp.mapping))
            try:
                policies = Policies(**dict(sp.policies))
            except GraphsimError:
                raise
            except (TypeError, ValueError) as e:  # attrs validators name the attribute, not the section
                name = getattr(e.args[1], "name", "?") if len(e.args) > 1 else "?"
                raise GraphsimError(f"policies.{name}", str(e.args[0])) from None
            view = None
            if sp.view[0] != "sol":
                from ..views.measured.view import ViewSpec

                view = ViewSpec(*sp.view)
            c = compile_plan(self.models[mkey], Plan(requests, mapping, policies), sp.hw, view=view)
            while len(self.compiled) >= self.keep:
                self.weights.pop(next(iter(self.compiled)), None)
                self.compiled.pop(next(iter(self.compiled)))
            self.compiled[key] = c
        plan = self.compiled[key].plan
        mkey = (sp.model, dict(sp.inputs).get("model"))
        kv_key = (mkey, plan.policies.dspark, plan.mapping)  # DSpark's draft blocks hold SWA caches too
        if kv_key not in self.kv:
            self.kv[kv_key] = KVTable(self.models[mkey], plan.policies, plan.mapping)
        return self.compiled[key], self.kv[kv_key]


_PROGRAMS = _Programs()


def representative_requests(spec: SweepSpec, kinds: tuple) -> tuple:
    """The requests a structural point's program is built for: one per group, from the first valid value of
    each axis (the largest count). The program's *costs* are exact for every grid point — lengths, counts
    and hardware figures are workload arrays — but a rule a model or pass applies to the plan's request
    values at build time (e.g. pipeline micro-batches <= requests) sees these values only."""
    from ..core.plan import Request

    by_name = {a.name: a for a in spec.axes}

    def whole(lo):
        return lambda v: math.isfinite(v) and v >= lo and v == int(v)

    out = []
    for i, k in enumerate(kinds):
        def pick(f, ok, largest=False):
            a = by_name.get(f"g{i}.{f}") or by_name.get(f"{k}.{f}")
            good = [v for v in (a.values if a else (GROUP_FIELDS[k][f],)) if v is not None and ok(v)]
            return int(max(good) if largest else good[0]) if good else None

        count = pick("count", whole(1), largest=True) or 1
        if k == "prefill":
            prompt = pick("prompt", whole(1)) or 1
            cached = pick("cached", lambda v: whole(0)(v) and v < prompt) or 0
            # images are structural (they add the vision stage): build it when any point carries patches
            patches = pick("patches", lambda v: whole(1)(v), largest=True) or 0
            image = min(pick("image", whole(1)) or 1, prompt - cached) if patches else 0
            out.append(Request("prefill", prompt, count, cached, image_tokens=image, image_patches=patches))
        else:
            out.append(Request("decode", pick("context", whole(1)) or 1, count, new=pick("new", whole(1)) or 1))
    return tuple(out)


def _error_of(e: GraphsimError) -> tuple[str, str]:
    return str(e), e.field


class _Rates:
    """Unit-time rows per distinct (hw figures, profile fractions) combination, validated once each."""

    def __init__(self, hw, profile, hw_axes: list, prof_axes: list):
        from ..hw.descriptor import SOL

        self.hw, self.profile = hw, profile if profile is not None else SOL
        self.hw_axes, self.prof_axes = hw_axes, prof_axes
        self.memo: dict = {}

    def row(self, values: tuple):
        got = self.memo.get(values)
        if got is None:
            got = self.memo[values] = self._build(values)
        return got

    def _build(self, values: tuple):
        from ..lowering.evaluate import unit_time

        hv, pv = values[: len(self.hw_axes)], values[len(self.hw_axes):]
        try:
            over: dict = {}
            for name, v in zip(self.hw_axes, hv):
                f = name[3:]
                if f.startswith("peak_flops."):
                    over.setdefault("peak_flops", {})[f[len("peak_flops."):]] = v
                else:
                    over[f] = v
            hw = self.hw.with_overrides(**over) if over else self.hw
        except GraphsimError as e:
            return None, 0.0, 0.0, f"hw.{e}", f"hw.{e.field}"
        try:
            over = {}
            for name, v in zip(self.prof_axes, pv):
                f = name[len("profile."):]
                if f.startswith("compute_overrides."):
                    over.setdefault("compute_overrides", dict(self.profile.compute_overrides))[f[18:]] = v
                else:
                    over[f] = v
            prof = attrs.evolve(self.profile, **over) if over else self.profile
        except GraphsimError as e:
            return None, 0.0, 0.0, f"profile.{e}", f"profile.{e.field}"
        return unit_time(hw.rates(prof)), prof.op_overhead_s, hw.hbm_capacity_bytes, None, ""


def _group_values(kinds: tuple, cols: dict, n: int) -> list[dict]:
    """Per group, field -> (values (n,), source axis name or '' for a default)."""
    out = []
    for i, k in enumerate(kinds):
        g = {}
        for f, default in GROUP_FIELDS[k].items():
            for name in (f"g{i}.{f}", f"{k}.{f}"):
                if name in cols:
                    g[f] = (cols[name], name)
                    break
            else:
                g[f] = (np.full(n, default), "")
        out.append(g)
    return out


def _check_groups(groups: list[dict], n: int, speculative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-point validation (first failure wins): error message and field arrays ('' where valid).
    Without speculative decoding a decode step emits one position (``new`` = 1)."""
    msg = np.full(n, "", dtype=object)
    fld = np.full(n, "", dtype=object)

    def flag(bad, name, text):
        bad = bad & (msg == "")
        for i in np.flatnonzero(bad):
            v = values_of[name][i] if name in values_of else np.nan
            msg[i] = f"{name}: {text}, got {v:g}"
            fld[i] = name

    values_of = {}
    for g in groups:
        for f, (v, name) in g.items():
            if name:
                values_of[name] = v
    for g in groups:
        for f, (v, name) in g.items():
            finite = np.isfinite(v)
            if f == "count":
                flag(~finite | (v < 1) | (v != np.floor(v)), name, "must be an integer >= 1")
            elif f == "swa_cached":
                flag(~np.isin(v, (0.0, 1.0)), name, "must be true/false (1/0)")
            elif f == "tier":
                flag(~np.isin(v, (0.0, 1.0, 2.0)), name, "must be 0 (hbm), 1 (host) or 2 (disk)")
            else:
                lo = 1.0 if f in ("prompt", "context", "new") else 0.0
                flag(~finite | (v < lo) | (v != np.floor(v)), name, f"must be an integer >= {lo:g}")
        if "context" in g and not speculative:
            flag(g["new"][0] > 1, g["new"][1] or "decode.new", "verifying drafts needs policies.dspark='on'")
        if "prompt" in g:
            p, c, im = g["prompt"][0], g["cached"][0], g["image"][0]
            flag(c >= p, g["cached"][1] or "prefill.cached", "cached prefix must be shorter than the prompt")
            flag(im > p - c, g["image"][1] or "prefill.image", "image tokens must fit in the uncached prompt")
    return msg, fld


def _workload_arrays(kinds: tuple, groups: list[dict], policies: Mapping) -> dict[str, np.ndarray]:
    """(n, G) workload fields, with ``Plan.workload`` semantics (both use plan.prefill_positions)."""
    from ..core.plan import prefill_positions
    from ..core.workload import FIELDS, HOST

    cols: dict[str, list] = {f: [] for f in FIELDS}
    for k, g in zip(kinds, groups):
        v = {f: g[f][0] for f in g}
        zero = np.zeros_like(v["count"])
        if k == "prefill":
            new, past, replay = prefill_positions(
                v["prompt"], v["cached"], v["swa_cached"] != 0, replay_window=int(policies.get("replay_window", 128)),
                encoder_replay=policies.get("encoder_replay", "on") == "on")
            parts = {"count": v["count"], "new": new, "past": past, "image": v["image"], "patches": v["patches"],
                     "replay": replay, "tier": v["tier"]}
        else:
            parts = {"count": v["count"], "new": v["new"], "past": v["context"], "image": zero, "patches": zero,
                     "replay": zero, "tier": zero + HOST}
        for f in FIELDS:
            cols[f].append(parts[f])
    return {f: np.stack(c, axis=1) for f, c in cols.items()}


def structural_tables(spec: SweepSpec, sp: StructuralPoint, programs: _Programs | None = None,
                      progress: Callable[[int], None] | None = None) -> Iterator:
    """pyarrow Tables (one per chunk) of every point of one structural point, in point order."""
    from ..hw import load_profile

    programs = programs or _PROGRAMS
    struct_id = sp.key(spec)
    ident = {"struct_id": struct_id, "sweep": spec.name, **sp.identity()}
    pol = {**_policy_fields(), **dict(sp.policies)}
    grid = spec.grid(sp.kinds)
    try:
        if sp.view[0] != "sol" and sp.profile != "SOL":
            raise GraphsimError("structure.profile", f"an efficiency profile derates the SOL view; the {sp.view[0]} "
                                "view takes its times from measured tables (evaluate it with profile = \"sol\")")
        compiled, kv = programs.get(sp, representative_requests(spec, sp.kinds))
        profile = None if sp.profile == "SOL" else load_profile(sp.profile)
    except GraphsimError as e:  # bad input for this program: its error row; anything else is a bug and raises
        if progress:
            progress(grid.size)
        yield error_table(spec, sp, *_error_of(e))
        return
    yield from _point_tables(spec, sp, compiled, kv, profile, ident, pol, grid, progress, programs.weight_bytes(compiled))


def _point_tables(spec, sp, compiled, kv, profile, ident, pol, grid, progress, weights):
    import pyarrow as pa

    from ..lowering.evaluate import op_kinds
    from ..driver.metrics import kv_bytes_per_device, memory_metrics, token_metrics
    from ..core.workload import FIELDS, Workload

    mapping, kinds = compiled.plan.mapping, sp.kinds
    hw_axes = [a for a in grid.names if a.startswith("hw.")]
    prof_axes = [a for a in grid.names if a.startswith("profile.")]
    rates = _Rates(compiled.hw, profile, hw_axes, prof_axes)
    split = 1  # the KV table already gives one request's bytes on one device
    want = ("forward", "stages", "workspace") + (("kinds",) if "kinds" in spec.outputs else ()) \
        + (("components",) if "traffic" in spec.outputs else ())
    stage_names, kind_names = compiled.program.stages, op_kinds(compiled.program)
    combo_names = hw_axes + prof_axes
    axis_values = {a: grid_values(grid, a) for a in combo_names}
    size = min(spec.chunk, grid.size)  # every kernel call gets exactly `size` points: one compilation
    axis_order = [a.name for a in spec.axes if a.name in grid.names]  # the output's order: a part can be it
    ident_cols = {k: _const(v, size) for k, v in ident.items()}  # built once, sliced per chunk
    for lo in range(0, grid.size, size):
        hi = min(lo + size, grid.size)
        n = hi - lo
        taken = grid.take(lo, hi)
        cols_in = {k: v for k, (_, v) in taken.items()}
        groups = _group_values(kinds, cols_in, n)
        msg, fld = _check_groups(groups, n, compiled.plan.policies.dspark == "on")
        # unit times per distinct hw/profile combination
        if combo_names:
            shape = tuple(len(axis_values[a]) for a in combo_names)
            code = np.ravel_multi_index(tuple(taken[a][0] for a in combo_names), shape)
            uniq, inv = np.unique(code, return_inverse=True)
            rows = [rates.row(tuple(float(axis_values[a][j]) for a, j in zip(combo_names, np.unravel_index(u, shape))))
                    for u in uniq]
        else:
            inv = np.zeros(n, dtype=np.int64)
            rows = [rates.row(())]
        for j, (ut_row, _, _, err, efield) in enumerate(rows):
            if err:
                bad = (inv == j) & (msg == "")
                msg[bad], fld[bad] = err, efield
        ok = msg == ""
        idx = np.flatnonzero(ok)
        good_rows = [r if r[0] is not None else (np.zeros(len(COMPONENTS)), 0.0, 0.0, None, "") for r in rows]
        ut = np.stack([r[0] for r in good_rows])[inv]
        overhead = np.array([r[1] for r in good_rows])[inv]
        capacity = np.array([r[2] for r in good_rows])[inv]
        wl = _workload_arrays(kinds, groups, pol)
        res = {}
        if idx.size:
            sel = np.concatenate([idx, np.repeat(idx[-1:], size - idx.size)])  # pad: one compiled shape
            workload = Workload(kinds, **{f: wl[f][sel] for f in FIELDS})
            out = compiled.evaluate(workload, ut[sel], overhead[sel], want, spec.precision)
            res = {k: np.asarray(v)[: idx.size] for k, v in out.items()}
            if "sol_forward" in res:  # FPM: a request mix the partition never sampled has no curve
                bad = ~np.isfinite(res["forward"])
                msg[idx[bad]] = "fpm: the FPM partition has no forwards of this request mix"
                fld[idx[bad]] = "fpm"
                ok = msg == ""

        def full(x, width=None):
            a = np.full((n,) if width is None else (n, width), np.nan)
            if idx.size:
                a[idx] = x
            return a

        forward = full(res.get("forward"))
        cols = {k: v.slice(0, n) for k, v in ident_cols.items()}
        cols["point"] = pa.array(np.arange(lo, hi, dtype=np.int64))
        for name in axis_order:
            cols[name] = pa.array(cols_in[name])
        cols["forward_s"] = pa.array(forward)
        if "sol_forward" in res:  # the FPM view: SOL beside it, and whether the point was inside the samples
            cols["sol_forward_s"] = pa.array(full(res["sol_forward"]))
            dom = np.full(n, None, dtype=object)
            if idx.size:
                fin = np.isfinite(res["forward"])
                dom[idx] = np.where(~fin, "no_curve", np.where(res["fpm_in_domain"], "in", "extrapolated"))
            cols["fpm_domain"] = pa.array(dom.tolist(), pa.string())
        if "stages" in spec.outputs:
            st = full(res.get("stages"), len(stage_names))
            for j, s in enumerate(stage_names):
                cols[f"stage_s.{s}"] = pa.array(st[:, j])
        if "kinds" in spec.outputs:
            km = full(res.get("kinds"), len(kind_names))
            for j, k in enumerate(kind_names):
                cols[f"kind_s.{k}"] = pa.array(km[:, j])
        tok = token_metrics(kinds, wl["count"], wl["new"], forward, mapping.gpus, compiled.plan.policies,
                            compiled.hw.power_w)
        for k in TOKEN_COLUMNS:
            cols[k] = pa.array(tok[k], mask=~ok)
        kvb = np.where(ok, kv_bytes_per_device(kv, np.where(ok[:, None], wl["count"], 0.0),
                                               np.where(ok[:, None], wl["new"], 0.0),
                                               np.where(ok[:, None], wl["past"], 0.0), split), np.nan)
        mem = memory_metrics(weights, kvb, full(res.get("workspace")), capacity)
        for k in MEMORY_COLUMNS:
            cols[k] = pa.array(np.asarray(mem[k]), mask=~ok)
        if "traffic" in spec.outputs:
            comp = full(res.get("components"), len(COMPONENTS))
            for j, c in enumerate(COMPONENTS):
                cols[f"traffic.{c}"] = pa.array(comp[:, j])
        cols["error"] = pa.array(np.where(ok, None, msg).tolist(), pa.string())
        cols["error_field"] = pa.array(np.where(ok, None, fld).tolist(), pa.string())
        if progress:
            progress(n)
        yield _table(cols)


def error_table(spec: SweepSpec, sp: StructuralPoint, msg: str, field: str):
    """The one row of a structural point that could not be evaluated (no point index)."""
    import pyarrow as pa

    ident = {"struct_id": sp.key(spec), "sweep": spec.name, **sp.identity()}
    cols = {k: _const(v, 1) for k, v in ident.items()}
    cols.update(point=pa.nulls(1, pa.int64()), error=_const(msg, 1), error_field=_const(field, 1))
    return _table(cols)


def grid_values(grid: Grid, name: str) -> np.ndarray:
    for d in grid.dims:
        for a in d:
            if a.name == name:
                return np.asarray(a.values, dtype=np.float64)
    raise KeyError(name)
