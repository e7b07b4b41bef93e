"""Packages that export their modules' names on first use (treeattn.lazy): every name resolves
to its module's object, none is shadowed by a module of the same name, and a rank process
(``treeattn.exec.worker``) starts without the parts of treeattn it never runs."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

LAZY_PACKAGES = ("treeattn", "treeattn.cost", "treeattn.topology")


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_every_exported_name_is_its_modules_object(name: str) -> None:
    package = importlib.import_module(name)
    exports = package.__getattr__.exports
    assert set(package.__all__) - {"__version__"} <= set(dir(package))
    for attr, module in exports.items():
        assert getattr(package, attr) is getattr(importlib.import_module(f"{name}.{module}"), attr), attr
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        package.nonexistent  # noqa: B018


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_no_exported_name_is_also_a_module(name: str) -> None:
    # Python sets a package's attribute to its submodule on import: the lazy name would be lost.
    package = importlib.import_module(name)
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert not modules & set(package.__getattr__.exports)


def test_a_rank_process_imports_neither_the_topology_schema_nor_the_simulator() -> None:
    # Every rank of `treeattn run` starts by importing the worker; what it imports beyond torch is
    # paid once per rank per run (about a second each on a small CPU).
    code = ("import sys, treeattn.exec.worker\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'yaml', 'networkx', 'pandas') or m in ('treeattn.topology.schema', "
            "'treeattn.topology.families', 'treeattn.cost.simulate', 'treeattn.search'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == []
