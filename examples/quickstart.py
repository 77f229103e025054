"""The Python API end to end: load, plan, build, run passes, lower, evaluate one point and a sweep."""
import numpy as np

import graphsim as gs

model = gs.load_model("deepseek-v3")
hw = gs.load_hw("gb300")
plan = gs.Plan(["decode:8192x32"], gs.ParallelMapping(tp=1, dp=8, ep=8))

compiled = gs.compile_plan(model, plan, hw)          # build -> passes -> shard -> lower
report = compiled.report()                           # one point, full graph, critical path
print(f"ITL {report.forward_s * 1e3:.3f} ms, {report.tokens['tokens_per_s_per_user']:.1f} tok/s/user, "
      f"{report.tokens['tokens_per_s_per_gpu']:.0f} tok/s/GPU, memory fits: {report.memory['fits']}")

# The same program at 10,000 workload points in one vectorized call: batch per rank x context.
batch, ctx = np.meshgrid(np.arange(1, 101), np.round(np.linspace(1024, 131072, 100)))  # whole positions
dp = plan.mapping.dp
wl = gs.Workload(("decode",), batch.reshape(-1, 1) * dp, np.ones((batch.size, 1)), ctx.reshape(-1, 1))
step = compiled.evaluate(wl)["forward"]
tput = batch.reshape(-1) / step  # tokens/s per GPU: each of the dp ranks decodes `batch` requests per step
best = int(np.argmax(tput))
print(f"swept {wl.points} points; best tokens/s/GPU {tput[best]:.0f} at batch {batch.reshape(-1)[best]}/rank, "
      f"context {ctx.reshape(-1)[best]:.0f}")
