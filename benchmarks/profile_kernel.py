"""Where a compiled plan's kernel spends its time: XLA's fused kernels, by time per point, with the source lines
they come from (``jax.profiler`` per kernel, XLA's optimized HLO for the lines). What found the measured views'
costs (docs/measured.md "Speed").

    python benchmarks/profile_kernel.py [--model deepseek-v4.1-flash] [--hw gb200] [--view hybrid]
        [--measured DIR] [--backend trtllm@1.3.0rc20] [--points 65536] [--top 25]

Times are per point of a warm evaluation (three calls), inflated by the profiler; compare kernels with each other,
not with the benchmarks. A kernel inside a conditional is listed with the conditional too.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured"


def _sources(hlo: str) -> dict:
    """Fused kernel name -> its most frequent source lines (from the HLO's stack frames)."""
    def table(name):
        m = re.search(r"\n" + name + r"\n(.*?)\n\n", hlo, re.S)
        return m.group(1).splitlines() if m else []

    files = {int(line.split()[0]): line.split(None, 1)[1].strip('"').split("/")[-1] for line in table("FileNames")}
    locs = {int(line.split()[0]): dict(re.findall(r"(\w+)=(\d+)", line)) for line in table("FileLocations")}
    frames = {int(line.split()[0]): dict(re.findall(r"(\w+)=(\d+)", line)) for line in table("StackFrames")}

    def stack(fid):
        out, seen = [], set()
        while fid in frames and fid not in seen:
            seen.add(fid)
            loc = locs[int(frames[fid]["file_location_id"])]
            out.append(f'{files[int(loc["file_name_id"])]}:{loc["line"]}')
            fid = int(frames[fid]["parent_frame_id"])
        return out

    bodies = {m.group(1): m.group(0) for m in re.finditer(r"\n%([\w.\-]+) .*?\n}\n", hlo, re.S)}
    out = {}
    for m in re.finditer(r"\n\s+%([\w.\-]+) = [^\n]*?(?:calls|branch_computations)=\{?%([\w.\-]+)(?:, %([\w.\-]+))?",
                         hlo):
        srcs: collections.Counter = collections.Counter()
        for comp in (c for c in m.groups()[1:] if c):
            for sf in re.findall(r"stack_frame_id=(\d+)", bodies.get(comp, "")):
                st = [s for s in stack(int(sf)) if not s.startswith(("xla.py", "evaluate.py"))]
                if st:
                    srcs[" < ".join(st[:2])] += 1
        out[m.group(1)] = ", ".join(s for s, _ in srcs.most_common(2))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--hw", default="gb200")
    ap.add_argument("--view", default="hybrid", choices=("sol", "op", "hybrid"))
    ap.add_argument("--measured", default=str(FIXTURE))
    ap.add_argument("--backend", default="trtllm@1.3.0rc20")
    ap.add_argument("--request", default="decode:4096x64")
    ap.add_argument("--points", type=int, default=65536)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="graphsim-profile-")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={work}/hlo --xla_dump_hlo_as_text "
                               "--xla_dump_hlo_module_re=.*kernel.*").strip()
    import jax
    import numpy as np

    import graphsim as gs
    from graphsim.views.measured.view import ViewSpec

    rng = np.random.default_rng(0)
    P = a.points
    wl = gs.Workload(("decode",), rng.integers(1, 1024, (P, 1)).astype(float), np.ones((P, 1)),
                     rng.integers(1024, 131072, (P, 1)).astype(float))
    view = None if a.view == "sol" else ViewSpec(a.view, a.measured, a.backend)
    c = gs.compile_plan(a.model, gs.Plan([a.request], gs.ParallelMapping(tp=4, ep=4)), a.hw, view=view)
    c.evaluate(wl, outputs=("forward",))
    c.evaluate(wl, outputs=("forward",))
    jax.profiler.start_trace(f"{work}/trace", create_perfetto_trace=True)
    for _ in range(3):
        c.evaluate(wl, outputs=("forward",))
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(f"{work}/trace/**/*.trace.json.gz", recursive=True))[-1]
    events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    skip = ("ThunkExecutor", "$", "Pjit", "PjRt", "DevicePut", "end:", "while")
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(skip):
            total[e["name"]] += e["dur"]
            count[e["name"]] += 1
    dumps = sorted(glob.glob(f"{work}/hlo/*kernel*cpu_after_optimizations.txt"), key=os.path.getsize)
    src = _sources(open(dumps[-1]).read()) if dumps else {}
    print(f"{a.model} {a.view} {a.request} on {a.hw}: {P:,} points, warm, x3 (ns per point, profiler-inflated)")
    for name, us in total.most_common(a.top):
        print(f"{us * 1e3 / 3 / P:8.1f}  x{count[name] // 3:<5d} {name:<34} {src.get(name, '')}")
    print(f"(traces and HLO under {work})", file=sys.stderr)


if __name__ == "__main__":
    main()
