"""`make demo`: DeepSeek-V3 on GB200 (TP4, EP4) with a mixed batch — the report a user reads first."""
import sys

import graphsim as gs

requests = sys.argv[1:] or ["decode:4096x64", "prefill:2048"]
plan = gs.Plan(requests, gs.ParallelMapping(tp=4, ep=4))
compiled = gs.compile_plan("deepseek-v3", plan, "gb200")
print(compiled.report().to_text())
