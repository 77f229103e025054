"""Subcommands beyond the core ones: every module ``graphsim/cmd_*.py`` exposing ``register(subparsers)``
is discovered and registered, so features add their commands without editing the CLI core.

:func:`register` imports them when the parser is built (``graphsim.cli.build_parser``); to run one command it
imports only the module :data:`COMMAND_MODULES` names for it, the others are never loaded."""
from __future__ import annotations

import importlib
import pkgutil

from . import __path__ as _pkg_path
from .cli import _EXTRA_COMMANDS

#: which module registers each command: running one command imports only its module (a test holds this table
#: to what the modules register; a module missing here is still found, by importing them all)
COMMAND_MODULES = {"collect": "cmd_collect", "disagg": "cmd_disagg", "fit": "cmd_fit", "fpm": "cmd_fpm",
                   "ledger": "cmd_ledger", "measured": "cmd_measured", "layers": "cmd_model", "memory": "cmd_model",
                   "plot": "cmd_plot", "search": "cmd_search", "serve-sim": "cmd_serve", "sweep": "cmd_sweep",
                   "trace": "cmd_trace"}


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(_pkg_path) if m.name.startswith("cmd_"))


def _registering(command: str, modules: list[str]) -> list[str]:
    """The module that registers ``command`` (none known: the parser falls back to every module)."""
    m = COMMAND_MODULES.get(command)
    return [m] if m in modules else []


def register(command: str | None = None) -> None:
    """Add every ``cmd_*`` module's ``register`` to ``graphsim.cli._EXTRA_COMMANDS`` (in module order); given
    ``command``, only those of the modules that register it (all of them when none seems to)."""
    modules = _modules()
    if command is not None:
        modules = _registering(command, modules) or modules
    for name in modules:
        mod = importlib.import_module(f"graphsim.{name}")
        if mod.register not in _EXTRA_COMMANDS:
            _EXTRA_COMMANDS.append(mod.register)
    _EXTRA_COMMANDS.sort(key=lambda fn: fn.__module__)  # a later full build lists them in module order
