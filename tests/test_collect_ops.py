"""``graphsim collect ops``: local op tables timed with JAX on the default device, in the measured-table
format, priced back by the OP / Hybrid views. Tiny grids (the shapes of a tiny Llama), a few seconds."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

import graphsim as gs
import graphsim.hw
from graphsim.cli import main
from graphsim.views.collect.ops import FAMILIES, cartesian, collect_ops, default_grid
from graphsim.core.errors import GraphsimError
from graphsim.views.measured.store import Store
from graphsim.views.measured.view import ViewSpec

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
         "max_position_embeddings": 4096, "tie_word_embeddings": False, "hidden_act": "silu", "rms_norm_eps": 1e-5}

#: per rank of the tiny Llama at tp 1: wqkv 256 -> (4 + 2·2)·64 = 512, wo 256 -> 256, gate_up 256 -> 1024,
#: down 512 -> 256, head 256 -> 1000; decode of 2 requests at ~256 cached positions; norms over 256, SwiGLU
#: over 512; K/V writes of 512 B per token
GRID = {
    "gemm": cartesian(dtype="bfloat16", m=(1, 2), n=(256, 512, 1024), k=(256, 512))
    + [{"dtype": "bfloat16", "m": 2048, "n": 256, "k": 256}, {"dtype": "float32", "m": 2, "n": 256, "k": 256}],
    "attention_context": cartesian(batch=1, seq=(16, 64), heads=4, kv_heads=2, head_dim=64, window=(0, 16)),
    "attention_generation": cartesian(batch=(1, 2), ctx=(128, 512), heads=4, kv_heads=2, head_dim=64, window=0),
    "elementwise": cartesian(op="rmsnorm", tokens=(1, 4), elems=256)
    + cartesian(op="silu_mul", tokens=(1, 4), elems=512),
    "copy": cartesian(bytes=(256, 4096)),
}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """(tables folder, descriptor path, config path, summary) of one tiny collection."""
    tmp = tmp_path_factory.mktemp("collect_ops")
    toml = (Path(graphsim.hw.__file__).parent / "data" / "gb200.toml").read_text()
    assert 'name = "GB200"' in toml
    hw = tmp / "testcpu.toml"
    hw.write_text(toml.replace('name = "GB200"', 'name = "testcpu"'))
    cfg = tmp / "llama" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(LLAMA))
    out = tmp / "tables"
    summary = collect_ops(str(hw), str(out), grid=GRID, warmup=1, reps=3)
    return out, str(hw), str(cfg), summary


def test_tables_load_with_the_collectors_identity(local):
    from graphsim.views.collect.env import environment

    out, _, _, summary = local
    env = environment("testcpu")
    assert summary["rows"] == {f: len(GRID[f]) for f in FAMILIES}
    assert summary["backend"] == f"jax@{env['version']}"
    for fam in FAMILIES:
        assert (out / "testcpu" / fam / f"jax@{env['version']}" / "local.parquet").is_file()
    parts = Store(out).partitions("testcpu")
    assert {p.family for p in parts} == set(FAMILIES)
    for p in parts:
        i = p.identity
        assert (i["device"], i["framework"], i["version"], i["boundary"]) == ("testcpu", "jax", env["version"], "kernel")
        assert i["image_digest"] == env["image_digest"] and i["image_digest"].startswith("env:sha256:")
        assert i["kernel_source"].startswith(env["kernel_source"]) and i["source"].startswith("graphsim collect ops r")
        assert i["collected"] == env["collected"]
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["timing"]["warmup"] == 1 and prov["timing"]["reps"] == 3 and "median" in prov["timing"]["statistic"]
    assert set(prov["families"]) == set(FAMILIES) and prov["environment"]["image_digest"] == env["image_digest"]


def test_latencies_are_finite_positive_and_grow_with_the_work(local):
    import pandas as pd

    out = local[0]
    for f in out.rglob("*.parquet"):
        df = pd.read_parquet(f)
        assert (df["reps"] == 3).all()
        assert all(math.isfinite(t) and t > 0 for t in df["latency_s"])
        assert (df["latency_min_s"] <= df["latency_s"]).all()
    g = pd.read_parquet(next(out.rglob("gemm/*/local.parquet")))
    at = {(r.dtype, r.m, r.n, r.k): r.latency_s for r in g.itertuples()}
    # 2048x the FLOPs: far beyond any timing noise
    assert at[("bfloat16", 2048, 256, 256)] > at[("bfloat16", 1, 256, 256)]
    assert set(g["dtype"]) == {"bfloat16", "float32"}


def test_a_plan_is_priced_from_the_local_tables(local):
    out, hw, cfg, _ = local
    c = gs.compile_plan(cfg, gs.Plan(["decode:256x2"]), hw, view=ViewSpec("hybrid", str(out), "jax"))
    src = {}
    for op, s, fam in zip(c.graph.ops, c.view.op_source, c.view.op_family):
        src.setdefault(op.kind, set()).add((s, fam))
    assert src["gemm"] == {("table", "gemm")}
    assert src["attention"] == {("table", "attention_generation")}
    assert src["norm"] == {("table", "elementwise")}
    assert src["activation"] == {("table", "elementwise")}
    assert src["cache_write"] == {("table", "copy")}
    assert src["embedding"] == {("sol", "")}
    cov = c.report().to_dict()["coverage"]
    for kind in ("gemm", "attention", "norm", "activation", "cache_write"):
        n = cov["kinds"][kind]["sources"]
        assert n["fallback"] == 0 and n["sol"] == 0 and n["measured"] + n["interpolated"] + n["extrapolated"] > 0
        assert cov["kinds"][kind]["view_s"] > 0
    i = c.graph.op_index["layers.0.wo"]  # m = 2 tokens, n = k = 256: a measured row, returned exactly
    s = c.schedule()
    part = next(p for p in Store(out).partitions("testcpu", "gemm") if p.key == c.view.op_note[i])
    row = (part.x[:, 0] == 2) & (part.x[:, 1] == 256) & (part.x[:, 2] == 256)
    assert s.duration[0, i] == part.t[row][0]
    # the strict op view covers every op a family times
    op = gs.compile_plan(cfg, gs.Plan(["decode:256x2"]), hw, view=ViewSpec("op", str(out), "jax"))
    assert {s for o, s in zip(op.graph.ops, op.view.op_source) if o.kind != "embedding"} == {"table"}


def test_a_backend_without_the_local_families_prices_those_ops_at_sol(local, tmp_path):
    out, hw, cfg, _ = local
    part = tmp_path / "tables"
    shutil.copytree(out, part)
    for fam in ("elementwise", "copy"):
        shutil.rmtree(part / "testcpu" / fam)
    c = gs.compile_plan(cfg, gs.Plan(["decode:256x2"]), hw, view=ViewSpec("op", str(part), "jax"))
    for o, s, note in zip(c.graph.ops, c.view.op_source, c.view.op_note):
        if o.kind in ("norm", "activation", "cache_write"):
            assert s == "sol" and "collect ops" in note
        elif o.kind in ("gemm", "attention"):
            assert s == "table"


def test_windowed_kernels_match_the_masked_reference():
    """The collector times the executor's attention (graphsim.views.collect.kernels): banded prompt, full, decode."""
    import jax
    import jax.numpy as jnp

    from graphsim.views.collect.ops import _attend

    def _prefill(q, k, v, w):
        return _attend(q, k, v, w)

    def _decode(q1, k, v, w):  # one query (the last position) over the cache
        return _attend(q1[:, None], k, v, w)[:, 0]

    rng = np.random.default_rng(0)
    b, s, H, hk, d, W = 2, 37, 4, 2, 16, 8
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.float32) for h in (H, hk, hk))
    blocked = _prefill(q, k, v, W)
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    kk, vv = np.repeat(np.asarray(k), H // hk, axis=2), np.repeat(np.asarray(v), H // hk, axis=2)
    sc = np.einsum("bqhd,bkhd->bhqk", np.asarray(q), kk) / math.sqrt(d)
    sc = np.where((j <= i) & (i - j < W), sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vv)
    np.testing.assert_allclose(np.asarray(blocked), ref, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.asarray(_prefill(q, k, v, 0)), np.asarray(jax.jit(_prefill, static_argnums=3)(q, k, v, s)),
                               rtol=1e-5, atol=1e-5)
    # decode over the last W positions = the last prefill row of the same window
    dec = _decode(q[:, -1], k, v, W)
    np.testing.assert_allclose(np.asarray(dec), ref[:, -1], rtol=2e-4, atol=2e-4)


def test_default_grids_bound_work_and_memory_on_a_cpu():
    for quick in (False, True):
        g = default_grid("cpu", quick)
        assert set(g) == set(FAMILIES) and all(len(p) > 0 for p, _ in g.values())
        assert all(p["n"] * p["k"] <= 2 ** 24 for p in g["gemm"][0])
        assert all(2 * 2 * p["batch"] * p["ctx"] * p["kv_heads"] * p["head_dim"] <= 2 ** 25
                   for p in g["attention_generation"][0])
        ms = {p["m"] for p in g["gemm"][0]}
        assert 1 in ms and max(ms) >= 1024
    assert len(default_grid("cpu", True)["gemm"][0]) < len(default_grid("cpu", False)["gemm"][0])


def test_cli_and_errors(tmp_path, capsys):
    toml = (Path(graphsim.hw.__file__).parent / "data" / "gb200.toml").read_text()
    hw = tmp_path / "testcpu.toml"
    hw.write_text(toml.replace('name = "GB200"', 'name = "testcpu"'))
    assert main(["collect", "ops", "--hw", str(hw), "-o", str(tmp_path / "t"), "--family", "copy", "--quick",
                 "--warmup", "0", "--reps", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert [p.family for p in Store(tmp_path / "t").partitions("testcpu")] == ["copy"]
    with pytest.raises(GraphsimError, match="family"):
        collect_ops(str(hw), str(tmp_path / "u"), families=["nope"])
    with pytest.raises(GraphsimError, match="reps"):
        collect_ops(str(hw), str(tmp_path / "u"), reps=0)
