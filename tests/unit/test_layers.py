"""The package layering of docs/design.md section 3: a lower layer never imports a higher one,
and only ``treeattn.exec`` and ``treeattn.calibrate`` import torch.

Every ``import`` in the source counts, those inside functions too (a deferred import is still
a dependency); the check reads the source, it does not import it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "treeattn"

# Bottom up. Each entry is a top-level module or package of treeattn; a module may import its
# own layer and those before it.
LAYERS = (
    "lazy", "stdio", "errors", "units", "textfile", "yamlkeys", "interrupts", "figures", "workload", "topology",
    "probe", "plan", "cost", "search",
    "exec", "calibrate", "emulate", "report", "validate", "api", "cli", "entry", "__init__", "__main__",
)
TORCH = {"exec", "calibrate"}


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "treeattn":
                out.extend((node.lineno, f"treeattn.{a.name}") for a in node.names)
            else:
                out.append((node.lineno, node.module))
    return out


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_is_in_a_layer() -> None:
    assert {_layer(p) for p in _sources()} <= set(LAYERS)


def test_lower_layers_never_import_higher_ones() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for path in _sources():
        mine = _layer(path)
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] != "treeattn" or len(parts) < 2 or parts[1] == "__version__":
                continue
            if rank.get(parts[1], -1) > rank[mine]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {mine} imports {module}")
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_only_exec_and_calibrate_import_torch() -> None:
    bad = [f"{p.relative_to(PACKAGE.parent)}:{line}: {module}" for p in _sources() if _layer(p) not in TORCH
           for line, module in _imports(p) if module.split(".")[0] in ("torch", "triton")]
    assert not bad, "torch imported outside exec/ and calibrate/:\n" + "\n".join(bad)


@pytest.mark.parametrize("modules", [
    ["treeattn.probe", *sorted(f"treeattn.probe.{p.stem}" for p in (PACKAGE / "probe").glob("[!_]*.py"))],
    ["treeattn.calibrate", "treeattn.calibrate.fit_host", "treeattn.calibrate.from_nccl_tests",
     "treeattn.calibrate.pingpong", "treeattn.calibrate.plans"],
], ids=["probe", "calibrate-fits"])
def test_importing_leaves_torch_out(modules: list[str]) -> None:
    """Discovery and the pure fits load without torch (through every module they import)."""
    code = f"import sys; import {', '.join(modules)}; assert 'torch' not in sys.modules, 'torch imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]


_INDEX_READERS = {"cost/nccl_p2p.py"}
"""Modules outside the topology package that still read ``Topology._index`` (the index as a
cache key): known; no other may start."""


def test_only_the_topology_package_reads_a_topologys_private_index() -> None:
    """``Topology._index`` (its ``RouteIndex``) is the topology package's own; other layers
    use the topology's public lookups (``fabric_island``, ``route``, ``device``)."""
    bad = []
    for path in _sources():
        if _layer(path) == "topology" or str(path.relative_to(PACKAGE)) in _INDEX_READERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "_index":
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not bad, bad
