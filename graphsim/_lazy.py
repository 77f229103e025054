"""A module imported on first use, for heavy optional dependencies a module names at its top but needs only in
a rarely called function (``nx = lazy_module("networkx")``): importing graphsim stays cheap, and the module
reads ``nx.DiGraph`` as before. Unlike importlib's LazyLoader it puts nothing in ``sys.modules`` until used."""
from __future__ import annotations


class _LazyModule:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        import importlib

        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str):
    """The module ``name``, imported when an attribute of it is first read."""
    return _LazyModule(name)
