"""What a library collective costs, the way the simulator charges a COLLECTIVE step.

Each form of ``treeattn.plan.ir.COLLECTIVE_FORMS`` is one or more library calls; each call
costs, on GPUs, one ``overhead_us`` (issuing it: NCCL's constants leave the host's cost of
issuing out, since nccl-tests overlaps it with the previous call) plus NCCL's pick
(``treeattn.cost.nccl``, bus bandwidth capped by the routes; an all-to-all, which NCCL runs
as grouped sends and receives, by the point-to-point model: ``alltoall_us``); on ``host``
ranks, the schedule gloo runs (``treeattn.cost.gloo``; gloo reduce-scatters, and here reduces, with an
all-reduce of the whole buffer). Every call is floored at what the cut bounds allow
(``CutModel.collective_floor_us``), for the bytes every rank must receive at least.
"""

from __future__ import annotations

import shlex

from treeattn.cost import gloo, nccl, nccl_fabric, nccl_tuning
from treeattn.cost.bounds import CutModel
from treeattn.cost.nccl_p2p import WORLD
from treeattn.plan.ir import COLLECTIVE_FORMS, Op, Plan, collective_row_bytes, element_bytes, element_dtype, widened
from treeattn.topology.model import DeviceKind, Topology

__all__ = ["LibraryModel", "alltoall_us", "last_landing_us", "link_rates_note", "uncalibrated_note",
           "host_search_note"]

_A2A: dict[tuple[str, int], float] = {}


def last_landing_us(plan: Plan, topo: Topology, communicator: str = WORLD) -> float:
    """When the last message of ``plan`` lands on ``topo`` under the simulator's point-to-point
    model (NCCL's per-message channels of ``communicator``): an exchange's time without the
    merges a plan applies afterwards."""
    from treeattn.cost.simulate import simulate

    res = simulate(plan, topo, timeline=True, communicator=communicator)
    assert res.timeline is not None
    return max(t.end_us for t in res.timeline if t.kind in ("recv_merge", "recv_copy"))


def alltoall_us(topo: Topology, nbytes: int, communicator: str = WORLD) -> float:
    """Time of an all-to-all of ``nbytes`` per rank on ``topo`` between GPUs: the last landing
    of ``gloo.exchange_plan`` (NCCL's is the same grouped exchange); cached per (topology, size)."""
    if topo.num_ranks < 2:
        return 0.0
    key = (f"{topo.fingerprint}/{communicator}", nbytes)
    hit = _A2A.get(key)
    if hit is None:
        hit = last_landing_us(gloo.exchange_plan(topo, nbytes), topo, communicator)
        if len(_A2A) > 4096:
            _A2A.clear()
        _A2A[key] = hit
    return hit


def link_rates_note(topo: Topology) -> str | None:
    """Which link rates the predictions on ``topo`` read, in two lines of at most 80
    characters, where a calibration measured them on GPU ranks (``cost.link_rates:
    measured``); None elsewhere (datasheet rates, or host ranks, where gloo and treeattn's
    transfers alike read the measured ones)."""
    if topo.on_hosts or topo.cost.link_rates != "measured":
        return None
    if topo.rated is topo:
        return ("link rates: measured, and the topology keeps no hardware ratings (rated_gbps):\n"
                "NCCL's collectives read the measured rates too (docs/nccl-model.md)")
    return ("link rates: point-to-point at the rates calibration measured (else NCCL's);\n"
            "NCCL's collectives at the hardware ratings kept (rated_gbps; docs/nccl-model.md)")


def uncalibrated_note(topo: Topology, spec: str, raw: bool = False) -> str:
    """That ``topo``'s figures are not fitted to the machine (``spec``: how the user names it,
    for the ``treeattn calibrate`` command that fits them; ``raw``: for a raw payload's plans,
    whose kernel is the sum, not attention)."""
    kernel = "sum" if raw else "attention"
    return (f"predictions use {topo.name!r} as shipped, not fitted to this machine (uncalibrated); "
            f"`treeattn calibrate --topology {shlex.quote(spec)} --compute {kernel} --out FILE` fits it, "
            "then give FILE as the topology")


def host_search_note(topo: Topology, spec: str, raw: bool = False) -> str | None:
    """``uncalibrated_note`` where a search ranks schedules for host ranks on figures not fitted
    to this machine (which measures fastest there can differ); None elsewhere (GPU figures are
    the hardware's by design, a calibrated file is this machine's)."""
    return uncalibrated_note(topo, spec, raw) if topo.on_hosts and not topo.calibrated else None


def unknown_gpu_note(topo: Topology) -> str | None:
    """A warning where GPUs of ``topo`` name a model treeattn has no figures for (none of
    ``treeattn.probe.hardware.gpu_spec``'s, which ``treeattn probe --gpu-model`` takes): a typo
    there would go unnoticed, since NCCL's tables are then read by the name's nearest
    architecture (Hopper's for a name it cannot place); None where every GPU model is known."""
    from treeattn.probe.hardware import GPU_SPECS, gpu_spec

    unknown = sorted({d.model for d in topo.devices if d.kind is DeviceKind.GPU and gpu_spec(d.model) is None})
    if not unknown:
        return None
    arch = "/".join(sorted({nccl_tuning.nccl_arch(m) for m in unknown}))
    known = f"{', '.join(GPU_SPECS)}, or a name nvidia-smi prints for one"
    if unknown == [""]:
        return (f"the GPUs of {topo.name} name no model (node.gpus.model, or a device's model: {known}): NCCL's "
                f"figures are read as for {arch} GPUs")
    names = [m for m in unknown if m]
    named = ", ".join(repr(m) for m in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    unnamed = "; some of its GPUs name no model" if "" in unknown else ""
    return (f"GPU model {named} of {topo.name} is not one treeattn knows ({known}){unnamed}: NCCL's figures are "
            f"read as for {arch} GPUs")


class LibraryModel:
    """Collective times on one topology (its summaries built once)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.hosts = topo.on_hosts
        # NCCL's collectives are bounded by the hardware, not by rates a calibration fitted to
        # treeattn's own transfers (Topology.rated); gloo's by what was measured.
        self.cuts = CutModel(topo if self.hosts else topo.rated)
        self.fabric = None if self.hosts else nccl_fabric.fabric(topo)

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
                row = collective_row_bytes(w, coll, what)
                share = (stop - start) * row
            if coll == "alltoall":  # every rank sends each the rows it owns: timed for the largest owner
                share = plan.alltoall_bytes(op.chunk, what)
            # What every rank must receive at least: a reduce-scatter and an all-to-all deliver
            # a p-th of the buffer from every rank.
            floor = self.cuts.collective_floor_us(share // p if coll in ("reducescatter", "alltoall") else share,
                                                  row, everyone=coll != "reduce")
            if self.hosts:
                t, cpu = gloo.collective(self.topo, coll if coll in ("allgather", "alltoall") else "allreduce", share)
                spent.append(cpu)
            elif coll == "alltoall":
                t = self.topo.cost.overhead_us + alltoall_us(self.topo, share)
            else:
                size = share * p if coll == "allgather" else share
                wide = widened(w, coll, what)
                elem = 4 if wide else element_bytes(w, what)
                # The lse's running max, every other part a sum: NVLink SHARP takes no fp32 max.
                op = "none" if coll == "allgather" else "max" if what == "lse" else "sum"
                reduction = ("fp32" if wide else element_dtype(w, what).value, op)
                est = nccl.pick(self.fabric, nccl_tuning.Collective(coll), size, elem_bytes=elem, reduction=reduction)
                t = self.topo.cost.overhead_us + est.time_us
            total += max(t, floor)
        return total, spent
