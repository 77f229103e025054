"""The fast paths of structural compilation give what the plain paths give: the model's build cache, the
hash-consed sharding / overlap / fusion rewrites, Cost's cached normal form, ``replace_op``, the bulk graph
check and the cost-class grouping of the lowering (held to the row-by-row construction it replaced); and what a
search shares between its programs (issue 25 item 5), keyed on everything the result depends on: a caller's
``CompileCache`` (a plan's graph for the prediction and its SOL twin), a measured store's memoized selections
and candidates — each compiled with and without the cache, the two held equal, and where a wrong key would serve
the previous plan's graph the two results differ (asserted too, so the tests can fail)."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import attrs
import numpy as np
import pandas as pd
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import Cost, Edge, Feature, Graph, Op, TokenSet, feature_key, replace_op
from graphsim.driver.pipeline import CompileCache, compile_plan
from graphsim.hw import load_hw, load_profile
from graphsim.lowering.program import lower
from graphsim.passes.overlap import scale_batch, two_batch_overlap
from graphsim.passes.sharding import apply_mapping, layout_of, shard_cost
from graphsim.views.measured.store import Backend, Store
from graphsim.views.measured.view import ViewSpec

MODEL = gs.load_model("deepseek-v4.1-flash")
HW = gs.pipeline.load_hw("gb300")


def _same_graph(a: Graph, b: Graph) -> None:
    assert a.ops == b.ops and a.edges == b.edges and a.tensors == b.tensors
    assert a.token_sets == b.token_sets and a.stages == b.stages and a.meta == b.meta
    assert [repr(o.cost) for o in a.ops] == [repr(o.cost) for o in b.ops]  # number types too


# ---- build cache ------------------------------------------------------------------------------------------

def test_build_cache_returns_the_build_it_would_make():
    plan = gs.Plan(["decode:4096x8"], policies=gs.Policies(dspark="off"))
    opts = {"policies": plan.policies, "requests": plan.requests}
    g1 = MODEL.build(plan.kinds, **opts)
    assert MODEL.build(plan.kinds, **opts) is g1  # a hit: the same frozen graph
    _same_graph(g1, MODEL._build_graph(plan.kinds, opts))  # equal to an uncached build
    other = MODEL.build(plan.kinds, policies=attrs.evolve(plan.policies, engram_proj="tp"), requests=plan.requests)
    assert other is not g1


def test_build_cache_is_per_model_object_and_bounded():
    m = gs.load_model("llama-3.1-70b")
    g = m.build(("decode",), policies=gs.Policies())
    view = copy.copy(m)  # a variant (e.g. another config) must not read its original's builds
    view.cfg = m.cfg
    assert view.build(("decode",), policies=gs.Policies()) is not g
    for w in range(1, m.BUILD_CACHE_SIZE + 3):
        m.build(("decode",), policies=gs.Policies(), requests=(gs.Request.parse(f"decode:{w}"),))
    assert len(m.__dict__["_build_cache"][1]) == m.BUILD_CACHE_SIZE


def test_build_cache_keys_the_policies_by_the_fields_the_build_read():
    """A build is a function of the policy fields it reads: policies that differ only elsewhere (overlap, the
    collective algorithms: passes, not the model, read them) share it; a field it read (how Engram's projections
    are sharded) does not, and every hit equals an uncached build."""
    plan = gs.Plan(["decode:4096x8"], policies=gs.Policies())
    base = MODEL.build(plan.kinds, policies=plan.policies, requests=plan.requests)
    reads = next(r for k, r, g in MODEL.__dict__["_build_cache"][1].values() if g is base)
    names = dict(reads)
    assert "engram_proj" in names and "overlap" not in names and "algorithms" not in names
    for pol in (attrs.evolve(plan.policies, overlap="two-batch"),
                attrs.evolve(plan.policies, algorithms={"all_reduce": "tree"})):
        hit = MODEL.build(plan.kinds, policies=pol, requests=plan.requests)
        assert hit is base
        _same_graph(hit, MODEL._build_graph(plan.kinds, {"policies": pol, "requests": plan.requests}))
    proj = MODEL.build(plan.kinds, policies=attrs.evolve(plan.policies, engram_proj="tp"), requests=plan.requests)
    assert proj is not base and proj.ops != base.ops
    with pytest.raises(AttributeError, match="read-only"):  # a build cannot change the policies it is given
        from graphsim.models.base import _PolicyReads

        _PolicyReads(plan.policies).fusion = "x"


def test_pickles_and_copies_leave_the_caches_behind():
    import pickle

    m = gs.load_model("llama-3.1-70b")
    g = m.build(("decode",), policies=gs.Policies())
    for other in (pickle.loads(pickle.dumps(m)), copy.copy(m)):  # a sweep worker's model, a variant
        assert "_build_cache" not in other.__dict__ and "_inventory_cache" not in other.__dict__
        _same_graph(other.build(("decode",), policies=gs.Policies()), g)


def test_unhashable_options_build_without_the_cache():
    m = gs.load_model("llama-3.1-70b")
    g = m.build(("decode",), policies=gs.Policies(), requests=[gs.Request.parse("decode:64")])
    assert isinstance(g, Graph) and "_build_cache" not in m.__dict__


# ---- hash-consed passes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mapping", [gs.ParallelMapping(tp=4, ep=4), gs.ParallelMapping(tp=2, ep=8, dp=4),
                                     gs.ParallelMapping(tp=8, ep=8)])
def test_memoized_sharding_equals_sharding_each_op(mapping):
    pol = gs.Policies(ep_imbalance=1.25, sp="on")
    g = MODEL.build(("decode",), policies=pol, requests=(gs.Request.parse("decode:4096x64"),))
    out = apply_mapping(g, mapping, HW.nvlink_domain, policies=pol, hw=HW)
    layout = layout_of(g, mapping, HW.nvlink_domain, pol, HW)
    by_name = {o.name: o for o in out.ops}
    for op in g.ops:  # every original op keeps its name; its cost is its own shard_cost
        if by_name[op.name].formula.startswith("merged into") or op.kind == "collective":
            continue
        want = shard_cost(op, mapping, pol.ep_imbalance, layout.of(op.name))
        assert by_name[op.name].cost == want and repr(by_name[op.name].cost) == repr(want), op.name


def test_two_batch_overlap_halves_each_cost():
    g = MODEL.build(("decode",), policies=gs.Policies(), requests=(gs.Request.parse("decode:4096x64"),))
    out = two_batch_overlap(g)
    ops = {o.name: o for o in g.ops}
    for o in out.ops:
        src = ops[o.origin]
        assert o.cost == scale_batch(src.cost, 0.5)
        assert attrs.evolve(src, name=o.name, cost=o.cost, params=src.params + (("half", o.name[-4:]),),
                            origin=src.name) == o


# ---- Cost normal form -------------------------------------------------------------------------------------

def test_cost_of_and_sum_keep_the_normal_form():
    t = Feature("tokens", "x")
    w = Feature("window_pairs", "x", (128,))
    generic = Cost(tuple((c, t, v) for c, v in {"flops_fp8": 2, "bytes_act": 3.0, "exps": 0.0}.items()))
    fast = Cost.of(t, flops_fp8=2, bytes_act=3.0, exps=0.0)
    assert fast == generic and repr(fast) == repr(generic) and hash(fast) == hash(generic)
    assert Cost.of(t) + fast is fast and fast + Cost() is fast
    s = Cost.of(w, exps=1.0) + fast + Cost.of(t, exps=2.0)
    assert s.terms == Cost(tuple(Cost.of(w, exps=1.0).terms + fast.terms + Cost.of(t, exps=2.0).terms)).terms
    for bad in ({"flops_fp9": 1.0}, {"exps": True}, {"exps": float("inf")}):
        with pytest.raises(GraphsimError):
            Cost.of(t, **bad)
    with pytest.raises(GraphsimError, match="must be a Feature"):
        Cost.of("tokens", exps=1.0)


def test_feature_order_is_repr_order_with_any_number_types():
    feats = [Feature("window_pairs", "x", (128,)), Feature("window_pairs", "x", (128.0,)), Feature("tokens", "x", (), 1),
             Feature("tokens", "x"), Feature("tokens", "x", (), 0.5), Feature("tokens", "x", (), 1.0, (0, 2))]
    for f in feats * 2:  # twice: the second round reads the cache
        assert feature_key(f) == repr(f)
    # distinct features (by value) in any order: sorted as (component, repr) sorts them
    distinct = [feats[0], feats[2], feats[4], feats[5], Feature("kv_len", "x")]
    terms = [(c, f, 1.0) for f in reversed(distinct) for c in ("exps", "bytes_act")]
    want = sorted(terms, key=lambda x: (x[0], repr(x[1])))
    assert [(c, repr(f)) for c, f, _ in Cost(tuple(terms)).terms] == [(c, repr(f)) for c, f, _ in want]


# ---- replace_op -------------------------------------------------------------------------------------------

def test_replace_op_is_evolve():
    op = Op("a", "gemm", "s", Cost.of(Feature("tokens", "x"), exps=1.0), 3, split=("tp",), params=(("note", 1),),
            reads=("w",))
    for changes in ({"name": "b"}, {"cost": Cost()}, {"params": {"half": "tbo0"}}, {"reads": ["w", "v"]},
                    {"kind": "norm", "writes": ("y",)}, {"stream": "comm"}, {"split": ["dp"]}, {"comm": []}):
        assert replace_op(op, **changes) == attrs.evolve(op, **changes)
    for bad in ({"name": ""}, {"params": (("k", 3),)}, {"stream": "nope"}, {"split": ("xx",)}):
        with pytest.raises(GraphsimError) as fast:
            replace_op(op, **bad)
        with pytest.raises(GraphsimError) as slow:
            attrs.evolve(op, **bad)
        assert str(fast.value) == str(slow.value)


# ---- graph check ------------------------------------------------------------------------------------------

def _toy(ops, edges=()):
    return Graph("toy", ops, edges, token_sets=(TokenSet("x"),), stages=("s",))


def test_bulk_check_names_the_first_offender_as_before():
    good = Op("a", "gemm", "s", Cost.of(Feature("tokens", "x"), exps=1.0), token_set="x")
    bad_ts = Op("b", "gemm", "s", Cost.of(Feature("tokens", "nope"), exps=1.0))
    bad_stage = Op("c", "gemm", "t")
    with pytest.raises(GraphsimError, match=r"op\[b\]\.cost"):
        _toy((good, bad_ts, bad_stage)).validate()
    with pytest.raises(GraphsimError, match=r"op\[c\]\.stage"):
        _toy((good, bad_stage, bad_ts)).validate()
    with pytest.raises(GraphsimError, match="goes against program order"):
        _toy((good, replace_op(good, name="d")), (Edge("d", "a"),)).validate()
    with pytest.raises(GraphsimError, match="unique"):
        _toy((good, good)).validate()
    g = _toy((good,)).validate()
    assert g.evolve(meta={"hw": "x"}).__dict__.get("_valid")  # a meta change keeps the passed check
    assert not g.evolve(ops=(good, bad_stage)).__dict__.get("_valid")


# ---- cost classes -----------------------------------------------------------------------------------------

def _lower_row_by_row(graph: Graph):
    """The lowering's cost classes as first written: one dense row per op, classes by row bytes."""
    from graphsim.core.ir import COMPONENT_INDEX, COMPONENTS

    feats: dict = {}
    for cost in [op.cost for op in graph.ops] + [c for op in graph.ops for _, c in op.alts[1:]]:
        for f in cost.features():
            feats.setdefault(f, len(feats))

    def row(cost):
        r = np.zeros((max(len(feats), 1), len(COMPONENTS)))
        for c, f, v in cost.terms:
            r[feats[f], COMPONENT_INDEX[c]] += v
        return r

    rows = [row(op.cost) for op in graph.ops]
    # an op with alternatives (a collective's algorithm x protocol) is keyed by all of them; each alternative
    # beyond its first is a class of its own, after the ops' classes
    keys: dict = {}
    op_class = np.array([keys.setdefault((rows[i].tobytes(), *(row(c).tobytes() for _, c in op.alts[1:])), len(keys))
                         for i, op in enumerate(graph.ops)])
    alt_rows, seen = [], set()
    for i, op in enumerate(graph.ops):  # in the order of each class's first op
        if op_class[i] not in seen:
            seen.add(op_class[i])
            alt_rows += [row(c) for _, c in op.alts[1:]]
    coef = np.zeros((rows[0].shape[0] if rows else 1, len(keys) + len(alt_rows), len(COMPONENTS)))
    for i in range(len(graph.ops)):
        coef[:, op_class[i], :] = rows[i]
    for j, r in enumerate(alt_rows):
        coef[:, len(keys) + j, :] = r
    return tuple(feats), coef, op_class


@pytest.mark.parametrize("policies", [gs.Policies(overlap="two-batch"), gs.Policies(fusion="single-pass")])
def test_cost_classes_equal_the_row_by_row_lowering(policies):
    c = gs.compile_plan(MODEL, gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=4, ep=4), policies), HW)
    feats, coef, op_class = _lower_row_by_row(c.graph)
    assert [repr(f) for f in c.program.features] == [repr(f) for f in feats]
    assert np.array_equal(c.program.op_class, op_class) and np.array_equal(c.program.coef, coef)
    again = lower(c.graph)  # the lowering is a function of the graph
    assert np.array_equal(again.coef, c.program.coef) and again.seg_preds == c.program.seg_preds


# ---- what a search shares between its programs ---------------------------------------------------------------
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
    # the same plan again is served (the graph object itself), and gives the first result; once: a third
    # compile builds it again (a search compiles a plan twice), which clear() drops
    again = compile_plan(model, base, hw, cache=cache)
    assert again.graph is a.graph and _fwd(again) == _fwd(a) and cache.hits == 1
    third = compile_plan(model, base, hw, cache=cache)
    assert third.graph is not a.graph and third.graph.ops == a.graph.ops
    cache.clear()
    assert compile_plan(model, base, hw, cache=cache).graph is not third.graph and cache.hits == 1


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


def test_a_lookup_key_is_its_query_memoized_by_value():
    """Lookup.key() is memoized per distinct lookup: equal lookups share it, and it is the query's repr."""
    from graphsim.views.measured.mapping import Coord, Lookup

    def lk(n, coef=1.0):
        return Lookup("gemm", "gemm", (("dtype", ("fp8",)),), (("n", n), ("k", 7168)),
                      (("m", Coord(((Feature("tokens", "q"), coef),))),))

    keys = {n: lk(n).key() for n in (1536, 2048)}
    assert keys[1536] != keys[2048] and lk(1536).key() == keys[1536]
    assert lk(1536, 0.5).key() != keys[1536]
    a = lk(2048)
    assert a.key() == repr((a.family, a.op, a.where, a.fixed, a.varying))
