"""Longest path on hand-made graphs; the JAX reduced-graph evaluation equals the NumPy full-graph reference."""
import numpy as np
from hypothesis import given, settings, strategies as st

from graphsim.core.builder import GraphBuilder
from graphsim.core.ir import COMPONENTS, ONE, Cost, Feature, replace_op
from graphsim.lowering.evaluate import evaluate, evaluate_reference, unit_time
from graphsim.lowering.program import lower
from graphsim.core.workload import Workload

# unit rates: 1 FLOP/s, 1 B/s, so an op costing x flops lasts x seconds
UT = unit_time({c: (1.0 if not c.startswith("hops") else 0.0) for c in COMPONENTS})
WL = Workload(("prefill",), [[1]], [[1]], [[0]])


def timed(b, name, secs, **kw):
    return b.op(name, "gemm", Cost.of(ONE, flops_bf16=secs), **kw)


def run(g):
    p = lower(g)
    ref = evaluate_reference(p, WL, UT)
    jx = evaluate(p, WL, UT)
    assert abs(jx["forward"][0] - ref.forward[0]) <= 1e-12 * max(1, ref.forward[0])
    return ref


def names(g, ref):
    return [g.ops[i].name for i in ref.critical_path(0)]


def test_chain_adds():
    b = GraphBuilder("chain")
    with b.stage("s"):
        for i, t in enumerate([1, 2, 3]):
            timed(b, f"op{i}", t)
    g = b.build()
    ref = run(g)
    assert ref.forward[0] == 6  # 1 + 2 + 3
    assert names(g, ref) == ["op0", "op1", "op2"]


def test_diamond_takes_longer_branch():
    b = GraphBuilder("diamond")
    with b.stage("s"):
        a = timed(b, "a", 1)
        x = timed(b, "x", 5, deps=[a])
        y = b.op("y", "gemm", Cost.of(ONE, flops_bf16=2), stream="comm", deps=[a])
        timed(b, "z", 1, deps=[x, y])
    g = b.build()
    ref = run(g)
    assert ref.forward[0] == 1 + 5 + 1  # max(5, 2) on the middle
    assert names(g, ref) == ["a", "x", "z"]


def test_two_streams_overlap():
    # comm (4 s) runs beside compute c1 (3 s) + c2 (3 s); the join waits for both
    b = GraphBuilder("overlap")
    with b.stage("s"):
        a = timed(b, "a", 1)
        comm = b.op("comm", "collective", Cost.of(ONE, flops_bf16=4), stream="comm", deps=[a])
        timed(b, "c1", 3, deps=[a])
        c2 = timed(b, "c2", 3)
        timed(b, "join", 1, deps=[c2, comm])
    ref = run(b.build())
    assert ref.forward[0] == 1 + 6 + 1
    b2 = GraphBuilder("overlap-comm-bound")
    with b2.stage("s"):
        a = timed(b2, "a", 1)
        comm = b2.op("comm", "collective", Cost.of(ONE, flops_bf16=10), stream="comm", deps=[a])
        timed(b2, "c1", 3, deps=[a])
        timed(b2, "join", 1, deps=[comm])
    g2 = b2.build()
    ref2 = run(g2)
    assert ref2.forward[0] == 1 + 10 + 1
    assert names(g2, ref2) == ["a", "comm", "join"]


def test_one_stream_serializes_independent_ops():
    # no data edge between x and y, but both on the compute stream -> they run one after the other
    b = GraphBuilder("serial")
    with b.stage("s"):
        timed(b, "x", 2, deps=[])
        timed(b, "y", 3, deps=[])
    assert run(b.build()).forward[0] == 5
    b = GraphBuilder("parallel")
    with b.stage("s"):
        timed(b, "x", 2, deps=[])
        b.op("y", "gemm", Cost.of(ONE, flops_bf16=3), stream="comm", deps=[])
    assert run(b.build()).forward[0] == 3


@settings(max_examples=max(4, int(__import__("os").environ.get("GRAPHSIM_FUZZ_EXAMPLES", "8")) // 2), deadline=None)
@given(st.data())
def test_random_dags_jax_equals_numpy(data):  # each example JIT-compiles: GRAPHSIM_FUZZ_EXAMPLES=50 for 25
    n = data.draw(st.integers(2, 40))
    b = GraphBuilder("rand")
    b.token_set("all")
    names_ = []
    with b.stage("s"):
        for i in range(n):
            deps = data.draw(st.lists(st.sampled_from(names_), max_size=3, unique=True)) if names_ else []
            stream = data.draw(st.sampled_from(["compute", "comm", "host_copy"]))
            k = data.draw(st.sampled_from([1.0, 2.0, 3.5]))
            cost = Cost.of(Feature("tokens", "all"), flops_bf16=k * (i % 3 + 1), bytes_act=7.0 * (i % 2)) + Cost.of(ONE, hops_nvlink=1)
            names_.append(b.op(f"o{i}", "gemm", cost, stream=stream, deps=deps))
    g = b.build()
    # some ops carry alternatives (a collective's algorithm x protocol): fewer steps on a slower link, or more
    # bytes at a lower latency; the op takes the fastest at each point, so the winner changes with the tokens
    alt = data.draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True))
    ops = list(g.ops)
    for i in alt:
        k = data.draw(st.sampled_from([0.5, 2.0]))
        other = Cost.of(Feature("tokens", "all"), bytes_nvlink=k * (i % 2 + 1)) + Cost.of(ONE, hops_nvlink_ll=3)
        third = Cost.of(Feature("tokens", "all"), bytes_scaleout=4.0 * k) + Cost.of(ONE, hops_nvlink_simple=1)
        options = (("a", ops[i].cost), ("b", other), ("c", third))[:data.draw(st.integers(2, 3))]
        ops[i] = replace_op(ops[i], alts=options)
    g = g.evolve(ops=tuple(ops))
    p = lower(g)
    rng = np.random.default_rng(n)
    P = 64
    wl = Workload(("prefill", "decode"), rng.integers(1, 9, (P, 2)), rng.integers(1, 999, (P, 2)), rng.integers(0, 999, (P, 2)))
    ut = np.tile(unit_time({c: 1e3 if not c.startswith("hops") else 1e-3 for c in COMPONENTS}), (P, 1))
    ut[:, COMPONENTS.index("bytes_act")] *= rng.uniform(0.5, 2, P)
    ut[:, COMPONENTS.index("bytes_nvlink")] *= rng.uniform(0.5, 2, P)
    ref = evaluate_reference(p, wl, ut, 1e-6)
    stage_busy = ref.duration.sum(axis=1)
    from graphsim.lowering.evaluate import Evaluator, reference_outputs

    outs = ("forward", "stages", "kinds", "classes", "workspace", "components")
    want = reference_outputs(p, wl, ut, 1e-6, None, outs)
    # both kernel routes: NumPy (few points) and jitted JAX in several chunks incl. a padded one (the level
    # schedule's window, reach and widths vary with the drawn DAG)
    for numpy_points in (1 << 20, 0):
        jx = Evaluator(p, wl.kinds, chunk=16, numpy_points=numpy_points)(wl, ut, 1e-6, outputs=outs)
        np.testing.assert_allclose(jx["forward"], ref.forward, rtol=1e-9)
        np.testing.assert_allclose(jx["stages"][:, 0], stage_busy, rtol=1e-9)
        for k in outs:
            np.testing.assert_allclose(jx[k], want[k], rtol=1e-9, atol=1e-18, err_msg=k)
    for i in alt[:3]:  # an op with alternatives takes the fastest: each alternative alone, as a plain op
        plain = [g.evolve(ops=tuple(replace_op(o, cost=c, alts=()) if j == i else o for j, o in enumerate(g.ops)))
                 for _, c in g.ops[i].alts]
        alone = [evaluate_reference(lower(h), wl, ut, 1e-6).duration[:, i] for h in plain]
        np.testing.assert_allclose(ref.duration[:, i], np.min(alone, axis=0), rtol=1e-12)
        assert [g.ops[i].alts[j][0] for j in np.argmin(alone, axis=0)] == [ref.algorithm(i, q) for q in range(P)]


def test_reduction_collapses_single_stream_graph_to_one_segment():
    b = GraphBuilder("long")
    with b.stage("s"):
        a = timed(b, "a", 1)
        for i in range(20):
            timed(b, f"x{i}", 1)
        timed(b, "late", 1, deps=[a, b.last])  # an implied (transitive) edge, e.g. a KV-owner read
    p = lower(b.build())
    assert p.n_segments == 1
    assert p.n_classes == 1  # 22 identical cost rows -> one cost class


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] < e[1])))))
def test_transitive_reduction_is_networkx(dag):
    # the bitset reduction on the lowering path against networkx's (the oracle; 100-3000x slower on a
    # 1,300-op graph, which is why lowering does not call it)
    import networkx as nx

    from graphsim.lowering.program import _transitive_reduction

    n, edges = dag
    preds = tuple(tuple(sorted(u for u, v in edges if v == w)) for w in range(n))
    ours = {(u, v) for v, ps in enumerate(_transitive_reduction(n, preds)) for u in ps}
    g = nx.DiGraph(sorted(edges))
    g.add_nodes_from(range(n))
    assert ours == set(nx.transitive_reduction(g).edges)


def test_transitive_reduction_of_a_shipped_graph_is_networkx():
    import networkx as nx

    import graphsim as gs
    from graphsim.lowering.program import _preds, _transitive_reduction

    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:4096x8"], gs.ParallelMapping(dp=8, ep=8)), "gb300")
    preds = _preds(c.graph)
    g = nx.DiGraph([(u, v) for v, ps in enumerate(preds) for u in ps])
    ours = {(u, v) for v, ps in enumerate(_transitive_reduction(len(preds), preds)) for u in ps}
    assert ours == set(nx.transitive_reduction(g).edges) and len(ours) < g.number_of_edges()


def test_big_dags_give_the_reference_numbers_on_both_kernel_routes():
    # a pipeline-parallel prefill unrolls into thousands of segments: the level-scheduled kernel (NumPy for a
    # few points, jitted JAX for many) gives the NumPy full-graph schedule's outputs, every one of them
    import graphsim as gs
    from graphsim.lowering import evaluate as E

    c = gs.compile_plan("llama-3.1-70b", gs.Plan(["prefill:2048x4"], gs.ParallelMapping(pp=4, dp=2)), "gb200")
    assert c.program.n_segments > 256
    wl = gs.Workload.stack([gs.Plan([f"prefill:{n}x4"]).workload() for n in (1024, 2048, 3000)])
    outs = ("forward", "stages", "kinds", "classes", "workspace", "components")
    ref = E.reference_outputs(c.program, wl, c.unit_time(), 0.0, None, outs)
    jit = E.build_kernel(c.program, wl.kinds, outs)(wl.arrays(), np.broadcast_to(c.unit_time(), (3, len(c.unit_time()))),
                                                     np.zeros(3))
    for k in outs:
        np.testing.assert_allclose(ref[k], np.asarray(jit[k]), rtol=1e-9, atol=1e-18, err_msg=k)
    routed = c.evaluate(wl, outputs=outs)  # 3 points: the NumPy route of the same kernel
    for k in outs:
        np.testing.assert_allclose(routed[k], ref[k], rtol=1e-12, atol=1e-18, err_msg=k)

def test_the_graph_hands_itself_to_networkx():
    """Graph.to_networkx(): every op a node with its kind and stream, the dependency edges, acyclic (program order
    is a topological order)."""
    import networkx as nx

    import graphsim as gs

    g = gs.compile_plan("deepseek-v3", gs.Plan(["decode:1024x8"], gs.ParallelMapping(tp=4, ep=4)), "gb200").graph
    d = g.to_networkx()
    assert d.number_of_nodes() == len(g.ops) and nx.is_directed_acyclic_graph(d)
    assert d.number_of_edges() == len({(e.src, e.dst) for e in g.edges})
    op = g.ops[len(g.ops) // 2]
    assert d.nodes[op.name]["kind"] == op.kind and d.nodes[op.name]["stream"] == op.stream
    order = {o.name: i for i, o in enumerate(g.ops)}
    assert all(order[a] < order[b] for a, b in d.edges)  # program order is topological
