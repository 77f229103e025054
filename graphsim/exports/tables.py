"""Plain-text tables for the commands' text output (:func:`graphsim.core.display.text_table`, laid out by rich:
widths from the content, nothing truncated, no colour), re-exported where the exporters live."""
from __future__ import annotations

from graphsim.core.display import text_table

__all__ = ["text_table"]
