"""Exporters: DOT pictures (:mod:`.dot`), Perfetto traces (:mod:`.trace`), matplotlib plots (:mod:`.plots`).

The core never imports these: its notebook displays (``Graph``, ``Report``, ``Compiled``, ``Schedule``) write
HTML with :mod:`graphsim.core.display`, and a Graph's SVG comes from the renderer this package registers there
(``graphsim/__init__.py`` names this package as the provider, imported when a picture is first asked for). :func:`display` shows a graph with a schedule's critical path and
times; :func:`graph_svg` and :func:`graph_html` are a Graph's own pictures (SVG with layers collapsed when
Graphviz's ``dot`` is installed, else an HTML summary); :func:`html_table` is the escaped table they all use.
"""
from __future__ import annotations

import attrs

from graphsim.core import display as _display
from graphsim.core.display import MAX_ROWS, graph_html, html_table, side_by_side  # noqa: F401 (their home: core)
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


_display.register("graph_svg", graph_svg)  # a Graph's notebook picture (graphsim.core.ir asks the registry)

__all__ = ["GraphView", "display", "graph_html", "graph_svg", "html_table", "side_by_side"]
