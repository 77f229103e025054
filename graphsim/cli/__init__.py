"""The ``graphsim`` command line: :mod:`~graphsim.cli.app` builds the parser and runs the core commands,
:mod:`~graphsim.cli.commands` finds the other commands, one module each (``search.py``, ``serve.py``, ...)."""
from .app import main

__all__ = ["main"]
