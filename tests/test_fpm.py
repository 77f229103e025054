"""The FPM loop: graphsim's compiled graph executed op for op, forward samples with failure categories, fits
that never pool partitions, the fpm view on estimate / sweep, and held-out error reports (docs/fpm.md)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.views.collect.execute import Unsupported, lower_to_jax
from graphsim.views.collect.kernels import gqa_attention, grouped_experts
from graphsim.views.collect.forward import collect_forward, parse_grid
from graphsim.core.errors import GraphsimError
from graphsim.views.fpm.fit import fit, predict
from graphsim.views.fpm.schema import COORDS, IDENTITY, STATUSES, plan_identity, sample_identity

LLAMA = "examples/configs/tiny-llama.json"
MOE = "examples/configs/tiny-qwen3-moe.json"


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """A very small Llama config (forwards in milliseconds)."""
    p = tmp_path_factory.mktemp("cfg") / "micro-llama.json"
    p.write_text(json.dumps({
        "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_act": "silu", "max_position_embeddings": 1024, "tie_word_embeddings": False}))
    return str(p)


# ---- the executed graph is the priced graph --------------------------------------------------------

@pytest.mark.parametrize("model", [LLAMA, MOE])
def test_executed_ops_are_the_priced_ops(model):
    c = gs.compile_plan(model, gs.Plan(["prefill:32x2", "decode:64x3"]), "gb200")
    ex = lower_to_jax(c)
    assert len(ex.steps) == len(c.graph.ops)
    for st, op in zip(ex.steps, c.graph.ops):
        assert st.op is op  # the same object the cost program priced, in program order
    kinds = {st.op.kind for st in ex.steps}
    assert {"gemm", "attention", "cache_write", "norm", "embedding"} <= kinds
    if model == MOE:
        assert {"moe_experts", "router"} <= kinds
    params, caches, ids = ex.init(0)
    logits, caches = ex.fn(params, caches, ids)
    # the head reads the token set "last": one row per prefill request, every decode request
    assert logits.shape == (2 + 3, 8192)
    assert np.isfinite(np.asarray(logits, np.float32)).all()


def test_unsupported_plans_name_the_reason(micro):
    c = gs.compile_plan(micro, gs.Plan(["decode:64x2"], gs.ParallelMapping(tp=2)), "gb200")
    with pytest.raises(Unsupported, match="one device"):
        lower_to_jax(c)
    c = gs.compile_plan(micro, gs.Plan(["prefill:64@32"]), "gb200")  # prefix in host memory by default
    with pytest.raises(Unsupported, match="host"):
        lower_to_jax(c)


@pytest.mark.parametrize("past,new,window", [(5, 3, 0), (5, 3, 4), (9, 1, 4), (0, 11, 4), (0, 11, 0)])
def test_attention_kernel_matches_a_reference(past, new, window):
    """Full, windowed (the cache read from past + 1 - W on), decode and banded prompt (past 0, new > 2W) paths."""
    rng = np.random.default_rng(0)
    b, H, Hkv, d = 2, 4, 2, 8
    q = rng.normal(size=(b, new, H, d)).astype(np.float32)
    k = rng.normal(size=(b, past + new, Hkv, d)).astype(np.float32)
    v = rng.normal(size=(b, past + new, Hkv, d)).astype(np.float32)
    got = np.asarray(gqa_attention(q, k, v, past, new, window))
    ref = np.zeros_like(got)
    for r in range(b):
        for i in range(new):
            for h in range(H):
                kv = h // (H // Hkv)
                pos = past + i
                keys = [j for j in range(past + new) if j <= pos and (not window or j > pos - window)]
                s = np.array([q[r, i, h] @ k[r, j, kv] for j in keys]) / np.sqrt(d)
                p = np.exp(s - s.max())
                p /= p.sum()
                ref[r, i, h] = sum(pj * v[r, j, kv] for pj, j in zip(p, keys))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_grouped_experts_match_a_per_token_loop():
    rng = np.random.default_rng(1)
    T, k, E, h, i = 7, 3, 5, 8, 6
    x = rng.normal(size=(T, h)).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    w = rng.random((T, k)).astype(np.float32)
    wu = rng.normal(size=(E, h, 2 * i)).astype(np.float32)
    wd = rng.normal(size=(E, i, h)).astype(np.float32)
    got = np.asarray(grouped_experts(x, w, ids, wu, wd, "silu", "float32"))
    ref = np.zeros((T, h))
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            g = x[t] @ wu[e]
            a = g[:i] / (1 + np.exp(-g[:i])) * g[i:]
            ref[t] += w[t, j] * (a @ wd[e])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


# ---- forward samples ----------------------------------------------------------------------------------

def test_parse_grid_is_a_cartesian_product():
    mixes = parse_grid("decode:128,512x1,4;prefill:64x2@32+decode:256x2")
    assert mixes == [["decode:128x1"], ["decode:128x4"], ["decode:512x1"], ["decode:512x4"],
                     ["prefill:64x2@32:hbm", "decode:256x2"]]
    for bad in ("decode:abc", "encode:12", "decode:12@3", ""):
        with pytest.raises(GraphsimError, match="grid"):
            parse_grid(bad)


def test_collect_forward_keeps_every_point_with_its_category(micro, tmp_path, monkeypatch):
    out = tmp_path / "s.parquet"
    mixes = parse_grid("decode:32x1,2;prefill:16x2;prefill:16x1+decode:32x2;decode:5000x1")
    df = collect_forward(micro, mixes, "gb200", out, warmup=0, reps=2)
    assert len(df) == len(mixes)  # nothing dropped
    by = dict(zip(df["requests"], df["status"]))
    assert by["decode:5000x1"] == "unsupported"  # beyond the config's 1,024 positions: a row, not a crash
    ok = df[df["status"] == "ok"]
    assert len(ok) == len(mixes) - 1
    assert (ok["latency_s"] > 0).all() and (ok["sol_s"] > 0).all() and (ok["latency_min_s"] <= ok["latency_s"]).all()
    row = ok[ok["requests"] == "prefill:16x1+decode:32x2"].iloc[0]
    assert (row["prefill_requests"], row["prefill_tokens"], row["decode_requests"], row["decode_past"]) == (1, 16, 2, 64)
    assert set(df["status"]) <= set(STATUSES)
    back = pd.read_parquet(out)
    assert list(back["requests"]) == list(df["requests"]) and set(IDENTITY) <= set(back.columns)
    # a mapping one device cannot run is a failure row too
    df2 = collect_forward(micro, [["decode:32x2"]], "gb200", tmp_path / "tp2.parquet", warmup=0, reps=1,
                          mapping=(2, 1, 1, 1, 1))
    assert list(df2["status"]) == ["unsupported"] and "one device" in df2["error"][0]
    # non-finite logits are invalid output, not a latency
    import graphsim.views.collect.execute as ex_mod

    real = ex_mod.init_params

    def nan_params(c, seed=0):
        return {k: v * np.nan for k, v in real(c, seed).items()}

    monkeypatch.setattr(ex_mod, "init_params", nan_params)
    df3 = collect_forward(micro, [["decode:32x1"]], "gb200", tmp_path / "nan.parquet", warmup=0, reps=1)
    assert list(df3["status"]) == ["invalid_output"]


# ---- fits: partitions are never pooled --------------------------------------------------------------

def _synthetic(model_arg, versions=("0.1",), ratio_of=None, hw="gb200", grid=None):
    """Samples of a real plan identity with known measured/SOL ratios (no timing)."""
    m = gs.load_model(model_arg)
    spec = gs.load_hw(hw)
    rows = []
    grid = grid or [(b, c) for b in (1, 2, 4, 8) for c in (64, 128, 256, 512)]
    for ver in versions:
        env = {"framework": "jax", "version": ver, "image_digest": f"env:{ver}", "kernel_source": "xla:cpu",
               "instrumentation": "test", "device_name": "test cpu", "devices": 1}
        for b, ctx in grid:
            plan = gs.Plan([f"decode:{ctx}x{b}"])
            ident = sample_identity(m, plan.mapping, plan.policies, spec, env, 1)
            sol = 1e-3 * b + 1e-6 * ctx
            r = ratio_of(ver, b, ctx) if ratio_of else 2.0
            rows.append({**ident, "requests": f"decode:{ctx}x{b}", "prefill_requests": 0, "prefill_tokens": 0,
                         "prefill_past": 0, "decode_requests": b, "decode_tokens": b, "decode_past": b * ctx,
                         "latency_s": sol * r, "latency_min_s": sol * r, "latency_p90_s": sol * r, "reps": 3,
                         "compile_s": 0.1, "sol_s": sol, "status": "ok", "error": ""})
    return pd.DataFrame(rows)


def test_fit_never_mixes_backends(micro):
    # two versions of one runtime whose forwards are 1.5x and 4x their SOL: pooled they would give ~2.4x
    df = _synthetic(micro, ("0.1", "0.2"), lambda v, b, c: 1.5 if v == "0.1" else 4.0)
    model = fit(df)
    assert len(model.partitions) == 2
    for part in model.partitions:
        want = 1.5 if part.identity["version"] == "0.1" else 4.0
        sub = df[df["version"] == part.identity["version"]]
        pr = predict(part, {c: sub[c].to_numpy() for c in COORDS}, sub["sol_s"].to_numpy())
        np.testing.assert_allclose(pr.t / sub["sol_s"].to_numpy(), want, rtol=1e-6)
        assert pr.inside.all()
    ident = plan_identity(gs.load_model(micro), gs.ParallelMapping(), gs.Policies(), gs.load_hw("gb200"))
    with pytest.raises(GraphsimError, match="2 FPM partitions match.*version"):
        model.find(ident)
    assert model.find(ident, "jax@0.2").identity["version"] == "0.2"


def test_fit_interpolates_inside_and_marks_extrapolation(micro):
    # a ratio piecewise-linear in log(1 + batch) with a knot at a sampled batch: reproduced exactly
    def ratio(_v, b, _c):
        z = np.log1p(b)
        return float(np.exp(0.5 - 0.2 * z + 0.4 * max(0.0, z - np.log1p(2))))

    df = _synthetic(micro, ratio_of=ratio)
    part = fit(df).partitions[0]
    cols = {c: np.zeros(3, np.int64) for c in COORDS}
    cols["decode_requests"] = np.array([3, 6, 32])
    cols["decode_tokens"] = cols["decode_requests"]
    cols["decode_past"] = cols["decode_requests"] * np.array([200, 100, 100])
    sol = np.ones(3)
    pr = predict(part, cols, sol)
    np.testing.assert_allclose(pr.t[:2], [ratio(0, 3, 0), ratio(0, 6, 0)], rtol=1e-3)
    assert list(pr.inside) == [True, True, False] and pr.outside_names(2) == ["decode_requests"]
    # flat beyond the data: the ratio at the edge (8 requests), the forward scaling like SOL
    np.testing.assert_allclose(pr.t[2], ratio(0, 8, 0), rtol=1e-3)
    # a request mix never sampled has no curve
    cols["prefill_requests"] = np.array([1, 0, 0])
    pr = predict(part, cols, sol)
    assert np.isnan(pr.t[0]) and not pr.inside[0]


# ---- the fpm view on estimate and sweep; eval ---------------------------------------------------------

@pytest.fixture(scope="module")
def fpm_file(micro, tmp_path_factory):
    d = tmp_path_factory.mktemp("fpm")
    df = _synthetic(micro, ratio_of=lambda v, b, c: 3.0)
    df.to_parquet(d / "train.parquet", index=False)
    assert main(["fpm", "fit", str(d / "train.parquet"), "-o", str(d / "m.fpm")]) == 0
    return d


def test_estimate_in_the_fpm_view(micro, fpm_file, capsys):
    capsys.readouterr()
    assert main(["estimate", "--model", micro, "--hw", "gb200", "--request", "decode:200x3", "--view", "fpm",
                 "--fpm", str(fpm_file / "m.fpm"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    cov = rep["fpm"]
    assert rep["identity"]["view"] == "fpm" and cov["domain"] == "in"
    assert rep["forward_s"] == pytest.approx(3.0 * cov["sol_forward_s"], rel=1e-9)
    assert rep["tokens"]["itl_s"] == pytest.approx(rep["forward_s"])
    # outside the sampled batches: answered, marked
    assert main(["estimate", "--model", micro, "--hw", "gb200", "--request", "decode:200x64", "--view", "fpm",
                 "--fpm", str(fpm_file / "m.fpm")]) == 0
    assert "EXTRAPOLATED (outside the samples in decode_requests)" in capsys.readouterr().out
    # another mapping, descriptor or request mix: refused with one line naming what differs
    for extra, what in ((["--request", "decode:200x2", "--tp", "2"], "mapping"),
                        (["--request", "decode:200x2", "--hw", "gb300"], "device"),
                        (["--request", "prefill:64x2"], "no prefill forwards")):
        argv = ["estimate", "--model", micro, "--view", "fpm", "--fpm", str(fpm_file / "m.fpm")] + extra
        if "--hw" not in extra:
            argv += ["--hw", "gb200"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and what in err


def test_sweep_in_the_fpm_view(micro, fpm_file, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(f'''name = "fpm"
[structure]
model = "{micro}"
hw = "gb200"
requests = ["decode"]
view = ["sol", "fpm"]
fpm = "{fpm_file / 'm.fpm'}"
[axes]
"decode.count" = [2, 16]
"decode.context" = [128]
''')
    assert main(["sweep", str(spec), "-o", str(tmp_path / "r.parquet")]) == 0
    r = pd.read_parquet(tmp_path / "r.parquet")
    f = r[r["view"] == "fpm"].sort_values("decode.count")
    assert list(f["fpm_domain"]) == ["in", "extrapolated"]
    np.testing.assert_allclose(f["forward_s"], 3.0 * f["sol_forward_s"], rtol=1e-9)
    s = r[r["view"] == "sol"].sort_values("decode.count")
    np.testing.assert_allclose(s["forward_s"].to_numpy(), f["sol_forward_s"].to_numpy(), rtol=1e-12)


def test_eval_reports_all_views_and_failures(micro, fpm_file, tmp_path, capsys):
    hold = _synthetic(micro, ratio_of=lambda v, b, c: 3.3, grid=[(3, 100), (16, 100)])
    bad = hold.iloc[:1].copy()
    bad["status"], bad["error"], bad["latency_s"] = "oom", "RESOURCE_EXHAUSTED", np.nan
    pd.concat([hold, bad]).to_parquet(tmp_path / "h.parquet", index=False)
    capsys.readouterr()
    assert main(["fpm", "eval", str(fpm_file / "m.fpm"), "--holdout", str(tmp_path / "h.parquet"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    views = {(v["view"], v["domain"]): v for v in rep["views"]}
    assert views[("fpm", "in")]["median"] == pytest.approx(abs(3.0 - 3.3) / 3.3, rel=1e-6)
    assert views[("fpm", "out")]["n"] == 1 and views[("sol", "in")]["median"] == pytest.approx(1 - 1 / 3.3)
    assert rep["failures"] == {"oom": 1} and rep["sol_bound"]["violations"] == 0
    assert main(["fpm", "eval", str(fpm_file / "m.fpm"), "--holdout", str(tmp_path / "h.parquet")]) == 0
    text = capsys.readouterr().out
    assert "fpm   in" in text and "failures: oom 1" in text


@pytest.mark.full  # the example end to end (~80 s on 2 cores); the suite checks its parts (collect forward, fpm
# fit / eval) in the tests above
def test_local_fpm_example_runs_end_to_end(tmp_path):
    """examples/local_fpm.py --quick: probe, op tables, forwards, fit and the held-out table of all three views."""
    import pathlib
    import subprocess
    import sys

    ex = pathlib.Path(__file__).parent.parent / "examples" / "local_fpm.py"
    r = subprocess.run([sys.executable, str(ex), "--quick"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    for view in ("sol", "op", "fpm"):
        for dom in ("in", "out"):
            assert f"\n{view:<5} {dom:<7}" in out
    assert "SOL bound" in out and (tmp_path / "local_fpm" / "model.fpm").is_file()


def test_disagg_takes_the_fpm_view(micro, fpm_file, capsys):
    """disagg reads its forwards from the FPM partition: a phase it never sampled is refused, never priced at SOL."""
    base = ["disagg", "--model", micro, "--hw", "gb200", "--isl", "64", "--osl", "32", "--prefill", "tp=1",
            "--decode", "tp=1", "--json"]
    capsys.readouterr()
    assert main(base + ["--view", "fpm", "--fpm", str(fpm_file / "m.fpm")]) == 2
    err = capsys.readouterr().err
    assert "no prefill forwards" in err and err.count("\n") == 1
