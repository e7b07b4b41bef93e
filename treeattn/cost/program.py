"""A plan read into flat per-op arrays for the simulator (``treeattn.cost.simulate``).

Ops are numbered globally (gid), rank by rank; ``offset[r]`` is rank r's first. Per rank,
its steps are gid ranges; per step, the bytes its local work moves and the kernels it takes
(``merge_b``, ``merge_k``), and its COMPUTE's gid (-1: none). The local work of a step is:

* its merges and copies: a chunk merged into moves what ``ComputeModel.merge_bytes`` says
  (on a GPU the k partials received and the accumulator's rows twice; on a host 3 x the
  received bytes), but on a GPU an exchanged chunk (``stacked_exchanges``) moves its own slot
  of the stack in place of the accumulator's read (``kernels.merged_into`` writes the rows
  and does not read them); copied rows count twice; a chunk merged into counts one kernel, however
  many partials it receives, and each
  copy one (``exec.interpreter`` stores every copied chunk on its own); on a narrow wire a
  copy counts two (its lse's bytes go into the accumulator's column beside its rows:
  ``from_wire``), and so does a merge where the lse is not aligned (``lse_copied``: copied
  out of the stack first, ``exec.merge.split_wire``);
* the next step's conversions before it posts (``wire_conversions``): the rank's own slot of
  an exchanged chunk, and the chunks it sends on a narrow wire. They run between the two
  steps, so charging them at this step's end delays the next post exactly as they do
  (a rank's first step has no step before: its conversions are charged at its own end);
* on a rank's last step, the end-of-run rounding of copied rows (``Plan.rounded_runs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from treeattn.cost.compute import ComputeModel
from treeattn.errors import PlanInvalidError
from treeattn.plan.ir import (
    Op,
    OpKind,
    Plan,
    contiguous_runs,
    converted_of,
    lse_copied,
    message_bytes,
    stacked_of,
    step_transfers,
)
from treeattn.plan.steps import NEVER_BREAK, order_problem, step_problem

__all__ = ["Program", "compile_plan", "wire_conversions", "end_rounding"]

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
    chunk: list[int]
    """Per op its chunk, -1 for None."""
    block: list[int]
    """Per op its KV block, -1 for None."""
    step_no: list[list[int]]
    """Per rank and step: its step number."""
    partner: list[int] | None = None
    """``pair``'s answer, once asked."""

    def pair(self, p: int) -> list[int]:
        """Per op its partner (-1: none): the k-th SEND a->b matches the k-th RECV at b from a."""
        if self.partner is None:
            self.partner = self._pair(p)
        return self.partner

    def _pair(self, p: int) -> list[int]:
        kind = np.array(self.kind, dtype=np.int8)
        rank = np.array(self.rank_of, dtype=np.int64)
        peer = np.array(self.peer, dtype=np.int64)
        sends = np.flatnonzero(kind == _SEND)
        recvs = np.flatnonzero((kind == _RECV_MERGE) | (kind == _RECV_COPY))
        partner = np.full(len(kind), -1, dtype=np.int64)
        if len(sends) and len(recvs):
            skey = rank[sends] * p + peer[sends]
            rkey = peer[recvs] * p + rank[recvs]
            socc, rocc = _occurrence(skey), _occurrence(rkey)
            m = int(max(socc.max(), rocc.max())) + 1
            _, i_s, i_r = np.intersect1d(skey * m + socc, rkey * m + rocc, assume_unique=True, return_indices=True)
            s, q = sends[i_s], recvs[i_r]
            chunk, block = np.array(self.chunk), np.array(self.block)
            bad = np.flatnonzero((chunk[s] != chunk[q]) | (block[s] != block[q]))
            if len(bad):
                j = bad[np.argmin(s[bad])]
                self._mismatch(int(s[j]), int(q[j]))
            partner[s], partner[q] = q, s
        return partner.tolist()

    def _mismatch(self, s: int, q: int) -> None:
        so, qo, off, rank_of = self.ops[s], self.ops[q], self.offset, self.rank_of
        sr, qr = rank_of[s], rank_of[q]
        raise PlanInvalidError(
            f"rank {sr} op {s - off[sr]} sends chunk {so.chunk} block {so.block} to rank {qr}, "
            f"whose matching op {q - off[qr]} receives chunk {qo.chunk} block {qo.block} "
            "(the k-th send a->b matches the k-th receive at b from a)"
        )


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """Per element, how many equal keys come before it (the k of the k-th send a->b)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    n = len(keys)
    starts = np.ones(n, dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - first
    return out


def compile_plan(plan: Plan, p: int, cm: ComputeModel) -> Program:
    """Read ``plan`` (of ``p`` ranks) into a ``Program``; raises ``PlanInvalidError`` for a
    broken step rule (``treeattn.plan.steps``) or out-of-range peers and blocks.

    The Program is kept with the plan (a plan is immutable): the search's floor and the
    simulator read the same plan one after the other."""
    key = (p, cm.payload, cm.fused)  # what the Program depends on besides the plan
    cached = vars(plan).get(_CACHE)
    if cached is not None and cached[0] == key:
        return cached[1]
    prog = _compile(plan, p, cm)
    vars(plan)[_CACHE] = (key, prog)
    return prog


_CACHE = "_program"


def _compile(plan: Plan, p: int, cm: ComputeModel) -> Program:
    kind: list[int] = []
    peer: list[int] = []
    nbytes: list[int] = []
    rank_of: list[int] = []
    chunk_of: list[int] = []
    block_of: list[int] = []
    flat: list = []
    steps: list[list[tuple[int, int]]] = []
    merge_b: list[list[int]] = []
    step_no: list[list[int]] = []
    # Kernels of each step's merges and copies (module docstring): a chunk merged into (its
    # partials are merged at once) counts per_merge, each copy per_copy.
    merge_k: list[list[int]] = []
    per_copy = 2 if plan.narrow_wire else 1
    per_merge = 2 if plan.narrow_wire and lse_copied(plan.workload) else 1
    step_compute: list[list[int]] = []
    """Per rank and step: the gid of the step's COMPUTE, or -1."""
    offset: list[int] = []
    size_cache: dict[tuple, int] = {}
    acc_row = plan.workload.acc_row_bytes

    ranges: dict[int | None, tuple[int, int]] = {}

    def chunk_range(chunk: int | None) -> tuple[int, int]:
        # a plan's chunks are few and asked for again and again (every merge, every step)
        hit = ranges.get(chunk)
        if hit is None:
            hit = ranges[chunk] = plan.chunk_range(chunk)
        return hit

    def acc_bytes(chunk: int | None) -> int:
        start, stop = chunk_range(chunk)
        return (stop - start) * acc_row

    codes, never = _KIND_CODE, NEVER_BREAK
    merge_bytes, partial_bytes = cm.merge_bytes, cm.partial_bytes
    # bound once: this loop runs for every op of every candidate the search reads
    kind_add, peer_add, nbytes_add, chunk_add, block_add = (
        kind.append, peer.append, nbytes.append, chunk_of.append, block_of.append)
    for r, prog in enumerate(plan.programs):
        base = len(kind)
        offset.append(base)
        rsteps: list[tuple[int, int]] = []
        rno: list[int] = []
        rmerge: list[int] = []
        rkern: list[int] = []
        rcomp: list[int] = []
        targets: set = set()
        copies = 0
        prev = None
        lo = base
        odd = False  # the step holds an op outside NEVER_BREAK: its rules are checked
        for i, op in enumerate(prog):
            gid = base + i
            okind = op.kind
            code = codes[okind]
            st = op.step
            chunk, block = op.chunk, op.block
            if st != prev:
                if prev is not None:
                    if st < prev:
                        raise PlanInvalidError(f"rank {r} op {i}: {order_problem(prev, st)}")
                    if odd and gid - lo > 1:
                        _check_step(prog, r, lo - base, i)
                    rsteps.append((lo, gid))
                lo = gid
                rno.append(st)
                rmerge.append(0)
                rkern.append(len(targets) * per_merge + copies * per_copy)
                rcomp.append(-1)
                targets = set()
                copies = 0
                prev = st
                odd = okind not in never
            elif not odd and okind not in never:
                odd = True
            if code == _COMPUTE:
                if rcomp[-1] < 0:
                    rcomp[-1] = gid
                blk = r if block is None else block
                if not 0 <= blk < p:
                    raise PlanInvalidError(f"rank {r} op {i}: KV block {blk} out of range 0-{p - 1}")
                b = partial_bytes(blk)
                q = -1
            else:
                q = op.peer if op.peer is not None else -1
                if code != _COLL and not 0 <= q < p:
                    raise PlanInvalidError(f"rank {r} op {i}: peer {op.peer} out of range 0-{p - 1}")
                key = (code == _COLL, chunk, block, op.part)
                b = size_cache.get(key)
                if b is None:
                    b = size_cache[key] = message_bytes(plan, op)
                if code == _RECV_MERGE:
                    if chunk in targets:
                        rmerge[-1] += merge_bytes(r, b, 0)
                    else:
                        rmerge[-1] += merge_bytes(r, b, acc_bytes(chunk))
                        targets.add(chunk)
                elif code == _RECV_COPY and block is None:
                    rmerge[-1] += 2 * b
                    copies += 1
            kind_add(code)
            peer_add(q)
            nbytes_add(b)
            chunk_add(-1 if chunk is None else chunk)
            block_add(-1 if block is None else block)
        rank_of.extend([r] * len(prog))
        flat.extend(prog)
        if prev is not None:
            if odd and base + len(prog) - lo > 1:
                _check_step(prog, r, lo - base, len(prog))
            rsteps.append((lo, base + len(prog)))
        rkern.append(len(targets) * per_merge + copies * per_copy)
        rkern = rkern[1:]
        _charge_conversions(plan, prog, rsteps, base, rmerge, rkern, cm.fuses(r), chunk_range)
        steps.append(rsteps)
        step_no.append(rno)
        merge_b.append(rmerge)
        merge_k.append(rkern)
        step_compute.append(rcomp)
    return Program(kind, peer, nbytes, rank_of, flat, offset, steps, merge_b, merge_k, step_compute, chunk_of,
                   block_of, step_no)


def wire_conversions(plan: Plan, ops: list[Op]) -> tuple[int, int]:
    """The bytes moved and kernels run converting what one rank's step (``ops``) sends,
    before it posts (``exec.interpreter``): each exchanged chunk's own slot of its stack
    (``stacked_exchanges``; one kernel, two on a narrow wire), and the chunks it sends on a
    narrow wire, two kernels per contiguous run of rows (``wire_converted``). A conversion
    reads the fp32 accumulator's rows and writes their wire form."""
    sent, merged, computes = step_transfers(ops)
    stacked = set() if computes else stacked_of(plan.is_raw, sent, merged)
    w = plan.workload
    return _conversions(sent, stacked, plan.chunk_range, w.acc_row_bytes + w.row_bytes, plan.narrow_wire)


def _conversions(sent: dict, stacked: set[int | None], chunk_range: Callable[[int | None], tuple[int, int]],
                 per_row: int, narrow: bool) -> tuple[int, int]:
    """``wire_conversions`` of a step from its ``step_transfers`` (``sent``) and
    ``stacked_exchanges`` (``stacked``), a row's bytes read and written (``per_row``) and
    whether the wire is narrow: the chunks it sends converted to a narrow wire
    (``wire_converted``) are those of ``sent`` not stacked."""
    per_kernel = 2 if narrow else 1
    moved = kernels = 0
    for c in stacked:
        start, stop = chunk_range(c)
        moved += (stop - start) * per_row
        kernels += per_kernel
    if narrow:
        for start, stop in contiguous_runs(chunk_range(c) for c in converted_of(sent, stacked)):
            moved += (stop - start) * per_row
            kernels += 2
    return moved, kernels


def end_rounding(plan: Plan) -> tuple[int, int]:
    """The bytes moved and kernels run by every rank's end-of-run rounding of copied rows
    (``Plan.rounded_runs``): o read in fp32, written and read back in the partial dtype,
    written in fp32, two kernels per run."""
    runs = plan.rounded_runs
    if not runs:
        return 0, 0
    w = plan.workload
    rows = sum(stop - start for start, stop in runs)
    return rows * w.value_dim * 2 * (4 + w.partial_dtype.nbytes), 2 * len(runs)


def _charge_conversions(plan: Plan, prog: list[Op], rsteps: list[tuple[int, int]], base: int,
                        rmerge: list[int], rkern: list[int], fused: bool,
                        chunk_range: Callable[[int | None], tuple[int, int]]) -> None:
    """Add a rank's conversions and end rounding to its steps' local work, and on a GPU
    (``fused``) take off what an exchanged chunk's merge does not read (module docstring)."""
    if not rsteps:
        return
    w = plan.workload
    # what an exchanged chunk's own SEND moves (``message_bytes``: its rows as packed
    # partials) less the accumulator's rows its merge does not read, per row
    slot_less_acc = w.row_bytes - w.acc_row_bytes
    per_row, narrow, raw = w.acc_row_bytes + w.row_bytes, plan.narrow_wire, plan.is_raw
    for c, (lo, hi) in enumerate(rsteps):
        # one pass over the step (``step_transfers``) gives what ``stacked_exchanges`` and
        # ``wire_conversions`` read: this runs for every step of every candidate plan
        sent, merged, computes = step_transfers(prog[lo - base:hi - base])
        if not sent:  # no SEND of the accumulator
            continue
        stacked = set() if computes else stacked_of(raw, sent, merged)
        if fused:
            for chunk in stacked:
                start, stop = chunk_range(chunk)
                rmerge[c] += (stop - start) * slot_less_acc
        moved, kernels = _conversions(sent, stacked, chunk_range, per_row, narrow)
        at = max(c - 1, 0)
        rmerge[at] += moved
        rkern[at] += kernels
    moved, kernels = end_rounding(plan)
    rmerge[-1] += moved
    rkern[-1] += kernels


def _check_step(prog, r: int, start: int, stop: int) -> None:  # noqa: ANN001 - a rank's ops
    found = step_problem(prog, start, stop)
    if found is not None:
        raise PlanInvalidError(f"rank {r} op {found.index}: {found.message}")
