"""What a run's results are checked against, computed from the ranks' own inputs, on their devices.

* Attention, small (every rank's KV together at most ``EXACT_MAX_KV_BYTES``): rank 0 gathers
  the shards and computes the exact attention by a plain softmax over all tokens at once in
  fp64 (no merge involved), on its device; every row is checked.
* Attention, larger: ``SAMPLED_ROWS`` rows (the first and last row of every rank's heads and
  a seeded sample of the rest) are checked. Each rank computes, in fp64 on its device over its
  own shard, per sampled row the largest score m_i, l_i = sum exp(s - m_i) and
  u_i = sum exp(s - m_i) v; gathered, they give o = sum u_i e^(m_i - m) / L and
  lse = m + log L with m = max m_i, L = sum l_i e^(m_i - m): exact attention in fp64, by a
  two-level softmax written apart from the fp32 merge under test. Nothing of the size of the
  KV crosses the network or a host.
* Raw payloads: the fp64 sum of the buffers (small integers: exact in any order).

Legend as in ``treeattn.exec.attention``; rows are head-major (row = h * B + b).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from treeattn.exec.attention import kv_shape, split_kv, sub_seed
from treeattn.exec.comm import P2P, Comm
from treeattn.exec.merge import pack_heads
from treeattn.plan.ir import head_split
from treeattn.workload import Payload, RawPayload, Workload

__all__ = ["EXACT_MAX_KV_BYTES", "SAMPLED_ROWS", "TOKENS", "FP64_BLOCK_ELEMENTS", "Reference", "exact_attention",
           "row_stats", "combine_stats", "sample_rows", "compute_reference"]

EXACT_MAX_KV_BYTES = 256 << 20
"""Largest KV (all ranks, K and V, every batch element) checked exactly on every row; above
it, sampled rows are."""

SAMPLED_ROWS = 64
"""Rows checked above ``EXACT_MAX_KV_BYTES`` (besides the first and last of each rank's heads)."""

TOKENS = 1 << 16
"""Tokens converted to fp64 at once (bounds the reference's memory at long shards)."""

FP64_BLOCK_ELEMENTS = 1 << 21
"""Elements of a raw payload summed, or checked, at once (16 MiB of fp64): what the reference
and the check hold beside the buffers themselves, rather than a whole buffer in fp64."""


@dataclass(frozen=True)
class Reference:
    """The expected rows: ``values[i]`` is row ``rows[i]`` (every row in order when ``rows`` is None);
    packed partials ``(n, Dv + 1)`` fp32 or raw sums ``(n,)`` fp64, on the CPU."""

    values: torch.Tensor
    rows: torch.Tensor | None = None

    def span(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row indices within [start, stop), counted from ``start``; their expected values)."""
        if self.rows is None:
            return torch.arange(stop - start), self.values[start:stop]
        keep = (self.rows >= start) & (self.rows < stop)
        return self.rows[keep] - start, self.values[keep]


def exact_attention(q: torch.Tensor, shards: list[torch.Tensor], value_dim: int | None = None) -> torch.Tensor:
    """Exact attention of ``q`` over the concatenated ``shards`` (blocks of ``kv_shape``; V of
    ``value_dim`` values, None: D) by one softmax over all tokens in fp64, one batch element at
    a time.

    Returns:
        Packed ``(Hq * B, Dv + 1)`` fp32 on q's device; (0, -inf) rows when there is no token.
    """
    bsz, hq, d = q.shape
    dv = d if value_dim is None else value_dim
    shards = [split_kv(s, d, dv) for s in shards if s.shape[3] > 0]
    if not shards:
        return pack_heads(torch.zeros(bsz, hq, dv, device=q.device),
                          torch.full((bsz, hq), float("-inf"), device=q.device))
    hkv = shards[0][0].shape[1]
    g = hq // hkv
    fp64 = _fp64_block(hkv * max(k.shape[2] for k, _ in shards) * max(d, dv), q.device)
    outs, lses = [], []
    for b in range(bsz):
        qb = q[b].double().reshape(hkv, g, d)
        scores = torch.cat([torch.matmul(qb, fp64(k[b]).transpose(-1, -2)) for k, _ in shards], dim=-1)
        lse = torch.logsumexp(scores / math.sqrt(d), dim=-1)
        probs = torch.exp(scores / math.sqrt(d) - lse.unsqueeze(-1))
        o = torch.zeros((hkv, g, dv), dtype=torch.float64, device=q.device)
        at = 0
        for k, v in shards:
            n = k.shape[2]
            o += torch.matmul(probs[..., at:at + n], fp64(v[b]))
            at += n
        outs.append(o.reshape(hq, dv))
        lses.append(lse.reshape(hq))
        del scores, probs  # else the next element's scores are made beside these (``exec.footprint``)
    return pack_heads(torch.stack(outs), torch.stack(lses))


def _fp64_block(elements: int, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """A converter to fp64 through one buffer of ``elements``: each call's result (contiguous)
    is valid until the next call. Blocks of several sizes made and freed in turn would leave
    the allocator holding more than one (``exec.footprint`` counts one)."""
    block = torch.empty(elements, dtype=torch.float64, device=device)

    def fp64(x: torch.Tensor) -> torch.Tensor:
        return block[:x.numel()].view(x.shape).copy_(x)

    return fp64


def row_stats(q: torch.Tensor, kv: torch.Tensor, rows: torch.Tensor, value_dim: int | None = None) -> torch.Tensor:
    """Per row of ``rows`` (head-major indices), over this shard (a block of ``kv_shape``), in
    fp64: ``[m, l, u_0..u_Dv-1]`` (see the module docstring); an empty shard gives (-inf, 0, 0...).

    Returns:
        ``(len(rows), Dv + 2)`` fp64 on q's device.
    """
    bsz, hq, d = q.shape
    dv = d if value_dim is None else value_dim
    n = kv.shape[3]
    out = torch.zeros((len(rows), dv + 2), dtype=torch.float64, device=q.device)
    out[:, 0] = float("-inf")
    if n == 0:
        return out
    g = hq // kv.shape[2]
    scale = 1.0 / math.sqrt(d)
    keys, values = split_kv(kv, d, dv)
    fp64 = _fp64_block(min(n, TOKENS) * max(d, dv), q.device)
    for i, row in enumerate(rows.tolist()):
        h, b = divmod(row, bsz)
        k, v = keys[b, h // g], values[b, h // g]
        qv = q[b, h].double()
        scores = torch.cat([torch.mv(fp64(k[t:t + TOKENS]), qv) for t in range(0, n, TOKENS)]) * scale
        m = scores.max()
        p = torch.exp(scores - m)
        u = sum(torch.mv(fp64(v[t:t + TOKENS]).T, p[t:t + TOKENS]) for t in range(0, n, TOKENS))
        out[i, 0], out[i, 1], out[i, 2:] = m, p.sum(), u
    return out


def combine_stats(stats: torch.Tensor) -> torch.Tensor:
    """The packed rows ``(S, Dv + 1)`` fp32 from every rank's ``row_stats`` stacked ``(p, S, Dv + 2)``."""
    m_i, l_i, u_i = stats[..., 0], stats[..., 1], stats[..., 2:]
    m = m_i.max(dim=0).values
    scale = torch.where(torch.isneginf(m_i), torch.zeros_like(m_i), torch.exp(m_i - m.clamp(min=-1e300)))
    total = (l_i * scale).sum(dim=0)
    live = total > 0
    o = (u_i * scale.unsqueeze(-1)).sum(dim=0) / torch.where(live, total, torch.ones_like(total)).unsqueeze(-1)
    lse = torch.where(live, m + torch.log(torch.where(live, total, torch.ones_like(total))),
                      torch.full_like(m, float("-inf")))
    return torch.cat([o, lse.unsqueeze(1)], dim=1).float()


def sample_rows(workload: Workload, seed: int, world: int, count: int = SAMPLED_ROWS) -> torch.Tensor:
    """The rows a large case checks: the first and last row of every rank's query heads (so
    every rank of a ``heads`` layout checks some) and ``count`` more drawn from the seed; sorted."""
    w = workload
    chosen, at = set(), 0
    for n in head_split(w.q_heads, world):
        if n:
            chosen |= {at * w.batch, (at + n) * w.batch - 1}
        at += n
    gen = torch.Generator().manual_seed(sub_seed(seed, "rows"))
    chosen |= set(torch.randint(0, w.rows, (count,), generator=gen).tolist())
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def compute_reference(comm: Comm, payload: Payload, seed: int, mine: torch.Tensor, q: torch.Tensor | None,
                      contributors: tuple[int, ...] | None, exact_max_bytes: int = EXACT_MAX_KV_BYTES,
                      keep: bool = True) -> Reference | None:
    """The reference of a run, computed together by every rank (each calls it with its inputs).

    Args:
        comm: the ranks.
        payload: the workload or raw payload.
        seed: the run's seed (it picks the sampled rows).
        mine: this rank's KV shard or raw buffer.
        q: the query (attention).
        contributors: whose inputs count (None: every rank's).
        exact_max_bytes: where sampled rows take over (``EXACT_MAX_KV_BYTES``).
        keep: whether this rank keeps the result (it checks against it); every rank computes.

    Returns:
        The same ``Reference`` on every rank that keeps it; None on the others.
    """
    counts = contributors is None or comm.rank in contributors
    if isinstance(payload, RawPayload):
        return _raw_sum(comm, mine, counts, keep)
    w = payload
    if sum(w.kv_bytes(r) for r in range(w.ranks)) <= exact_max_bytes:
        values = _exact(comm, w, mine, q, contributors).cpu()
        return Reference(values) if keep else None
    rows = sample_rows(w, seed, comm.world)
    stats = row_stats(q, mine if counts else mine[:, :, :, :0], rows, w.value_dim)
    values = combine_stats(comm.all_gather(stats, "reference rows", setup=True)).cpu()
    return Reference(values, rows) if keep else None


def _raw_sum(comm: Comm, mine: torch.Tensor, counts: bool, keep: bool) -> Reference | None:
    """The fp64 sum of the contributing ranks' raw buffers, ``FP64_BLOCK_ELEMENTS`` at a time; None
    where not ``keep``."""
    total = torch.empty(mine.shape, dtype=torch.float64) if keep else None
    buf = torch.empty(min(mine.numel(), FP64_BLOCK_ELEMENTS), dtype=torch.float64, device=mine.device)
    for start in range(0, mine.numel(), FP64_BLOCK_ELEMENTS):
        src = mine[start:start + FP64_BLOCK_ELEMENTS]
        piece = buf[:len(src)]
        if counts:
            piece.copy_(src)
        else:
            piece.zero_()
        comm.all_reduce(piece, "sum", "reference sum", setup=True)
        if total is not None:
            total[start:start + len(piece)] = piece
    return Reference(total) if total is not None else None


def _exact(comm: Comm, w: Workload, mine: torch.Tensor, q: torch.Tensor,
           contributors: tuple[int, ...] | None) -> torch.Tensor:
    """Rank 0 gathers the contributors' shards, computes, and broadcasts the packed result."""
    who = range(comm.world) if contributors is None else sorted(set(contributors))
    if comm.rank == 0:
        shards, posts = [], []
        for r in who:
            if r == 0:
                shards.append(mine)
                continue
            buf = torch.empty(kv_shape(w, w.split[r]), dtype=mine.dtype, device=mine.device)
            shards.append(buf)
            posts.append(P2P(False, buf, r))
        for work in comm.post(posts):
            comm.wait(work, "reference gather", setup=True)
        out = exact_attention(q, shards, w.value_dim).float()
    else:
        if comm.rank in who:
            for work in comm.post([P2P(True, mine, 0)]):
                comm.wait(work, "reference gather", setup=True)
        out = torch.empty((w.rows, w.value_dim + 1), dtype=torch.float32, device=mine.device)
    return comm.broadcast(out, 0, "reference broadcast")
