"""The methods treeattn is compared with, executed for real on their own code paths.

None of these reads a Plan: they are written the way their authors' code does it, so a bug
in the plan interpreter cannot hide in both. Their local arithmetic runs on the same fused
kernels as the plan's (``treeattn.exec.kernels``), so a comparison is of the schedules, and
the buffers they fill to send or receive come from a ``BufferPool`` the caller gives (one per
baseline, released before each iteration), as the plan's come from its executor's.
Every function is one iteration on one rank and returns its result rows, packed head-major:
every row (result ``all``), its own heads' rows (``heads``), or every row on the root
(``root``); ``treeattn.plan.baselines`` says which method delivers which layout.

* ``allreduce3``: the tree-attention paper's reference code: all-reduce max of lse, then
  all-reduce sums of exp(lse - max) * o and of exp(lse - max).
* ``allreduce2``: what an engineer writes first: all-reduce max of lse, then one sum of
  (w o, w): an all-reduce, or for ``heads`` a reduce-scatter, for ``root`` a reduce.
* ``allgather_merge``: Star Attention: all-gather every partial, merge locally.
* ``dcp_ag_rs``: vLLM's decode context parallel: attend every head over the local shard,
  all-gather the lse, reduce-scatter the outputs corrected by the merged lse (each rank ends
  with its heads). vLLM gathers the query's heads first; every method here starts from the
  whole query on every rank.
* ``dcp_a2a``: vLLM's all-to-all variant: all-to-all of the partials by head, local merge.
* ``ring_attention``: KV shards rotate around a ring (isend/irecv of the next block posted
  before computing on the current one), every rank merging each block's partial; the ring
  follows ``order`` (the topology's, as ``treeattn.search.rings`` finds it).
* ``library_collective``: raw payloads: the library's all-reduce, reduce-scatter or reduce.
"""

from __future__ import annotations

import torch

from treeattn.exec import kernels
from treeattn.exec.attention import kv_shape, partial_attention
from treeattn.exec.comm import P2P, BufferPool, Comm, distinct
from treeattn.exec.merge import lse_column, sum_shift, weights, wired
from treeattn.plan.ir import head_split
from treeattn.workload import Workload

__all__ = ["allreduce3", "allreduce2", "allgather_merge", "dcp_ag_rs", "dcp_a2a", "ring_attention",
           "library_collective", "allgather_sum", "run_attention_baseline", "run_raw_baseline", "segments"]



def segments(workload: Workload, world: int) -> list[tuple[int, int]]:
    """Per rank, the head-major rows of its own query heads (``treeattn.plan.ir.head_split``)."""
    out, at = [], 0
    for n in head_split(workload.q_heads, world):
        out.append((at * workload.batch, (at + n) * workload.batch))
        at += n
    return out


def _pool(pool: BufferPool | None, device: torch.device) -> BufferPool:
    """``pool``, else one of this call's own (whose buffers are then freed with the call)."""
    return pool if pool is not None else BufferPool(device)


def allreduce3(comm: Comm, q: torch.Tensor, kv: torch.Tensor, kernel: str,
               wire: torch.dtype = torch.float32, pool: BufferPool | None = None,
               value_dim: int | None = None) -> torch.Tensor:
    """The paper's three all-reduces on this rank's partial; returns the packed result.
    The weighted output travels in ``wire`` (the partial dtype); max and weights in fp32.
    The buffers this rank fills to send come from ``pool`` when given, as the plan's do.
    ``value_dim``: V's head dim (None: q's)."""
    part = partial_attention(q, kv, kernel, value_dim)
    m = comm.all_reduce(lse_column(part, _pool(pool, part.device), sum_shift(wire, comm.world)), "max",
                        "allreduce3 max lse")
    num = comm.all_reduce(kernels.weighted(part, m, wire, with_weight=False), "sum", "allreduce3 sum num", widen=True)
    den = comm.all_reduce(weights(part[:, -1], m), "sum", "allreduce3 sum den")
    kernels.finish(part, m, num, den)
    return part


def allreduce2(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
               wire: torch.dtype = torch.float32, result: str = "all", root: int = 0,
               pool: BufferPool | None = None) -> torch.Tensor:
    """All-reduce max of lse, then one library sum of (w o, w): all-reduce (``all``),
    reduce-scatter by head (``heads``: returns this rank's rows, finished in the partial's
    own) or reduce to ``root``. Buffers from ``pool`` when given."""
    part = partial_attention(q, kv, kernel, workload.value_dim)
    pool = _pool(pool, part.device)
    m = comm.all_reduce(lse_column(part, pool, sum_shift(wire, comm.world)), "max", "allreduce2 max lse")
    packed = kernels.weighted(part, m, wire)
    if result == "heads":
        segs = segments(workload, comm.world)
        got = _reduce_scatter_rows(comm, packed, segs, "allreduce2 reduce-scatter", pool)
        a, b = segs[comm.rank]
        out = part[a:b]  # packed holds what the sum needed of part: its rows are free to take the result
        kernels.finish(out, m[a:b], got[:, :-1], got[:, -1])
        return out
    if result == "root":
        total = comm.reduce(packed, root, "sum", "allreduce2 reduce", widen=True)
    else:
        total = comm.all_reduce(packed, "sum", "allreduce2 sum", widen=True)
    kernels.finish(part, m, total[:, :-1], total[:, -1])
    return part


def _reduce_scatter_rows(comm: Comm, x: torch.Tensor, segs: list[tuple[int, int]], what: str,
                         pool: BufferPool | None = None, in_place: bool = False) -> torch.Tensor:
    """Sum of every rank's ``x`` over this rank's rows (segments padded to the longest, as a
    caller of the library's reduce-scatter must when the heads do not split evenly; fp8's in
    fp32, ``Comm``'s ``widen``). The padded input and the output come from ``pool`` when
    given; with ``in_place``, where the segments are even, the output is this rank's rows of
    ``x`` (NCCL's in-place reduce-scatter, as a caller that may overwrite its input writes it).
    The padding is not written, as in the plan's reduce-scatter: it lands in rows its owner
    drops, and the library's sum is element-wise, so what it holds changes no kept row."""
    pool = _pool(pool, x.device)
    sizes = [b - a for a, b in segs]
    n = max(sizes)
    tail = tuple(x.shape[1:])
    even = min(sizes) == n
    if even:
        inp = x.contiguous()
    else:
        inp = pool.take((len(segs) * n, *tail), x.dtype)
        for j, (a, b) in enumerate(segs):
            inp[j * n:j * n + b - a] = x[a:b]
    a, b = segs[comm.rank]
    out = inp[a:b] if in_place and even else pool.take((n, *tail), x.dtype)
    return comm.reduce_scatter(out, inp, "sum", what, widen=True)[:sizes[comm.rank]]


def allgather_merge(comm: Comm, q: torch.Tensor, kv: torch.Tensor, kernel: str,
                    wire: torch.dtype = torch.float32, pool: BufferPool | None = None,
                    value_dim: int | None = None) -> torch.Tensor:
    """All-gather of every rank's packed partial, then one local k-way merge into the
    partial's own buffer. Its wire form and the gathered stack come from ``pool`` when given,
    as the plan's stack does: a buffer allocated per iteration pays fresh pages in the timed
    run (on CPU ranks; a GPU's caching allocator would not), which is the harness's cost, not
    the method's, and under a CUDA graph it must keep its address from capture to replay.
    ``value_dim``: V's head dim (None: q's)."""
    part = partial_attention(q, kv, kernel, value_dim)
    pool = _pool(pool, part.device)
    mine = wired(part, wire, pool)
    gathered = comm.all_gather(mine, "allgather-merge all-gather", out=pool.take((comm.world, *mine.shape), wire))
    return kernels.merged_into(part, gathered)  # the gather has completed: part is free to take the result


def dcp_ag_rs(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
              wire: torch.dtype = torch.float32, pool: BufferPool | None = None) -> torch.Tensor:
    """vLLM decode context parallel (all-gather + reduce-scatter); returns this rank's rows,
    written into the partial's own. Buffers from ``pool`` when given. vLLM first all-gathers
    the query's heads (tensor parallelism shards them): here, as for every method, each rank
    starts from the whole query."""
    p = comm.world
    part = partial_attention(q, kv, kernel, workload.value_dim)
    pool = _pool(pool, part.device)
    lse = lse_column(part, pool)
    lses = comm.all_gather(lse, "dcp-ag-rs all-gather lse", out=pool.take((p, *lse.shape), lse.dtype))
    total, corrected = kernels.corrected(part, lses, wire)
    segs = segments(workload, p)
    got = _reduce_scatter_rows(comm, corrected, segs, "dcp-ag-rs reduce-scatter", pool)
    a, b = segs[comm.rank]
    out = part[a:b]  # corrected holds what the sum needed of part: its rows are free to take the result
    out[:, :-1] = got  # the copy widens a narrow wire to fp32, exactly
    out[:, -1] = total[a:b]
    return out


def dcp_a2a(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
            wire: torch.dtype = torch.float32, pool: BufferPool | None = None) -> torch.Tensor:
    """vLLM decode context parallel (all-to-all): partials exchanged by head, merged locally
    into the partial's own rows; returns this rank's rows. Buffers from ``pool`` when given."""
    part = partial_attention(q, kv, kernel, workload.value_dim)
    pool = _pool(pool, part.device)
    sent = wired(part, wire, pool)
    segs = segments(workload, comm.world)
    a, b = segs[comm.rank]
    got = pool.take((comm.world * (b - a), sent.shape[1]), wire)
    comm.all_to_all(got, sent, [hi - lo for lo, hi in segs], "dcp-a2a all-to-all")
    # the exchange has completed: part (fp32 wire: what was sent) is free to take the result
    return kernels.merged_into(part[a:b], got.view(comm.world, b - a, sent.shape[1]))


def ring_attention(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
                   pool: BufferPool | None = None, order: list[int] | None = None) -> torch.Tensor:
    """Ring attention for decode: p - 1 rotations of the KV shards, compute overlapped.

    The ring visits ranks in ``order`` (default 0..p-1). At rotation s the rank at position i
    holds the block of position i - s; it posts the send of that block to the next position
    and the receive of the block of position i - s - 1 from the previous, computes on its
    block while they fly, merges, then waits. Blocks of 0 tokens are not sent, on either side
    (``Comm.post``'s rule for empty messages).
    """
    p, w = comm.world, workload
    order = list(range(p)) if order is None else list(order)
    i = order.index(comm.rank)
    nxt, prv = order[(i + 1) % p], order[(i - 1) % p]
    pool = pool if pool is not None else BufferPool(kv.device)
    acc = None
    current = kv
    for s in range(p):
        works: list = []
        incoming = None
        if s < p - 1:
            block = order[(i - s - 1) % p]
            incoming = pool.take(kv_shape(w, w.split[block]), kv.dtype)
            works = comm.post([P2P(True, current, nxt), P2P(False, incoming, prv)])
        part = partial_attention(q, current, kernel, w.value_dim)
        acc = part if acc is None else kernels.merge_into(acc, part.unsqueeze(0))
        for work in distinct(works):
            comm.wait(work, f"ring-attention rotation {s}")
        if incoming is not None:
            if current is not kv:
                pool.release(current)  # its send has completed
            current = incoming
    if current is not kv:
        pool.release(current)
    return acc


def library_collective(comm: Comm, buf: torch.Tensor, result: str = "all", root: int = 0,
                       pool: BufferPool | None = None) -> torch.Tensor:
    """Raw payload: the library's sum of ``buf`` for the layout: all-reduce, in place (every
    element); reduce-scatter (``heads``: returns this rank's even share of the elements,
    ``treeattn.plan.ir.head_split``, in place where the shares are even, else in a buffer of
    ``pool`` when given, as ``cost.memory`` counts it); reduce to ``root`` (in place). fp8
    travels as fp32: libraries lack fp8 sums. Callers keep their input by passing a copy."""
    if result == "all":
        return comm.all_reduce(buf, "sum", "allreduce sum")
    if result == "root":
        return comm.reduce(buf, root, "sum", "reduce sum")
    segs, at = [], 0
    for n in head_split(buf.shape[0], comm.world):
        segs.append((at, at + n))
        at += n
    return _reduce_scatter_rows(comm, buf, segs, "reduce-scatter sum", pool, in_place=True)


def allgather_sum(comm: Comm, buf: torch.Tensor, pool: BufferPool | None = None) -> torch.Tensor:
    """Raw payload, result ``all``: all-gather + merge as it is for a sum, every rank's ``buf``
    gathered (into a buffer of ``pool`` when given), then summed locally into ``buf``."""
    pool = _pool(pool, buf.device)
    gathered = comm.all_gather(buf, "allgather-merge all-gather", out=pool.take((comm.world, *buf.shape), buf.dtype))
    return kernels.sum_stack_into(buf, gathered)  # the gather has completed: buf is free to take the sum


def run_raw_baseline(name: str, comm: Comm, buf: torch.Tensor, result: str = "all", root: int = 0,
                     pool: BufferPool | None = None) -> torch.Tensor:
    """Dispatch a raw payload's baseline by name (``allreduce``: the library's collective for
    the layout; ``allgather-merge``: ``allgather_sum``), on ``buf`` in place where it can."""
    if name == "allreduce":
        return library_collective(comm, buf, result, root, pool)
    if name == "allgather-merge":
        return allgather_sum(comm, buf, pool)
    raise ValueError(f"unknown raw baseline {name!r}")


def run_attention_baseline(name: str, comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload,
                           kernel: str, wire: torch.dtype, pool: BufferPool | None = None, *, result: str = "all",
                           root: int = 0, order: list[int] | None = None) -> torch.Tensor:
    """Dispatch an attention baseline by name (``treeattn.plan.baselines.baselines_for`` lists
    them; ``result`` and ``root`` for ``allreduce2``, ``order`` for ``ring-attention``; ``pool``
    lends every baseline's buffers: one pool per baseline, released before each iteration)."""
    if name == "allreduce3":
        return allreduce3(comm, q, kv, kernel, wire, pool, workload.value_dim)
    if name == "allreduce2":
        return allreduce2(comm, q, kv, workload, kernel, wire, result, root, pool)
    if name == "allgather-merge":
        return allgather_merge(comm, q, kv, kernel, wire, pool, workload.value_dim)
    if name == "dcp-ag-rs":
        return dcp_ag_rs(comm, q, kv, workload, kernel, wire, pool)
    if name == "dcp-a2a":
        return dcp_a2a(comm, q, kv, workload, kernel, wire, pool)
    if name == "ring-attention":
        return ring_attention(comm, q, kv, workload, kernel, pool, order)
    raise ValueError(f"unknown baseline {name!r}")
