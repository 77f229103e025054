"""Issue 25 item 1: beyond a table's sampled range a measured view extrapolates by the op's work, not by the
coordinate — a causal prefill grows with its (query, key) pairs at the efficiency trend of the kernel's last
measured rows, every other coordinate in proportion — and an extrapolated time is never below SOL."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import graphsim as gs
from graphsim.views.measured.interp import EXTRAPOLATED, MEASURED, build_curve, eval_curve
from graphsim.views.measured.schema import COMMON
from graphsim.views.measured.store import Store
from graphsim.views.measured.view import ViewSpec

ROOT = Path(__file__).resolve().parents[1]
FMHA = str(ROOT / "tests" / "data" / "measured_fmha")  # TRT-LLM MLA context, 128 heads, GB200 + GB300 (NOTICE.md)


def _table(tmp_path, family, op, rows, dtype="bfloat16"):
    base = {c: "" for c in COMMON}
    base.update(device="h200", framework="mine", version="1", kernel_source="k", family=family, op=op, dtype=dtype,
                boundary="kernel")
    d = tmp_path / "h200" / family / "mine@1"
    d.mkdir(parents=True)
    pd.DataFrame([{**base, **r} for r in rows]).to_parquet(d / "t.parquet", index=False)
    return Store(tmp_path).partitions("h200", family)[0]


def _pairs(n):
    return n * (n + 1) / 2


def test_causal_prefill_grows_with_its_pairs_at_the_edge_trend(tmp_path):
    # two measured lengths: the kernel's time grew 3.4x for 4x the pairs (its per-query costs amortize)
    t1, t2 = 1.0e-3, 3.4e-3
    part = _table(tmp_path, "mla_context", "context",
                  [dict(batch=1, seq=4096, heads=128, latency_s=t1), dict(batch=1, seq=8192, heads=128, latency_s=t2)])
    cv = build_curve(part, "", {"heads": 128}, ("batch", "seq"))
    gamma = math.log(t2 / t1) / math.log(_pairs(8192) / _pairs(4096))
    q = np.array([8192.0, 32768.0, 131072.0])
    t, flag = eval_curve(cv, [np.ones(3), q])
    want = t2 * (_pairs(q) / _pairs(8192)) ** gamma
    np.testing.assert_allclose(t, want, rtol=1e-9)
    assert flag.tolist() == [MEASURED, EXTRAPOLATED, EXTRAPOLATED]
    assert t[2] > t2 * 131072 / 8192  # faster than in proportion to the length: 4.0x -> 50x for 16x the tokens


def test_a_kernel_never_gets_less_efficient_nor_grows_slower_than_its_coordinate(tmp_path):
    # γ is clipped to [0, 1]: a superquadratic last segment extrapolates with the pairs, a flat one in proportion
    steep = _table(tmp_path / "a", "mla_context", "context",
                   [dict(batch=1, seq=1024, heads=8, latency_s=1e-5), dict(batch=1, seq=2048, heads=8, latency_s=1e-4)])
    t, _ = eval_curve(build_curve(steep, "", {"heads": 8}, ("batch", "seq")), [np.ones(1), np.array([8192.0])])
    np.testing.assert_allclose(t, 1e-4 * _pairs(8192) / _pairs(2048), rtol=1e-9)
    flat = _table(tmp_path / "b", "mla_context", "context",
                  [dict(batch=1, seq=1024, heads=8, latency_s=1e-5), dict(batch=1, seq=2048, heads=8, latency_s=1e-5)])
    t, _ = eval_curve(build_curve(flat, "", {"heads": 8}, ("batch", "seq")), [np.ones(1), np.array([8192.0])])
    np.testing.assert_allclose(t, 1e-5 * 4, rtol=1e-9)


def test_windowed_prefill_grows_linearly_past_its_window(tmp_path):
    W = 4096
    part = _table(tmp_path, "attention_context", "context",
                  [dict(batch=1, seq=s, heads=8, kv_heads=8, head_dim=128, window=W, latency_s=1e-3 * s / 8192)
                   for s in (4096, 8192)])
    cv = build_curve(part, "", {"heads": 8, "kv_heads": 8, "head_dim": 128, "window": W}, ("batch", "seq"))
    work = lambda n: W * (W + 1) / 2 + (n - W) * W  # noqa: E731 - pairs past the window
    gamma = math.log(2.0) / math.log(work(8192) / work(4096))
    t, _ = eval_curve(cv, [np.ones(1), np.array([65536.0])])
    np.testing.assert_allclose(t, 1e-3 * max((work(65536) / work(8192)) ** gamma, 8.0), rtol=1e-9)


def test_gemm_tokens_beyond_the_table_grow_in_proportion(tmp_path):
    part = _table(tmp_path, "gemm", "gemm", [dict(m=m, n=4096, k=4096, latency_s=1e-5 * m / 1024)
                                              for m in (512, 1024)])
    cv = build_curve(part, "", {"n": 4096, "k": 4096}, ("m",))
    t, flag = eval_curve(cv, [np.array([8192.0])])
    np.testing.assert_allclose(t, 8e-5, rtol=1e-9)
    assert flag.tolist() == [EXTRAPOLATED]


def _fmha(hw, view):
    plan = gs.Plan(["prefill:131072"], policies=gs.Policies(attention_precision="fp8"))
    s = gs.compile_plan("deepseek-v3", plan, hw, view=None if view == "sol" else view).schedule()
    i = next(j for j, o in enumerate(s.graph.ops) if o.name == "layers.3.attn_prefill")
    sol = float(np.asarray(s.sol_duration if s.sol_duration is not None else s.duration)[0, i])
    src = None if s.source is None else int(np.asarray(s.source)[0, i])
    return float(np.asarray(s.duration)[0, i]), sol, src


@pytest.mark.parametrize("hw,published", [("gb300", 205e-3), ("gb200", 277e-3)])
def test_128k_fp8_fmha_from_tables_that_end_at_32k(hw, published):
    """shared/reference/hardware.md: FP8 FMHA of a 128K DeepSeek prefill, one layer, 128 heads on one GPU, 205 ms
    on GB300 and 277 ms on GB200. TensorRT-LLM's tables end at 32K (17.0 / 22.9 ms): extrapolated in proportion
    to the length it came out at 68 / 92 ms, below SOL (140.7 / 219.9 ms); by pairs at the kernel's edge trend it
    lands within 25 % of the measurement and above SOL."""
    t, sol, src = _fmha(hw, ViewSpec("hybrid", FMHA, "trtllm@1.3.0rc20"))
    assert src == EXTRAPOLATED
    assert sol < t and abs(t / published - 1) < 0.25, (t, sol)


def test_gb300_is_faster_than_gb200_in_every_view():
    for view in ("sol", ViewSpec("hybrid", FMHA, "trtllm@1.3.0rc20")):
        assert _fmha("gb300", view)[0] < _fmha("gb200", view)[0]


def test_an_extrapolated_time_is_never_below_sol(tmp_path):
    """Tables 100x too fast (a what-if): the measured rows stay as timed (the check flags them), the 128K point
    beyond them is held at the op's SOL."""
    import shutil

    shutil.copytree(FMHA, tmp_path / "t")
    for f in (tmp_path / "t").rglob("*.parquet"):
        df = pd.read_parquet(f)
        df["latency_s"] *= 0.01
        df.to_parquet(f, index=False)
    t, sol, src = _fmha("gb200", ViewSpec("hybrid", str(tmp_path / "t"), "trtllm@1.3.0rc20"))
    assert src == EXTRAPOLATED and t == pytest.approx(sol, rel=1e-12)


# ---- fallback for a family the tables have, at a shape they miss (issue 25 item 2) ------------------------

def test_family_efficiency_is_a_curve_of_the_work():
    from graphsim.views.measured.check import family_efficiency

    store = Store(str(ROOT / "tests" / "data" / "measured"))
    centres, meds, n = family_efficiency(store, "gb200", "moe", "trtllm", "1.3.0rc20")
    assert n > 0 and list(centres) == sorted(centres)
    assert all(m >= 1.0 for m in meds) and all(b <= a for a, b in zip(meds, meds[1:]))  # never past its roofline
    assert family_efficiency(store, "gb200", "moe", "nosuch") is None


def test_an_uncovered_op_of_a_covered_family_runs_at_that_familys_efficiency_at_its_work():
    """DeepSeek-V3 with 256 + 32 redundant experts: the MoE tables have rows only at 256, so the experts fall back;
    they are priced at the GB200 TRT-LLM MoE tables' median measured / SOL at the op's own SOL time, not at a fit
    over other families (which made a 4K prefill's experts 4.5x SOL on H100)."""
    from graphsim.core.config import load_config
    from graphsim.views.measured.view import _efficiency_at

    model = gs.load_model({**load_config("deepseek-v3"), "n_routed_experts": 288, "_name": "deepseek-v3"})
    c = gs.compile_plan(model, gs.Plan(["decode:1024x16"], gs.ParallelMapping(tp=4, ep=4)), "gb200",
                        view=ViewSpec("hybrid", str(ROOT / "tests" / "data" / "measured"), "trtllm@1.3.0rc20"))
    eff = dict(c.view.family_eff)["moe"]
    s = c.schedule()
    idx = [i for i, o in enumerate(s.graph.ops) if o.kind == "moe_experts" and c.view.op_source[i] == "fallback"]
    assert idx
    sol = np.asarray(s.sol_duration)[0, idx]
    np.testing.assert_allclose(np.asarray(s.duration)[0, idx], sol * _efficiency_at(eff, sol, np), rtol=1e-9)
    basis = c.report().coverage["fallback"]["moe"]
    assert basis["fitted_from"].startswith("no covered moe op: the moe tables on this device")
