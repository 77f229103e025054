"""Subcommands beyond the core ones (registered into graphsim.cli)."""
from __future__ import annotations

from .cli import _EXTRA_COMMANDS  # noqa: F401
