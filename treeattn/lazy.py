"""Package attributes imported on first use (PEP 562).

A package's ``__init__`` that imports every module it re-exports makes importing any one of
its modules import all of them: a rank process that only needs ``treeattn.cost.memory`` would
build the topology file schema and the simulator before its first message. Packages on that
path name their exports here instead::

    __getattr__, __dir__ = lazy_exports(__name__, {"bounds": ("Bounds", "lower_bounds")})

A re-exported name must not also be a module of the package: once that module is imported,
Python sets the package's attribute to the module and ``__getattr__`` is never asked
(``tests/unit/test_startup_imports.py`` checks every package that uses this).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a module, relative to
    the package (``"exec.merger"``), to the names it gives the package."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    __getattr__.exports = dict(where)  # type: ignore[attr-defined]  # read by the tests
    return __getattr__, __dir__
