"""Subcommands beyond the core ones: every module ``graphsim/cmd_*.py`` exposing ``register(subparsers)``
is discovered and registered, so features add their commands without editing the CLI core."""
from __future__ import annotations

import importlib
import pkgutil

from . import __path__ as _pkg_path
from .cli import _EXTRA_COMMANDS

for _m in sorted(m.name for m in pkgutil.iter_modules(_pkg_path) if m.name.startswith("cmd_")):
    _mod = importlib.import_module(f"graphsim.{_m}")
    if _mod.register not in _EXTRA_COMMANDS:
        _EXTRA_COMMANDS.append(_mod.register)
