"""Ranks on host CPUs: their cores as resources of the simulator (``treeattn.cost.simulate``).

Processes on one machine's CPUs do not behave like GPUs behind a NIC. The ranks of one node
(or of the whole machine, ``HostParams.cpu_scope``) share ``host_cores`` cores, and each
rank runs on at most one: every piece of CPU work below is a flow of that many microseconds
through its rank's core and its pool of cores, shared max-min fairly like bandwidth (or, with
``cpu_queue: fifo``, at most ``host_cores`` pieces at once, each run to its end in the order
it became ready: ranks under a real-time policy).

* A message enters the wire when both sides posted it (no ``overhead_us``); it costs
  ``cpu_us`` of the sender's CPU from then on (the SEND completes when that is done too)
  and ``cpu_us`` of the receiver's after it arrived (both ops complete then), except that
  receive work already running on the rank serves every message that arrives meanwhile
  (one wake-up).
* COMPUTE and a step's merges and copies are CPU work; each step of transfers first costs
  ``step_us`` (posting and collecting it); each end of a message costs ``cpu_us_per_kb``
  per KiB from the moment it starts, work nothing waits for but that loads the cores (on
  any core of the pool: the library's threads); every host rank spends ``start_cpu_us``
  before its first step (all ranks queue at once).

The engine calls the hooks below where a rank's work would otherwise take time on a device
of its own; ranks not on host devices (and every rank when ``host_cores`` is 0) never reach
this module.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from treeattn.topology.model import DeviceKind, Topology

if TYPE_CHECKING:
    from treeattn.cost.simulate import _Engine

__all__ = ["HostModel", "CPU_OP", "CPU_MERGE"]

# Kinds of CPU work (a flow's ``what`` in the engine; 0 is a transfer's bytes): what to go
# on with when it is done (sending: the transfer; receiving: its completion; an op; a
# step's posting; a step's end; a rank's first step; nothing).
CPU_SENT, CPU_RECV, CPU_OP, CPU_MERGE, CPU_STEP, CPU_START, CPU_BYTES = range(1, 8)


class HostModel:
    """The host CPUs of one simulation (``attach`` returns None where no rank uses them)."""

    def __init__(self, engine: _Engine, topo: Topology) -> None:
        self.e = engine
        cost = topo.cost.host
        self.cpu_us, self.step_us = cost.cpu_us, cost.step_us
        self.start_cpu, self.kb_us = cost.start_cpu_us, cost.cpu_us_per_kb
        self.fifo = cost.cpu_queue == "fifo"
        p = engine.p
        self.core = [-1] * p
        """Per rank: the resource index of its core (-1: not a host rank)."""
        self.pool = [-1] * p
        self.pool_busy: dict[int, int] = {}
        self.pool_wait: dict[int, deque] = {}
        self.hold: dict[int, int] = {}
        """Per transfer: the sender's ends still to complete (its CPU work and delivery)."""
        self.batch: dict[int, int] = {}
        """Per rank: the CPU work of receiving messages running now."""
        self.riders: dict[int, list[int]] = {}
        """Per such work: the other transfers it serves."""
        pools: dict[int, int] = {}
        for r in range(p):
            dev = topo.rank_device(r)
            if dev.kind is not DeviceKind.HOST:
                continue
            key = 0 if cost.cpu_scope == "machine" else dev.node
            if key not in pools:
                pools[key] = engine.add_resource(float(cost.host_cores))
                self.pool_busy[pools[key]] = 0
                self.pool_wait[pools[key]] = deque()
            self.pool[r] = pools[key]
            self.core[r] = engine.add_resource(1.0)

    @classmethod
    def attach(cls, engine: _Engine, topo: Topology) -> HostModel | None:
        """The host model of ``topo``'s ranks, or None when ``host_cores`` is 0 (not modelled)."""
        return cls(engine, topo) if topo.cost.host.host_cores > 0 else None

    def active(self, r: int) -> bool:
        """Rank ``r`` runs on a host core."""
        return self.core[r] >= 0

    # -- hooks the engine calls -----------------------------------------------------------------

    def starts(self, r: int) -> bool:
        """Rank ``r`` has start-up work even with no step to run."""
        return self.start_cpu > 0 and self.core[r] >= 0

    def begin(self, r: int, t: float) -> bool:
        """Rank ``r`` wakes: its start-up CPU work (True), or nothing to do (False)."""
        if self.start_cpu > 0 and self.core[r] >= 0:
            self.cpu(CPU_START, r, self.start_cpu, r, t)
            return True
        return False

    def post_step(self, r: int, t: float) -> bool:
        """A step of transfers begins on ``r``: its posting work (True) or none (False)."""
        if self.step_us > 0 and self.core[r] >= 0:
            self.cpu(CPU_STEP, r, self.step_us, r, t)
            return True
        return False

    def matched(self, x: int, sr: int, qr: int, nbytes: int, t: float) -> bool:
        """Transfer ``x`` from ``sr`` to ``qr`` starts: the ends' per-KiB work, and the sender's
        own work (True: the transfer is on the wire; False: the engine sends it)."""
        e = self.e
        if self.kb_us > 0 and nbytes:
            # Both ends' stacks copy the bytes as they go (the library's threads): work
            # nothing waits for.
            us = nbytes / 1024.0 * self.kb_us
            for r in (sr, qr):
                if self.core[r] >= 0:
                    self.cpu(CPU_BYTES, r, us, -1, t)
        if self.core[sr] >= 0 and self.cpu_us > 0:
            # The sender writes the message out at once; the rest of its CPU work for it runs
            # meanwhile, and its SEND completes when both are done.
            self.hold[x] = 2
            self.cpu(CPU_SENT, sr, self.cpu_us, x, t)
            e.send(x, t)
            return True
        return False

    def receives(self, x: int) -> bool:
        """Transfer ``x``'s receiver has CPU work once it lands."""
        e = self.e
        return self.cpu_us > 0 and self.core[e.rank_of[e.x_recv[x]]] >= 0

    def sender_done(self, x: int) -> bool:
        """One of the sender's ends of transfer ``x`` is done; True while the other is not."""
        left = self.hold.get(x)
        if left is None:
            return False
        if left > 1:
            self.hold[x] = left - 1
            return True
        del self.hold[x]
        return False

    def receive(self, r: int, x: int, t: float) -> None:
        """Rank ``r``'s CPU work for receiving transfer ``x``; receive work already running on
        the rank takes it along (one wake-up serves every message that arrived meanwhile).
        Sending costs every message its own work (a system call through the network stack)."""
        y = self.batch.get(r)
        if y is not None:
            self.riders.setdefault(y, []).append(x)
            return
        self.batch[r] = len(self.e.x_send)
        self.cpu(CPU_RECV, r, self.cpu_us, x, t)

    def cpu(self, what: int, r: int, us: float, then: int, t: float) -> None:
        """Start ``us`` of CPU work on host rank ``r`` at ``t``; when done, go on with ``then``
        (a transfer, an op or a rank, by ``what``)."""
        e = self.e
        pool = self.pool[r]
        e.cpu_spent[r] += us
        # The rank's own thread runs its work one piece at a time; the library's threads run
        # a message's background work (CPU_BYTES) on any core of the pool.
        route = (pool,) if what == CPU_BYTES else (self.core[r], pool)
        x = e.new_flow(what, then, -1, route, 0.0, 1.0, us, t)
        if us <= 0.0:
            e.rem[x] = 0.0
            self.done(x, t)
        elif not self.fifo:
            e.bw_start(x, t)
        elif self.pool_busy[pool] < e.cap[pool]:
            self.pool_busy[pool] += 1
            e.bw_start(x, t)
        else:
            self.pool_wait[pool].append(x)

    def drained(self, x: int, route: tuple[int, ...], t: float) -> None:
        """CPU work ``x`` ran to its end at ``t``."""
        if self.fifo:
            # Its core goes to the work that has waited longest.
            pool = route[-1]
            waiting = self.pool_wait[pool]
            if waiting:
                self.e.bw_start(waiting.popleft(), t)
            else:
                self.pool_busy[pool] -= 1
        self.done(x, t)

    def done(self, x: int, t: float) -> None:
        e = self.e
        what, then = e.x_what[x], e.x_send[x]
        if what == CPU_SENT or what == CPU_RECV:
            recv = what == CPU_RECV
            if recv:
                del self.batch[e.rank_of[e.x_recv[then]]]
            for y in (then, *self.riders.pop(x, ())):
                e.sender_side(y, t)
                if recv:
                    e.op_done(e.x_recv[y], t)
        elif what == CPU_OP:
            e.op_done(then, t)
        elif what == CPU_STEP:
            e.post_transfers(then, t)
        elif what == CPU_START:
            e.started(then, t)
        elif what == CPU_MERGE:
            e.step_end(then, t)
