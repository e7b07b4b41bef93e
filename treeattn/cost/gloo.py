"""Library collectives between ranks on ``host`` devices (CPU-only runs: gloo), timed as the
schedules gloo runs, by the simulator itself.

NCCL's tuning constants describe GPU kernels; they know nothing of a host's per-message
cost (``cost.overhead_us``: tens of microseconds through gloo and TCP) nor of the shared
links of an emulated cluster. So a collective between host ranks is timed as a plan of the
algorithm gloo would run, built by the plan builders on a ``RawPayload`` of the
collective's size and simulated on the same topology with the same simulator (every
message pays the overhead, flows share links max-min fairly):

* all-reduce: gloo's ring (``gloo/allreduce.cc``): the buffer is cut into
  ``max(2p, ceil(bytes / 1 MiB))`` segments rounded up to a multiple of p (at least two a
  rank), and a reduce-scatter then an all-gather pass one segment to the rank below per
  iteration, with two iterations in flight; segments past the buffer's end (fewer elements
  than segments) are not sent. A 4-byte all-reduce on 8 emulated ranks takes the time of 14
  hops, not of recursive doubling's 3 (results/validate-emu/NOTES.md).
* all-gather of ``nbytes`` per rank: gloo's ring (``gloo/allgather.cc``): 2(p - 1)
  iterations, each passing half of one rank's buffer to the rank above, two in flight.
* all-to-all of ``nbytes`` per rank (``gloo/alltoall.cc``, ``alltoallv.cc``): every send
  and receive posted at once, then all awaited: one step of p - 1 messages a rank
  (``exchange_plan``; NCCL's all-to-all is the same grouped exchange,
  ``treeattn.cost.library.alltoall_us``).

Two iterations in flight are one step here (posted together, both awaited), so a rank
pays a message end per segment, as gloo's ranks do.

The reduction inside gloo is a loop over its receive buffer, not a kernel launch: the
plans are simulated with the topology's ``launch_us`` set to 0 (memory time stays), and
without ``wakeup_us`` or ``start_cpu_us`` (the plan that calls the collective already woke
up) or ``step_us`` (gloo steps in C++, not through the interpreter); a message end costs
``coll_cpu_us`` where calibration measured it apart.
Results are cached per (topology fingerprint, collective, size).
"""

from __future__ import annotations

import dataclasses

from treeattn.plan.ir import Plan, TopologyRef
from treeattn.plan.schedule import Programs
from treeattn.topology.model import Topology
from treeattn.units import DType
from treeattn.workload import RawPayload

__all__ = ["collective", "allreduce_us", "allgather_us", "ring_allreduce_plan", "ring_allgather_plan",
           "exchange_plan"]

_CACHE: dict[tuple[str, str, int], tuple[float, tuple[float, ...]]] = {}
_CACHE_MAX = 4096
_NO_LAUNCH: dict[str, Topology] = {}
_MAX_SEGMENT = 1 << 20
"""gloo's largest all-reduce segment (``AllreduceOptionsImpl::kMaxSegmentSize``)."""


def _payload(nbytes: int, p: int) -> RawPayload:
    for dtype in (DType.FP32, DType.FP16, DType.FP8):
        if nbytes % dtype.nbytes == 0:
            return RawPayload(nbytes=nbytes, ranks=p, dtype=dtype)
    raise AssertionError("fp8 divides every size")


def _no_launch(topo: Topology) -> Topology:
    key = topo.fingerprint
    hit = _NO_LAUNCH.get(key)
    if hit is None:
        host = topo.cost.host
        cpu = host.cpu_us if host.coll_cpu_us is None else host.coll_cpu_us
        cost = dataclasses.replace(topo.cost, launch_us=0.0).with_host(wakeup_us=0.0, step_us=0.0, start_cpu_us=0.0,
                                                                        cpu_us=cpu, coll_cpu_us=None)
        hit = dataclasses.replace(topo, cost=cost)
        if len(_NO_LAUNCH) > 64:
            _NO_LAUNCH.clear()
        _NO_LAUNCH[key] = hit
    return hit


def _cached(topo: Topology, what: str, nbytes: int, compute) -> tuple[float, tuple[float, ...]]:  # noqa: ANN001
    key = (topo.fingerprint, what, nbytes)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        hit = _CACHE[key] = compute()
    return hit


def collective(topo: Topology, coll: str, nbytes: int) -> tuple[float, tuple[float, ...]]:
    """Time of gloo's ``allreduce``, ``allgather`` or ``alltoall`` of ``nbytes`` per rank on ``topo``, and
    the CPU work each rank pays for it (zeros without a host CPU model)."""
    if topo.num_ranks < 2:
        return 0.0, (0.0,) * topo.num_ranks
    plan = {"allgather": ring_allgather_plan, "alltoall": exchange_plan}.get(coll, ring_allreduce_plan)

    def run() -> tuple[float, tuple[float, ...]]:
        from treeattn.cost.simulate import simulate

        sim_topo = _no_launch(topo)
        res = simulate(plan(sim_topo, nbytes), sim_topo, timeline=False)
        return res.predicted_us, res.cpu_us

    return _cached(topo, coll, nbytes, run)


def allreduce_us(topo: Topology, nbytes: int) -> float:
    """Time of gloo's all-reduce of ``nbytes`` per rank on ``topo`` (see the module docstring).

    Args:
        topo: the topology (its ranks are the collective's).
        nbytes: bytes of each rank's buffer (> 0).

    Returns:
        Microseconds: gloo's segmented ring, as simulated (0 for one rank).
    """
    return collective(topo, "allreduce", nbytes)[0]


def _segments(nbytes: int, elem: int, p: int) -> int:
    """How many segments gloo's ring all-reduce cuts ``nbytes`` into (a multiple of p, >= 2p)."""
    per_seg = elem * max(1, _MAX_SEGMENT // elem)
    wanted = max(-(-nbytes // per_seg), 2 * p)
    return -(-wanted // p) * p


def ring_allreduce_plan(topo: Topology, nbytes: int) -> Plan:
    """gloo's ring all-reduce of ``nbytes`` per rank as a plan (one chunk per segment)."""
    p = topo.num_ranks
    payload = _payload(nbytes, p)
    segs = _segments(nbytes, payload.dtype.nbytes, p)
    per = segs // p
    # gloo's segments hold ceil(elements / segments) elements each, so a small buffer fills
    # only the first few; the rest are not sent.
    live = -(-payload.rows // -(-payload.rows // segs))
    progs = Programs(p)
    iterations = segs - per
    for phase, (offset, kind) in enumerate(((1, False), (0, True))):
        base = phase * -(-iterations // 2)
        for i in range(iterations):
            for r in range(p):
                seg = ((r + offset) * per + i) % segs
                if seg < live:
                    progs.transfer(r, (r - 1) % p, base + i // 2, seg, copy=kind)
    return Plan(algorithm="gloo-ring-allreduce", params={}, workload=payload, topology=TopologyRef.of(topo),
                chunks=live, programs=progs.build(), result_ranks=tuple(range(p)))


def allgather_us(topo: Topology, nbytes: int) -> float:
    """Time of gloo's all-gather of ``nbytes`` from every rank on ``topo`` (no local merge).

    Args:
        topo: the topology.
        nbytes: bytes each rank contributes (> 0).

    Returns:
        Microseconds: the ring all-gather, as simulated.
    """
    return collective(topo, "allgather", nbytes)[0]


def ring_allgather_plan(topo: Topology, nbytes: int) -> Plan:
    """gloo's ring all-gather of ``nbytes`` from every rank as a plan (chunk 2j + h is half h
    of rank j's buffer; a one-byte buffer is not halved)."""
    p = topo.num_ranks
    payload = RawPayload(nbytes=nbytes * p, ranks=p, dtype=DType.FP8)  # gloo cuts bytes, not elements
    halves = 2 if nbytes > 1 else 1
    ring = Programs(p)
    for i in range(halves * (p - 1)):
        for r in range(p):
            ring.transfer(r, (r + 1) % p, i // halves, halves * ((r - i // halves) % p) + i % halves, copy=True)
    return Plan(algorithm="gloo-ring-allgather", params={}, workload=payload, topology=TopologyRef.of(topo),
                chunks=halves * p, programs=ring.build(), result_ranks=tuple(range(p)))


def exchange_plan(topo: Topology, nbytes: int) -> Plan:
    """An all-to-all of ``nbytes`` per rank as one step of point-to-point messages: every rank
    sends a p-th of its buffer to every other rank at once, which lands as a copy (gloo's
    ``alltoall`` posts every send and receive before waiting; NCCL's is one group of them).
    Chunk j is rank j's piece (at least 4 bytes); like the all-gather's, the plan only times
    the exchange: what ends where is the caller's (a COLLECTIVE's effect)."""
    p = topo.num_ranks
    piece = max(nbytes // p, 4)
    progs = Programs(p)
    for u in range(p):
        for v in range(p):
            if u != v:
                progs.transfer(u, v, 0, u, copy=True)
    return Plan(algorithm="alltoall", params={}, workload=RawPayload(nbytes=piece * p, ranks=p, dtype=DType.FP8),
                topology=TopologyRef.of(topo), chunks=p, programs=progs.build(), result_ranks=tuple(range(p)))
