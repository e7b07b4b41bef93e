"""What a search returns: ranked candidates, the winning plan, the bound and the baselines."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from treeattn.plan.baselines import baselines_for
from treeattn.plan.ir import Plan
from treeattn.search.evaluate import Evaluator, Schedule
from treeattn.topology.model import Topology
from treeattn.workload import Payload, Workload

__all__ = ["Candidate", "SearchResult", "baselines", "RING_ATTENTION_MAX_RANKS"]

RING_ATTENTION_MAX_RANKS = 256
"""Ring attention moves p(p-1) KV blocks: building and simulating it takes about 0.5 s at
128 ranks, 2.5 s at 256 and 50 s at 1,024, so ``search`` leaves it out of the baselines
above this many ranks (``treeattn compare`` simulates it up to
``treeattn.search.compare.COMPARE_RING_MAX_RANKS``)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One ranked schedule with its best chunk count."""

    algorithm: str
    """Family: star, chain, kary, binomial, butterfly, ring, hierarchical, multirail,
    double-binary, direct, or ``improved`` (a tree after local moves)."""
    params: dict[str, Any]
    """Short description of the family's parameters (orders named, not listed)."""
    chunks: int
    """Chunks the builder was given (per segment for ring, per tree for forests)."""
    predicted_us: float
    ratio_to_bound: float | None
    """predicted_us / the lower bound (None where that bound is 0)."""
    builder: str = ""
    """The ``treeattn.plan.build`` algorithm that makes its plan."""
    peak_bytes: int | None = None
    """The most bytes a rank holds at once under its plan (``treeattn.cost.memory``)."""
    build_params: dict[str, Any] = field(default_factory=dict)
    """What rebuilds its plan: ``treeattn.plan.build(builder, payload, topology_ref,
    chunks=chunks, **build_params)`` (an ``improved`` tree's parents, every order listed)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "params": self.params,
            "chunks": self.chunks,
            "predicted_us": self.predicted_us,
            "ratio_to_bound": self.ratio_to_bound,
            "builder": self.builder,
            "build_params": self.build_params,
            "peak_bytes": self.peak_bytes,
        }


@dataclass(frozen=True)
class SearchResult:
    """What ``search`` found."""

    best: Plan
    """The winning plan, ``predicted_us`` filled, ``notes['search']`` holding the statistics."""
    candidates: list[Candidate]
    """The top candidates, fastest first (``candidates[0]`` is ``best``)."""
    lower_bound_us: float
    baselines: dict[str, float | None]
    """Predicted time of each baseline of the result layout (``baselines``; None where not
    simulated). The library calls are timed as the simulator times COLLECTIVE steps: NCCL's
    model on GPUs, gloo's schedules on host ranks (the ``_nccl`` in two keys is historical)."""
    stats: dict[str, Any] = field(default_factory=dict)
    baseline_peak_bytes: dict[str, int | None] = field(default_factory=dict)
    """Per baseline (keys as ``baselines``), the most bytes a rank holds at once."""
    left_out: list[dict[str, Any]] = field(default_factory=list)
    """Schedules and baselines faster than the pick that do not fit in the devices' memory,
    each with ``why``."""
    memory_limit_bytes: int | None = None
    """What the busiest rank may use (its device's memory times the usable fraction); None
    when the devices do not say or memory was not checked."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.candidates[0].to_dict(),
            "lower_bound_us": self.lower_bound_us,
            "baselines": self.baselines,
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "memory_limit_bytes": self.memory_limit_bytes,
            "left_out": self.left_out,
            "candidates": [c.to_dict() for c in self.candidates],
            "stats": self.stats,
        }


def baselines(
    topo: Topology,
    payload: Payload,
    ev: Evaluator | None = None,
    *,
    ring_max_ranks: int | None = RING_ATTENTION_MAX_RANKS,
    result: str = "all",
    root: int | None = None,
) -> dict[str, float | None]:
    """Predicted times of what libraries, papers and serving engines do for ``result``
    (``treeattn.plan.baselines.baselines_for``), as the simulator times them.

    Returns:
        Per baseline its ``Baseline.key`` (``allreduce3_nccl_us``, ``allreduce2_us``,
        ``allgather_merge_us``, ``dcp_ag_rs_us``, ``dcp_a2a_us``, ``ring_attention_us``; raw:
        ``allreduce_nccl_us``, ...) and its time; ring attention runs on the topology's ring
        (``treeattn.search.rings``) and is None above ``ring_max_ranks`` ranks (None lifts it).
    """
    from treeattn.search.rings import ring_order

    ev = ev or Evaluator(topo, payload)
    ring = ring_order(topo)[1] if isinstance(payload, Workload) else None
    out: dict[str, float | None] = {}
    for b in baselines_for(payload, result, root, ring):
        if b.name == "ring-attention" and ring_max_ranks is not None and topo.num_ranks > ring_max_ranks:
            out[b.key] = None
            continue
        out[b.key] = ev.time_us(Schedule(b.name, b.name, b.kwargs), 1)
    return {k: (None if v is None or math.isinf(v) else v) for k, v in out.items()}
