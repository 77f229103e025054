"""No process-wide side effects (issue 15): ``import graphsim`` loads none of the heavy dependencies, and the
commands that do not evaluate a plan through the JAX kernel never import JAX. Each case runs in a fresh
interpreter, since the test process itself has long imported everything."""
import subprocess
import sys

import pytest

HEAVY = ("jax", "networkx", "pyarrow", "pandas", "matplotlib", "rich", "graphviz", "scipy")

#: every subcommand (``graphsim <cmd> --help`` only builds its parser)
COMMANDS = ("estimate", "graph", "hw", "models", "collect", "disagg", "fit", "fpm", "ledger", "measured", "layers",
            "memory", "plot", "search", "serve-sim", "sweep", "trace")


def _loaded_after(code: str, modules) -> list:
    """The ``modules`` present in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint('LOADED=' + ','.join(m for m in {tuple(modules)!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("LOADED=")][-1]
    return [m for m in line[len("LOADED="):].split(",") if m]


def _main(args) -> str:
    """Code that runs ``graphsim ARGS`` in-process (output discarded) and insists it succeeded."""
    return ("import contextlib, io\nfrom graphsim.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main({list(args)!r})\n"
            "assert rc == 0, rc")


def test_import_graphsim_is_light():
    assert _loaded_after("import graphsim", HEAVY + ("numpy",)) == []


def test_moved_modules_resolve_as_attributes():
    """``gs.ir``, ``gs.search``, ... (the flat modules before the layer packages) are the modules now in them."""
    import importlib

    import graphsim as gs

    for name, where in gs._MODULES.items():
        assert getattr(gs, name) is importlib.import_module(where, "graphsim"), name


def test_public_names_still_resolve():
    code = ("import graphsim as gs\n"
            "for n in gs.__all__: getattr(gs, n)\n"
            "from graphsim import Plan, ParallelMapping, compile_plan, __version__\n"
            "assert gs.sweep.run and gs.Plan is Plan\n"
            "assert set(gs.__all__) <= set(dir(gs))")
    assert _loaded_after(code, ()) == []


@pytest.mark.parametrize("args", [
    ["hw", "list"],
    ["hw", "list", "--json"],
    ["hw", "show", "gb300"],
    ["hw", "show", "gb300", "--json"],
])
def test_hw_commands_import_nothing_heavy(args):
    # `graphsim hw list` answers in a blink: not even NumPy
    assert _loaded_after(_main(args), HEAVY + ("numpy",)) == []


def test_help_imports_nothing_heavy():
    code = ("import contextlib, io\nfrom graphsim.cli import main\n"
            f"for cmd in [[]] + [[c] for c in {COMMANDS!r}]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n"
            "            main(cmd + ['--help'])\n"
            "        except SystemExit as e:\n"
            "            assert e.code == 0, (cmd, e.code)\n")
    assert _loaded_after(code, HEAVY + ("numpy",)) == []


@pytest.mark.parametrize("args", [
    ["layers", "deepseek-v4.1-flash"],
    ["memory", "deepseek-v4.1-flash", "--context", "4096"],
    ["ledger", "--model", "deepseek-v4.1-flash", "--request", "decode:4096x8", "--request", "prefill:2048"],
    ["models"],
])
def test_model_commands_never_import_jax(args):
    assert _loaded_after(_main(args), HEAVY) == []


CMD_MODULES = tuple(f"graphsim.cli.{m}" for m in ("collect", "disagg", "fit", "fpm", "ledger", "measured", "model",
                                                     "plot", "sweep", "trace"))


@pytest.mark.parametrize("args,loaded", [
    (["hw", "list"], []),
    (["ledger", "--help"], ["graphsim.cli.ledger"]),
    (["memory", "--help"], ["graphsim.cli.model"]),
])
def test_one_command_loads_only_its_module(args, loaded):
    code = _main(args) if "--help" not in args else (
        "import contextlib, io\nfrom graphsim.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try:\n        main({args!r})\n    except SystemExit:\n        pass")
    assert _loaded_after(code, CMD_MODULES) == loaded


def test_every_command_has_help():
    """The one-command parser (built for speed) still knows every command, and the full one lists them."""
    from graphsim.cli import commands  # noqa: F401
    from graphsim.cli.app import build_parser

    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    one = build_parser("hw")
    sub1 = next(a for a in one._actions if a.dest == "command")
    assert list(sub1.choices) == ["hw"]
    assert build_parser("nope") is not None  # an unknown word: the full parser (its error lists the commands)


def test_cli_attention_precisions_match_ir():
    from graphsim.cli import app as cli
    from graphsim.core import ir

    assert cli.ATTENTION_PRECISIONS == ir.ATTENTION_PRECISIONS


def test_the_command_table_names_the_module_that_registers_each_command():
    import argparse
    import importlib

    from graphsim.cli import commands

    found = {}
    for name in commands._modules():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"graphsim.cli.{name}").register(sub)
        found.update({cmd: name for cmd in sub.choices})
    assert found == commands.COMMAND_MODULES
