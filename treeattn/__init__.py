"""treeattn: plan, simulate and validate the cross-device merge of tree attention.

The Python API (see the README's "Python API")::

    plan = treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len=131072)
    # or one named algorithm: treeattn.build_plan("dgx-h100", "llama-3.1-8b", "dcp-a2a", ...)
    merge = treeattn.Merger(plan)                       # once, on every rank
    o, lse = treeattn.attention_partial(q, k, v)        # this rank's KV shard
    o, lse = merge(o, lse)                              # every decode step
"""

from __future__ import annotations

from treeattn.lazy import lazy_exports

__version__ = "0.1.0"

__all__ = ["__version__", "load_plan", "save_plan", "search_plan", "build_plan", "simulate_plan", "Merger",
           "attention_partial"]

# torch is imported only with the executor's names.
__getattr__, __dir__ = lazy_exports(__name__, {
    "api": ("load_plan", "save_plan", "search_plan", "build_plan", "simulate_plan"),
    "exec.merger": ("Merger",),
    "exec.attention": ("attention_partial",),
})
