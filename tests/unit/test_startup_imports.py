"""What a process imports to start. Packages that export their modules' names on first use
(treeattn.lazy): every name resolves to its module's object, none is shadowed by a module of
the same name. A rank process (``treeattn.exec.worker``) and a command that needs neither the
cost model nor the search (``treeattn topo list``, ``treeattn run --help``) start without them."""

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


def _imported(code: str, watched: tuple[str, ...]) -> list[str]:
    """The modules of ``watched`` (or under them) that a fresh interpreter holds after ``code``."""
    probe = (f"{code}\nimport sys\n"
             f"print(' '.join(sorted(m for m in sys.modules\n"
             f"                      if any(m == w or m.startswith(w + '.') for w in {watched!r}))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_a_rank_process_imports_neither_the_topology_schema_nor_the_simulator() -> None:
    # Every rank of `treeattn run` starts by importing the worker; what it imports beyond torch is
    # paid once per rank per run under NCCL, torchrun and SLURM (benchmarks/bench_rank_startup.py).
    assert _imported("import treeattn.exec.worker", ("pydantic", "yaml", "networkx", "pandas", "treeattn.search",
                     "treeattn.topology.schema", "treeattn.topology.families", "treeattn.cost.simulate")) == []


@pytest.mark.parametrize("args", [["topo", "list"], ["run", "--help"], ["--help"]])
def test_a_command_that_needs_no_model_starts_without_it(args: list[str]) -> None:
    # Every command starts by importing every command module (each adds its commands to the app):
    # what those import at the top, every command pays.
    code = ("import contextlib, io\nfrom treeattn.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main({args!r})")
    watched = ("numpy", "torch", "treeattn.search", "treeattn.cost.simulate", "treeattn.cost.compute")
    assert _imported(code, watched) == []
