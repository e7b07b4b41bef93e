"""Library collectives between ranks on ``host`` devices (CPU-only runs: gloo), timed as the
schedules gloo runs, by the simulator itself.

NCCL's tuning constants describe GPU kernels; they know nothing of a host's per-message
cost (``cost.overhead_us``: tens of microseconds through gloo and TCP) nor of the shared
links of an emulated cluster. So a collective between host ranks is timed as a plan of the
algorithm gloo would run, built by the plan builders on a ``RawPayload`` of the
collective's size and simulated on the same topology with the same simulator (every
message pays the overhead, flows share links max-min fairly):

* all-reduce: the ring (reduce-scatter + all-gather, 2(p-1) steps: what gloo's
  ``allreduce`` runs for torch.distributed) and recursive doubling (``butterfly``: log2 p
  steps of whole buffers; the latency-optimal member of gloo's halving-doubling family,
  whose rounds of several chunks the Plan IR cannot send as one message). The faster of
  the two counts: never slower than the ring gloo runs.
* all-gather of ``nbytes`` per rank: gloo's ring (p-1 steps, each passing one rank's
  buffer on) and the direct exchange (every rank sends its buffer to every other in one
  step); the faster counts.

The reduction inside gloo is a loop over its receive buffer, not a kernel launch: the
plans are simulated with the topology's ``launch_us`` set to 0 (memory time stays).
Results are cached per (topology fingerprint, collective, size).
"""

from __future__ import annotations

import dataclasses
import math

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
        hit = dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, launch_us=0.0))
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
        Microseconds: the faster of the ring and recursive doubling, as simulated.
    """
    p = topo.num_ranks
    if p < 2:
        return 0.0
    return _cached(topo, "allreduce", nbytes, lambda: _allreduce(topo, nbytes))


def _allreduce(topo: Topology, nbytes: int) -> float:
    from treeattn.cost.simulate import simulate

    sim_topo = _no_launch(topo)
    payload = _payload(nbytes, topo.num_ranks)
    best = math.inf
    for name in ("ring", "butterfly"):
        if name == "ring" and payload.rows < topo.num_ranks:
            continue  # fewer elements than ranks: gloo's ring has empty segments; doubling covers it
        plan = build(name, payload, sim_topo, chunks=1)
        best = min(best, simulate(plan, sim_topo, timeline=False).predicted_us)
    return best


def allgather_us(topo: Topology, nbytes: int) -> float:
    """Time of gloo's all-gather of ``nbytes`` from every rank on ``topo`` (no local merge).

    Args:
        topo: the topology.
        nbytes: bytes each rank contributes (> 0).

    Returns:
        Microseconds: the faster of the ring all-gather and the direct exchange, as simulated.
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
    ring, direct = Programs(p), Programs(p)
    for t in range(p - 1):
        for i in range(p):
            ring.transfer(i, (i + 1) % p, t, (i - t) % p, copy=True)
    for i in range(p):
        for j in range(p):
            if i != j:
                direct.transfer(i, j, 0, i, copy=True)
    ref = TopologyRef.of(topo)
    best = math.inf
    for name, progs in (("gloo-ring-allgather", ring), ("gloo-direct-allgather", direct)):
        plan = Plan(algorithm=name, params={}, workload=payload, topology=ref, chunks=p, programs=progs.build(),
                    result_ranks=tuple(range(p)))
        best = min(best, simulate(plan, topo, timeline=False).predicted_us)
    return best
