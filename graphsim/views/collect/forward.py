"""``graphsim collect forward``: time whole forwards of compiled plans on this device into FPM samples.

For every request mix of the grid: compile the plan (the same graph the SOL view prices, SOL recorded
beside the measurement), lower it to a JAX program (:mod:`graphsim.views.collect.execute`), compile it (timed
apart), run ``warmup`` untimed forwards, then ``reps`` timed forwards — each from the host call to
``block_until_ready`` on the logits, the KV caches donated and carried from one forward to the next — and
record the median (and min / p90) as one sample. Failures are rows with their category
(:data:`graphsim.views.fpm.schema.STATUSES`), never dropped; the logits are checked for finiteness.
"""
from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import numpy as np

from graphsim.core.errors import GraphsimError, require

_GROUP = re.compile(r"^(?P<kind>prefill|decode):(?P<lens>\d+(?:,\d+)*)(?:x(?P<counts>\d+(?:,\d+)*))?"
                    r"(?:@(?P<cached>\d+(?:,\d+)*))?$")


def parse_grid(spec: str) -> list[list[str]]:
    """Request mixes from a grid SPEC (or a file of them, one per line, ``#`` comments): mixes separated by
    ``;``, groups of a mix by ``+``, each ``KIND:LENS[xCOUNTS][@CACHED]`` with comma lists expanded as a
    cartesian product. A prefix hit (``@CACHED``) is resident on the device (tier hbm). Returns each mix as
    request strings, e.g. ``[["decode:128x1"], ["decode:128x4"], ["prefill:64x2", "decode:256x2"]]``."""
    require(isinstance(spec, str) and spec.strip(), "grid", "give request mixes, e.g. 'decode:128,512x1,4'")
    text = spec
    p = Path(spec)
    if len(spec) < 4096 and "\n" not in spec and p.suffix in (".txt", ".grid") and p.is_file():
        text = ";".join(line.split("#", 1)[0] for line in p.read_text().splitlines())
    mixes = []
    for mix in (m.strip() for m in text.split(";")):
        if not mix:
            continue
        options = []
        for grp in (g.strip() for g in mix.split("+")):
            m = _GROUP.match(grp)
            require(m is not None, "grid", f"{grp!r}: expected KIND:LENS[xCOUNTS][@CACHED] with KIND prefill or "
                    "decode and comma-separated whole numbers, e.g. decode:128,512x1,4")
            lens = [int(x) for x in m.group("lens").split(",")]
            counts = [int(x) for x in (m.group("counts") or "1").split(",")]
            cached = [int(x) for x in (m.group("cached") or "0").split(",")]
            require(m.group("kind") == "prefill" or cached == [0], "grid", f"{grp!r}: a decode request has no "
                    "cached prefix (its LEN is the context)")
            opts = []
            for n, c, h in itertools.product(lens, counts, cached):
                opts.append(f"{m.group('kind')}:{n}x{c}" + (f"@{h}:hbm" if h else ""))
            options.append(opts)
        mixes.extend(list(combo) for combo in itertools.product(*options))
    require(bool(mixes), "grid", "no request mix in the spec")
    return mixes


def _category(exc: BaseException, phase: str) -> str:
    """Failure category of an exception raised while building (init) or running (execution) a forward."""
    from .execute import Unsupported

    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or re.search(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|OOM|Failed to allocate", text):
        return "oom"
    if isinstance(exc, (Unsupported, GraphsimError)):
        return "unsupported"
    return "init_failure" if phase == "init" else "execution_failure"


def collect_forward(model, mixes, hw, output, *, warmup: int = 2, reps: int = 5, seed: int = 0,
                    mapping=(1, 1, 1, 1, 1), weights=None, policies=None, budget_s: float | None = None,
                    log=None):
    """Time every mix of ``mixes`` (lists of request strings) and write the samples to ``output``
    (``.parquet``); returns the samples as a DataFrame. ``budget_s``: mixes not started within it are
    ``missing_sample`` rows. The output is checked before any work, locked while the run lasts and
    replaced atomically."""
    from graphsim.core.outputs import atomic_target, exclusive, output_path

    require(isinstance(warmup, int) and 0 <= warmup <= 1000, "warmup", f"must be a whole number in [0, 1000], got {warmup!r}")
    require(isinstance(reps, int) and 1 <= reps <= 10000, "reps", f"must be a whole number in [1, 10000], got {reps!r}")
    out_path = output_path(output, suffixes=(".parquet",))  # before any work: a device, a folder, a wrong type
    with exclusive(out_path):
        return _collect_forward(model, mixes, hw, out_path, warmup, reps, seed, mapping, weights, policies,
                                budget_s, log, atomic_target)


def _collect_forward(model, mixes, hw, out_path, warmup, reps, seed, mapping, weights, policies, budget_s, log,
                     atomic_target):
    import pandas as pd

    from graphsim import ParallelMapping, Plan, Policies
    from graphsim.views.fpm.schema import check_samples, sample_identity
    from graphsim.hw import load_hw
    from graphsim.models import load_model

    from .env import environment

    spec = load_hw(hw)
    m = load_model(model, weights=weights)
    mapping = ParallelMapping(*mapping)
    policies = policies or Policies()
    # every row of one run has one identity (the model, runtime, device, mapping and policies)
    ident = sample_identity(m, mapping, policies, spec, environment(spec.name), warmup)
    t_start = time.perf_counter()
    rows = []
    params = None
    for n, reqs in enumerate(mixes):
        try:
            plan = Plan(reqs, mapping, policies)
        except GraphsimError as e:
            rows.append(_row(ident, reqs, "unsupported", str(e)))
            continue
        if budget_s is not None and time.perf_counter() - t_start > budget_s:
            rows.append(_row(ident, reqs, "missing_sample", f"collection budget of {budget_s:g} s spent", plan=plan))
            continue
        row = _time_one(m, plan, spec, ident, reqs, warmup, reps, seed, params, log)
        params = row.pop("_params", params)
        rows.append(row)
        if log:
            lat = row.get("latency_s")
            what = f"{lat * 1e3:9.3f} ms (SOL {row['sol_s'] * 1e3:.3f} ms)" if row["status"] == "ok" else \
                f"{row['status']}: {row['error'][:100]}"
            log(f"[{n + 1}/{len(mixes)}] {'+'.join(reqs):<34} {what}")
    df = pd.DataFrame(rows)
    check_samples(df, str(out_path))
    with atomic_target(out_path, suffixes=(".parquet",)) as tmp:
        df.to_parquet(tmp, index=False)
    if log:
        ok = int((df["status"] == "ok").sum())
        log(f"wrote {out_path}: {len(df)} samples ({ok} ok, {len(df) - ok} failed) in {time.perf_counter() - t_start:.1f} s")
    return df


def _coords(plan) -> dict:
    from graphsim.views.fpm.schema import COORDS

    c = dict.fromkeys(COORDS, 0)
    for r in plan.requests:
        c[f"{r.kind}_requests"] += r.count
        c[f"{r.kind}_tokens"] += r.count * r.new_tokens
        c[f"{r.kind}_past"] += r.count * r.past_tokens
    return c


def _row(ident, reqs, status, error="", plan=None, **res) -> dict:
    """One sample: the run's identity, the mix, its coordinates (zeros for a mix no plan could be made of),
    the results (NaN where nothing was timed) and the status."""
    from graphsim.views.fpm.schema import COORDS, RESULTS

    row = dict(ident)
    row["requests"] = "+".join(reqs)
    row.update(_coords(plan) if plan is not None else dict.fromkeys(COORDS, 0))
    row.update({k: res.get(k, np.nan) for k in RESULTS})
    row["status"], row["error"] = status, " ".join(str(error).split())[:500]
    return row


def _time_one(model, plan, spec, ident, reqs, warmup, reps, seed, params, log) -> dict:
    import jax

    from graphsim import compile_plan

    from .execute import init_caches, init_ids, init_params, lower_to_jax

    try:
        c = compile_plan(model, plan, spec)
        sol = float(c.report().forward_s)
        ex = lower_to_jax(c)
    except Exception as e:  # noqa: BLE001 - every failure is a row with its category
        return _row(ident, reqs, _category(e, "init"), f"{type(e).__name__}: {e}", plan=plan)
    try:
        if params is None or not _same_params(params, c):
            params = init_params(c, seed)
        caches, ids = init_caches(ex, seed + 1), init_ids(ex, seed + 2)
        t0 = time.perf_counter()
        logits, caches = ex.fn(params, caches, ids)
        jax.block_until_ready(logits)
        compile_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        return {**_row(ident, reqs, _category(e, "init"), f"{type(e).__name__}: {e}", plan=plan, sol_s=sol), "_params": params}
    try:
        for _ in range(warmup):
            logits, caches = ex.fn(params, caches, ids)
            jax.block_until_ready(logits)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            logits, caches = ex.fn(params, caches, ids)
            jax.block_until_ready(logits)
            times.append(time.perf_counter() - t0)
        finite = bool(np.isfinite(np.asarray(logits, dtype=np.float32)).all())
    except Exception as e:  # noqa: BLE001
        return {**_row(ident, reqs, _category(e, "run"), f"{type(e).__name__}: {e}", plan=plan, sol_s=sol,
                       compile_s=compile_s), "_params": params}
    t = np.asarray(times)
    res = dict(latency_s=float(np.median(t)), latency_min_s=float(t.min()), latency_p90_s=float(np.quantile(t, 0.9)),
               reps=len(times), compile_s=compile_s, sol_s=sol)
    if not finite:
        return {**_row(ident, reqs, "invalid_output", "non-finite logits", plan=plan, **res), "_params": params}
    return {**_row(ident, reqs, "ok", plan=plan, **res), "_params": params}


def _same_params(params: dict, compiled) -> bool:
    """Whether weights made for an earlier plan serve this one (the same weight tensors)."""
    g = compiled.graph
    names = {op.reads[0] for op in g.ops if op.reads and g.tensor_map[op.reads[0]].role == "weight"}
    have = {k.rsplit(".", 1)[0] if k.endswith((".gate_up", ".down", ".gamma")) else k for k in params}
    return names <= have
