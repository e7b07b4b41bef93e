"""What a library collective costs, the way the simulator charges a COLLECTIVE step.

Each form of ``treeattn.plan.ir.COLLECTIVE_FORMS`` is one or more library calls; each call
costs, on GPUs, one ``overhead_us`` (issuing it: NCCL's constants leave the host's cost of
issuing out, since nccl-tests overlaps it with the previous call) plus NCCL's pick
(``treeattn.cost.nccl``, bus bandwidth capped by the routes); on ``host`` ranks, the schedule
gloo runs (``treeattn.cost.gloo``; gloo reduce-scatters, and here reduces, with an
all-reduce of the whole buffer). Every call is floored at what the cut bounds allow
(``CutModel.collective_floor_us``), for the bytes every rank must receive at least.
"""

from __future__ import annotations

from treeattn.cost import gloo, nccl
from treeattn.cost.bounds import CutModel
from treeattn.plan.ir import COLLECTIVE_FORMS, Op, Plan, row_bytes
from treeattn.topology.model import Topology

__all__ = ["LibraryModel"]


class LibraryModel:
    """Collective times on one topology (its summaries built once)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.cuts = CutModel(topo)
        self.hosts = gloo.on_hosts(topo)
        self.fabric = None if self.hosts else nccl.fabric(topo)

    def time_us(self, plan: Plan, op: Op, share_bytes: int) -> tuple[float, list[tuple[float, ...]]]:
        """(time of COLLECTIVE ``op`` of ``plan``, per library call the CPU work it costs each
        rank (host ranks; none elsewhere)); ``share_bytes`` is ``message_bytes(plan, op)``."""
        w, p = plan.workload, self.topo.num_ranks
        start, stop = plan.chunk_range(op.chunk)
        total = 0.0
        spent: list[tuple[float, ...]] = []
        for coll, what in COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].calls:
            if what == "q":
                share = row = share_bytes
            else:
                row = row_bytes(w, what)
                share = (stop - start) * row
            # What every rank must receive at least: a reduce-scatter delivers a p-th.
            floor = self.cuts.collective_floor_us(share // p if coll == "reducescatter" else share, row,
                                                  everyone=coll != "reduce")
            if self.hosts:
                t, cpu = gloo.collective(self.topo, "allgather" if coll == "allgather" else "allreduce", share)
                spent.append(cpu)
            else:
                size = share * p if coll == "allgather" else share
                t = self.topo.cost.overhead_us + nccl.pick(self.fabric, nccl.Collective(coll), size).time_us
            total += max(t, floor)
        return total, spent
