"""A small row-filter language for results tables (``graphsim plot --where``) — not pandas ``query``, which can
call methods and evaluate Python.

Grammar (case-insensitive keywords)::

    expr       := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" expr ")" | comparison
    comparison := column op literal
    op         := == | != | < | <= | > | >= | in
    column     := a name of letters, digits, _ . -   or   `any text in backquotes`
    literal    := number | 'text' | "text" | true | false | [literal, ...]   (a list only after "in")

Examples: ``decode.count == 64``, ```decode.count` >= 8 and mapping != 'tp8-dp1-ep1-pp1'``,
``hw in ['GB200', 'GB300'] and not fits == false``.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from ..core.errors import GraphsimError, require

_TOKEN = re.compile(r"""\s*(?:
      (?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.])
    | (?P<str>'[^']*'|"[^"]*")
    | (?P<quoted>`[^`]+`)
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
    | (?P<word>[A-Za-z_][\w.\-]*)
    )""", re.X)
OPS = ("==", "!=", "<", "<=", ">", ">=", "in")
MAX_LENGTH = 2000
#: nested parentheses / "not"s a filter may hold (the parser recurses once per level)
MAX_DEPTH = 64


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise GraphsimError("where", f"cannot read {text[pos:pos + 20]!r} (at character {pos}); see --help")
        kind = m.lastgroup
        val = m.group(kind)
        if kind == "word" and val.lower() in ("and", "or", "not", "in", "true", "false"):
            kind, val = ("op", "in") if val.lower() == "in" else ("kw", val.lower())
        out.append((kind, val))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str, columns):
        self.toks = _tokens(text)
        self.i = 0
        self.columns = set(map(str, columns))
        self.depth = 0

    def nest(self) -> None:
        self.depth += 1
        require(self.depth <= MAX_DEPTH, "where", f"nested deeper than {MAX_DEPTH} levels of parentheses or 'not'")

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        t = self.peek()
        require(t is not None, "where", "the filter ends too early")
        self.i += 1
        return t

    def expect(self, val: str) -> None:
        t = self.take()
        require(t[1] == val, "where", f"expected {val!r}, got {t[1]!r}")

    def parse(self) -> Callable:
        f = self.or_()
        require(self.peek() is None, "where", f"unexpected {self.peek()[1]!r} after a complete filter"
                if self.peek() else "")
        return f

    def or_(self):
        f = self.and_()
        while self.peek() == ("kw", "or"):
            self.take()
            g, h = f, self.and_()
            f = lambda df, g=g, h=h: g(df) | h(df)  # noqa: E731
        return f

    def and_(self):
        f = self.not_()
        while self.peek() == ("kw", "and"):
            self.take()
            g, h = f, self.not_()
            f = lambda df, g=g, h=h: g(df) & h(df)  # noqa: E731
        return f

    def not_(self):
        t = self.peek()
        if t == ("kw", "not"):
            self.take()
            self.nest()
            g = self.not_()
            self.depth -= 1
            return lambda df: ~g(df)
        if t == ("op", "("):
            self.take()
            self.nest()
            f = self.or_()
            self.expect(")")
            self.depth -= 1
            return f
        return self.comparison()

    def comparison(self):
        kind, val = self.take()
        require(kind in ("word", "quoted"), "where", f"expected a column name, got {val!r}")
        col = val.strip("`")
        require(col in self.columns, "where", f"no column {col!r}; columns: {', '.join(sorted(self.columns))[:300]}")
        kind, op = self.take()
        require(kind == "op" and op in OPS, "where", f"expected one of {' '.join(OPS)} after {col!r}, got {op!r}")
        lit = self.list_literal() if op == "in" else self.literal()
        return lambda df: _compare(df[col], op, lit)

    def literal(self) -> Any:
        kind, val = self.take()
        if kind == "num":
            return float(val)
        if kind == "str":
            return val[1:-1]
        if kind == "kw" and val in ("true", "false"):
            return val == "true"
        raise GraphsimError("where", f"expected a number, 'text' or true/false, got {val!r}")

    def list_literal(self) -> list:
        self.expect("[")
        out = [self.literal()]
        while self.peek() == ("op", ","):
            self.take()
            out.append(self.literal())
        self.expect("]")
        return out


def _compare(series, op: str, lit):
    try:
        if op == "in":
            return series.isin(lit)
        return {"==": series.__eq__, "!=": series.__ne__, "<": series.__lt__, "<=": series.__le__,
                ">": series.__gt__, ">=": series.__ge__}[op](lit)
    except TypeError:
        raise GraphsimError("where", f"cannot compare column {series.name!r} ({series.dtype}) with {lit!r}") from None


def compile_filter(text: str, columns) -> Callable:
    """A function DataFrame -> boolean mask for ``text`` over ``columns`` (validated now, evaluated later)."""
    require(isinstance(text, str) and text.strip() != "", "where", "give a filter, e.g. \"decode.count == 64\"")
    require(len(text) <= MAX_LENGTH, "where", f"at most {MAX_LENGTH} characters")
    return _Parser(text, columns).parse()


def apply_filter(df, text: str | None, *, allow_empty: bool = False):
    """The rows of ``df`` that ``text`` selects (all of them for None); selecting no row is an error naming
    the filter (a picture of nothing is not an answer), unless ``allow_empty``."""
    if text is None:
        return df
    mask = compile_filter(text, df.columns)(df)
    try:
        mask = mask.fillna(False).astype(bool)
    except (TypeError, ValueError):
        raise GraphsimError("where", f"{text[:80]!r} does not give true/false per row") from None
    out = df[mask]
    require(allow_empty or len(out) > 0, "where", f"{text[:80]!r} selects none of the {len(df):,} rows")
    return out
