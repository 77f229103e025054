"""One error type for bad input: it names the field and what is allowed."""
from __future__ import annotations


class GraphsimError(ValueError):
    """Invalid input. ``field`` names the offending field; the message says what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def require(cond: bool, field: str, message: str) -> None:
    """Raise :class:`GraphsimError` for ``field`` unless ``cond`` holds."""
    if not cond:
        raise GraphsimError(field, message)


def positive_int(value, field: str, *, allow_zero: bool = False) -> int:
    """Validate an integer count (``allow_zero`` admits 0)."""
    ok = isinstance(value, (int,)) and not isinstance(value, bool)
    if ok:
        ok = value >= 0 if allow_zero else value > 0
    if not ok:
        lo = "a non-negative" if allow_zero else "a positive"
        raise GraphsimError(field, f"must be {lo} integer, got {value!r}")
    return value


def one_of(scope: str, allowed):
    """attrs validator: the value is one of ``allowed``, else a one-line GraphsimError naming
    ``<scope>.<field>`` and what is allowed."""
    allowed = tuple(allowed)

    def check(_inst, attr, value):
        try:
            ok = value in allowed
        except TypeError:
            ok = False
        if not ok:  # (the message is built only when it is needed: this check runs per IR object)
            raise GraphsimError(f"{scope}.{attr.name}", f"must be one of {', '.join(map(str, allowed))}, got {value!r}")

    return check
