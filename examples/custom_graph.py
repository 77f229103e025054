"""Describe a toy two-stage pipeline by hand with the builder API: a GEMM stage whose all-reduce overlaps the
next chunk's compute, then a second stage. Same passes, lowering, scheduler and exports as the shipped models."""
import graphsim as gs
from graphsim.core.ir import Cost, Feature
from graphsim.lowering.evaluate import evaluate_reference, unit_time
from graphsim.lowering.program import lower
from graphsim.passes.overlap import two_batch_overlap
from graphsim.passes.pipeline import PassContext, PassPipeline
from graphsim.passes.sharding import shard

b = gs.GraphBuilder("toy-pipeline")
b.token_set("all")
tokens = Feature("tokens", "all")
with b.stage("encode"):
    for chunk in range(2):
        with b.layer(chunk, prefix=f"chunk{chunk}."):
            b.gemm("up", "all", 4096, 16384, weight_format="fp8", split=("tp",))
            b.elementwise("gelu", "all", 16384, bytes_in=2, bytes_out=2, split=("tp",))
            down = b.gemm("down", "all", 16384, 4096, weight_format="fp8", split=("tp",))
            # the all-reduce runs on the comm stream; the next chunk's GEMMs do not wait for it
            ar = b.collective("allreduce", "all_reduce", "tp", Cost.of(tokens, bytes_act=4096 * 2), deps=[down])
with b.stage("decode"):
    b.op("mix", "elementwise", Cost.of(tokens, bytes_act=4096 * 4.0), deps=[b.last, ar])  # joins the last collective
    b.gemm("head", "all", 4096, 32000, weight_format="bf16", split=("tp",))
graph = b.build()

hw = gs.load_hw("gb200")
plan = gs.Plan(["prefill:8192"], gs.ParallelMapping(tp=8))
# the same verified pass pipeline compile_plan runs: every pass is (graph, ctx) -> graph
passes = PassPipeline([("shard", shard), ("two_batch_overlap", two_batch_overlap)])
sharded = passes.run(graph, PassContext(plan=plan, hw=hw))
program = lower(sharded)
sched = evaluate_reference(program, gs.Workload(("prefill",), [[1]], [[8192]], [[0]]), unit_time(hw.rates()))
print(f"{len(sharded.ops)} ops after {', '.join(sharded.meta.passes)}, forward {sched.forward[0] * 1e6:.1f} us")
print("critical path:")
for i in sched.critical_path(0):
    op = sharded.ops[i]
    print(f"  {op.name:<22} {op.stream:<8} {sched.duration[0, i] * 1e6:8.2f} us  {sched.bound(0)[i]}")
