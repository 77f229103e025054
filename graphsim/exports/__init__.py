"""Exporters: DOT pictures (:mod:`.dot`), Perfetto traces (:mod:`.trace`), matplotlib plots (:mod:`.plots`).

The core never imports these. Importing ``graphsim.exports`` gives :class:`~graphsim.ir.Graph` a Jupyter
``_repr_svg_`` (layers collapsed; ``None`` — so Jupyter falls back to text — when Graphviz's ``dot`` is
missing); :func:`display` shows a graph with a schedule's critical path and times.
"""
from __future__ import annotations

import attrs

from graphsim.ir import Graph


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

        from graphsim.outputs import write_text

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


def _graph_repr_svg(self: Graph):
    try:
        return display(self)._repr_svg_()
    except RuntimeError:  # dot failed: let Jupyter show the text repr instead of a traceback
        return None


# Attached here, not in ir.py, so the core stays free of exporters.
Graph._repr_svg_ = _graph_repr_svg

__all__ = ["GraphView", "display"]
