"""Exports: DOT pictures (clusters, critical path, tooltips, rendering), Jupyter display, Perfetto traces, roofline."""
import json
import re
import shutil

import numpy as np
import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.exports import GraphView, display
from graphsim.exports.dot import render_svg, to_dot
from graphsim.exports.trace import TRACKS, to_trace, trace_of

HAS_DOT = shutil.which("dot") is not None
NO_DOT = "Graphviz's `dot` binary is not installed (apt-get install graphviz): SVG rendering not checked"


@pytest.fixture(scope="module")
def v41():
    return gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["decode:65536x8"], gs.ParallelMapping(dp=8, ep=8)), "gb300")


@pytest.fixture(scope="module")
def llama():
    return gs.compile_plan("llama-3.1-70b", gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=4)), "gb200")


def critical_edges(dot: str) -> list[tuple[str, str]]:
    return re.findall(r"^\s*(\w+) -> (\w+) \[[^\]]*class=critical", dot, flags=re.M)


def test_dot_stage_clusters_and_critical_path(v41):
    sched = v41.schedule()
    dot = to_dot(v41.graph, schedule=sched, collapse_layers=True)
    import graphviz

    src = graphviz.Source(dot)  # the Python package takes it as DOT source
    assert src.source.startswith("digraph") and dot.count("{") == dot.count("}")
    stages = dict.fromkeys(op.stage for op in v41.graph.ops)
    for s in stages:
        assert f'label="stage: {s}' in dot, s
    assert len(re.findall(r"subgraph cluster_stage_\d+", dot)) == len(stages)
    crit = critical_edges(dot)
    assert crit and all("color=red" in line for line in dot.splitlines() if "class=critical" in line)
    # the marked edges form one chain (collapsed: between layer nodes and ungrouped ops)
    heads = [b for _, b in crit]
    assert len(set(heads)) == len(heads)
    if HAS_DOT:
        svg = src.pipe(format="svg").decode()
        assert "<svg" in svg and "critical" in svg


def test_dot_full_graph_marks_every_critical_hop(llama):
    sched = llama.schedule()
    path = sched.critical_path()
    dot = to_dot(llama.graph, schedule=sched)
    crit = critical_edges(dot)
    assert set(crit) == {(f"n{a}", f"n{b}") for a, b in zip(path, path[1:])}  # data and stream-order hops
    node = re.search(rf'^\s*n{path[len(path) // 2]} \[.*$', dot, flags=re.M).group(0)
    assert "color=red" in node and "FLOP" in node and " us" in node and "bound:" in node  # tooltip: flops, time
    assert "cluster_legend" in dot


def test_dot_edge_styles_by_dependency_kind(v41):
    kinds = {e.kind for e in v41.graph.edges}
    dot = to_dot(v41.graph)
    from graphsim.exports.dot import EDGE_STYLES

    for k in kinds:
        assert re.search(rf"style={EDGE_STYLES[k]} tooltip={k}", dot), k
    assert {"cache_read", "topk_reuse"} <= kinds  # KV-owner reads and Top-K reuse (V41_FACTS §2)
    assert re.search(r"style=dashed tooltip=cache_read", dot) and re.search(r"style=dotted tooltip=topk_reuse", dot)


def test_collapse_some_layers(llama):
    dot = to_dot(llama.graph, collapse_layers=[0, 1])
    assert "L1_0" in dot and "L1_1" in dot and "L1_2" not in dot
    assert "subgraph cluster_s1_l2 " in dot and "subgraph cluster_s1_l0 " not in dot


@pytest.mark.skipif(not HAS_DOT, reason=NO_DOT)
def test_render_svg_and_cli_svg(tmp_path, capsys):
    g = gs.load_model("llama-3.1-70b").build(("decode",))
    assert render_svg(to_dot(g, collapse_layers=True)).lstrip().startswith(("<?xml", "<svg"))
    out = tmp_path / "g.svg"
    assert main(["graph", "--model", "llama-3.1-70b", "--request", "decode:1024x4", "--collapse", "-o", str(out)]) == 0
    assert "edge critical" in out.read_text()


def test_display_and_repr_svg_fall_back_without_dot(llama, monkeypatch):
    view = display(llama)
    assert isinstance(view, GraphView) and "class=critical" in view.dot
    if HAS_DOT:
        assert view._repr_svg_().lstrip().startswith(("<?xml", "<svg")) and view._repr_html_() is None
        assert llama.graph._repr_svg_() is not None
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as on a machine without Graphviz
    assert view._repr_svg_() is None and view._repr_html_().startswith("<pre>digraph")
    assert llama.graph._repr_svg_() is None
    with pytest.raises(gs.GraphsimError, match="output: an SVG needs the graphviz 'dot' binary.*apt-get install graphviz"):
        render_svg(view.dot)


# ---- traces ----------------------------------------------------------------------------------------

def test_trace_schema(v41):
    sched = v41.schedule()
    t = trace_of(v41)
    json.dumps(t)  # serializable as is
    ev = t["traceEvents"]
    meta = [e for e in ev if e["ph"] == "M"]
    names = {(e["name"], e.get("tid"), e["args"].get("name")) for e in meta}
    assert ("process_name", 0, "rank 0 (tp1-dp8-ep8-pp1; represents all 8 GPUs)") in names
    for tid, track in enumerate(TRACKS):
        assert ("thread_name", tid, track) in names
    xs = [e for e in ev if e["ph"] == "X"]
    for e in xs:
        assert set(e) >= {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
        assert e["pid"] == 0 and e["dur"] >= 0 and e["ts"] >= 0
    ops = [e for e in xs if e["tid"] < 3]
    assert len(ops) == len(v41.graph.ops)
    by_name = {op.name: i for i, op in enumerate(v41.graph.ops)}
    for e in ops[:: max(1, len(ops) // 50)]:
        i = by_name[e["name"]]
        op = v41.graph.ops[i]
        assert e["tid"] == ["compute", "comm", "host_copy"].index(op.stream) and e["cat"] == op.kind
        assert e["ts"] == pytest.approx(sched.start[0, i] * 1e6, abs=1e-5)
        assert e["dur"] == pytest.approx(sched.duration[0, i] * 1e6, abs=1e-5)
        a = e["args"]
        assert a["stage"] == op.stage and a["layer"] == op.layer and a["formula"] == op.formula
        assert a["bound"] in ("compute", "hbm", "nvlink", "scaleout", "c2c", "latency", "idle")
        assert set(a["flops"]) <= {"fp4", "fp8", "bf16", "tf32", "fp32", "int8"}
        assert set(a["bytes"]) <= {"weight", "kv", "act", "nvlink", "scaleout", "c2c"}
    crit = [e for e in xs if e["tid"] == TRACKS.index("critical path")]
    assert len(crit) == len(sched.critical_path())
    end = max(e["ts"] + e["dur"] for e in crit)
    assert end == pytest.approx(sched.forward[0] * 1e6, rel=1e-9)
    stages = [e for e in xs if e["tid"] == TRACKS.index("stages")]
    assert {e["name"] for e in stages} == {op.stage for op in v41.graph.ops}
    assert t["otherData"]["model"] == v41.model.name and t["otherData"]["graphsim_version"] == gs.__version__


def test_trace_several_ranks_and_cli(llama, tmp_path, capsys):
    t = to_trace([("a", llama.schedule()), ("b", llama.schedule())])
    assert {e["pid"] for e in t["traceEvents"]} == {0, 1}
    out = tmp_path / "t.json"
    assert main(["trace", "--model", "deepseek-v3", "--tp", "4", "--ep", "4", "--request", "decode:4096x8",
                 "-o", str(out)]) == 0
    ev = json.loads(out.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["tid"] == 1 for e in ev)  # collectives on the comm track
    assert main(["trace", "--model", "deepseek-v3", "--tp", "3", "--request", "decode:1", "-o", str(out)]) == 2
    assert "mapping.tp" in capsys.readouterr().err


# ---- roofline --------------------------------------------------------------------------------------

def test_roofline_points_under_the_roof(v41, tmp_path):
    from graphsim.exports.plots import plot_roofline, roofline_points

    r = roofline_points(v41.schedule())
    assert len(r["intensity"]) > 10
    roof = np.minimum(max(r["peaks"].values()), r["hbm_bw"] * r["intensity"])
    assert (r["achieved"] <= roof * (1 + 1e-9)).all()  # SOL ops never beat the roofline
    out = plot_roofline(v41.schedule(), tmp_path / "roof.png")
    assert open(out, "rb").read(4) == b"\x89PNG"


def test_collapsed_layer_labels_break_lines_not_backslashes(v41):
    # DOT escapes: a label line break is `\n` inside the quoted string, never a literal backslash
    dot = to_dot(v41.graph, collapse_layers=True)
    assert re.search(r'label="layer 0\\n\d+ ops"', dot)
    assert "\\\\n" not in dot


def test_large_graphs_get_a_bounded_layout(llama, monkeypatch):
    # the fuzz campaign's one hang: `graph --model deepseek-v4.1-flash -o x.svg` spent 55 s in dot's
    # network simplex on 1,184 nodes; above FAST_LAYOUT_NODES its iterations are capped (1.3 s) by graph
    # attributes the DOT text carries (the same as dot's -G flags)
    from graphsim.exports import dot as D

    small = D.to_digraph(llama.graph, collapse_layers=True)  # 80 layer nodes and a few ops
    large = D.to_digraph(llama.graph)  # every op: over FAST_LAYOUT_NODES
    assert len(llama.graph.ops) > D.FAST_LAYOUT_NODES
    assert not set(D.FAST_LAYOUT) & set(small.graph_attr)
    assert {k: large.graph_attr[k] for k in D.FAST_LAYOUT} == D.FAST_LAYOUT
    assert re.search(r"graph \[.*mclimit=0\.1.*nslimit=1 nslimit1=1", large.source)


def test_a_dot_that_runs_too_long_is_stopped(tmp_path, monkeypatch):
    # the graphviz package's pipe has no timeout: the deadline interrupts it and subprocess.run kills the child
    import os
    import time

    from graphsim.exports import dot as D

    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    pidfile = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(D, "DOT_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(gs.GraphsimError, match="--collapse"):
        D.render_svg("digraph g { a -> b }")
    assert time.monotonic() - t0 < 10
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_a_failing_dot_is_a_runtime_error_with_its_message(tmp_path, monkeypatch):
    import os

    from graphsim.exports import dot as D

    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'syntax error in line 1' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(RuntimeError, match="dot failed: syntax error in line 1"):
        D.render_svg("digraph g { a -> b }")


def test_names_are_text_not_html_or_escapes():
    # a graph or stage named like an HTML label, with quotes or a backslash, stays text: the package quotes it
    # and escapes its quotes, we double the backslash (DOT would read `\n` in a name as a line break)
    b = gs.GraphBuilder("<g>")
    b.token_set("all")
    with b.stage('s"\\n<x>'):
        b.gemm("up", "all", 64, 128, weight_format="bf16")
    dot = to_dot(b.build())
    assert dot.startswith('digraph "<g>" {')
    assert 'label="stage: s\\"\\\\n<x>"' in dot
    if HAS_DOT:
        svg = render_svg(dot)
        assert "stage: s&quot;\\n&lt;x&gt;" in svg
