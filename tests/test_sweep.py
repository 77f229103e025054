"""Sweeps: spec parsing, agreement with single-point reports, error rows, identity, resume, executors, plots."""
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.driver.metrics import KVTable, report_columns
from graphsim.sweep import SweepSpec, identity_columns, read_results, run

ROOT = Path(__file__).resolve().parents[1]


def v3_spec(**axes):
    return {"name": "t", "structure": {"model": "deepseek-v3", "hw": "gb200", "mapping": {"tp": 4, "ep": 4},
                                       "requests": "decode"},
            "axes": axes or {"decode.count": [8, 64], "decode.context": [1024, 4096]}}


# ---- spec ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,field", [
    ({"bogus": 1}, "spec"),
    ({"axes": {"decode.contxt": [1]}}, "axes.decode.contxt"),
    ({"axes": {"decode.count": [1]}}, "axes"),  # decode.context is required
    ({"axes": {"hw.nvlink_domain": [8], "decode.context": [1]}}, "axes.hw.nvlink_domain"),
    ({"axes": {"decode.context": {"start": 1, "stop": 9}}}, "axes.decode.context.num"),
    ({"axes": {"decode.context": [1, 2], "decode.count": [1]}, "zip": [["decode.context", "decode.count"]]}, "zip"),
    ({"outputs": ["nope"]}, "outputs"),
])
def test_spec_errors_name_the_field(change, field):
    d = v3_spec()
    d.update(change)
    with pytest.raises(GraphsimError) as e:
        SweepSpec.from_dict(d)
    assert e.value.field == field


def test_spec_ranges_zip_and_grid_shape():
    s = SweepSpec.from_dict({
        "structure": {"model": "deepseek-v3", "mapping": ["tp4-ep4", {"dp": 8, "ep": 8}],
                      "requests": ["decode", "prefill+decode"], "policies": {"fusion": ["unfused", "two-pass"]}},
        "axes": {"decode.count": [1, 2, 3], "decode.context": {"start": 1024, "stop": 8192, "num": 4, "scale": "log"},
                 "prefill.prompt": {"start": 100, "stop": 300, "step": 100}, "hw.hbm_bw": [8e12, 9e12, 1e13]},
        "zip": [["decode.count", "hw.hbm_bw"]]})
    assert s.axes[1].values == (1024.0, 2048.0, 4096.0, 8192.0)
    assert s.axes[2].values == (100.0, 200.0, 300.0)
    assert len(s.structural_points()) == 2 * 2 * 2
    assert s.grid(("decode",)).shape == (3, 4)  # prefill.prompt drops out; count and hbm_bw move together
    assert s.grid(("prefill", "decode")).size == 3 * 4 * 3


def test_spec_files_toml_and_yaml(tmp_path):
    (tmp_path / "s.toml").write_text('[structure]\nmodel = "deepseek-v3"\n[axes]\n"decode.context" = [1024]\n')
    assert SweepSpec.load(tmp_path / "s.toml").name == "s"
    pytest.importorskip("yaml")
    (tmp_path / "s.yaml").write_text("structure: {model: deepseek-v3}\naxes: {decode.context: [1024]}\n")
    assert SweepSpec.load(tmp_path / "s.yaml").axes[0].values == (1024.0,)


# ---- agreement with the single-point path ----------------------------------------------------------

@pytest.mark.parametrize("model,mapping,requests,axes", [
    ("deepseek-v3", {"tp": 4, "ep": 4}, ["decode:4096x64"], {"decode.count": 64, "decode.context": 4096}),
    ("llama-3.1-70b", {"tp": 8}, ["prefill:2048x2@512", "decode:8192x16"],
     {"prefill.count": 2, "prefill.prompt": 2048, "prefill.cached": 512, "decode.count": 16, "decode.context": 8192}),
    ("deepseek-v4.1-flash", {"dp": 8, "ep": 8}, ["decode:65536x64"], {"decode.count": 64, "decode.context": 65536}),
])
def test_sweep_row_equals_report(model, mapping, requests, axes):
    kinds = "+".join(r.split(":")[0] for r in requests)
    df = run({"structure": {"model": model, "hw": "gb300", "mapping": mapping, "requests": kinds},
              "axes": axes}).to_pandas()
    rep = gs.compile_plan(model, gs.Plan(requests, gs.ParallelMapping(**mapping)), "gb300").report()
    row = df.iloc[0]
    assert pd.isna(row["error"])
    for k, v in report_columns(rep).items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(row[k]), k
        else:
            assert row[k] == pytest.approx(v, rel=1e-9), k
    for s, v in rep.stages.items():
        assert row[f"stage_s.{s}"] == pytest.approx(v["busy_s"], rel=1e-9)


def test_workload_arrays_follow_plan_semantics():
    """A prefix hit without its SWA cache replays (encoder_replay on) or recomputes (off), as Plan.workload."""
    from graphsim.sweep import _group_values, _workload_arrays

    axes = {"prefill.prompt": np.array([4096.0]), "prefill.cached": np.array([1024.0]),
            "prefill.count": np.array([2.0]), "prefill.swa_cached": np.array([0.0])}
    for replay in ("on", "off"):
        pol = gs.Policies(encoder_replay=replay)
        got = _workload_arrays(("prefill",), _group_values(("prefill",), axes, 1), pol.identity())
        want = gs.Plan([gs.Request("prefill", 4096, 2, 1024, swa_cached=False)], policies=pol).workload().arrays()
        for f, a in want.items():
            np.testing.assert_array_equal(got[f], a, err_msg=f)


def test_hw_and_profile_axes_match_evaluate_with_overrides():
    d = v3_spec(**{"decode.count": [64], "decode.context": [4096], "hw.hbm_bw": [6e12, 8e12],
                   "profile.hbm": [0.8], "profile.op_overhead_s": [2e-6]})
    df = run(d).to_pandas()
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=4, ep=4)), "gb200")
    prof = gs.EfficiencyProfile("x", hbm=0.8, op_overhead_s=2e-6)
    for bw, got in zip((6e12, 8e12), df["forward_s"]):
        want = gs.compile_plan("deepseek-v3", c.plan, c.hw.with_overrides(hbm_bw=bw), prof).report().forward_s
        assert got == pytest.approx(want, rel=1e-9)
    assert df["forward_s"].iloc[0] > df["forward_s"].iloc[1]


def test_chunking_does_not_change_results():
    d = v3_spec(**{"decode.count": [1, 7, 64, -3], "decode.context": [100, 1000, 10000], "hw.hbm_bw": [8e12, 0.0]})
    a = run(d).to_pandas()
    b = run(SweepSpec.from_dict({**d, "chunk": 5})).to_pandas()
    pd.testing.assert_frame_equal(a, b)


def test_kv_table_scalar_fallback_matches_model():
    m = gs.load_model("deepseek-v4.1-flash")  # its kv_bytes takes one integer at a time
    kv = KVTable(m)
    n = np.array([[0.0, 4096.0], [131072.0, 4096.0]])
    np.testing.assert_array_equal(kv(n), [[m.kv_bytes(0), m.kv_bytes(4096)], [m.kv_bytes(131072), m.kv_bytes(4096)]])
    v3 = KVTable(gs.load_model("deepseek-v3"))
    assert v3(np.array([10.0, 20.0])).tolist() == [v3.model.kv_bytes(10), v3.model.kv_bytes(20)] and v3._vectorized


# ---- errors and identity ---------------------------------------------------------------------------

BAD = {
    "name": "bad",
    "structure": {"model": "deepseek-v3", "hw": "gb200", "mapping": [{"tp": 4, "ep": 4}, {"tp": 3}],
                  "requests": ["decode", "prefill"]},
    "axes": {"decode.count": [8, 64], "decode.context": [-5, 1024, 4096], "prefill.prompt": [512, 2048],
             "prefill.cached": [0, 1024], "hw.hbm_bw": [8e12, -1.0]},
}


def check_bad(df):
    struct = df[df["point"].isna()]
    assert len(struct) == 2 and (struct["tp"] == 3).all()  # one row per impossible program
    assert struct["error"].str.startswith("mapping.tp: 3 does not divide attention heads").all()
    good = df[(df["tp"] == 4)]
    dec, pre = good[good["requests"] == "decode"], good[good["requests"] == "prefill"]
    assert len(dec) == 2 * 3 * 2 and len(pre) == 2 * 2 * 2  # every point of the valid programs has a row
    neg = dec["decode.context"] < 0
    assert (dec.loc[neg, "error_field"] == "decode.context").all()
    assert dec.loc[neg, "error"].str.contains("must be an integer >= 1, got -5").all()
    bw = (dec["hw.hbm_bw"] < 0) & ~neg
    assert (dec.loc[bw, "error_field"] == "hw.hbm_bw").all()
    ok = dec["error"].isna()
    assert ok.sum() == 2 * 2 and (dec.loc[ok, "forward_s"] > 0).all()
    cached = (pre["prefill.cached"] >= pre["prefill.prompt"]) & (pre["hw.hbm_bw"] > 0)
    assert (pre.loc[cached, "error_field"] == "prefill.cached").all() and cached.sum() == 1
    assert pre["error"].isna().sum() == 3
    assert df.loc[df["error"].notna(), "forward_s"].isna().all()


def test_invalid_points_are_error_rows_and_the_rest_completes():
    r = run(BAD)
    df = r.to_pandas()
    check_bad(df)
    assert r.structural_errors == 2 and r.point_errors == len(df) - 2 - 7


def test_identity_columns_and_version():
    df = run({**v3_spec(), "structure": {**v3_spec()["structure"], "profile": ["sol", "practitioner"],
                                         "policies": {"fusion": ["unfused", "two-pass"]}}}).to_pandas()
    for c in identity_columns():
        assert c in df.columns, c
    assert (df["graphsim_version"] == gs.__version__).all()
    assert set(df["profile"]) == {"SOL", "practitioner"} and set(df["fusion"]) == {"unfused", "two-pass"}
    ident = list(identity_columns())
    assert (df.groupby("struct_id")[ident].nunique(dropna=False) == 1).all().all()  # one identity per struct_id
    assert df.groupby(ident[1:], dropna=False)["struct_id"].nunique().max() == 1
    assert df["struct_id"].nunique() == 4


# ---- output files, resume, CLI, executors ----------------------------------------------------------

def test_resume_skips_done_points_and_csv_matches_parquet(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    one = {**v3_spec(), "structure": {**v3_spec()["structure"], "mapping": [{"tp": 4, "ep": 4}]}}
    r1 = run(one, out)
    assert r1.skipped == 0 and r1.rows == 4
    two = {**one, "structure": {**one["structure"], "mapping": [{"tp": 4, "ep": 4}, {"dp": 8, "ep": 8}]}}
    r2 = run(two, out)
    assert r2.skipped == 1 and r2.rows == 8  # only the new mapping ran; the old rows are kept
    df = read_results(out)
    assert list(df["mapping"].unique()) == ["tp4-dp1-ep4-pp1", "tp1-dp8-ep8-pp1"]  # spec order
    r3 = run(two, out)
    assert r3.skipped == 2
    pd.testing.assert_frame_equal(read_results(out), df)
    csv = tmp_path / "r.csv"
    run(two, csv)
    c = read_results(csv)
    assert list(c.columns) == list(df.columns) and len(c) == len(df)
    np.testing.assert_allclose(c["forward_s"], df["forward_s"], rtol=1e-12)


def test_cli_sweep_and_plot(tmp_path, capsys):
    from graphsim.cli import main

    spec = tmp_path / "s.toml"
    spec.write_text('name = "cli"\noutputs = ["stages", "kinds"]\n[structure]\nmodel = "deepseek-v3"\n'
                    'mapping = [{tp = 4, ep = 4}, {tp = 3}]\n[axes]\n"decode.count" = [8, 64]\n'
                    '"decode.context" = [1024, 8192, 65536]\n')
    out = tmp_path / "r.parquet"
    assert main(["sweep", str(spec), "-o", str(out), "--no-progress"]) == 0
    assert "1 structural errors" in capsys.readouterr().out
    for kind in ("latency", "pareto", "kinds", "memory"):
        png = tmp_path / f"{kind}.png"
        assert main(["plot", str(out), "--kind", kind, "-o", str(png)]) == 0
        assert png.read_bytes()[:4] == b"\x89PNG"
    png = tmp_path / "roof.png"
    assert main(["plot", "--kind", "roofline", "--model", "deepseek-v3", "--request", "decode:4096x8", "-o", str(png)]) == 0
    assert png.stat().st_size > 0
    assert main(["plot", str(out), "--kind", "latency", "--x", "nope", "-o", str(png)]) == 2
    assert "x: no column 'nope'" in capsys.readouterr().err


def test_local_executor_does_not_import_ray():
    code = ("import sys, graphsim.sweep as s; s.run({'structure': {'model': 'llama-3.1-70b', 'mapping': {'tp': 8}}, "
            "'axes': {'decode.context': [128]}}); print('ray' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.slow
def test_ray_executor_matches_local(tmp_path, ray_local):
    local = run(BAD).to_pandas()
    remote = run(BAD, executor="ray").to_pandas()
    pd.testing.assert_frame_equal(local, remote)
    run(BAD, tmp_path / "r.parquet", executor="ray")
    check_bad(read_results(tmp_path / "r.parquet"))


# ---- plots -----------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=40))
def test_pareto_front_dominance(pts):
    from graphsim.exports.plots import pareto_front

    df = pd.DataFrame(pts, columns=["x", "y"]).astype(float)
    front = pareto_front(df, "x", "y")
    F = front[["x", "y"]].to_numpy()
    P = df[["x", "y"]].to_numpy()

    def dominates(a, b):
        return (a >= b).all() and (a > b).any()

    assert not any(dominates(p, f) for f in F for p in P)  # nothing beats a front point
    for p in P:  # every point is on the front or weakly beaten by a front point
        assert any((f >= p).all() for f in F)
    assert (np.diff(F[:, 0]) >= 0).all()


# ---- the example -----------------------------------------------------------------------------------

def test_example_small(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "run_sweep.py"), str(tmp_path), "--small"],
                       capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert r.returncode == 0, r.stderr
    df = read_results(tmp_path / "results.parquet")
    for c in (*identity_columns(), "point", "decode.count", "decode.context", "hw.hbm_bw", "forward_s",
              "stage_s.decoder", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "itl_s", "kv_gib", "fits", "error"):
        assert c in df.columns, c
    assert (df["model"] == "deepseek-v4.1-flash").all() and df["error"].isna().all()
    assert len(df) == df["struct_id"].nunique() * 8  # 2 values on each of 3 axes
    for name in ("latency", "pareto", "memory"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    from graphsim.exports.plots import pareto_front

    ok = df[df["fits"].astype(bool)]
    front = pareto_front(ok, "tokens_per_s_per_user", "tokens_per_s_per_gpu")
    for _, f in front.iterrows():
        better = (ok["tokens_per_s_per_user"] >= f["tokens_per_s_per_user"]) & \
                 (ok["tokens_per_s_per_gpu"] >= f["tokens_per_s_per_gpu"]) & \
                 ((ok["tokens_per_s_per_user"] > f["tokens_per_s_per_user"]) |
                  (ok["tokens_per_s_per_gpu"] > f["tokens_per_s_per_gpu"]))
        assert not better.any()


# ---- kernel outputs added for sweeps ---------------------------------------------------------------

def test_kernel_kinds_workspace_components_match_reference():
    from graphsim.core.ir import COMPONENTS
    from graphsim.lowering.evaluate import op_kinds

    c = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:1024@256", "decode:4096x16"], gs.ParallelMapping(tp=4, ep=4)),
                        "gb200")
    wl = gs.Workload.stack([c.plan.workload()] * 3)
    out = c.evaluate(wl, outputs=("forward", "stages", "kinds", "workspace", "components"))
    ref = c.schedule(wl)
    kinds = op_kinds(c.program)
    for j, k in enumerate(kinds):
        mask = np.array([op.kind == k for op in c.graph.ops])
        np.testing.assert_allclose(out["kinds"][:, j], ref.duration[:, mask].sum(axis=1), rtol=1e-9)
    np.testing.assert_allclose(out["kinds"].sum(axis=1), out["stages"].sum(axis=1), rtol=1e-12)
    act = ref.components[:, :, COMPONENTS.index("bytes_act")]
    np.testing.assert_allclose(out["workspace"], act.max(axis=1), rtol=1e-12)
    np.testing.assert_allclose(out["components"], ref.components.sum(axis=1), rtol=1e-9)
    base = c.evaluate(wl)  # the default outputs are unchanged
    assert set(base) == {"forward", "stages"}
    np.testing.assert_array_equal(base["forward"], out["forward"])


def test_exp_rate_and_tier_axes():
    """hw.exp_rate is a what-if like any rate: a softmax-bound 64K FP8 prefill on GB200 speeds up with it until
    the tensor cores bound it; prefill.tier moves a prefix hit between HBM (0), host (1) and disk (2)."""
    d = {"name": "t", "structure": {"model": "deepseek-v3", "hw": "gb200", "mapping": {"tp": 8},
                                    "requests": "prefill", "policies": {"attention_precision": "fp8"}},
         "axes": {"prefill.prompt": [65536], "hw.exp_rate": [5e12, 10.7e12, 1e15]}}
    df = run(d).to_pandas()
    t = df["forward_s"].to_numpy()
    assert t[0] > t[1] >= t[2]  # past GB300's rate the tensor cores bound the attention
    want = gs.compile_plan("deepseek-v3", gs.Plan(["prefill:65536"], gs.ParallelMapping(tp=8),
                                                  gs.Policies(attention_precision="fp8")), "gb300").report().forward_s
    assert t[1] == pytest.approx(want, rel=0.02)  # GB300's SFU on GB200: within the NIC/C2C differences
    d = {"name": "t", "structure": {"model": "deepseek-v3", "hw": "h200", "requests": "prefill"},
         "axes": {"prefill.prompt": [40000], "prefill.cached": [32000], "prefill.tier": [0, 1, 2, 3]}}
    df = run(d).to_pandas()
    t = df["forward_s"].to_numpy()
    assert t[0] < t[1] < t[2]
    assert df["error_field"].iloc[3] == "prefill.tier"


def test_models_with_load_options_are_structural_points(tmp_path):
    # structure.model takes {name, weights, redundant_experts}: EP48 runs with 256 + 32 expert slots, the
    # plain model is that mapping's error row, and an unknown format is its own point's error, naming it
    spec = {"name": "opts", "structure": {
        "model": [{"name": "deepseek-v3", "redundant_experts": 32}, "deepseek-v3",
                  {"name": "deepseek-v3", "weights": "int3"}],
        "hw": "gb200", "mapping": [{"dp": 48, "ep": 48}], "requests": ["decode"]},
        "axes": {"decode.count": [64], "decode.context": [4096]}}
    df = run(spec, tmp_path / "r.parquet").to_pandas().set_index("model")
    assert df.loc["deepseek-v3[redundant_experts=32]", "forward_s"] > 0
    assert df.loc["deepseek-v3", "error_field"] == "mapping.ep"
    assert df.loc["deepseek-v3[weights=int3]", "error_field"] == "weights"
    with pytest.raises(gs.GraphsimError, match="structure.model: unknown keys"):
        SweepSpec.from_dict({**spec, "structure": {**spec["structure"], "model": [{"name": "x", "tp": 2}]}})
