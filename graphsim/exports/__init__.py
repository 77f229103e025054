"""Exporters: DOT pictures (:mod:`.dot`), Perfetto traces (:mod:`.trace`), matplotlib plots (:mod:`.plots`).

The core never imports these at import time; its notebook displays (``Graph``, ``Report``, ``Compiled``,
``Schedule``) import them when first shown. :func:`display` shows a graph with a schedule's critical path and
times; :func:`graph_svg` and :func:`graph_html` are a Graph's own pictures (SVG with layers collapsed when
Graphviz's ``dot`` is installed, else an HTML summary); :func:`html_table` is the escaped table they all use.
"""
from __future__ import annotations

import attrs

from graphsim.core.ir import Graph


@attrs.frozen(eq=False)
class GraphView:
    """A displayable graph: SVG in Jupyter when ``dot`` exists, else the DOT text in a ``<pre>``."""

    dot: str

    def _repr_svg_(self):
        from .dot import dot_available, render_svg

        return render_svg(self.dot) if dot_available() else None

    def _repr_html_(self):
        from html import escape

        from .dot import dot_available

        return None if dot_available() else f"<pre>{escape(self.dot)}</pre>"

    def save(self, path: str) -> str:
        """Write ``.svg`` (rendered) or anything else (DOT text)."""
        from .dot import render_svg

        from graphsim.core.outputs import write_text

        text = render_svg(self.dot) if str(path).endswith(".svg") else self.dot
        return write_text(path, text)


def display(graph_or_compiled, *, schedule=None, collapse_layers=True, **kw) -> GraphView:
    """A :class:`GraphView` of a Graph, or of a Compiled plan (then with its schedule: times, critical path)."""
    from .dot import to_dot

    graph = graph_or_compiled
    if not isinstance(graph, Graph):  # a Compiled
        schedule = schedule if schedule is not None else graph_or_compiled.schedule()
        graph = graph_or_compiled.graph
    return GraphView(to_dot(graph, schedule=schedule, collapse_layers=collapse_layers, **kw))


#: An SVG larger than this is not sent to a notebook (the HTML summary is shown instead).
SVG_MAX_CHARS = 4_000_000
#: A graph with more ops than this is drawn with one node per layer (a shipped model's decode: 1,000+ ops).
COLLAPSE_ABOVE_OPS = 200
#: Rows of a summary table before the rest is folded into one "… n more" row.
MAX_ROWS = 30


def graph_svg(graph: Graph) -> str | None:
    """The graph as SVG, layers collapsed above ``COLLAPSE_ABOVE_OPS`` ops; None when ``dot`` is missing, fails
    or times out, or the picture is over ``SVG_MAX_CHARS`` (a notebook then shows :func:`graph_html`, never a
    traceback)."""
    from graphsim.core.errors import GraphsimError

    from .dot import dot_available

    if not dot_available():
        return None
    try:
        svg = display(graph, collapse_layers=len(graph.ops) > COLLAPSE_ABOVE_OPS)._repr_svg_()
    except (GraphsimError, RuntimeError):  # dot failed or ran past its timeout
        return None
    return svg if svg is not None and len(svg) <= SVG_MAX_CHARS else None


def html_table(head, rows, *, caption: str = "", right=()) -> str:
    """An HTML table, every cell escaped: ``head`` the column titles, ``rows`` sequences of cells (``str()``
    of each), ``right`` the indices of right-aligned (numeric) columns; over ``MAX_ROWS`` rows the rest is
    counted in one last row."""
    from html import escape

    rows = list(rows)
    if len(rows) > MAX_ROWS:
        rows = rows[:MAX_ROWS - 1] + [(f"… {len(rows) - MAX_ROWS + 1} more",) + ("",) * (len(head) - 1)]

    def cell(tag, i, v):
        style = ' style="text-align:right"' if i in right else ""
        return f"<{tag}{style}>{escape(str(v))}</{tag}>"

    cap = f'<caption style="text-align:left">{escape(caption)}</caption>' if caption else ""
    return (f"<table>{cap}<thead><tr>{''.join(cell('th', i, h) for i, h in enumerate(head))}</tr></thead><tbody>"
            + "".join(f"<tr>{''.join(cell('td', i, v) for i, v in enumerate(r))}</tr>" for r in rows)
            + "</tbody></table>")


def side_by_side(*blocks: str) -> str:
    """HTML blocks (tables) in one wrapping row."""
    return ('<div style="display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start">'
            + "".join(f"<div>{b}</div>" for b in blocks) + "</div>")


def graph_html(graph: Graph) -> str:
    """A summary of a graph for a notebook: op, edge, tensor and layer counts, the passes that made it, ops per
    stage and per op kind (a few kilobytes whatever the graph's size)."""
    from html import escape

    ops = graph.ops
    layers = {(op.stage, op.layer) for op in ops if op.layer is not None}
    stages: dict = {}
    kinds: dict = {}
    for op in ops:
        s = stages.setdefault(op.stage, [0, set()])
        s[0] += 1
        if op.layer is not None:
            s[1].add(op.layer)
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    m = graph.meta
    made = ", ".join(x for x in (m.model, m.hw, m.mapping) if x)
    head = (f"<p><b>Graph {escape(repr(graph.name))}</b>{' (' + escape(made) + ')' if made else ''}: "
            f"{len(ops):,} ops, {len(graph.edges):,} edges, {len(graph.tensors):,} tensors, {len(layers):,} layers"
            + (f"; passes: {escape(', '.join(m.passes))}" if m.passes else "") + "</p>")
    by_stage = html_table(("stage", "ops", "layers"), [(s, n, len(ls)) for s, (n, ls) in stages.items()],
                          right=(1, 2))
    by_kind = html_table(("op kind", "ops"), sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])), right=(1,))
    return f'<div class="graphsim-graph">{head}{side_by_side(by_stage, by_kind)}</div>'


__all__ = ["GraphView", "display", "graph_html", "graph_svg", "html_table", "side_by_side"]
