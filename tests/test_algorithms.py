"""Collectives at their fastest algorithm x protocol (passes/sharding.py ``link_alternatives``): per-algorithm
bytes and steps in closed form, the protocols' wire bytes and step latencies, the choice made per evaluation
point (one-shot for small messages, in-switch reduction for large ones, at the closed-form crossover),
forcing one, and measured collectives that are never below the SOL.

Per rank, payload S, n ranks in one NVLink domain (bytes each way, steps):
  all-reduce  ring 2(n-1)/n·S, 2(n-1) | tree 2S, 2⌈log2 n⌉ | one-shot (n-1)·S, 1 | two-shot 2(n-1)/n·S, 2 |
              NVLS S, 2 (Simple only)
  all-gather / reduce-scatter  ring (n-1)/n·S, n-1 | tree S, ⌈log2 n⌉ | one-shot (n-1)/n·S, 1 | NVLS (n-1)/n·S, 1
Protocols (NCCL): LL 2 wire bytes per data byte, step nvlink_ll_latency_s (0.6 us); LL128 128/120,
nvlink_latency_s (1.9 us); Simple 1, nvlink_simple_latency_s (3.4 us) — src/graph/tuning.cc hwLat."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import graphsim as gs
from graphsim.core.builder import GraphBuilder
from graphsim.core.ir import COMPONENTS, ONE, Cost, Feature
from graphsim.lowering.evaluate import Evaluator, evaluate_reference, unit_time
from graphsim.lowering.program import COMPONENT_GROUP, GROUPS, LATENCY, lower
from graphsim.passes.sharding import apply_mapping, link_alternatives

S = 1000.0
PAY = Cost.of(ONE, bytes_act=S)
LL, LL128 = 0.6e-6, 1.9e-6  # NCCL hwLat NVLink per-step latencies (the shipped descriptors)
SIMPLE = 3.4e-6
WIRE = {"LL": 2.0, "LL128": 128 / 120, "Simple": 1.0}
HOP = {"LL": "hops_nvlink_ll", "LL128": "hops_nvlink", "Simple": "hops_nvlink_simple"}


def terms(cost: Cost) -> dict:
    out = dict.fromkeys(COMPONENTS, 0.0)
    for c, _, v in cost.terms:
        out[c] += v
    return out


def seconds(cost: Cost, hw) -> float:
    """One collective's SOL: the roofline of its link terms plus its steps at their latencies."""
    t = np.array([terms(cost)[c] for c in COMPONENTS]) * unit_time(hw.rates())
    parts = [t[COMPONENT_GROUP == g].sum() for g in range(len(GROUPS))]
    return max(parts[:LATENCY]) + parts[LATENCY]


def sol(collective: str, n: int, size: float, hw, **kw) -> tuple[float, str]:
    """(seconds, label) of the fastest alternative of a collective on ``size`` bytes inside one domain."""
    nvls = hw.nvlink_bw / hw.nvls_bw if hw.nvls_bw else 0.0
    alts = link_alternatives(collective, n, n, Cost.of(ONE, bytes_act=float(size)), "auto", nvls=nvls, **kw)
    return min((seconds(c, hw), label) for label, c in alts)


# ---- closed forms --------------------------------------------------------------------------------------

@pytest.mark.parametrize("coll,n,want", [
    # all-reduce on 8 ranks of a switch with NVLS: ring (same bytes as two-shot, 14 steps) and tree (2S, 6
    # steps) are no better than two-shot anywhere, so they are dropped
    ("all_reduce", 8, {"one_shot": (7 * S, 1), "two_shot": (2 * 7 / 8 * S, 2), "nvls": (S, 2)}),
    ("all_reduce", 2, {"one_shot": (S, 1)}),  # two-shot and NVLS: one-shot's bytes in 2 steps
    ("all_gather", 4, {"one_shot": (3 / 4 * S, 1)}),  # NVLS: the same bytes and step, dropped as equal
    ("reduce_scatter", 8, {"one_shot": (7 / 8 * S, 1)}),
])
def test_per_algorithm_bytes_and_steps(coll, n, want):
    alts = dict(link_alternatives(coll, n, n, PAY, nvls=1.0))
    assert {label.split("/")[0] for label in alts} == set(want)
    for label, cost in alts.items():
        algo, proto = label.split("/")
        nv, steps = want[algo]
        t = terms(cost)
        assert t["bytes_nvlink"] == pytest.approx(nv * WIRE[proto]) and t[HOP[proto]] == steps
        assert sum(t[h] for h in HOP.values() if h != HOP[proto]) == 0 and t["bytes_scaleout"] == 0
    assert [label for label in alts if label.startswith("nvls")] in ([], ["nvls/Simple"])  # multimem: Simple only


def test_forced_algorithms_keep_their_textbook_form():
    ring = dict(link_alternatives("all_reduce", 8, 8, PAY, "ring"))
    assert list(ring) == ["ring/LL", "ring/LL128", "ring/Simple"]
    assert terms(ring["ring/LL128"])["bytes_nvlink"] == pytest.approx(2 * 7 / 8 * S * 128 / 120)
    assert terms(ring["ring/LL128"])["hops_nvlink"] == 14
    tree = dict(link_alternatives("all_gather", 4, 4, PAY, "tree/simple"))
    assert list(tree) == ["tree/Simple"] and terms(tree["tree/Simple"])["hops_nvlink_simple"] == 2
    # no in-switch reduction on this hardware: a forced NVLS falls back to the default ring (at each protocol)
    assert [lbl for lbl, _ in link_alternatives("all_reduce", 8, 8, PAY, "nvls", nvls=0.0)] == list(ring)
    # one-shot / two-shot / NVLS run inside one NVLink domain only: across domains, hierarchical rings and trees
    across = [lbl for lbl, _ in link_alternatives("all_reduce", 32, 8, PAY, nvls=1.0)]
    assert {lbl.split("/")[0] for lbl in across} <= {"ring", "tree"}
    forced = [lbl for lbl, _ in link_alternatives("all_reduce", 32, 8, PAY, "one_shot")]
    assert forced and all(lbl.startswith("ring/") for lbl in forced)


def test_nvls_bytes_follow_the_switch_bandwidth():
    # a switch reducing at 2/3 of the link rate: its bytes count 1.5 times against nvlink_bw
    alts = dict(link_alternatives("all_reduce", 8, 8, PAY, nvls=1.5))
    assert terms(alts["nvls/Simple"])["bytes_nvlink"] == pytest.approx(1.5 * S)
    # at half the link rate it is no better than two-shot at Simple (2(n-1)/n·S = 1.75 S in 2 steps): dropped
    assert "nvls/Simple" not in dict(link_alternatives("all_reduce", 8, 8, PAY, nvls=2.0))
    assert "nvls/Simple" not in dict(link_alternatives("all_reduce", 8, 8, PAY, nvls=0.0))


# ---- the choice, point by point ------------------------------------------------------------------------

def test_one_shot_for_small_messages_nvls_for_large_at_the_closed_form_crossovers():
    hw = gs.load_hw("gb200")
    B, n = hw.nvlink_bw, 4
    # one-shot LL: 2(n-1)·S/B + L_LL; two-shot LL: 4(n-1)/n·S/B + 2·L_LL -> equal at S* = L_LL·B·n/(2(n-1)(n-2))
    cross = LL * B * n / (2 * (n - 1) * (n - 2))
    assert cross == pytest.approx(180e3)  # 180 KB on NVLink 5
    assert sol("all_reduce", n, 0.99 * cross, hw)[1] == "one_shot/LL"
    assert sol("all_reduce", n, 1.01 * cross, hw)[1] == "two_shot/LL"
    t, _ = sol("all_reduce", n, cross, hw)
    assert t == pytest.approx(2 * (n - 1) * cross / B + LL)
    # NVLS (S/B + 2·L_Simple) against two-shot LL128 (2(n-1)/n·128/120·S/B + 2·L_LL128): equal at
    # S = 2(L_Simple - L_LL128)·B / (2(n-1)/n·128/120 - 1) = 4.5 MB for n = 4
    big = 2 * (SIMPLE - LL128) * B / (2 * (n - 1) / n * 128 / 120 - 1)
    assert big == pytest.approx(4.5e6)
    assert sol("all_reduce", n, 0.99 * big, hw)[1] == "two_shot/LL128"
    assert sol("all_reduce", n, 1.01 * big, hw)[1] == "nvls/Simple"
    assert sol("all_reduce", n, 64 * big, hw) == pytest.approx((64 * big / B + 2 * SIMPLE, "nvls/Simple"))


def test_the_choice_is_made_at_every_evaluation_point():
    # one TP4 all-reduce of 7168 BF16 per token on GB200, evaluated at 1 .. 4096 tokens in one call: each
    # point takes its own fastest alternative, and both kernel routes agree with the reference
    hw = gs.load_hw("gb200")
    b = GraphBuilder("ar")
    b.token_set("all")
    with b.stage("s"):
        b.collective("ar", "all_reduce", "tp", Cost.of(Feature("tokens", "all"), bytes_act=7168 * 2.0))
    g = apply_mapping(b.build(), gs.ParallelMapping(tp=4), hw.nvlink_domain, hw=hw)
    tokens = np.array([1, 8, 16, 64, 512, 4096])
    wl = gs.Workload(("decode",), np.c_[tokens], np.ones((len(tokens), 1)), np.full((len(tokens), 1), 100))
    p, ut = lower(g), unit_time(hw.rates())
    ref = evaluate_reference(p, wl, ut)
    want = [sol("all_reduce", 4, 7168 * 2.0 * t, hw) for t in tokens]
    np.testing.assert_allclose(ref.forward, [w[0] for w in want], rtol=1e-12)
    assert [ref.algorithm(0, q) for q in range(len(tokens))] == [w[1] for w in want]
    assert {w[1] for w in want} >= {"one_shot/LL", "nvls/Simple"}  # the winner changes along the sweep
    for numpy_points in (1 << 20, 0):
        out = Evaluator(p, wl.kinds, numpy_points=numpy_points)(wl, ut, outputs=("forward", "components"))
        np.testing.assert_allclose(out["forward"], ref.forward, rtol=1e-9)
        np.testing.assert_allclose(out["components"], ref.components.sum(axis=1), rtol=1e-9)


def test_forcing_on_the_command_line_and_bad_names():
    plan = lambda alg: gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=4), gs.Policies(algorithms=alg))
    c = gs.compile_plan("deepseek-v3", plan({"all_reduce": "one_shot/ll128"}), "gb200")
    ar = [op for op in c.graph.ops if op.info.collective == "all_reduce" and op.cost.terms]
    assert ar and all([lbl for lbl, _ in op.alts] == ["one_shot/LL128"] for op in ar)
    r = c.report()
    assert [x["algorithm"] for x in r.collectives if x["collective"] == "all_reduce"] == ["one_shot/LL128"]
    assert sum(x["ops"] for x in r.collectives if x["collective"] == "all_reduce") == len(ar)
    assert gs.Policies(algorithms={"all_reduce": "tree"}).algorithms == (("all_reduce", "tree"),)  # old names
    # the label a report prints (ring/LL128) forces the same thing as the lower-case name
    assert gs.Policies(algorithms={"all_reduce": "Ring/LL128"}).algorithms == (("all_reduce", "ring/ll128"),)
    with pytest.raises(gs.GraphsimError, match=r"policies\.algorithms\.all_reduce: unknown algorithm 'nvls/ll'"):
        gs.Policies(algorithms={"all_reduce": "nvls/ll"})  # in-switch reduction has no LL protocol
    with pytest.raises(gs.GraphsimError, match="policies.algorithms.all_gather"):
        gs.Policies(algorithms={"all_gather": "two_shot"})


# ---- measured collectives are never below the SOL ---------------------------------------------------------

def test_published_custom_all_reduce_figures_are_at_or_above_sol():
    # aiconfigurator-core 0.12 TensorRT-LLM 1.3.0rc20 custom all-reduce tables (systems/data/<gpu>/comm/trtllm/
    # 1.3.0rc20/custom_allreduce_perf.parquet). The ring at LL128 gave 11.7 us on GB200 (4 ranks, 229 KB: 6 steps
    # x 1.9 us) and 26.7 us on H200 (8 ranks: 14 steps), above these runs
    gb200, h200 = gs.load_hw("gb200"), gs.load_hw("h200")
    for hw, n, size, measured in ((gb200, 4, 131072, 5.13e-6), (gb200, 4, 229376, 5.3e-6),
                                  (gb200, 4, 262144, 5.6e-6), (h200, 8, 256, 3.05e-6), (h200, 8, 16384, 3.49e-6)):
        t, label = sol("all_reduce", n, size, hw)
        assert t <= measured, (hw.name, n, size, label)
    # two-shot at LL on GB200, 229 KB: 2·3/4·S x 2 / 900 GB/s + 2 x 0.6 us = 1.96 us
    t, label = sol("all_reduce", 4, 229376, gb200)
    assert label == "two_shot/LL" and t == pytest.approx(2 * 3 / 4 * 229376 * 2 / 900e9 + 2 * LL)


FIX = Path(__file__).parent / "data" / "measured"


@pytest.mark.parametrize("device", ["gb200", "h200"])
def test_every_shipped_collective_row_is_at_or_above_sol(device):
    # the fixture's TensorRT-LLM all-reduce and NCCL all-gather / reduce-scatter / all-to-all rows ("bytes": the
    # whole buffer, nccl-tests' convention)
    hw = gs.load_hw(device)
    rows = pd.concat([pd.read_parquet(f) for f in sorted((FIX / device / "collective").glob("*/*.parquet"))])
    assert len(rows) > 50
    below = [(r.op, r.gpus, r.bytes, r.latency_s) for r in rows.itertuples()
             if r.latency_s < sol(r.op, int(r.gpus), float(r.bytes), hw)[0]]
    assert below == []
