"""Real checkpoints: families from model_type, parameter counts against the model cards, bytes per parameter
from the checkpoint's quantization, DSA, redundant experts and MTP. Test data: graphsim/configs/hf (the bundled public
HF configs, see its NOTICE.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import fmt
from graphsim.models import load_model
from graphsim.models.families import FAMILIES

DATA = Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "hf"
CONFIGS = sorted(p for p in DATA.glob("*_config.json") if not p.name.endswith("hf_quant_config.json"))


def cfg(name: str) -> str:
    return str(DATA / f"{name}_config.json")


def close_to_card(value: float, card: float, digits: int) -> bool:
    """Within 1 % of the card's figure, or within one unit of the last digit the card gives (in billions):
    cards round or truncate ("3.3B" for Qwen3-30B-A3B's 3.35 B)."""
    return abs(value - card) <= max(0.01 * card, 10.0 ** -digits)


# (config, total B, active B, active convention, decimals the card gives, source)
CARDS = [
    ("meta-llama--Meta-Llama-3.1-8B", 8.03, None, None, 2, "HF safetensors: 8.03B params"),
    ("meta-llama--Meta-Llama-3.1-70B", 70.6, None, None, 1, "HF safetensors: 70.6B params"),
    ("meta-llama--Meta-Llama-3.1-405B", 406, None, None, 0, "HF safetensors: 406B params"),
    ("Qwen--Qwen3-0.6B", 0.6, None, None, 1, "Qwen3-0.6B card: 0.6B"),
    ("Qwen--Qwen3-8B", 8.2, None, None, 1, "Qwen3-8B card: Number of Parameters 8.2B"),
    ("Qwen--Qwen3-32B", 32.8, None, None, 1, "Qwen3-32B card: 32.8B"),
    ("Qwen--Qwen3-30B-A3B", 30.5, 3.3, "with_embeddings", 1, "Qwen3-30B-A3B card: 30.5B total, 3.3B activated"),
    ("Qwen--Qwen3-235B-A22B", 235, 22, "with_embeddings", 0, "Qwen3-235B-A22B card: 235B total, 22B activated"),
    ("mistralai--Mixtral-8x7B-v0.1", 46.7, 12.9, "with_embeddings", 1, "Mistral AI, Mixtral of experts: 46.7B, 12.9B per token"),
    ("mistralai--Mixtral-8x22B-v0.1", 141, 39, "with_embeddings", 0, "Mistral AI, Mixtral 8x22B: 141B, 39B active"),
    ("openai--gpt-oss-120b", 116.83, 5.13, "per_token", 2, "gpt-oss model card, Table 1: 116.83B total, 5.13B active"),
    ("openai--gpt-oss-20b", 20.91, 3.61, "per_token", 2, "gpt-oss model card, Table 1: 20.91B total, 3.61B active"),
    ("meta-llama--Llama-4-Maverick-17B-128E-Instruct", 400, 17, "with_embeddings", 0, "Llama 4 card: 400B total, 17B active"),
    ("deepseek-ai--DeepSeek-V3", 671, 37, "per_token", 0, "DeepSeek-V3 report: 671B total, 37B activated"),
    ("moonshotai--Kimi-K2-Instruct", 1026, 32, "per_token", 0, "Kimi K2 card: 1T total (1.03T), 32B activated"),
    ("zai-org--GLM-5", 744, None, None, 0, "GLM-5 card: 744B parameters"),
    ("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 31.6, 3.2, "per_token", 1,
     "Nemotron 3 Nano card: 31.6B total, 3.2B active (3.6B including embeddings)"),
    ("Qwen--Qwen3.5-397B-A17B", 397, 17, "with_embeddings", 0, "Qwen3.5-397B-A17B: 397B total, 17B activated"),
    ("MiniMaxAI--MiniMax-M2.5", 229, 10, "per_token", 0, "MiniMax-M2.5 card: 229B total, 10B activated"),
]


@pytest.mark.parametrize("name,total,active,conv,digits,source", CARDS, ids=[c[0] for c in CARDS])
def test_params_match_model_cards(name, total, active, conv, digits, source):
    counts = load_model(cfg(name)).param_counts()
    assert close_to_card(counts["total_params"] / 1e9, total, digits), (source, counts)
    if active is not None:
        key = "active_params_per_token" if conv == "per_token" else "active_params_with_embeddings"
        assert close_to_card(counts[key] / 1e9, active, digits), (source, counts)
    assert counts["active_params_per_token"] <= counts["active_params_with_embeddings"] <= counts["total_params"]


def test_nemotron_nano_both_conventions():
    # "3.2B active (3.6B including embeddings)" (Nemotron 3 Nano card): the two keys are the two conventions
    c = load_model(cfg("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")).param_counts()
    assert close_to_card(c["active_params_per_token"] / 1e9, 3.2, 1)
    assert close_to_card(c["active_params_with_embeddings"] / 1e9, 3.6, 1)


def test_most_configs_load_and_refusals_name_what_is_accepted():
    loaded, refused = [], []
    for p in CONFIGS:
        try:
            load_model(str(p)).weights()
            loaded.append(p.name)
        except GraphsimError as e:
            refused.append((p.name, str(e)))
            assert "accepted:" in str(e) or "not modelled" in str(e), e
            if str(e).startswith("model_type"):
                for mt in ("llama", "qwen3_moe", "gpt_oss", "nemotron_h", "deepseek_v32"):
                    assert mt in str(e)
    assert len(loaded) / len(CONFIGS) >= 0.75, refused


def test_unsupported_family_names_the_missing_mechanism():
    with pytest.raises(GraphsimError, match="Kimi Delta Attention"):
        load_model(cfg("moonshotai--Kimi-K3"))
    with pytest.raises(GraphsimError, match=r"model_type: 'gemma4' needs Gemma 4's per-type attention.*accepted: .*llama"):
        load_model(cfg("google--gemma-4-26B-A4B"))
    with pytest.raises(GraphsimError, match=r"model_type: unsupported model_type 'bert'; accepted: .*step3p7"):
        load_model({"model_type": "bert", "hidden_size": 8})
    # Step-3.7-Flash: sliding (512) / full GQA layers, 3 dense layers, then 288 experts top-8 + a shared expert
    m = load_model(cfg("stepfun-ai--Step-3.7-Flash"))
    assert [l.mixer.window for l in m.cfg.layers[:6]] == [0, 512, 512, 512, 0, 512]
    assert [isinstance(l.ffn, int) for l in m.cfg.layers[:4]] == [True, True, True, False]
    assert m.cfg.layers[3].ffn.shared_inter == 1280 and m.cfg.layers[3].ffn.experts == 288


def _bytes_per_param(model, pred) -> float:
    ts = [t for t in model.weights() if pred(t.name)]
    return sum(t.nbytes for t in ts) / sum(t.elems for t in ts)


def test_quantization_read_from_the_checkpoint():
    # Llama-3.1-70B-Instruct-FP8 (ModelOpt, hf_quant_config.json: FP8 per tensor, lm_head excluded):
    # every projection 1 B/param; embedding and head BF16 -> the checkpoint is ~1.03 B/param, not 2
    m = load_model(cfg("nvidia--Llama-3.1-70B-Instruct-FP8"))
    assert _bytes_per_param(m, lambda n: n.endswith(("wqkv", "wo", "gate_up", "down"))) == 1.0
    assert {t.format.name for t in m.weights() if t.name in ("embed", "head")} == {"bf16"}
    total = sum(t.nbytes for t in m.weights()) / sum(t.elems for t in m.weights())
    assert 1.0 < total < 1.05
    # NVFP4 DeepSeek (hf_quant_config: NVFP4 group 16; q/kv projections excluded, o_proj quantized): experts
    # at 4 + 8/16 bits
    m = load_model(cfg("nvidia--DeepSeek-V3.1-NVFP4"))
    assert _bytes_per_param(m, lambda n: n.startswith("layers.") and n.endswith("moe.experts")) == 0.5 + 1 / 16
    assert _bytes_per_param(m, lambda n: n.startswith("layers.") and (".attn.wq" in n or ".attn.wkv" in n)) == 2.0
    assert _bytes_per_param(m, lambda n: n.startswith("layers.") and n.endswith(".attn.wo")) == 0.5 + 1 / 16
    # gpt-oss MXFP4 experts (E8M0 scale per 32), attention and router BF16
    m = load_model(cfg("openai--gpt-oss-120b"))
    assert _bytes_per_param(m, lambda n: n.endswith("moe.experts")) == 0.5 + 1 / 32
    assert _bytes_per_param(m, lambda n: ".attn." in n) == 2.0
    # Kimi K2.5 (compressed-tensors int4, group 32, BF16 scales; attention, shared and dense MLPs ignored)
    m = load_model(cfg("moonshotai--Kimi-K2.5"))
    assert _bytes_per_param(m, lambda n: n.endswith("moe.experts")) == 0.5 + 2 / 32
    assert _bytes_per_param(m, lambda n: "shared" in n or ".attn.w" in n) == 2.0
    # ModelOpt MIXED_PRECISION listing each expert's projections (W4A16_NVFP4) and the Mamba in/out
    # projections (FP8): graphsim's one experts tensor per layer takes its experts' format
    m = load_model(cfg("nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"))
    assert {t.format.name for t in m.weights() if t.name.endswith("moe.experts")} == {"nvfp4_w4a16"}
    assert {t.format.name for t in m.weights() if t.name.endswith("mixer.in_proj")} == {"fp8"}
    # DeepSeek-V3's own FP8 release: 128x128 blocks with an fp32 scale each; GLM-5 (no quantization) is BF16
    assert _bytes_per_param(load_model(cfg("deepseek-ai--DeepSeek-V3")), lambda n: n.endswith("experts")) == 1 + 4 / 128**2
    assert _bytes_per_param(load_model(cfg("zai-org--GLM-5")), lambda n: n.endswith("experts")) == 2.0


def test_quantization_from_a_checkpoint_directory(tmp_path):
    (tmp_path / "config.json").write_text((DATA / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text(
        (DATA / "nvidia--Llama-3.1-70B-Instruct-FP8_hf_quant_config.json").read_text())
    m = load_model(str(tmp_path))
    assert m.name == tmp_path.name
    assert {t.format.name for t in m.weights() if t.name.endswith("wqkv")} == {"fp8"}
    assert m.kv_format == "fp8"  # kv_cache_quant_algo: FP8


def test_weights_override_and_fallback_precision():
    m = load_model("llama-3.1-70b", weights="nvfp4")
    assert {t.format.name for t in m.weights() if t.name.endswith("wqkv")} == {"nvfp4"}
    c = gs.compile_plan(m, gs.Plan(["prefill:2048"]), "gb200")
    assert {op.precision for op in c.graph.ops if op.name.endswith("wqkv")} == {"fp4"}
    # H100 has no FP4 rate: the descriptor runs the GEMM at the next rate it has (FP8)
    assert gs.load_hw("h100").resolve_precision("fp4") == "fp8"
    with pytest.raises(GraphsimError, match="weights: unknown weight format 'int3'"):
        load_model("llama-3.1-70b", weights="int3")


def test_dsa_makes_long_context_decode_faster_by_the_indexers_arithmetic():
    # DeepSeek-V3.2 = V3 shapes + a lightning indexer selecting 2,048 positions per query: at 128K context the
    # MLA core reads 2,048 latents instead of 131,072; the indexer reads one 132 B FP8 key per position
    plan = gs.Plan(["decode:131072x16"], gs.ParallelMapping(tp=8))
    v3 = gs.compile_plan(load_model(cfg("deepseek-ai--DeepSeek-V3")), plan, "gb200").report()
    v32m = load_model(cfg("deepseek-ai--DeepSeek-V3.2"))
    v32 = gs.compile_plan(v32m, plan, "gb200").report()
    assert v32.forward_s < 0.5 * v3.forward_s
    g = gs.compile_plan(v32m, plan, "gb200").graph
    score = next(op for op in g.ops if op.name == "layers.5.indexer.score")
    assert "fp8" in score.precision and "causal_pairs" in str(score.cost)
    assert v32m.index_key_bytes() == 128 + 4
    # equal at a context within the selection: every position is selected
    short = gs.Plan(["decode:1024x16"], gs.ParallelMapping(tp=8))
    a = gs.compile_plan(load_model(cfg("deepseek-ai--DeepSeek-V3")), short, "gb200").schedule()
    b = gs.compile_plan(v32m, short, "gb200").schedule()
    assert b.forward[0] > a.forward[0]  # the indexer's own work, nothing saved yet


def test_redundant_experts_ep48_from_the_cli(capsys):
    from graphsim.cli import main

    args = ["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--dp", "48", "--ep", "48", "--request",
            "decode:2000x67584", "--json"]
    assert main(args) == 2
    assert "mapping.ep: 48 does not divide routed experts (256)" in capsys.readouterr().err
    assert main([*args, "--redundant-experts", "32"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["forward_s"] > 0
    # memory: (256 + 32) / 48 = 6 expert slots per GPU instead of 256 / 8 ... ; routing unchanged
    m0, m32 = load_model("deepseek-v3"), load_model("deepseek-v3", redundant_experts=32)
    e0 = sum(t.elems for t in m0.weights() if t.name.endswith("moe.experts"))
    e32 = sum(t.elems for t in m32.weights() if t.name.endswith("moe.experts"))
    assert e32 * 256 == e0 * 288
    assert m32.param_counts()["active_params_per_token"] == m0.param_counts()["active_params_per_token"]


def test_mtp_raises_tokens_per_step_as_the_acceptance_implies():
    m = load_model("deepseek-v3")
    base = gs.compile_plan(m, gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=8)), "gb200").report()
    acc = (0.8, 0.6, 0.4)
    pol = gs.Policies(mtp=3, acceptance=acc)
    # the CLI's --mtp 3 verifies 1 + 3 positions per step
    step = gs.Plan([gs.Request("decode", 4096, 64, new=4)], gs.ParallelMapping(tp=8), pol)
    c = gs.compile_plan(m, step, "gb200")
    r = c.report()
    emitted = 1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.4  # E[emitted] with the bonus token
    assert r.tokens["itl_s"] == pytest.approx(r.forward_s / emitted, rel=1e-9)
    assert r.tokens["decode_tokens"] == pytest.approx(64 * emitted)
    assert r.forward_s > base.forward_s and r.tokens["itl_s"] < base.tokens["itl_s"]
    assert "draft" in {op.stage for op in c.graph.ops}
    assert sum(op.name.endswith(".eh_proj") for op in c.graph.ops) == 3  # three sequential MTP passes
    with pytest.raises(GraphsimError, match="policies.mtp"):
        gs.compile_plan(load_model(cfg("Qwen--Qwen3-8B")), gs.Plan(["decode:64"], policies=gs.Policies(mtp=1)), "gb200")
    with pytest.raises(GraphsimError, match="policies.acceptance"):
        gs.compile_plan(m, gs.Plan(["decode:64"], policies=gs.Policies(mtp=3, acceptance=(0.5,))), "gb200")


def test_memory_json_reports_params_and_formats(capsys):
    from graphsim.cli import main

    assert main(["memory", cfg("openai--gpt-oss-120b"), "--context", "4096", "--json"]) in (0, None)
    d = json.loads(capsys.readouterr().out)["weights"]
    assert d["total_params"] == pytest.approx(116.83e9, rel=0.005)
    assert d["active_params_per_token"] == pytest.approx(5.13e9, rel=0.01)
    assert {f["format"]: f["bytes_per_param"] for f in d["by_format"]}["mxfp4"] == fmt("mxfp4").bytes_per_elem
    assert d["quantization"] == "quantization_config"
    assert main(["memory", cfg("openai--gpt-oss-120b"), "--context", "4096"]) in (0, None)
    assert "B active per token" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["Qwen--Qwen3.5-27B", "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                                  "openai--gpt-oss-20b", "meta-llama--Llama-4-Scout-17B-16E-Instruct"])
def test_hybrid_and_windowed_caches_are_monotone_and_bounded(name):
    m = load_model(cfg(name))
    sizes = [m.kv_bytes(n) for n in (1, 127, 128, 129, 4096, 8192, 8193, 100_000)]
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))
    c = gs.compile_plan(m, gs.Plan(["decode:8192x8"], gs.ParallelMapping(tp=2)), "gb200").report()
    assert 0 < c.forward_s < 1


def test_recurrent_state_is_per_request():
    # Qwen3.5-27B: 48 Gated DeltaNet layers of 48 value heads x 128 x 128 FP32 state (+ conv window) and 16
    # full-attention layers of 4 KV heads x 256 x 2 BF16 per position
    m = load_model(cfg("Qwen--Qwen3.5-27B"))
    state = 48 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 48 * 128) * 2
    per_pos = 4 * 256 * 2 * 2
    assert m.kv_bytes(1000) == 48 * state + 16 * 1000 * per_pos


def test_every_family_is_registered_once():
    assert {"llama", "qwen3", "qwen3_moe", "mixtral", "gpt_oss", "llama4_text", "deepseek_v3", "kimi_k2",
            "deepseek_v32", "glm_moe_dsa", "qwen3_5", "nemotron_h", "deepseek_v4", "deepseek_v41"} <= set(FAMILIES)


def test_v41_parameter_counts_match_the_facts():
    # V41_FACTS §12: ≈ 551.6 B trunk + 196.9 B Engram + 14.2 B DSpark + 0.5 B vision ≈ 763 B; active ≈ 15.1 B over
    # the 40 trunk layers (attention + 6 routed + 1 shared expert + gate + mHC); a text token also runs the head
    # and the Engram projections, not the vision tower, and reads one row of each table
    m = load_model("deepseek-v4.1-flash")
    c = m.param_counts()
    assert c["shipped_params"] / 1e9 == pytest.approx(763, abs=1.0)
    dspark = sum(t.elems for t in m.weights() if t.group == "dspark")
    assert c["total_params"] == c["shipped_params"] - dspark  # DSpark is loaded only when it runs
    head = next(t.elems for t in m.weights() if t.name == "head.weight")
    proj = sum(t.elems for t in m.weights() if t.group == "engram" and t.role == "weight" and t.name.endswith(".wkv"))
    assert (c["active_params_per_token"] - head - proj) / 1e9 == pytest.approx(15.1, rel=0.01)


def test_quantization_module_matching():
    from graphsim.core.quant import Quantization, from_config

    q = Quantization("nvfp4", "t", exclude=("lm_head", "model.layers.0*", "re:.*self_attn.*", "*.shared_expert.*"),
                     layers=())
    assert q.format_of("layers.0.mlp.experts") == "bf16"  # glob over a whole layer
    assert q.format_of("layers.10.mlp.experts") == "nvfp4"  # "model.layers.0*" does not reach layer 10
    assert q.format_of("layers.3.self_attn.q_proj") == "bf16"  # regex
    assert q.format_of("layers.3.mlp.shared_expert.gate_proj") == "bf16"
    assert q.format_of("layers.3.mlp.experts") == "nvfp4" and q.format_of("lm_head") == "bf16"
    mixed = from_config({}, {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.layers.1.mlp.experts.0.down_proj": {"quant_algo": "NVFP4"},  # a part of graphsim's tensor
        "backbone.layers.2.mixer": {"quant_algo": "FP8"},  # a module enclosing graphsim's tensor
        "model.layers.3.mlp.*": {"quant_algo": "W4A8_AWQ"}}}})
    assert mixed.format_of("layers.1.mlp.experts") == "nvfp4"
    assert mixed.format_of("layers.2.mixer.in_proj") == "fp8"
    assert mixed.format_of("layers.3.mlp.gate_proj") == "w4a8_g128"
    assert mixed.format_of("layers.4.mlp.gate_proj") == "bf16"  # not listed: MIXED_PRECISION leaves it BF16


@pytest.mark.parametrize("mt", [["glm_moe_dsa"], {"a": 1}, 3])
def test_model_type_of_the_wrong_type_is_named(mt):
    # found by the fuzz run: a list model_type was an unhashable-type crash
    with pytest.raises(GraphsimError, match="model_type: unsupported model_type"):
        load_model({"model_type": mt, "architectures": [["x"]], "hidden_size": 8})
