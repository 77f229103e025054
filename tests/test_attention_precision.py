"""Attention at its real precision and the softmax's exponentials as a roofline unit (issue: SOL as a true
lower bound). Closed forms: DeepSeek-V3 MLA prefill attends N(N+1)/2 causal pairs per layer, 2·(192+128)
FLOPs per pair and head, one exponential per pair and head (V41_FACTS §13 shapes)."""
from __future__ import annotations

import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENTS

N = 131072
PAIRS = N * (N + 1) // 2
HEADS = 128
FLOPS = PAIRS * HEADS * 2 * (192 + 128)
EXPS = PAIRS * HEADS


def _core(hw: str, precision: str, tp: int = 1, model: str = "deepseek-v3", op: str = "layers.3.attn_prefill"):
    plan = gs.Plan([f"prefill:{N}"], gs.ParallelMapping(tp=tp), gs.Policies(attention_precision=precision))
    c = gs.compile_plan(model, plan, hw)
    s = c.schedule()
    i = c.graph.op_index[op]
    return c, float(s.duration[0, i]), s.bound(0)[i], dict(zip(COMPONENTS, s.components[0, i]))


@pytest.mark.parametrize("hw", ["gb200", "gb300"])
def test_fp8_attention_is_the_max_of_tensor_and_sfu_time(hw):
    c, t, bound, comp = _core(hw, "fp8")
    assert comp["flops_fp8"] == FLOPS and comp["flops_bf16"] == 0
    assert comp["exps"] == EXPS
    want = max(FLOPS / c.hw.peak("fp8"), EXPS / c.hw.exp_rate)
    assert t == pytest.approx(want, rel=1e-12)
    # GB200's 5 T exp/s make the 128K prefill softmax-bound; GB300's 10.7 T leave it tensor-bound
    assert bound == {"gb200": "sfu", "gb300": "compute"}[hw]


def test_fp8_attention_stays_below_the_published_fmha_kernel():
    """Published FP8 FMHA for DeepSeek's 128K prefill (issue #10, shared/reference/hardware.md "FMHA 1.35x
    GB200 at 128K"): 277 ms per layer on GB200, 205 ms on GB300. A SOL above them would be beaten."""
    published = {"gb200": 277e-3, "gb300": 205e-3}
    times = {hw: _core(hw, "fp8")[1] for hw in published}
    for hw, t in times.items():
        assert t <= published[hw], hw
    # GB300 is faster by exactly the descriptors' ratio: SFU-bound GB200 vs tensor-bound GB300
    g2, g3 = gs.load_hw("gb200"), gs.load_hw("gb300")
    assert times["gb200"] / times["gb300"] == pytest.approx((EXPS / g2.exp_rate) / (FLOPS / g3.peak("fp8")), rel=1e-12)
    # per rank with TP8 the heads split 8 ways: the same ratio, 1/8 of the time
    assert _core("gb300", "fp8", tp=8)[1] == pytest.approx(times["gb300"] / 8, rel=1e-12)


def test_bf16_attention_keeps_the_bf16_rate():
    c, t, bound, comp = _core("gb200", "bf16")
    assert comp["flops_bf16"] == FLOPS
    assert t == pytest.approx(FLOPS / 2.5e15, rel=1e-12)  # hardware.md: BF16 2.5 PF dense
    assert bound == "compute"
    # auto = the checkpoint's BF16 MLA cache -> BF16 attention, today's rate
    assert _core("gb200", "auto")[1] == t


def test_explicit_precision_needs_its_tensor_rate():
    with pytest.raises(GraphsimError, match="policies.attention_precision.*H100 has no fp4"):
        gs.compile_plan("deepseek-v3", gs.Plan(["decode:100"], policies=gs.Policies(attention_precision="fp4")), "h100")
    gs.compile_plan("deepseek-v3", gs.Plan(["decode:100"], policies=gs.Policies(attention_precision="fp4")), "gb300")
    with pytest.raises(GraphsimError, match="policies.attention_precision"):
        gs.Policies(attention_precision="int4")


def test_fp8_attention_reads_an_fp8_cache():
    """FP8 attention (FP8 Q/K/V and FP8 KV, as SGLang/TRT-LLM run it): the MLA latent cache is 576 B per
    token and layer instead of 1,152 (V41_FACTS §13: 576 elements)."""
    m = gs.load_model("deepseek-v3")
    assert m.kv_bytes(1000) == 1000 * 61 * 576 * 2
    assert m.kv_bytes(1000, gs.Policies(attention_precision="fp8")) == 1000 * 61 * 576
    c = gs.compile_plan(m, gs.Plan(["decode:4096x8"], policies=gs.Policies(attention_precision="fp8")), "gb200")
    s = c.schedule()
    i = c.graph.op_index["layers.3.attn_decode"]
    assert s.components[0, i, COMPONENTS.index("bytes_kv")] == 8 * 4097 * 576
    assert c.report().memory["kv_gib"] == pytest.approx(8 * 4097 * 61 * 576 / 2**30)


def test_checkpoint_kv_dtype_sets_the_default():
    from graphsim.core.config import load_config

    cfg = load_config("deepseek-v3")
    fp8 = {**cfg, "quantization_config": {**cfg["quantization_config"], "kv_cache_quant_algo": "FP8"}}
    m = gs.load_model(fp8)
    assert m.kv_format == "fp8" and m.attention_precision() == "fp8"
    scheme = {**cfg, "quantization_config": {**cfg["quantization_config"],
                                             "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
    assert gs.load_model(scheme).kv_format == "fp8"
    with pytest.raises(GraphsimError, match="kv_cache_dtype"):
        gs.load_model({**cfg, "kv_cache_dtype": "fp3"})


def test_v41_attention_defaults_to_bf16_and_keeps_its_cache_formats():
    """V41_FACTS §8: main KV FP4 is a storage format, dequantized before attention (BF16 math); an
    explicit FP8 attention changes the rate, never the checkpoint's cache layout."""
    m = gs.load_model("deepseek-v4.1-flash")
    assert m.attention_precision() == "bf16"
    kv = m.kv_bytes(4096)
    assert m.kv_bytes(4096, gs.Policies(attention_precision="fp8")) == kv
    c = gs.compile_plan(m, gs.Plan(["decode:4096"], policies=gs.Policies(attention_precision="fp8")), "gb200")
    op = c.graph.op("layers.29.attn.sparse")
    assert op.precision == "fp8" and {cc for cc, _, _ in op.cost.terms} >= {"flops_fp8", "exps"}


@pytest.mark.parametrize("hw,rate", [("gb200", 10e15), ("h200", 1979e12)])
def test_v41_indexer_scores_at_the_fp4_rate_or_fp8_without_it(hw, rate):
    """V41_FACTS §8: index Q/K are MXFP4 -> the FP4 tensor rate; H200 has none and runs FP8 (hardware.md)."""
    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:65536"]), hw)
    op = c.graph.op("layers.20.indexer.score")
    assert op.precision == "fp4"
    assert c.unit_time()[COMPONENTS.index("flops_fp4")] == pytest.approx(1 / rate)


def test_builder_attention_counts_scores_and_sink_logits():
    """One exponential per (query, key, head) score plus, with sinks, one per (query, head) sink logit:
    a 100-token causal prefill with 4 heads normalises 4·5050 scores and 4·100 sink logits."""
    from graphsim.core.builder import GraphBuilder
    from graphsim.core.ir import Feature
    from graphsim.lowering.evaluate import evaluate_reference, unit_time
    from graphsim.lowering.program import lower

    b = GraphBuilder("toy")
    b.token_set("all")
    with b.stage("s"):
        b.attention("attn", "all", pairs=Feature("causal_pairs", "all"), flops_per_pair=4 * 64 * 4, heads=4,
                    precision="fp8", sinks=True)
    g = b.build()
    s = evaluate_reference(lower(g), gs.Workload(("prefill",), [[1]], [[100]], [[0]]),
                           unit_time(gs.load_hw("gb200").rates()))
    comp = dict(zip(COMPONENTS, s.components[0, 0]))
    assert comp["exps"] == 4 * 5050 + 4 * 100
    assert comp["flops_fp8"] == 4 * 64 * 4 * 5050
    assert "4 sink exps per query" in g.op("attn").formula
