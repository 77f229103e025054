"""Issue 25 item 3 (steps): an engine's request and token limits per step, chunked prompts and the host time of a
step price a prediction as the engine runs it; the SOL view and the SOL twin never pay them."""
from __future__ import annotations

import json

import numpy as np
import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.hw import load_profile
from graphsim.serving.search import SLA, Space, Traffic, _Search, kernels, search
from graphsim.serving import ENGINES, SETTABLE, expected_max_normal, hottest_rank_factor, prefill_steps
from graphsim.core.workload import Workload

GiB = 2.0**30
M = gs.ParallelMapping(tp=4, ep=4)
PROFILE = load_profile("practitioner")  # any profile makes a prediction
SPACE = Space(tp=(4,), ep=(4,), dp=(1,), batches=(8, 64), prefill_batches=(1,), modes=("agg",), refine=0)


def _forward(reqs, mapping, wl, profile=PROFILE):
    c = gs.compile_plan("deepseek-v3", gs.Plan(reqs, mapping), "gb200", profile)
    return np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], np.float64), c


def test_prefill_steps_cut_the_token_stream_or_pack_whole_prompts():
    e = (0, 10000, 0)
    # vLLM / SGLang: a 10,000-token prompt in an 8,192 budget is a chunk of 8,192, then 1,808 after it
    assert prefill_steps(1, 10000, 8192, True) == [((1, 8192, 0), e, e), ((1, 1808, 8192), e, e)]
    # three 4,000-token prompts first come first served: two whole and 192 of the third, then its 3,808
    assert prefill_steps(3, 4000, 8192, True) == [((1, 4000, 0), (1, 4000, 0), (1, 192, 0)),
                                                  ((1, 3808, 192), (0, 4000, 0), (0, 4000, 0))]
    # TensorRT-LLM without chunked prefill: ⌊8192/4000⌋ = 2 whole prompts a step; a longer prompt never runs
    assert [st[1][0] for st in prefill_steps(3, 4000, 8192, False)] == [2, 1]
    assert prefill_steps(1, 10000, 8192, False) is None
    assert prefill_steps(2, 4000, 8192, True) == [((0, 4000, 0), (2, 4000, 0), (0, 4000, 0))]


def test_documented_defaults_tiers_and_settings():
    v, t, s = ENGINES["vllm"], ENGINES["trtllm"], ENGINES["sglang"]
    # vLLM EngineArgs.get_batch_defaults: 1024 seqs / 8192 tokens at >= 70 GiB, 256 / 2048 below
    assert (v.on(80 * GiB).max_running, v.on(80 * GiB).step_tokens) == (1024, 8192)
    assert (v.on(48 * GiB).max_running, v.on(48 * GiB).step_tokens) == (256, 2048)
    # TensorRT-LLM BaseLlmArgs max_batch_size 2048, max_num_tokens 8192, no chunked prefill, graphs up to 128
    assert (t.max_running, t.step_tokens, t.chunked_prefill, t.graph_max_batch) == (2048, 8192, False, 128)
    # SGLang --chunked-prefill-size by GPU memory (8192 below 160 GiB, 16384 above), split over DP-attention ranks
    gb200, h200 = s.on(186 * GiB), s.on(141 * GiB)
    assert (gb200.step_tokens, h200.step_tokens, gb200.budget(4), gb200.max_running) == (16384, 8192, 4096.0, None)
    assert v.budget(4) == 8192.0  # vLLM: per engine core
    for e in ENGINES.values():  # every step term has its source (or its sourced 'no term' note)
        assert {"max_running", "step_tokens", "chunked_prefill", "graph_max_batch", "launch_us",
                "step_overhead_us"} <= {f for f, _ in e.sources}
    x = v.with_settings(["max_running=none", "launch_us=4", "chunked_prefill=false"])
    assert (x.max_running, x.launch_s, x.chunked_prefill) == (None, 4e-6, False)
    assert set(x.to_dict()) >= {k for k in SETTABLE}
    with pytest.raises(gs.GraphsimError, match=r"^engine_set: unknown engine term 'tokens'; allowed: memory_fraction"):
        v.with_settings(["tokens=1"])
    with pytest.raises(gs.GraphsimError, match=r"^engine_set.step_tokens: a whole number in \[1, .*\] or none, got"):
        v.with_settings(["step_tokens=8k"])


def test_step_time_is_the_longer_of_gpu_and_launches_plus_the_exposed_overhead():
    e = ENGINES["vllm"].with_settings(["launch_us=5", "graph_launch_us=20", "step_overhead_us=100"])
    gpu = np.array([1e-3, 1e-2])
    # no graph: max(gpu, K x launch) + overhead; a graph replay is one launch
    np.testing.assert_allclose(e.step_time(gpu, 1000), [5e-3 + 1e-4, 1e-2 + 1e-4])
    np.testing.assert_allclose(e.step_time(gpu, 1000, e.graphed([512, 513])), [1e-3 + 1e-4, 1e-2 + 1e-4])


def _search(engine, sets=(), isl=10000, profile=PROFILE, space=SPACE):
    return _Search(gs.models.load_model("deepseek-v3"), gs.hw.load_hw("gb200"), 8, Traffic.of(isl, 1000), SLA(),
                   space, profile, None, 0.0, engine=engine and engine.on(186 * GiB).with_settings(sets))


def test_a_prompt_over_the_budget_is_its_chunks_summed():
    s = _search(ENGINES["vllm"], ["launch_us=3"])  # budget 8192, chunked
    g = s.group("prefill", M, gs.Policies())
    one = list(g.batch).index(1.0)
    wl = Workload(("prefill",), [[1], [1]], [[8192], [1808]], [[0], [8192]])
    f, c = _forward(["prefill:10000x8"], M, wl)
    k = kernels(c)
    want = sum(max(x, k * 3e-6) for x in f)  # forward(8192, past 0) + forward(1808, past 8192), each a step
    assert g.forward_s[one, 0] == pytest.approx(want, rel=1e-9)
    whole = _search(None).group("prefill", M, gs.Policies())  # no engine: one forward of the whole prompt
    assert whole.forward_s[list(whole.batch).index(1.0), 0] != pytest.approx(want, rel=1e-6)
    # TensorRT-LLM packs prompts whole and runs none longer than its 8192 tokens
    assert np.isnan(_search(ENGINES["trtllm"]).group("prefill", M, gs.Policies()).forward_s).all()
    with pytest.raises(gs.GraphsimError, match=r"trtllm runs no step of this traffic within its limits \(step_tokens"
                       r"=8192, chunked_prefill=false"):
        search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(10000, 1000), space=SPACE, profile=PROFILE,
               engine="trtllm")


def test_decode_rows_within_the_limits_and_graph_replay():
    off = "moe_routing=false"  # the routing term apart (test_the_hottest_ep_rank_carries_the_routing_statistics)
    s = _search(ENGINES["vllm"], ["max_running=8", "launch_us=50", "graph_max_batch=4", off], isl=4000)
    g = s.group("decode", M, gs.Policies())
    assert set(g.batch) == {8.0}  # 64 requests per DP rank exceed max_running
    # a 16-token budget: vLLM counts decode tokens in it (8 x 1 fits, 64 does not); SGLang's bounds prompts only
    small = ["step_tokens=16", off]
    assert set(_search(ENGINES["vllm"], small, isl=4000).group("decode", M, gs.Policies()).batch) == {8.0}
    assert set(_search(ENGINES["sglang"], small, isl=4000).group("decode", M, gs.Policies()).batch) == {8.0, 64.0}
    ref = _search(None, isl=4000).group("decode", M, gs.Policies())
    gpu = ref.forward_s[list(ref.batch).index(8.0)]
    c = gs.compile_plan("deepseek-v3", gs.Plan([f"decode:{s.traffic.decode_context}x{64 * 8}"], M), "gb200", PROFILE)
    assert g.forward_s[0] == pytest.approx(max(gpu, kernels(c) * 50e-6), rel=1e-12)  # 8 > 4: no graph
    s2 = _search(ENGINES["vllm"], ["max_running=8", "launch_us=50", off], isl=4000)  # graphs up to 512: one launch
    assert s2.group("decode", M, gs.Policies()).forward_s[0] == pytest.approx(gpu, rel=1e-12)


def test_routing_statistics_closed_forms():
    # E[max of 2 standard normals] = 1/sqrt(pi); of 8: 1.4236 (tabulated order statistics)
    assert expected_max_normal(2) == pytest.approx(1 / np.pi ** 0.5, rel=1e-9)
    assert expected_max_normal(8) == pytest.approx(1.42360, abs=1e-5)
    # T tokens x top-8 of 256 experts on 8 ranks: 1 + z_8·σ/(μ·sqrt(1 - 1/8)), σ² = T·8·(1/8)(7/8)(248/255)
    t = np.array([8.0, 512.0])
    mu, var = t, t * (7 / 8) * 248 / 255
    want = 1 + expected_max_normal(8) * np.sqrt(var) / (mu * np.sqrt(7 / 8))
    np.testing.assert_allclose(hottest_rank_factor(t, 8, 256, 8), want, rtol=1e-12)
    # (a 3,000-draw simulation of the same routing gives 1.520 and 1.062: the normal approximation holds)
    assert hottest_rank_factor(t, 8, 256, 8, load_ratio=1.3) == pytest.approx(1.3 * want, rel=1e-12)
    assert hottest_rank_factor(t, 8, 256, 8, load_ratio=1.3, eplb=True) == pytest.approx(want, rel=1e-12)
    assert (hottest_rank_factor(t, 8, 256, 1) == 1).all()
    # a rank holds 2 of 16 experts: one token sends it at most 2 of its 8, twice the mean 1 (the normal's 2.04 capped)
    assert hottest_rank_factor([1.0], 8, 16, 8)[0] == pytest.approx(2.0, rel=1e-12)


def test_the_hottest_ep_rank_carries_the_routing_statistics():
    s = _search(ENGINES["trtllm"], ["max_running=8"], isl=4000)  # graphs up to 128: the GPU time alone
    g = s.group("decode", M, gs.Policies())
    ctx = s.traffic.decode_context
    wl = Workload(("decode",), [[8]], [[1]], [[ctx]])
    req = [f"decode:{ctx}x{64 * 8}"]
    base, _ = _forward(req, M, wl)
    hot = np.asarray(gs.compile_plan("deepseek-v3", gs.Plan(req, M, gs.Policies(ep_imbalance=2.0)), "gb200",
                                     PROFILE).evaluate(wl, outputs=("forward",))["forward"])
    f = hottest_rank_factor([8.0], 8, 256, 4)  # DeepSeek-V3: top-8 of 256 routed experts, ep 4
    assert g.forward_s[0] == pytest.approx(float(base[0] + (f[0] - 1) * (hot[0] - base[0])), rel=1e-12)
    assert g.forward_s[0] > base[0]


def test_the_sol_twin_never_pays_the_step_terms():
    args = dict(gpus=8, traffic=Traffic.of(10000, 1000), sla=SLA(), space=SPACE)
    pred = search("deepseek-v3", "gb200", profile=PROFILE, engine="vllm",
                  engine_set=("launch_us=40", "max_running=8"), **args)
    sol = search("deepseek-v3", "gb200", engine="vllm", **args)
    assert pred.space["engine_steps"] == "priced" and sol.space["engine_steps"] == "memory only"
    assert pred.space["engine_terms"]["max_running"] == 8 and pred.space["engine_terms"]["launch_us"] == 40
    assert set(pred.table["decode_batch"]) == {8} and 64 in set(sol.table["decode_batch"])
    key = ["mapping", "decode_batch", "ttft_step"]
    a, b = pred.table.set_index(key), sol.table.set_index(key)
    common = a.index.intersection(b.index)
    assert len(common)
    for own, twin in (("ttft_ms", "sol_ttft_ms"), ("tpot_ms", "sol_tpot_ms")):
        np.testing.assert_allclose(a.loc[common, twin].to_numpy(float), b.loc[common, own].to_numpy(float),
                                   rtol=1e-12)


def test_cli_engine_set(capsys):
    args = ["search", "--model", "deepseek-v3", "--hw", "gb200", "--gpus", "8", "--isl", "4000", "--osl", "1000",
            "--tp", "4", "--ep", "4", "--dp", "1", "--batch", "8", "--modes", "agg", "--refine", "0",
            "--profile", "practitioner", "--engine", "trtllm"]
    assert main([*args, "--engine-set", "step_tokens=9000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["space"]["engine_terms"]["step_tokens"] == 9000 and d["space"]["engine_terms"]["graph_max_batch"] == 128
    assert main([*args, "--engine-set", "graph_max_batch=-1"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("engine_set.graph_max_batch: a whole number in [0, 16777216], got '-1'")
