"""DeepSeek-V3 decode in the SOL, OP and Hybrid views from measured tables (docs/measured.md).

    graphsim measured import aiconfigurator -o tables      # needs `pip install 'graphsim[measured]'`
    python examples/op_view.py tables [--backend trtllm@1.3.0rc20]

Without an argument it uses the small fixture the tests use (GB200 and H200, TRT-LLM 1.3.0rc20 rows of
NVIDIA aiconfigurator 0.12, Apache-2.0)."""
import argparse
from pathlib import Path

import graphsim as gs
from graphsim.views.measured.view import ViewSpec

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measured", nargs="?", default=str(FIXTURE))
    ap.add_argument("--backend", default="trtllm@1.3.0rc20")
    ap.add_argument("--grid", action="store_true", help="batch x context grid (needs a full import)")
    a = ap.parse_args()
    points = [("gb200", 4, 16, 1024), ("h200", 8, 16, 1024)]
    if a.grid:
        points = [(hw, tp, b, ctx) for hw, tp in (("gb200", 4), ("h200", 8)) for b in (1, 16, 64, 256)
                  for ctx in (1024, 8192)]
    print(f"{'hw':<6} {'map':<8} {'batch':>5} {'ctx':>6} {'SOL ms':>9} {'OP ms':>9} {'hybrid ms':>9}")
    compiled = {}
    for hw, tp, b, ctx in points:
        out = []
        for view in ("sol", "op", "hybrid"):
            key = (hw, tp, view)
            if key not in compiled:
                spec = ViewSpec(view, a.measured, a.backend) if view != "sol" else None
                compiled[key] = gs.compile_plan("deepseek-v3", gs.Plan([f"decode:{ctx}x{b}"], gs.ParallelMapping(
                    tp=tp, ep=tp)), hw, view=spec)
            c = compiled[key]
            wl = gs.Plan([f"decode:{ctx}x{b}"]).workload()
            out.append(float(c.evaluate(wl, outputs=("forward",))["forward"][0]))
        print(f"{hw:<6} tp{tp}ep{tp:<3} {b:>5} {ctx:>6} " + " ".join(f"{x * 1e3:9.3f}" for x in out))


if __name__ == "__main__":
    main()
