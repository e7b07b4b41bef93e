"""Whether every result rank of a plan ends with the same bits, as the executor computes them.

Under tensor parallelism every rank of an ``all`` result goes on with the merged rows, and
ranks that hold different last bits can sample different tokens; an all-reduce gives every
rank the same bits. A plan gives them where every result rank's rows come out of the same
operations on the same operands in the same order: copies of one merge, or merges that each
rank runs over the same partials, in the same order, as the wire carried them.

``bit_groups`` runs the plan with the validator's progress simulation
(``treeattn.plan.validate``), on expressions instead of bitmasks, following
``treeattn.exec.interpreter`` op for op (keep the two in step):

* a rank's accumulator starts empty (a raw payload: the rank's own data); a COMPUTE's partial
  lands at its step's end: copied into an empty accumulator, else merged into it (the
  accumulator first);
* what a rank sends is its chunk as its step began, in the wire's form (on a wire narrower
  than the accumulator, ``Plan.narrow_wire``, rounded);
* at a step's end the copies land (as sent) and what it received is merged one stack per op
  chunk (None: every row), the stacks in the order the step first merges each (a chunk a step
  merges both alone and among all rows is merged twice): an exchanged chunk
  (``stacked_exchanges``) over every rank's partial in rank order, its own as sent, not reading
  the accumulator; any other the accumulator first, then what it received in program order (a
  raw payload: summed so);
* a library collective gives each rank it delivers to the same bits (NCCL's and gloo's
  all-reduce do), a function of every rank's input;
* on a narrow wire the rows some rank copies are rounded by every rank at the end
  (``Plan.rounded_runs``), so a row rounded once stays as it was.

Operands and order are matched exactly: two merges of the same partials in another order count
as different bits (floating-point addition is not associative, and a compiled kernel may fuse a
multiply and an add), so ``True`` is a proof and ``False`` a warning. One exception: a raw
payload's sum of two operands, the accumulator and one part received, is the same whichever
is which (IEEE addition commutes, eager or compiled: ``treeattn.exec.merge.sum_many_into``,
``sum_stack``), so the butterfly's ranks, each adding its partner's sum to its own, agree.
Three or more are summed in program order (eager from the accumulator, compiled the parts
first), which another order can change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from treeattn.plan.ir import COLLECTIVE_FORMS, OpKind, Plan, stacked_exchanges
from treeattn.plan.validate import check_with

if TYPE_CHECKING:
    from treeattn.plan.validate import _Validator

__all__ = ["BitTracker", "bit_groups", "different_bits_note", "split_text"]

_EMPTY = 0


class BitTracker:
    """The expression each rank's accumulator chunks hold (interned to ints), fed by the
    validator's progress simulation (``validate._Validator``) at each transfer, step end and
    collective."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.ids: dict[tuple, int] = {("empty",): _EMPTY}
        p, k = plan.ranks, plan.chunks
        self.raw = plan.is_raw
        self.narrow = plan.narrow_wire
        self.acc = [[self._id(("raw", r))] * k for r in range(p)] if self.raw else [[_EMPTY] * k for _ in range(p)]
        self.empty = [not self.raw] * p
        self._wired: set[int] = set()
        self.v: _Validator | None = None

    def _id(self, expr: tuple) -> int:
        got = self.ids.get(expr)
        if got is None:
            got = self.ids[expr] = len(self.ids)
        return got

    def _wire(self, e: int) -> int:
        """``e`` as the wire carries it (rounded on a narrow wire; rounding twice changes nothing)."""
        if not self.narrow or e in self._wired:
            return e
        w = self._id(("wire", e))
        self._wired.add(w)
        return w

    def attach(self, validator: _Validator) -> None:
        self.v = validator

    def sent(self, sender: int, gid: int) -> Any:
        """What the send ``gid`` of ``sender`` carries (None: a KV block)."""
        v = self.v
        if v.block_a[gid] >= 0:
            return None
        ch = v.chunk_a[gid]
        row = self.acc[sender]
        return tuple(self._wire(e) for e in row) if ch < 0 else self._wire(row[ch])

    def finish(self, r: int, g: int, box: list[tuple[int, Any, Any]]) -> None:
        """Rank ``r``'s step ``g`` ends: its COMPUTE lands, then what it received (``box``:
        (receive gid, mask, what the send carried), in program order)."""
        v = self.v
        acc = self.acc[r]
        began = acc[:]  # an exchange's own slot holds the chunk as the step began
        start = v.g_compute[g]
        if start >= 0:
            b = v.block_a[start]
            part = self._id(("part", r if b < 0 else b))
            for c in range(len(acc)):
                acc[c] = part if self.empty[r] else self._id(("merge", acc[c], part))
            self.empty[r] = False
        # As the executor stacks them: one stack per op chunk (None: every row), in the order
        # the step first merges each, merged one after the other over the stack's rows.
        stacks: dict[int | None, list[tuple[int, Any]]] = {}
        for gid, _, carried in box:
            if carried is None:
                continue
            ch = v.chunk_a[gid]
            if v.ops[gid].kind is not OpKind.RECV_MERGE:
                for c in range(len(acc)) if ch < 0 else (ch,):
                    acc[c] = carried[c] if ch < 0 else carried
                self.empty[r] = False
                continue
            stacks.setdefault(None if ch < 0 else ch, []).append((v.peer_a[gid], carried))
        if not stacks:
            return
        lo, hi = v.g_start[g], v.g_start[g + 1]
        exchanged = stacked_exchanges(self.plan, v.ops[lo:hi])
        for key, got in stacks.items():
            for c in range(len(acc)) if key is None else (key,):
                parts = [(s, e[c] if key is None else e) for s, e in got]
                if key in exchanged:  # every rank's partial in rank order, this rank's as sent
                    ordered = sorted([(r, self._wire(began[c])), *parts])
                    acc[c] = self._id(("stack", *(e for _, e in ordered)))
                elif self.raw and len(parts) == 1:  # a + b: IEEE addition gives b + a's bits
                    acc[c] = self._id(("sum", *sorted((acc[c], parts[0][1]))))
                else:  # the accumulator first, then what it received in program order
                    acc[c] = self._id(("sum" if self.raw else "merge", acc[c], *(e for _, e in parts)))
        self.empty[r] = False

    def collective(self, op: Any, c: int, effect: str, root: int | None) -> None:
        """A collective's effect on chunk ``c``: the ranks it delivers to get the same bits."""
        if effect == "none":
            return
        inputs = tuple(row[c] for row in self.acc)
        form = COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)]
        e = self._id(("coll", form.group or f"{op.coll} {op.reduce} {op.part}", *inputs))
        if effect == "all":
            targets = range(len(self.acc))
        elif effect == "owner":
            targets = (self.plan.owner(c),)
        else:
            targets = (root,)
        for t in targets:
            self.acc[t][c] = e
        for t in range(len(self.acc)):
            self.empty[t] = False

    def final(self, r: int, c: int) -> int:
        """Rank ``r``'s chunk ``c`` after the end-of-run rounding."""
        e = self.acc[r][c]
        lo, hi = self.plan.chunk_range(c)
        if any(a <= lo and hi <= b for a, b in self.plan.rounded_runs):
            return self._wire(e)
        return e


def bit_groups(plan: Plan) -> dict[int, list[list[int]]]:
    """Per chunk that more than one result rank holds and whose holders do not all end with
    the same bits, the holders grouped by the bits they hold (each group sorted, groups by
    their first rank); empty where every holder of every chunk ends with the same bits.

    Raises:
        PlanInvalidError: the plan is invalid (``validate.check``'s message).
    """
    tracker = BitTracker(plan)
    check_with(plan, tracker)
    out: dict[int, list[list[int]]] = {}
    for c in range(plan.chunks):
        holders = [r for r in plan.result_ranks if c in plan.owned_chunks(r)]
        by_bits: dict[int, list[int]] = {}
        for r in holders:
            by_bits.setdefault(tracker.final(r, c), []).append(r)
        if len(by_bits) > 1:
            out[c] = sorted(sorted(g) for g in by_bits.values())
    return out


def split_text(split: dict[int, list[list[int]]], shown: int = 4) -> str:
    """``bit_groups``' first chunk as a user reads it: ``chunk 0: ranks 0,1 | 2,3`` (its first
    ``shown`` groups)."""
    c, groups = next(iter(split.items()))
    more = " | ..." if len(groups) > shown else ""
    return f"chunk {c}: ranks " + " | ".join(",".join(map(str, g)) for g in groups[:shown]) + more


def different_bits_note(split: dict[int, list[list[int]]]) -> str:
    """What ``bit_groups``' non-empty answer means, in one sentence (verify and plan say it)."""
    chunks = f"{len(split)} chunk" + ("" if len(split) == 1 else "s")
    return (f"its result ranks may end with different bits in {chunks} ({split_text(split)}): they merge the "
            "same partials in other orders or groupings")
