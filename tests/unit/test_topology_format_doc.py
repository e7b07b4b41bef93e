"""docs/topology-format.md cannot rot: every YAML block in it loads (or is refused with the
error it says), every command shown prints the lines shown, and every field of the file
format and every family parameter is described in it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.cost.nccl_rates import SHM_GBPS
from treeattn.cost.nccl_tuning import NET_ACHIEVED, Protocol
from treeattn.topology.families import FAMILIES
from treeattn.topology.io import topology_json_schema

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "topology-format.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(DOC.read_text(encoding="utf-8")) if kind == lang]


def yaml_files() -> dict[str, str]:
    """Each YAML block by the file name its first line gives (``# NAME.yaml``)."""
    out = {}
    for body in blocks("yaml"):
        first = body.splitlines()[0]
        assert re.fullmatch(r"# [\w.-]+\.yaml", first), f"a YAML block must start with '# NAME.yaml': {first!r}"
        name = first[2:]
        assert name not in out, f"two YAML blocks named {name}"
        out[name] = body
    return out


def test_the_doc_has_examples_and_the_readme_links_it():
    assert len(yaml_files()) >= 5 and blocks("text")
    assert "](docs/topology-format.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(yaml_files()))
def test_every_yaml_block_loads_or_is_refused_as_it_says(name, tmp_path):
    body = yaml_files()[name]
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    refused = re.search(r"^# refused: (.+)$", body, re.M)
    res = run_cli("topo", "show", str(path), "--json")
    if refused is None:
        assert res.exit_code == 0, res.stderr
        assert res.stderr == ""
    else:
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        assert f"{name}:" in lines[0] and refused.group(1) in lines[0], (refused.group(1), lines[0])


@pytest.mark.parametrize("block", blocks("text"), ids=lambda b: b.splitlines()[0])
def test_every_command_shown_prints_the_lines_shown(block, tmp_path, monkeypatch):
    for name, body in yaml_files().items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    command, *shown = block.splitlines()
    assert command.startswith("$ treeattn "), command
    res = run_cli(*shlex.split(command)[2:])
    assert res.exit_code == 0, res.stderr
    printed = res.stdout.splitlines()
    # The lines shown appear in that order ('...' stands for lines left out); a line shown
    # directly after another follows it directly.
    at, loose = 0, True
    for line in shown:
        if line == "...":
            loose = True
            continue
        if loose:
            assert line in printed[at:], (line, res.stdout)
            at = printed.index(line, at) + 1
        else:
            assert at < len(printed) and printed[at] == line, (line, printed[at:at + 3])
            at += 1
        loose = False


def _fields(node: object) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties":
                out |= set(value)
            out |= _fields(value)
    elif isinstance(node, list):
        for value in node:
            out |= _fields(value)
    return out


def test_every_field_of_the_schema_and_every_family_parameter_is_described():
    text = DOC.read_text(encoding="utf-8")
    missing = sorted(f for f in _fields(topology_json_schema()) if f"`{f}`" not in text)
    assert not missing, f"fields the doc does not describe: {missing}"
    for fam in FAMILIES.values():
        assert f"`{fam.name}`" in text, fam.name
        for p in fam.params:
            assert f"`{p.name}=" in text, (fam.name, p.name)
    # the figures it quotes are the model's
    assert f"| none: {SHM_GBPS:g} at `datasheet` rates;" in text and f"({SHM_GBPS:g} GB/s unless set)" in text
    assert f"network ports at {NET_ACHIEVED[Protocol.SIMPLE]:g} of their speed" in text
