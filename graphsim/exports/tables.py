"""Plain-text tables for the commands' text output, laid out by rich (widths from the content, nothing truncated,
no colour: the text is for people and for pipes alike)."""
from __future__ import annotations

import io
from typing import Sequence


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


__all__ = ["text_table"]
