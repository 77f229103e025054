"""Issue 29 item 4: energy and capacity — tokens per joule at board power in estimate, sweeps and search (closed
forms on the descriptor's power_w), and search rows' sustained request rate and concurrency."""
from __future__ import annotations

import json

import pytest

import graphsim as gs
from graphsim.cli import main


def test_estimate_reports_tokens_per_joule_at_board_power(capsys):
    assert main(["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "8", "--ep", "8", "--request",
                 "decode:4096x64", "--request", "prefill:2048", "--view", "sol", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    t, power = d["tokens"], gs.load_hw("gb200").power_w
    assert power == 1200.0  # hw/data/gb200.toml: 1,200 W per GPU
    assert t["energy_j"] == pytest.approx(d["forward_s"] * 8 * power, rel=1e-12)
    assert t["tokens_per_joule"] == pytest.approx((t["prefill_tokens"] + t["decode_tokens"]) / t["energy_j"], rel=1e-12)
    assert t["output_tokens_per_joule"] == pytest.approx(t["decode_tokens"] / t["energy_j"], rel=1e-12)


def test_sweep_rows_carry_energy():
    from graphsim.sweep import run

    res = run({"name": "e", "structure": {"model": "deepseek-v3", "hw": "h100", "mapping": {"tp": 8, "ep": 8}},
               "axes": {"decode.count": [8, 64], "decode.context": [4096]}}).to_pandas()
    assert (res["energy_j"] == res["forward_s"] * 8 * 700.0).all()  # hw/data/h100.toml: 700 W (SXM)
    assert (res["output_tokens_per_joule"] == res["decode_tokens"] / res["energy_j"]).all()


def test_search_rows_sustain_a_rate_a_concurrency_and_tokens_per_joule():
    from graphsim.serving.search import SLA, Space, Traffic, search

    r = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(2000, 500), sla=SLA(ttft_ms=3000, tpot_ms=60),
               space=Space(modes=("agg",), tp=(8,), ep=(8,), batches=(16, 64)), top=2, engine="none")
    t = r.table
    assert ((t["requests_per_s"] - t["output_tokens_per_s"] / 500.0).abs() < 1e-9).all()
    assert (t["concurrency"] == t["decode_batch"] * t["decode_replicas"]).all()
    assert ((t["output_tokens_per_joule"] - t["output_tokens_per_s"] / (t["gpus"] * 1200.0)).abs() < 1e-12).all()
    assert {"requests_per_s", "concurrency", "output_tokens_per_joule"} <= set(r.best[0])


def test_fewest_gpus_scale_replicas_to_the_load():
    import pandas as pd

    from graphsim.serving.capacity import fewest_gpus, gpus_for_load

    t = pd.DataFrame({"mode": ["agg", "agg", "disagg"], "mapping": ["tp8 x2", "tp4", "P tp4 + D tp4"],
                      "policies": ["default"] * 3, "decode_replicas": [2, 1, 1], "gpus": [16, 4, 8],
                      "requests_per_s": [10.0, 2.0, 6.0], "concurrency": [512, 64, 256],
                      "tokens_per_s_per_gpu": [1.0, 2.0, 3.0], "fits": [True, True, True],
                      "meets_sla": [True, True, False]})
    # 25 req/s: replicas of 5 req/s (8 GPUs) -> 5 x 8 = 40; of 2 req/s (4 GPUs) -> 13 x 4 = 52; disagg 5 x 8 = 40
    assert gpus_for_load(t, rate=25.0).tolist() == [40.0, 52.0, 40.0]
    # and 1,000 in flight: 512 per 16-GPU deployment of 2 replicas (256 each: 4 replicas, the rate needs 5); 64 per
    # 4-GPU replica -> 16 replicas; the disagg copy holds 256 (4 copies, the rate needs 5)
    assert gpus_for_load(t, rate=25.0, concurrency=1000).tolist() == [40.0, 64.0, 40.0]
    r = type("R", (), {"table": t})()
    cap = fewest_gpus(r, rate=25.0)
    assert cap["fewest_gpus"] == 40 and cap["replicas"] == 5 and cap["deployment"] == "agg tp8 x2 [default]"
    assert fewest_gpus(r, rate=1e9)["fewest_gpus"] > 0
    with pytest.raises(Exception, match="rate"):
        fewest_gpus(r)


def test_search_cli_prints_the_capacity(capsys):
    assert main(["search", "--model", "deepseek-v3", "--hw", "gb200", "--gpus", "8", "--isl", "2000", "--osl", "500",
                 "--ttft", "3000", "--tpot", "60", "--modes", "agg", "--tp", "8", "--ep", "8", "--batch", "16,64",
                 "--refine", "0", "--view", "sol", "--rate", "20", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    cap = d["capacity"]
    best = d["best"][0]
    per_replica = best["requests_per_s"] / best["decode_replicas"]
    assert cap["rate_per_s"] == 20 and cap["fewest_gpus"] <= -(-20 // per_replica) * best["gpus"] / best["decode_replicas"]
