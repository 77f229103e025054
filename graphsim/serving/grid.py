"""A grid of serving simulations (issue 27): the cartesian product of deployment and cache axes, each point one
:func:`~graphsim.serving.sim.simulate` call, run on the sweeps' executors (``local``, ``processes``, ``ray``) and
written like a sweep: with an output, each point's row is a part ``<output>.parts/<key>.json`` sealed with the
digests of its inputs (:func:`graphsim.driver.identity.seal`), so a rerun skips finished points and recomputes a point
whose inputs changed; the parts are merged into the output at the end, under an exclusive lock on it.

A point that graphsim refuses (a :class:`~graphsim.core.errors.GraphsimError`: a mapping the model cannot take, a KV
pool that does not fit) is an error row naming the field; the other points complete.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import pickle
import shutil
import uuid
from pathlib import Path
from typing import Callable, Mapping

import attrs
import numpy as np

from ..core.errors import GraphsimError, require
from ..driver.views import view_name
from .kvcache import GiB, design_tiers
from .sim import SLA, Deployment, kv_terms, simulate

#: Deployment fields a grid may vary, with the type of their values
DEPLOYMENT_AXES = {"replicas": int, "mapping": str, "policies": str, "max_running": int, "token_budget": int,
                   "hbm_kv_gib": float, "engine": str}
#: cache axes: the design (its tiers rebuilt from :data:`graphsim.serving.kvcache.DESIGNS`), the router, and one
#: parameter of a tier of the design (``host_fraction``: the host tier's share of the pooled DRAM)
CACHE_AXES = {"cache_design": str, "router": str, "host_fraction": float, "host_ttl_s": float,
              "disk_capacity_gib": float, "disk_ttl_s": float}
AXES = {**DEPLOYMENT_AXES, **CACHE_AXES}
EXECUTORS = ("local", "processes", "ray")

#: the metric columns of a row (flat summary of :class:`~graphsim.serving.sim.SimResult`), in table order;
#: NaN on an error row
METRICS = (
    "gpus", "hbm_pool_gib_per_replica", "requests", "served", "rejected", "preemptions", "preempted_requests",
    "duration_s",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
    "goodput_fraction", "goodput_req_per_s", "goodput_out_tok_per_s_per_gpu",
    "out_tok_per_s_per_gpu", "in_tok_per_s_per_gpu", "req_per_s",
    "hit_ratio", "hit_tokens_hbm", "hit_tokens_host", "hit_tokens_disk",
    "host_gib_hours", "host_peak_gib", "disk_gib_hours", "disk_peak_gib",
    "swa_hits", "replays", "replayed_tokens", "recomputed_hit_tokens",
    "littles_law_rel_error", "surface_steps", "surface_median_rel_error", "surface_p90_abs_rel_error",
    "surface_max_abs_rel_error",
)


# ---- axes ----------------------------------------------------------------------------------------------------------
def _axis_value(axis: str, v):
    """``v`` as the axis's column value (ints, floats with ``inf``, texts); a value of the wrong kind is one line
    naming ``grid.<axis>`` (checked before any point runs)."""
    kind = AXES[axis]
    field = f"grid.{axis}"
    if axis == "mapping" and not isinstance(v, str):
        v = str(v)  # a ParallelMapping
    if axis == "policies" and not isinstance(v, str):
        from ..driver.pipeline import policy_text

        v = policy_text(v)  # a Policies
    try:
        if kind is int:
            f = float(v)
            require(f.is_integer(), field, f"must be a whole number, got {v!r}")
            return int(f)
        if kind is float:
            f = float(v)
            require(not math.isnan(f), field, f"must be a number (inf: unbounded), got {v!r}")
            return f
    except (TypeError, ValueError):
        raise GraphsimError(field, f"{v!r} is not a number") from None
    require(isinstance(v, str) and v.strip() != "", field, f"must be a non-empty text, got {v!r}")
    v = v.strip()
    if axis in ("mapping", "policies"):
        _parse(axis, v)  # a malformed mapping or policies text fails the grid at once
    return v


def _parse(axis: str, text: str):
    """A mapping (``tp4-dp1-ep4-pp1``) or policies (``fusion=single-pass``) text as the value serve-sim takes."""
    from ..driver.pipeline import parse_policy_text
    from ..core.plan import ParallelMapping

    try:
        return (ParallelMapping.parse if axis == "mapping" else parse_policy_text)(text)
    except GraphsimError as e:
        raise GraphsimError(f"grid.{axis}", str(e).partition(": ")[2]) from None


def points(axes: Mapping) -> list[dict]:
    """The cartesian product of ``axes`` ({axis: values}), in order (the last axis varies fastest)."""
    require(isinstance(axes, Mapping) and len(axes) > 0, "grid", "give at least one axis: {axis: [values, ...]}")
    names = list(axes)
    bad = [a for a in names if a not in AXES]
    if bad:
        raise GraphsimError("grid", f"unknown axis {bad[0]!r}; allowed: {', '.join(AXES)}")
    values = []
    for a in names:
        vs = axes[a]
        vs = [vs] if isinstance(vs, (str, int, float)) else list(vs)
        require(len(vs) > 0, f"grid.{a}", "give at least one value")
        vs = [_axis_value(a, v) for v in vs]
        require(len(set(vs)) == len(vs), f"grid.{a}", f"a value is given twice in {vs}")
        values.append(vs)
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


# ---- one point -----------------------------------------------------------------------------------------------------
def _has_swa(model, policies) -> bool:
    """Whether the model keeps a sliding-window state (the kind a design's tiers may keep apart): as simulate()."""
    _, s = kv_terms(model, policies)
    br = model.kv_breakdown(1024) if s > 0 and hasattr(model, "kv_breakdown") else None
    return bool(br) and "swa_bytes" in br


def _tier_axes(point: dict, dep: Deployment, kw: dict) -> None:
    """Rebuild the tiers when the point sets a tier parameter: the design's tiers (or ``tiers`` given) with the
    host tier's fraction of the pooled DRAM / TTL and the disk tier's capacity / TTL replaced."""
    tier_axes = {a: point[a] for a in ("host_fraction", "host_ttl_s", "disk_capacity_gib", "disk_ttl_s") if a in point}
    if not tier_axes:
        return
    from ..hw import load_hw
    from ..models import load_model
    from ..driver.pipeline import Policies
    from ..core.plan import ParallelMapping

    hw = load_hw(dep.hw) if isinstance(dep.hw, str) else dep.hw
    mapping = dep.mapping or ParallelMapping()
    host = hw.host_mem_bytes * mapping.gpus * dep.replicas
    tiers = kw.get("tiers")
    if tiers is None:
        model = load_model(dep.model) if isinstance(dep.model, str) else dep.model
        tiers = design_tiers(kw.get("cache_design", "auto"), host, _has_swa(model, dep.policies or Policies()))
    tiers = {t.name: t for t in tiers}
    for axis, v in tier_axes.items():
        name, _, what = axis.partition("_")
        require(name in tiers, f"grid.{axis}", f"the cache has no {name} tier (its tiers: "
                                               f"{', '.join(tiers) or 'none'}); choose a design that has one")
        t = tiers[name]
        if what == "fraction":
            require(0 <= v <= 1, f"grid.{axis}", f"must be in [0, 1], got {v!r}")
            tiers[name] = attrs.evolve(t, capacity_bytes=v * host)
        elif what == "capacity_gib":
            tiers[name] = attrs.evolve(t, capacity_bytes=v * GiB)
        else:
            tiers[name] = attrs.evolve(t, ttl_s=v)
    kw["tiers"] = tuple(tiers.values())


def _metrics(res) -> dict:
    s, chk, err = res.summary, res.checks, res.surface_error
    lat, rq, g, th, c = s["latency"], s["requests"], s["goodput"], s["throughput"], s["cache"]
    tiers = {t["name"]: t for t in c["tiers"]}
    row = {"gpus": s["deployment"]["gpus"], "hbm_pool_gib_per_replica": s["deployment"]["hbm_pool_gib_per_replica"],
           "requests": rq["total"], "served": rq["served"], "rejected": rq["rejected"],
           "preemptions": rq["preemptions"], "preempted_requests": rq["preempted"], "duration_s": s["duration_s"]}
    for key in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p90", "p99"):
            row[f"{key}_{q}_ms"] = lat[f"{key}_ms"][q]
    row.update(goodput_fraction=g["fraction"], goodput_req_per_s=g["requests_per_s"],
               goodput_out_tok_per_s_per_gpu=g["output_tokens_per_s_per_gpu"],
               out_tok_per_s_per_gpu=th["output_tokens_per_s_per_gpu"],
               in_tok_per_s_per_gpu=th["input_tokens_per_s_per_gpu"], req_per_s=th["requests_per_s"],
               hit_ratio=c["hit_ratio"])
    for t in ("hbm", "host", "disk"):
        row[f"hit_tokens_{t}"] = c["hit_tokens"][t]
    for t in ("host", "disk"):
        row[f"{t}_gib_hours"] = tiers[t]["gib_hours"]
        row[f"{t}_peak_gib"] = tiers[t]["peak_gib"]
    row.update(swa_hits=c["swa_hits"], replays=c["replays"], replayed_tokens=c["replayed_tokens"],
               recomputed_hit_tokens=c["recomputed_hit_tokens"],
               littles_law_rel_error=chk["littles_law"]["relative_error"], surface_steps=err["steps"],
               surface_median_rel_error=err["median_rel"], surface_p90_abs_rel_error=err["p90_abs_rel"],
               surface_max_abs_rel_error=err["max_abs_rel"])
    return {k: (math.nan if row[k] is None else row[k]) for k in METRICS}


def simulate_point(trace, base: Deployment, point: dict, simulate_kwargs: dict) -> dict:
    """One grid point's row: its axis values, ``error_field`` / ``error`` (None unless graphsim refused the point)
    and the metrics (:data:`METRICS`, NaN on an error row)."""
    row = {**point, "error_field": None, "error": None}
    try:
        dep_kw = {}
        for a, v in point.items():
            if a in ("mapping", "policies"):
                dep_kw[a] = _parse(a, v)
            elif a in DEPLOYMENT_AXES:
                dep_kw[a] = v
        dep = attrs.evolve(base, **dep_kw)
        kw = dict(simulate_kwargs)
        for a in ("cache_design", "router"):
            if a in point:
                kw[a] = point[a]
        _tier_axes(point, dep, kw)
        res = simulate(trace, dep, **kw)
    except GraphsimError as e:
        row.update(error_field=e.field, error=str(e))
        row.update(dict.fromkeys(METRICS, math.nan))
        return row
    row.update(_metrics(res))
    return row


# ---- identity of a point (what its part was computed from) ---------------------------------------------------------
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def trace_digest(trace) -> str:
    """The requests themselves (arrivals, lengths, block ids, sessions): a trace file's content as read (after
    ``head`` / ``scale_rate``), or a synthetic stream, which its generator's parameters and seed determine."""
    h = hashlib.sha256(str(int(trace.block_tokens)).encode())
    for name in ("arrival_s", "input_len", "output_len", "block_ids", "offsets", "session", "turn"):
        a = np.ascontiguousarray(getattr(trace, name))
        h.update(name.encode() + str(a.dtype).encode() + a.tobytes())
    return h.hexdigest()[:16]


def _object_digest(obj, kind: str) -> str:
    """A model / hardware / profile given by name or path: its file's digest (:mod:`graphsim.driver.identity`); given as
    a loaded object: its pickled state."""
    from ..driver import identity

    if isinstance(obj, (str, Path)) or (kind == "model" and isinstance(obj, dict)):
        return identity.model_digest(obj) if kind == "model" else identity.toml_digest(obj, kind)
    return "object:" + _sha(pickle.dumps(obj, protocol=4))


def _settings(base: Deployment, simulate_kwargs: dict) -> dict:
    """The base deployment's fields and simulate()'s arguments, as text (their model / hardware / profile / view
    files are digested apart)."""
    from ..driver.pipeline import Policies

    dep = {f.name: getattr(base, f.name) for f in attrs.fields(Deployment)
           if f.name not in ("model", "hw", "profile")}
    dep["policies"] = dep["policies"] or Policies()  # every field (policy_text leaves acceptance out)
    return {"deployment": {k: repr(v) for k, v in dep.items()},
            "simulate": {k: repr(v) for k, v in sorted(simulate_kwargs.items())}}


def input_digests(trace, base: Deployment, simulate_kwargs: dict) -> dict:
    """The digests every point shares: model, hardware, profile, measured tables / FPM model, the trace, the
    settings, graphsim's version."""
    from ..core.version import __version__
    from ..driver import identity
    from ..views.measured.schema import measured_digest

    out = {"model": _object_digest(base.model, "model"), "hw": _object_digest(base.hw, "hw")}
    if base.profile is not None:
        out["profile"] = _object_digest(base.profile, "profile")
    view = base.view
    if view_name(view) != "sol":
        src = getattr(view, "measured", None)
        if isinstance(src, (str, Path)) and str(src):
            out["fpm" if view.name == "fpm" else "measured"] = (identity.fpm_digest(src) if view.name == "fpm"
                                                               else measured_digest(src))
    out["trace"] = trace_digest(trace)
    out["settings"] = _sha(json.dumps(_settings(base, simulate_kwargs), sort_keys=True).encode())
    out["graphsim"] = str(__version__)
    return out


def point_key(point: dict) -> str:
    """A part's name: the point's axes and values (its inputs are in the part's sidecar, so a part keeps its name
    when an input changes and the sidecar says what changed)."""
    return hashlib.sha1(json.dumps(list(point.items()), default=repr).encode()).hexdigest()[:16]


# ---- executors -----------------------------------------------------------------------------------------------------
_WORKER: dict = {}  # a worker process's trace, base deployment and simulate() arguments (sent once)


def _init(trace, base, simulate_kwargs) -> None:
    _WORKER.update(trace=trace, base=base, kw=simulate_kwargs)


def _task(point: dict) -> dict:
    return simulate_point(_WORKER["trace"], _WORKER["base"], point, _WORKER["kw"])


def _run_processes(todo: list, jobs: int, trace, base, kw, collect) -> None:
    """Points on ``jobs`` workers, each a one-process pool started with ``spawn`` (JAX is not fork-safe) that dies
    with this process and gets the trace once. A point whose worker dies (killed, out of memory) is one error row
    that is not a part (a rerun retries it) and a fresh worker takes the next point (as the sweeps' executor)."""
    import multiprocessing as mp
    from collections import deque
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    from ..sweep.workers import pool_initializer

    ctx = mp.get_context("spawn")

    def worker():
        return ProcessPoolExecutor(1, mp_context=ctx, initializer=pool_initializer,
                                   initargs=(os.getpid(), _init, trace, base, kw))

    queue = deque(todo)
    pools = [worker() for _ in range(max(1, min(jobs, len(todo))))]
    running: dict = {}  # future -> (worker index, key, point)
    ok = False
    try:
        while queue or running:
            busy = {i for i, _, _ in running.values()}
            for i in range(len(pools)):
                if i not in busy and queue:
                    key, point = queue.popleft()
                    running[pools[i].submit(_task, point)] = (i, key, point)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in done:
                i, key, point = running.pop(f)
                try:
                    collect(key, f.result())
                except BrokenProcessPool:
                    pools[i].shutdown(wait=False)
                    pools[i] = worker()
                    collect(key, {**point, "error_field": "executor", "error": "executor: the worker process running "
                                  "this point died (out of memory?); run the grid again to retry it",
                                  **dict.fromkeys(METRICS, math.nan)}, part=False)
        ok = True
    finally:
        for pool in pools:
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=ok, cancel_futures=True)
            for p in procs if not ok else ():  # interrupted: end our own workers' running points
                if p.is_alive():
                    p.terminate()


def _run_ray(todo: list, address, trace, base, kw, collect) -> None:
    """One Ray task per point (the trace put in the object store once)."""
    from ..sweep.executors import ray_init

    ray = ray_init(address)
    task = ray.remote(simulate_point)
    refs = [ray.put(x) for x in (trace, base, kw)]
    pending = {task.remote(refs[0], refs[1], point, refs[2]): key for key, point in todo}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            collect(pending.pop(ref), ray.get(ref))


# ---- the grid ------------------------------------------------------------------------------------------------------
def _write_part(parts: Path, key: str, row: dict, digests: dict) -> None:
    """``parts/<key>.json`` (written whole, then renamed), sealed with the digests it was computed from."""
    from ..driver.identity import seal

    tmp = parts / f"{key}.json.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(json.dumps(row, default=_jsonable))
        os.replace(tmp, parts / f"{key}.json")
    except OSError as e:
        raise GraphsimError("output", f"cannot write the part {parts.name}/{key}.json: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    seal(parts / f"{key}.json", digests)


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not a table value")


def _frame(rows: list, axes: list):
    import pandas as pd

    return pd.DataFrame(rows, columns=[*axes, "error_field", "error", *METRICS])


def grid(trace, base: Deployment, axes: Mapping, *, output=None, executor: str = "local", jobs: int | None = None,
         address: str | None = None, resume: bool = True, progress: bool | Callable[[int, int], None] | None = None,
         **simulate_kwargs):
    """Simulate ``trace`` on every point of the cartesian product of ``axes`` ({axis: [values]}; axes:
    :data:`AXES` — Deployment fields, ``mapping`` as ``tp4-dp1-ep4-pp1``, ``policies`` as
    ``fusion=single-pass``; ``cache_design``, ``router``; tier parameters ``host_fraction`` (of the pooled DRAM),
    ``host_ttl_s``, ``disk_capacity_gib``, ``disk_ttl_s``) varied from ``base``; ``simulate_kwargs`` go to every
    :func:`~graphsim.serving.sim.simulate` call. Returns one row per point, in product order: the axes' values,
    ``error_field`` / ``error`` (a point graphsim refuses; its metrics NaN) and :data:`METRICS`.

    With ``output`` (``.parquet`` / ``.csv``) each point's row is a part ``<output>.parts/<key>.json`` sealed with
    its inputs' digests (model, hardware, profile, measured tables, the trace's requests, the base deployment and
    simulate()'s arguments, graphsim's version): a rerun reuses the parts whose inputs are unchanged, recomputes
    the others, and writes the merged table (under an exclusive lock on ``output``); ``resume=False`` starts over.
    ``executor``: ``local``, ``processes`` (``jobs`` spawned workers; a script needs the ``__main__`` guard) or
    ``ray`` (a cluster at ``address``, default a local one); every executor gives the same table.
    ``df.attrs["grid"]``: points, computed, reused, stale ((key, why) of parts recomputed)."""
    require(executor in EXECUTORS, "executor", f"must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    require(jobs is None or (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1), "jobs",
            f"must be an integer >= 1, got {jobs!r}")
    require(isinstance(base, Deployment), "base", "give a graphsim.serving.Deployment")
    require(len(trace) > 0, "trace", "holds no requests")
    given = set(axes) if isinstance(axes, Mapping) else set()
    bad = sorted(set(simulate_kwargs) & {"cache_design", "router"} & given)
    require(not bad, "grid", f"{', '.join(bad)} is an axis of this grid; do not also give it as an argument")
    require(not ("tiers" in simulate_kwargs and simulate_kwargs["tiers"] is not None and "cache_design" in given),
            "grid.cache_design", "tiers= replaces the design's tiers; vary cache_design without tiers=")
    pts = points(axes)
    kw = {"sla": SLA(), **simulate_kwargs}
    if output is None:
        return _grid(pts, trace, base, kw, None, executor, jobs, address, resume, progress)
    from ..core.outputs import exclusive, output_path

    out = output_path(output, suffixes=(".parquet", ".csv"))
    with exclusive(out):  # a second grid on the same output fails at once instead of losing results
        return _grid(pts, trace, base, kw, out, executor, jobs, address, resume, progress)


def _grid(pts: list, trace, base, kw: dict, out: Path | None, executor, jobs, address, resume, progress):
    from ..sweep.executors import _progress_bar, _trusted

    digests = input_digests(trace, base, kw)
    keys = [point_key(p) for p in pts]
    rows: dict = {}
    stale: list = []
    parts = None
    if out is not None:
        parts = out.with_name(out.name + ".parts")
        if not resume:
            shutil.rmtree(parts, ignore_errors=True)
            out.unlink(missing_ok=True)
        done, stale = _trusted(parts, {k: digests for k in keys}, suffix=".json")
        parts.mkdir(parents=True, exist_ok=True)
        for k in done:
            rows[k] = json.loads((parts / f"{k}.json").read_text())
    todo = [(k, p) for k, p in dict(zip(keys, pts)).items() if k not in rows]
    reused = len(pts) - len(todo)
    bar = _progress_bar(progress, len(todo), label="serve grid")

    def collect(key: str, row: dict, part: bool = True) -> None:
        rows[key] = row
        if parts is not None and part:
            _write_part(parts, key, row, digests)
        if bar:
            bar(1)

    try:
        if executor == "processes" and todo:
            _run_processes(todo, jobs or os.cpu_count() or 1, trace, base, kw, collect)
        elif executor == "ray" and todo:
            _run_ray(todo, address, trace, base, kw, collect)
        else:
            for k, p in todo:
                collect(k, simulate_point(trace, base, p, kw))
    finally:
        if hasattr(bar, "close"):
            bar.close()
    df = _frame([rows[k] for k in keys], list(pts[0]))
    if out is not None:
        from ..core.outputs import atomic_target

        with atomic_target(out, suffixes=(".parquet", ".csv")) as tmp:
            (df.to_parquet if out.suffix.lower() == ".parquet" else df.to_csv)(tmp, index=False)
    df.attrs["grid"] = {"points": len(pts), "computed": len(todo), "reused": reused, "stale": stale}
    return df


__all__ = ["AXES", "CACHE_AXES", "DEPLOYMENT_AXES", "EXECUTORS", "METRICS", "grid", "input_digests", "point_key",
           "points", "simulate_point", "trace_digest"]
