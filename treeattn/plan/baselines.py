"""Which methods a plan is compared with, for its payload and result layout: one list read by
the search (predicted baselines), ``compare``, ``run --baselines`` (measured) and ``validate``.

A baseline is a builder name with the keyword arguments that make its plan
(``treeattn.plan.build``); the executor runs the same method on a code path of its own
(``treeattn.exec.baselines``) with the same arguments (result layout, root, ring order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from treeattn.errors import InputError
from treeattn.workload import Payload, RawPayload

__all__ = ["Baseline", "baselines_for", "parse_result", "RESULT_HELP"]

_KEYS = {"allreduce3": "allreduce3_nccl_us", "allreduce": "allreduce_nccl_us"}

RESULT_HELP = ("result layout: all (every rank gets every row), heads (each rank its own query heads, what a "
               "tensor-parallel o_proj consumes: reduce-scatter) or root[:R] (only rank R, default 0: a reduce)")


@dataclass(frozen=True)
class Baseline:
    """One method to compare with: ``build(name, payload, topology, **kwargs)`` is its plan."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def result(self) -> str:
        """The layout it delivers: its ``result`` argument, else its builder's default."""
        from treeattn.plan.builders import ALGORITHMS

        return self.kwargs.get("result") or ALGORITHMS[self.name].results[0]

    @property
    def key(self) -> str:
        """Its key in predicted-baseline tables (``allgather_merge_us``; the library all-reduces
        keep their historical ``_nccl_us``, though host ranks time them as gloo runs them)."""
        return _KEYS.get(self.name, self.name.replace("-", "_") + "_us")


def parse_result(text: str, ranks: int, on: str | None = None, what: str = "result") -> tuple[str, int | None]:
    """``all`` / ``heads`` / ``root`` / ``root:R`` as (layout, root).

    Args:
        text: what the user wrote. ranks: p, the range of R. on: the topology, named where R
            is out of range (``compare`` reads one layout on several). what: how messages name
            it (``--result`` on the command line).

    Returns:
        (``all`` | ``heads`` | ``root``, R or None).

    Raises:
        InputError: anything else, or R out of range.
    """
    word, colon, arg = str(text).partition(":")
    if word in ("all", "heads") and not colon:
        return word, None
    if word == "root":
        try:
            root = int(arg) if colon else 0  # "root:" names no rank: refused, not read as 0
        except ValueError:
            raise InputError(f"{what} root:R needs an integer rank R, got {text!r}") from None
        if not 0 <= root < ranks:
            raise InputError(f"{what} {text}: rank {root} is out of range: there are {ranks} ranks"
                             + (f" on {on}" if on else ""))
        return "root", root
    raise InputError(f"{what} must be all, heads or root[:R], got {text!r}")


def baselines_for(payload: Payload, result: str = "all", root: int | None = None,
                  ring_order: Sequence[int] | None = None) -> list[Baseline]:
    """The methods that deliver ``result`` for ``payload``, as libraries, papers and serving
    engines run them.

    ``all``: the paper's three all-reduces, the two all-reduces an engineer writes first,
    all-gather + merge (Star Attention), ring attention. ``heads``: all-reduce max then a
    reduce-scatter, vLLM's decode context parallel (all-gather + reduce-scatter and
    all-to-all), ring attention (it delivers every row). ``root``: all-reduce max then a
    reduce, ring attention. Raw payloads: the library's collective for the layout.

    Args:
        payload: the workload or raw payload.
        result: ``all``, ``heads`` or ``root`` (``parse_result``).
        root: the root for ``root``.
        ring_order: ring attention's ring (``treeattn.search.rings.ring_order``); None: rank order.
    """
    lib: dict[str, Any] = {} if result == "all" else {"result": result}
    if result == "root":
        lib["root"] = 0 if root is None else root
    if isinstance(payload, RawPayload):
        return [Baseline("allreduce", lib)] + ([Baseline("allgather-merge")] if result == "all" else [])
    ring = Baseline("ring-attention", {} if ring_order is None else {"order": list(ring_order)})
    if result == "all":
        return [Baseline("allreduce3"), Baseline("allreduce2"), Baseline("allgather-merge"), ring]
    if result == "heads":
        return [Baseline("allreduce2", lib), Baseline("dcp-ag-rs"), Baseline("dcp-a2a"), ring]
    return [Baseline("allreduce2", lib), ring]
