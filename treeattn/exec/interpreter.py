"""Execute a Plan on one rank with torch.distributed, exactly as ``treeattn.plan.ir`` says.

Per step: the step's transfers are posted together (SENDs read the accumulator as it stood
when the step began, RECVs land in fresh buffers); a COMPUTE of the step runs while they
fly (gloo and NCCL progress them on their own threads and streams); then every transfer is
awaited, and only then are the computed partial and the received rows stored (RECV_COPY)
or merged (RECV_MERGE: the partials a step receives for one chunk land side by side and are
merged in one pass, one fused kernel on CUDA: ``treeattn.exec.kernels``). A COLLECTIVE is a
step of its own (``treeattn.exec.collectives``). Each op gets a post and a completion
timestamp when the executor is ``timed`` (``Comm.mark``: CUDA events on a GPU, so nothing
waits on the host inside the iteration). On NCCL an op's completion is its own (each peer's
messages are an NCCL group of their own; ops of one step with one peer share it); on gloo
transfers of one step are awaited in program order, so an op's completion time is when it
*and the ops before it in the step* had completed.

A rank given its partial (``RankInputs.partial``, a ``Merger``) whose program touches the
accumulator first with its COMPUTE uses the given buffer as its accumulator: the partial is
where the plan's COMPUTE would have put it, and nothing is copied.

Legend: acc is the packed accumulator ``(rows, Dv + 1)`` fp32 for attention plans (rows
head-major, see ``treeattn.exec.merge``) or the raw buffer ``(rows,)`` for raw payload plans;
a KV block is of ``treeattn.exec.attention.kv_shape``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, groupby

import torch

from treeattn.errors import ExecutionError, PlanInvalidError
from treeattn.exec import kernels
from treeattn.exec.attention import kv_shape, partial_attention, torch_dtype
from treeattn.exec.collectives import gather_query, run_collective
from treeattn.exec.comm import P2P, BufferPool, Comm, Mark, first_uses
from treeattn.exec.issue_order import nccl_order_problem
from treeattn.exec.merge import clear_partial, empty_partial, from_wire, to_wire, wire_cols
from treeattn.plan.ir import Op, OpKind, Plan, contiguous_runs, stacked_exchanges, wire_converted
from treeattn.plan.steps import order_problem, step_problem
from treeattn.plan.validate import given_partial_problem

__all__ = ["FAULT_ENV", "MeasuredOp", "RankInputs", "PlanExecutor", "InjectedFault"]

FAULT_ENV = "TREEATTN_FAULT"
"""Test-only fault injection: ``RANK:OP:MODE`` makes rank RANK, before its OP-th plan op
(counted from 0 over the process's life), raise (MODE ``raise``), die (``exit``) or hang, alive
(``hang``)."""


class InjectedFault(ExecutionError):
    """Raised by the test-only fault injection (``TREEATTN_FAULT``)."""


@dataclass(frozen=True, slots=True)
class MeasuredOp:
    """When one op of the measured iteration was posted and completed (µs from the run's origin:
    the agreed start instant on one host, else the rank's own start)."""

    rank: int
    index: int
    op: Op
    post_us: float
    done_us: float


@dataclass(slots=True)
class RankInputs:
    """What one rank starts from: q and its own KV shard (attention), its buffer (raw), or
    its own partial already computed (``partial``, packed: a model's attention kernel ran)."""

    q: torch.Tensor | None = None
    kv: torch.Tensor | None = None
    raw: torch.Tensor | None = None
    partial: torch.Tensor | None = None


def _parse_fault() -> tuple[int, int, str] | None:
    text = os.environ.get(FAULT_ENV, "")
    if not text:
        return None
    rank, op, mode = text.split(":")
    return int(rank), int(op), mode


def _no_mark() -> Mark:
    return 0.0


def _touches_acc(op: Op) -> bool:
    """Whether ``op`` reads or writes the accumulator (moving KV or gathering the query does not)."""
    if op.kind is OpKind.COLLECTIVE:
        return op.part != "q"
    return op.block is None or op.kind is OpKind.COMPUTE


def _partial_lands_first(steps: list[list[tuple[int, Op]]]) -> bool:
    """Whether the first step that touches the accumulator holds the COMPUTE and sends none of
    the accumulator's rows (a send reads the accumulator as the step began: the identity)."""
    for ops in steps:
        touching = [op for _, op in ops if _touches_acc(op)]
        if touching:
            return (any(op.kind is OpKind.COMPUTE for op in touching)
                    and not any(op.kind is OpKind.SEND for op in touching))
    return False


class PlanExecutor:
    """Runs one rank's program of ``plan``; ``run`` is one iteration.

    Args:
        plan: the plan.
        comm: this rank's communicator (its rank is the plan rank).
        inputs: q and KV (attention), the raw buffer, or the rank's own packed ``partial``
            (then the plan's COMPUTE takes it instead of computing).
        kernel: the attention kernel (``treeattn.exec.attention.KERNELS``, resolved).
        timed: record when each op was posted and completed (``timeline``); a ``Merger``,
            which reports no timeline, runs without.
    """

    def __init__(self, plan: Plan, comm: Comm, inputs: RankInputs, kernel: str = "explicit",
                 timed: bool = True) -> None:
        if comm.backend == "nccl":  # every rank finds the same, before anything is posted
            problem = nccl_order_problem(plan)
            if problem:
                raise PlanInvalidError(problem)
        self.plan = plan
        self.comm = comm
        self.inputs = inputs
        self.kernel = kernel
        self.rank = comm.rank
        w = plan.workload
        self.rows = w.rows
        self.wire_dtype = torch_dtype(w.dtype if plan.is_raw else w.partial_dtype)
        if inputs.partial is not None:
            problem = given_partial_problem(plan)
            if problem:
                raise ValueError(problem)
        self.steps = self._compile(plan.programs[self.rank])
        self._op_count = sum(len(ops) for ops in self.steps)
        self.timed = timed
        self._mark: Callable[[], Mark] = comm.mark if timed else _no_mark
        self.in_place = inputs.partial is not None and _partial_lands_first(self.steps)
        """Whether the given partial is the accumulator itself (see the module docstring)."""
        self._fault = _parse_fault()
        self._ops_done = 0
        self.pool = BufferPool(comm.device)
        """Receive and collective buffers, taken per iteration and reused by the next."""
        runs = plan.rounded_runs
        self._rounding = None if not runs else torch.empty(
            (max(stop - start for start, stop in runs), w.value_dim), dtype=self.wire_dtype, device=comm.device)
        """The end-of-run rounding's buffer, one run of rows: its own, as the pool's slots are
        sized by the steps (taken from the pool, it grew a slot past what any step holds)."""
        self._marks: list[tuple[int, Op, Mark, Mark]] = []
        self._clock: tuple[tuple[float, Mark], float] | None = None
        self.origin: float | None = None
        """Where the next run's timeline counts from (host seconds): the instant the ranks
        agreed to start, when the harness has one; else this rank's own start."""
        self.clock: tuple[float, Mark] | None = None
        """The harness's ``Comm.origin`` for the next timed run, taken just before it: the run
        then takes none of its own (on CUDA each waits for the device, which a run timed from
        the harness's origin would count and a baseline's would not); None: the run takes one."""
        self._acc: torch.Tensor | None = None
        self._prepared = False
        self._q: torch.Tensor | None = None
        """The query gathered by an ``allgather copy q`` (decode context parallel)."""

    def _compile(self, program: tuple[Op, ...]) -> list[list[tuple[int, Op]]]:
        steps: list[list[tuple[int, Op]]] = []
        last = None
        for step, group in groupby(enumerate(program), key=lambda item: item[1].step):
            ops = list(group)
            problem = None if last is None else order_problem(last, step)
            if problem is not None:
                raise PlanInvalidError(f"rank {self.rank} op {ops[0][0]}: {problem}")
            last = step
            found = step_problem(program, ops[0][0], ops[-1][0] + 1)
            if found is not None:
                raise PlanInvalidError(f"rank {self.rank} op {found.index}: {found.message}")
            if self.plan.is_raw and any(op.kind is OpKind.COMPUTE or op.block is not None for _, op in ops):
                raise PlanInvalidError(f"rank {self.rank}: step {step} computes or moves KV in a raw payload plan")
            for _, op in ops:
                if op.kind is OpKind.RECV_MERGE and op.block is not None:
                    raise PlanInvalidError(f"rank {self.rank}: recv_merge of KV block {op.block}; use recv_copy")
            steps.append(ops)
        return steps

    # -- one iteration ---------------------------------------------------------------------

    def prepare(self) -> None:
        """Put the accumulator back to the plan's starting state (own buffer for raw payloads,
        the merge identity for attention) in a buffer reused across iterations.

        Harnesses call this before they start the clock: restoring the input is not part of
        the plan (in a decode step the partial is produced in place), and a fresh buffer per
        iteration would time page faults as if they were the plan's."""
        w = self.plan.workload
        if self.plan.is_raw:
            if self._acc is None:
                self._acc = torch.empty_like(self.inputs.raw)
            self._acc.copy_(self.inputs.raw)
        elif self.in_place:
            self._acc = self.inputs.partial
        else:
            if self._acc is None:
                self._acc = empty_partial(self.rows, w.value_dim, self.comm.device)
            else:
                clear_partial(self._acc)
        self.pool.release_all()  # the previous iteration's blocks and buffers are no longer read
        self._prepared = True

    def run(self) -> torch.Tensor:
        """Execute the rank's program once; returns its accumulator (see module legend), a
        buffer the next iteration reuses (copy it to keep it). In a ``heads`` plan only this
        rank's own rows (``plan.segments[rank]``) hold the result, in ``root`` plans only the
        root's accumulator."""
        if not self._prepared:
            self.prepare()
        self._prepared = False
        acc = self._acc
        blocks: dict[int, torch.Tensor] = {} if self.plan.is_raw else {self.rank: self.inputs.kv}
        state: dict = {}
        self._q = None
        self._marks = []
        if self.timed:
            self.rebase()
        empty = [not self.plan.is_raw]  # the accumulator still holds the merge's identity
        for ops in self.steps:
            for index, _ in ops:
                self._maybe_fault(index)
            t_post = self._mark()
            first = ops[0][1]
            if first.kind is OpKind.COLLECTIVE:
                what = f"collective {first.coll} {first.reduce} {first.part} (step {first.step})"
                if first.part == "q":
                    # A Merger's partial was computed by the model with its own query: nothing to gather.
                    if self.inputs.partial is None:
                        self._q = gather_query(self, self.inputs.q, what)
                else:
                    run_collective(self, first, acc, state, what)
                    empty[0] = False
                done = [self._mark()]
            else:
                done = self._step(ops, acc, blocks, empty, t_post)
            if self.timed:
                for (index, op), t_done in zip(ops, done, strict=True):
                    self._marks.append((index, op, t_post, t_done))
        for start, stop in self.plan.rounded_runs:
            # A copy on a narrower wire lands rounded (o in the partial dtype): the rank it came
            # from, and those that merged the same rows (an exchange beside it), round theirs
            # too, so every rank ends with the same bits (rounding a rounded row changes nothing).
            # Only o is rounded: the lse travels as fp32 bytes, so its round trip changes nothing.
            o = acc[start:stop, :-1]
            o.copy_(self._rounding[:stop - start].copy_(o))
        return acc

    def rebase(self) -> None:
        """Count this run's timeline from the harness's ``clock``, else from a ``Comm.origin``
        taken now (as the run or a CUDA graph's replay begins)."""
        origin = self.comm.origin() if self.clock is None else self.clock
        self._clock = (origin, origin[0] if self.origin is None else self.origin)
        self.origin = self.clock = None

    def replaying(self) -> None:
        """What a CUDA graph's replay of ``run`` does on the host first: count the ops for the
        test-only fault injection, and take the timeline's origin."""
        if self._fault is None:  # every decode step: count the ops without a loop over them
            self._ops_done += self._op_count
        else:
            for ops in self.steps:
                for index, _ in ops:
                    self._maybe_fault(index)
        if self.timed:
            self.rebase()

    @property
    def timeline(self) -> list[MeasuredOp]:
        """When each op of the last run was posted and completed (read once the device is done)."""
        if self._clock is None:
            return []
        origin, start = self._clock
        sec = self.comm.seconds
        return [MeasuredOp(self.rank, index, op, (sec(p, origin) - start) * 1e6, (sec(d, origin) - start) * 1e6)
                for index, op, p, d in self._marks]

    def _maybe_fault(self, index: int) -> None:
        count = self._ops_done
        self._ops_done += 1
        if self._fault is None or self._fault[0] != self.rank or self._fault[1] != count:
            return
        if self._fault[2] == "exit":
            os._exit(17)
        if self._fault[2] == "hang":
            time.sleep(3600)
        raise InjectedFault(f"injected fault on rank {self.rank} at op {count} (program op {index})")

    @property
    def buffer_bytes(self) -> int:
        """What the executor holds beside the accumulator and the inputs: its pool and the
        rounding buffer (``cost.memory`` counts both)."""
        return self.pool.nbytes + (0 if self._rounding is None else self._rounding.nbytes)

    def rows_of(self, chunk: int | None) -> slice:
        """The accumulator rows of ``chunk`` (None: all)."""
        start, stop = self.plan.chunk_range(chunk)
        return slice(start, stop)

    def _row_shape(self, chunk: int | None) -> tuple[int, ...]:
        """Shape of ``chunk``'s rows on the wire: raw elements, or partials in wire form (``wire_cols``)."""
        rows = self.rows_of(chunk)
        n = rows.stop - rows.start
        return (n,) if self.plan.is_raw else (n, wire_cols(self.plan.workload.value_dim, self.wire_dtype))

    def _block(self, blocks: dict[int, torch.Tensor], block: int, op: Op) -> torch.Tensor:
        if block not in blocks:
            raise PlanInvalidError(f"rank {self.rank}: op {op.to_dict()} uses KV block {block}, which it does not hold")
        return blocks[block]

    def _partial(self, op: Op, blocks: dict[int, torch.Tensor]) -> torch.Tensor:
        """The packed partial a COMPUTE contributes: the given one, or attention over its block."""
        if self.inputs.partial is not None:
            return self.inputs.partial
        kv = self._block(blocks, self.rank if op.block is None else op.block, op)
        q = self._q if self._q is not None else self.inputs.q
        return partial_attention(q, kv, self.kernel, self.plan.workload.value_dim)

    @staticmethod
    def _land(part: torch.Tensor, acc: torch.Tensor, empty: list[bool]) -> None:
        """A COMPUTE's partial lands in the accumulator (unless it is the accumulator itself)."""
        if part is not acc:
            if empty[0]:
                acc.copy_(part)  # merging into the identity gives the partial itself
            else:
                kernels.merge_into(acc, part.unsqueeze(0))
        empty[0] = False

    def _sent_on_wire(self, transfers: list[tuple[int, Op]], acc: torch.Tensor,
                      exchanged: set) -> tuple[dict[int | None, torch.Tensor], list[torch.Tensor]]:
        """The wire form of the accumulator's chunks a step sends (on a wire narrower than the
        accumulator): each chunk converted once however many it goes to, and the chunks of one
        contiguous run of rows in one conversion (two kernels, not two per chunk: a heads
        layout's root sends p - 1 chunks). Returns each chunk's view and the pooled buffers."""
        chunks = wire_converted(self.plan, (op for _, op in transfers), exchanged)
        sent: dict[int | None, torch.Tensor] = {}
        bufs: list[torch.Tensor] = []
        spans = sorted(((*self.plan.chunk_range(c), c) for c in chunks), key=lambda t: t[:2])  # as the runs
        i = 0
        for start, stop in contiguous_runs(span[:2] for span in spans):
            buf = to_wire(self.pool.take((stop - start, *self._row_shape(None)[1:]), self.wire_dtype), acc[start:stop])
            bufs.append(buf)
            while i < len(spans) and spans[i][1] <= stop:
                a, b, c = spans[i]
                sent[c] = buf[a - start:b - start]
                i += 1
        return sent, bufs

    def _step(self, ops: list[tuple[int, Op]], acc: torch.Tensor, blocks: dict[int, torch.Tensor],
              empty: list[bool], t_post: Mark) -> list[Mark]:
        """One step of transfers, with its COMPUTE (if any) running while they fly; ``t_post``:
        the step's post, when an empty message (none is sent) is done, as the simulator has it."""
        w = self.plan.workload
        compute = next((op for _, op in ops if op.kind is OpKind.COMPUTE), None)
        transfers = [(i, op) for i, op in ops if op.kind is not OpKind.COMPUTE]
        if not transfers:  # a COMPUTE alone
            part = self._partial(compute, blocks)
            t_compute = self._mark()
            self._land(part, acc, empty)
            return [t_compute]
        # The partials merged into one chunk land side by side in one buffer, so the step
        # merges each chunk once however many it receives (``merge_many_into``). An exchanged
        # chunk's (``stacked_exchanges``) holds every rank's partial in rank order, this rank's
        # as it sends it, so the ranks of the exchange merge the same bits in the same order.
        stacks: dict[int | None, torch.Tensor] = {}
        merging = [op.chunk for _, op in transfers if op.kind is OpKind.RECV_MERGE]
        exchanged = stacked_exchanges(self.plan, (op for _, op in ops))
        for chunk in dict.fromkeys(merging):
            count = merging.count(chunk) + (chunk in exchanged)
            stacks[chunk] = self.pool.take((count, *self._row_shape(chunk)), self.wire_dtype)
        slot: dict[int | None, int] = dict.fromkeys(stacks, 0)
        order = {c: sorted([self.rank, *(op.peer for _, op in transfers
                                        if op.kind is OpKind.RECV_MERGE and op.chunk == c)]) for c in exchanged}
        for c in exchanged:
            own = stacks[c][order[c].index(self.rank)]
            own.copy_(acc[self.rows_of(c)]) if self.plan.is_raw else to_wire(own, acc[self.rows_of(c)])
        posts: list[P2P] = []
        sent, wire_bufs = self._sent_on_wire(transfers, acc, exchanged)
        for _, op in transfers:
            if op.kind is OpKind.SEND:
                if op.block is not None:
                    tensor = self._block(blocks, op.block, op)
                elif op.chunk in exchanged:
                    tensor = stacks[op.chunk][order[op.chunk].index(self.rank)]
                elif op.chunk in sent:
                    tensor = sent[op.chunk]
                else:
                    tensor = acc[self.rows_of(op.chunk)]
                posts.append(P2P(True, tensor, op.peer))
            elif op.block is not None:
                shape = kv_shape(w, w.split[op.block])
                posts.append(P2P(False, self.pool.take(shape, torch_dtype(w.kv_dtype)), op.peer))
            elif op.kind is OpKind.RECV_MERGE:
                at = order[op.chunk].index(op.peer) if op.chunk in exchanged else slot[op.chunk]
                posts.append(P2P(False, stacks[op.chunk][at], op.peer))
                slot[op.chunk] += 1
            else:
                posts.append(P2P(False, self.pool.take(self._row_shape(op.chunk), self.wire_dtype), op.peer))
        works = self.comm.post(posts)
        first = first_uses(works)  # ops of one NCCL batch with one peer share a work: waited (and marked) once
        own: dict[int, Mark] = {}  # CUDA: each work's own completion, marked before the compute is queued
        if self.comm.cuda and self.timed:
            own = {id(work): self.comm.done_mark(work, slot) for slot, work in enumerate(compress(works, first))}
        part = None
        t_compute: Mark = 0.0
        if compute is not None:
            part = self._partial(compute, blocks)  # while the transfers fly
            t_compute = self._mark()
        done: list[Mark] = []
        for (_, op), work, new in zip(transfers, works, first, strict=True):
            if work is None:  # an empty message: nothing was posted
                done.append(t_post)
                continue
            if new:
                self.comm.wait(work, f"{op.kind.value} chunk {op.chunk} with rank {op.peer} (step {op.step})")
            done.append(own[id(work)] if own else self._mark())
        if own:
            self.comm.join_sides(len(own))
        # What the step computed and received lands only now, at its end (IR semantics). A
        # step never both copies into and merges into one chunk, nor computes beside a copy
        # (the validator's rules), so their order does not matter, and merges commute.
        for tensor in wire_bufs:  # sent: nothing reads them any more
            self.pool.release(tensor)
        if part is not None:
            self._land(part, acc, empty)
        for (_, op), post in zip(transfers, posts, strict=True):
            if op.kind is OpKind.RECV_COPY:
                if op.block is not None:
                    blocks[op.block] = post.tensor  # held to the end of the iteration
                else:
                    target = acc[self.rows_of(op.chunk)]
                    target.copy_(post.tensor) if self.plan.is_raw else from_wire(target, post.tensor)
                    self.pool.release(post.tensor)
        for chunk, stack in stacks.items():
            target = acc[self.rows_of(chunk)]
            if self.plan.is_raw:
                (kernels.sum_stack_into if chunk in exchanged else kernels.add_stack_into)(target, stack)
            elif chunk in exchanged:
                kernels.merged_into(target, stack)
            else:
                kernels.merge_into(target, stack)
            self.pool.release(stack)
        if stacks or any(op.kind is OpKind.RECV_COPY and op.block is None for _, op in transfers):
            empty[0] = False
        out: list[Mark] = []
        it = iter(done)
        for _, op in ops:
            out.append(t_compute if op.kind is OpKind.COMPUTE else next(it))
        return out
