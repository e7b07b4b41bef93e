"""The COLLECTIVE forms of the Plan IR (``treeattn.plan.ir.COLLECTIVE_FORMS``) on torch.distributed.

No library reduces with the merge operator, so the attention forms are built from sums and
maxima the way their authors' code does: ``allreduce``/``reducescatter``/``reduce merge
partial`` take an all-reduce max of the rows' lse m, then one sum of (w o, w) with
w = exp(lse - m) and finish o = sum(w o) / sum(w), lse = m + log sum(w); the paper's trio
runs the same three pieces as three calls; decode context parallel all-gathers the lse,
corrects its own output by the merged lse and reduce-scatters the corrected outputs.

Legend as in ``treeattn.exec.interpreter``: acc is the packed head-major accumulator; a
rank's *segment* is the rows it owns in a heads layout (``Plan.segments``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from treeattn.errors import PlanInvalidError
from treeattn.exec import kernels
from treeattn.exec.merge import sum_many_into, weights
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
            gathered = comm.all_gather(part, what)
            total = gathered[0].clone()
            if len(gathered) > 1:
                sum_many_into(total, torch.stack(gathered[1:]))
            part.copy_(total)
        else:
            got, where = _sum_to_owners(ex, op, part.clone(), rows, what)
            if got is not None:
                acc[where] = got
        return
    if op.coll == "allgather" and op.part == "partial":
        part.copy_(kernels.merged(torch.stack(comm.all_gather(part.to(wire), what))))
    elif form.group == "trio":
        _trio(ex, op.part, rows, part, state, what)
    elif form.group == "dcp":
        _dcp(ex, op, rows, part, acc, state, what)
    else:  # allreduce / reducescatter / reduce merge partial
        m = comm.all_reduce(part[:, -1].contiguous(), "max", what + " (max lse)")
        packed = kernels.weighted(part, m, wire)
        if op.coll == "allreduce":
            total = comm.all_reduce(packed, "sum", what + " (sum)")
            kernels.finish(part, m, total[:, :-1], total[:, -1])
        else:
            got, where = _sum_to_owners(ex, op, packed, rows, what + " (sum)")
            if got is not None:
                mine = acc[where]
                kernels.finish(mine, m[where.start - rows.start:where.stop - rows.start], got[:, :-1], got[:, -1])


def _sum_to_owners(ex: PlanExecutor, op: Op, x: torch.Tensor, rows: slice,
                   what: str) -> tuple[torch.Tensor | None, slice]:
    """Sum ``x`` (the rows ``rows``) over the ranks to where the plan wants them: to the root
    (``reduce``), to the chunk's owner (one chunk), or each rank its segment (reduce-scatter,
    segments padded to the longest when the heads do not split evenly). Returns this rank's
    summed rows and the accumulator rows they are for, or (None, ...) when it gets none."""
    plan, comm = ex.plan, ex.comm
    if op.coll == "reduce" or op.chunk is not None:
        root = op.peer if op.coll == "reduce" else plan.owner(op.chunk)
        comm.reduce(x, root, "sum", what)
        return (x, rows) if comm.rank == root else (None, rows)
    segs = plan.segments
    sizes = [b - a for a, b in segs]
    n = max(sizes)
    tail = tuple(x.shape[1:])
    if min(sizes) == n:
        inp = x.contiguous()
    else:
        inp = torch.zeros((len(segs) * n, *tail), dtype=x.dtype, device=x.device)
        for j, (a, b) in enumerate(segs):
            inp[j * n:j * n + b - a] = x[a - rows.start:b - rows.start]
    out = torch.empty((n, *tail), dtype=x.dtype, device=x.device)
    comm.reduce_scatter(out, inp, "sum", what)
    a, b = segs[comm.rank]
    return out[:b - a], slice(a, b)


def gather_query(ex: PlanExecutor, q: torch.Tensor, what: str) -> torch.Tensor:
    """Decode context parallel gathers the query: rank r holds the query heads of its
    segment (what tensor parallelism gives it: here the heads of its segment of ``q``);
    afterwards every rank holds them all."""
    p, hq = ex.comm.world, q.shape[1]
    shares = head_split(hq, p)
    n = max(shares)
    lo = sum(shares[:ex.comm.rank])
    mine = torch.zeros((q.shape[0], n, q.shape[2]), dtype=q.dtype, device=q.device)
    mine[:, :shares[ex.comm.rank]] = q[:, lo:lo + shares[ex.comm.rank]]
    parts = ex.comm.all_gather(mine, what)
    return torch.cat([t[:, :k] for t, k in zip(parts, shares, strict=True)], dim=1)


def _dcp(ex: PlanExecutor, op: Op, rows: slice, part: torch.Tensor, acc: torch.Tensor, state: dict,
         what: str) -> None:
    """vLLM's decode context parallel: all-gather lse, then reduce-scatter the corrected outputs."""
    if op.part == "lse":
        lses = torch.stack(ex.comm.all_gather(part[:, -1].contiguous(), what))
        total = torch.logsumexp(lses, dim=0)  # -inf where every rank is empty
        state["dcp"] = (rows, total, kernels.weighted(part, total, ex.wire_dtype, with_weight=False))
        return
    if "dcp" not in state or state["dcp"][0] != rows:
        raise PlanInvalidError(f"rank {ex.rank}: {what} runs before allgather copy lse of its rows; the outputs "
                               "are corrected by the gathered lse first")
    _, total, corrected = state.pop("dcp")
    got, where = _sum_to_owners(ex, op, corrected, rows, what)
    if got is not None:
        mine = acc[where]
        mine[:, :-1] = got.float()
        mine[:, -1] = total[where.start - rows.start:where.stop - rows.start]


def _trio(ex: PlanExecutor, name: str, rows: slice, part: torch.Tensor, state: dict, what: str) -> None:
    # Row-wise state, so the three parts may use different chunkings; each takes effect only
    # when all three have run over a row. Which rows have which part is known on the host
    # (the plan says), so nothing waits on the device to decide.
    trio = state.get("trio")
    d = part.shape[1] - 1
    if trio is None:
        dev = part.device
        trio = state["trio"] = dict(m=torch.zeros(ex.rows, device=dev), num=torch.zeros(ex.rows, d, device=dev),
                                    den=torch.zeros(ex.rows, device=dev))
        for k in ("lse", "num", "den"):
            trio[f"has_{k}"] = bytearray(ex.rows)
    lse = part[:, -1]
    if name == "lse":
        trio["m"][rows] = ex.comm.all_reduce(lse.contiguous(), "max", what)
    else:
        if not all(trio["has_lse"][rows]):
            raise PlanInvalidError(
                f"rank {ex.rank}: {what} runs before allreduce max lse of its rows; this executor needs the "
                "max first (the weights exp(lse - max) depend on it)"
            )
        if name == "num":
            num = kernels.weighted(part, trio["m"][rows], ex.wire_dtype, with_weight=False)
            trio["num"][rows] = ex.comm.all_reduce(num, "sum", what).float()
        else:
            trio["den"][rows] = ex.comm.all_reduce(weights(lse, trio["m"][rows]), "sum", what)
    trio[f"has_{name}"][rows] = b"\x01" * (rows.stop - rows.start)
    has = [trio[f"has_{k}"] for k in ("lse", "num", "den")]
    start = None
    for i in range(rows.start, rows.stop + 1):  # finish each run of rows that has all three
        full = i < rows.stop and all(h[i] for h in has)
        if full and start is None:
            start = i
        elif not full and start is not None:
            kernels.finish(part[start - rows.start:i - rows.start], trio["m"][start:i], trio["num"][start:i],
                           trio["den"][start:i])
            for h in has:
                h[start:i] = bytes(i - start)
            start = None
