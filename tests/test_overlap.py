"""Streams and overlap: two-batch overlap hides the smaller of compute and communication, the critical path
names the bounding ops, and host-resident Engram prefetch is hidden or exposed by prefetch distance."""
import numpy as np
import pytest

import graphsim as gs
from conftest import toy_model
from graphsim.passes.pipeline import PassContext
from graphsim.core.builder import GraphBuilder
from graphsim.core.ir import COMPONENTS, Cost, Feature
from graphsim.lowering.evaluate import evaluate_reference, unit_time
from graphsim.lowering.program import lower
from graphsim.passes.overlap import two_batch_overlap
from graphsim.serving.studies import prefetch_study

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


# ---- overlap inside one batch: collectives beside the compute that does not depend on them -------------

A, R, D, E, C, O = 1.0, 0.5, 2.0, 4.0, 3.0, 0.25  # norm, router, dispatch, experts, combine, output (s)


def moe_block(shared: float, independent: bool = True):
    """norm -> router -> dispatch (comm) -> experts -> combine (comm) -> out, and a shared expert that reads
    the norm's output (``independent``) or the combined routed output; ``out`` sums both (builder join)."""
    b = GraphBuilder("moe", meta={"kinds": "decode"})
    b.token_set("all")
    t = Feature("tokens", "all")
    comp = lambda s: Cost.of(t, flops_bf16=s / T)
    comm = lambda s: Cost.of(t, bytes_nvlink=s / T)
    with b.stage("trunk"):
        x = b.op("norm", "norm", comp(A))
        b.op("router", "router", comp(R))
        d = b.op("dispatch", "collective", comm(D), stream="comm")
        e = b.op("experts", "moe_experts", comp(E), deps=[d])
        c = b.op("combine", "collective", comm(C), stream="comm", deps=[e])
        b.op("shared", "gemm", comp(shared), deps=[x] if independent else [c])
        b.join(c)
        b.op("out", "norm", comp(O))
    return b.build()


@pytest.mark.parametrize("shared", [1.0, 3.0, 5.0])
def test_a_collective_runs_beside_independent_compute(shared):
    from graphsim.passes.overlap import serialize_collectives

    g = moe_block(shared)
    assert {(e.src, e.dst) for e in g.edges} >= {("norm", "shared"), ("combine", "out"), ("shared", "out")}
    # the shared expert (issued after the routed experts) runs while the combine is in flight
    assert forward(g).forward[0] == pytest.approx(A + R + D + E + max(C, shared) + O)
    # serial: every collective exposed
    assert forward(serialize_collectives(g)).forward[0] == pytest.approx(A + R + D + E + C + shared + O)


def test_a_dependent_compute_op_still_waits_for_the_collective():
    from graphsim.passes.overlap import serialize_collectives

    g = moe_block(2.0, independent=False)
    assert forward(g).forward[0] == pytest.approx(A + R + D + E + C + 2.0 + O)
    assert forward(serialize_collectives(g)).forward[0] == pytest.approx(forward(g).forward[0])


def test_serializing_never_shortens_a_schedule():
    """Property: the serial schedule adds edges to the same DAG, so no point gets faster (random graphs of
    compute ops and collectives with random dataflow)."""
    from graphsim.passes.overlap import serialize_collectives

    rng = np.random.default_rng(24)
    t = Feature("tokens", "all")
    for trial in range(20):
        b = GraphBuilder(f"r{trial}", meta={"kinds": "decode"})
        b.token_set("all")
        names: list[str] = []
        with b.stage("s"):
            for i in range(int(rng.integers(4, 30))):
                dur = float(rng.uniform(0.1, 3.0)) / T
                deps = [names[j] for j in rng.choice(len(names), size=min(len(names), int(rng.integers(0, 3))),
                                                     replace=False)] if names else []
                if rng.random() < 0.35:
                    names.append(b.op(f"c{i}", "collective", Cost.of(t, bytes_nvlink=dur), stream="comm", deps=deps))
                else:
                    names.append(b.op(f"k{i}", "gemm", Cost.of(t, flops_bf16=dur), deps=deps))
        g = b.build()
        free, serial = forward(g).forward[0], forward(serialize_collectives(g)).forward[0]
        assert free <= serial + 1e-12
        # serial = the sum of every op's time when comm and compute take turns (no stream runs alone)
        assert serial <= sum(forward(g).duration[0]) + 1e-12


def _v3(policy: str, req: str = "decode:4096x64", **mapping):
    return gs.compile_plan("deepseek-v3", gs.Plan([req], gs.ParallelMapping(**(mapping or {"tp": 8, "ep": 8})),
                                                  gs.Policies(overlap=policy)), "gb200")


@pytest.mark.parametrize("req,mapping,hidden", [
    ("decode:4096x64", {"tp": 8, "ep": 8}, "combine"),  # 64 requests: the combine hides under the shared expert
    ("decode:2048x1024", {"dp": 8, "ep": 8}, "shared"),  # 1024: the shared expert hides under the combine
])
def test_v3_shared_expert_runs_beside_the_combine(gb200, req, mapping, hidden):
    """DeepSeek-V3 EP8 decode on GB200: the shared expert (it reads the MoE block's input) runs while the
    combine all-to-all is in flight. Each MoE layer saves min(combine, shared expert) against the serial
    schedule, and the critical path keeps only the longer of the two."""
    free, serial = _v3("none", req, **mapping), _v3("serial", req, **mapping)
    sf, ss = free.schedule(), serial.schedule()
    assert [op.name for op in free.graph.ops] == [op.name for op in serial.graph.ops]
    dur = {op.name: ss.duration[0, i] for i, op in enumerate(serial.graph.ops)}

    def branches(i):
        p = f"layers.{i}.moe."
        return dur[p + "experts.all_to_all.1"], sum(dur[p + f"shared.{k}"] for k in ("gate_up", "swiglu", "down"))

    saved = sum(min(branches(i)) for i in range(3, 61))  # first_k_dense_replace = 3 of 61 layers (config.json)
    assert sf.forward[0] == pytest.approx(ss.forward[0] - saved, rel=1e-9)
    comb, shared = branches(30)
    assert (shared > comb) == (hidden == "combine")
    path = {free.graph.ops[i].name for i in sf.critical_path(0)}
    p = "layers.30.moe."
    on = {"combine": p + "shared.gate_up", "shared": p + "experts.all_to_all.1"}[hidden]
    off = {"combine": p + "experts.all_to_all.1", "shared": p + "shared.gate_up"}[hidden]
    assert on in path and off not in path
    spath = {serial.graph.ops[i].name for i in ss.critical_path(0)}
    assert {on, off} <= spath


@pytest.mark.parametrize("model,req,mapping", [
    ("deepseek-v3", "decode:4096x64", {"tp": 8, "ep": 8}),
    ("deepseek-v3", "prefill:8192", {"tp": 8}),
    ("deepseek-v3", "decode:2048x256", {"dp": 8, "ep": 8}),
    ("deepseek-v4.1-flash", "decode:4096x64", {"tp": 4, "ep": 4}),
    ("deepseek-v4.1-flash", "decode:4096x1", {"tp": 4}),
])
def test_overlap_never_raises_the_sol(model, req, mapping):
    """Property: the SOL with overlap inside the batch (the default) is never above the serial schedule."""
    plan = lambda o: gs.Plan([req], gs.ParallelMapping(**mapping), gs.Policies(overlap=o))
    free = gs.compile_plan(model, plan("none"), "gb200").schedule().forward[0]
    serial = gs.compile_plan(model, plan("serial"), "gb200").schedule().forward[0]
    assert free <= serial


# ---- two-batch overlap of one prompt: its tokens in two causal halves ---------------------------------

def test_two_batch_splits_one_prompt_into_causal_halves():
    """One 1000-token prompt: half 0 is positions [0, 500), half 1 [500, 1000) attending to half 0's KV —
    Σ causal pairs 500·501/2 and (1000·1001 - 500·501)/2, exactly (not half of the prompt's pairs each)."""
    from graphsim.passes.pipeline import PassContext

    b = GraphBuilder("attn", meta={"kinds": "prefill"})
    b.token_set("all")
    with b.stage("s"):
        b.op("attn", "attention", Cost.of(Feature("causal_pairs", "all"), flops_bf16=1.0))
        b.op("mlp", "gemm", Cost.of(Feature("tokens", "all"), flops_bf16=1.0))
    plan = gs.Plan(["prefill:1000"], policies=gs.Policies(overlap="two-batch"))
    g = two_batch_overlap(b.build(), PassContext(plan=plan))
    s = forward(g, gs.Workload(("prefill",), [[1]], [[1000]], [[0]]))
    d = {op.name: s.duration[0, i] for i, op in enumerate(g.ops)}
    assert d["attn.tbo0"] == pytest.approx(500 * 501 / 2)
    assert d["attn.tbo1"] == pytest.approx(1000 * 1001 / 2 - 500 * 501 / 2)
    assert d["mlp.tbo0"] == d["mlp.tbo1"] == pytest.approx(500)


def test_two_batch_with_one_prompt_per_rank_runs_and_is_not_slower(gb200):
    for req, mapping in [("prefill:8192", {"tp": 8, "ep": 8}), ("prefill:4096x8", {"dp": 8, "ep": 8})]:
        none, tbo = _v3("none", req, **mapping), _v3("two-batch", req, **mapping)
        assert {op.param_dict.get("half") for op in tbo.graph.ops} == {"tbo0", "tbo1"}
        assert any(f.chunk == (1, 2) for op in tbo.graph.ops for f in op.cost.features())
        assert tbo.schedule().forward[0] <= none.schedule().forward[0]
    with pytest.raises(gs.GraphsimError, match="policies.overlap"):
        _v3("two-batch", "decode:4096x1")  # one decode position per rank cannot be split


def test_cli_overlap_serial_and_what_stays_exposed(capsys):
    """The text report says how much communication the schedule hides: all of it exposed when serial; with
    the default, the busy time minus what is on the critical path (the shared expert hid the combines)."""
    import re

    from graphsim.cli import main

    def comm(*extra):
        main(["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "8", "--ep", "8", "--request",
              "decode:4096x64", "--view", "sol", *extra])
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("communication"))
        return [float(v) for v in re.findall(r"([\d.]+) ms", line)]

    busy, exposed, hidden = comm("--overlap", "serial")
    assert exposed == busy and hidden == 0.0
    busy2, exposed2, hidden2 = comm()
    assert busy2 == busy and hidden2 > 0 and exposed2 == pytest.approx(busy2 - hidden2, abs=2e-4)
    free, serial = _v3("none").schedule().forward[0], _v3("serial").schedule().forward[0]
    assert hidden2 == pytest.approx((serial - free) * 1e3, abs=2e-4)  # what overlap saved is what it hid
