"""Subcommands beyond the core ones: every module of this package (``graphsim/cli/<command>.py``) exposing
``register(subparsers)`` is discovered and registered, so features add their commands without editing the CLI core.

:func:`register` imports them when the parser is built (``graphsim.cli.app.build_parser``); to run one command it
imports only the module :data:`COMMAND_MODULES` names for it, the others are never loaded."""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

#: which module registers each command: running one command imports only its module (a test holds this table
#: to what the modules register; a module missing here is still found, by importing them all)
COMMAND_MODULES = {"collect": "collect", "disagg": "disagg", "fit": "fit", "fpm": "fpm", "ledger": "ledger",
                   "measured": "measured", "layers": "model", "memory": "model", "plot": "plot", "search": "search",
                   "serve-sim": "serve", "sweep": "sweep", "trace": "trace"}
#: the package's modules that are the command line's own machinery, not commands
NOT_COMMANDS = frozenset({"app", "commands", "common"})

#: the ``register(subparsers)`` functions found so far (``graphsim.cli.app`` adds their commands to its parser)
EXTRA_COMMANDS: list = []


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name not in NOT_COMMANDS)


def _registering(command: str, modules: list[str]) -> list[str]:
    """The module that registers ``command`` (none known: the parser falls back to every module)."""
    m = COMMAND_MODULES.get(command)
    return [m] if m in modules else []


def register(command: str | None = None) -> None:
    """Add every command module's ``register`` to :data:`EXTRA_COMMANDS` (in module order); given ``command``,
    only those of the modules that register it (all of them when none seems to)."""
    modules = _modules()
    if command is not None:
        modules = _registering(command, modules) or modules
    for name in modules:
        mod = importlib.import_module(f"{__package__}.{name}")
        fn = getattr(mod, "register", None)
        if fn is not None and fn not in EXTRA_COMMANDS:
            EXTRA_COMMANDS.append(fn)
    EXTRA_COMMANDS.sort(key=lambda fn: fn.__module__)  # a later full build lists them in module order
