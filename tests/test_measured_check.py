"""No table row below SOL (issue 24): `graphsim measured check` prices every row of a store with graphsim's
own rules at the row's shape and lists the rows measured faster than that SOL.

The fixture (tests/data/measured) is cut from aiconfigurator 0.12's GB200 / H200 collections (NOTICE.md)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from graphsim.cli import main
from graphsim.lowering.evaluate import evaluate_reference, unit_time
from graphsim.views.measured.check import PROBES, Rows, _moe_act, price, scan
from graphsim.views.measured.mapping import Coord
from graphsim.driver.pipeline import _shipped_hw

FIX = str(Path(__file__).parent / "data" / "measured")


@pytest.fixture(scope="module")
def fixture_scan():
    return scan(FIX)


def test_every_fixture_row_is_scanned_and_none_outside_collectives_is_below_sol(fixture_scan):
    r = fixture_scan
    assert r.rows == sum(s["rows"] for s in r.summary)
    for s in r.summary:  # every row has exactly one status
        assert s["rows"] == s["checked"] + s["unserved"] + s["unmapped"] + s["no_descriptor"], s
        assert s["unmapped"] == 0, s  # the mapping reads back every row it is asked about
    priced = {s["family"] for s in r.summary if s["checked"]}
    assert {"gemm", "bmm", "mla_context", "mla_generation", "moe", "moe_a2a", "collective"} <= priced
    below = [s for s in r.summary if s["family"] != "collective" and s["violations"]]
    assert below == []


def test_fixture_collectives_are_not_below_sol(fixture_scan):
    """TRT-LLM's one-shot all-reduce of 4 x 256 B..2 MB on GB200 (~5 us) was below the ring/LL128 SOL (11 us);
    at the fastest algorithm x protocol no collective row of the fixture is below SOL (issue 24 item 1)."""
    assert sum(s["violations"] for s in fixture_scan.summary if s["family"] == "collective") == 0


def _rows_of(family, device="h200"):
    from graphsim.views.measured.store import Store

    return next(p for p in Store(FIX).partitions(device, family))


@pytest.mark.parametrize("family,device", [("gemm", "h200"), ("bmm", "h200"), ("mla_generation", "h200"),
                                           ("mla_context", "gb200"), ("moe", "h200"), ("collective", "h200"),
                                           ("moe_a2a", "h200")])
def test_vectorized_price_is_the_reference_evaluation(family, device):
    """The stacked-coefficient pricing equals graphsim's reference evaluation of the probe program, row by row."""
    from graphsim.views.measured.check import VARYING

    hw = _shipped_hw(device)
    ut = unit_time(hw.rates())
    part = _rows_of(family, device)
    var = VARYING[family]
    fixed = [c for c in part.coords if c not in var]
    shape = part.x[0, [part.coords.index(c) for c in fixed]]
    sel = np.all(part.x[:, [part.coords.index(c) for c in fixed]] == shape, axis=1)
    pr = PROBES[family](part.identity, dict(zip(fixed, (int(v) for v in shape))), hw)
    assert not isinstance(pr, str), pr
    c = {n: part.x[sel, part.coords.index(n)] for n in var}
    rows = pr.workload(c)
    got, ok, _ = price([pr], rows, np.zeros(rows.points, dtype=np.int64), ut, c)
    assert ok.all()
    ref = evaluate_reference(pr.program, rows, ut).duration[:, 0]
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_gemm_row_sol_is_the_roofline_closed_form():
    """An FP8 GEMM of m x k x n on H200: max(2mkn / 1979 TF/s, (kn + m(k + 2n)) B / 4.8 TB/s) — weights FP8,
    activations in FP8 and out BF16 (hw/data/h200.toml peak_flops.fp8, hbm_bw)."""
    hw = _shipped_hw("h200")
    m, n, k = np.array([1.0, 64.0, 8192.0]), 7168, 2048
    pr = PROBES["gemm"]({"dtype": "fp8", "op": "gemm"}, {"n": n, "k": k}, hw)
    got, _, _ = price([pr], Rows(("prefill",), np.ones(3), m, np.zeros(3)), np.zeros(3, dtype=np.int64),
                   unit_time(hw.rates()))
    want = np.maximum(2 * m * k * n / 1979e12, (k * n + m * (k + 2 * n)) / 4.8e12)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_rows_whose_operands_fit_in_l2_are_held_to_their_replayed_identity(tmp_path):
    """A collector replays one op on the same operands: when they fit in L2 (H200: 50 MiB, hw/data/h200.toml
    l2_bytes) a row may beat the all-HBM roofline but never compute. FP8 GEMM m=16 on H200: n=k=4096 reads
    16.8 MB (3.5 us at 4.8 TB/s; 2mkn / 1979 TF/s = 0.27 us); n=k=8192 reads 67 MB, more than L2 holds."""
    m = 16
    small = 4096 * 4096 + m * (4096 + 2 * 4096)
    hbm, flops = small / 4.8e12, 2 * m * 4096 * 4096 / 1979e12
    r = scan(_store_with(tmp_path / "a", 0.5 * hbm, m, 4096, 4096))  # below HBM, above compute: replayed L2
    assert r.n_violations == 0 and sum(n for m_ in r.reasons.values() for why, n in m_.items() if "L2" in why) == 1
    assert scan(_store_with(tmp_path / "b", 0.5 * flops, m, 4096, 4096)).n_violations == 1  # below compute
    big = 8192 * 8192 + m * (8192 + 2 * 8192)
    assert big > _shipped_hw("h200").l2_bytes
    assert scan(_store_with(tmp_path / "c", 0.7 * big / 4.8e12, m, 8192, 8192)).n_violations == 1  # from HBM


def test_sliding_window_prefill_maps_to_its_prompt_length():
    """A windowed prefill of s positions has Σ_i min(i+1, W) pairs: W(W+1)/2 + (s-W)·W beyond the window; the
    table's seq is s (not the equal-work causal prompt)."""
    from graphsim.core.ir import Feature

    pairs, req = Feature("window_pairs", "all", (4096,)), Feature("requests", "all")
    co = Coord(((pairs, 1.0),), ((req, 1.0),), tri=True, window=4096)
    s = np.array([1.0, 100.0, 4096.0, 4097.0, 32768.0])
    per = np.where(s <= 4096, s * (s + 1) / 2, 4096 * 4097 / 2 + (s - 4096) * 4096)
    vals = {pairs: 3 * per, req: np.full(5, 3.0)}
    np.testing.assert_allclose(co.value(vals.__getitem__, np), s, rtol=1e-12)


def _store_with(tmp_path, latency, m=4096, n=8192, k=8192):
    """A one-row GEMM table: H200, FP8, m x k x n (default 4096 x 8192 x 8192) at ``latency`` seconds."""
    from graphsim.views.measured.schema import COMMON

    row = {c: "" for c in COMMON}
    row.update(device="h200", framework="mine", version="1", kernel_source="k", family="gemm", op="gemm",
               dtype="fp8", boundary="kernel", m=m, n=n, k=k, latency_s=latency)
    d = tmp_path / "tables" / "h200" / "gemm" / "mine@1"
    d.mkdir(parents=True)
    pd.DataFrame([row]).to_parquet(d / "gemm.parquet", index=False)
    return str(tmp_path / "tables")


def test_check_command_exit_code_and_violations_file(tmp_path, capsys):
    sol = 2 * 4096 * 8192 * 8192 / 1979e12  # compute-bound: 0.278 ms
    ok = _store_with(tmp_path / "a", sol * 1.01)
    assert main(["measured", "check", ok]) == 0
    assert "0 below SOL" in capsys.readouterr().out
    bad = _store_with(tmp_path / "b", sol * 0.5)
    out = tmp_path / "v.parquet"
    assert main(["measured", "check", bad, "-o", str(out)]) == 1
    v = pd.read_parquet(out)
    assert len(v) == 1 and v["framework"][0] == "mine" and v["m"][0] == 4096
    assert v["ratio"][0] == pytest.approx(0.5, rel=1e-9)
    assert v["sol_s"][0] == pytest.approx(sol, rel=1e-9)
    assert main(["measured", "check", bad, "--json"]) == 1
    assert '"violations": 1' in capsys.readouterr().out
    # with --json and a violations file, stdout is the JSON document alone (the "wrote" line goes to stderr)
    assert main(["measured", "check", bad, "--json", "-o", str(tmp_path / "w.parquet")]) == 1
    got = capsys.readouterr()
    assert json.loads(got.out)["violations"] == 1 and "wrote" in got.err
    assert main(["measured", "check", bad, "--family", "nope"]) == 2


def test_attention_over_an_fp8_cache_reads_the_fp8_cache_rows_at_fp8():
    """The runtimes label an attention over an FP8 cache bfloat16 / fp8 and run it at FP8 (graphsim's rule for
    an FP8 cache): an FP8 attention reads those rows, a BF16 one over an FP8 cache reads none."""
    from graphsim.views.measured.mapping import attention_dtypes

    assert attention_dtypes("fp8", "fp8") == ("bfloat16", "fp8")
    assert attention_dtypes("bf16", "fp8") == ()
    assert attention_dtypes("bf16", "bfloat16") == ("bfloat16",)
    assert attention_dtypes("bf16", "") == ("bfloat16",)


def test_mla_prefill_row_over_an_fp8_cache_is_priced_at_the_fp8_peak():
    """GB300, MLA prefill of one 32,768-token prompt, 128 heads, FP8 cache (aiconfigurator 0.12 sglang
    trtllm_mla: 16.28 ms). Causal pairs s(s+1)/2, 2·(192+128)·128 FLOPs each at FP8 5 PF/s
    (hw/data/gb300.toml) = 8.80 ms — the compute term, above the exponentials' and the bytes'."""
    hw = _shipped_hw("gb300")
    pr = PROBES["mla_context"]({"dtype": "bfloat16", "kv_dtype": "fp8", "op": "context"}, {"heads": 128}, hw)
    rows = pr.workload({"batch": np.array([1]), "seq": np.array([32768])})
    assert pr.lookup.where == (("dtype", ("bfloat16", "fp8")), ("kv_dtype", ("fp8",)))  # the mapping's rows
    got, _, _ = price([pr], rows, np.zeros(1, dtype=np.int64), unit_time(hw.rates()))
    pairs = 32768 * 32769 / 2
    assert got[0] == pytest.approx(pairs * 2 * (192 + 128) * 128 / 5e15, rel=1e-12)
    assert got[0] < 16.28e-3


def test_nongated_moe_rows_are_priced_with_two_matrices():
    """TensorRT-LLM's moe_torch_flow_nongated (ReLU² experts): 2·2·h·i·k·T FLOPs, not SwiGLU's 2·3·h·i·k·T.
    H200 BF16 at 989 TF/s, h=4096, i=14336, top-2 of 8, 16,384 tokens on one rank: compute-bound."""
    hw = _shipped_hw("h200")
    fx = {"hidden": 4096, "inter": 14336, "topk": 2, "experts": 8, "moe_tp": 1, "moe_ep": 1}
    T = np.array([16384.0])
    out = {}
    for ks in ("moe_torch_flow", "moe_torch_flow_nongated"):
        ident = {"dtype": "bfloat16", "op": "moe", "distribution": "balanced", "kernel_source": ks}
        pr = PROBES["moe"]({**ident, "act": _moe_act(ident, fx)}, fx, hw)
        out[ks] = price([pr], pr.workload({"tokens": T}), np.zeros(1, dtype=np.int64), unit_time(hw.rates()))[0][0]
    assert out["moe_torch_flow"] == pytest.approx(2 * 3 * 4096 * 14336 * 2 * 16384 / 989e12, rel=1e-12)
    assert out["moe_torch_flow_nongated"] == pytest.approx(2 * 2 * 4096 * 14336 * 2 * 16384 / 989e12, rel=1e-12)


def test_a_shape_timed_non_gated_anywhere_is_non_gated_everywhere(tmp_path):
    """The tables carry no activation; a shape TensorRT-LLM times with its non-gated kernel is a non-gated
    model's (Nemotron-3), so another runtime's rows at that shape are priced with two matrices too."""
    from graphsim.views.measured.check import nongated_shapes
    from graphsim.views.measured.schema import COMMON
    from graphsim.views.measured.store import Store

    rows = []
    for fw, ks in (("trtllm", "moe_torch_flow_nongated"), ("sglang", "sglang_fused_moe_triton")):
        r = {c: "" for c in COMMON}
        r.update(device="h200", framework=fw, version="1", kernel_source=ks, family="moe", op="moe", dtype="bfloat16",
                 boundary="kernel", distribution="balanced", tokens=16384, hidden=2688, inter=1856, topk=6,
                 experts=128, moe_tp=1, moe_ep=1, latency_s=1.0)
        d = tmp_path / "h200" / "moe" / f"{fw}@1"
        d.mkdir(parents=True)
        pd.DataFrame([r]).to_parquet(d / "moe.parquet", index=False)
    ng = nongated_shapes(Store(tmp_path))
    assert ng == {(2688, 1856, 6, 128)}
    fx = {"hidden": 2688, "inter": 1856, "topk": 6, "experts": 128}
    assert _moe_act({"kernel_source": "sglang_fused_moe_triton"}, fx, ng) == "relu2"
    assert _moe_act({"kernel_source": "sglang_fused_moe_triton"}, {**fx, "topk": 8}, ng) == "silu"
