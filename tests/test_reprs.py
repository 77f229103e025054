"""Compact reprs (issue 16): a notebook cell that ends in a graph, a compiled plan, a schedule or a report
shows one summary line, not megabytes of fields; its rich display is a picture or HTML tables."""
import shutil
import subprocess
import sys

import attrs
import pytest

import graphsim as gs


def test_reprs_are_one_summary_line():
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x8"]), "gb200")
    s, r = c.schedule(), c.report()
    for obj, head in ((c, "Compiled(deepseek-v3 on GB200"), (c.graph, "Graph('deepseek-v3'"),
                      (c.program, "CostProgram('deepseek-v3'"), (s, "Schedule('deepseek-v3'"),
                      (r, "Report(deepseek-v3 on GB200"), (c.evaluator, "Evaluator(CostProgram(")):
        text = repr(obj)
        assert text.startswith(head) and "\n" not in text and len(text) < 300, text  # issue 16: under 300
    assert f"{len(c.graph.ops)} ops" in repr(c.graph)
    assert str(r) == r.to_text()  # print(report) shows the whole report


# ---- rich displays (issue 16, part 3): a notebook shows pictures and tables after a plain `import graphsim` ----
HAS_DOT = shutil.which("dot") is not None
NO_DOT = "Graphviz's `dot` binary is not installed (apt-get install graphviz): the SVG display is not checked"


@pytest.fixture(scope="module")
def v3():
    return gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=4, ep=4)), "gb200")


def _toy(name: str = "toy") -> "gs.Graph":
    b = gs.GraphBuilder(name)
    b.token_set("all")
    with b.stage("main"):
        for i in range(3):
            with b.layer(i):
                b.gemm("up", "all", 64, 128, weight_format="bf16")
                b.elementwise("act", "all", 128, bytes_in=2, bytes_out=2, kind="activation")
    return b.build()


def test_core_imports_no_exporter():
    code = "import graphsim.core.ir, graphsim.driver.report, graphsim.driver.pipeline, sys; print('graphsim.exports' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "False", r.stderr[-2000:]


@pytest.mark.skipif(not HAS_DOT, reason=NO_DOT)
def test_graph_displays_as_svg_with_dot(v3):
    from graphsim.exports import SVG_MAX_CHARS

    bundle = v3.graph._repr_mimebundle_()
    assert list(bundle) == ["image/svg+xml"]  # one rich form: a front end would prefer HTML over SVG
    svg = bundle["image/svg+xml"]
    assert svg.lstrip().startswith(("<?xml", "<svg")) and "layer 60" in svg  # layers collapsed
    assert len(svg) < min(SVG_MAX_CHARS, 1_000_000)
    assert v3.graph._repr_svg_() == svg


def test_graph_displays_html_summary_without_dot(v3, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as on a machine without Graphviz
    bundle = v3.graph._repr_mimebundle_()
    assert list(bundle) == ["text/html"] and v3.graph._repr_svg_() is None
    html = bundle["text/html"]
    kinds = {op.kind for op in v3.graph.ops}
    assert "deepseek-v3" in html and html.count("<table") == 2 and f"{len(v3.graph.ops):,} ops" in html
    assert "61 layers" in html and all(f"<td>{k}</td>" in html for k in kinds) and len(html) < 10_000


def test_graph_display_survives_a_failing_dot(monkeypatch):
    from graphsim.exports import dot

    def broken(text):
        raise RuntimeError("dot failed: segfault")

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/dot")
    monkeypatch.setattr(dot, "render_svg", broken)
    assert list(_toy()._repr_mimebundle_()) == ["text/html"]  # the summary, not a traceback


def test_displays_escape_names(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    html = _toy('<script>alert("x")</script>&')._repr_mimebundle_()["text/html"]
    assert "<script>" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in html


def test_html_table_escapes_and_bounds_rows():
    from graphsim.exports import MAX_ROWS, html_table

    t = html_table(("a<b", "n"), [(f"<i>{i}</i>", i) for i in range(100)], caption="c&d", right=(1,))
    assert t.count("<tr>") == MAX_ROWS + 1 and f"… {100 - MAX_ROWS + 1} more" in t  # header + MAX_ROWS rows
    assert "<i>" not in t and "&lt;i&gt;0&lt;/i&gt;" in t and "a&lt;b" in t and "c&amp;d" in t
    assert '<td style="text-align:right">3</td>' in t


def test_report_html(v3):
    r = v3.report()
    html = r._repr_html_()
    top = max(r.critical_path, key=lambda o: o["duration_s"])
    for text in ("deepseek-v3", "GB200 x4", "tp4-dp1-ep4-pp1", "decode:4096x8", "forward", "ITL (decode)",
                 "tokens/s per GPU", f"{r.tokens['tokens_per_s_per_gpu']:,.0f}", "memory per device",
                 f"{r.memory['total_gib']:.2f}", "critical path: top 12 of", top["name"]):
        assert text in html, text
    assert html.count("<table") == 5 and "TTFT" not in html and "<pre>" not in html and len(html) < 20_000
    evil = attrs.evolve(r, identity={**r.identity, "model": "<b>m&m</b>"})._repr_html_()
    assert "<b>m&m</b>" not in evil and "&lt;b&gt;m&amp;m&lt;/b&gt;" in evil
    assert repr(r).startswith("Report(deepseek-v3 on GB200") and r.to_text() in str(r)  # text forms unchanged


def test_compiled_and_schedule_html(v3):
    html = v3._repr_html_()
    assert html.startswith("<p><code>Compiled(deepseek-v3 on GB200") and 'class="graphsim-report"' in html
    s = v3.schedule()
    sh = s._repr_html_()
    path = s.critical_path()
    longest = max(path, key=lambda i: s.duration[0, i])
    assert f"forward {s.forward[0] * 1e3:.4g} ms" in sh and f"critical path {len(path):,} ops" in sh
    assert v3.graph.ops[longest].name in sh and sh.count("<tr>") == 1 + 8 and len(sh) < 5_000


def test_report_shares_say_they_are_of_the_forward_and_why_they_can_pass_100_percent():
    """Busy times count every stream: with two-batch overlap the all-to-alls run beside the experts, so the op
    kinds' busy times add to more than the forward — the report says so, with the sum (sum of busy / forward);
    one GPU of a dense model has one stream and no such line."""
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x64"], gs.ParallelMapping(tp=4, ep=4),
                                               gs.Policies(overlap="two-batch")), "gb200")
    r = c.report()
    busy = sum(r.breakdown.values())
    assert busy > r.forward_s  # overlapped communication
    text = r.to_text()
    assert "of forward" in text and f"add to {100 * busy / r.forward_s:.1f} % of the forward" in text
    assert "streams overlap" in r._repr_html_()
    one = gs.compile_plan("llama-3.1-70b", gs.Plan(["decode:4096x8"]), "gb200").report()
    assert sum(one.breakdown.values()) <= one.forward_s * (1 + 1e-9) and "streams overlap" not in one.to_text()
