"""The methods treeattn is compared with, executed for real on their own code paths.

None of these reads a Plan: they are written the way their authors' code does it, so a bug
in the plan interpreter cannot hide in both. Every function is one iteration on one rank
and returns the full result (every rank ends with it).

* ``allreduce3``: the tree-attention paper's reference code: all-reduce max of lse, then
  all-reduce sums of exp(lse - max) * o and of exp(lse - max).
* ``allgather_merge``: Star Attention / vLLM decode context parallel: all-gather every
  partial, merge locally.
* ``ring_attention``: KV shards rotate around the ring (isend/irecv of the next block posted
  before computing on the current one), every rank merging each block's partial.
* ``library_allreduce``: raw payloads: the library's all-reduce sum.
"""

from __future__ import annotations

import torch

from treeattn.exec.attention import partial_attention
from treeattn.exec.comm import P2P, BufferPool, Comm
from treeattn.exec.merge import merge_into, merge_many, pack, unpack
from treeattn.workload import Workload

__all__ = ["ATTENTION_BASELINES", "RAW_BASELINES", "allreduce3", "allgather_merge", "ring_attention",
           "library_allreduce", "run_attention_baseline"]

ATTENTION_BASELINES = ("allreduce3", "allgather-merge", "ring-attention")
RAW_BASELINES = ("allreduce",)


def allreduce3(comm: Comm, q: torch.Tensor, kv: torch.Tensor, kernel: str,
               wire: torch.dtype = torch.float32) -> torch.Tensor:
    """The paper's three all-reduces on this rank's partial; returns the packed result.
    The weighted output travels in ``wire`` (the partial dtype); max and weights in fp32."""
    o, lse = unpack(partial_attention(q, kv, kernel))
    m = comm.all_reduce(lse.clone(), "max", "allreduce3 max lse")
    # Rows empty on every rank keep max -inf: their weights must be 0, not exp(nan).
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.where(torch.isneginf(lse), torch.zeros_like(lse), torch.exp(lse - shift))
    num = comm.all_reduce((o * w.unsqueeze(1)).to(wire), "sum", "allreduce3 sum num").float()
    den = comm.all_reduce(w, "sum", "allreduce3 sum den")
    live = den > 0
    safe = torch.where(live, den, torch.ones_like(den))
    out_o = torch.where(live.unsqueeze(1), num / safe.unsqueeze(1), torch.zeros_like(num))
    out_l = torch.where(live, m + torch.log(safe), torch.full_like(m, float("-inf")))
    return pack(out_o, out_l)


def allgather_merge(comm: Comm, q: torch.Tensor, kv: torch.Tensor, kernel: str,
                    wire: torch.dtype = torch.float32) -> torch.Tensor:
    """All-gather of every rank's packed partial, then one local k-way merge."""
    mine = partial_attention(q, kv, kernel).to(wire)
    return merge_many(torch.stack(comm.all_gather(mine, "allgather-merge all-gather")))


def ring_attention(comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload, kernel: str,
                   pool: BufferPool | None = None) -> torch.Tensor:
    """Ring attention for decode: p - 1 rotations of the KV shards, compute overlapped.

    At rotation s rank r holds block (r - s) mod p; it posts the send of that block to
    r + 1 and the receive of block (r - s - 1) mod p from r - 1, computes on its block
    while they fly, merges, then waits. Blocks of 0 tokens still travel (0 bytes) so every
    rank keeps the same message sequence.
    """
    p, r, w = comm.world, comm.rank, workload
    pool = pool if pool is not None else BufferPool(kv.device)
    acc = None
    current = kv
    for s in range(p):
        works: list = []
        incoming = None
        if s < p - 1:
            nxt = (r - s - 1) % p
            shape = (2, w.batch, w.kv_heads, w.split[nxt], w.head_dim)
            incoming = pool.take(shape, kv.dtype)
            works = comm.post([P2P(True, current, (r + 1) % p), P2P(False, incoming, (r - 1) % p)])
        part = partial_attention(q, current, kernel)
        acc = part if acc is None else merge_into(acc, part)
        for work in works:
            comm.wait(work, f"ring-attention rotation {s}")
        if incoming is not None:
            if current is not kv:
                pool.release(current)  # its send has completed
            current = incoming
    if current is not kv:
        pool.release(current)
    return acc


def library_allreduce(comm: Comm, buf: torch.Tensor) -> torch.Tensor:
    """Raw payload: the library's all-reduce sum of ``buf``, in place (fp8 travels as fp32:
    libraries lack fp8 sums); callers keep their input by passing a copy."""
    return comm.all_reduce(buf, "sum", "allreduce sum")


def run_attention_baseline(name: str, comm: Comm, q: torch.Tensor, kv: torch.Tensor, workload: Workload,
                           kernel: str, wire: torch.dtype, pool: BufferPool | None = None) -> torch.Tensor:
    """Dispatch one of ``ATTENTION_BASELINES`` by name."""
    if name == "allreduce3":
        return allreduce3(comm, q, kv, kernel, wire)
    if name == "allgather-merge":
        return allgather_merge(comm, q, kv, kernel, wire)
    if name == "ring-attention":
        return ring_attention(comm, q, kv, workload, kernel, pool)
    raise ValueError(f"unknown baseline {name!r}")

