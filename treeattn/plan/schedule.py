"""Schedules: emit the ops of tree, butterfly, ring and direct-exchange patterns into per-rank programs.

Every emitter here puts both sides of a transfer in the *same step number*. Such plans
cannot deadlock: the ranks at the smallest unfinished step find all their partners at that
step too. Within a step, ops are sorted by (peer, send-after-receive, chunk), so that the
sends from a to b and the receives at b from a appear in the same chunk order on both
sides, which is what FIFO matching needs.

Pipelining: ``chunk_ids[q]`` is the plan chunk carried as the q-th piece; piece q moves one
step after piece q - 1, so a chain of depth d with k pieces takes d + k - 1 steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from treeattn.plan.ir import Op, OpKind
from treeattn.plan.ir import _unchecked_op as _op
from treeattn.plan.trees import TreeInfo

__all__ = ["Programs", "emit_tree", "emit_butterfly", "emit_ring", "emit_direct", "emit_direct_scatter"]

_SEND, _MERGE, _COPY = OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY


class Programs:
    """Per-rank op lists under construction; ``build()`` sorts them canonically."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        # Per rank: (step, peer + 1, 0 receive / 1 send, chunk + 1, block + 1, op); the first five sort.
        self._ops: list[list[tuple]] = [[] for _ in range(ranks)]

    def compute(self, rank: int, step: int, block: int | None = None) -> None:
        self._ops[rank].append((step, 0, 0, 0, 0, _op(OpKind.COMPUTE, step, None, None, block)))

    def collective(self, rank: int, step: int, coll: str, reduce: str, part: str, chunk: int | None = None,
                   peer: int | None = None) -> None:
        self._ops[rank].append((step, 0, 0, 0, 0, _op(OpKind.COLLECTIVE, step, peer, chunk, None, coll, reduce, part)))

    def transfer(self, src: int, dst: int, step: int, chunk: int | None = None, *, copy: bool = False,
                 block: int | None = None) -> None:
        """A SEND at ``src`` and its RECV_MERGE (RECV_COPY when ``copy`` or ``block``) at ``dst``."""
        c = 0 if chunk is None else chunk + 1
        b = 0 if block is None else block + 1
        self._ops[src].append((step, dst + 1, 1, c, b, _op(_SEND, step, dst, chunk, block)))
        kind = _COPY if copy or block is not None else _MERGE
        self._ops[dst].append((step, src + 1, 0, c, b, _op(kind, step, src, chunk, block)))

    def build(self) -> tuple[tuple[Op, ...], ...]:
        out = []
        key = itemgetter(slice(0, 5))
        for items in self._ops:
            items.sort(key=key)
            out.append(tuple(t[5] for t in items))
        return tuple(out)


def emit_tree(progs: Programs, tree: TreeInfo, chunk_ids: Sequence[int], base: int, *,
              reduce: bool = True, broadcast: bool = True) -> int:
    """Pipelined reduce up ``tree`` and/or broadcast down it.

    Reduce: rank r (height h) sends piece q to its parent at step ``base + q + h``, the
    step after it has merged piece q from all of its children. Broadcast: the root sends
    piece q down as soon as it is reduced (step ``base + q + H``, H the root's height, while
    it receives piece q + 1), and a rank at depth d forwards it at ``base + q + H + d``.

    Args:
        progs: where to add the ops.
        tree: the checked tree.
        chunk_ids: plan chunks in pipeline order.
        base: the first step.
        reduce: emit the reduction (RECV_MERGE towards the root).
        broadcast: emit the broadcast (RECV_COPY away from the root).

    Returns:
        The first step after the last one used.
    """
    parents, height, depth = tree.parents, tree.height, tree.depth
    k = len(chunk_ids)
    if len(parents) == 1 or not k:
        return base
    last = base - 1
    if reduce:
        for r, par in enumerate(parents):
            if par < 0:
                continue
            s0 = base + height[r]
            for q, c in enumerate(chunk_ids):
                progs.transfer(r, par, s0 + q, c)
        last = max(last, base + height[tree.root] + k - 2)
    if broadcast:
        offset = base + (height[tree.root] if reduce else 0)
        for r, par in enumerate(parents):
            if par < 0:
                continue
            s0 = offset + depth[par]
            for q, c in enumerate(chunk_ids):
                progs.transfer(par, r, s0 + q, c, copy=True)
            last = max(last, s0 + k - 1)
    return last + 1


def emit_butterfly(progs: Programs, order: Sequence[int], chunks: int, base: int) -> int:
    """Recursive doubling all-reduce over positions ``order``, pipelined by chunk.

    With P2 the largest power of two <= p, the p - P2 extra positions first fold their
    partial into positions 0..p - P2 - 1, the first P2 positions exchange with partner
    ``i ^ 2^j`` in round j, and the folded positions get the result back (RECV_COPY).
    Chunk q of round j runs at step ``X + q + j``.

    Args:
        progs: where to add ops. order: rank at each position. chunks: plan chunks. base: first step.

    Returns:
        The first step after the last one used.
    """
    p = len(order)
    p2 = 1 << (p.bit_length() - 1)
    rem, rounds = p - p2, p2.bit_length() - 1
    for i in range(rem):
        for q in range(chunks):
            progs.transfer(order[p2 + i], order[i], base + q, q)
    x = base + (1 if rem else 0)
    for j in range(rounds):
        for i in range(p2):
            partner = order[i ^ (1 << j)]
            for q in range(chunks):
                progs.transfer(order[i], partner, x + j + q, q)
    for i in range(rem):
        for q in range(chunks):
            progs.transfer(order[i], order[p2 + i], x + rounds + q, q, copy=True)
    if p == 1:
        return base
    return x + rounds + chunks - 1 + (1 if rem else 0)


def emit_ring(progs: Programs, order: Sequence[int], pieces: int, base: int, *, owned: bool = False) -> int:
    """Ring reduce-scatter then all-gather over positions ``order``.

    The rows are cut into p segments of ``pieces`` chunks each (plan chunk ``s * pieces + q``
    is piece q of segment s). In reduce-scatter round t position i sends segment i - t to
    position i + 1, which merges it; after p - 1 rounds position i holds segment i + 1
    complete, and all-gather round t passes segment i + 1 - t on (RECV_COPY). Piece q of
    round t runs at step ``base + t + q`` (all-gather rounds follow at ``base + p - 1``).
    With ``owned`` (a heads layout) only the reduce-scatter runs, and segment labels follow
    the owners: the segment position i ends with is rank ``order[i]``'s own.

    Args:
        progs: where to add ops. order: rank at each position. pieces: chunks per segment. base: first step.
        owned: reduce-scatter only, each rank ending with its own segment.

    Returns:
        The first step after the last one used.
    """
    p = len(order)
    if p == 1:
        return base

    def segment(j: int) -> int:
        """Plan segment of ring segment j (the one position j - 1 ends with)."""
        return order[(j - 1) % p] if owned else j % p

    for t in range(p - 1):
        for i in range(p):
            src, dst = order[i], order[(i + 1) % p]
            rs = segment(i - t) * pieces
            ag = segment(i + 1 - t) * pieces
            for q in range(pieces):
                progs.transfer(src, dst, base + t + q, rs + q)
                if not owned:
                    progs.transfer(src, dst, base + p - 1 + t + q, ag + q, copy=True)
    return base + (p - 1 if owned else 2 * (p - 1)) + pieces - 1


def emit_direct(progs: Programs, groups: Sequence[Sequence[int]], chunk_ids: Sequence[int], base: int) -> int:
    """Direct exchange (all-to-all merge), in one or two phases, pipelined by chunk.

    Phase 1: inside each group, every rank sends its accumulator to every other member and
    merges what it receives: each then holds its group's merge. Phase 2 (several groups):
    the rank at position i of a group receives from the rank at position ``i % len(h)`` of
    every other group h (its peer along a rail when groups are nodes listed by rail), so it
    gets each other group's merge exactly once. Piece q of phase j runs at step
    ``base + j + q`` (phase 2 starts at ``base`` when every group is a single rank).

    Args:
        progs: where to add ops. groups: a partition of the ranks, members in position order
        (one group: a flat exchange). chunk_ids: plan chunks in pipeline order. base: first step.

    Returns:
        The first step after the last one used.
    """
    k = len(chunk_ids)
    last = base - 1
    first = 0
    if any(len(g) > 1 for g in groups):
        for g in groups:
            for u in g:
                for v in g:
                    if u != v:
                        for q, c in enumerate(chunk_ids):
                            progs.transfer(u, v, base + q, c)
        last = base + k - 1
        first = 1
    if len(groups) > 1:
        for gi, g in enumerate(groups):
            for i, r in enumerate(g):
                for hi, h in enumerate(groups):
                    if hi != gi:
                        for q, c in enumerate(chunk_ids):
                            progs.transfer(h[i % len(h)], r, base + first + q, c)
        last = base + first + k - 1
    return last + 1


def emit_direct_scatter(progs: Programs, ranks: int, pieces: int, base: int) -> int:
    """Direct reduce-scatter (a heads layout): every rank sends each other rank that rank's
    own segment (``pieces`` chunks, plan chunk ``s * pieces + q``) and merges what it gets
    for its own; piece q at step ``base + q``. What an all-to-all of partials does.

    Args:
        progs: where to add ops. ranks: p. pieces: chunks per segment. base: first step.

    Returns:
        The first step after the last one used.
    """
    if ranks == 1:
        return base
    for u in range(ranks):
        for v in range(ranks):
            if u != v:
                for q in range(pieces):
                    progs.transfer(u, v, base + q, v * pieces + q)
    return base + pieces
