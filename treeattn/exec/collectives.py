"""The COLLECTIVE forms of the Plan IR (``treeattn.plan.ir.COLLECTIVE_FORMS``) on torch.distributed.

No library reduces with the merge operator, so the attention forms are built from sums and
maxima the way their authors' code does, with the pieces of ``treeattn.exec.merge``:
``allreduce``/``reducescatter``/``reduce merge partial`` take an all-reduce max of the rows'
lse m, then one sum of the rows (w o, w) (``weighted``) and ``finish`` o = sum(w o) / sum(w),
lse = m + log sum(w); the paper's trio runs the same three pieces as three calls; decode
context parallel all-gathers the lse, corrects its own output by the merged lse and
reduce-scatters the corrected outputs. ``allgather merge partial`` merges the gathered stack
locally; ``alltoall merge partial`` the pieces of its own rows every rank sent it. Buffers
that receive come from the executor's pool (``PlanExecutor.pool``).

Legend as in ``treeattn.exec.interpreter``: acc is the packed head-major accumulator; a
rank's *segment* is the rows it owns in a heads layout (``Plan.segments``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from treeattn.errors import PlanInvalidError
from treeattn.exec import kernels
from treeattn.exec.merge import lse_column, sum_shift, weights, wire_cols, wired
from treeattn.plan.ir import COLLECTIVE_FORMS, Op, head_split

if TYPE_CHECKING:
    from treeattn.exec.interpreter import PlanExecutor

__all__ = ["run_collective", "gather_query"]


def run_collective(ex: PlanExecutor, op: Op, acc: torch.Tensor, state: dict, what: str) -> None:
    """Run one COLLECTIVE of ``ex``'s plan that updates the accumulator (every form but the
    query's gather, ``gather_query``) on its rank, in place."""
    form = COLLECTIVE_FORMS.get((op.coll, op.reduce, op.part))
    plan = ex.plan
    if form is None or plan.workload.kind not in form.payloads or form.effect == "none":
        raise PlanInvalidError(f"rank {ex.rank}: {what} is not executable for a {plan.workload.kind} payload")
    rows = ex.rows_of(op.chunk)
    part = acc[rows]
    comm, wire = ex.comm, ex.wire_dtype
    if plan.is_raw:
        if op.coll == "allreduce":
            comm.all_reduce(part, "sum", what)
        elif op.coll == "allgather":
            gathered = comm.all_gather(part, what, out=ex.pool.take((comm.world, *part.shape), part.dtype))
            kernels.sum_stack_into(part, gathered)
        else:  # in place where the library allows: a reduce into the root's rows, an even reduce-scatter
            got, where = _sum_to_owners(ex, op, part, rows, what, into=acc)
            if got is not None and got.data_ptr() != acc[where].data_ptr():
                acc[where] = got
        return
    if op.coll == "allgather" and op.part == "partial":
        # Every rank merges the same gathered stack (its own partial as the wire carried it),
        # so every rank ends with the same rows.
        mine = wired(part, wire, ex.pool)
        gathered = comm.all_gather(mine, what, out=ex.pool.take((comm.world, *mine.shape), wire))
        kernels.merged_into(part, gathered)
    elif op.coll == "alltoall":
        _alltoall_merge(ex, op.chunk, rows, part, acc, what)
    elif form.group == "trio":
        _trio(ex, op.part, rows, part, state, what)
    elif form.group == "dcp":
        _dcp(ex, op, rows, part, acc, state, what)
    else:  # allreduce / reducescatter / reduce merge partial
        m = comm.all_reduce(lse_column(part, ex.pool, sum_shift(wire, comm.world)), "max", what + " (max lse)")
        packed = kernels.weighted(part, m, wire)
        if op.coll == "allreduce":
            total = comm.all_reduce(packed, "sum", what + " (sum)", widen=True)
            kernels.finish(part, m, total[:, :-1], total[:, -1])
        else:
            got, where = _sum_to_owners(ex, op, packed, rows, what + " (sum)", widen=True)
            if got is not None:
                mine = acc[where]
                kernels.finish(mine, m[where.start - rows.start:where.stop - rows.start], got[:, :-1], got[:, -1])


def _alltoall_merge(ex: PlanExecutor, op_chunk: int | None, rows: slice, part: torch.Tensor, acc: torch.Tensor,
                    what: str) -> None:
    """vLLM's all-to-all variant: rank j gets every rank's rows of its own segment (the part
    of ``rows`` it owns) in one library all-to-all, and merges them into its accumulator."""
    comm, wire = ex.comm, ex.wire_dtype
    splits = list(ex.plan.owned_rows(op_chunk))
    if not any(splits):
        return
    mine = splits[comm.rank]
    cols = wire_cols(part.shape[1] - 1, wire)
    got = ex.pool.take((comm.world * mine, cols), wire)
    comm.all_to_all(got, wired(part, wire, ex.pool), splits, what)
    if mine:
        start = max(ex.plan.segments[comm.rank][0], rows.start)
        kernels.merged_into(acc[start:start + mine], got.view(comm.world, mine, cols))


def _sum_to_owners(ex: PlanExecutor, op: Op, x: torch.Tensor, rows: slice, what: str,
                   into: torch.Tensor | None = None, widen: bool = False) -> tuple[torch.Tensor | None, slice]:
    """Sum ``x`` (the rows ``rows``) over the ranks to where the plan wants them: to the root
    (``reduce``, in ``x`` itself), to the chunk's owner (one chunk), or each rank its segment
    (reduce-scatter, segments padded to the longest when the heads do not split evenly; into
    ``into``'s own rows where they are even: NCCL's in-place reduce-scatter, whose output is
    the rank's piece of its input). Returns this rank's summed rows (fp8's in fp32 with
    ``widen``: ``Comm.all_reduce``) and the accumulator rows they are for, or (None, ...) when
    it gets none; a non-root's ``x`` may be overwritten."""
    plan, comm = ex.plan, ex.comm
    if op.coll == "reduce" or op.chunk is not None:
        root = op.peer if op.coll == "reduce" else plan.owner(op.chunk)
        got = comm.reduce(x, root, "sum", what, widen=widen)
        return (got, rows) if comm.rank == root else (None, rows)
    segs = plan.segments
    n = max(b - a for a, b in segs)
    tail = tuple(x.shape[1:])
    if not plan.padded_runs:
        inp = x.contiguous()
    else:  # one copy per run of equal segments; the padding is not written: it lands in rows its owner drops
        inp = ex.pool.take((len(segs) * n, *tail), x.dtype)
        pieces = inp.view(len(segs), n, *tail)
        for first, stop, size in plan.padded_runs:
            at = segs[first][0] - rows.start
            pieces[first:stop, :size] = x[at:at + (stop - first) * size].view(stop - first, size, *tail)
    a, b = segs[comm.rank]
    out = into[a:b] if into is not None and not plan.padded_runs else ex.pool.take((n, *tail), x.dtype)
    got = comm.reduce_scatter(out, inp, "sum", what, widen=widen)
    return got[:b - a], slice(a, b)


def gather_query(ex: PlanExecutor, q: torch.Tensor, what: str) -> torch.Tensor:
    """Decode context parallel gathers the query: rank r holds the query heads of its
    segment (what tensor parallelism gives it: here the heads of its segment of ``q``);
    afterwards every rank holds them all."""
    p, hq = ex.comm.world, q.shape[1]
    shares = head_split(hq, p)
    n = max(shares)
    lo = sum(shares[:ex.comm.rank])
    mine = ex.pool.take((q.shape[0], n, q.shape[2]), q.dtype).zero_()
    mine[:, :shares[ex.comm.rank]] = q[:, lo:lo + shares[ex.comm.rank]]
    parts = ex.comm.all_gather(mine, what, out=ex.pool.take((p, *mine.shape), q.dtype))
    return torch.cat([t[:, :k] for t, k in zip(parts, shares, strict=True)], dim=1,
                     out=ex.pool.take(tuple(q.shape), q.dtype))


def _dcp(ex: PlanExecutor, op: Op, rows: slice, part: torch.Tensor, acc: torch.Tensor, state: dict,
         what: str) -> None:
    """vLLM's decode context parallel: all-gather lse, then reduce-scatter the corrected outputs."""
    if op.part == "lse":
        lse = lse_column(part, ex.pool)
        lses = ex.comm.all_gather(lse, what, out=ex.pool.take((ex.comm.world, *lse.shape), lse.dtype))
        total, weighted_o = kernels.corrected(part, lses, ex.wire_dtype)
        state["dcp"] = (rows, total, weighted_o)
        return
    if "dcp" not in state or state["dcp"][0] != rows:
        raise PlanInvalidError(f"rank {ex.rank}: {what} runs before allgather copy lse of its rows; the outputs "
                               "are corrected by the gathered lse first")
    _, total, corrected = state.pop("dcp")
    got, where = _sum_to_owners(ex, op, corrected, rows, what, widen=True)
    if got is not None:
        mine = acc[where]
        mine[:, :-1] = got  # the copy widens a narrow wire to fp32, exactly
        mine[:, -1] = total[where.start - rows.start:where.stop - rows.start]


def _trio(ex: PlanExecutor, name: str, rows: slice, part: torch.Tensor, state: dict, what: str) -> None:
    # Row-wise state, so the three parts may use different chunkings; each takes effect only
    # when all three have run over a row. Which rows have which part is known on the host
    # (the plan says), so nothing waits on the device to decide.
    trio = state.get("trio")
    d = part.shape[1] - 1
    if trio is None:
        take = ex.pool.take
        # Left unwritten: a row of each is written by its part before ``finish`` reads it.
        trio = state["trio"] = dict(m=take((ex.rows,), torch.float32), num=take((ex.rows, d), torch.float32),
                                    den=take((ex.rows,), torch.float32))
        for k in ("lse", "num", "den"):
            trio[f"has_{k}"] = np.zeros(ex.rows, dtype=bool)
    lse = part[:, -1]
    if name == "lse":
        shift = sum_shift(ex.wire_dtype, ex.comm.world)
        trio["m"][rows] = ex.comm.all_reduce(lse_column(part, ex.pool, shift), "max", what)
    else:
        if not trio["has_lse"][rows].all():
            raise PlanInvalidError(
                f"rank {ex.rank}: {what} runs before allreduce max lse of its rows; this executor needs the "
                "max first (the weights exp(lse - max) depend on it)"
            )
        if name == "num":
            num = kernels.weighted(part, trio["m"][rows], ex.wire_dtype, with_weight=False)
            trio["num"][rows] = ex.comm.all_reduce(num, "sum", what, widen=True)  # widened by the copy
        else:
            trio["den"][rows] = ex.comm.all_reduce(weights(lse, trio["m"][rows]), "sum", what)
    trio[f"has_{name}"][rows] = True
    has = [trio[f"has_{k}"] for k in ("lse", "num", "den")]
    full = has[0][rows] & has[1][rows] & has[2][rows]
    # finish each run of rows that now has all three (run edges where `full` flips)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], full, [False])).astype(np.int8)))
    for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        start, stop = rows.start + a, rows.start + b
        kernels.finish(part[a:b], trio["m"][start:stop], trio["num"][start:stop], trio["den"][start:stop])
        for h in has:
            h[start:stop] = False
