"""Sweep speed, measured in one run (ratios, no assertions: the machine is shared).

1. A 1,000,000-point DeepSeek-V4.1-Flash decode-step sweep on GB300 (batch x context x HBM bandwidth,
   100 x 100 x 100) through ``graphsim.sweep`` — the whole path: grid chunks, per-point validation, unit-time
   rows, vectorized evaluation, metrics, Parquet output — against a per-point Python loop over the same
   program (a few hundred points timed, extrapolated), both the NumPy full-graph reference and one jitted call
   per point; and the peak memory of the sweep (ru_maxrss growth).
2. DeepSeek-V3 decode on GB200 (TP4/EP4) against aiconfigurator's SOL mode on the same points, when
   aiconfigurator is importable or ``--aic-python`` names an interpreter that has it (it pulls in a large
   dependency tree, so a separate virtualenv is fine). Skipped with a note otherwise.

    python benchmarks/bench_sweep.py [--points-per-axis 100] [--loop-points 300] [--aic-python PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

import graphsim as gs
from graphsim.lowering.evaluate import evaluate_reference, unit_time
from graphsim.sweep import SweepSpec, run, structural_tables


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def pick_model() -> str:
    try:
        gs.load_model("deepseek-v4.1-flash").build(("decode",))
        return "deepseek-v4.1-flash"
    except Exception as e:  # noqa: BLE001 - the V4.1 graph may be absent in an older checkout
        print(f"note: deepseek-v4.1-flash is not buildable here ({type(e).__name__}: {e}); using deepseek-v3")
        return "deepseek-v3"


def spec_for(model: str, hw: str, mapping: dict, n: int, hbm: tuple) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "bench", "outputs": ["stages"],
        "structure": {"model": model, "hw": hw, "mapping": mapping, "requests": "decode"},
        "axes": {"decode.count": {"start": 1, "stop": 1024, "num": n, "scale": "log"},
                 "decode.context": {"start": 1024, "stop": 1048576, "num": n, "scale": "log"},
                 "hw.hbm_bw": {"start": hbm[0], "stop": hbm[1], "num": max(n if hbm[0] != hbm[1] else 1, 1)}},
    })


def loop_rates(model: str, hw_name: str, mapping: dict, df_points, n: int) -> tuple[float, float, np.ndarray]:
    """Points/s of per-point loops over the same program: NumPy reference and one jitted call per point."""
    c = gs.compile_plan(model, gs.Plan(["decode:4096x64"], gs.ParallelMapping(**mapping)), hw_name)
    hw = c.hw
    rows = df_points.head(n)
    wls = [gs.Workload(("decode",), [[r["decode.count"]]], [[1.0]], [[r["decode.context"]]]) for _, r in rows.iterrows()]
    uts = [unit_time(hw.with_overrides(hbm_bw=float(r["hw.hbm_bw"])).rates()) for _, r in rows.iterrows()]
    c.evaluate(wls[0], uts[0])  # compile the one-point kernel outside the timing
    t0 = time.perf_counter()
    ref = [evaluate_reference(c.program, w, u).forward[0] for w, u in zip(wls, uts)]
    t1 = time.perf_counter()
    jit = [c.evaluate(w, u)["forward"][0] for w, u in zip(wls, uts)]
    t2 = time.perf_counter()
    assert np.allclose(ref, jit, rtol=1e-9)
    return n / (t1 - t0), n / (t2 - t1), np.asarray(ref)


AIC_SCRIPT = r"""
import json, logging, sys, time
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
pts = json.load(sys.stdin)
out, t0 = [], time.perf_counter()
for bs, ctx in pts:
    r = cli_estimate("deepseek-ai/DeepSeek-V3", "gb200", mode="static_gen", database_mode="SOL", isl=int(ctx), osl=2,
                     batch_size=int(bs), tp_size=4, moe_ep_size=4, moe_tp_size=1)
    out.append(r.tpot / 1e3)
print(json.dumps({"seconds": time.perf_counter() - t0, "itl_s": out}))
"""


AIC_ENGINE_SCRIPT = r"""
import json, logging, sys, time
logging.disable(logging.WARNING)
import aiconfigurator_core.sdk.rust_engine_step as R
from aiconfigurator.cli.api import cli_estimate
got = {}
build = R._cached_engine_handle
def keep(model, database):  # the compiled (Rust) engine cli_estimate builds for this model and system
    got["engine"] = h = build(model, database)
    return h
R._cached_engine_handle = keep
pts = json.load(sys.stdin)
cli_estimate("deepseek-ai/DeepSeek-V3", "gb200", mode="static_gen", database_mode="SOL", isl=4096, osl=2,
             batch_size=64, tp_size=4, moe_ep_size=4, moe_tp_size=1)
engine = got["engine"]
t0 = time.perf_counter()
out = [engine.decode_step_latency(int(bs), int(ctx), 2) / 1e3 for bs, ctx in pts]
print(json.dumps({"seconds": time.perf_counter() - t0, "itl_s": out}))
"""


def aiconfigurator(points: list, python: str | None, script: str = AIC_SCRIPT) -> dict | None:
    """Run aiconfigurator's SOL estimate per point in-process or in ``python``; None when unavailable."""
    cmd = None
    try:
        import aiconfigurator  # noqa: F401

        cmd = [sys.executable]
    except ImportError:
        if python and os.path.exists(python):
            cmd = [python]
    if cmd is None:
        return None
    r = subprocess.run([*cmd, "-c", script], input=json.dumps(points), capture_output=True, text=True, timeout=1800)
    if r.returncode:
        print(f"note: aiconfigurator failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points-per-axis", type=int, default=100, help="grid is N^3 points (100 -> 1,000,000)")
    ap.add_argument("--loop-points", type=int, default=300)
    ap.add_argument("--aic-points", type=int, default=24, help="points timed with aiconfigurator")
    ap.add_argument("--aic-python", default=os.environ.get("GRAPHSIM_AIC_PYTHON"),
                    help="python of a virtualenv with aiconfigurator (if not importable here)")
    a = ap.parse_args()
    n = a.points_per_axis
    model = pick_model()
    mapping = {"dp": 8, "ep": 8}
    spec = spec_for(model, "gb300", mapping, n, (4e12, 16e12))
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up, timed apart: build + lower the program and JIT its kernel at the chunk shape (one chunk).
        t0 = time.perf_counter()
        next(structural_tables(spec, spec.structural_points()[0]))
        t_warm = time.perf_counter() - t0
        base = maxrss_mib()
        t0, c0 = time.perf_counter(), time.process_time()
        res = run(spec, os.path.join(tmp, "sweep.parquet"))
        t_sweep, cpu_sweep = time.perf_counter() - t0, time.process_time() - c0
        peak = maxrss_mib()
        size_mib = os.path.getsize(res.path) / 2**20
        import pyarrow.parquet as pq

        sample = pq.read_table(res.path, columns=["decode.count", "decode.context", "hw.hbm_bw", "forward_s"]) \
            .slice(0, 997 * max(a.loop_points, 1)).to_pandas().iloc[::997]
    P = res.rows
    sweep_rate = P / t_sweep
    ref_rate, jit_rate, ref = loop_rates(model, "gb300", mapping, sample, a.loop_points)
    assert np.allclose(ref, sample["forward_s"].head(len(ref)), rtol=1e-9), "sweep and loop disagree"
    print(f"{model} decode step on GB300 dp8/ep8: {P:,}-point sweep (batch x context x HBM bandwidth, {n}^3)")
    print(f"  warm-up (build + lower + JIT at the chunk shape, {spec.chunk:,} points per call): {t_warm:.2f} s")
    print(f"  sweep, all in (grid, validation, evaluation, metrics, Parquet {size_mib:.0f} MiB): {t_sweep:.2f} s "
          f"= {sweep_rate:,.0f} points/s ({res.point_errors} point errors; CPU time {cpu_sweep:.1f} s on "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")
    print(f"  per-point loop, NumPy full graph:   {ref_rate:,.0f} points/s -> the sweep is {sweep_rate / ref_rate:,.0f}x faster "
          f"(1M points would take {1e6 / ref_rate / 60:,.1f} min)")
    print(f"  per-point loop, one kernel call each:  {jit_rate:,.0f} points/s -> the sweep is {sweep_rate / jit_rate:,.0f}x faster")
    print(f"  peak memory: ru_maxrss {peak:,.0f} MiB, grew {peak - base:,.0f} MiB during the sweep")

    # ---- aiconfigurator, DeepSeek-V3 on GB200 TP4/EP4, datasheet HBM bandwidth
    v3 = {"tp": 4, "ep": 4}
    k = 100 if n >= 100 else n
    v3_spec = spec_for("deepseek-v3", "gb200", v3, k, (8e12, 8e12))
    t0 = time.perf_counter()
    v3_res = run(v3_spec)
    t_v3 = time.perf_counter() - t0
    df = v3_res.to_pandas()
    rng = np.random.default_rng(0)
    pick = df.iloc[np.sort(rng.choice(len(df), size=min(a.aic_points, len(df)), replace=False))]
    points = [(int(r["decode.count"]), int(r["decode.context"])) for _, r in pick.iterrows()]
    aic = aiconfigurator(points, a.aic_python)
    print(f"deepseek-v3 decode on GB200 tp4/ep4: graphsim sweep of {len(df):,} points (batch x context) incl. "
          f"compile: {t_v3:.2f} s = {len(df) / t_v3:,.0f} points/s")
    if aic is None:
        print("  aiconfigurator: not available (pip install aiconfigurator, or --aic-python PATH); skipped")
        return
    aic_rate = len(points) / aic["seconds"]
    ratio = pick["forward_s"].to_numpy() / np.asarray(aic["itl_s"])
    print(f"  aiconfigurator SOL (cli_estimate static_gen, per point): {aic_rate:,.2f} points/s on {len(points)} points "
          f"-> graphsim is {len(df) / t_v3 / aic_rate:,.0f}x faster per point")
    print(f"  step time graphsim / aiconfigurator on those points: median {np.median(ratio):.3f} "
          f"(min {ratio.min():.3f}, max {ratio.max():.3f})")
    # aiconfigurator's compiled engine (aiconfigurator_core, Rust), one call per point, on 1M random points
    g = np.random.default_rng(1)
    grid = list(zip(g.integers(1, 1024, 1_000_000).tolist(), g.integers(1024, 131072, 1_000_000).tolist()))
    eng = aiconfigurator(grid, a.aic_python, AIC_ENGINE_SCRIPT)
    if eng is None:
        print("  aiconfigurator's compiled engine: not available in that interpreter; skipped")
        return
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(**v3)), "gb200")
    wl = gs.Workload(("decode",), np.array(grid, float)[:, :1], np.ones((len(grid), 1)), np.array(grid, float)[:, 1:])
    c.evaluate(wl)  # compile at this shape
    t0 = time.perf_counter()
    c.evaluate(wl)
    t_kernel = time.perf_counter() - t0
    eng_rate = len(grid) / eng["seconds"]
    print(f"  aiconfigurator compiled engine (decode_step_latency per point): {eng_rate:,.0f} points/s on "
          f"{len(grid):,} points; graphsim's kernel on the same grid: {len(grid) / t_kernel:,.0f} points/s "
          f"({len(grid) / t_kernel / eng_rate:,.1f}x)")


if __name__ == "__main__":
    main()
