"""Issue 25 item 5 ("Fast"): what a search shares between its programs is keyed on everything the result depends
on. ``graphsim.driver.pipeline.CompileCache`` shares the sharded graph of a plan (and its SOL-class program) between
the prediction and its SOL twin; a measured store memoizes its selections and candidate partitions. Each test
compiles with and without the cache and holds the cached result to the uncached one — where a wrong key would
serve the previous plan's graph, the two differ (asserted too, so the test can fail)."""
from __future__ import annotations

import shutil
from pathlib import Path

import attrs
import numpy as np
import pandas as pd

import graphsim as gs
from graphsim.driver.pipeline import CompileCache, compile_plan
from graphsim.hw import load_hw, load_profile
from graphsim.views.measured.store import Backend, Store
from graphsim.views.measured.view import ViewSpec

FIX = Path(__file__).resolve().parent / "data" / "measured"
MAP = gs.ParallelMapping(tp=4, ep=4)
WL = gs.Plan(["decode:4096x64"], MAP).workload()


def _fwd(c) -> float:
    return float(np.asarray(c.evaluate(WL, outputs=("forward",))["forward"])[0])


def test_a_changed_plan_descriptor_or_model_is_never_served_a_cached_graph():
    model = gs.load_model("deepseek-v3")
    hw = load_hw("gb200")
    cache = CompileCache()
    base = gs.Plan(["decode:4096x64"], MAP)
    a = compile_plan(model, base, hw, cache=cache)
    # another policy (the hot EP rank's work doubles), another descriptor under the same name (half the HBM
    # bandwidth; an NVLink domain of 2 GPUs, so the TP group's collectives leave it: another graph), another
    # model object (FP8 -> NVFP4 routed experts): each is another graph or program
    hot = attrs.evolve(base, policies=attrs.evolve(base.policies, ep_imbalance=2.0))
    slow = attrs.evolve(hw, hbm_bw=hw.hbm_bw / 2)
    split = attrs.evolve(hw, nvlink_domain=2)
    other = gs.load_model("deepseek-v3", weights="nvfp4")
    assert compile_plan(model, base, split).graph.ops != a.graph.ops
    for m, plan, h in ((model, hot, hw), (model, base, slow), (model, base, split), (other, base, hw)):
        got = compile_plan(m, plan, h, cache=cache)
        ref = compile_plan(m, plan, h)
        assert _fwd(got) == _fwd(ref) != _fwd(a)
        assert got.graph.ops == ref.graph.ops and got.program.n_classes == ref.program.n_classes
    # the same plan again is served (the graph object itself), and gives the first result
    again = compile_plan(model, base, hw, cache=cache)
    assert again.graph is a.graph and _fwd(again) == _fwd(a) and cache.hits == 1
    cache.clear()
    assert compile_plan(model, base, hw, cache=cache).graph is not a.graph


def test_a_shared_program_is_evaluated_under_each_compile_s_own_profile_and_view():
    """The prediction (a profile, or a measured view) and its SOL twin share the graph; the profile enters at
    evaluation only, and a measured view's binding keeps its own program."""
    model = gs.load_model("deepseek-v3")
    prof = load_profile("practitioner")
    plan = gs.Plan(["decode:4096x64"], MAP)
    view = ViewSpec("hybrid", str(FIX), "trtllm@1.3.0rc20")
    cache = CompileCache()
    cases = ((prof, None), (None, None), (None, view))
    got = [compile_plan(model, plan, "gb200", p, view=v, cache=cache) for p, v in cases]
    ref = [compile_plan(model, plan, "gb200", p, view=v) for p, v in cases]
    assert got[0].program is got[1].program and got[2].program is not got[1].program
    fwd = [_fwd(c) for c in got]
    assert fwd == [_fwd(c) for c in ref] and len(set(fwd)) == 3


def test_an_edited_table_is_read_by_the_next_bind(tmp_path):
    """Selections and candidates are memoized on the store; a table edited in place reopens the store (its file
    signature changed), so the next compile reads the new rows — the same as a fresh store's."""
    tables = tmp_path / "tables"
    shutil.copytree(FIX, tables)
    view = ViewSpec("hybrid", str(tables), "trtllm@1.3.0rc20")
    plan = gs.Plan(["decode:4096x64"], MAP)
    store = view.store()
    sel = store.select("gb200", Backend.parse("trtllm@1.3.0rc20"))
    assert store.select("GB200", Backend.parse("trtllm@1.3.0rc20")) is sel
    before = _fwd(compile_plan("deepseek-v3", plan, "gb200", view=view))
    f = next(p for p in sorted(tables.rglob("*.parquet")) if "/gb200/gemm/trtllm@" in p.as_posix())
    df = pd.read_parquet(f)
    df["latency_s"] *= 10.0
    df.to_parquet(f, index=False)
    assert view.store() is not store
    after = _fwd(compile_plan("deepseek-v3", plan, "gb200", view=view))
    fresh = _fwd(compile_plan("deepseek-v3", plan, "gb200", view=attrs.evolve(view, measured=Store(tables))))
    assert after == fresh and after > before
