"""Issue 25 item 4: a search under a measured view ranks by the prediction and carries each row's SOL twin —
the same deployment, batch and TTFT step at the speed of light."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphsim.cli import main
from graphsim.views.measured.view import ViewSpec
from graphsim.serving.search import SLA, SOL_COLUMNS, TWIN_KEYS, Space, Traffic, search

ROOT = Path(__file__).resolve().parents[1]
FIX = str(ROOT / "tests" / "data" / "measured")
SPACE = Space(tp=(4,), ep=(4,), batches=(8, 64), prefill_batches=(1,), modes=("agg",), refine=0)
ARGS = dict(gpus=8, traffic=Traffic.of(4000, 1000), sla=SLA(2000, 30), space=SPACE)


@pytest.fixture(scope="module")
def pair():
    view = ViewSpec("hybrid", FIX, "trtllm@1.3.0rc20")
    # the SOL search under the same engine's memory rule (the batches a TRT-LLM deployment admits), and under none
    return (search("deepseek-v3", "gb200", view=view, **ARGS), search("deepseek-v3", "gb200", engine="trtllm", **ARGS),
            search("deepseek-v3", "gb200", **ARGS))


def test_sol_view_rows_are_their_own_twin(pair):
    t = pair[2].table
    for own, sol in SOL_COLUMNS.items():
        assert np.array_equal(t[own].to_numpy(), t[sol].to_numpy())
    assert pair[2].stats["sol_programs_compiled"] == 0


def test_every_predicted_row_has_the_sol_of_the_same_row(pair):
    pred, sol, _ = pair
    t = pred.table
    assert t["bound"].eq("estimate").all() and t[list(SOL_COLUMNS.values())].notna().all().all()
    # the twin is what a SOL search (same engine memory rule) reports for the same deployment, batch and TTFT step
    ref = sol.table.set_index(list(TWIN_KEYS))
    got = t.set_index(list(TWIN_KEYS))
    common = got.index.intersection(ref.index)
    assert len(common) == len(got)
    for own, twin in SOL_COLUMNS.items():
        np.testing.assert_allclose(got.loc[common, twin].to_numpy(float), ref.loc[common, own].to_numpy(float),
                                   rtol=1e-12)
    # measured ops are never below SOL (issue 24): a prediction never beats its bound
    assert (t["tpot_ms"] >= t["sol_tpot_ms"] * (1 - 1e-9)).all()
    assert (t["tokens_per_s_per_gpu"] <= t["sol_tokens_per_s_per_gpu"] * (1 + 1e-9)).all()
    assert pred.stats["sol_programs_compiled"] > 0


def test_json_and_text_show_both(capsys):
    args = ["search", "--model", "deepseek-v3", "--hw", "gb200", "--gpus", "8", "--isl", "4000", "--osl", "1000",
            "--ttft", "2000", "--tpot", "30", "--tp", "4", "--ep", "4", "--batch", "8,64", "--modes", "agg",
            "--refine", "0", "--view", "hybrid", "--measured", FIX, "--backend", "trtllm@1.3.0rc20"]
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    b = d["best"][0]
    assert b["bound"] == "estimate" and b["sol_tokens_per_s_per_gpu"] >= b["tokens_per_s_per_gpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ranked by the prediction" in out and "SOL tok/s/GPU" in out


def test_estimate_prints_the_prediction_beside_its_bound(capsys):
    """`estimate --view hybrid`: the forward line and the JSON carry the same program's SOL forward; the
    prediction is never faster than it."""
    import graphsim as gs

    args = ["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "4", "--ep", "4", "--request",
            "decode:1024x16", "--view", "hybrid", "--measured", FIX, "--backend", "trtllm@1.3.0rc20"]
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    sol = gs.compile_plan("deepseek-v3", gs.Plan(["decode:1024x16"], gs.ParallelMapping(tp=4, ep=4)),
                          "gb200").report().forward_s
    assert d["coverage"]["sol_forward_s"] == pytest.approx(sol, rel=1e-12)
    assert d["coverage"]["prediction_over_sol"] == pytest.approx(d["forward_s"] / sol, rel=1e-12)
    assert d["forward_s"] >= sol
    assert d["prediction"] == {"source": "hybrid", "label": "hybrid view (trtllm@1.3.0rc20 tables)",
                               "sol_forward_s": d["coverage"]["sol_forward_s"],
                               "prediction_over_sol": d["coverage"]["prediction_over_sol"]}
    assert main(args) == 0
    assert "predicted (hybrid view (trtllm@1.3.0rc20 tables)); SOL" in capsys.readouterr().out


def test_without_tables_the_default_is_the_practitioner_profile_beside_the_bound(capsys):
    """Issue 25 item 4: `--view auto` (the default) without tables predicts with the practitioner profile and
    says so; the SOL forward of the same program stays beside it; `--view sol` is the bound alone."""
    import graphsim as gs

    args = ["estimate", "--model", "deepseek-v3", "--hw", "gb200", "--tp", "4", "--ep", "4", "--request",
            "decode:1024x16", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    plan = gs.Plan(["decode:1024x16"], gs.ParallelMapping(tp=4, ep=4))
    sol = gs.compile_plan("deepseek-v3", plan, "gb200").report().forward_s
    prof = gs.compile_plan("deepseek-v3", plan, "gb200", gs.load_profile("practitioner")).report().forward_s
    assert d["identity"]["profile"] == "practitioner" and d["forward_s"] == pytest.approx(prof, rel=1e-12)
    assert d["prediction"]["source"] == "profile" and d["prediction"]["label"] == "practitioner profile"
    assert d["prediction"]["sol_forward_s"] == pytest.approx(sol, rel=1e-12) and prof > sol
    assert main([*args, "--view", "sol"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert b["forward_s"] == pytest.approx(sol, rel=1e-12) and b["prediction"]["source"] == "sol"
    assert b["prediction"]["prediction_over_sol"] == 1.0
