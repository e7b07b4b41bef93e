"""Every command's --help, and --version."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
import typer

from tests.cli_helpers import run_cli
from treeattn.cli import _register, app


def _commands() -> list[tuple[str, ...]]:
    _register()
    out: list[tuple[str, ...]] = []

    def walk(cmd, path: tuple[str, ...]) -> None:  # noqa: ANN001 - a click command
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return out


def _params(path: tuple[str, ...]):  # noqa: ANN202 - click parameters
    cmd = typer.main.get_command(app)
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


def test_version_is_the_installed_distribution_version() -> None:
    res = run_cli("--version")
    assert res.exit_code == 0
    assert res.stdout == f"treeattn {importlib.metadata.version('treeattn')}\n"
