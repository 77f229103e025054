"""How long `graphsim search` takes (issue 25 item 5): wall and CPU seconds of the acceptance case — DeepSeek-V3 on
8 GB200s, ISL 4000 / OSL 1000, TTFT 2 s, TPOT 30 ms — under SOL (a profile's prediction and its SOL twin) and, with
``--measured TABLES``, under the hybrid view of TensorRT-LLM 1.3.0rc20's tables; and of DeepSeek-V4.1-Flash on 8
GB300s (SOL), each ``graphsim search --json`` in a fresh interpreter (imports included), with the programs it
compiled and its peak resident memory. Markdown on stdout (tables, no assertions: speed is read, not asserted).

    python benchmarks/bench_search_speed.py [--measured TABLES] [--repeat N]

TABLES: a folder of measured tables, e.g. the full aiconfigurator import
(``graphsim measured import aiconfigurator -o TABLES``, docs/measured.md).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASE = ["--gpus", "8", "--isl", "4000", "--osl", "1000", "--ttft", "2000", "--tpot", "30", "--json", "--no-progress"]


def run(args: list[str]) -> dict:
    """One ``graphsim search`` in a fresh interpreter: wall, CPU (user + system) and peak RSS of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "graphsim", "search", *args, *CASE], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    stats = json.loads(p.stdout)["stats"]
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "rss_mb": after.ru_maxrss / 1024, "programs": stats["programs_compiled"],
            "sol_programs": stats["sol_programs_compiled"], "rows": stats["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", default=None, metavar="TABLES", help="measured tables for the hybrid search")
    ap.add_argument("--backend", default="trtllm@1.3.0rc20")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each search (the table lists each)")
    a = ap.parse_args()
    cases = [("DeepSeek-V3, 8 GB200, SOL", ["--model", "deepseek-v3", "--hw", "gb200"])]
    if a.measured:
        cases.append((f"DeepSeek-V3, 8 GB200, hybrid {a.backend}",
                      ["--model", "deepseek-v3", "--hw", "gb200", "--measured", a.measured, "--backend", a.backend]))
    cases.append(("DeepSeek-V4.1-Flash, 8 GB300, SOL", ["--model", "deepseek-v4.1-flash", "--hw", "gb300"]))
    print("| search | wall s | CPU s | peak RSS MB (max so far) | programs (+ SOL twin) | rows |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, args in cases:
        for _ in range(a.repeat):
            r = run(args)
            if "error" in r:
                print(f"| {name} | – | – | – | {r['error']} | – |")
                continue
            print(f"| {name} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['rss_mb']:.0f} | "
                  f"{r['programs']} (+{r['sol_programs']}) | {r['rows']:,} |")


if __name__ == "__main__":
    main()
