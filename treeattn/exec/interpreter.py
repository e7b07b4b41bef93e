"""Execute a Plan on one rank with torch.distributed, exactly as ``treeattn.plan.ir`` says.

Per step: the ops of the step are posted together (SENDs read the accumulator as it stood
when the step began, RECVs land in fresh buffers), every op is awaited, and only then are
the received rows stored (RECV_COPY) or merged (RECV_MERGE: the partials a step receives
for one chunk land side by side and are merged in one pass). COMPUTE and
COLLECTIVE ops are steps of their own. Each op gets a post and a completion timestamp; ops
of one step are awaited in program order, so an op's completion time is when it *and the
ops before it in the step* had completed.

Legend: acc is the packed accumulator ``(rows, D + 1)`` fp32 for attention plans (see
``treeattn.exec.merge``) or the raw buffer ``(rows,)`` for raw payload plans; a KV block is
``(2, B, Hkv, N_j, D)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import groupby

import torch

from treeattn.errors import ExecutionError, PlanInvalidError
from treeattn.exec.attention import partial_attention, torch_dtype
from treeattn.exec.comm import P2P, BufferPool, Comm
from treeattn.exec.merge import (
    clear_partial,
    empty_partial,
    merge_into,
    merge_many,
    merge_many_into,
    sum_into,
    sum_many_into,
)
from treeattn.plan.ir import Op, OpKind, Plan, chunk_rows

__all__ = ["FAULT_ENV", "OpTiming", "RankInputs", "PlanExecutor", "InjectedFault"]

FAULT_ENV = "TREEATTN_FAULT"
"""Test-only fault injection: ``RANK:OP:MODE`` makes rank RANK, before its OP-th plan op
(counted from 0 over the process's life), raise (MODE ``raise``) or die (``exit``)."""


class InjectedFault(ExecutionError):
    """Raised by the test-only fault injection (``TREEATTN_FAULT``)."""


@dataclass(frozen=True, slots=True)
class OpTiming:
    """When one op of the measured iteration was posted and completed (µs from the run's origin:
    the agreed start instant on one host, else the rank's own start)."""

    rank: int
    index: int
    op: Op
    post_us: float
    done_us: float


@dataclass(slots=True)
class RankInputs:
    """What one rank starts from: q and its own KV shard (attention) or its buffer (raw)."""

    q: torch.Tensor | None = None
    kv: torch.Tensor | None = None
    raw: torch.Tensor | None = None


def _parse_fault() -> tuple[int, int, str] | None:
    text = os.environ.get(FAULT_ENV, "")
    if not text:
        return None
    rank, op, mode = text.split(":")
    return int(rank), int(op), mode


class PlanExecutor:
    """Runs one rank's program of ``plan``; ``run`` is one iteration."""

    def __init__(self, plan: Plan, comm: Comm, inputs: RankInputs, kernel: str = "explicit") -> None:
        self.plan = plan
        self.comm = comm
        self.inputs = inputs
        self.kernel = kernel
        self.rank = comm.rank
        w = plan.workload
        self.rows = w.rows
        self.wire_dtype = torch_dtype(w.dtype if plan.is_raw else w.partial_dtype)
        self.steps = self._compile(plan.programs[self.rank])
        self._fault = _parse_fault()
        self._ops_done = 0
        self._pool = BufferPool(comm.device)
        self.timeline: list[OpTiming] = []
        self.origin: float | None = None
        """Where the next run's timeline counts from (``Comm.now`` seconds): the instant the
        ranks agreed to start, when the harness has one; else this rank's own start."""
        self._acc: torch.Tensor | None = None
        self._prepared = False

    def _compile(self, program: tuple[Op, ...]) -> list[list[tuple[int, Op]]]:
        steps: list[list[tuple[int, Op]]] = []
        last = None
        for step, group in groupby(enumerate(program), key=lambda item: item[1].step):
            ops = list(group)
            if last is not None and step < last:
                raise PlanInvalidError(f"rank {self.rank}: step {step} follows step {last}; steps must not decrease")
            last = step
            alone = [op for _, op in ops if op.kind in (OpKind.COMPUTE, OpKind.COLLECTIVE)]
            if alone and len(ops) > 1:
                raise PlanInvalidError(
                    f"rank {self.rank}: step {step} mixes a {alone[0].kind.value} op with other ops; "
                    "compute and collective ops are steps of their own"
                )
            if self.plan.is_raw and any(op.kind is OpKind.COMPUTE or op.block is not None for _, op in ops):
                raise PlanInvalidError(f"rank {self.rank}: step {step} computes or moves KV in a raw payload plan")
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
        else:
            if self._acc is None:
                self._acc = empty_partial(self.rows, w.head_dim, self.comm.device)
            else:
                clear_partial(self._acc)
        self._pool.release_all()  # the previous iteration's blocks and buffers are no longer read
        self._prepared = True

    def run(self) -> torch.Tensor:
        """Execute the rank's program once; returns its accumulator (see module legend), a
        buffer the next iteration reuses (copy it to keep it)."""
        if not self._prepared:
            self.prepare()
        self._prepared = False
        acc = self._acc
        blocks: dict[int, torch.Tensor] = {} if self.plan.is_raw else {self.rank: self.inputs.kv}
        trio: dict[str, torch.Tensor] = {}
        self.timeline = []
        start = self.comm.now() if self.origin is None else self.origin
        self.origin = None
        fresh = not self.plan.is_raw  # the accumulator holds the merge's identity until a step ran
        for ops in self.steps:
            first = ops[0][1]
            for index, _ in ops:
                self._maybe_fault(index)
            t_post = self.comm.now()
            if first.kind is OpKind.COMPUTE:
                kv = self._block(blocks, self.rank if first.block is None else first.block, first)
                part = partial_attention(self.inputs.q, kv, self.kernel)
                if fresh:
                    # Merging into the identity gives the partial itself: a copy, not a dozen
                    # kernels (about 200 us of CPU a rank at B4 on CPU ranks; the model charges none).
                    acc.copy_(part)
                else:
                    merge_into(acc, part)
                done = [self.comm.now()]
            elif first.kind is OpKind.COLLECTIVE:
                acc = self._collective(first, acc, trio)
                done = [self.comm.now()]
            else:
                done = self._transfer_step(ops, acc, blocks)
            for (index, op), t_done in zip(ops, done, strict=True):
                self.timeline.append(OpTiming(self.rank, index, op, (t_post - start) * 1e6, (t_done - start) * 1e6))
            fresh = False
        return acc

    def _maybe_fault(self, index: int) -> None:
        count = self._ops_done
        self._ops_done += 1
        if self._fault is None or self._fault[0] != self.rank or self._fault[1] != count:
            return
        if self._fault[2] == "exit":
            os._exit(17)
        raise InjectedFault(f"injected fault on rank {self.rank} at op {count} (program op {index})")

    def _rows(self, chunk: int | None) -> slice:
        start, stop = chunk_rows(self.rows, self.plan.chunks, chunk)
        return slice(start, stop)

    def _row_shape(self, chunk: int | None) -> tuple[int, ...]:
        """Shape of ``chunk``'s rows on the wire: raw elements, or packed partials (D + 1)."""
        rows = self._rows(chunk)
        n = rows.stop - rows.start
        return (n,) if self.plan.is_raw else (n, self.plan.workload.head_dim + 1)

    def _block(self, blocks: dict[int, torch.Tensor], block: int, op: Op) -> torch.Tensor:
        if block not in blocks:
            raise PlanInvalidError(f"rank {self.rank}: op {op.to_dict()} uses KV block {block}, which it does not hold")
        return blocks[block]

    def _transfer_step(self, ops: list[tuple[int, Op]], acc: torch.Tensor,
                       blocks: dict[int, torch.Tensor]) -> list[float]:
        w = self.plan.workload
        for _, op in ops:
            if op.kind is OpKind.RECV_MERGE and op.block is not None:
                raise PlanInvalidError(f"rank {self.rank}: recv_merge of KV block {op.block}; use recv_copy")
        # The partials merged into one chunk land side by side in one buffer, so the step
        # merges each chunk once however many it receives (``merge_many_into``).
        stacks: dict[int | None, torch.Tensor] = {}
        merging = [op.chunk for _, op in ops if op.kind is OpKind.RECV_MERGE]
        for chunk in dict.fromkeys(merging):
            stacks[chunk] = self._pool.take((merging.count(chunk), *self._row_shape(chunk)), self.wire_dtype)
        slot: dict[int | None, int] = dict.fromkeys(stacks, 0)
        posts: list[P2P] = []
        for _, op in ops:
            if op.kind is OpKind.SEND:
                if op.block is not None:
                    tensor = self._block(blocks, op.block, op)
                else:
                    tensor = acc[self._rows(op.chunk)]
                    if tensor.dtype != self.wire_dtype:
                        tensor = tensor.to(self.wire_dtype)
                posts.append(P2P(True, tensor, op.peer))
            elif op.block is not None:
                shape = (2, w.batch, w.kv_heads, w.split[op.block], w.head_dim)
                posts.append(P2P(False, self._pool.take(shape, torch_dtype(w.kv_dtype)), op.peer))
            elif op.kind is OpKind.RECV_MERGE:
                posts.append(P2P(False, stacks[op.chunk][slot[op.chunk]], op.peer))
                slot[op.chunk] += 1
            else:
                posts.append(P2P(False, self._pool.take(self._row_shape(op.chunk), self.wire_dtype), op.peer))
        works = self.comm.post(posts)
        done: list[float] = []
        if len(works) == len(posts):
            for (_, op), work in zip(ops, works, strict=True):
                self.comm.wait(work, f"{op.kind.value} chunk {op.chunk} with rank {op.peer} (step {op.step})")
                done.append(self.comm.now())
        else:  # NCCL coalesces a batch into fewer handles: one completion time for all
            for work in works:
                self.comm.wait(work, f"step {ops[0][1].step} with ranks {sorted({op.peer for _, op in ops})}")
            done = [self.comm.now()] * len(posts)
        # Merges and copies land only now, at the end of the step (IR semantics). A step
        # never both copies into and merges into one chunk (the validator's rule), so their
        # order does not matter, and merges commute.
        for (_, op), post in zip(ops, posts, strict=True):
            if op.kind is OpKind.RECV_COPY:
                if op.block is not None:
                    blocks[op.block] = post.tensor  # held to the end of the iteration
                else:
                    acc[self._rows(op.chunk)] = post.tensor.to(acc.dtype)
                    self._pool.release(post.tensor)
        for chunk, stack in stacks.items():
            target = acc[self._rows(chunk)]
            if self.plan.is_raw:
                sum_many_into(target, stack)
            else:
                merge_many_into(target, stack)
            self._pool.release(stack)
        return done

    # -- collectives -----------------------------------------------------------------------

    def _collective(self, op: Op, acc: torch.Tensor, trio: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = self._rows(op.chunk)
        what = f"collective {op.coll} {op.reduce} {op.part} over rows {rows.start}:{rows.stop} (step {op.step})"
        part = acc[rows]
        if self.plan.is_raw:
            if op.part != "partial" or op.reduce != "sum":
                raise PlanInvalidError(f"rank {self.rank}: {what} is not defined for a raw payload; use sum partial")
            if op.coll == "allreduce":
                self.comm.all_reduce(part, "sum", what)
            else:
                gathered = self.comm.all_gather(part, what)
                total = gathered[0].clone()
                for other in gathered[1:]:
                    sum_into(total, other)
                part.copy_(total)
            return acc
        combo = (op.coll, op.reduce, op.part)
        if combo == ("allgather", "merge", "partial"):
            part.copy_(merge_many(torch.stack(self.comm.all_gather(part.to(self.wire_dtype), what))))
        elif combo == ("allreduce", "merge", "partial"):
            # No library reduces with the merge: a max of lse, then one sum of (w * o, w) rows.
            m = self.comm.all_reduce(part[:, -1].contiguous(), "max", what + " (max lse)")
            w = _weights(part[:, -1], m)
            packed = torch.cat([w.unsqueeze(1) * part[:, :-1], w.unsqueeze(1)], dim=1).to(self.wire_dtype)
            packed = self.comm.all_reduce(packed, "sum", what + " (sum)").float()
            _finish(part, m, packed[:, :-1], packed[:, -1])
        elif combo in (("allreduce", "max", "lse"), ("allreduce", "sum", "num"), ("allreduce", "sum", "den")):
            self._trio(op.part, rows, part, trio, what)
        else:
            raise PlanInvalidError(
                f"rank {self.rank}: {what} is not executable; attention plans use allgather/allreduce merge "
                "partial or the trio allreduce max lse, allreduce sum num, allreduce sum den"
            )
        return acc

    def _trio(self, name: str, rows: slice, part: torch.Tensor, trio: dict[str, torch.Tensor], what: str) -> None:
        # Row-wise state, so the three parts may use different chunkings; each takes effect
        # only when all three have run over a row.
        d = part.shape[1] - 1
        if not trio:
            dev = part.device
            trio.update(m=torch.zeros(self.rows, device=dev), num=torch.zeros(self.rows, d, device=dev),
                        den=torch.zeros(self.rows, device=dev))
            for k in ("lse", "num", "den"):
                trio[f"has_{k}"] = torch.zeros(self.rows, dtype=torch.bool, device=dev)
        lse = part[:, -1]
        if name == "lse":
            trio["m"][rows] = self.comm.all_reduce(lse.contiguous(), "max", what)
        else:
            if not bool(trio["has_lse"][rows].all()):
                raise PlanInvalidError(
                    f"rank {self.rank}: {what} runs before allreduce max lse of its rows; this executor needs the "
                    "max first (the weights exp(lse - max) depend on it)"
                )
            w = _weights(lse, trio["m"][rows])
            if name == "num":
                num = (w.unsqueeze(1) * part[:, :-1]).to(self.wire_dtype)
                trio["num"][rows] = self.comm.all_reduce(num, "sum", what).float()
            else:
                trio["den"][rows] = self.comm.all_reduce(w, "sum", what)
        trio[f"has_{name}"][rows] = True
        full = trio["has_lse"][rows] & trio["has_num"][rows] & trio["has_den"][rows]
        if bool(full.any()):
            idx = torch.nonzero(full).flatten()
            sub = part[idx]
            gidx = idx + rows.start
            _finish(sub, trio["m"][gidx], trio["num"][gidx], trio["den"][gidx])
            part[idx] = sub
            for k in ("lse", "num", "den"):
                trio[f"has_{k}"][gidx] = False


def _weights(lse: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """exp(lse - m), 0 for empty rows, and no exp(nan) where every rank is empty (m = -inf)."""
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), torch.exp(lse - shift))


def _finish(part: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    """part <- (num / den, m + log den), the empty partial where den = 0."""
    live = den > 0
    safe = torch.where(live, den, torch.ones_like(den))
    part[:, :-1] = torch.where(live.unsqueeze(1), num / safe.unsqueeze(1), torch.zeros_like(num))
    part[:, -1] = torch.where(live, m + torch.log(safe), torch.full_like(m, float("-inf")))
