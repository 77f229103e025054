"""Parallel mappings: collective formulas against hand calculations, shards summing to the whole, EP bytes,
imbalance, link placement (NVLink vs scale-out), CP, PP stages and bubbles, and mappings that cannot exist."""

import numpy as np
import pytest

import graphsim as gs
from conftest import toy_model
from graphsim.passes.pipeline import PassContext
from graphsim.core.builder import GraphBuilder
from graphsim.core.config import load_config
from graphsim.core.ir import COMPONENTS, ONE, Cost, Feature, fmt
from graphsim.lowering.evaluate import evaluate_reference, unit_time
from graphsim.lowering.program import lower
from graphsim.passes.pipeline_parallel import pipeline_parallel, stage_sizes
from graphsim.passes.sharding import QUERY_FEATURES, apply_mapping, layout_of, link_cost, members_in_domain

S = 1000.0  # payload bytes per rank
PAY = Cost.of(ONE, bytes_act=S)
#: Tests of the data a collective moves force the bandwidth-view algorithms at Simple (every wire byte is data);
#: by default an op runs at its fastest algorithm x protocol (tests/test_algorithms.py)
DATA = gs.Policies(algorithms={"all_reduce": "ring/simple", "all_gather": "ring/simple",
                               "reduce_scatter": "ring/simple", "all_to_all": "hierarchical/simple"})


def comps(cost: Cost) -> dict:
    out = dict.fromkeys(COMPONENTS, 0.0)
    for c, _, v in cost.terms:
        out[c] += v
    return out


# ---- collective formulas by hand ----------------------------------------------------------------------

@pytest.mark.parametrize("coll,algo,n,nv,hops", [
    ("all_reduce", "ring", 8, 2 * 7 / 8 * S, 14),  # 2(n-1)/n·S in 2(n-1) steps
    ("all_reduce", "tree", 8, 2 * S, 6),  # 2S in 2·log2(8) steps
    ("all_gather", "ring", 4, 3 / 4 * S, 3),  # (n-1)/n·S in n-1 steps
    ("reduce_scatter", "ring", 4, 3 / 4 * S, 3),
    ("all_gather", "tree", 4, S, 2),
    ("all_to_all", "direct", 8, 7 / 8 * S, 1),  # (n-1)/n of the send buffer leaves the rank
    ("p2p", "direct", 2, S, 1),
])
def test_in_domain_collectives(coll, algo, n, nv, hops):
    c = comps(link_cost(coll, n, n, PAY, algo)[0])
    assert c["bytes_nvlink"] == pytest.approx(nv) and c["hops_nvlink"] == hops
    assert c["bytes_scaleout"] == 0 and c["hops_scaleout"] == 0


def test_ring_across_domains_is_hierarchical():
    # 32 ranks, 8 per NVLink domain (4 H800 nodes): reduce-scatter in the node, ring over 4 nodes on 1/8 of
    # the data per NIC, all-gather in the node
    c = comps(link_cost("all_reduce", 32, 8, PAY, "ring")[0])
    assert c["bytes_nvlink"] == pytest.approx(2 * 7 / 8 * S)
    assert c["bytes_scaleout"] == pytest.approx(2 * 3 / 4 * S / 8)
    assert (c["hops_nvlink"], c["hops_scaleout"]) == (14, 6)
    # one member per domain (e.g. a DP group strided by 8 on H800): every byte crosses the NIC
    c = comps(link_cost("all_reduce", 4, 1, PAY, "ring")[0])
    assert c["bytes_scaleout"] == pytest.approx(2 * 3 / 4 * S) and c["bytes_nvlink"] == 0


def test_all_to_all_across_domains():
    n, g, k = 32, 8, 8
    direct = comps(link_cost("all_to_all", n, g, PAY, "direct", top_k=k)[0])
    assert direct["bytes_nvlink"] == pytest.approx((g - 1) / n * S)
    assert direct["bytes_scaleout"] == pytest.approx((n - g) / n * S)
    # hierarchical (DeepEP normal): a token crosses once per remote node it is routed to
    N = n / g
    hier = comps(link_cost("all_to_all", n, g, PAY, top_k=k)[0])  # the default
    assert hier["bytes_scaleout"] == pytest.approx(S / k * (N - 1) * (1 - (1 - 1 / N) ** k))
    assert hier["bytes_nvlink"] == pytest.approx((g - 1) / g * S)
    assert hier["bytes_scaleout"] < direct["bytes_scaleout"]


def test_members_in_domain():
    assert members_in_domain(144, 1, 72) == 72  # ep=144 over two NVL72 racks
    assert members_in_domain(18, 8, 72) == 9  # dp groups strided by tp=8
    assert members_in_domain(4, 8, 8) == 1  # H800 dp over nodes


def test_collective_time_by_hand(gb200):
    # a TP8 all-reduce of 64 tokens x 7168 bf16 on GB200. It used to be priced as a ring at LL128 only
    # (2·7/8·S / 900 GB/s + 14 steps x 1.9 us = 28.4 us); it now runs at its fastest algorithm x protocol:
    # two-shot (direct reduce-scatter + all-gather) at LL, 2·7/8·S x 2 wire bytes per data byte / 900 GB/s +
    # 2 steps x 0.6 us = 4.77 us (one-shot LL128: 7·S·128/120 / 900 GB/s + 1.9 us = 9.5 us; no NVLS without hw)
    b = GraphBuilder("ar")
    b.token_set("all")
    with b.stage("s"):
        b.collective("ar", "all_reduce", "tp", Cost.of(Feature("tokens", "all"), bytes_act=7168 * 2.0))
    g = apply_mapping(b.build(), gs.ParallelMapping(tp=8), gb200.nvlink_domain)
    wl = gs.Workload(("decode",), [[64]], [[1]], [[100]])
    s = evaluate_reference(lower(g), wl, unit_time(gb200.rates()))
    S_ = 64 * 7168 * 2.0
    assert s.forward[0] == pytest.approx(2 * 7 / 8 * S_ * 2 / 900e9 + 2 * 0.6e-6, rel=1e-12)
    assert s.algorithm(0) == "two_shot/LL"
    # forced back to the old ring, at LL128: the old number
    g = apply_mapping(b.build(), gs.ParallelMapping(tp=8), gb200.nvlink_domain,
                      policies=gs.Policies(algorithms={"all_reduce": "ring/ll128"}))
    t = evaluate_reference(lower(g), wl, unit_time(gb200.rates())).forward[0]
    assert t == pytest.approx(2 * 7 / 8 * S_ * 128 / 120 / 900e9 + 14 * 1.9e-6, rel=1e-12)


def test_algorithm_choice_on_the_plan(gb200):
    plan = lambda alg: gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=8), gs.Policies(algorithms=alg))
    ring = gs.compile_plan("deepseek-v3", plan({}), gb200)
    tree = gs.compile_plan("deepseek-v3", plan({"all_reduce": "tree"}), gb200)
    name = "layers.3.wo.all_reduce"
    # auto: the fastest of every algorithm x protocol; a forced algorithm runs at its fastest protocol
    # (its steps on that protocol's latency), algorithm/protocol forces both
    assert {label.split("/")[0] for label, _ in ring.graph.op(name).alts} == {"one_shot", "two_shot", "nvls"}
    assert [comps(c)["hops_nvlink_ll"] for label, c in tree.graph.op(name).alts if label == "tree/LL"] == [6]
    assert [label for label, _ in tree.graph.op(name).alts] == ["tree/LL", "tree/LL128", "tree/Simple"]
    assert "tree/LL" in tree.graph.op(name).formula
    one = gs.compile_plan("deepseek-v3", plan({"all_reduce": "ring/ll128"}), gb200).graph.op(name)
    assert [label for label, _ in one.alts] == ["ring/LL128"] and comps(one.cost)["hops_nvlink"] == 14
    assert "all_reduce/ring/LL128" in one.formula
    with pytest.raises(gs.GraphsimError, match="policies.algorithms.all_to_all"):
        gs.Policies(algorithms={"all_to_all": "ring"})


# ---- sharding: shards sum to the whole ---------------------------------------------------------------

def _divisor(op, comp, feat, m, lay):
    """What the test expects: tp/dp/ep shards, cp for query features of token-parallel ops, and the token
    layout's extra TP split of tokens (a scattered MoE block)."""
    split = op.split - ({"tp"} if op.kind == "indexer" else set())
    if comp == "bytes_weight":
        tp = m.tp if "tp" in split and not lay.replicate_weights else 1
        return tp * (m.world if "ep" in split else 1)
    if not comp.startswith(("flops", "exps", "bytes_kv", "bytes_act", "bytes_c2c", "bytes_disk")):
        return 1
    tp = m.tp if "tp" in split else 1
    kvh = op.info.kv_heads
    if comp in ("bytes_kv", "bytes_c2c", "bytes_disk") and kvh and "tp" in split:
        tp = min(m.tp, kvh)  # a cache with fewer KV heads than TP ranks is read whole per rank
    d = tp * (m.dp if "dp" in split else 1) * (m.world if "ep" in split else 1)
    if "dp" in split and "ep" not in split and feat.kind in QUERY_FEATURES:
        d *= m.cp
    if feat.kind in QUERY_FEATURES:
        d *= lay.token_div
    return d


@pytest.mark.parametrize("name,kinds,mapping", [
    ("deepseek-v3", ("decode", "prefill"), gs.ParallelMapping(tp=4)),
    ("deepseek-v3", ("decode", "prefill"), gs.ParallelMapping(tp=2, dp=4, ep=8)),
    ("deepseek-v3", ("prefill",), gs.ParallelMapping(tp=2, dp=2, ep=8, cp=2)),
    ("deepseek-v4.1-flash", ("decode",), gs.ParallelMapping(tp=4, dp=2, ep=8)),
    ("deepseek-v4.1-flash", ("prefill",), gs.ParallelMapping(tp=2, ep=4, cp=2)),
])
def test_shards_over_ranks_sum_to_the_whole(name, kinds, mapping):
    g = gs.load_model(name).build(kinds)
    s = apply_mapping(g, mapping, 72)
    layout = layout_of(g, mapping, 72)
    for op in g.ops:
        sharded = dict(((c, f), v) for c, f, v in s.op(op.name).cost.terms)
        for c, f, v in op.cost.terms:
            d = _divisor(op, c, f, mapping, layout.of(op.name))
            assert mapping.world % d == 0 or c == "bytes_weight", (op.name, c, d)
            assert sharded[(c, f)] * d == pytest.approx(v, rel=1e-12), (op.name, c, str(f))


def test_indexer_is_replicated_across_tp():
    g = gs.load_model("deepseek-v4.1-flash").build(("decode",))
    one = apply_mapping(g, gs.ParallelMapping(dp=1), 72)
    tp4 = apply_mapping(g, gs.ParallelMapping(tp=4), 72)
    idx = [op.name for op in g.ops if op.kind == "indexer"]
    assert idx
    for n in idx:
        assert tp4.op(n).cost == one.op(n).cost  # every TP rank scores all index heads
    assert not any(op.name.startswith(tuple(idx)) and op.stream == "comm" for op in tp4.ops)  # no reduction


def test_engram_rows_sharded_across_tp_and_all_reduced():
    g = gs.load_model("deepseek-v4.1-flash").build(("decode",))
    s = apply_mapping(g, gs.ParallelMapping(tp=4), 72)
    look = [op for op in g.ops if any(g.tensor_map[t].role == "table" for t in op.reads)]
    assert len(look) == 2
    for op in look:
        w = sum(v for c, _, v in op.cost.terms if c == "bytes_weight")
        assert sum(v for c, _, v in s.op(op.name).cost.terms if c == "bytes_weight") == pytest.approx(w / 4)
        assert dict(s.op(f"{op.name}.all_reduce").params)["group"] == "tp"


# ---- EP: dispatch/combine bytes, experts per rank, imbalance -------------------------------------------

def _v3(**over):
    return gs.load_model({**load_config("deepseek-v3"), **over, "_name": "deepseek-v3"})


def _a2a(graph, layer=3):
    d = graph.op(f"layers.{layer}.moe.experts.all_to_all.0")
    c = graph.op(f"layers.{layer}.moe.experts.all_to_all.1")
    return comps(d.cost)["bytes_nvlink"], comps(c.cost)["bytes_nvlink"]


def test_ep_dispatch_bytes_scale_with_topk_and_precision():
    m = gs.ParallelMapping(dp=8, ep=8)
    g8 = apply_mapping(_v3().build(("decode",)), m, 72, policies=DATA)
    g4 = apply_mapping(_v3(num_experts_per_tok=4).build(("decode",)), m, 72, policies=DATA)
    d8, c8 = _a2a(g8)
    d4, c4 = _a2a(g4)
    # per token per rank (1/world of the tokens): sent once to each distinct remote rank among its k experts'
    # ranks, (n-1)(1-(1-1/n)^k) of them in expectation, hidden · bytes each (DeepEP per-rank dedup)
    coef = lambda g: next(v for c, f, v in g.op("layers.3.moe.experts.all_to_all.0").cost.terms if c == "bytes_nvlink")
    assert coef(g8) == pytest.approx(7 * (1 - (7 / 8) ** 8) * 7168 * 1.0 / 8)  # FP8 dispatch
    assert c8 == pytest.approx(2 * d8)  # BF16 combine
    assert d8 / d4 == pytest.approx((1 - (7 / 8) ** 8) / (1 - (7 / 8) ** 4))  # top-8 vs top-4 distinct ranks
    direct = apply_mapping(_v3().build(("decode",)), m, 72,
                           policies=gs.Policies(algorithms={"all_to_all": "direct/simple"}))
    assert _a2a(direct)[0] == pytest.approx(8 * 7168 * 1.0 / 8 * 7 / 8)  # every (token, expert) pair: k(n-1)/n


def test_expected_distinct_experts_per_rank(gb200):
    # 64 decode tokens, EP8 over DP8: each rank holds 32 of 256 experts and touches 32·(1-(1-8/256)^64) of them
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(dp=8, ep=8)), gb200)
    s = c.schedule()
    i = c.graph.op_index["layers.3.moe.experts"]
    per_expert = fmt("fp8_b128x128").nbytes(3 * 7168 * 2048)
    want = 256 / 8 * (1 - (1 - 8 / 256) ** 64) * per_expert
    assert s.components[0, i, COMPONENTS.index("bytes_weight")] == pytest.approx(want, rel=1e-12)


def test_ep_imbalance_scales_the_hot_rank(gb200):
    mk = lambda imb: gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(dp=8, ep=8),
                                                            gs.Policies(ep_imbalance=imb)), gb200).schedule()
    a, b = mk(1.0), mk(1.5)
    g = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(dp=8, ep=8)), gb200).graph
    i = g.op_index["layers.3.moe.experts"]
    j = g.op_index["layers.3.moe.experts.all_to_all.0"]
    k = COMPONENTS.index
    assert b.components[0, i, k("flops_fp8")] == pytest.approx(1.5 * a.components[0, i, k("flops_fp8")])
    assert b.components[0, j, k("bytes_nvlink")] == pytest.approx(1.5 * a.components[0, j, k("bytes_nvlink")])
    # the hot rank touches the experts 1.5x the tokens would: more, but never more than it holds
    touched = lambda t: 256 / 8 * (1 - (1 - 8 / 256) ** t)
    w = a.components[0, i, k("bytes_weight")]
    assert b.components[0, i, k("bytes_weight")] == pytest.approx(w * touched(96) / touched(64))
    with pytest.raises(gs.GraphsimError, match="policies.ep_imbalance"):
        gs.Policies(ep_imbalance=0.5)


def test_two_nvl72_racks_pay_scale_out(gb200):
    model = _v3(n_routed_experts=288)  # 256 + 32 redundant: DeepSeek's EP144 decode layout, 2 per GPU

    def a2a(m):
        c = gs.compile_plan(model, gs.Plan(["decode:4096x" + str(64 * m.dp)], m), gb200)
        s = c.schedule()
        i = c.graph.op_index["layers.3.moe.experts.all_to_all.1"]
        return comps(c.graph.ops[i].cost), s.bound(0)[i]
    one_rack, b1 = a2a(gs.ParallelMapping(dp=72, ep=72))
    two_racks, b2 = a2a(gs.ParallelMapping(dp=144, ep=144))
    assert one_rack["bytes_scaleout"] == 0 and b1 == "nvlink"
    assert two_racks["bytes_scaleout"] > 0 and b2 == "scaleout"
    assert two_racks["hops_scaleout"] == 1


# ---- mappings that cannot exist -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v4.1-flash"])
def test_tp_not_dividing_heads_is_rejected(name, gb200):
    with pytest.raises(gs.GraphsimError, match=r"mapping\.tp: 3 does not divide attention heads"):
        gs.compile_plan(name, gs.Plan(["decode:100"], gs.ParallelMapping(tp=3)), gb200)


def test_cp_is_prefill_only_and_vision_rejects_pp_cp(gb200):
    with pytest.raises(gs.GraphsimError, match="mapping.cp"):
        gs.compile_plan("deepseek-v3", gs.Plan(["decode:100x4"], gs.ParallelMapping(cp=2)), gb200)
    b = GraphBuilder("vl", meta={"kinds": "prefill"})
    b.token_set("all")
    with b.stage("vision"):
        b.op("vit", "gemm", Cost.of(Feature("tokens", "all"), flops_bf16=1.0))
    g = b.build()
    for m, field in ((gs.ParallelMapping(pp=2), "mapping.pp"), (gs.ParallelMapping(cp=2), "mapping.cp")):
        with pytest.raises(gs.GraphsimError, match=field):
            apply_mapping(g, m, 72)
    with pytest.raises(gs.GraphsimError, match="mapping.cp"):
        gs.ParallelMapping(cp=0)


def test_context_parallel_prefill(gb200):
    # cp=2 halves query work, keeps per-request KV reads whole and all-gathers each layer's new latent KV
    one = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:32768"], gs.ParallelMapping(tp=8), DATA), gb200)
    two = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:32768"], gs.ParallelMapping(tp=8, cp=2), DATA), gb200)
    a, b = one.schedule(), two.schedule()
    k = COMPONENTS.index
    att = lambda c, s: s.components[0, c.graph.op_index["layers.5.attn_prefill"]]
    assert att(two, b)[k("flops_bf16")] == pytest.approx(att(one, a)[k("flops_bf16")] / 2)
    assert att(two, b)[k("bytes_kv")] == pytest.approx(att(one, a)[k("bytes_kv")])
    ag = two.graph.op("layers.5.kv_write.all_gather")
    # S = the request's new latents (32768 x 576 bf16), each rank receives the other half over NVLink
    assert comps(ag.cost)["bytes_nvlink"] == pytest.approx(576 * 2.0 / 2)  # per token: half of 576 bf16
    assert b.forward[0] < a.forward[0]
    assert two.plan.mapping.gpus == 16 and "cp2" in str(two.plan.mapping)


# ---- pipeline parallelism -------------------------------------------------------------------------------

def test_stage_sizes():
    assert stage_sizes(61, 4) == (16, 15, 15, 15)
    assert stage_sizes(40, 8) == (5,) * 8
    with pytest.raises(gs.GraphsimError, match=r"mapping\.pp: pp=32 splits 40 trunk layers"):
        stage_sizes(40, 32)
    with pytest.raises(gs.GraphsimError, match="mapping.pp"):
        stage_sizes(40, 64)


def _layers_graph(costs):
    """One compute op per layer costing ``costs[i]`` BF16 FLOPs per token."""
    b = GraphBuilder("chain", meta={"kinds": "prefill"})
    b.token_set("all")
    with b.stage("trunk"):
        for i, c in enumerate(costs):
            with b.layer(i):
                b.op("f", "gemm", Cost.of(Feature("tokens", "all"), flops_bf16=c))
    return b.build()


@pytest.mark.parametrize("pp,m", [(4, 4), (4, 8), (2, 1), (8, 3)])
def test_pipeline_bubble_formula(gb200, pp, m):
    L, T = 16, 1000
    per_layer = 2.5e15 / (T * m)  # 1 s per layer for the whole batch (m prompts of T) at the BF16 peak
    g = _layers_graph([per_layer] * L)
    model = toy_model(L, 1)
    plan = gs.Plan([f"prefill:{T}x{m}"], gs.ParallelMapping(pp=pp), gs.Policies(pp_micro_batches=m))
    out = pipeline_parallel(g, PassContext(model, plan, gb200))
    t = evaluate_reference(lower(out), plan.workload(), unit_time(gb200.rates())).forward[0]
    stage = L / pp / m  # one micro-batch through one stage; sends add ~2 us of latency each
    assert t == pytest.approx((m + pp - 1) * stage, abs=(m + pp) * 3e-6)
    assert t == pytest.approx((m + pp - 1) / m * L / pp, rel=1e-4)


def test_pipeline_uneven_stages_take_the_bottleneck(gb200):
    T = 1000
    costs = [2.5e15 / T / 4] * 7 + [3 * 2.5e15 / T / 4]  # last layer 3 s: stage 1 (layers 4-7) takes 6 s, stage 0 4 s
    model = toy_model(8, 1)
    plan = gs.Plan([f"prefill:{T}x4"], gs.ParallelMapping(pp=2), gs.Policies(pp_micro_batches=4))
    out = pipeline_parallel(_layers_graph(costs), PassContext(model, plan, gb200))
    t = evaluate_reference(lower(out), plan.workload(), unit_time(gb200.rates())).forward[0]
    t0, t1 = 4 / 4, 6 / 4
    assert t == pytest.approx(t0 + t1 + 3 * max(t0, t1), abs=1e-4)  # Σ t_s + (m-1)·max t_s
    assert out.meta.pp_bottleneck_stage == 1


@pytest.mark.parametrize("hw,mapping,links", [
    ("gb200", gs.ParallelMapping(tp=8, pp=2), ["nvlink"]),  # both stages in one NVL72 rack
    ("h800", gs.ParallelMapping(tp=8, pp=2), ["scaleout"]),  # one stage per 8-GPU node
    ("gb200", gs.ParallelMapping(tp=4, dp=9, pp=4), ["nvlink", "scaleout", "nvlink"]),  # 36 per stage: 2 per rack
])
def test_pipeline_sends_take_the_right_link(hw, mapping, links):
    batch = 64 * mapping.dp
    c = gs.compile_plan("llama-3.1-70b", gs.Plan([f"decode:2048x{batch}"], mapping), hw)
    s = c.schedule()
    got = []
    for st in range(mapping.pp - 1):
        i = next(i for i, o in enumerate(c.graph.ops) if o.name.startswith(f"pp.send.{st}"))
        row = dict(zip(COMPONENTS, s.components[0, i]))
        got.append("scaleout" if row["bytes_scaleout"] else "nvlink")
        # the hidden state (8192 bf16) of one micro-batch's tokens, each rank its 1/world share
        want = batch / mapping.pp * 8192 * 2.0 / mapping.world
        assert row["bytes_scaleout"] + row["bytes_nvlink"] == pytest.approx(want)
    assert got == links


def test_pipeline_decode_v3(gb200):
    base = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=8)), gb200).schedule()
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=8, pp=4)), gb200)
    s = c.schedule()
    meta = c.graph.meta_dict
    assert meta["pp_stages"] == (16, 15, 15, 15) and meta["pp_micro_batches"] == 4
    # weight-bound decode: each micro-batch re-reads its stage's weights, so (m+pp-1)/m·(1/pp) of the
    # unsplit step is a lower bound, and the bubble makes PP slower per GPU than TP alone
    assert s.forward[0] > base.forward[0] * (4 + 3) / 4 / 4
    assert c.report().tokens["tokens_per_s_per_gpu"] < 64 / base.forward[0] / 8
    with pytest.raises(gs.GraphsimError, match="policies.pp_micro_batches"):
        gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x2"], gs.ParallelMapping(pp=4)), gb200)


def test_pipeline_carries_shared_kv_across_stages(gb200):
    # V4.1 with pp=4 (10 layers each): layers 10-13 read the KV owned by layer 8, layers 30-39 the KV of
    # layer 20, so those owners' new entries ride sends 0 and 2; nothing shared crosses send 1
    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:8192x64"], gs.ParallelMapping(tp=4, ep=4, pp=4)),
                        gb200)
    feats = {}
    for s in range(3):
        op = next(o for o in c.graph.ops if o.name.startswith(f"pp.send.{s}"))
        feats[s] = {f.kind for _, f, _ in op.cost.terms if f.kind != "one"}
        resid = [v for _, f, v in op.cost.terms if f.kind == "tokens"]
        assert resid == [pytest.approx(4 * 5120 * 2.0 / 4)]  # 4 mHC streams in BF16, 1/world per rank
    assert feats[1] == {"tokens"}
    assert "new_groups" in feats[0] and "new_groups" in feats[2]


@pytest.mark.parametrize("ep,share", [(1, 1.0), (4, 1 - (3 / 4) ** 8)])
def test_expert_tp_reduce_payload(ep, share):
    # TP8 over the MoE: without EP every rank holds a slice of every expert for all T tokens, so its
    # all-reduce carries as much as the attention output's; with EP4 (expert-TP 2) only the tokens routed
    # to the rank's experts, T·(1-(1-1/ep)^k)
    g = apply_mapping(gs.load_model("deepseek-v3").build(("decode",)), gs.ParallelMapping(tp=8, ep=ep), 72,
                      policies=DATA)
    wo = comps(g.op("layers.3.wo.all_reduce").cost)["bytes_nvlink"]
    moe = g.op("layers.3.moe.experts.all_reduce.2")  # the op's third CommSpec (after dispatch, combine)
    assert dict(moe.params)["group"] == "moe_tp"
    if ep == 1:  # same 8 ranks as the shared expert's TP reduce: summed first, reduced once there
        assert not moe.cost.terms and "merged into" in moe.formula
        moe = g.op("layers.3.moe.shared.down.all_reduce")
    n = 8 // ep
    assert comps(moe.cost)["bytes_nvlink"] == pytest.approx(wo / (2 * 7 / 8) * share * 2 * (n - 1) / n)


@pytest.mark.parametrize("pp,m", [(4, 4), (8, 3), (2, 5)])
def test_one_prompt_splits_into_causal_chunks(gb200, pp, m):
    """One prompt of T tokens cannot be split by requests: its m chunks c_j = ⌊(j+1)T/m⌋ - ⌊jT/m⌋ flow through
    the pp stages; with a per-token cost τ per stage the fill-drain grid's longest path is
    τ·(Σ c_j + (pp - 1)·max c_j) (plus send latencies)."""
    L, T = 16, 1000
    per_layer = 2.5e15 / T  # 1 s per layer for the whole prompt
    g = _layers_graph([per_layer] * L)
    model = toy_model(L, 1)
    plan = gs.Plan([f"prefill:{T}"], gs.ParallelMapping(pp=pp), gs.Policies(pp_micro_batches=m))
    out = pipeline_parallel(g, PassContext(model, plan, gb200))
    assert out.meta.pp_split == "causal-chunks" and {op.device for op in out.ops} == set(range(pp))
    t = evaluate_reference(lower(out), plan.workload(), unit_time(gb200.rates())).forward[0]
    c = [(j + 1) * T // m - j * T // m for j in range(m)]
    tau = L / pp / T  # seconds per token per stage
    assert t == pytest.approx(tau * (T + (pp - 1) * max(c)), abs=(m + pp) * 3e-6)


def test_long_prompt_pipeline_chunks_attend_to_more(gb200):
    """DeepSeek-V3, one 32K prompt over pp=4: chunk j's attention covers its own and every earlier chunk's
    positions (causal pairs grow with j), and the time to first token is the longest path of the grid in
    which stage s runs chunk j after chunk j-1 and after stage s-1 sent chunk j (rebuilt here by hand)."""
    plan = gs.Plan(["prefill:32768"], gs.ParallelMapping(pp=4))
    c = gs.compile_plan("deepseek-v3", plan, "gb200")
    s = c.schedule()
    g = c.graph
    att = [s.duration[0, g.op_index["layers.5.attn_prefill" + ("" if j == 0 else f".mb{j}")]] for j in range(4)]
    assert att[0] < att[1] < att[2] < att[3]
    # causal pairs of chunk j: Σ_{i=8192j}^{8192(j+1)-1} (i+1)
    pairs = [sum(range(8192 * j + 1, 8192 * (j + 1) + 1)) for j in range(4)]
    assert [a / att[0] for a in att] == pytest.approx([p / pairs[0] for p in pairs], rel=0.02)
    busy = np.zeros((4, 4))
    send = np.zeros((4, 4))
    for i, op in enumerate(g.ops):
        j = dict(op.params).get("micro_batch", 0)
        if op.name.startswith("pp.send"):
            send[op.device, j] += s.duration[0, i]
        elif op.stream == "compute":
            busy[op.device, j] += s.duration[0, i]
    fin = np.zeros((4, 4))
    sent = np.zeros((4, 4))
    for j in range(4):
        for st in range(4):
            ready = max(fin[st, j - 1] if j else 0.0, sent[st - 1, j] if st else 0.0)
            fin[st, j] = ready + busy[st, j]
            sent[st, j] = max(fin[st, j], sent[st, j - 1] if j else 0.0) + send[st, j]
    assert s.forward[0] == pytest.approx(fin[3, 3], rel=1e-9)
    # pipelining one prompt beats running it on one stage, but cannot beat a perfect 4-way split
    flat = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:32768"]), "gb200").schedule().forward[0]
    assert flat / 4 < s.forward[0] < flat
