"""Compact reprs (issue 16): a notebook cell that ends in a graph, a compiled plan, a schedule or a report
shows one summary line, not megabytes of fields."""
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
