"""graphsim search: the serving formulas against independent evaluations, SLA and ranking invariants, the Pareto
front, resumability, launch flags and the CLI (docs/search.md, docs/json.md)."""
from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.serving.search import (SLA, Space, Traffic, launch_flags, mappings, pareto_flags, policies_of, search)

# a small space: V3 on 8 GB200s, TP 1/2, a few batches (each search below runs in ~1 s)
SMALL = Space(tp=(1, 2), batches=(8, 32, 128, 256), prefill_batches=(1, 2), refine=2)
TRAFFIC = Traffic.of(4000, 1000)


@pytest.fixture(scope="module")
def v3():
    return search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=SMALL)


def ref_model():
    from graphsim.models import load_model

    return load_model("deepseek-v3")


def _rows(res, **eq):
    t = res.table
    for k, v in eq.items():
        t = t[t[k] == v]
    return t


def test_agg_row_is_the_mixed_step_formula(v3):
    """f = B/(OSL·dp) of the steps prefill one prompt per DP group together with the decodes:
    TPOT = (1 - f)·T_dec(B) + f·T_mix(B, dp prompts), TTFT = T_mix, tok/s/GPU = B/TPOT/GPUs — forward times from
    separately compiled plans (docs/search.md, aggregated serving)."""
    row = _rows(v3, mode="agg", mapping="tp2-dp4-ep4-pp1", policies="default", decode_batch=128).iloc[0]
    m = gs.ParallelMapping(tp=2, dp=4, ep=4)
    ctx = 4000 + 1000 // 2  # token-weighted mean context of one class: isl + osl/2
    dec = gs.compile_plan("deepseek-v3", gs.Plan([f"decode:{ctx}x128"], m), "gb200").report().forward_s
    mix = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:4000x4", f"decode:{ctx}x128"], m), "gb200").report()
    f = 128 / (1000 * 4)
    tpot = (1 - f) * dec + f * mix.forward_s
    assert row["tpot_ms"] == pytest.approx(tpot * 1e3, rel=1e-9)
    assert row["ttft_ms"] == pytest.approx(mix.forward_s * 1e3, rel=1e-9)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(128 / tpot / 8, rel=1e-9)
    assert row["tokens_per_s_per_user"] == pytest.approx(1 / tpot, rel=1e-9)
    assert row["gpus"] == 8 and row["prefill_batch"] == 4
    # a mixed step shares the weight reads: never slower than a prefill forward plus a decode step
    pre = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:4000x4"], m), "gb200").report().forward_s
    assert mix.forward_s <= pre + dec


def test_disagg_row_matches_graphsim_disagg(v3):
    """A disaggregated row equals graphsim.serving.disagg for the same pools (TTFT with the KV hand-over, rate balance)."""
    from graphsim.serving.disagg import Pool, disagg

    t = _rows(v3, mode="disagg")
    assert len(t) > 0
    row = t.sort_values("tokens_per_s_per_gpu").iloc[-1]
    from graphsim.cli.disagg import parse_mapping

    pm, dm = parse_mapping(row["prefill_mapping"]), parse_mapping(row["decode_mapping"])
    ref = disagg("deepseek-v3", "gb200", Pool(pm, int(row["prefill_batch"]), int(row["prefill_replicas"])),
                 Pool(dm, int(row["decode_batch"]), int(row["decode_replicas"])), isl=4000, osl=1000)
    # the hand-over streams layer by layer during the prefill, over NVLink when both pools share a domain
    from graphsim.serving.disagg import handover_seconds

    hand, _, link = handover_seconds(ref_model(), gs.load_hw("gb200"), ref.prefill, ref.decode, 4000, ref.prefill_s)
    assert link == "nvlink" and hand < ref.transfer_s
    assert row["ttft_ms"] == pytest.approx((ref.prefill_s + hand) * 1e3, rel=1e-9)
    assert row["ttft_step"] == "disagg" and row["tpot_p99_ms"] == row["tpot_ms"]
    assert row["tpot_ms"] == pytest.approx(ref.itl_s * 1e3, rel=1e-9)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(ref.tokens_per_s_per_gpu, rel=1e-9)
    assert row["gpus"] == ref.gpus <= 8


def test_memory_verdict_matches_fit(v3):
    """fits / headroom of a decode pool equal graphsim.serving.fit at the steady-state context: the mean isl + osl/2 plus
    3 standard deviations of the summed context of a DP rank's n requests, osl/√12 · 3/√n per request."""
    from graphsim.serving.fit import MemoryModel

    m = gs.ParallelMapping(tp=2, dp=4, ep=4)
    mm = MemoryModel("deepseek-v3", "gb200", m)
    for b in (32, 1024):  # 8 and 256 requests per DP rank
        dis = v3.table[(v3.table["mode"] == "disagg") & (v3.table["decode_mapping"] == "tp2-dp4-ep4-pp1")
                       & (v3.table["decode_batch"] == b)]
        row = _rows(v3, mode="agg", mapping="tp2-dp4-ep4-pp1", policies="default", decode_batch=b,
                    ttft_step="mixed").iloc[0]
        ctx = math.ceil(4500 + 3 * 1000 / math.sqrt(12) / math.sqrt(b / 4))
        assert TRAFFIC.memory_context(b / 4) == ctx
        ref = mm.fit(b, ctx).headroom_bytes / 2**30
        # the agg row's step also prefills whole 4,000-token prompts: their activations outweigh one decode
        # token's, so it has strictly less room than the decode pool alone (which disagg rows are held to)
        assert row["memory_headroom_gib"] < ref - 1e-3
        assert row["memory_headroom_gib"] == pytest.approx(ref, abs=2.0)
        assert row["fits"] == (row["memory_headroom_gib"] >= 0)
        for _, d in dis.iterrows():
            assert d["memory_headroom_gib"] <= ref + 1e-9


def test_ranked_rows_meet_the_sla_and_nothing_better_is_left_out(v3):
    best = v3.best
    assert best, "V3 on 8 GB200s meets TTFT 2 s / TPOT 30 ms at SOL"
    tps = [b["tokens_per_s_per_gpu"] for b in best]
    assert tps == sorted(tps, reverse=True)
    for b in best:
        assert b["ttft_ms"] <= 2000 and b["tpot_ms"] <= 30 and b["fits"] and b["meets_sla"]
    ranked = {(b["mode"], b["mapping"]) for b in best}
    t = v3.table[v3.table["meets_sla"]]
    others = t[[(m, p) not in ranked for m, p in zip(t["mode"], t["mapping"])]]
    assert (others["tokens_per_s_per_gpu"] <= tps[-1] + 1e-9).all()
    # every deployment that is not ranked has a reason, and the reasons add up
    assert sum(v3.reasons.values()) == len(v3.rejected)
    assert {r["reason"] for r in v3.rejected} <= set(v3.reasons)


def test_pareto_front_is_exactly_the_non_dominated_points(v3):
    t = v3.table
    ok = t[t["fits"] & (t["ttft_ms"] <= 2000)]
    x, y = ok["tokens_per_s_per_user"].to_numpy(), ok["tokens_per_s_per_gpu"].to_numpy()
    flags = ok["pareto"].to_numpy()
    for i in range(len(ok)):
        dominated = np.any((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i])))
        assert flags[i] == (not dominated)  # identical points are all on the front
    assert not t[~(t["fits"] & (t["ttft_ms"] <= 2000))]["pareto"].any()


def test_pareto_flags_closed_form():
    x = np.array([1.0, 2.0, 3.0, 2.0, 0.5])
    y = np.array([5.0, 4.0, 1.0, 3.0, 5.0])
    assert pareto_flags(x, y).tolist() == [True, True, True, False, False]


def test_tighter_sla_never_raises_the_best_throughput():
    space = Space(tp=(1, 2), batches=(8, 64, 256), prefill_batches=(1,), refine=0, modes=("agg",))
    loose = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 40), space=space)
    tight = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 15), space=space)
    assert tight.best and loose.best
    assert tight.best[0]["tokens_per_s_per_gpu"] <= loose.best[0]["tokens_per_s_per_gpu"]
    assert tight.best[0]["tpot_ms"] <= 15


def test_space_prunes_and_mappings_respect_the_model_and_nvlink():
    from graphsim.hw import load_hw
    from graphsim.models import load_model

    model = load_model("deepseek-v3")
    h100 = load_hw("h100")  # 8-GPU NVLink domain
    ms = mappings(model, h100, 16, Space(), "decode")
    assert ms and all(m.tp * m.cp <= 8 for m in ms)
    assert all(16 % m.gpus == 0 or (m.gpus & (m.gpus - 1)) == 0 for m in ms)
    for m in ms:
        model.validate_mapping(m)  # never raises
    assert {m.tp for m in mappings(model, h100, 8, Space(tp=(2,)), "decode")} == {2}
    res = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(2,), modes=("agg",), batches=(8, 64), refine=0))
    assert set(res.table["mode"]) == {"agg"}
    assert all(m.startswith("tp2-") for m in res.table["mapping"])


def test_speculative_rows_divide_the_step_by_expected_emitted_tokens():
    """DSpark rows: per step every request gets E[emitted | k] tokens (bonus-token convention, V41_FACTS §9), so
    TPOT = ((1 - f)·T_step + f·T_mix) / E with f = B·E/(OSL·dp) — never the verify forward itself."""
    from graphsim.models.dspark import AcceptanceProfile

    acc = (0.9, 0.8, 0.7, 0.6, 0.5)
    res = search("deepseek-v4.1-flash", "gb300", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(1,), dp=(8,), ep=(8,), modes=("agg",), batches=(2,), prefill_batches=(1,),
                             policies=(("fusion", ("unfused",)), ("overlap", ("none",)), ("engram", ("hbm",)),
                                       ("decoder_replay", ("off",))), acceptance=acc, refine=1))
    assert [a["field"] for a in res.space["policy_axes"]] == ["fusion", "overlap", "decoder_replay", "engram",
                                                             "engram_shard", "engram_proj", "sp", "spec"]
    assert res.space["memory_axes"] == ["engram", "engram_shard", "engram_proj", "sp"]
    spec = res.table[(res.table["verify"] > 0) & (res.table["policies"] == "dspark=on")
                     & (res.table["ttft_step"] == "mixed")]
    assert set(spec["verify"]) == {1, 2, 3, 4, 5}
    e = AcceptanceProfile.constant(acc).expected_emitted_table()[0]
    pol = policies_of({"spec": "dspark"}, acc)
    m = gs.ParallelMapping(tp=1, dp=8, ep=8)
    for k in (1, 5):
        row = spec[spec["verify"] == k].iloc[0]
        step = gs.compile_plan("deepseek-v4.1-flash", gs.Plan([f"decode:4500x16v{k}"], m, pol), "gb300").report()
        mix = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["prefill:4000x8", f"decode:4500x16v{k}"], m, pol),
                              "gb300").report()
        f = 16 * e[k] / (1000 * 8)
        tpot = ((1 - f) * step.forward_s + f * mix.forward_s) / e[k]
        assert row["tpot_ms"] == pytest.approx(tpot * 1e3, rel=1e-9)


def test_a_failing_program_is_reported_and_the_rest_kept():
    """Two-batch overlap cannot split one request per DP rank: that program is skipped with its reason, the
    other policies' rows stay."""
    res = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(2,), dp=(4,), ep=(4,), batches=(1,), prefill_batches=(1,), modes=("agg",),
                             policies=(("overlap", ("none", "two-batch")),), refine=1))
    assert len(res.table) > 0 and "default" in set(res.table["policies"])
    assert not any("two-batch" in p for p in res.table["policies"])
    assert any("two-batch" in s["error"] for s in res.skipped)


def test_resume_reuses_every_program(tmp_path):
    space = Space(tp=(2,), batches=(8, 64), prefill_batches=(1,), refine=1)
    a = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=space, cache_dir=tmp_path)
    b = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=space, cache_dir=tmp_path)
    assert a.stats["programs_compiled"] > 0 and b.stats["programs_compiled"] == 0
    assert b.stats["programs_cached"] == a.stats["programs_compiled"]
    cols = ["mapping", "decode_batch", "tpot_ms", "ttft_ms", "tokens_per_s_per_gpu", "memory_headroom_gib"]
    assert a.table[cols].equals(b.table[cols])
    # a different traffic does not reuse them (the cache key holds every input)
    c = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(2000, 1000), sla=SLA(2000, 30), space=space,
               cache_dir=tmp_path)
    assert c.stats["programs_cached"] == 0


def test_traffic_distribution(tmp_path):
    p = tmp_path / "lengths.csv"
    p.write_text("isl,osl,weight\n1000,500,3\n8000,1500,1\n1000,500,1\n")
    t = Traffic.load(p)
    assert t.isl == (1000, 8000) and t.osl == (500, 1500)
    w = np.array([0.8, 0.2])
    # token-weighted decode context: sum w*osl*(isl + osl/2) / sum w*osl
    ctx = (w * [500, 1500]) @ np.array([1250.0, 8750.0]) / (w @ [500, 1500])
    assert t.decode_context == round(ctx)
    assert t.mean_osl == pytest.approx(0.8 * 500 + 0.2 * 1500)
    # a slot holds class c with probability ∝ w·osl, at a position uniform over [isl, isl + osl]
    assert t.fit_context == math.ceil(ctx)
    pi = np.array([0.8 * 500, 0.2 * 1500]) / (0.8 * 500 + 0.2 * 1500)
    var = pi @ (np.array([500.0, 1500.0]) ** 2 / 12 + np.array([1250.0, 8750.0]) ** 2) - ctx**2
    assert t.context_std == pytest.approx(math.sqrt(var), rel=1e-12)
    assert t.memory_context([1, 100]).tolist() == [min(9500, math.ceil(ctx + 3 * math.sqrt(var))),
                                                   math.ceil(ctx + 0.3 * math.sqrt(var))]
    assert Traffic.of(1000, 4000, kv_margin=0.0).memory_context(7) == 3000
    bad = tmp_path / "bad.csv"
    bad.write_text("isl,out\n1,2\n")
    with pytest.raises(GraphsimError, match="lengths"):
        Traffic.load(bad)


def test_launch_flags_follow_the_documented_mapping():
    from graphsim.models import load_model

    model = load_model("deepseek-v3")
    m = gs.ParallelMapping(tp=1, dp=8, ep=8)
    row = {"mode": "agg", "_dmap": m, "_pmap": m, "decode_batch": 768, "prefill_batch": 8, "prefill_replicas": 1,
           "decode_replicas": 1, "_policies": gs.Policies(overlap="two-batch", mtp=1, acceptance=(0.8,)),
           "_prefill_policies": gs.Policies()}
    f = launch_flags(model, row)
    sg, vl = f["sglang"][0], f["vllm"][0]
    for flag in ("--tp-size 8", "--dp-size 8", "--enable-dp-attention", "--ep-size 8", "--max-running-requests 768",
                 "--enable-two-batch-overlap", "--speculative-algorithm EAGLE", "--speculative-num-steps 1"):
        assert flag in sg
    for flag in ("--tensor-parallel-size 1", "--data-parallel-size 8", "--enable-expert-parallel",
                 "--max-num-seqs 96", "--enable-dbo", '"num_speculative_tokens": 1'):
        assert flag in vl
    part = dict(row, _dmap=gs.ParallelMapping(tp=1, dp=8, ep=4), mode="disagg")
    f = launch_flags(model, part)
    assert len(f["sglang"]) == 2 and "--disaggregation-mode prefill" in f["sglang"][0]
    assert "--disaggregation-mode decode" in f["sglang"][1]
    assert "--enable-expert-parallel" not in f["vllm"][1]
    assert any("ep=4" in n for n in f["notes"])


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(GraphsimError, match="policy"):
        Space(policies=(("nonsense", ("a",)),))
    with pytest.raises(GraphsimError, match="modes"):
        Space(modes=("mixed",))
    with pytest.raises(GraphsimError, match="sla.tpot_ms"):
        SLA(tpot_ms=-1)
    with pytest.raises(GraphsimError, match="gpus"):
        search("deepseek-v3", "gb200", gpus=1, traffic=TRAFFIC, space=Space(tp=(8,)))


# ---- the command line ---------------------------------------------------------------------------------------------
def _doc_keys(prefix: str) -> set:
    """Keys the ``## search`` section of docs/json.md lists directly under ``prefix`` ("" for the document,
    "best[]." for a ranked row...; ``best[].<row key>`` stands for the row keys listed under ``pareto[].``)."""
    import re
    from pathlib import Path

    text = Path(__file__).resolve().parents[1].joinpath("docs", "json.md").read_text()
    part = text.split("\n## search\n", 1)[1].split("\n## ", 1)[0]
    keys = [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", part, re.M)]
    out = set()
    for k in keys:
        if k.startswith(prefix):
            rest = k[len(prefix):]
            if rest == "<row key>":
                out |= _doc_keys("pareto[].")
            elif "." not in rest and "[" not in rest:
                out.add(rest)
    return out


@pytest.mark.parametrize("model,hw", [("deepseek-v3", "gb200"),
                                     # every program of V4.1's default space (its policy axes: ~20 s on 2 cores);
                                     # the suite checks those axes on a small space (test_speculative_rows_...)
                                     pytest.param("deepseek-v4.1-flash", "gb300", marks=pytest.mark.full)])
def test_cli_acceptance_json(model, hw, capsys):
    """The issue's acceptance command: ranked deployments with the keys docs/json.md documents."""
    from graphsim.cli import main

    rc = main(["search", "--model", model, "--hw", hw, "--gpus", "8", "--isl", "4000", "--osl", "1000",
               "--ttft", "2000", "--tpot", "30", "--json", "--no-progress"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema_version"] == 1 and d["command"] == "search"
    assert d["skipped"] == []  # every program of the default space builds and prices (a failure drops a mapping)
    assert {b["mode"] for b in d["best"]} >= {"agg"}
    assert set(d) == _doc_keys("")
    assert d["best"], f"{model} meets TTFT 2 s / TPOT 30 ms on 8x {hw} at SOL"
    assert set(d["best"][0]) == _doc_keys("best[].")
    assert set(d["pareto"][0]) == _doc_keys("pareto[].")
    assert set(d["rejected"][0]) == _doc_keys("rejected[].")
    for obj in ("traffic", "sla", "space", "reasons", "stats"):
        assert set(d[obj]) == _doc_keys(f"{obj}."), obj
    assert set(d["best"][0]["launch"]) == _doc_keys("best[].launch.")
    if model.startswith("deepseek-v4.1"):  # its policies are in the space
        assert {"fusion", "overlap", "decoder_replay", "engram"} <= {a["field"] for a in d["space"]["policy_axes"]}


def test_cli_table_plot_and_resume(tmp_path, capsys):
    from graphsim.cli import main

    out = tmp_path / "res.parquet"
    args = ["search", "--model", "deepseek-v3", "--gpus", "8", "--isl", "4000", "--osl", "1000", "--ttft", "2000",
            "--tpot", "30", "--tp", "2", "--batch", "8,64", "--refine", "0", "-o", str(out), "--no-progress"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "launch #1" in text and "sglang.launch_server" in text
    import pandas as pd

    df = pd.read_parquet(out)
    assert {"mode", "mapping", "policies", "profile", "view", "pareto", "tokens_per_s_per_gpu"} <= set(df.columns)
    assert (tmp_path / "res.pareto.png").stat().st_size > 1000
    assert main(args) == 0
    assert "0 programs compiled" in capsys.readouterr().out


def test_cli_errors(capsys):
    from graphsim.cli import main

    assert main(["search", "--model", "deepseek-v3", "--gpus", "8", "--isl", "4000"]) == 2
    assert "osl" in capsys.readouterr().err
    assert main(["search", "--model", "deepseek-v3", "--gpus", "8", "--isl", "10", "--osl", "10",
                 "--policy", "fusion"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphsim: error: policy") and err.count("\n") == 1


def test_measured_view_prices_the_same_space():
    """--view hybrid (measured tables where covered): the same deployments, each at least as slow as its SOL."""
    from pathlib import Path

    from graphsim.views.measured.view import ViewSpec

    fix = str(Path(__file__).parent / "data" / "measured")
    space = Space(tp=(2,), dp=(4,), ep=(2,), batches=(8, 32), prefill_batches=(1,), modes=("agg",), refine=0)
    sol = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=space)
    hyb = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=space,
                 view=ViewSpec("hybrid", fix, "trtllm@1.3.0rc20"))
    assert set(hyb.table["view"]) == {"hybrid"} and hyb.view == "hybrid"
    a, b = sol.table.set_index("decode_batch"), hyb.table.set_index("decode_batch")
    assert (b["tpot_ms"] >= a["tpot_ms"] * (1 - 1e-9)).all() and (b["ttft_ms"] >= a["ttft_ms"] * (1 - 1e-9)).all()


def test_agg_with_more_than_one_prompt_per_step():
    """Short outputs, big batches: f = B/(OSL·dp) > 1 prompts per DP group and step. Steps carry dp·⌊f⌋ or dp·⌈f⌉
    whole prompts in the proportions that average f."""
    space = Space(tp=(2,), dp=(4,), ep=(4,), batches=(256,), modes=("agg",), refine=0)
    res = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(4000, 100), space=space)
    row = res.table.iloc[0]
    m = gs.ParallelMapping(tp=2, dp=4, ep=4)
    f = 1024 / (100 * 4)  # 2.56
    ctx = 4000 + 50
    t = [gs.compile_plan("deepseek-v3", gs.Plan([f"prefill:4000x{n}", f"decode:{ctx}x1024"], m), "gb200")
         .report().forward_s for n in (8, 12)]
    tpot = 0.44 * t[0] + 0.56 * t[1]
    assert f - 2 == pytest.approx(0.56)
    assert row["tpot_ms"] == pytest.approx(tpot * 1e3, rel=1e-9)
    assert row["ttft_ms"] == pytest.approx(t[1] * 1e3, rel=1e-9) and row["prefill_batch"] == 12
    assert not res.skipped


def test_worker_processes_give_the_same_search():
    """jobs=2 evaluates the programs on spawned workers: the same table, ranking and front as in-process."""
    space = Space(tp=(2,), ep=(2, 4), batches=(8, 64), prefill_batches=(1,), refine=1)
    one = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=space)
    two = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30), space=space, jobs=2)
    assert one.table.equals(two.table)
    assert one.best == two.best and one.rejected == two.rejected and one.skipped == two.skipped
    assert one.stats["programs_compiled"] == two.stats["programs_compiled"]


def test_mtp_depths_and_reasons():
    """Every MTP depth up to K is searched (a shallower one may win); a deployment's reason is the bound it
    misses among the batches that fit and meet TTFT (docs/search.md, ranking)."""
    res = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(150, 12),
                 space=Space(tp=(1, 2), ep=(8,), batches=(8, 64, 512), modes=("agg",), acceptance=(0.9, 0.8),
                             refine=2))
    axis = dict((a["field"], a["values"]) for a in res.space["policy_axes"])
    assert axis["spec"] == ["off", "mtp1", "mtp2"]
    t = res.table
    assert {"mtp=1", "mtp=2"} <= set(t["policies"])
    for r in res.rejected:
        g = t[(t["mode"] + " " + t["mapping"] + " [" + t["policies"] + "]") == r["deployment"]]
        fits = g[g["fits"]]
        timely = fits[fits["ttft_ms"] <= 150]
        if r["reason"] == "memory":
            assert fits.empty
        elif r["reason"] == "ttft":
            assert len(fits) and timely.empty
        elif r["reason"] == "tpot":
            assert len(timely) and (timely["tpot_ms"] > 12).all()


def test_disagg_lists_each_pool_pair_once():
    """A scaled copy of a disaggregated deployment (more replicas, same ratio) has the same TTFT, TPOT and
    tokens/s per GPU: one row per pool pair and batch, the fewest GPUs among equals."""
    res = search("deepseek-v3", "gb200", gpus=16, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(1,), dp=(4,), ep=(4,), batches=(8, 32), prefill_batches=(1,), modes=("disagg",),
                             refine=0))
    t = res.table
    key = ["prefill_mapping", "decode_mapping", "policies", "prefill_batch", "decode_batch", "verify"]
    assert not t.duplicated(key).any()
    assert (t["gpus"] <= 16).all()


def test_review_inputs_are_one_line_errors(tmp_path, capsys):
    from graphsim.cli import main

    with pytest.raises(GraphsimError, match="acceptance"):  # DSpark drafts 5 positions
        search("deepseek-v4.1-flash", "gb300", gpus=8, traffic=TRAFFIC, space=Space(acceptance=(0.9, 0.8)))
    with pytest.raises(GraphsimError, match="reserve_gib"):
        search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, reserve_gib=-1)
    with pytest.raises(GraphsimError, match="max_replica_gpus"):
        Space(max_replica_gpus=0)
    with pytest.raises(GraphsimError, match="pool"):
        search("deepseek-v3", "gb200", gpus=1, traffic=TRAFFIC, space=Space(modes=("disagg",)))
    assert np.isfinite(Traffic((4000, 10), (1000, 10), (1e308, 1e308)).w).all()
    for body in ('[{"isl": 4000.7, "osl": 10}]', '[{"isl": true, "osl": 10}]'):
        p = tmp_path / "l.json"
        p.write_text(body)
        with pytest.raises(GraphsimError, match="lengths"):
            Traffic.load(p)
    from graphsim.cli.search import _policies

    assert _policies(["ep_imbalance=1.0,1.5", "pp_micro_batches=0"]) == (("ep_imbalance", (1.0, 1.5)),
                                                                         ("pp_micro_batches", (0,)))
    assert main(["search", "--model", "deepseek-v3", "--gpus", "8", "--isl", "10", "--osl", "10",
                 "--policy", "ep_imbalance=x"]) == 2
    assert "policy.ep_imbalance" in capsys.readouterr().err


def test_a_damaged_cache_file_is_recomputed(tmp_path):
    space = Space(tp=(2,), dp=(4,), ep=(4,), batches=(8,), prefill_batches=(1,), modes=("agg",), refine=0)
    a = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, space=space, cache_dir=tmp_path)
    files = sorted(tmp_path.glob("*.json"))
    files[0].write_text("{}")
    b = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, space=space, cache_dir=tmp_path)
    assert b.stats["programs_compiled"] == 1 and b.table.equals(a.table)


# ---- a search that is a bound on its space (issue 24) ------------------------------------------------------------
LLAMA = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "hf"
            / "meta-llama--Meta-Llama-3.1-8B_config.json")


def _best_meeting(table, sla: SLA) -> float:
    """The most tokens/s per GPU among a table's rows that fit and meet every bound of ``sla``."""
    t = table[table["fits"]]
    if sla.ttft_ms:
        t = t[t["ttft_ms"] <= sla.ttft_ms]
    if sla.tpot_ms:
        t = t[t["tpot_p99_ms" if sla.tpot_stat == "p99" else "tpot_ms"] <= sla.tpot_ms]
    if sla.min_tokens_per_s_per_user:
        t = t[t["tokens_per_s_per_user"] >= sla.min_tokens_per_s_per_user]
    return float(t["tokens_per_s_per_gpu"].max()) if len(t) else 0.0


@pytest.mark.parametrize("bounded", [SLA(min_tokens_per_s_per_user=75), SLA(ttft_ms=40, tpot_ms=20),
                                     SLA(tpot_ms=20, tpot_stat="p99"), SLA(ttft_ms=20)])
def test_adding_a_bound_never_lowers_the_best(bounded, tmp_path):
    """What is explored never depends on the SLA: the best under a bound is at least every row of the unbounded
    search that meets it (the --min-user-tps 75 review case)."""
    space = Space(tp=(1, 2), batches=(4, 32, 256), prefill_batches=(1, 2), refine=1)
    free = search(LLAMA, "h100", gpus=4, traffic=Traffic.of(2000, 500), space=space, cache_dir=tmp_path)
    res = search(LLAMA, "h100", gpus=4, traffic=Traffic.of(2000, 500), sla=bounded, space=space, cache_dir=tmp_path)
    want = _best_meeting(free.table, bounded)
    assert want > 0  # the bound leaves something to find
    assert res.best and res.best[0]["tokens_per_s_per_gpu"] >= want * (1 - 1e-12)
    assert res.best[0]["tokens_per_s_per_gpu"] == pytest.approx(_best_meeting(res.table, bounded), rel=1e-12)


@pytest.mark.parametrize("small,large", [
    (Space(tp=(1,), batches=(8, 64), modes=("agg",)), Space(tp=(1, 2), batches=(8, 64), modes=("agg",))),
    (Space(tp=(2,), batches=(8, 64), modes=("agg",)), Space(tp=(2,), batches=(8, 64, 512), modes=("agg",))),
    (Space(tp=(2,), batches=(8, 64), modes=("agg",), policies=(("sp", ("off",)),)),
     Space(tp=(2,), batches=(8, 64), modes=("agg",))),
    (Space(tp=(2,), batches=(8, 64), modes=("agg",)), Space(tp=(2,), batches=(8, 64))),
])
def test_enlarging_the_space_never_lowers_the_best(small, large):
    """The exhaustive search is a bound on its space: a larger space (more mappings, batches, policy values or
    modes) never finds less."""
    sla = SLA(ttft_ms=100, tpot_ms=25)
    a, b = (search(LLAMA, "h100", gpus=2, traffic=Traffic.of(2000, 500), sla=sla,
                   space=attrs.evolve(sp, prefill_batches=(1,), refine=100, exhaustive=True)) for sp in (small, large))
    assert a.best and b.best
    assert b.best[0]["tokens_per_s_per_gpu"] >= a.best[0]["tokens_per_s_per_gpu"] * (1 - 1e-12)


def test_memory_is_checked_after_the_residency_axes():
    """V4.1-Flash at TP1 on GB200 holds its Engram tables only in host memory: the base (HBM) fits at no batch,
    so the search tries the residency values before pruning and ranks engram=host (issue 24: 22,715 tok/s/GPU,
    not 17,708)."""
    res = search("deepseek-v4.1-flash", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(1,), dp=(8,), ep=(8,), modes=("agg",), refine=1,
                             policies=(("decoder_replay", ("paper",)), ("fusion", ("unfused",)),
                                       ("overlap", ("none",)))))
    t = res.table
    assert not t[t["policies"] == "decoder_replay=paper"]["fits"].any()
    # stage 1 tries the saver values together (host tables, world-sharded rows); stage 2 each back at its base
    assert {"decoder_replay=paper,engram=host,engram_shard=world", "decoder_replay=paper,engram=host"} <= \
        set(t["policies"])
    assert res.best and "engram=host" in res.best[0]["policies"]
    assert res.best[0]["tokens_per_s_per_gpu"] >= 22_714


def test_ttft_steps_and_p99():
    """Each aggregated deployment and batch has a row per TTFT step (mixed, prefill-only, lone prompt), each
    TTFT and TPOT achieved together by its schedule; a prefill-only step is faster to the first token and slower
    per output token than the mixed step; p99 TPOT is the spike step when more than 1 % of steps prefill."""
    res = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(2,), dp=(4,), ep=(4,), batches=(8, 128), modes=("agg",), refine=0))
    t = res.table
    for b in (32, 512):
        g = t[t["decode_batch"] == b].set_index("ttft_step")
        assert set(g.index) == {"mixed", "prefill", "lone"}
        assert g.loc["prefill", "ttft_ms"] < g.loc["mixed", "ttft_ms"]
        assert g.loc["lone", "ttft_ms"] <= g.loc["prefill", "ttft_ms"]
        assert g.loc["prefill", "tpot_ms"] > g.loc["mixed", "tpot_ms"]
    m = gs.ParallelMapping(tp=2, dp=4, ep=4)
    ctx = 4500
    dec = gs.compile_plan("deepseek-v3", gs.Plan([f"decode:{ctx}x512"], m), "gb200").report().forward_s
    mix = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:4000x4", f"decode:{ctx}x512"], m),
                          "gb200").report().forward_s
    row = t[(t["decode_batch"] == 512) & (t["ttft_step"] == "mixed")].iloc[0]
    f = 512 / (1000 * 4)  # 12.8 % of the steps prefill: p99 is the mixed step
    assert row["tpot_p99_ms"] == pytest.approx(mix * 1e3, rel=1e-9)
    pre = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:4000x4"], m), "gb200").report().forward_s
    row = t[(t["decode_batch"] == 512) & (t["ttft_step"] == "prefill")].iloc[0]
    assert row["ttft_ms"] == pytest.approx(pre * 1e3, rel=1e-9)
    assert row["tpot_ms"] == pytest.approx((dec + f * pre) * 1e3, rel=1e-9)
    assert row["tpot_p99_ms"] == pytest.approx((dec + pre) * 1e3, rel=1e-9)
    assert set(t["bound"]) == {"lower"}
    # --tpot-stat p99 holds the bound on the spike
    p99 = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30, tpot_stat="p99"),
                 space=Space(tp=(2,), dp=(4,), ep=(4,), batches=(8, 128), modes=("agg",), refine=0))
    assert all(b["tpot_p99_ms"] <= 30 for b in p99.best)
    with pytest.raises(GraphsimError, match="sla.tpot_stat"):
        SLA(tpot_stat="p50")


def test_steady_state_memory_fits_more():
    """DeepSeek-V3 on 8 GB200s at ISL 1000 / OSL 4000 (issue 24): held at the steady-state mean context
    isl + osl/2 plus the 3-sigma margin, TP1/DP8/EP8 fits 3,224 requests (3,416 at the mean alone), not the
    2,048 of the full length."""
    res = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(1000, 4000),
                 space=Space(tp=(1,), dp=(8,), ep=(8,), modes=("agg",), refine=0, batches=(256, 512)))
    fit = res.table[res.table["fits"]]["decode_batch"].max()
    assert 3000 < fit < 3500 and fit % 8 == 0  # the most that fits is a row (the grid runs up to what fits)
    full = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(1000, 4000, kv_margin=1000.0),
                  space=Space(tp=(1,), dp=(8,), ep=(8,), modes=("agg",), refine=0, batches=(256, 512)))
    assert full.table[full.table["fits"]]["decode_batch"].max() < 2600  # every request at isl + osl


def test_build_failures_are_listed_with_their_error(capsys):
    """A program that fails to build is listed with its error in the text and the JSON, never dropped."""
    from graphsim.cli.search import to_text

    res = search("deepseek-v3", "gb200", gpus=8, traffic=TRAFFIC, sla=SLA(2000, 30),
                 space=Space(tp=(2,), dp=(4,), ep=(4,), batches=(1,), prefill_batches=(1,), modes=("agg",),
                             policies=(("overlap", ("none", "two-batch")),), refine=1))
    assert res.skipped and all(x["what"] and x["error"] for x in res.skipped)
    text = to_text(res)
    for x in res.skipped:
        assert f"{x['what']}: {x['error']}" in text
    assert res.to_json()["skipped"] == res.skipped


def test_handover_streams_over_nvlink_inside_a_domain():
    """The KV hand-over streams layer by layer during the prefill (each of L layers 1/L of the bytes and of the
    forward): exposed = max(T_tr/L, T_tr − T_pre·(L−1)/L) + one latency, over NVLink when a prefill and a
    decode replica fit in one NVLink domain together, else over scale-out (docs/search.md)."""
    from graphsim.serving.disagg import Pool, handover_link, handover_seconds, transfer_seconds

    model, gb200, h100 = ref_model(), gs.load_hw("gb200"), gs.load_hw("h100")
    p, d = Pool(gs.ParallelMapping(tp=4), 2), Pool(gs.ParallelMapping(tp=4), 1)
    assert handover_link(gb200, p.mapping, d.mapping) == "nvlink"  # 8 <= 72
    assert handover_link(h100, gs.ParallelMapping(tp=8), d.mapping) == "scaleout"  # 12 > 8
    L = model.num_layers()
    for t_pre in (1e-6, 10.0):  # nothing to hide it under / all of it hidden but the last layer
        exposed, nbytes, link = handover_seconds(model, gb200, p, d, 4000, t_pre)
        total, _ = transfer_seconds(model, gb200, p, d, 4000, link="nvlink")
        wire = total - gb200.nvlink_latency_s
        assert link == "nvlink" and nbytes > 0
        assert exposed == pytest.approx(max(wire / L, wire - t_pre * (L - 1) / L) + gb200.nvlink_latency_s,
                                        rel=1e-12)
    assert handover_seconds(model, gb200, p, d, 4000, 10.0)[0] < total / 10
