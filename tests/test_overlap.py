"""Streams and overlap: two-batch overlap hides the smaller of compute and communication, the critical path
names the bounding ops, and host-resident Engram prefetch is hidden or exposed by prefetch distance."""
import numpy as np
import pytest

import graphsim as gs
from conftest import toy_model
from graphsim.passes.pipeline import PassContext
from graphsim.builder import GraphBuilder
from graphsim.ir import COMPONENTS, Cost, Feature
from graphsim.lowering.evaluate import evaluate_reference, unit_time
from graphsim.lowering.program import lower
from graphsim.passes.overlap import two_batch_overlap
from graphsim.studies import prefetch_study

UT = unit_time({c: (1.0 if not c.startswith("hops") else 0.0) for c in COMPONENTS})  # 1 unit = 1 s
T = 100.0  # tokens


def layered(compute: float, comm: float, layers: int = 20):
    """Per layer: a compute op then a collective the next layer waits for (seconds at the full batch)."""
    b = GraphBuilder("toy", meta={"kinds": "decode"})
    b.token_set("all")
    t = Feature("tokens", "all")
    with b.stage("trunk"):
        for i in range(layers):
            with b.layer(i):
                c = b.op("mlp", "gemm", Cost.of(t, flops_bf16=compute / T))
                b.op("a2a", "collective", Cost.of(t, bytes_nvlink=comm / T), stream="comm", deps=[c])
                b.op("join", "norm", Cost(), deps=[b.last_on("comm")])
    return b.build()


def forward(g, wl=None):
    wl = wl or gs.Workload(("decode",), [[T]], [[1]], [[10]])
    return evaluate_reference(lower(g), wl, UT)


@pytest.mark.parametrize("compute,comm", [(1.0, 0.5), (1.0, 2.0), (1.0, 1.0)])
def test_two_batch_overlap_hides_the_smaller(compute, comm):
    g = layered(compute, comm)
    plain = forward(g).forward[0]
    tbo = forward(two_batch_overlap(g)).forward[0]
    assert plain == pytest.approx(20 * (compute + comm))
    # one half-unit of the smaller side is exposed at the start or the end
    assert tbo == pytest.approx(20 * max(compute, comm) + min(compute, comm) / 2)
    assert tbo < plain


def test_two_batch_overlap_conserves_linear_work_and_rereads_weights():
    b = GraphBuilder("w", meta={"kinds": "decode"})
    b.token_set("all")
    with b.stage("s"):
        b.gemm("g", "all", 1024, 1024, weight_format="fp8")
    g = b.build()
    s2 = two_batch_overlap(g)
    wl = gs.Workload(("decode",), [[64]], [[1]], [[10]])
    one, two = forward(g, wl), forward(s2, wl)
    k = COMPONENTS.index
    tot = lambda s, c: s.components[0, :, k(c)].sum()
    assert tot(two, "flops_fp8") == pytest.approx(tot(one, "flops_fp8"))  # token work split, not duplicated
    assert tot(two, "bytes_weight") == pytest.approx(2 * tot(one, "bytes_weight"))  # each micro-batch reads W
    assert [op.name for op in s2.ops] == ["g.tbo0", "g.tbo1"]


def busy(c, s, stream):
    return sum(s.duration[0, i] for i, op in enumerate(c.graph.ops) if op.stream == stream)


def _tbo(hw, mapping, req):
    return gs.compile_plan("deepseek-v3", gs.Plan([req], mapping, gs.Policies(overlap="two-batch")), hw)


def test_tbo_decode_compute_bound_costs_compute(gb200):
    # EP8 in one NVL72 rack: dispatch/combine over NVLink are far smaller than the compute
    c = _tbo(gb200, gs.ParallelMapping(dp=8, ep=8), "decode:4096x1024")
    s = c.schedule()
    comp, comm = busy(c, s, "compute"), busy(c, s, "comm")
    assert comm < 0.5 * comp
    assert comp <= s.forward[0] <= 1.03 * comp
    path = [c.graph.ops[i] for i in s.critical_path(0)]
    assert sum(s.duration[0, i] for i in s.critical_path(0) if c.graph.ops[i].stream == "compute") > 0.97 * s.forward[0]
    assert {op.kind for op in path if op.stream == "compute"} >= {"attention", "gemm", "moe_experts"}


def test_tbo_decode_comm_bound_costs_communication():
    # EP128 over 16 H800 nodes, 256 short requests per GPU: dispatch/combine over 50 GB/s NICs exceed
    # the compute; what stays exposed is compute with no communication beside it (3 dense layers, head)
    h800 = gs.load_hw("h800")
    c = _tbo(h800, gs.ParallelMapping(dp=128, ep=128), "decode:256x32768")
    s = c.schedule()
    comp, comm = busy(c, s, "compute"), busy(c, s, "comm")
    assert comm > 1.5 * comp
    lone = sum(s.duration[0, i] for i, op in enumerate(c.graph.ops)
               if op.stream == "compute" and (op.layer is None or op.layer < 3))
    assert comm <= s.forward[0] <= comm + lone
    # the critical path names the bounding ops: in the trunk, scale-out all-to-alls (BF16 combines first)
    path = s.critical_path(0)
    bounds = s.bound(0)
    top = sorted((i for i in path if c.graph.ops[i].stage == "trunk"), key=lambda i: -s.duration[0, i])[:20]
    assert all(c.graph.ops[i].kind == "collective" and bounds[i] == "scaleout" for i in top)
    assert sum(s.duration[0, i] for i in path if c.graph.ops[i].stream == "comm") > 0.9 * s.forward[0]
    plain = gs.compile_plan("deepseek-v3", gs.Plan(["decode:256x32768"], gs.ParallelMapping(dp=128, ep=128)),
                            h800).schedule().forward[0]
    assert s.forward[0] < plain


def test_tbo_prefill(gb200):
    plan = lambda o: gs.Plan(["prefill:4096x16"], gs.ParallelMapping(dp=8, ep=8), gs.Policies(overlap=o))
    a = gs.compile_plan("deepseek-v3", plan("none"), gb200).schedule().forward[0]
    b = gs.compile_plan("deepseek-v3", plan("two-batch"), gb200).schedule().forward[0]
    assert b < a


# ---- Engram host residency with prefetch (DeepSeek-V4.1 on GB200) --------------------------------------

TP4 = gs.ParallelMapping(tp=4, ep=4)


@pytest.mark.parametrize("req,tokens", [("prefill:8192", 8192), ("decode:65536x64", 64)])
def test_engram_host_prefetch_hidden_or_exposed(req, tokens):
    study = prefetch_study("deepseek-v4.1-flash", "gb200", [req], TP4, distances=(0, 1, 2))
    for row in study:
        assert len(row.copies) == 2  # one copy per Engram module (blocks 1 and 14)
        for r in row.copies:
            # rows of one module per token: 24 x 256 FP8 + scales = 6,336 B, sharded over tp=4, over C2C
            assert r.copy_s == pytest.approx(tokens * 6336 / 4 / 225e9, rel=1e-9)
        if row.distance == 0:  # on demand: each Engram block waits for its whole copy
            assert not row.hidden
            assert all(r.exposed_s == pytest.approx(r.copy_s, rel=0.05) for r in row.copies)
            assert row.forward_s == pytest.approx(row.forward_hbm_s + row.exposed_s, rel=1e-9)
        else:  # issued a block or more ahead: hidden behind that block, as fast as all-HBM tables
            assert row.hidden and row.forward_s == pytest.approx(row.forward_hbm_s, rel=1e-12)


def test_engram_prefetch_distance_trades_exposure_on_a_slow_link():
    # a host link of 8 GB/s and a 16K-token prefill: one block ahead hides part of each copy, two hide the
    # block-14 copy; the block-1 copy cannot start before the forward, so part of it stays exposed
    slow = gs.load_hw("gb200").with_overrides(c2c_bw=8e9)
    study = prefetch_study("deepseek-v4.1-flash", slow, ["prefill:16384"], TP4, distances=(0, 1, 2, 8))
    exposed = [r.exposed_s for r in study]
    assert exposed[0] > exposed[1] > exposed[2] > 0 and exposed[3] == pytest.approx(exposed[2])
    for r in study:
        assert r.forward_s == pytest.approx(r.forward_hbm_s + r.exposed_s, rel=1e-9)
    late = [c for c in study[2].copies if "layers.14" in c.copy]
    assert late[0].hidden


def test_prefetch_distance_validated():
    with pytest.raises(gs.GraphsimError, match="policies.prefetch_distance"):
        prefetch_study("deepseek-v4.1-flash", "gb200", ["decode:1024x4"], TP4, distances=(-1,))


def test_runtime_passes_lower_exactly(gb200):
    # the reduced-graph JAX evaluation equals the full-graph NumPy reference on a pipelined, overlapped graph
    from graphsim.lowering.evaluate import evaluate
    from graphsim.passes.pipeline_parallel import pipeline_parallel

    g = layered(1.0, 0.7, layers=8)
    model = toy_model(8, 64)
    plan = gs.Plan(["decode:10x100"], gs.ParallelMapping(pp=2), gs.Policies(pp_micro_batches=3))
    out = two_batch_overlap(pipeline_parallel(g, PassContext(model, plan, gb200)))
    p = lower(out)
    wl = gs.Workload(("decode",), [[100], [37], [400]], [[1], [1], [1]], [[10], [900], [5]])
    ut = unit_time(gb200.rates())
    ref = evaluate_reference(p, wl, ut).forward
    assert np.allclose(evaluate(p, wl, ut)["forward"], ref, rtol=1e-12, atol=0)
    assert len({op.name for op in out.ops}) == len(out.ops)
