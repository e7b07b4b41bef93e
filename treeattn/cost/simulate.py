"""The cost-model simulator: times a Plan on a Topology, event by event.

It implements the Plan IR semantics of ``treeattn.plan.ir`` with these costs:

* A rank posts the ops of a step together and starts its next step when all of them are
  done and the step's local work has run: its merges and copies, and the next step's
  conversions before it posts (``treeattn.cost.program``, ``ComputeModel.step_local_us``).
* A transfer starts when both its SEND and its matching RECV are posted (k-th SEND a->b
  matches the k-th RECV at b from a). It costs the sender's ``topo.cost.overhead_us``,
  then its bytes drain at the flow's share of bandwidth, then its route latency (sum of
  hop ``latency_us``). SEND and RECV both complete when it arrives. A route with no links
  (a rank to itself) costs the overhead (and latency) only. An empty message is not sent
  (``Comm.post`` posts none): its SEND and its RECV each complete when their step is posted.
* A rank issues its messages one after another (LogP's gap, equal to the overhead). On GPU
  ranks under a communicator per pair (``PAIR``, as the executor runs plans) a step posts
  one NCCL group per peer it has a non-empty message with, in ascending peer rank, its sends
  and receives with that peer together (``Comm.post``), and each group is a kernel launch of
  its own on both sides: the k-th group a rank posts begins k overheads after the step is
  posted, and a transfer begins draining when both its
  sender's and its receiver's groups are issued, so a rank that receives from many peers
  pays for each as a sender does. Elsewhere (host ranks without host CPU costs; ``WORLD``,
  nccl-tests' one group a call) the sender alone pays: of the transfers a rank starts at one
  instant, the k-th in its program order begins draining k overheads after that instant, and
  a transfer that starts while its sender is still issuing earlier ones waits for them.
* Bandwidth: every flow in its draining phase shares each link it crosses max-min
  fairly (``treeattn.cost.sharing``). Rates are recomputed whenever flows start or finish,
  in one batch per instant, and only for the connected component of flows (linked through
  shared links) that the change touches.
* COMPUTE costs ``ComputeModel.partial_us`` (a rank's later ones ``later=True``); it starts
  when its step is posted and runs beside the step's transfers (the device computes while
  the links carry them: a resource of its own). A COLLECTIVE starts when the last rank
  arrives and ends on every rank at once, after the library's time for its calls
  (``treeattn.cost.library``); a form that gathers and merges adds the local merge, and
  every form the other kernels its ranks launch around the calls (``collective_kernels``).
* Host CPUs (``topo.cost.host.host_cores`` > 0; ranks on ``host`` devices only): their cores are
  resources beside the links and their CPU work flows through them (``treeattn.cost.host``,
  which says what a message, a step, a merge and a compute cost there).
* Every rank runs its first step ``cost.host.wakeup_us`` after time 0 (a blocked process wakes).
* A link's ``flow_gbps`` caps each flow on it below the link's shared ``bw_gbps``; a send
  between two GPUs of a node, one without peer-to-peer, moves at most NCCL's shared-memory
  rate (``treeattn.cost.nccl_rates.shm_pair_gbps``). Between
  GPUs a link carries what NCCL's transfers reach on it, not its datasheet rate
  (``treeattn.cost.nccl_rates.p2p_link_gbps``: NCCL's own rating of NVLink, xGMI and PCIe links,
  0.94 of a network port), and a send between NVIDIA GPUs runs at most at what NCCL's
  channels for its size move (``treeattn.cost.nccl_p2p``: a communicator per pair of ranks,
  as the executor runs plans, or one of every rank, as nccl-tests runs). In a communicator
  of every rank a send to another node takes NCCL's PXN route (``nccl_p2p.router``): over
  NVLink to the GPU on the peer's rail, then that GPU's NIC.
* A plan whose ranks wait forever raises ``PlanInvalidError`` naming what they wait on.

The critical path follows, back from the last rank to finish, for each op the op that
released it: the last op of its rank's previous step, or the partner that posted a
transfer (or arrived at a collective) last. Contention is not an edge of it.
"""

from __future__ import annotations

import heapq
from collections import deque

from treeattn.cost.compute import ComputeModel
from treeattn.cost.host import CPU_MERGE, CPU_OP, HostModel
from treeattn.cost.library import LibraryModel
from treeattn.cost.nccl_p2p import PAIR, peer_channels, router
from treeattn.cost.nccl_rates import shm_pair_gbps, transfer_gbps
from treeattn.cost.program import _COLL, _COMPUTE, _KIND_CODE, _SEND, compile_plan
from treeattn.cost.sharing import component, fair_rates, shared_routes
from treeattn.cost.simresult import OpTiming, SimResult
from treeattn.errors import InputError, PlanInvalidError
from treeattn.plan.ir import COLLECTIVE_FORMS, OpKind, Plan, collective_kernels, gc_paused, padding_kernels, row_bytes
from treeattn.plan.validate import given_partial_problem
from treeattn.topology.model import Topology

__all__ = ["OpTiming", "SimResult", "issues_by_peer", "simulate"]

# Event kinds, in heap tuples (time, seq, kind, a, b).
(_EV_BW_START, _EV_DRAIN, _EV_XFER_DONE, _EV_OP_DONE, _EV_STEP_END, _EV_COLL_DONE, _EV_POST,
 _EV_ARRIVE) = range(8)
_FLOW_BYTES = 0
"""A flow that is a transfer's bytes (host CPU work has kinds of its own, ``treeattn.cost.host``)."""


def issues_by_peer(topo: Topology, communicator: str = PAIR) -> bool:
    """Whether ranks issue one group a peer and step, receiver and sender alike (GPU ranks under
    a communicator per pair, with an overhead to pay: the module docstring), rather than the
    sender alone one message at a time."""
    return communicator == PAIR and not topo.on_hosts and topo.cost.overhead_us > 0


def simulate(plan: Plan, topo: Topology, *, timeline: bool = True, communicator: str = PAIR,
             given_partials: bool = False) -> SimResult:
    """Predict how long ``plan`` takes on ``topo`` (see the module docstring for the model).

    Args:
        plan: the plan; its rank count must equal the topology's.
        topo: the topology to time it on.
        timeline: also return every op's start and end (costs memory on huge plans).
        communicator: the NCCL communicators sends run in, which set their channels on GPUs
            (``treeattn.cost.nccl_p2p``): ``pair`` (one per pair of ranks, as treeattn's
            executor runs plans) or ``world`` (one of every rank, as nccl-tests runs).
        given_partials: time a ``Merger`` call: each rank's partial over its own KV shard is
            given (the model's attention kernel computed it), so that COMPUTE costs nothing and
            the time is the merge's alone. The plan must merge given partials
            (``treeattn.plan.validate.given_partial_problem``).

    Returns:
        The SimResult.

    Raises:
        InputError: the plan and topology have different rank counts.
        PlanInvalidError: ops out of order, unmatched transfers, disagreeing collectives,
            or a deadlock (of non-empty messages: an empty one is done when posted, as the
            executor never sends it, so one left unmatched goes unseen here; the validator,
            ``treeattn.plan.validate``, which the ``simulate`` command and the API ask first, reports it).

    Examples:
        >>> from treeattn.plan.builders import build  # doctest: +SKIP
        >>> from treeattn.topology.library import resolve  # doctest: +SKIP
        >>> topo = resolve("dgx-h100:nodes=2")  # doctest: +SKIP
        >>> simulate(build("binomial", w, topo, chunks=4), topo).predicted_us  # doctest: +SKIP
    """
    if plan.ranks != topo.num_ranks:
        raise InputError(
            f"plan has {plan.ranks} ranks but topology {topo.name!r} places {topo.num_ranks}; "
            "use a topology with as many ranks as the plan"
        )
    if given_partials and (problem := given_partial_problem(plan)):
        raise InputError(problem)
    # The engine allocates hundreds of thousands of small acyclic objects; the cyclic
    # collector would rescan the growing heap again and again (superlinear time).
    with gc_paused():
        return _Engine(plan, topo, communicator, given_partials).run(timeline)


class _Engine:
    """One simulation's state. Ops are numbered globally (gid), rank by rank."""

    def __init__(self, plan: Plan, topo: Topology, communicator: str = PAIR, given_partials: bool = False) -> None:
        self.plan, self.topo = plan, topo
        p = self.p = topo.num_ranks
        self.cm = ComputeModel.of(plan.workload, topo, given_partials)
        self.overhead = topo.cost.overhead_us
        gbps = transfer_gbps(topo)
        self.cap = [bw * 1e3 for bw in gbps]  # bytes per microsecond
        self.flow_cap = [min(ln.flow_cap_gbps, bw) * 1e3 for ln, bw in zip(topo.links, gbps, strict=True)]
        self.wakeup = topo.cost.host.wakeup_us
        self.lat = [ln.latency_us for ln in topo.links]
        prog = compile_plan(plan, p, self.cm)
        kind, self.offset = prog.kind, prog.offset
        self.kind, self.peer, self.nbytes, self.rank_of, self.ops = kind, prog.peer, prog.nbytes, prog.rank_of, prog.ops
        self.steps, self.merge_b, self.merge_k = prog.steps, prog.merge_b, prog.merge_k
        self.step_compute = prog.step_compute
        n = len(kind)
        self.partner = prog.pair(p)
        keys = sorted({self.rank_of[g] * p + self.rank_of[self.partner[g]]
                       for g, k in enumerate(kind) if k == _SEND and self.partner[g] >= 0})
        self.routes = shared_routes(topo, keys, self.cap, self.lat, self.flow_cap,
                                    lambda a, b: shm_pair_gbps(topo, a, b) * 1e3, router(topo, communicator))
        peers = peer_channels(topo, [(k // p, k % p) for k in self.routes], communicator)
        self.peers = None if peers is None else {a * p + b: v for (a, b), v in peers.items()}
        """Per route key, what NCCL's channels let one send of it reach (None, or a key left
        out: no such cap)."""
        self.msg_cap: dict[tuple[int, int], float] = {}
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
        """Per rank: the CPU work charged to it (host ranks; host collectives)."""
        self.host = HostModel.attach(self, topo)
        self.grouped = issues_by_peer(topo, communicator)
        """Issue slots per peer group on both sides (module docstring), else the sender's alone."""
        self.slot = [0.0] * n if self.grouped else []
        """Per op (``grouped``): when its peer group is issued."""
        # Collectives: per instance k, the arrivals (time, rank, gid).
        self.coll_count = [0] * p
        self.coll_arrivals: list[list[tuple[float, int, int]]] = []
        self._library: LibraryModel | None = None

    def add_resource(self, capacity: float) -> int:
        """A resource flows can cross beside the links (a CPU core, a pool of cores): its index."""
        self.cap.append(capacity)
        self.link_flows.append(None)
        return len(self.cap) - 1

    # -- event plumbing ----------------------------------------------------------------------

    def _push(self, t: float, ev: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, ev, a, b))

    def run(self, want_timeline: bool) -> SimResult:
        host = self.host
        for r in range(self.p):
            if self.steps[r] or (host is not None and host.starts(r)):
                if self.wakeup > 0:
                    self._push(self.wakeup, _EV_POST, r)
                else:
                    self._begin(r, 0.0)
        heap, fifo = self.heap, self.fifo
        events = 0
        pop, popleft = heapq.heappop, fifo.popleft
        ver, x_recv = self.ver, self.x_recv
        op_done, drained, bw_start = self.op_done, self._drained, self.bw_start
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
                self.sender_side(a, t)
                op_done(x_recv[a], t)
            elif ev == _EV_DRAIN:
                if ver[a] == b:
                    drained(a, t)
            elif ev == _EV_BW_START:
                bw_start(a, t)
            elif ev == _EV_STEP_END:
                self.step_end(a, t)
            elif ev == _EV_OP_DONE:
                op_done(a, t)
            elif ev == _EV_COLL_DONE:
                self._coll_done(a, t)
            elif ev == _EV_POST:
                self._begin(a, t)
            else:
                host.receive(self.rank_of[x_recv[a]], a, t)
        self._check_finished()
        return self._result(want_timeline, events)

    # -- steps ---------------------------------------------------------------------------------

    def _begin(self, r: int, t: float) -> None:
        """Rank ``r`` is awake: its start-up CPU work, then its first step."""
        if self.host is None or not self.host.begin(r, t):
            self.started(r, t)

    def started(self, r: int, t: float) -> None:
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
            if self.host is not None and self.host.active(r):
                self.host.cpu(CPU_OP, r, us, cg, t)
            else:
                self._push(t + us, _EV_OP_DONE, cg)
            if hi - lo == 1:
                return
        if self.host is None or not self.host.post_step(r, t):
            self.post_transfers(r, t)

    def post_transfers(self, r: int, t: float) -> None:
        lo, hi = self.steps[r][self.cur[r]]
        spred, kind = self.last_gid[r], self.kind
        post, pred = self.post, self.pred
        partner = self.partner
        if self.grouped:
            self._issue_groups(r, lo, hi, t)
        nbytes = self.nbytes
        for gid in range(lo, hi):
            if kind[gid] == _COMPUTE:
                continue
            post[gid] = t
            pred[gid] = spred
            if not nbytes[gid]:
                self.start[gid] = t
                self._push(t, _EV_OP_DONE, gid)
                continue
            q = partner[gid]
            if q >= 0 and post[q] >= 0.0:
                # The partner posted first (or at the same instant): the transfer starts now.
                if post[q] < t:
                    pred[q] = gid
                if kind[gid] == _SEND:
                    self._match(gid, q, t)
                else:
                    self._match(q, gid, t)

    def _issue_groups(self, r: int, lo: int, hi: int, t: float) -> None:
        """Rank ``r`` posts ops ``lo:hi`` at ``t``: one group per peer with a non-empty message,
        in ascending peer rank, one overhead each after the one before. A message to itself
        opens no group: it is issued one overhead after the post. (A step ends only once its
        last group's messages have moved, so a rank's groups never outlast its step.)"""
        kind, peer, nbytes, slot, o = self.kind, self.peer, self.nbytes, self.slot, self.overhead
        peers = sorted({peer[g] for g in range(lo, hi) if kind[g] != _COMPUTE and nbytes[g] and peer[g] != r})
        at = {q: t + (k + 1) * o for k, q in enumerate(peers)}
        first = t + o
        for g in range(lo, hi):
            if kind[g] != _COMPUTE:
                slot[g] = at.get(peer[g], first)

    def op_done(self, gid: int, t: float) -> None:
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
                if self.host is not None and self.host.active(r):
                    self.host.cpu(CPU_MERGE, r, us, r, t)
                else:
                    self._push(t + us, _EV_STEP_END, r)
            else:
                self.step_end(r, t)

    def step_end(self, r: int, t: float) -> None:
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
        key = sr * self.p + qr
        hit = self.routes[key]
        nbytes = self.nbytes[s]
        cap = hit[2] if self.peers is None or key not in self.peers else min(hit[2], self._message_cap(key, nbytes))
        x = self.new_flow(_FLOW_BYTES, s, q, hit[0], hit[1], cap, float(nbytes), t)
        self.n_transfers += 1
        host = self.host
        if host is not None and host.matched(x, sr, qr, nbytes, t):
            return
        if self.grouped:
            slot = self.slot
            begin = slot[s] if slot[s] > slot[q] else slot[q]
            if not hit[0]:
                self._land(x, begin + hit[1])
            elif begin == t + self.overhead:
                self.seq += 1  # due in the order made, as in _issue
                self.fifo.append((begin, self.seq, _EV_BW_START, x, 0))
            else:
                self._push(begin, _EV_BW_START, x)
        elif self.overhead > 0 and (host is None or not host.active(sr)):
            # The sender's issue slot is given once every transfer starting now is known.
            self.issue.append(x)
        else:
            self.send(x, t)

    def _message_cap(self, key: int, nbytes: int) -> float:
        """Bytes per microsecond NCCL's channels move one send of ``nbytes`` over route ``key``."""
        hit = self.msg_cap.get((key, nbytes))
        if hit is None:
            hit = self.msg_cap[(key, nbytes)] = self.peers[key].gbps(nbytes) * 1e3
        return hit

    def new_flow(self, what: int, a: int, b: int, route: tuple[int, ...], lat: float, cap: float, amount: float,
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

    def send(self, x: int, t: float) -> None:
        """Transfer ``x`` enters the wire at ``t``."""
        if not self.x_route[x]:
            self._land(x, t + self.x_lat[x])
        else:
            self.bw_start(x, t)

    def _land(self, x: int, t: float) -> None:
        """Transfer ``x``'s last byte reaches the receiver at ``t``; it completes then, or
        after the receiver's CPU work for it."""
        if self.host is not None and self.host.receives(x):
            self._push(t, _EV_ARRIVE, x)
        else:
            self._push(t, _EV_XFER_DONE, x)

    def sender_side(self, x: int, t: float) -> None:
        """Transfer ``x`` is done on the sender's side (delivered, or the sender's CPU work for
        it done): its SEND completes with the last of those."""
        if self.host is None or not self.host.sender_done(x):
            self.op_done(self.x_send[x], t)

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
            if not x_route[x]:
                self._land(x, begin + self.x_lat[x])
            elif begin == first:
                # Most flows wait exactly one overhead, so these events come due in the order
                # they are made: a FIFO beside the heap keeps them out of it.
                self.seq += 1
                fifo.append((begin, self.seq, _EV_BW_START, x, 0))
            else:
                self._push(begin, _EV_BW_START, x)

    def bw_start(self, x: int, t: float) -> None:
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
        self.host.drained(x, route, t)

    def _reshare(self, t: float) -> None:
        """Max-min fair rates for the flows connected to the links that changed."""
        flows, cnt = component(self.dirty, self.link_flows, self.x_route)
        self.dirty.clear()
        if not flows:
            return
        new_rate = fair_rates(flows, cnt, self.link_flows, self.x_route, self.cap, self.x_min)
        rem, rate, last, ver = self.rem, self.rate, self.last, self.ver
        for x in [x for x in flows if new_rate[x] != rate[x]]:  # most keep their rate
            nr = new_rate[x]
            old = rate[x]
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
        if self._library is None:
            self._library = LibraryModel(self.topo)
        t, calls = self._library.time_us(self.plan, self.ops[gid], self.nbytes[gid])
        for cpu in calls:
            for r, us in enumerate(cpu):
                self.cpu_spent[r] += us
        return t

    def _coll_done(self, k: int, t: float) -> None:
        for _, r, gid in self.coll_arrivals[k]:
            op = self._op(r, gid)
            merges = COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].local_merge
            # An all-gather's rank merges p whole buffers; an all-to-all's, p pieces of its own rows.
            share = self.nbytes[gid]
            if op.coll == "alltoall":
                share = self.plan.owned_rows(op.chunk)[r] * row_bytes(self.plan.workload, op.part)
            extra = self.cm.gather_merge_us(r, share, self.p) if merges else 0.0
            kernels = collective_kernels(self.plan, op, r)
            if kernels:  # each reads and writes the rows once, but the padding's copies share one pass
                pad = padding_kernels(self.plan, op)
                passes = kernels - pad + (pad > 0)
                extra += self.cm.step_local_us(r, 2 * passes * self.nbytes[gid], kernels)
            if extra > 0:
                self._push(t + extra, _EV_OP_DONE, gid)
            else:
                self.op_done(gid, t)

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
