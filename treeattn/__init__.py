"""treeattn: plan, simulate and validate the cross-device merge of tree attention.

The Python API (see the README's "Python API")::

    plan = treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len=131072)
    # or one named algorithm: treeattn.build_plan("dgx-h100", "llama-3.1-8b", "dcp-a2a", ...)
    merge = treeattn.Merger(plan)                       # once, on every rank
    o, lse = treeattn.attention_partial(q, k, v)        # this rank's KV shard
    o, lse = merge(o, lse)                              # every decode step
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_plan", "save_plan", "search_plan", "build_plan", "simulate_plan", "Merger",
           "attention_partial"]

# ``Merger`` and ``attention_partial`` need torch; the CLI and the planner do not, so they
# are imported on first use (PEP 562) rather than with the package.
_LAZY = {"load_plan": "treeattn.api", "save_plan": "treeattn.api", "search_plan": "treeattn.api",
         "build_plan": "treeattn.api", "simulate_plan": "treeattn.api", "Merger": "treeattn.exec.merger",
         "attention_partial": "treeattn.exec.attention"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'treeattn' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
