"""Closed-form checks on the core models (DeepSeek-V3, Llama-3.1-70B) and the sharding pass."""
import json
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import graphsim as gs
from graphsim.core.builder import GraphBuilder
from graphsim.core.ir import COMPONENTS, Feature
from graphsim.lowering.evaluate import evaluate_reference
from graphsim.passes.sharding import apply_mapping

V3 = json.loads((resources.files("graphsim") / "configs" / "deepseek-v3.json").read_text())


def test_gemm_flops_and_bytes():
    # Y = X·W with X [T, k], W [k, n] FP8: 2kn FLOPs per token, k·n weight bytes once, bf16 in/out
    b = GraphBuilder("g")
    b.token_set("all")
    with b.stage("s"):
        b.gemm("w", "all", 7168, 1536, weight_format="fp8", act_in="fp8", act_out="bf16")
        b.gemm("u", "all", 7168, 1536, weight="w", act_in="bf16", act_out="bf16")
        b.moe_experts("e", "all", experts=8, top_k=2, hidden=64, inter=32, weight_format="fp4_ue8m0_32", act_in="fp8")
    g = b.build()
    vals = {Feature("one"): 1.0, Feature("active", "all"): 1.0, Feature("tokens", "all"): 100.0}
    c = g.op("w").cost.evaluate(vals)
    assert c["flops_fp8"] == 2 * 7168 * 1536 * 100
    assert c["bytes_weight"] == 7168 * 1536
    assert c["bytes_act"] == 100 * (7168 * 1 + 1536 * 2)
    # a GEMM runs at its wider operand's rate: bf16 activations x FP8 weights -> bf16; FP8 x FP4 -> FP8
    assert g.op("u").cost.evaluate(vals)["flops_bf16"] == 2 * 7168 * 1536 * 100
    vals[Feature("experts_touched", "all", (8, 2))] = 8.0
    assert g.op("e").cost.evaluate(vals)["flops_fp8"] == 2 * 3 * 64 * 32 * 2 * 100
    assert g.op("e").cost.evaluate(vals)["flops_fp4"] == 0


def test_v3_params_from_config():
    # Derived from configs/deepseek-v3.json (V41_FACTS §13): MLA + 3 dense + 58 MoE layers, MTP excluded.
    c = V3
    h, L, dense = c["hidden_size"], c["num_hidden_layers"], c["first_k_dense_replace"]
    heads, ql, kl, nope, rope, v = (c[k] for k in ("num_attention_heads", "q_lora_rank", "kv_lora_rank",
                                                    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    attn = h * ql + ql * heads * (nope + rope) + h * (kl + rope) + kl * heads * (nope + v) + heads * v * h
    norms = 2 * h + ql + kl
    # routed + shared experts, the router and its per-expert score-correction bias (e_score_correction_bias)
    moe = (c["n_routed_experts"] * 3 * h * c["moe_intermediate_size"] + 3 * h * c["moe_intermediate_size"]
           + h * c["n_routed_experts"] + c["n_routed_experts"])
    mlp = 3 * h * c["intermediate_size"]
    total = L * (attn + norms) + dense * mlp + (L - dense) * moe + 2 * c["vocab_size"] * h + h
    m = gs.load_model("deepseek-v3")
    assert sum(t.elems for t in m.weights() if t.group != "mtp") == total
    assert m.param_counts()["total_params"] == total
    assert abs(total / 1e9 - 671) / 671 < 0.005  # "671 B total" (DeepSeek-V3 report)
    # the shipped MTP module (eh_proj 2h x h, three norms, one MoE layer): "685B = 671B + 14B MTP" (HF card)
    mtp = 2 * h * h + 3 * h + attn + norms + moe
    assert m.param_counts()["shipped_params"] == total + mtp
    assert abs((total + mtp) / 1e9 - 685) / 685 < 0.005
    active = m.active_params_per_token()
    assert abs(active / 1e9 - 37) / 37 < 0.02  # "37 B activated" (DeepSeek-V3 report)


def test_v3_mla_kv_bytes():
    # MLA cache: 576 elements per layer per token x 61 layers (V41_FACTS §13)
    assert gs.load_model("deepseek-v3").kv_bytes(1) == 576 * 61 * 2 == 70_272
    assert gs.load_model("deepseek-v3", kv_format="fp8").kv_bytes(1) == 576 * 61 == 35_136


def test_llama_70b_params():
    m = gs.load_model("llama-3.1-70b")
    assert abs(sum(t.elems for t in m.weights()) / 1e9 - 70.6) < 0.1  # Llama-3.1-70B model card: 70.6 B


@pytest.mark.parametrize("mapping", [gs.ParallelMapping(tp=4), gs.ParallelMapping(tp=2, dp=4, ep=8),
                                     gs.ParallelMapping(dp=8, ep=8)])
def test_shards_sum_to_whole(mapping):
    # every op's FLOPs, weight bytes and cache bytes, summed over the ranks that split it, equal the whole
    m = gs.load_model("deepseek-v3")
    g = m.build(("decode", "prefill"))
    s = apply_mapping(g, mapping, 72)
    from graphsim.passes.sharding import QUERY_FEATURES, layout_of, split_factors

    layout = layout_of(g, mapping, 72)
    for op in g.ops:
        work, weight = split_factors(op, mapping)
        lay = layout.of(op.name)
        if lay.replicate_weights:  # the scattered MoE block's shared expert: its weights whole on every TP rank
            weight /= mapping.tp
        sharded = s.op(op.name)
        kvh = op.info.kv_heads
        for (c, f, v), (c2, f2, v2) in zip(op.cost.terms, sharded.cost.terms):
            ranks = weight if c == "bytes_weight" else work
            if c != "bytes_weight" and f.kind in QUERY_FEATURES:
                ranks *= lay.token_div  # TP ranks of a scattered layout split the tokens too
            if c in ("bytes_kv", "bytes_c2c", "bytes_disk") and kvh and "tp" in op.split:
                ranks = work / mapping.tp * min(mapping.tp, kvh)  # a replicated latent is read (and restored) whole per rank
            assert (c, f) == (c2, f2) and abs(v2 * ranks - v) <= 1e-9 * abs(v)


def test_bad_mappings_are_rejected():
    m = gs.load_model("deepseek-v3")
    with pytest.raises(gs.GraphsimError, match="mapping.tp"):
        m.validate_mapping(gs.ParallelMapping(tp=3))
    with pytest.raises(gs.GraphsimError, match="mapping.ep"):
        m.validate_mapping(gs.ParallelMapping(dp=6, ep=6))  # 6 does not divide 256 experts
    with pytest.raises(gs.GraphsimError, match="mapping.ep"):
        gs.ParallelMapping(tp=2, ep=4)  # ep must divide the tp·dp ranks


def _point(c, reqs):
    plan = gs.Plan(reqs, c.plan.mapping)
    return evaluate_reference(c.program, plan.workload(), c.unit_time())


def test_heterogeneous_batch_tokens_add_weights_do_not(gb200):
    m = gs.load_model("deepseek-v3")
    both = gs.compile_plan(m, gs.Plan(["decode:4096x8", "prefill:1024"]), gb200)
    s = both.schedule()
    tot = s.components[0].sum(axis=0)
    one_a = gs.compile_plan(m, gs.Plan(["decode:4096x8"]), gb200).schedule().components[0].sum(axis=0)
    one_b = gs.compile_plan(m, gs.Plan(["prefill:1024"]), gb200).schedule().components[0].sum(axis=0)
    k = COMPONENTS.index
    # token-proportional work adds (FP8 GEMM flops of the batch = sum of each request alone)
    assert abs(tot[k("flops_fp8")] - (one_a[k("flops_fp8")] + one_b[k("flops_fp8")])) < 1e-6 * tot[k("flops_fp8")]
    # dense weights are read once per forward, not once per request kind
    assert tot[k("bytes_weight")] < one_a[k("bytes_weight")] + one_b[k("bytes_weight")]
    assert both.report().tokens["prefill_tokens"] == 1024 and both.report().tokens["decode_tokens"] == 8


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 20000), ctx=st.integers(1, 100000), cnt=st.integers(1, 64),
       dn=st.integers(0, 5000), dc=st.integers(0, 5000))
def test_monotonic_in_tokens_and_context(n, ctx, cnt, dn, dc):
    # more tokens or more context never makes any op, or the forward, faster
    c = _compiled()
    base = gs.Workload(("prefill", "decode"), [[1, cnt]], [[n, 1]], [[0, ctx]])
    more = gs.Workload(("prefill", "decode"), [[1, cnt]], [[n + dn, 1]], [[0, ctx + dc]])
    a = evaluate_reference(c.program, base, c.unit_time())
    b = evaluate_reference(c.program, more, c.unit_time())
    assert np.all(b.duration >= a.duration - 1e-15)
    assert b.forward[0] >= a.forward[0]


_CACHE = {}


def _compiled():
    if "c" not in _CACHE:
        _CACHE["c"] = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:10", "decode:10"], gs.ParallelMapping(tp=4, ep=4)), "gb200")
    return _CACHE["c"]


def test_jax_sweep_matches_reference_on_v3():
    c = _compiled()
    rng = np.random.default_rng(1)
    P = 200
    wl = gs.Workload(("prefill", "decode"), np.c_[np.ones(P), rng.integers(1, 256, P)],
                     np.c_[rng.integers(1, 32768, P), np.ones(P)], np.c_[np.zeros(P), rng.integers(1, 131072, P)])
    ref = evaluate_reference(c.program, wl, c.unit_time())
    jx = c.evaluate(wl)
    np.testing.assert_allclose(jx["forward"], ref.forward, rtol=1e-9)


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v4.1-flash"])
def test_routed_and_shared_expert_outputs_share_one_all_reduce(model):
    # ep=1, tp=4: routed (expert-TP) and shared (TP) outputs land on the same 4 ranks -> summed, reduced once
    g = gs.compile_plan(model, gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=4)), "gb200").graph
    ars = [op for op in g.ops if op.layer == 5 and op.kind == "collective" and "all_reduce" in op.name]
    live = [op for op in ars if op.cost.terms]
    assert len(ars) == 3 and len(live) == 2  # wo_b's, and one for the MoE block
    # tp=2, dp=2: the expert group spans 4 ranks, the shared expert's 2: both reductions stay
    g = gs.compile_plan(model, gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=2, dp=2)), "gb200").graph
    ars = [op for op in g.ops if op.layer == 5 and op.kind == "collective" and "all_reduce" in op.name]
    assert len([op for op in ars if op.cost.terms]) == 3
