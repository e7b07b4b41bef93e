"""A plan read into flat per-op arrays for the simulator (``treeattn.cost.simulate``).

Ops are numbered globally (gid), rank by rank; ``offset[r]`` is rank r's first. Per rank,
its steps are gid ranges; per step, the bytes its merges and copies move (merged rows count
3 times: read both, write one; copied rows twice), the kernels they take (a chunk merged
into counts one, however many partials it receives; the copies one between them) and its
COMPUTE's gid (-1: none).
"""

from __future__ import annotations

from dataclasses import dataclass

from treeattn.cost.compute import ComputeModel
from treeattn.errors import PlanInvalidError
from treeattn.plan.ir import Op, OpKind, Plan, message_bytes

__all__ = ["Program", "compile_plan"]

_COMPUTE, _SEND, _RECV_MERGE, _RECV_COPY, _COLL = 0, 1, 2, 3, 4
_KIND_CODE = {
    OpKind.COMPUTE: _COMPUTE,
    OpKind.SEND: _SEND,
    OpKind.RECV_MERGE: _RECV_MERGE,
    OpKind.RECV_COPY: _RECV_COPY,
    OpKind.COLLECTIVE: _COLL,
}


@dataclass(slots=True)
class Program:
    """Every rank's program as flat arrays (see the module docstring)."""

    kind: list[int]
    peer: list[int]
    nbytes: list[int]
    rank_of: list[int]
    ops: list[Op]
    offset: list[int]
    steps: list[list[tuple[int, int]]]
    merge_b: list[list[int]]
    merge_k: list[list[int]]
    step_compute: list[list[int]]

    def pair(self, p: int) -> list[int]:
        """Per op its partner (-1: none): the k-th SEND a->b matches the k-th RECV at b from a."""
        kind, peer, rank_of, ops = self.kind, self.peer, self.rank_of, self.ops
        sends: dict[int, list[int]] = {}
        recvs: dict[int, list[int]] = {}
        for gid, code in enumerate(kind):
            if code == _SEND:
                sends.setdefault(rank_of[gid] * p + peer[gid], []).append(gid)
            elif code == _RECV_MERGE or code == _RECV_COPY:
                recvs.setdefault(peer[gid] * p + rank_of[gid], []).append(gid)
        partner = [-1] * len(kind)
        off = self.offset
        for key, ss in sends.items():
            rs = recvs.get(key, ())
            for s, q in zip(ss, rs, strict=False):
                so, qo = ops[s], ops[q]
                if so.chunk != qo.chunk or so.block != qo.block:
                    sr, qr = rank_of[s], rank_of[q]
                    raise PlanInvalidError(
                        f"rank {sr} op {s - off[sr]} sends chunk {so.chunk} block {so.block} to rank {qr}, "
                        f"whose matching op {q - off[qr]} receives chunk {qo.chunk} block {qo.block} "
                        "(the k-th send a->b matches the k-th receive at b from a)"
                    )
                partner[s], partner[q] = q, s
        return partner


def compile_plan(plan: Plan, p: int, cm: ComputeModel) -> Program:
    """Read ``plan`` (of ``p`` ranks) into a ``Program``; raises ``PlanInvalidError`` for steps
    that decrease, a collective sharing a step, two computes in a step, or out-of-range peers
    and blocks."""
    kind: list[int] = []
    peer: list[int] = []
    nbytes: list[int] = []
    rank_of: list[int] = []
    flat: list = []
    steps: list[list[tuple[int, int]]] = []
    merge_b: list[list[int]] = []
    # Kernels of each step's merges and copies: a chunk merged into (its partials are
    # merged at once) counts one, copies one between them.
    merge_k: list[list[int]] = []
    step_compute: list[list[int]] = []
    """Per rank and step: the gid of the step's COMPUTE, or -1."""
    offset: list[int] = []
    size_cache: dict[tuple, int] = {}
    codes = _KIND_CODE
    for r, prog in enumerate(plan.programs):
        base = len(kind)
        offset.append(base)
        rsteps: list[tuple[int, int]] = []
        rmerge: list[int] = []
        rkern: list[int] = []
        rcomp: list[int] = []
        targets: set = set()
        prev = None
        lo = base
        for i, op in enumerate(prog):
            gid = base + i
            code = codes[op.kind]
            st = op.step
            if st != prev:
                if prev is not None:
                    if st < prev:
                        raise PlanInvalidError(
                            f"rank {r} op {i}: step {st} follows step {prev}; steps must not decrease")
                    rsteps.append((lo, gid))
                lo = gid
                rmerge.append(0)
                rkern.append(len(targets))
                rcomp.append(-1)
                targets = set()
                prev = st
            elif code == _COLL or kind[lo] == _COLL:
                raise PlanInvalidError(f"rank {r} step {st}: a collective op must be a step of its own")
            if code == _COMPUTE:
                if rcomp[-1] >= 0:
                    raise PlanInvalidError(f"rank {r} step {st}: a step holds at most one compute")
                rcomp[-1] = gid
                blk = r if op.block is None else op.block
                if not 0 <= blk < p:
                    raise PlanInvalidError(f"rank {r} op {i}: KV block {blk} out of range 0-{p - 1}")
                b = cm.partial_bytes(blk)
                q = -1
            else:
                q = op.peer if op.peer is not None else -1
                if code != _COLL and not 0 <= q < p:
                    raise PlanInvalidError(f"rank {r} op {i}: peer {op.peer} out of range 0-{p - 1}")
                key = (code == _COLL, op.chunk, op.block, op.part)
                b = size_cache.get(key)
                if b is None:
                    b = size_cache[key] = message_bytes(plan, op)
                if code == _RECV_MERGE:
                    rmerge[-1] += 3 * b
                    targets.add(op.chunk)
                elif code == _RECV_COPY and op.block is None:
                    rmerge[-1] += 2 * b
                    targets.add("copy")
            kind.append(code)
            peer.append(q)
            nbytes.append(b)
            rank_of.append(r)
            flat.append(op)
        if prev is not None:
            rsteps.append((lo, base + len(prog)))
        rkern.append(len(targets))
        steps.append(rsteps)
        merge_b.append(rmerge)
        merge_k.append(rkern[1:])
        step_compute.append(rcomp)
    return Program(kind, peer, nbytes, rank_of, flat, offset, steps, merge_b, merge_k, step_compute)
