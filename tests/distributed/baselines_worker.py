"""What each rank of the pooled-baseline tests runs (tasks of ``api_worker``; no test here).

``pooled``: every baseline of ``treeattn.exec.baselines`` against its allocation-per-call form,
kept here as it was written (``old_*``), on the same inputs: the pooled form must give the
same bits, take the same pool addresses on its second iteration and take no new slot.
``runner_pools``: the baselines ``_RankRun.methods`` sets up for a plan, run interleaved as
a timed run deals them out; records which buffers each one's iterations were lent.
"""

from __future__ import annotations

import torch

from treeattn.exec import baselines, kernels
from treeattn.exec.attention import make_kv_shard, make_query, make_raw, partial_attention
from treeattn.exec.comm import BufferPool, Comm
from treeattn.exec.merge import pack, sum_shift, weights, wired
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef, head_split
from treeattn.workload import RawPayload, Workload

REF = TopologyRef("cpu:test", "sha256:test")
segments = baselines.segments


# -- the allocation-per-call forms, verbatim ----------------------------------------------------

def old_allreduce3(comm: Comm, q: torch.Tensor, kv: torch.Tensor, kernel: str,
                   wire: torch.dtype = torch.float32) -> torch.Tensor:
    part = partial_attention(q, kv, kernel)
    m = comm.all_reduce(part[:, -1] + sum_shift(wire, comm.world), "max", "allreduce3 max lse")
    num = comm.all_reduce(kernels.weighted(part, m, wire, with_weight=False), "sum", "allreduce3 sum num",
                         widen=True)
    den = comm.all_reduce(weights(part[:, -1], m), "sum", "allreduce3 sum den")
    kernels.finish(part, m, num, den)
    return part


def old_allreduce2(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
                   wire: torch.dtype = torch.float32, result: str = "all", root: int = 0) -> torch.Tensor:
    part = partial_attention(q, kv, kernel)
    m = comm.all_reduce(part[:, -1] + sum_shift(wire, comm.world), "max", "allreduce2 max lse")
    packed = kernels.weighted(part, m, wire)
    if result == "heads":
        segs = segments(workload, comm.world)
        got = old_reduce_scatter_rows(comm, packed, segs, "allreduce2 reduce-scatter", widen=True)
        a, b = segs[comm.rank]
        out = torch.empty(b - a, packed.shape[1], dtype=torch.float32, device=packed.device)
        kernels.finish(out, m[a:b], got[:, :-1], got[:, -1])
        return out
    if result == "root":
        total = comm.reduce(packed, root, "sum", "allreduce2 reduce", widen=True)
    else:
        total = comm.all_reduce(packed, "sum", "allreduce2 sum", widen=True)
    kernels.finish(part, m, total[:, :-1], total[:, -1])
    return part


def old_reduce_scatter_rows(comm: Comm, x: torch.Tensor, segs: list[tuple[int, int]], what: str,
                            widen: bool = False) -> torch.Tensor:
    sizes = [b - a for a, b in segs]
    n = max(sizes)
    if min(sizes) == n:
        inp = x.contiguous()
    else:
        inp = torch.zeros((len(segs) * n, *x.shape[1:]), dtype=x.dtype, device=x.device)
        for j, (a, b) in enumerate(segs):
            inp[j * n:j * n + b - a] = x[a:b]
    out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return comm.reduce_scatter(out, inp, "sum", what, widen=widen)[:sizes[comm.rank]]


def old_allgather_merge(comm: Comm, q: torch.Tensor, kv: torch.Tensor, kernel: str,
                        wire: torch.dtype = torch.float32) -> torch.Tensor:
    mine = wired(partial_attention(q, kv, kernel), wire)
    return kernels.merged(comm.all_gather(mine, "allgather-merge all-gather"))


def old_dcp_ag_rs(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
                  wire: torch.dtype = torch.float32) -> torch.Tensor:
    part = partial_attention(q, kv, kernel)
    total, corrected = kernels.corrected(part, comm.all_gather(part[:, -1].contiguous(), "dcp-ag-rs all-gather lse"),
                                         wire)
    segs = segments(workload, comm.world)
    got = old_reduce_scatter_rows(comm, corrected, segs, "dcp-ag-rs reduce-scatter", widen=True).float()
    a, b = segs[comm.rank]
    return pack(got, total[a:b])


def old_dcp_a2a(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
                wire: torch.dtype = torch.float32) -> torch.Tensor:
    part = wired(partial_attention(q, kv, kernel), wire)
    segs = segments(workload, comm.world)
    a, b = segs[comm.rank]
    got = torch.empty((comm.world * (b - a), part.shape[1]), dtype=wire, device=part.device)
    comm.all_to_all(got, part, [hi - lo for lo, hi in segs], "dcp-a2a all-to-all")
    return kernels.merged(got.view(comm.world, b - a, part.shape[1]))


def old_library_collective(comm: Comm, buf: torch.Tensor, result: str = "all", root: int = 0) -> torch.Tensor:
    if result == "all":
        return comm.all_reduce(buf, "sum", "allreduce sum")
    if result == "root":
        return comm.reduce(buf, root, "sum", "reduce sum")
    segs, at = [], 0
    for n in head_split(buf.shape[0], comm.world):
        segs.append((at, at + n))
        at += n
    return old_reduce_scatter_rows(comm, buf, segs, "reduce-scatter sum")


# -- the tasks ----------------------------------------------------------------------------------

class RecordingPool(BufferPool):
    """A pool that notes each buffer it lends: (what ran, its iteration, first and last byte + 1)."""

    log: list[tuple[str, int, int, int, int]] = []
    """Every take of every such pool: (what, iteration, pool id, start, end)."""
    now: tuple[str, int] = ("", 0)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buf = super().take(shape, dtype)
        start = buf.data_ptr()
        RecordingPool.log.append((*RecordingPool.now, id(self), start, start + buf.numel() * buf.element_size()))
        return buf


def _comm(rank: int, p: int) -> Comm:
    return Comm(rank, p, "gloo", torch.device("cpu"), op_timeout_s=60.0, setup_timeout_s=60.0)


def _cases(p: int):  # noqa: ANN202 - a generator of (label, old call, new call taking a pool)
    """Every baseline, on heads that split evenly over the ranks and heads that do not (the
    padded reduce-scatter; 2 heads on 3 ranks leave one rank none), in each wire dtype."""
    fp8 = getattr(torch, "float8_e4m3fn", None)
    for q_heads, kv_heads in ((6, 2), (4, 2), (2, 1)):
        split = tuple([9, 0, *[5 + 4 * i for i in range(p - 2)]])
        for wire in (torch.float32, torch.bfloat16, *([fp8] if fp8 is not None else [])):
            w = Workload(batch=2, q_heads=q_heads, kv_heads=kv_heads, head_dim=8, split=split, kv_dtype="fp32",
                         partial_dtype={torch.float32: "fp32", torch.bfloat16: "bf16"}.get(wire, "fp8"))
            tag = f"{q_heads}/{kv_heads} heads, {wire}"
            yield (f"allreduce3 {tag}", w, lambda c, q, kv, w, wire=wire: old_allreduce3(c, q, kv, "explicit", wire),
                   lambda c, q, kv, w, pool, wire=wire: baselines.allreduce3(c, q, kv, "explicit", wire, pool))
            for result, root in (("all", 0), ("heads", 0), ("root", p - 1)):
                yield (f"allreduce2 {result} {tag}", w,
                       lambda c, q, kv, w, wire=wire, r=result, o=root: old_allreduce2(c, q, kv, w, "explicit", wire,
                                                                                       r, o),
                       lambda c, q, kv, w, pool, wire=wire, r=result, o=root: baselines.allreduce2(
                           c, q, kv, w, "explicit", wire, r, o, pool))
            yield (f"allgather-merge {tag}", w,
                   lambda c, q, kv, w, wire=wire: old_allgather_merge(c, q, kv, "explicit", wire),
                   lambda c, q, kv, w, pool, wire=wire: baselines.allgather_merge(c, q, kv, "explicit", wire, pool))
            yield (f"dcp-ag-rs {tag}", w, lambda c, q, kv, w, wire=wire: old_dcp_ag_rs(c, q, kv, w, "explicit", wire),
                   lambda c, q, kv, w, pool, wire=wire: baselines.dcp_ag_rs(c, q, kv, w, "explicit", wire, pool))
            yield (f"dcp-a2a {tag}", w, lambda c, q, kv, w, wire=wire: old_dcp_a2a(c, q, kv, w, "explicit", wire),
                   lambda c, q, kv, w, pool, wire=wire: baselines.dcp_a2a(c, q, kv, w, "explicit", wire, pool))


def pooled(rank: int, p: int):  # noqa: ANN201 - a generator of result dicts
    """Each baseline's pooled form against its allocation-per-call form (``old_*``), bit for bit,
    over two iterations of one pool; and the raw payload's library collectives likewise."""
    comm = _comm(rank, p)
    for label, w, old, new in _cases(p):
        q, kv = make_query(w, 5, "cpu"), make_kv_shard(w, rank, 5, "cpu")
        expected = old(comm, q, kv, w)
        yield _two_iterations(label, expected, lambda pool, w=w, q=q, kv=kv, new=new: new(comm, q, kv, w, pool))
    for nbytes, dtype in ((4 * 24, "fp32"), (4 * 23, "fp32"), (2 * 22, "bf16")):  # even and uneven shares
        raw = RawPayload(nbytes=nbytes, ranks=p, dtype=dtype)
        buf = make_raw(raw, rank, 5, "cpu")
        for result, root in (("all", 0), ("heads", 0), ("root", p - 1)):
            expected = old_library_collective(comm, buf.clone(), result, root)
            yield _two_iterations(f"library {result} {nbytes} B {dtype}", expected,
                                  lambda pool, b=buf, r=result, o=root: baselines.library_collective(
                                      comm, b.clone(), r, o, pool))


def _two_iterations(label: str, expected: torch.Tensor, call) -> dict:  # noqa: ANN001 - pool -> result
    pool = RecordingPool(torch.device("cpu"))
    got, lent, held = [], [], []
    for it in range(2):
        pool.release_all()  # what the runner's prepare does before every iteration
        RecordingPool.log.clear()
        RecordingPool.now = (label, it)
        got.append(call(pool).clone())
        lent.append([(start, end) for *_, start, end in RecordingPool.log])
        held.append(pool.nbytes)
    return {"label": label, "equal": [bool(torch.equal(g, expected)) for g in got],
            "dtype": [str(g.dtype) for g in got], "expected_dtype": str(expected.dtype),
            "takes": len(lent[0]), "same_addresses": lent[0] == lent[1], "held": held}


def runner_pools(rank: int, p: int):  # noqa: ANN201 - a generator of result dicts
    """The baselines the runner sets up for an attention plan (``all`` and ``heads``) and a
    raw one (``heads`` and ``all``), run twice in turn as a timed run deals them out: every buffer each
    one took, per iteration."""
    import treeattn.exec.runner as runner

    runner.BufferPool = RecordingPool  # the pools the runner makes for its baselines
    comm = _comm(rank, p)
    w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=tuple([9, 0, *[5] * (p - 2)]), kv_dtype="fp32",
                 partial_dtype="bf16")
    plans = [runner.PlanJob("all", build("binomial", w, REF)),
             runner.PlanJob("heads", build("ring", w, REF, result="heads")),
             runner.PlanJob("raw", build("ring", RawPayload(nbytes=4 * 23, ranks=p), REF, result="heads")),
             runner.PlanJob("rawall", build("ring", RawPayload(nbytes=4 * 23, ranks=p), REF))]
    job = runner.Job(tuple(plans), runner.RunOptions(baselines=True, backend="gloo"))
    run = runner._RankRun(job, comm, {})
    timed = [t for pj in plans for t in run.methods(pj) if t.method != "plan"]
    RecordingPool.log.clear()
    for it in range(2):
        for t in timed:
            RecordingPool.now = (f"{t.label} {t.method}", it)
            t.prepare()
            t.fn()
    yield {"methods": [f"{t.label} {t.method}" for t in timed], "log": RecordingPool.log}
