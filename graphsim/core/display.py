"""Tables for people and notebook display without upward imports: plain-text tables laid out by rich
(:func:`text_table`), the HTML tables every record's ``_repr_html_`` writes, a graph's HTML summary, and a registry of renderers that higher layers provide (a Graph's SVG picture comes from
:mod:`graphsim.exports`, which registers it when imported; ``graphsim/__init__.py`` names that package as the
provider, so the first picture asked for imports it — the core itself never imports the exporters)."""
from __future__ import annotations

import importlib
import io
from typing import Sequence

#: Rows of a summary table before the rest is folded into one "… n more" row.
MAX_ROWS = 30

_RENDERERS: dict = {}
_PROVIDERS: list = []


def register(kind: str, fn) -> None:
    """A renderer for ``kind`` (e.g. ``graph_svg``: Graph -> SVG text or None)."""
    _RENDERERS[kind] = fn


def provided_by(module: str) -> None:
    """``module`` registers renderers when imported (imported at the first :func:`renderer` call that needs it)."""
    if module not in _PROVIDERS:
        _PROVIDERS.append(module)


def renderer(kind: str):
    """The renderer registered for ``kind``, importing the declared providers once if none is yet; None if no
    provider has one (a display then falls back to HTML)."""
    if kind not in _RENDERERS:
        for module in _PROVIDERS:
            importlib.import_module(module)
    return _RENDERERS.get(kind)


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


def graph_html(graph) -> str:
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


def text_table(headers: Sequence[str], rows: Sequence[Sequence], *, right: Sequence[bool] | None = None,
               indent: int = 0) -> list[str]:
    """``rows`` under ``headers`` as text lines: each column as wide as its widest cell (nothing is cut), numbers
    right-aligned where ``right`` says so (default: every column but the text ones of the first row)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    if right is None:
        first = rows[0] if rows else ()
        right = [not isinstance(v, str) for v in first] + [False] * (len(headers) - len(first))
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), header_style="",
              show_lines=False)
    for h, r in zip(headers, right):
        t.add_column(h, justify="right" if r else "left", no_wrap=True)
    for row in rows:
        t.add_row(*(v if isinstance(v, str) else f"{v}" for v in row))
    buf = io.StringIO()
    Console(file=buf, width=100_000, color_system=None, force_terminal=False, highlight=False, emoji=False,
            soft_wrap=True).print(t)
    pad = " " * indent
    return [pad + ln.rstrip().replace("\u2500", "-") for ln in buf.getvalue().splitlines() if ln.strip()]
