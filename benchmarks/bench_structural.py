"""Structural sweep speed: programs per second for a mapping x policy sweep of DeepSeek-V4.1-Flash (printed,
no assertions: the machine is shared).

A structural point (a new mapping, policy or hardware) costs a graph build + passes + lowering and an
evaluation of its grid; this times N such programs end to end through ``graphsim.sweep.run`` with the
sequential executor and with the local process executor, each in a fresh interpreter (cold: nothing cached
from an earlier run), and prints programs/s and points/s.

    python benchmarks/bench_structural.py [--programs 200] [--jobs 2]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

MAPPINGS = [dict(tp=tp, dp=dp, ep=ep) for tp, dp, ep in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
            if ep <= tp * dp]
POLICIES = {"overlap": ["none", "two-batch"], "decoder_replay": ["off", "paper"], "fusion": ["unfused", "single-pass"]}


def spec(programs: int) -> dict:
    n_pol = 1
    for v in POLICIES.values():
        n_pol *= len(v)
    maps = MAPPINGS[: max(1, programs // n_pol)]
    return {"name": "structural-bench", "outputs": [],
            "structure": {"model": "deepseek-v4.1-flash", "hw": "gb300", "mapping": maps, "requests": "decode",
                          "policies": POLICIES},
            "axes": {"decode.count": [8, 16, 32, 64, 128, 256, 512, 1024],
                     "decode.context": [4096, 16384, 65536, 262144]}}


RUN = r"""
import json, sys, time
t0 = time.perf_counter()
import graphsim
from graphsim.sweep import run
s = json.loads(sys.argv[1])
kw = {} if sys.argv[2] == "local" else {"jobs": int(sys.argv[3])}
if __name__ == "__main__":
    t1 = time.perf_counter()
    r = run(s, sys.argv[4], executor=sys.argv[2], **kw)
    t2 = time.perf_counter()
    print(json.dumps({"programs": r.structural_points, "rows": r.rows, "errors": r.point_errors + r.structural_errors,
                      "import_s": t1 - t0, "sweep_s": t2 - t1}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    s = spec(a.programs)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "run_bench.py")
        with open(script, "w") as f:
            f.write(RUN)
        print(f"deepseek-v4.1-flash on gb300, decode: {len(s['structure']['mapping'])} mappings x "
              f"{' x '.join(f'{len(v)} {k}' for k, v in POLICIES.items())}, 32 grid points each "
              f"(load average {os.getloadavg()[0]:.1f})")
        for executor in ("local", "processes"):
            out = os.path.join(tmp, f"{executor}.parquet")
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, script, json.dumps(s), executor, str(a.jobs), out],
                               capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if r.returncode:
                print(f"  {executor}: failed: {r.stderr.strip().splitlines()[-3:]}")
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            jobs = f" (jobs={a.jobs})" if executor == "processes" else ""
            print(f"  {executor:<9}{jobs}: {res['programs']} programs in {res['sweep_s']:.1f} s = "
                  f"{res['programs'] / res['sweep_s']:.1f} programs/s ({res['rows']:,} rows, {res['errors']} "
                  f"error rows; {wall:.1f} s wall incl. interpreter start)", flush=True)


if __name__ == "__main__":
    main()
