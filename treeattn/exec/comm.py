"""torch.distributed plumbing shared by the plan interpreter and the baselines.

A ``Comm`` works over a process group (default the world): plan rank i is rank i of the
group. Point-to-point messages carry a tag of their sequence number on the ordered pair of
that group within the Comm's tag space (k-th message from a to b has tag k on both sides,
counted over the process's life; a ``Merger`` has a space of its own), so gloo matches them
FIFO per pair exactly as the Plan IR says, however many are in flight, and never matches one
Merger's message with another's. On NCCL, which ignores tags, every pair of
ranks that exchanges messages has a communicator of its own (``open_pairs``): a batch's
messages to one peer are one NCCL group on it, FIFO per pair, and each peer's messages
complete on their own instead of all of a step's at the end of one group. NCCL requires
operations on different communicators to be issued in one order on every rank, or they may
deadlock (its user guide, "Using multiple NCCL communicators concurrently"), so a batch posts
its groups in ascending peer rank: on every rank that is ascending pair (min, max), and a
plan whose transfers have both sides in one step (every builder's, ``plan.schedule``) is
issued in one order on all ranks: by step, then by pair. A plan whose transfers straddle
steps can be valid and still issue communicators in a cycle: ``PlanExecutor`` refuses it on
NCCL (``treeattn.exec.issue_order``).

One rule for empty messages: a message of zero bytes (a KV shard of no tokens) is not
posted, on either side (both sides know its size). fp8 travels as its bytes (a uint8 view).

Every wait has a deadline: ``op_timeout_s`` for the operations being measured,
``setup_timeout_s`` for set-up, checks and barriers. A failed or timed-out wait raises
``CommError``, which names the operation and the peer. On CUDA a wait does not hold the
host: the device waits (the NCCL work joins the current stream), a marker (an untimed
event, one per work handle) records where, and ``settle`` later waits for the markers,
each within the deadline of the one before (``treeattn.exec.deadline``), so a rank that
died or hung is named within the timeout without a host synchronisation inside a timed
region. A ``Merger`` hands each call's markers to ``calls`` instead, which checks them
without waiting unless the host has run more than ``CALLS_AHEAD`` calls ahead of the device.

Time: ``mark`` is a timestamp of the current stream's position (a CUDA event on a GPU, the
host clock on a CPU) and ``seconds`` turns it into seconds on the host clock, counted from
an ``origin``.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import math
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import compress

import torch
import torch.distributed as dist

from treeattn.errors import ExecutionError
from treeattn.exec.board import HostBoard, RankExited
from treeattn.exec.deadline import LONGEST_TIMEOUT_S, Outstanding, wait_marks  # the first re-exported

__all__ = ["CALLS_AHEAD", "LONGEST_TIMEOUT_S", "EXTERNAL_EVENTS", "CommError", "Comm", "P2P", "BufferPool", "Mark",
           "timing_event", "deadline_event", "distinct", "first_uses"]

_PAIRS: dict[tuple[int, int], dist.ProcessGroup] = {}
"""NCCL communicators of pairs of global ranks, created once per default process group
(``Comm.open_pairs``; ``_forget_pairs_of_another_world``)."""
_PAIRS_WORLD: list = [None]
"""The default process group ``_PAIRS`` were made under."""


def _forget_pairs_of_another_world() -> None:
    """Empty ``_PAIRS`` where the default process group is not the one they were made under (a
    process that destroyed it and initialised again: the old pairs' communicators are gone)."""
    world = dist.distributed_c10d._get_default_group()
    if _PAIRS_WORLD[0] is not world:
        _PAIRS.clear()
        _PAIRS_WORLD[0] = world

Mark = float | torch.cuda.Event
"""A timestamp: host seconds on a CPU device, a recorded CUDA event on a GPU."""

_TAGS: dict[tuple[int, int, int, bool], int] = defaultdict(int)
"""Messages so far per (group, tag space, peer, sent): shared by every ``Comm`` of the process,
so two Comms in one tag space never reuse a tag the other still has in flight."""
_SPACES: dict[int, int] = defaultdict(int)
"""Tag spaces handed out so far per group (``Comm.claim_space``, one per ``Merger``)."""
SEQ_BITS = 16
"""A tag is its tag space above its sequence number's low ``SEQ_BITS`` bits (gloo's tags are
31-bit: a sequence counted over a long decode would pass that; far fewer than 2**16 messages of
one pair, direction and space are ever in flight at once, and the 2**15 - 1 spaces outlast the
Mergers a process builds: one per layer of a 126-layer model, rebuilt, takes hundreds)."""
TAG_SPACES = 1 << (31 - SEQ_BITS)

_SPIN_S = 0.001
"""How long before an agreed start instant a rank stops sleeping and yields until it."""

CALLS_AHEAD = 3
"""How many earlier calls (``Comm.calls``) the device may not have finished when a call starts
without the call waiting (more: it waits for the oldest). When the host has to wait, the
device still has that many calls queued, so the host's late wake-up (tens of µs) costs it
nothing; a host that ran ahead of a hung peer stops within that many calls and raises by
the deadline; and the markers held are those of at most that many calls and the current one."""


def _first_line(exc: BaseException) -> str:
    """The message's first line without gloo's ``[path/to/file.cc:78] `` prefix."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", first)


def _is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.element_size() == 1


EXTERNAL_EVENTS = "external" in inspect.signature(torch.cuda.Event.__new__).parameters
"""Whether this torch records an event as a node of a CUDA graph being captured (2.5 on);
before, such an event is only a dependency inside the graph, and querying it later fails
(CUDA error 907), so a captured graph keeps no markers of its own then (``graphs``)."""


def timing_event() -> torch.cuda.Event:
    """A CUDA event that times, and that a CUDA graph capture records as a node of the graph
    (so each replay records it again), where this torch can (``EXTERNAL_EVENTS``)."""
    return torch.cuda.Event(enable_timing=True, external=True) if EXTERNAL_EVENTS else torch.cuda.Event(
        enable_timing=True)


def deadline_event() -> torch.cuda.Event:
    """A CUDA event that only marks a position (no timing: cheaper to record), recorded as a
    node of a CUDA graph being captured where this torch can (``EXTERNAL_EVENTS``)."""
    return torch.cuda.Event(external=True) if EXTERNAL_EVENTS else torch.cuda.Event()


def first_uses(works: list) -> list[bool]:
    """For each of ``works`` (one per op posted), whether it is its handle's first occurrence;
    never for None (an empty message, not posted). Ops of one NCCL batch with one peer share a
    handle: it is waited for, and marked, once, at its first op."""
    seen: set[int] = set()
    first = []
    for w in works:
        first.append(w is not None and id(w) not in seen)
        if w is not None:
            seen.add(id(w))
    return first


def distinct(works: list) -> list:
    """The distinct work handles of ``works`` in first-seen order, without None (``first_uses``)."""
    return list(compress(works, first_uses(works)))


_REDUCE = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}


def _collective(name: str, before: str):  # noqa: ANN202 - a torch.distributed function
    """``torch.distributed``'s collective ``name``, else the same one under its name ``before``
    (same arguments): torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor``
    to the ``_single`` names, and the pyproject admits torch from 2.2 (a GPU machine's own torch
    is often older than the pin). Looked up per call, not at import, so tests can take one away."""
    return getattr(dist, name, None) or getattr(dist, before)


@contextmanager
def _members_only() -> Iterator[None]:
    """While a pair's communicator is created by its two ranks alone: torch makes a new NCCL
    group by ``ncclCommSplit`` of the default group's communicator whenever the default group
    is bound to a device (``init_process_group(device_id=...)``, as ``run_rank`` and most
    models do), and that split is collective over every rank of the default group. The other
    ranks do not take part in a pair's creation, so with p > 2 the split waits for them, or
    pairs up ranks that each split for a different pair. With the binding lifted meanwhile,
    torch initialises the pair's communicator from an id its two ranks exchange through the
    store (``distributed_c10d._new_process_group_helper``: it splits only from a bound group)."""
    default = dist.distributed_c10d._get_default_group()
    bound = getattr(default, "bound_device_id", None)
    if bound is None:
        yield
        return
    default.bound_device_id = None
    try:
        yield
    finally:
        default.bound_device_id = bound


class CommError(ExecutionError):
    """A communication failed on this rank (usually because a peer died or hung)."""


@dataclass(slots=True)
class P2P:
    """One point-to-point operation to post: send ``tensor`` to ``peer`` or receive into it."""

    send: bool
    tensor: torch.Tensor
    peer: int


class Comm:
    """This rank's view of the process group: tagged p2p, collectives and barriers with deadlines."""

    def __init__(self, rank: int, world: int, backend: str, device: torch.device,
                 op_timeout_s: float, setup_timeout_s: float, group: dist.ProcessGroup | None = None,
                 watchdog_s: float | None = None) -> None:
        self.rank = rank
        """This process's rank in ``group``."""
        self.world = world
        self.backend = backend
        self.device = device
        self.group = group
        """The process group (None: the world)."""
        self.op_timeout = datetime.timedelta(seconds=op_timeout_s)
        self.setup_timeout = datetime.timedelta(seconds=setup_timeout_s)
        self.watchdog = datetime.timedelta(seconds=setup_timeout_s if watchdog_s is None else watchdog_s)
        """The NCCL watchdog timeout of the pair communicators ``open_pairs`` creates (default: the
        set-up deadline). The watchdog counts from each operation's enqueue and, by torch's
        default, takes the process down: a caller whose deadlines count from later (a Merger's,
        from a call first seeing an earlier one unfinished) gives a longer one, so that its own
        error is the one raised."""
        # The world passed as itself (dist.group.WORLD) is the world: one tag count, one space count.
        self._key = id(group) if group is not None and group is not dist.GroupMember.WORLD else 0
        self.serial = 0
        self.posted = 0
        """Communication posted so far (batches of messages, collectives): a caller tells by it
        whether a call that failed had begun communicating."""
        self._space = 0
        """The tag space of this Comm's messages: 0, or one of its own that every rank of the
        group agreed on (``claim_space``). Messages match only within a space: ranks that call
        two Mergers in different orders wait on each other and time out, rather than merging
        each other's partials."""
        self.board: HostBoard | None = None
        """Where ``release`` meets when every rank shares this host (``open_board``)."""
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[Mark, str]] = []
        """CUDA: markers of waits the device has not been seen to pass yet (``settle``)."""
        self.tracking = True
        """Whether a CUDA wait records a marker (off while a caller's CUDA graph capture records
        the waits: its replays happen where no deadline can see them)."""
        self.calls = Outstanding(op_timeout_s, CALLS_AHEAD, lambda what: self.timed_out(what, op_timeout_s))
        """CUDA: the markers of calls issued and not yet seen finished (a ``Merger``'s)."""
        self._sides: list[torch.cuda.Stream] = []

    # -- time ---------------------------------------------------------------------------------

    def mark(self, stream: torch.cuda.Stream | None = None) -> Mark:
        """Now, in the order of the current stream (or ``stream``): an event on CUDA, else the host clock."""
        if not self.cuda:
            return time.perf_counter()
        event = timing_event()
        event.record(stream)
        return event

    def origin(self) -> tuple[float, Mark]:
        """A mark and the host clock at it: what ``seconds`` counts from. On CUDA the host reads
        its clock once the device has passed the mark, which it reaches microseconds after
        the host records it (a clock read before the record would count every later mark that
        much early); inside a CUDA graph capture, where nothing may wait, before the record
        (a replay takes its own origin)."""
        if not self.cuda or torch.cuda.is_current_stream_capturing():
            return time.perf_counter(), self.mark()
        mark = self.mark()
        mark.synchronize()
        return time.perf_counter(), mark

    def seconds(self, mark: Mark, origin: tuple[float, Mark]) -> float:
        """``mark`` in host-clock seconds (the device must have passed it: ``settle``)."""
        if isinstance(mark, float):
            return mark
        try:
            return origin[0] + origin[1].elapsed_time(mark) / 1e3
        except RuntimeError:  # an event a graph capture could not record (torch without external events)
            return math.nan

    def track(self, what: str, mark: Mark | None = None) -> None:
        """CUDA: remember that the device must pass ``mark`` (default: a new untimed one here)
        in time, ``what`` naming the operation if it does not (``settle``)."""
        if self.cuda:
            if mark is None:
                mark = deadline_event()
                mark.record()
            self._pending.append((mark, what))

    def untracked(self) -> list[tuple[Mark, str]]:
        """Take the markers not settled yet (a CUDA graph keeps those it captured)."""
        out, self._pending = self._pending, []
        return out

    def settle(self, setup: bool = False) -> None:
        """Wait on the host until the device has finished the outstanding ``calls`` and passed
        every tracked marker, each within the deadline of the one before (or of the call);
        raise ``CommError`` naming the first one it did not pass."""
        if not self.cuda:
            return
        self.calls.drain()
        limit = (self.setup_timeout if setup else self.op_timeout).total_seconds()
        wait_marks(self.untracked(), limit, lambda what: self.timed_out(what, limit))

    def timed_out(self, what: str, limit_s: float) -> CommError:
        """The error of ``what``, which the device did not pass within ``limit_s``."""
        return CommError(f"rank {self.rank}: {what} failed: Timed out after {limit_s:g} s (NCCL)")

    # -- point to point ---------------------------------------------------------------------

    def open_pairs(self, pairs: set[tuple[int, int]]) -> None:
        """NCCL: a communicator for each pair of group ranks in ``pairs`` that this rank is in
        (each pair calls it; others are left alone). Every rank must pass the same pairs: they
        are created in one order (a local synchronisation per pair, deadlock-free in that
        order), once per process, each with ``watchdog`` as its watchdog timeout, and
        used once at once (one element each way) so that no communicator is set up lazily in
        the middle of a step, where a pair's rendezvous could wait on a message not yet posted."""
        if self.backend != "nccl":
            return
        _forget_pairs_of_another_world()
        for a, b in sorted({(min(p), max(p)) for p in pairs if p[0] != p[1]}):
            if self.rank not in (a, b):
                continue
            ga, gb = (dist.get_global_rank(self.group, r) if self.group is not None else r for r in (a, b))
            key = (min(ga, gb), max(ga, gb))
            if key in _PAIRS:
                continue
            with _members_only():
                try:
                    group = dist.new_group(list(key), timeout=self.watchdog, use_local_synchronization=True,
                                           device_id=self.device)
                except TypeError:  # torch without eager initialisation of subgroups
                    group = dist.new_group(list(key), timeout=self.watchdog, use_local_synchronization=True)
            _PAIRS[key] = group
            peer = b if self.rank == a else a
            out, back = torch.zeros(1, device=self.device), torch.empty(1, device=self.device)
            at = self._pair(peer)[1]
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, group=group, group_peer=at),
                                                dist.P2POp(dist.irecv, back, group=group, group_peer=at)]):
                self.wait(work, f"opening the communicator with rank {peer}", setup=True)

    def _pair(self, peer: int) -> tuple[dist.ProcessGroup, int] | None:
        """The pair communicator with ``peer`` and the peer's rank in it (None: not opened)."""
        me, other = ((dist.get_global_rank(self.group, r) if self.group is not None else r)
                     for r in (self.rank, peer))
        group = _PAIRS.get((min(me, other), max(me, other)))
        return None if group is None else (group, 0 if other < me else 1)

    def post(self, ops: list[P2P]) -> list:
        """Post ``ops`` together; returns one work handle per op: None for an empty message
        (not posted), and on NCCL the same handle for the ops of one batch with one peer."""
        works: list = [None] * len(ops)
        live = [i for i, op in enumerate(ops) if op.tensor.numel() > 0]
        if not live:
            return works
        self.posted += 1
        g = self.group
        p2p = []
        for i in live:
            op = ops[i]
            key = (self._key, self._space, op.peer, op.send)
            seq = _TAGS[key]
            _TAGS[key] = (seq + 1) % (1 << SEQ_BITS)
            tag = (self._space << SEQ_BITS) | seq
            fn = dist.isend if op.send else dist.irecv
            wire = op.tensor.view(torch.uint8) if _is_fp8(op.tensor) else op.tensor
            p2p.append(dist.P2POp(fn, wire, group=g, tag=tag, group_peer=op.peer))
        try:
            if self.backend == "nccl":
                return self._post_nccl(ops, live, p2p, works)
            for i, p in zip(live, p2p, strict=True):
                works[i] = (dist.isend(p.tensor, group=g, tag=p.tag, group_dst=p.group_peer) if p.op is dist.isend
                            else dist.irecv(p.tensor, group=g, tag=p.tag, group_src=p.group_peer))
            return works
        except RuntimeError as exc:
            raise CommError(f"rank {self.rank}: posting {len(ops)} point-to-point ops failed: "
                            f"{_first_line(exc)}") from exc

    def _post_nccl(self, ops: list[P2P], live: list[int], p2p: list, works: list) -> list:
        by_peer: dict[int, list[int]] = defaultdict(list)
        for j, i in enumerate(live):
            by_peer[ops[i].peer].append(j)
        if not all(self._pair(peer) for peer in by_peer):  # no pair communicators: one group for all
            handles = dist.batch_isend_irecv(p2p)
            for j, i in enumerate(live):
                works[i] = handles[0] if len(handles) == 1 else handles[j]
            return works
        # Peer by peer in ascending rank order, whatever the order of ``ops``: see the module
        # docstring (NCCL's rule for operations on different communicators).
        for peer in sorted(by_peer):
            idx = by_peer[peer]
            group, at = self._pair(peer)
            batch = [dist.P2POp(p2p[j].op, p2p[j].tensor, group=group, group_peer=at) for j in idx]
            handles = dist.batch_isend_irecv(batch)
            for n, j in enumerate(idx):
                works[live[j]] = handles[0] if len(handles) == 1 else handles[n]
        return works

    def wait(self, work, what: str, setup: bool = False) -> None:  # noqa: ANN001 - torch Work or None
        """Wait for ``work`` (None: an empty message, done); raise ``CommError`` naming ``what``
        on failure or deadline. On CUDA the current stream waits, and the host only by
        ``settle`` (at once for set-up waits)."""
        if work is None:
            return
        self.posted += 1  # a collective's work: posted already, as its handle exists
        timeout = self.setup_timeout if setup else self.op_timeout
        try:
            if self.backend == "gloo":
                work.wait(timeout=timeout)
            else:
                work.wait()
        except RuntimeError as exc:
            said = _first_line(exc)
            if "timed out" in said.lower() and self.backend == "gloo":  # gloo's words name no limit
                said += f" (the {'set-up' if setup else 'operation'} timeout, {timeout.total_seconds():g} s)"
            raise CommError(f"rank {self.rank}: {what} failed: {said}") from exc
        if self.cuda and self.tracking:
            self.track(what)
            if setup:
                self.settle(setup=True)

    def done_mark(self, work, slot: int) -> Mark:  # noqa: ANN001 - torch Work
        """CUDA: a marker of ``work``'s own completion: recorded on side stream ``slot`` (one per
        work of a step, so neither the current stream's compute nor another work delays it);
        take it right after posting, and ``join_sides`` before the step ends."""
        while len(self._sides) <= slot:
            self._sides.append(torch.cuda.Stream(self.device))
        side = self._sides[slot]
        with torch.cuda.stream(side):
            work.wait()
            return self.mark(side)

    def join_sides(self, used: int) -> None:
        """The current stream waits for the first ``used`` side streams (a CUDA graph capture
        must end with every stream it forked joined back)."""
        current = torch.cuda.current_stream(self.device)
        for side in self._sides[:used]:
            current.wait_stream(side)

    # -- collectives ----------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: str, what: str, setup: bool = False,
                   widen: bool = False) -> torch.Tensor:
        """In-place all-reduce (``max`` or ``sum``) of ``tensor``; fp8 is reduced through fp32
        (no library reduces fp8), so it moves 4x the bytes. With ``widen`` an fp8 tensor's
        result is that fp32 sum (returned; ``tensor`` is left as it was): a caller that
        finishes from it skips the rounding back, and fp8's range, which a sum of p rows may
        pass though each fits."""
        red = _REDUCE[op]
        if _is_fp8(tensor):
            wide = tensor.float()
            self.wait(dist.all_reduce(wide, op=red, group=self.group, async_op=True), what, setup)
            return wide if widen else tensor.copy_(wide)  # converted back by the copy: one kernel
        self.wait(dist.all_reduce(tensor, op=red, group=self.group, async_op=True), what, setup)
        return tensor

    def reduce_scatter(self, out: torch.Tensor, tensor: torch.Tensor, op: str, what: str,
                       widen: bool = False) -> torch.Tensor:
        """``out`` <- this rank's p-th (along dim 0) of the ``op``-reduction of every rank's ``tensor``
        (dim 0 of ``tensor`` is p times ``out``'s); fp8 is reduced through fp32 (with ``widen``,
        returned in fp32 instead of ``out``, as ``all_reduce``)."""
        scatter = _collective("reduce_scatter_single", "reduce_scatter_tensor")
        if _is_fp8(tensor):
            wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
            self.wait(scatter(wide, tensor.float(), op=_REDUCE[op], group=self.group, async_op=True), what)
            return wide if widen else out.copy_(wide)
        self.wait(scatter(out, tensor.contiguous(), op=_REDUCE[op], group=self.group, async_op=True), what)
        return out

    def reduce(self, tensor: torch.Tensor, root: int, op: str, what: str, widen: bool = False) -> torch.Tensor:
        """In-place reduction of every rank's ``tensor`` into group rank ``root``'s (others' are
        left as the library leaves them); fp8 through fp32 (with ``widen``, returned in fp32, as
        ``all_reduce``)."""
        wide = tensor.float() if _is_fp8(tensor) else tensor
        self.wait(dist.reduce(wide, op=_REDUCE[op], group=self.group, group_dst=root, async_op=True), what)
        if wide is not tensor and not widen:
            tensor.copy_(wide)
            return tensor
        return wide

    def first_text(self, text: str, what: str) -> str:
        """The lowest rank's non-empty ``text``, on every rank ("" where every rank's is
        empty; set-up deadline): an all-gather of lengths, then a broadcast from that rank."""
        data = text.encode()
        mine = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        lengths = self.all_gather(mine, what, setup=True).view(-1).tolist()
        src = next((r for r, n in enumerate(lengths) if n), None)
        if src is None:
            return ""
        buf = torch.zeros(lengths[src], dtype=torch.uint8, device=self.device)
        if self.rank == src:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return bytes(self.broadcast(buf, src, what).cpu().tolist()).decode()

    def all_to_all(self, out: torch.Tensor, tensor: torch.Tensor, splits: list[int], what: str) -> torch.Tensor:
        """``out`` <- the ``splits[self.rank]`` rows every rank sends this one, in rank order;
        this rank sends rows ``[sum(splits[:j]), sum(splits[:j + 1]))`` of ``tensor`` to rank j."""
        src = tensor.contiguous()
        wire_in = src.view(torch.uint8) if _is_fp8(src) else src
        wire_out = out.view(torch.uint8) if _is_fp8(out) else out
        mine = splits[self.rank]
        self.wait(dist.all_to_all_single(wire_out, wire_in, [mine] * self.world, list(splits), group=self.group,
                                         async_op=True), what)
        return out

    def all_gather(self, tensor: torch.Tensor, what: str, setup: bool = False,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's ``tensor`` (same shape everywhere), stacked in rank order: ``(world, *shape)``,
        in ``out`` when given (a buffer of that shape and dtype, e.g. a pooled one)."""
        src = tensor.contiguous()
        if out is None:
            out = torch.empty((self.world, *src.shape), dtype=src.dtype, device=src.device)
        elif out.shape != (self.world, *src.shape) or out.dtype != src.dtype:
            raise ValueError(f"all-gather of {tuple(src.shape)} {src.dtype} into {tuple(out.shape)} {out.dtype}")
        # Flat: gloo wants the output as the inputs concatenated. fp8 travels as its bytes
        # (gloo gathers bytes but knows no fp8).
        wire_out, wire_in = (out.view(torch.uint8), src.view(torch.uint8)) if _is_fp8(src) else (out, src)
        gather = _collective("all_gather_single", "all_gather_into_tensor")
        self.wait(gather(wire_out.view(-1), wire_in.view(-1), group=self.group, async_op=True), what, setup)
        return out

    def digests(self, text: str, what: str) -> list[int]:
        """Every rank's 60-bit digest of its ``text``, in rank order (set-up deadline): equal
        digests mean the ranks hold the same text."""
        mine = torch.tensor([int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)], dtype=torch.int64,
                            device=self.device)
        return self.all_gather(mine, what, setup=True).view(-1).tolist()

    def claim_space(self, what: str) -> None:
        """Give this Comm a tag space of its own, the same on every rank of the group (set-up
        deadline): the next after the highest any rank has handed out on the group. Agreed, not
        counted on each rank alone: a rank whose Merger failed before its Comm (a bad argument
        there only), or that built one its peers did not, would otherwise number every later
        Merger's space differently from its peers, and all their messages would time out."""
        mine = torch.tensor([_SPACES[self._key]], dtype=torch.int64, device=self.device)
        top = int(self.all_reduce(mine, "max", what, setup=True).item()) + 1
        _SPACES[self._key] = top
        self.serial = top  # its number among the group's Comms that claimed one: the same on every rank
        self._space = 1 + (top - 1) % (TAG_SPACES - 1)

    def differing(self, text: str, what: str) -> str | None:
        """Which ranks hold another ``text`` than rank 0 (``digests``), in words ("rank 2 differs",
        "ranks 1, 3 differ"); None where every rank holds the same."""
        every = self.digests(text, what)
        differ = [r for r, d in enumerate(every) if d != every[0]]
        if not differ:
            return None
        return f"ranks {', '.join(map(str, differ))} differ" if len(differ) > 1 else f"rank {differ[0]} differs"

    def broadcast(self, tensor: torch.Tensor, src: int, what: str) -> torch.Tensor:
        self.wait(dist.broadcast(tensor, group=self.group, group_src=src, async_op=True), what, setup=True)
        return tensor

    def barrier(self, stop: int = 0) -> int:
        """All ranks meet (set-up deadline); on CUDA the device is idle afterwards. Returns the
        largest ``stop`` any rank gave (a signal that asked it to wrap up, 0: none)."""
        self.synchronize()
        flag = torch.tensor([float(stop)], dtype=torch.float64, device=self.device)
        agreed = int(self.all_reduce(flag, "max", "barrier", setup=True).item())
        self.synchronize()
        return agreed

    def open_board(self) -> bool:
        """Set up ``release``'s shared-memory board; only for ranks that share one host (the
        caller checked). Rank 0 creates it and names it to the others; it is unlinked as soon
        as every rank has it mapped, so nothing is left behind. Returns whether every rank
        has it (otherwise ``release`` keeps meeting by a collective)."""
        path, created = "", False
        if self.rank == 0:
            path = HostBoard.new_path()
            try:
                HostBoard.create(path, self.world)
                created = True
            except OSError:
                path = ""
        name = torch.zeros(256, dtype=torch.uint8, device=self.device)
        if self.rank == 0 and path:
            name[:len(path)] = torch.tensor(list(path.encode()), dtype=torch.uint8)
        path = bytes(self.broadcast(name, 0, "board name").cpu().tolist()).rstrip(b"\0").decode()
        board = None
        try:
            board = HostBoard(path, self.rank, self.world) if path else None
        except OSError:
            board = None
        try:
            count = torch.tensor([1.0 if board else 0.0], device=self.device)
            opened = int(self.all_reduce(count, "sum", "board check", setup=True).item())
        finally:
            if created:
                os.unlink(path)
        if opened != self.world:
            if board is not None:
                board.close()
            return False
        self.board = board
        return True

    def release(self, margin_s: float, last_delay_s: float, stop: int = 0) -> tuple[float, float, float, int]:
        """Meet the other ranks and start together: every rank contributes its clock (one host's
        CLOCK_MONOTONIC), the worst delay it saw last time and ``stop`` (a signal that asked it to
        wrap up, 0: none); all then sleep until
        ``max(clocks) + margin_s`` and start at that one instant, so no rank gets a head start
        on work the others have not begun. With a board (``open_board``) they meet through
        shared memory, so ranks that finished a run early send nothing while others still run it.

        Returns (start instant, when this rank had the agreed values, the worst delay of the
        previous release over all ranks: for the caller's next margin, the largest ``stop``:
        where it is not 0 every rank wraps up rather than start)."""
        self.synchronize()
        if self.board is not None:
            try:
                latest, worst, agreed = self.board.meet(time.perf_counter(), last_delay_s,
                                                        self.setup_timeout.total_seconds(), float(stop))
            except (TimeoutError, RankExited) as exc:
                raise CommError(f"rank {self.rank}: start release failed: {exc}") from exc
        else:
            mine = torch.tensor([time.perf_counter(), last_delay_s, float(stop)], dtype=torch.float64,
                                device=self.device)
            both = self.all_reduce(mine, "max", "start release", setup=True).cpu()
            latest, worst, agreed = float(both[0]), float(both[1]), float(both[2])
        arrived = time.perf_counter()
        if agreed:
            return latest, arrived, worst, int(agreed)
        start = latest + margin_s
        # Sleep most of the wait, then stay runnable (yielding) to the instant: a process
        # that sleeps through it wakes hundreds of microseconds to milliseconds late when
        # the ranks outnumber the cores, one that is runnable starts as soon as a core is free.
        if start - _SPIN_S > arrived:
            time.sleep(start - _SPIN_S - arrived)
        while time.perf_counter() < start:
            os.sched_yield()
        return start, arrived, worst, 0

    def synchronize(self) -> None:
        """Host waits for the device (tracked markers first, with their deadlines)."""
        if self.cuda:
            self.settle(setup=True)
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        """Seconds on this rank's clock, after the device caught up."""
        self.synchronize()
        return time.perf_counter()


class BufferPool:
    """Receive and collective buffers reused across iterations, so a timed iteration does not pay for
    fresh pages (large KV blocks cost page faults on first touch, not their transfer).

    A buffer is a view of a flat byte storage (a slot) that nothing holds at the time, whatever
    shape and dtype it had before: an iteration holds what its busiest moment needs (what
    ``cost.memory`` counts), not one buffer per shape it ever received. Callers start each
    iteration with ``release_all`` and take and release in the same order every iteration. The
    first picks each take's slot (the smallest free one that is large enough, else the largest
    free one grown, else a new one); later iterations give each take the slot the same take had,
    which is free at that moment and large enough, so they allocate nothing and keep their
    addresses (a CUDA graph captured from one replays those)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._slots: list[torch.Tensor] = []
        self._free: set[int] = set()
        self._lent: list[tuple[torch.Tensor, int]] = []
        self._taken: list[int] = []
        """The slot of each take of this iteration, in order."""
        self._last: list[int] = []
        """The same for the previous iteration."""

    @property
    def nbytes(self) -> int:
        """What the pool holds, lent or free."""
        return sum(slot.numel() for slot in self._slots)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype``, lent until ``release``/``release_all``."""
        nbytes = math.prod(shape) * dtype.itemsize
        k = len(self._taken)
        slot = self._last[k] if k < len(self._last) else -1
        if slot not in self._free or self._slots[slot].numel() < nbytes:
            slot = self._pick(nbytes)
        self._free.discard(slot)
        self._taken.append(slot)
        buf = self._slots[slot][:nbytes].view(dtype).view(shape)
        self._lent.append((buf, slot))
        return buf

    def _pick(self, nbytes: int) -> int:
        free = sorted(self._free, key=lambda s: self._slots[s].numel())
        fits = [s for s in free if self._slots[s].numel() >= nbytes]
        if fits:
            return fits[0]
        if not free:
            self._slots.append(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
            return len(self._slots) - 1
        # The largest free slot grows (its old storage freed first), so what the pool holds
        # tends to the most an iteration holds at once, not to the sum of what it took.
        slot = free[-1]
        self._slots[slot] = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._slots[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return slot

    def release(self, buf: torch.Tensor) -> None:
        """Give one lent buffer back (its transfer has completed and nothing reads it)."""
        for i, (lent, slot) in enumerate(self._lent):
            if lent is buf:
                del self._lent[i]
                self._free.add(slot)
                return

    def release_all(self) -> None:
        """Give back every lent buffer and start an iteration (when none is in use)."""
        self._free.update(slot for _, slot in self._lent)
        self._lent.clear()
        if self._taken:
            self._last, self._taken = self._taken, []
