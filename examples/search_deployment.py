"""Find the best deployment of DeepSeek-V3 on 8x GB200 for ISL 4000 / OSL 1000 under TTFT <= 2 s, TPOT <= 30 ms:
the top 3, the SGLang launch line of #1, and every evaluated point as results.parquet + a Pareto picture.

    python examples/search_deployment.py [OUT_DIR]      # OUT_DIR kept; without it, a temporary folder

The same as ``graphsim search --model deepseek-v3 --hw gb200 --gpus 8 --isl 4000 --osl 1000 --ttft 2000
--tpot 30 -o OUT_DIR/results.parquet`` (docs/search.md).
"""
import sys
import tempfile
from pathlib import Path

from graphsim.exports.plots import plot_pareto
from graphsim.serving.search import SLA, Traffic, search

r = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(4000, 1000), sla=SLA(ttft_ms=2000, tpot_ms=30), top=3)
print(f"{r.stats['rows']:,} deployment x batch points in {r.stats['wall_s']:.1f} s; "
      f"{r.stats['rows_meeting_sla']:,} meet the SLA")
for b in r.best:
    print(f"#{b['rank']} {b['mode']:<6} {b['mapping']:<24} [{b['policies']}] batch {b['decode_batch']:>5}: "
          f"{b['tokens_per_s_per_gpu']:7.1f} tok/s/GPU, {b['tokens_per_s_per_user']:5.1f} tok/s/user, "
          f"TTFT {b['ttft_ms']:4.0f} ms, TPOT {b['tpot_ms']:5.2f} ms")
print("SGLang launch of #1:\n" + "\n".join(r.best[0]["launch"]["sglang"]))

keep = len(sys.argv) > 1
tmp = None if keep else tempfile.TemporaryDirectory()
out = Path(sys.argv[1] if keep else tmp.name)
out.mkdir(parents=True, exist_ok=True)
r.table.to_parquet(out / "results.parquet", index=False)
# the front is drawn from the points that fit and meet TTFT; the TPOT bound is where it crosses 1000/30 tok/s/user
t = r.table[r.table["fits"] & (r.table["ttft_ms"] <= r.sla.ttft_ms)]
plot_pareto(t, out / "results.pareto.png", color="mode", marker="mode",
            title="deepseek-v3 on 8x GB200, ISL/OSL 4000/1000 (SOL)")
for f in ("results.parquet", "results.pareto.png"):
    print(f"wrote {out / f} ({(out / f).stat().st_size / 1024:.0f} KiB){'' if keep else ' (temporary)'}")
if tmp is not None:
    tmp.cleanup()
