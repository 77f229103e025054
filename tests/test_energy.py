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
    from graphsim.search import SLA, Space, Traffic, search

    r = search("deepseek-v3", "gb200", gpus=8, traffic=Traffic.of(2000, 500), sla=SLA(ttft_ms=3000, tpot_ms=60),
               space=Space(modes=("agg",), tp=(8,), ep=(8,), batches=(16, 64)), top=2, engine="none")
    t = r.table
    assert ((t["requests_per_s"] - t["output_tokens_per_s"] / 500.0).abs() < 1e-9).all()
    assert (t["concurrency"] == t["decode_batch"] * t["decode_replicas"]).all()
    assert ((t["output_tokens_per_joule"] - t["output_tokens_per_s"] / (t["gpus"] * 1200.0)).abs() < 1e-12).all()
    assert {"requests_per_s", "concurrency", "output_tokens_per_joule"} <= set(r.best[0])
