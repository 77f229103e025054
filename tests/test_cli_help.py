"""Every command's --help (issue 16): a description, examples that parse, arguments in named groups and a help
line on every argument. Commands are found by building the full parser, so a command added later is held to
the same conventions (graphsim.cli.app.add_command builds such a parser)."""
import argparse
import shlex

import pytest

from graphsim.cli.app import build_parser


def _subcommands(parser) -> dict:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


COMMANDS = sorted(_subcommands(build_parser()))


def _examples(p) -> list[str]:
    return [line.strip() for line in (p.epilog or "").splitlines() if line.strip().startswith("graphsim ")]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_description_and_examples(cmd):
    p = _subcommands(build_parser())[cmd]
    assert p.formatter_class is argparse.RawDescriptionHelpFormatter, cmd
    assert (p.description or "").strip(), f"{cmd}: no description"
    assert f"graphsim {cmd}" in (p.epilog or ""), f"{cmd}: the epilog has no `graphsim {cmd} ...` example"
    assert len(_examples(p)) >= 2, f"{cmd}: give 2-3 example invocations, got {_examples(p)}"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_argument_has_help_and_groups(cmd):
    p = _subcommands(build_parser())[cmd]
    actions = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
    for a in actions:
        assert (a.help or "").strip() and a.help != argparse.SUPPRESS, f"{cmd}: {a.option_strings or a.dest} has no help"
    if len(actions) > 3:  # argparse's own two groups are "positional arguments" and "options"
        named = [g for g in p._action_groups[2:] if g._group_actions]
        assert named, f"{cmd}: {len(actions)} arguments and no argument group"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_examples_parse(cmd):
    p = _subcommands(build_parser())[cmd]
    for line in _examples(p):
        words = shlex.split(line)
        assert words[:2] == ["graphsim", cmd], line
        a = build_parser().parse_args(words[1:])
        assert a.command == cmd, line
        one = build_parser(cmd).parse_args(words[1:])  # the one-command parser takes it too
        assert vars(one) == vars(a), line


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_prints(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser(cmd).parse_args([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"graphsim {cmd}" in out


def test_model_is_a_flag_everywhere_a_model_is_taken():
    for cmd, p in _subcommands(build_parser()).items():
        takes = {s for a in p._actions for s in a.option_strings}
        if any("model" in (a.dest or "") for a in p._actions):
            assert "--model" in takes, cmd


def test_help_after_a_model_shows_its_familys_flags(capsys):
    """Issue 29 item 5: `--model llama-3.1-70b --help` folds DeepSeek-V4.1's and MTP's policy flags into one line
    naming them; V4.1 keeps its own; without --model every flag is listed."""
    from graphsim.cli import main

    def helptext(*argv):
        with pytest.raises(SystemExit):
            main(["estimate", *argv, "--help"])
        return capsys.readouterr().out

    full, llama, v41 = helptext(), helptext("--model", "llama-3.1-70b"), helptext("--model", "deepseek-v4.1-flash")
    for flag in ("--decoder-replay", "--fusion", "--engram", "--dspark", "--mtp"):
        assert f"  {flag} " in full and f"  {flag} " not in llama, flag
    assert "not shown: flags llama-3.1-70b does not use" in llama and "--fusion" in llama.split("not shown")[1]
    assert "  --fusion " in v41 and "  --dspark " in v41 and "  --mtp " not in v41  # V4.1 drafts with DSpark
    assert len(llama.splitlines()) < len(full.splitlines()) - 25
