"""Peak memory of a sweep written to Parquet: it must not grow with the number of points.

Runs the same DeepSeek-V3 decode sweep on GB200 TP4/EP4 (decode.count x decode.context x hw.hbm_bw) at
1M and 10M points, each in a fresh subprocess, and prints that process's peak RSS (ru_maxrss), its RSS after
imports and the warm-up chunk, and points/s. The ratio of the two peaks shows RSS independence (target:
10M-point peak < 1 GiB). No assertions: the machine is shared.

With ``--hw gb200 gb300 ...`` the points are split over one structural point per hardware (several programs),
which is what ``--executor processes`` runs in parallel (one structural point runs on one worker).

    python benchmarks/bench_sweep_memory.py [--sizes 1000000 10000000] [--hw gb200 ...]
                                            [--executor local|processes] [--jobs N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, resource, sys, time
args = json.loads(sys.argv[1])
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
from graphsim.sweep import SweepSpec, run, structural_tables
n = args["points"] // len(args["hw"])
a = round(n ** (1 / 3))
axes = (a, a, n // (a * a))
spec = SweepSpec.from_dict({
    "name": "mem", "outputs": ["stages"], "chunk": args["chunk"],
    "structure": {"model": "deepseek-v3", "hw": args["hw"], "mapping": {"tp": 4, "ep": 4}, "requests": "decode"},
    "axes": {"decode.count": {"start": 1, "stop": 1024, "num": axes[0], "scale": "log"},
             "decode.context": {"start": 1024, "stop": 1048576, "num": axes[1], "scale": "log"},
             "hw.hbm_bw": {"start": 4e12, "stop": 16e12, "num": axes[2]}}})
t0 = time.perf_counter()
if args["executor"] == "local":  # build + lower + JIT at the chunk shape (workers do their own)
    next(structural_tables(spec, spec.structural_points()[0]))
warm_s, warm_rss = time.perf_counter() - t0, rss()
t0 = time.perf_counter()
r = run(spec, args["output"], executor=args["executor"], jobs=args["jobs"]) if args["executor"] != "local" \
    else run(spec, args["output"])
sweep_s = time.perf_counter() - t0
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
print(json.dumps({"rows": r.rows, "axes": axes, "warm_s": warm_s, "warm_rss": warm_rss, "sweep_s": sweep_s,
                  "peak_rss": rss(), "children_peak_rss": children, "bytes": os.path.getsize(r.path)}))
"""


def measure(points: int, chunk: int, executor: str, jobs: int | None, hw: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = {"points": points, "chunk": chunk, "executor": executor, "jobs": jobs, "hw": hw,
                "output": os.path.join(tmp, "sweep.parquet")}
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(f"sweep of {points:,} points failed:\n{r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--chunk", type=int, default=16384)
    ap.add_argument("--executor", default="local", choices=("local", "processes"))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--hw", nargs="+", default=["gb200"], help="one structural point per hardware")
    a = ap.parse_args()
    print(f"deepseek-v3 decode on {'/'.join(a.hw)} tp4/ep4, decode.count x decode.context x hw.hbm_bw -> Parquet "
          f"(chunk {a.chunk:,}, executor {a.executor}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    got = []
    for n in a.sizes:
        m = measure(n, a.chunk, a.executor, a.jobs, a.hw)
        got.append(m)
        kid = f", workers' peak {m['children_peak_rss']:,.0f} MiB" if a.executor != "local" else ""
        print(f"  {m['rows']:>12,} points ({len(a.hw)} x {'x'.join(map(str, m['axes']))}): peak RSS {m['peak_rss']:,.0f} MiB "
              f"(after imports{' + warm-up' * (a.executor == 'local')} {m['warm_rss']:,.0f} MiB){kid}; {m['rows'] / m['sweep_s']:,.0f} points/s "
              f"({m['sweep_s']:.1f} s, Parquet {m['bytes'] / 2**20:,.0f} MiB)")
    if len(got) > 1:
        print(f"  peak RSS ratio {got[-1]['rows'] / got[0]['rows']:.0f}x points: "
              f"{got[-1]['peak_rss'] / got[0]['peak_rss']:.2f}x")


if __name__ == "__main__":
    main()
