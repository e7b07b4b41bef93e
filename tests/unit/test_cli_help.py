"""Every command's --help, and --version."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.cli import built_command


def _commands() -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []

    def walk(cmd, path: tuple[str, ...]) -> None:  # noqa: ANN001 - a click command
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(built_command(), ())
    return out


def _params(path: tuple[str, ...]):  # noqa: ANN202 - click parameters
    cmd = built_command()
    for name in path:
        cmd = cmd.commands[name]
    return cmd.params


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "treeattn")
def test_help_shows_no_type_for_flags_and_keeps_every_word(path: tuple[str, ...]) -> None:
    res = run_cli(*path, "--help")
    assert res.exit_code == 0, res.stderr
    assert "<bool>" not in res.stdout
    for param in _params(path):
        # The help is rendered as Markdown: an <angle-bracketed> word would vanish from it.
        assert not re.search(r"<[A-Za-z][\w-]*>", param.help or ""), (param.name, param.help)


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "treeattn")
def test_h_is_help(path: tuple[str, ...]) -> None:
    assert run_cli(*path, "-h").stdout == run_cli(*path, "--help").stdout


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "treeattn")
def test_an_option_of_one_value_given_twice_is_refused(path: tuple[str, ...]) -> None:
    # click would keep the last value silently; a repeatable option (--env, --from-nccl-tests)
    # and a flag (--json) may be given again.
    for param in _params(path):
        if param.param_type_name != "option" or getattr(param, "is_flag", False) or param.is_eager:
            continue
        name = max(param.opts, key=len)
        res = run_cli(*path, name, "1", name, "1")
        if param.multiple or getattr(param, "count", False):
            assert "given twice" not in res.stderr, (name, res.stderr)
        else:
            assert res.exit_code == 2 and res.stderr.count("\n") == 1, (name, res.stderr)
            assert f"option {name} given twice; give it once" in res.stderr, res.stderr
    # The long and the short name of one option count as the same option.
    if path == ("plan",):
        res = run_cli("plan", "-t", "cpu-4", "--topology", "cpu-4", "-m", "llama-3.2-1b", "-n", "4K")
        assert res.exit_code == 2 and "option --topology given twice" in res.stderr


def test_version_is_the_installed_distribution_version() -> None:
    res = run_cli("--version")
    assert res.exit_code == 0
    assert res.stdout == f"treeattn {importlib.metadata.version('treeattn')}\n"
    # what follows it would pass unread
    res = run_cli("--version", "plan", "-t", "cpu-4")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == "error: treeattn: --version takes nothing else, got 'plan -t cpu-4' (see --help)\n"


def _groups() -> list[tuple[str, ...]]:
    cmd = built_command()
    out = []
    for path in _commands():
        sub = cmd
        for name in path:
            sub = sub.commands[name]
        if getattr(sub, "commands", None):
            out.append(path)
    return out


@pytest.mark.parametrize("path", _groups(), ids=lambda p: " ".join(p) or "treeattn")
def test_a_group_given_no_command_prints_its_help_and_succeeds(path: tuple[str, ...]) -> None:
    # A user typing the program's name (or a group's) asks for its help: no error after it.
    res = run_cli(*path)
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert res.stdout == run_cli(*path, "--help").stdout


def test_the_program_name_alone_prints_the_help() -> None:
    proc = subprocess.run([str(Path(sys.executable).with_name("treeattn"))], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "Usage: treeattn [OPTIONS] COMMAND" in proc.stdout


@pytest.mark.parametrize("args, needle", [
    # typer's conversions and ranges, in the words treeattn's own checks use (not pydantic's)
    (("plan", "-b", "abc"), "treeattn plan: --batch must be a whole number, got 'abc' (see --help)"),
    (("run", "--warmup", "-1", "p.yaml"), "treeattn run: --warmup must be at least 0, got '-1' (see --help)"),
    (("validate", "--max-load", "-1"), "treeattn validate: --max-load must be at least 0, got '-1' (see --help)"),
    (("plan", "--bogus"), "treeattn plan: No such option: --bogus"),
    (("nccl-model", "-t", "dgx-h100", "-c", "allreduce"), "treeattn nccl-model: Missing option '--bytes'"),
    (("calibrate", "--compute", "atention"), "'atention' is not one of"),
    (("emulate", "foo"), "treeattn emulate: No such command 'foo'"),
    (("topo", "foo"), "treeattn topo: No such command 'foo'"),
    (("no-such-command",), "treeattn: No such command 'no-such-command'"),
])
def test_usage_errors_are_one_line_with_status_2(args: tuple[str, ...], needle: str) -> None:
    # What the option parser refuses reads like every other bad input: one line, exit 2.
    res = run_cli(*args)
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error: "), res.stderr
    assert "Value error" not in lines[0] and "Traceback" not in res.stderr


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_mem_fraction_says_what_it_is_a_share_of_and_what_the_rest_is_for(command: str) -> None:
    # A share of mem_gb whose rest is the model's (README, "Result layouts"): without it a
    # reader cannot tell 0.9 of what, nor why to lower it.
    param = next(p for p in _params((command,)) if "--mem-fraction" in p.opts)
    text = " ".join(param.help.split())
    assert "Share of each device's memory (mem_gb) a rank may use" in text, text
    assert "the rest of the memory is left for what it does not count, the model's weights and activations" in text
