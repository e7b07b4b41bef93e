"""The cost-model simulator: times a Plan on a Topology, event by event.

It implements the Plan IR semantics of ``treeattn.plan.ir`` with these costs:

* A rank posts the ops of a step together and starts its next step when all of them are
  done and the step's merges and copies have run (``ComputeModel.step_local_us``).
* A transfer starts when both its SEND and its matching RECV are posted (k-th SEND a->b
  matches the k-th RECV at b from a). It costs the sender's ``topo.cost.overhead_us``,
  then its bytes drain at the flow's share of bandwidth, then its route latency (sum of
  hop ``latency_us``). SEND and RECV both complete when it arrives. A route with no links
  (a rank to itself) or an empty message costs the overhead (and latency) only.
* A rank issues its messages one after another (LogP's gap, equal to the overhead): of the
  transfers a rank starts at one instant, the k-th in its program order begins draining
  k overheads after that instant, and a transfer that starts while its sender is still
  issuing earlier ones waits for them. Receiving costs no issue time.
* Bandwidth: every flow in its draining phase shares each link it crosses max-min
  fairly (progressive filling). Rates are recomputed whenever flows start or finish, in
  one batch per instant, and only for the connected component of flows (linked through
  shared links) that the change touches.
* COMPUTE costs ``ComputeModel.partial_us`` (a rank's later ones ``later=True``); it starts
  when its step is posted and runs beside the step's transfers (the device computes while
  the links carry them: a resource of its own). A COLLECTIVE starts when the last rank
  arrives and ends on every rank at once, after the library's time for each call of its
  form (``treeattn.plan.ir.COLLECTIVE_FORMS``) and size on this topology, each floored at
  what the cut bounds allow (``CutModel.collective_floor_us``): on GPUs, one
  ``overhead_us`` (issuing the call) plus NCCL's pick (``treeattn.cost.nccl``, bus
  bandwidth capped by the routes); on ``host`` ranks, the schedule gloo runs, simulated
  here (``treeattn.cost.gloo``; gloo reduce-scatters and reduces with an all-reduce of the
  whole buffer). A form that gathers and merges adds the local merge.
* Host CPUs (``topo.cost.host_cores`` > 0; ranks on ``host`` devices only). The ranks of
  one node (or of the whole machine, ``cost.cpu_scope``) share ``host_cores`` cores, and
  each rank runs on at most one: every piece of CPU work below is a flow of that many
  microseconds through its rank's core and its pool of cores, shared max-min fairly like
  bandwidth. A message enters the wire when both sides posted it (no ``overhead_us``); it
  costs ``cost.cpu_us`` of the sender's CPU from then on (the SEND completes when that is
  done too) and ``cost.cpu_us`` of the receiver's after it arrived (both ops complete
  then), except that receive work already running on the rank serves every message that
  arrives meanwhile (one wake-up). COMPUTE and a step's merges and copies are CPU work too.
  So ranks that outnumber the cores slow each other down, and a rank handles its messages
  one core's worth at a time. With ``cost.cpu_queue: fifo`` (ranks under a real-time policy,
  which never preempts a running thread for another of its priority) the pool runs at most
  ``host_cores`` pieces of work at once, each to its end, and the others wait their turn in
  the order they became ready, instead of all sharing the cores at once.
  Each transfer step first costs its rank ``cost.step_us`` of CPU (posting and collecting it).
  Each end of a message also costs ``cost.cpu_us_per_kb`` per KiB from the moment it
  starts, work nothing waits for but that takes its share of the cores (on any core of the
  pool: the library's threads do it, not the rank's); and every host
  rank spends ``cost.start_cpu_us`` of CPU before its first step (all ranks queue at once).
* Every rank runs its first step ``cost.wakeup_us`` after time 0 (a blocked process wakes).
* A link's ``flow_gbps`` caps each flow on it below the link's shared ``bw_gbps``. Between
  GPUs a link carries what NCCL's transfers reach on it, not its datasheet rate
  (``treeattn.cost.nccl.p2p_link_gbps``: NCCL's own rating of NVLink, xGMI and PCIe links,
  0.94 of a network port).
* A plan whose ranks wait forever raises ``PlanInvalidError`` naming what they wait on.

The critical path follows, back from the last rank to finish, for each op the op that
released it: the last op of its rank's previous step, or the partner that posted a
transfer (or arrived at a collective) last. Contention is not an edge of it.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque
from dataclasses import dataclass

from treeattn.cost.bounds import CutModel
from treeattn.cost.compute import ComputeModel
from treeattn.errors import InputError, PlanInvalidError
from treeattn.plan.ir import COLLECTIVE_FORMS, OpKind, Plan, message_bytes, row_bytes
from treeattn.topology.model import DeviceKind, Topology

__all__ = ["OpTiming", "SimResult", "simulate"]

_COMPUTE, _SEND, _RECV_MERGE, _RECV_COPY, _COLL = 0, 1, 2, 3, 4
_KIND_CODE = {
    OpKind.COMPUTE: _COMPUTE,
    OpKind.SEND: _SEND,
    OpKind.RECV_MERGE: _RECV_MERGE,
    OpKind.RECV_COPY: _RECV_COPY,
    OpKind.COLLECTIVE: _COLL,
}
# Event kinds, in heap tuples (time, seq, kind, a, b).
(_EV_BW_START, _EV_DRAIN, _EV_XFER_DONE, _EV_OP_DONE, _EV_STEP_END, _EV_COLL_DONE, _EV_POST,
 _EV_ARRIVE) = range(8)
# What a flow is: a transfer's bytes, or CPU work that, when done, goes on with a transfer
# (sending: its bytes; receiving: its completion), an op (COMPUTE) or a step's end (merges).
_FLOW_BYTES, _CPU_SENT, _CPU_RECV, _CPU_OP, _CPU_MERGE, _CPU_STEP, _CPU_START, _CPU_BYTES = range(8)


@dataclass(frozen=True, slots=True)
class OpTiming:
    """When one op ran."""

    rank: int
    op: int
    """Index in the rank's program."""
    kind: str
    peer: int | None
    chunk: int | None
    start_us: float
    """Transfers: when both sides had posted; collectives: when the last rank arrived."""
    end_us: float
    bytes: int

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "op": self.op,
            "kind": self.kind,
            "peer": self.peer,
            "chunk": self.chunk,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "bytes": self.bytes,
        }


@dataclass(frozen=True, slots=True)
class SimResult:
    """What the simulator predicts for one plan on one topology."""

    predicted_us: float
    """When the last rank finishes."""
    per_rank_finish_us: tuple[float, ...]
    critical_path: tuple[tuple[int, int], ...]
    """(rank, op index) pairs, earliest first, ending at the last op of the last rank to finish."""
    timeline: tuple[OpTiming, ...] | None
    """Every op's timing (rank-major order) when asked for, else None."""
    events: int
    """Events processed (a size measure for benchmarks)."""
    transfers: int
    cpu_us: tuple[float, ...] = ()
    """Per rank, the CPU work the host model charged it (messages, steps, computes, merges,
    and its share of host collectives); zeros where ranks are not on host CPUs."""

    def to_dict(self, *, timeline: bool = False) -> dict:
        out = {
            "predicted_us": self.predicted_us,
            "per_rank_finish_us": list(self.per_rank_finish_us),
            "critical_path": [list(x) for x in self.critical_path],
            "events": self.events,
            "transfers": self.transfers,
        }
        if timeline and self.timeline is not None:
            out["timeline"] = [t.to_dict() for t in self.timeline]
        return out


def simulate(plan: Plan, topo: Topology, *, timeline: bool = True) -> SimResult:
    """Predict how long ``plan`` takes on ``topo`` (see the module docstring for the model).

    Args:
        plan: the plan; its rank count must equal the topology's.
        topo: the topology to time it on.
        timeline: also return every op's start and end (costs memory on huge plans).

    Returns:
        The SimResult.

    Raises:
        InputError: the plan and topology have different rank counts.
        PlanInvalidError: ops out of order, unmatched transfers, disagreeing collectives,
            or a deadlock.

    Examples:
        >>> from treeattn.plan.builders import build  # doctest: +SKIP
        >>> from treeattn.topology.library import resolve  # doctest: +SKIP
        >>> topo = resolve("dgx-h100:nodes=2")  # doctest: +SKIP
        >>> simulate(build("binomial", w, topo, chunks=4), topo).predicted_us  # doctest: +SKIP
    """
    if plan.ranks != topo.num_ranks:
        raise InputError(
            f"plan has {plan.ranks} ranks but topology {topo.name!r} places {topo.num_ranks}; "
            "use a topology with as many ranks as the plan (or --ranks to pick them)"
        )
    # The engine allocates hundreds of thousands of small acyclic objects; the cyclic
    # collector would rescan the growing heap again and again (superlinear time).
    was = gc.isenabled()
    gc.disable()
    try:
        return _Engine(plan, topo).run(timeline)
    finally:
        if was:
            gc.enable()


class _Engine:
    """One simulation's state. Ops are numbered globally (gid), rank by rank."""

    def __init__(self, plan: Plan, topo: Topology) -> None:
        self.plan, self.topo = plan, topo
        p = self.p = topo.num_ranks
        self.cm = ComputeModel.of(plan.workload, topo)
        self.overhead = topo.cost.overhead_us
        from treeattn.cost.nccl import p2p_link_gbps

        rated = p2p_link_gbps(topo)
        gbps = [ln.bw_gbps for ln in topo.links] if rated is None else rated
        self.cap = [bw * 1e3 for bw in gbps]  # bytes per microsecond
        self.flow_cap = [min(ln.flow_cap_gbps, bw) * 1e3 for ln, bw in zip(topo.links, gbps, strict=True)]
        self.wakeup = topo.cost.wakeup_us
        self.lat = [ln.latency_us for ln in topo.links]
        kind: list[int] = []
        peer: list[int] = []
        nbytes: list[int] = []
        rank_of: list[int] = []
        flat: list = []
        steps: list[list[tuple[int, int]]] = []
        merge_b: list[list[int]] = []
        # Kernels of each step's merges and copies: a chunk merged into (its partials are
        # merged at once) counts one, copies one between them.
        merge_k: list[list[int]] = []
        step_compute: list[list[int]] = []
        """Per rank and step: the gid of the step's COMPUTE, or -1."""
        self.offset: list[int] = []
        size_cache: dict[tuple, int] = {}
        codes = _KIND_CODE
        for r, prog in enumerate(plan.programs):
            base = len(kind)
            self.offset.append(base)
            rsteps: list[tuple[int, int]] = []
            rmerge: list[int] = []
            rkern: list[int] = []
            rcomp: list[int] = []
            targets: set = set()
            prev = None
            lo = base
            for i, op in enumerate(prog):
                gid = base + i
                code = codes[op.kind]
                st = op.step
                if st != prev:
                    if prev is not None:
                        if st < prev:
                            raise PlanInvalidError(
                                f"rank {r} op {i}: step {st} follows step {prev}; steps must not decrease")
                        rsteps.append((lo, gid))
                    lo = gid
                    rmerge.append(0)
                    rkern.append(len(targets))
                    rcomp.append(-1)
                    targets = set()
                    prev = st
                elif code == _COLL or kind[lo] == _COLL:
                    raise PlanInvalidError(f"rank {r} step {st}: a collective op must be a step of its own")
                if code == _COMPUTE:
                    if rcomp[-1] >= 0:
                        raise PlanInvalidError(f"rank {r} step {st}: a step holds at most one compute")
                    rcomp[-1] = gid
                    blk = r if op.block is None else op.block
                    if not 0 <= blk < p:
                        raise PlanInvalidError(f"rank {r} op {i}: KV block {blk} out of range 0-{p - 1}")
                    b = self.cm.partial_bytes(blk)
                    q = -1
                else:
                    q = op.peer if op.peer is not None else -1
                    if code != _COLL and not 0 <= q < p:
                        raise PlanInvalidError(f"rank {r} op {i}: peer {op.peer} out of range 0-{p - 1}")
                    key = (code == _COLL, op.chunk, op.block, op.part)
                    b = size_cache.get(key)
                    if b is None:
                        b = size_cache[key] = message_bytes(plan, op)
                    if code == _RECV_MERGE:
                        rmerge[-1] += 3 * b
                        targets.add(op.chunk)
                    elif code == _RECV_COPY and op.block is None:
                        rmerge[-1] += 2 * b
                        targets.add("copy")
                kind.append(code)
                peer.append(q)
                nbytes.append(b)
                rank_of.append(r)
                flat.append(op)
            if prev is not None:
                rsteps.append((lo, base + len(prog)))
            rkern.append(len(targets))
            steps.append(rsteps)
            merge_b.append(rmerge)
            merge_k.append(rkern[1:])
            step_compute.append(rcomp)
        self.kind, self.peer, self.nbytes, self.rank_of, self.ops = kind, peer, nbytes, rank_of, flat
        self.steps, self.merge_b, self.merge_k, self.step_compute = steps, merge_b, merge_k, step_compute
        n = len(kind)
        self.partner = self._pair()
        self.routes = self._plan_routes()
        self.start = [0.0] * n
        self.end = [-1.0] * n
        self.post = [-1.0] * n
        self.pred = [-1] * n
        self.cur = [0] * p
        self.computed = [False] * p
        """Per rank: a COMPUTE already ran (the next pays ``cost.attn_next_launch_us``)."""
        self.pending = [0] * p
        self.last_end = [-1.0] * p
        self.last_gid = [-1] * p
        self.finish = [0.0] * p
        self.heap: list = []
        self.fifo: deque = deque()
        self.issue: list[int] = []
        """Transfers started at the current instant, waiting for their sender's issue slot."""
        self.free = [0.0] * p
        """Per rank: when its issuing of messages is done (the LogP gap)."""
        self.seq = 0
        # Transfers and their flows (one flow per transfer, indexed alike).
        self.x_send: list[int] = []
        self.x_recv: list[int] = []
        self.x_route: list[tuple[int, ...]] = []
        self.x_lat: list[float] = []
        self.x_min: list[float] = []
        """Per transfer: the narrowest capacity on its route (its rate when alone)."""
        self.rem: list[float] = []
        self.rate: list[float] = []
        self.last: list[float] = []
        self.ver: list[int] = []
        self.link_flows: list[set | None] = [None] * len(topo.links)
        self.dirty: set[int] = set()
        self.x_what: list[int] = []
        """Per flow: _FLOW_BYTES or the kind of CPU work (then ``x_send`` holds what it goes on with)."""
        self.n_transfers = 0
        self.cpu_spent = [0.0] * p
        self.hold: dict[int, int] = {}
        self.batch: dict[int, int] = {}
        """Per rank: the CPU work of receiving messages running now."""
        self.riders: dict[int, list[int]] = {}
        """Per such work: the other transfers it serves."""
        self._host_cpus(topo)
        # Collectives: per instance k, the arrivals (time, rank, gid).
        self.coll_count = [0] * p
        self.coll_arrivals: list[list[tuple[float, int, int]]] = []
        self._fabric = None
        self._hosts = False
        self._cuts: CutModel | None = None

    def _host_cpus(self, topo: Topology) -> None:
        """Cores as resources after the links: one per host rank (capacity 1: a microsecond
        of work per microsecond) and one pool per node or machine (``host_cores``)."""
        p = self.p
        self.core = [-1] * p
        self.cpu_pool = [-1] * p
        self.cpu_us = self.step_us = self.start_cpu = self.kb_us = 0.0
        self.cpu_fifo = False
        self.pool_busy: dict[int, int] = {}
        self.pool_wait: dict[int, deque] = {}
        cost = topo.cost
        if cost.host_cores <= 0:
            return
        self.cpu_us, self.step_us = cost.cpu_us, cost.step_us
        self.start_cpu, self.kb_us = cost.start_cpu_us, cost.cpu_us_per_kb
        self.cpu_fifo = cost.cpu_queue == "fifo"
        pools: dict[int, int] = {}
        for r in range(p):
            dev = topo.rank_device(r)
            if dev.kind is not DeviceKind.HOST:
                continue
            key = 0 if cost.cpu_scope == "machine" else dev.node
            if key not in pools:
                pools[key] = len(self.cap)
                self.cap.append(float(cost.host_cores))
                self.pool_busy[pools[key]] = 0
                self.pool_wait[pools[key]] = deque()
            self.cpu_pool[r] = pools[key]
            self.core[r] = len(self.cap)
            self.cap.append(1.0)
        self.link_flows.extend([None] * (len(self.cap) - len(self.link_flows)))

    def _pair(self) -> list[int]:
        """The k-th SEND a->b matches the k-th RECV at b from a: pair them once, up front."""
        kind, peer, rank_of, ops = self.kind, self.peer, self.rank_of, self.ops
        p = self.p
        sends: dict[int, list[int]] = {}
        recvs: dict[int, list[int]] = {}
        for gid, code in enumerate(kind):
            if code == _SEND:
                sends.setdefault(rank_of[gid] * p + peer[gid], []).append(gid)
            elif code == _RECV_MERGE or code == _RECV_COPY:
                recvs.setdefault(peer[gid] * p + rank_of[gid], []).append(gid)
        partner = [-1] * len(kind)
        off = self.offset
        for key, ss in sends.items():
            rs = recvs.get(key, ())
            for s, q in zip(ss, rs, strict=False):
                so, qo = ops[s], ops[q]
                if so.chunk != qo.chunk or so.block != qo.block:
                    sr, qr = rank_of[s], rank_of[q]
                    raise PlanInvalidError(
                        f"rank {sr} op {s - off[sr]} sends chunk {so.chunk} block {so.block} to rank {qr}, "
                        f"whose matching op {q - off[qr]} receives chunk {qo.chunk} block {qo.block} "
                        "(the k-th send a->b matches the k-th receive at b from a)"
                    )
                partner[s], partner[q] = q, s
        return partner

    def _plan_routes(self) -> dict[int, tuple[tuple[int, ...], float, float]]:
        """Per rank pair the plan sends over (key ``src * p + dst``): the route cut down for
        sharing, its latency, and its narrowest capacity.

        Links crossed by exactly the same set of this plan's routes always carry the same
        flows, so for fair sharing one of them stands for all: the narrowest. Routes keep
        one link per such class (latency still sums every hop), which makes the flow
        bookkeeping about half as long on fabrics where a GPU's PCIe, NIC and leaf links
        line up.
        """
        p, rank_of, partner, cap, lat = self.p, self.rank_of, self.partner, self.cap, self.lat
        flow_cap = self.flow_cap
        keys = sorted({rank_of[g] * p + rank_of[partner[g]]
                       for g, k in enumerate(self.kind) if k == _SEND and partner[g] >= 0})
        full: list[tuple[int, ...]] = []
        users: dict[int, list[int]] = {}
        for idx, key in enumerate(keys):
            route = self.topo.route(key // p, key % p)
            full.append(route)
            for i in route:
                users.setdefault(i, []).append(idx)
        best: dict[tuple[int, ...], int] = {}
        for i, us in users.items():
            sig = tuple(us)
            j = best.get(sig)
            if j is None or cap[i] < cap[j]:
                best[sig] = i
        keep = set(best.values())
        out = {}
        for key, route in zip(keys, full, strict=True):
            out[key] = (tuple(i for i in route if i in keep), sum(lat[i] for i in route),
                        min((flow_cap[i] for i in route), default=0.0))
        return out

    # -- event plumbing ----------------------------------------------------------------------

    def _push(self, t: float, ev: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, ev, a, b))

    def run(self, want_timeline: bool) -> SimResult:
        for r in range(self.p):
            if self.steps[r] or (self.start_cpu > 0 and self.core[r] >= 0):
                if self.wakeup > 0:
                    self._push(self.wakeup, _EV_POST, r)
                else:
                    self._begin(r, 0.0)
        heap, fifo = self.heap, self.fifo
        events = 0
        pop, popleft = heapq.heappop, fifo.popleft
        ver, x_recv = self.ver, self.x_recv
        op_done, drained, bw_start = self._op_done, self._drained, self._bw_start
        t = 0.0
        while True:
            if (self.dirty or self.issue) and (not heap or heap[0][0] > t) and (not fifo or fifo[0][0] > t):
                # The instant is complete: issue its transfers, then share bandwidth anew.
                if self.issue:
                    self._issue(t)
                if self.dirty:
                    self._reshare(t)
            if fifo and (not heap or fifo[0] < heap[0]):
                t, _, ev, a, b = popleft()
            elif heap:
                t, _, ev, a, b = pop(heap)
            else:
                break
            events += 1
            if ev == _EV_XFER_DONE:
                self._send_side(a, t)
                op_done(x_recv[a], t)
            elif ev == _EV_DRAIN:
                if ver[a] == b:
                    drained(a, t)
            elif ev == _EV_BW_START:
                bw_start(a, t)
            elif ev == _EV_STEP_END:
                self._step_end(a, t)
            elif ev == _EV_OP_DONE:
                op_done(a, t)
            elif ev == _EV_COLL_DONE:
                self._coll_done(a, t)
            elif ev == _EV_POST:
                self._begin(a, t)
            else:
                self._receive_cpu(self.rank_of[x_recv[a]], a, t)
        self._check_finished()
        return self._result(want_timeline, events)

    # -- steps ---------------------------------------------------------------------------------

    def _begin(self, r: int, t: float) -> None:
        """Rank ``r`` is awake: its start-up CPU work, then its first step."""
        if self.start_cpu > 0 and self.core[r] >= 0:
            self._cpu(_CPU_START, r, self.start_cpu, r, t)
        else:
            self._started(r, t)

    def _started(self, r: int, t: float) -> None:
        if self.steps[r]:
            self._post_step(r, t)
        else:
            self.finish[r] = t

    def _post_step(self, r: int, t: float) -> None:
        lo, hi = self.steps[r][self.cur[r]]
        self.pending[r] = hi - lo
        spred = self.last_gid[r]
        self.last_end[r] = -1.0
        post, pred = self.post, self.pred
        if self.kind[lo] == _COLL:
            post[lo], pred[lo] = t, spred
            self._arrive(r, lo, t)
            return
        cg = self.step_compute[r][self.cur[r]]
        if cg >= 0:
            self.start[cg], post[cg], pred[cg] = t, t, spred
            us = self.cm.partial_us(r, self.ops[cg].block, later=self.computed[r])
            self.computed[r] = True
            if self.core[r] >= 0:
                self._cpu(_CPU_OP, r, us, cg, t)
            else:
                self._push(t + us, _EV_OP_DONE, cg)
            if hi - lo == 1:
                return
        if self.step_us > 0 and self.core[r] >= 0:
            self._cpu(_CPU_STEP, r, self.step_us, r, t)
        else:
            self._post_transfers(r, t)

    def _post_transfers(self, r: int, t: float) -> None:
        lo, hi = self.steps[r][self.cur[r]]
        spred, kind = self.last_gid[r], self.kind
        post, pred = self.post, self.pred
        partner = self.partner
        for gid in range(lo, hi):
            if kind[gid] == _COMPUTE:
                continue
            post[gid] = t
            pred[gid] = spred
            q = partner[gid]
            if q >= 0 and post[q] >= 0.0:
                # The partner posted first (or at the same instant): the transfer starts now.
                if post[q] < t:
                    pred[q] = gid
                if kind[gid] == _SEND:
                    self._match(gid, q, t)
                else:
                    self._match(q, gid, t)

    def _op_done(self, gid: int, t: float) -> None:
        self.end[gid] = t
        r = self.rank_of[gid]
        if t > self.last_end[r]:
            self.last_end[r] = t
            self.last_gid[r] = gid
        left = self.pending[r] - 1
        self.pending[r] = left
        if left == 0:
            c = self.cur[r]
            mb = self.merge_b[r][c]
            if mb:
                us = self.cm.step_local_us(r, mb, self.merge_k[r][c])
                if self.core[r] >= 0:
                    self._cpu(_CPU_MERGE, r, us, r, t)
                else:
                    self._push(t + us, _EV_STEP_END, r)
            else:
                self._step_end(r, t)

    def _step_end(self, r: int, t: float) -> None:
        c = self.cur[r] + 1
        self.cur[r] = c
        if c < len(self.steps[r]):
            self._post_step(r, t)
        else:
            self.finish[r] = t

    # -- transfers -----------------------------------------------------------------------------

    def _match(self, s: int, q: int, t: float) -> None:
        self.start[s] = self.start[q] = t
        sr, qr = self.rank_of[s], self.rank_of[q]
        hit = self.routes[sr * self.p + qr]
        nbytes = self.nbytes[s]
        x = self._flow(_FLOW_BYTES, s, q, hit[0], hit[1], hit[2], float(nbytes), t)
        self.n_transfers += 1
        if self.kb_us > 0 and nbytes:
            # Both ends' stacks copy the bytes as they go (the library's threads): work
            # nothing waits for.
            us = nbytes / 1024.0 * self.kb_us
            for r in (sr, qr):
                if self.core[r] >= 0:
                    self._cpu(_CPU_BYTES, r, us, -1, t)
        if self.core[sr] >= 0 and self.cpu_us > 0:
            # The sender writes the message out at once; the rest of its CPU work for it runs
            # meanwhile, and its SEND completes when both are done.
            self.hold[x] = 2
            self._cpu(_CPU_SENT, sr, self.cpu_us, x, t)
            self._send(x, t)
        elif self.overhead > 0 and self.core[sr] < 0:
            # The sender's issue slot is given once every transfer starting now is known.
            self.issue.append(x)
        else:
            self._send(x, t)

    def _flow(self, what: int, a: int, b: int, route: tuple[int, ...], lat: float, cap: float, amount: float,
              t: float) -> int:
        """A new flow (not yet draining): a transfer's bytes from op ``a`` to op ``b``, or CPU
        work that goes on with ``a``. Returns its index."""
        x = len(self.x_send)
        self.x_send.append(a)
        self.x_recv.append(b)
        self.x_route.append(route)
        self.x_lat.append(lat)
        self.x_min.append(cap)
        self.rem.append(amount)
        self.rate.append(0.0)
        self.last.append(t)
        self.ver.append(0)
        self.x_what.append(what)
        return x

    def _send(self, x: int, t: float) -> None:
        """Transfer ``x`` enters the wire at ``t``."""
        if not self.x_route[x] or self.rem[x] == 0.0:
            self._land(x, t + self.x_lat[x])
        else:
            self._bw_start(x, t)

    def _land(self, x: int, t: float) -> None:
        """Transfer ``x``'s last byte reaches the receiver at ``t``; it completes then, or
        after the receiver's CPU work for it."""
        if self.cpu_us > 0 and self.core[self.rank_of[self.x_recv[x]]] >= 0:
            self._push(t, _EV_ARRIVE, x)
        else:
            self._push(t, _EV_XFER_DONE, x)

    def _cpu(self, what: int, r: int, us: float, then: int, t: float) -> None:
        """Start ``us`` of CPU work on host rank ``r`` at ``t``; when done, go on with ``then``
        (a transfer, an op or a rank, by ``what``)."""
        pool = self.cpu_pool[r]
        self.cpu_spent[r] += us
        # The rank's own thread runs its work one piece at a time; the library's threads run
        # a message's background work (_CPU_BYTES) on any core of the pool.
        route = (pool,) if what == _CPU_BYTES else (self.core[r], pool)
        x = self._flow(what, then, -1, route, 0.0, 1.0, us, t)
        if us <= 0.0:
            self.rem[x] = 0.0
            self._cpu_done(x, t)
        elif not self.cpu_fifo:
            self._bw_start(x, t)
        elif self.pool_busy[pool] < self.cap[pool]:
            self.pool_busy[pool] += 1
            self._bw_start(x, t)
        else:
            self.pool_wait[pool].append(x)

    def _send_side(self, x: int, t: float) -> None:
        """Transfer ``x`` is done on the sender's side (delivered, or its CPU work done): its
        SEND completes with the last of the two when both are counted."""
        left = self.hold.get(x)
        if left is not None:
            if left > 1:
                self.hold[x] = left - 1
                return
            del self.hold[x]
        self._op_done(self.x_send[x], t)

    def _receive_cpu(self, r: int, x: int, t: float) -> None:
        """Rank ``r``'s CPU work for receiving transfer ``x``; receive work already running on
        the rank takes it along (one wake-up serves every message that arrived meanwhile).
        Sending costs every message its own work (a system call through the network stack)."""
        y = self.batch.get(r)
        if y is not None:
            self.riders.setdefault(y, []).append(x)
            return
        self.batch[r] = len(self.x_send)
        self._cpu(_CPU_RECV, r, self.cpu_us, x, t)

    def _cpu_done(self, x: int, t: float) -> None:
        what, then = self.x_what[x], self.x_send[x]
        if what == _CPU_SENT or what == _CPU_RECV:
            recv = what == _CPU_RECV
            if recv:
                del self.batch[self.rank_of[self.x_recv[then]]]
            for y in (then, *self.riders.pop(x, ())):
                self._send_side(y, t)
                if recv:
                    self._op_done(self.x_recv[y], t)
        elif what == _CPU_OP:
            self._op_done(then, t)
        elif what == _CPU_STEP:
            self._post_transfers(then, t)
        elif what == _CPU_START:
            self._started(then, t)
        elif what == _CPU_MERGE:
            self._step_end(then, t)

    def _issue(self, t: float) -> None:
        """Give the transfers that started at ``t`` their senders' issue slots.

        A rank issues its messages one at a time (one thread or stream): the k-th it starts
        at one instant, in program order, enters its bandwidth phase k overheads later, and
        one that starts while the rank is still issuing waits for it (a LogP gap equal to
        the overhead)."""
        xs = self.issue
        self.issue = []
        x_send, rank_of, free = self.x_send, self.rank_of, self.free
        if len(xs) > 1:
            xs.sort(key=x_send.__getitem__)  # gids run rank by rank in program order
        o = self.overhead
        first = t + o
        fifo, x_route = self.fifo, self.x_route
        for x in xs:
            sr = rank_of[x_send[x]]
            f = free[sr]
            begin = (t if f < t else f) + o
            free[sr] = begin
            if not x_route[x] or self.rem[x] == 0.0:
                self._land(x, begin + self.x_lat[x])
            elif begin == first:
                # Most flows wait exactly one overhead, so these events come due in the order
                # they are made: a FIFO beside the heap keeps them out of it.
                self.seq += 1
                fifo.append((begin, self.seq, _EV_BW_START, x, 0))
            else:
                self._push(begin, _EV_BW_START, x)

    def _bw_start(self, x: int, t: float) -> None:
        self.last[x] = t
        lf = self.link_flows
        route = self.x_route[x]
        alone = True
        for i in route:
            s = lf[i]
            if s is None:
                s = lf[i] = set()
            elif s:
                alone = False
            s.add(x)
        if alone:
            # Nobody else on its links: it runs at its narrowest link's rate and changes no
            # other flow's share (a flow that joins later pulls it into a reshare).
            rate = self.rate[x] = self.x_min[x]
            self.ver[x] += 1
            self._push(t + self.rem[x] / rate, _EV_DRAIN, x, self.ver[x])
        else:
            self.dirty.update(route)

    def _drained(self, x: int, t: float) -> None:
        self.rem[x] = 0.0
        self.ver[x] += 1
        lf = self.link_flows
        route = self.x_route[x]
        shared = False
        for i in route:
            s = lf[i]
            s.discard(x)
            if s:
                shared = True
        if shared:
            self.dirty.update(route)
        if self.x_what[x] == _FLOW_BYTES:
            self._land(x, t + self.x_lat[x])
            return
        if self.cpu_fifo:
            # Its core goes to the work that has waited longest.
            pool = route[-1]
            waiting = self.pool_wait[pool]
            if waiting:
                self._bw_start(waiting.popleft(), t)
            else:
                self.pool_busy[pool] -= 1
        self._cpu_done(x, t)

    def _reshare(self, t: float) -> None:
        """Max-min fair rates for the flows connected to the links that changed."""
        lf = self.link_flows
        routes = self.x_route
        # The component: flows reachable from the changed links through links that carry
        # more than one flow (a link with one flow couples nothing).
        flows: list[int] = []
        seen: set[int] = set()
        cnt: dict[int, int] = {}
        stack: list[int] = []
        for i in self.dirty:
            on = lf[i]
            if not on:
                continue
            if len(on) > 1:
                if i not in cnt:
                    cnt[i] = len(on)
                    stack.append(i)
                continue
            for x in on:
                if x not in seen:
                    seen.add(x)
                    flows.append(x)
                    for j in routes[x]:
                        n = len(lf[j])
                        if n > 1 and j not in cnt:
                            cnt[j] = n
                            stack.append(j)
        self.dirty.clear()
        while stack:
            for x in lf[stack.pop()]:
                if x not in seen:
                    seen.add(x)
                    flows.append(x)
                    for j in routes[x]:
                        n = len(lf[j])
                        if n > 1 and j not in cnt:
                            cnt[j] = n
                            stack.append(j)
        if not flows:
            return
        cap = self.cap
        new_rate: dict[int, float] = {}
        # Progressive filling: the link with the smallest fair share saturates first and
        # fixes the rate of its unfixed flows; shares of the other links can only grow. A
        # link carrying one flow only caps that flow: it enters as the flow's own limit.
        if not cnt:
            x_min = self.x_min
            for x in flows:
                new_rate[x] = x_min[x]
        else:
            left = {i: cap[i] for i in cnt}
            heap = [(left[i] / c, 0, i) for i, c in cnt.items()]
            # A flow's own limit: its narrowest link or flow cap (flow_gbps, a core), which no
            # link of its route is narrower than.
            x_min = self.x_min
            heap.extend((x_min[x], 1, x) for x in flows)
            heapq.heapify(heap)
            pop, push = heapq.heappop, heapq.heappush
            floor = 0.0
            while heap:
                share, is_flow, i = pop(heap)
                if is_flow:
                    if i in new_rate:
                        continue
                    fixed: tuple | set = (i,)
                    skip = -1
                else:
                    c = cnt[i]
                    if c == 0:
                        continue
                    cur = left[i] / c
                    if cur != share:
                        # Keys are lazy: a link's share only grows as flows leave it, so
                        # an old key is too small; put it back with its current share.
                        push(heap, (cur, 0, i))
                        continue
                    fixed, skip = lf[i], i
                    cnt[i] = 0
                # Shares never decrease in exact arithmetic; keep rounding from making one smaller.
                share = floor = share if share > floor else floor
                for x in fixed:
                    if x in new_rate:
                        continue
                    new_rate[x] = share
                    for j in routes[x]:
                        cj = cnt.get(j)
                        if cj is None or j == skip:
                            continue
                        cnt[j] = cj - 1
                        lj = left[j] - share
                        left[j] = lj if lj > 0.0 else 0.0
        rem, rate, last, ver = self.rem, self.rate, self.last, self.ver
        for x in flows:
            nr = new_rate[x]
            old = rate[x]
            if nr == old:
                continue
            r = rem[x] - old * (t - last[x])
            r = rem[x] = r if r > 0.0 else 0.0
            last[x] = t
            rate[x] = nr
            ver[x] += 1
            self._push(t + r / nr, _EV_DRAIN, x, ver[x])

    # -- collectives ---------------------------------------------------------------------------

    def _arrive(self, r: int, gid: int, t: float) -> None:
        k = self.coll_count[r]
        self.coll_count[r] += 1
        if k == len(self.coll_arrivals):
            self.coll_arrivals.append([])
        arrivals = self.coll_arrivals[k]
        if arrivals:
            r0, g0 = arrivals[0][1], arrivals[0][2]
            a, b = self._op(r0, g0), self._op(r, gid)
            if (a.coll, a.reduce, a.part, a.chunk) != (b.coll, b.reduce, b.part, b.chunk):
                raise PlanInvalidError(
                    f"collective #{k}: rank {r0} issues {a.coll} {a.reduce} {a.part} chunk {a.chunk} but rank {r} "
                    f"issues {b.coll} {b.reduce} {b.part} chunk {b.chunk}; every rank must issue the same in order"
                )
        arrivals.append((t, r, gid))
        if len(arrivals) < self.p:
            return
        t0 = max(a[0] for a in arrivals)
        last_gid = next(g for (ta, _, g) in arrivals if ta == t0)
        for ta, _, g in arrivals:
            self.start[g] = t0
            if ta < t0:
                self.pred[g] = last_gid
        self._push(t0 + self._coll_us(gid), _EV_COLL_DONE, k)

    def _coll_us(self, gid: int) -> float:
        from treeattn.cost import gloo, nccl

        if self._cuts is None:
            self._cuts = CutModel(self.topo)
            self._hosts = gloo.on_hosts(self.topo)
            if not self._hosts:
                self._fabric = nccl.fabric(self.topo)
        op = self._op(self.rank_of[gid], gid)
        w, p = self.plan.workload, self.p
        start, stop = self.plan.chunk_range(op.chunk)
        total = 0.0
        for coll, what in COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].calls:
            if what == "q":
                share = row = self.nbytes[gid]
            else:
                row = row_bytes(w, what)
                share = (stop - start) * row
            # What every rank must receive at least: a reduce-scatter delivers a p-th.
            floor = self._cuts.collective_floor_us(share // p if coll == "reducescatter" else share, row)
            if self._hosts:
                # gloo reduce-scatters (and, here, reduces) with an all-reduce of the whole buffer.
                t, cpu = gloo.collective(self.topo, "allgather" if coll == "allgather" else "allreduce", share)
                for r, us in enumerate(cpu):
                    self.cpu_spent[r] += us
            else:
                # NCCL's constants leave out the host's cost of issuing the call (nccl-tests
                # overlaps it with the previous call): one overhead per call, as per message.
                size = share * p if coll == "allgather" else share
                t = self.overhead + nccl.pick(self._fabric, nccl.Collective(coll), size).time_us
            total += max(t, floor)
        return total

    def _coll_done(self, k: int, t: float) -> None:
        for _, r, gid in self.coll_arrivals[k]:
            op = self._op(r, gid)
            merges = COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].local_merge
            extra = self.cm.gather_merge_us(r, self.nbytes[gid], self.p) if merges else 0.0
            if extra > 0:
                self._push(t + extra, _EV_OP_DONE, gid)
            else:
                self._op_done(gid, t)

    # -- results -------------------------------------------------------------------------------

    def _op(self, r: int, gid: int):  # noqa: ANN202 - an ir.Op
        return self.ops[gid]

    def _check_finished(self) -> None:
        stuck = [r for r in range(self.p) if self.cur[r] < len(self.steps[r])]
        if not stuck:
            return
        lines = []
        for r in stuck[:5]:
            lo, hi = self.steps[r][self.cur[r]]
            waits = []
            for gid in range(lo, hi):
                if self.end[gid] >= 0:
                    continue
                op = self._op(r, gid)
                if op.kind is OpKind.COLLECTIVE:
                    k = self.coll_count[r] - 1
                    waits.append(f"collective #{k} ({len(self.coll_arrivals[k])} of {self.p} ranks arrived)")
                else:
                    what = "send chunk {} to" if op.kind is OpKind.SEND else "recv chunk {} from"
                    unmatched = " (no matching op there)" if self.partner[gid] < 0 else ""
                    waits.append(f"op {gid - self.offset[r]} {what.format(op.chunk)} rank {op.peer}{unmatched}")
            lines.append(f"rank {r} at step {self.plan.programs[r][lo - self.offset[r]].step} waits on "
                         + ", ".join(waits[:3]) + (" ..." if len(waits) > 3 else ""))
        more = f" (and {len(stuck) - 5} more ranks)" if len(stuck) > 5 else ""
        raise PlanInvalidError(
            f"plan deadlocks: {len(stuck)} ranks never finish{more}; " + "; ".join(lines)
            + ". Every SEND needs a matching RECV (FIFO per rank pair) that can be posted"
        )

    def _result(self, want_timeline: bool, events: int) -> SimResult:
        finish = tuple(self.finish)
        predicted = max(finish) if finish else 0.0
        path: list[tuple[int, int]] = []
        last_rank = max(range(self.p), key=lambda r: (finish[r], -r))
        gid = self.last_gid[last_rank] if self.steps[last_rank] else -1
        guard = len(self.kind) + 1
        while gid >= 0 and guard:
            r = self.rank_of[gid]
            path.append((r, gid - self.offset[r]))
            gid = self.pred[gid]
            guard -= 1
        path.reverse()
        tl = None
        if want_timeline:
            names = {code: kind.value for kind, code in _KIND_CODE.items()}
            off = self.offset
            tl = tuple(
                OpTiming(r, g - off[r], names[k], op.peer, op.chunk, st, en, nb)
                for g, (r, k, op, st, en, nb) in enumerate(
                    zip(self.rank_of, self.kind, self.ops, self.start, self.end, self.nbytes, strict=True))
            )
        return SimResult(
            predicted_us=predicted,
            per_rank_finish_us=finish,
            critical_path=tuple(path),
            timeline=tl,
            events=events,
            transfers=self.n_transfers,
            cpu_us=tuple(self.cpu_spent),
        )
