"""Library collectives between ranks on ``host`` devices (CPU-only runs: gloo), timed as the
schedules gloo runs, by the simulator itself.

NCCL's tuning constants describe GPU kernels; they know nothing of a host's per-message
cost (``cost.overhead_us``: tens of microseconds through gloo and TCP) nor of the shared
links of an emulated cluster. So a collective between host ranks is timed as a plan of the
algorithm gloo would run, built by the plan builders on a ``RawPayload`` of the
collective's size and simulated on the same topology with the same simulator (every
message pays the overhead, flows share links max-min fairly):

* all-reduce: the ring (reduce-scatter + all-gather, 2(p-1) steps), which is what gloo's
  ``allreduce`` runs for torch.distributed: a 4-byte all-reduce on 8 emulated ranks takes
  the time of 14 steps, not of recursive doubling's 3 (results/validate-emu/NOTES.md).
  Buffers of fewer elements than ranks are timed as recursive doubling (``butterfly``).
* all-gather of ``nbytes`` per rank: gloo's ring (p-1 steps, each passing one rank's
  buffer on; gloo's ``allgather`` is a ring).

The reduction inside gloo is a loop over its receive buffer, not a kernel launch: the
plans are simulated with the topology's ``launch_us`` set to 0 (memory time stays), and
without ``wakeup_us`` (the plan that calls the collective already woke up) or ``step_us``
(gloo steps in C++, not through the interpreter); a message end costs ``coll_cpu_us``
where calibration measured it apart.
Results are cached per (topology fingerprint, collective, size).
"""

from __future__ import annotations

import dataclasses

from treeattn.plan.builders import build
from treeattn.plan.ir import Plan, TopologyRef
from treeattn.plan.schedule import Programs
from treeattn.topology.model import DeviceKind, Topology
from treeattn.units import DType
from treeattn.workload import RawPayload

__all__ = ["on_hosts", "allreduce_us", "allgather_us"]

_CACHE: dict[tuple[str, str, int], float] = {}
_CACHE_MAX = 4096
_NO_LAUNCH: dict[str, Topology] = {}


def on_hosts(topo: Topology) -> bool:
    """Whether any rank sits on a ``host`` device (then collectives run on gloo, not NCCL)."""
    return any(topo.rank_device(r).kind is DeviceKind.HOST for r in range(topo.num_ranks))


def _payload(nbytes: int, p: int) -> RawPayload:
    for dtype in (DType.FP32, DType.FP16, DType.FP8):
        if nbytes % dtype.nbytes == 0:
            return RawPayload(nbytes=nbytes, ranks=p, dtype=dtype)
    raise AssertionError("fp8 divides every size")


def _no_launch(topo: Topology) -> Topology:
    key = topo.fingerprint
    hit = _NO_LAUNCH.get(key)
    if hit is None:
        cost = topo.cost
        cpu = cost.cpu_us if cost.coll_cpu_us is None else cost.coll_cpu_us
        hit = dataclasses.replace(topo, cost=dataclasses.replace(cost, launch_us=0.0, wakeup_us=0.0, step_us=0.0,
                                                                 cpu_us=cpu, coll_cpu_us=None))
        if len(_NO_LAUNCH) > 64:
            _NO_LAUNCH.clear()
        _NO_LAUNCH[key] = hit
    return hit


def _cached(topo: Topology, what: str, nbytes: int, compute) -> float:  # noqa: ANN001 - a callable
    key = (topo.fingerprint, what, nbytes)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        hit = _CACHE[key] = compute()
    return hit


def allreduce_us(topo: Topology, nbytes: int) -> float:
    """Time of gloo's all-reduce of ``nbytes`` per rank on ``topo`` (see the module docstring).

    Args:
        topo: the topology (its ranks are the collective's).
        nbytes: bytes of each rank's buffer (> 0).

    Returns:
        Microseconds: gloo's ring (recursive doubling for fewer elements than ranks), as simulated.
    """
    p = topo.num_ranks
    if p < 2:
        return 0.0
    return _cached(topo, "allreduce", nbytes, lambda: _allreduce(topo, nbytes))


def _allreduce(topo: Topology, nbytes: int) -> float:
    from treeattn.cost.simulate import simulate

    sim_topo = _no_launch(topo)
    payload = _payload(nbytes, topo.num_ranks)
    name = "ring" if payload.rows >= topo.num_ranks else "butterfly"
    return simulate(build(name, payload, sim_topo, chunks=1), sim_topo, timeline=False).predicted_us


def allgather_us(topo: Topology, nbytes: int) -> float:
    """Time of gloo's all-gather of ``nbytes`` from every rank on ``topo`` (no local merge).

    Args:
        topo: the topology.
        nbytes: bytes each rank contributes (> 0).

    Returns:
        Microseconds: the ring all-gather, as simulated.
    """
    p = topo.num_ranks
    if p < 2:
        return 0.0
    return _cached(topo, "allgather", nbytes, lambda: _allgather(topo, nbytes))


def _allgather(topo: Topology, nbytes: int) -> float:
    from treeattn.cost.simulate import simulate

    p = topo.num_ranks
    # Chunk j is rank j's buffer; receives copy it in (no reduction inside the all-gather).
    payload = RawPayload(nbytes=nbytes * p, ranks=p, dtype=_payload(nbytes, p).dtype)
    ring = Programs(p)
    for t in range(p - 1):
        for i in range(p):
            ring.transfer(i, (i + 1) % p, t, (i - t) % p, copy=True)
    plan = Plan(algorithm="gloo-ring-allgather", params={}, workload=payload, topology=TopologyRef.of(topo),
                chunks=p, programs=ring.build(), result_ranks=tuple(range(p)))
    return simulate(plan, _no_launch(topo), timeline=False).predicted_us
