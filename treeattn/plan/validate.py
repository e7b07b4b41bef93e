"""The symbolic validator: does a Plan compute the exact merge, exactly once, without deadlock?

It executes the plan the way ``treeattn.plan.ir`` defines it, on symbols instead of
numbers: an accumulator is a bitmask of the contributions merged into it (bit j = rank j's
partial, or the partial over KV block j). A merge of two masks that share a bit counts a
contribution twice; at the end every result rank must hold all contributors' bits in every
chunk. Transfers are matched statically (FIFO per ordered pair), then a progress simulation
posts each rank's steps and completes a transfer once both of its sides are posted, a step
once all of its ops are done, a collective once every rank has reached it. If nothing can
progress while work is left, the plan deadlocks and the report names who waits on whom.

``validate`` returns every structural violation (up to a limit) or the first one found
while executing; ``check`` raises ``PlanInvalidError`` for the first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from treeattn.errors import PlanInvalidError
from treeattn.plan.ir import COLLECTIVE_FORMS, GROUPS, OpKind, Plan, gc_paused
from treeattn.plan.steps import order_problem, step_problem

__all__ = ["ViolationKind", "Violation", "ValidationReport", "validate", "check", "check_with", "given_partial_problem"]


class ViolationKind(StrEnum):
    """What is wrong. Structural kinds are found before executing, the rest while executing."""

    BAD_OP = "bad-op"
    """An op carries a field its kind does not take, or a non-integer step/peer/chunk."""
    PEER_RANGE = "peer-out-of-range"
    SELF_SEND = "self-send"
    CHUNK_RANGE = "chunk-out-of-range"
    BLOCK_RANGE = "block-out-of-range"
    STEP_ORDER = "step-order"
    """Steps of a program decrease."""
    NOT_ALONE = "not-alone"
    """A COLLECTIVE shares its step with other ops, or two COMPUTEs share one."""
    WRITE_CONFLICT = "write-conflict"
    """Two receives of one step write one chunk and one of them overwrites (order-dependent)."""
    BAD_RESULT_RANKS = "bad-result-ranks"
    UNMATCHED_SEND = "unmatched-send"
    UNMATCHED_RECV = "unmatched-recv"
    MISMATCH = "mismatch"
    """A matched send and receive disagree on chunk or block."""
    BAD_COLLECTIVE = "bad-collective"
    """A (coll, reduce, part) combination that means nothing for this payload."""
    COLLECTIVE_MISMATCH = "collective-mismatch"
    """Ranks issue different collectives, or a different number of them."""
    DOUBLE_COUNT = "double-count"
    EMPTY_SEND = "empty-send"
    """A chunk is sent (or enters a collective) before it holds any contribution."""
    BLOCK_NOT_HELD = "block-not-held"
    TRIO = "trio"
    """The lse/num/den all-reduce trio (or the lse/num pair of decode context parallel) is
    repeated, incomplete, mixed, or runs over changing accumulators."""
    DEADLOCK = "deadlock"
    MISSING = "missing"
    """A result rank lacks some contribution in some chunk at the end."""
    EXTRA = "extra"
    """A result rank holds a contribution that is not one of ``plan.contributors``."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One thing wrong with a plan, located as precisely as it can be."""

    kind: ViolationKind
    message: str
    """One line, starting with the location (``rank 3 op 7 (step 2): ...``)."""
    rank: int | None = None
    op_index: int | None = None
    """Index into ``plan.programs[rank]``."""
    step: int | None = None
    chunk: int | None = None
    peer: int | None = None

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "message": self.message,
            "rank": self.rank,
            "op_index": self.op_index,
            "step": self.step,
            "chunk": self.chunk,
            "peer": self.peer,
        }


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """What ``validate`` found, with a summary of the plan for the CLI."""

    algorithm: str
    ranks: int
    chunks: int
    ops: int
    steps: int
    """Distinct step numbers used (over all ranks)."""
    transfers: int
    """Matched send/receive pairs."""
    collectives: int
    """Collectives per rank."""
    result_ranks: int
    violations: tuple[Violation, ...] = field(default=())

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def first(self) -> Violation | None:
        return self.violations[0] if self.violations else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "ranks": self.ranks,
            "chunks": self.chunks,
            "ops": self.ops,
            "steps": self.steps,
            "transfers": self.transfers,
            "collectives": self.collectives,
            "result_ranks": self.result_ranks,
            "valid": self.valid,
            "violation": self.first.to_dict() if self.first else None,
            "violations": [v.to_dict() for v in self.violations],
        }


def check(plan: Plan) -> None:
    """Raise ``PlanInvalidError`` for the first violation of ``plan``; return None when valid.

    Args:
        plan: the plan to prove.

    Raises:
        PlanInvalidError: with the one-line message of the violation; the ``Violation``
            itself is on its ``violation`` attribute.
    """
    check_with(plan, None)


def check_with(plan: Plan, tracker: Any) -> None:
    """``check``, feeding ``tracker`` (``treeattn.plan.bits.BitTracker``; None: none) as the
    plan runs."""
    with gc_paused():
        report = _Validator(plan, 1, tracker).run()
    if report.violations:
        v = report.violations[0]
        err = PlanInvalidError(f"plan {plan.algorithm!r} is invalid: {v.message}")
        err.violation = v  # type: ignore[attr-defined]
        raise err


def validate(plan: Plan, *, max_violations: int = 20) -> ValidationReport:
    """Prove (or refute) that ``plan`` computes its result exactly once and terminates.

    Args:
        plan: the plan to check.
        max_violations: stop collecting structural violations after this many. Execution
            stops at its first violation either way.

    Returns:
        A ``ValidationReport``; ``report.valid`` is True when nothing is wrong.
    """
    with gc_paused():
        return _Validator(plan, max(1, max_violations)).run()


# -- implementation --------------------------------------------------------------------

_SEND, _MERGE, _COPY, _COMPUTE, _COLL = 0, 1, 2, 3, 4  # op kinds as small ints (transfers <= _COPY)


class _Stop(Exception):
    """Raised internally once enough violations are collected."""


def _is_int(x: Any) -> bool:
    return type(x) is int


def _ranks_of(mask: int, limit: int = 8) -> str:
    out = []
    total = mask.bit_count()
    while mask and len(out) < limit:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    text = ", ".join(map(str, out))
    return f"[{text}, ... ({total} in all)]" if total > limit else f"[{text}]"


def _describe(op: Any) -> str:
    kind = op.kind.value
    what = f"block {op.block}" if op.block is not None else (
        "all chunks" if op.chunk is None else f"chunk {op.chunk}")
    if op.kind is OpKind.SEND:
        return f"send {what} to rank {op.peer}"
    if op.kind in (OpKind.RECV_MERGE, OpKind.RECV_COPY):
        return f"{kind} {what} from rank {op.peer}"
    if op.kind is OpKind.COMPUTE:
        return "compute" + ("" if op.block is None else f" block {op.block}")
    return f"collective {op.coll} {op.reduce} {op.part} ({what})"


class _Validator:
    def __init__(self, plan: Plan, limit: int, tracker: Any = None) -> None:
        self.plan = plan
        self.limit = limit
        self.tracker = tracker
        """Fed each transfer, step end and collective as the plan runs (``plan.bits``), or None."""
        self.p = plan.ranks
        self.k = plan.chunks
        self.raw = plan.is_raw
        self.violations: list[Violation] = []
        self.transfers = 0
        self.ncoll = 0
        self.steps: set[int] = set()

    # -- reporting -----------------------------------------------------------------------

    def _add(self, kind: ViolationKind, rank: int | None, index: int | None, text: str,
             chunk: int | None = None, located: bool = True) -> None:
        op = self.plan.programs[rank][index] if rank is not None and index is not None else None
        if not located:
            where = ""
        elif op is not None:
            where = f"rank {rank} op {index} (step {op.step}, {_describe(op)}): "
        elif rank is not None:
            where = f"rank {rank}: "
        else:
            where = ""
        self.violations.append(Violation(
            kind=kind,
            message=where + text,
            rank=rank,
            op_index=index,
            step=op.step if op is not None and _is_int(op.step) else None,
            chunk=chunk if chunk is not None else (op.chunk if op is not None and _is_int(op.chunk) else None),
            peer=op.peer if op is not None and _is_int(op.peer) else None,
        ))
        if len(self.violations) >= self.limit:
            raise _Stop

    def run(self) -> ValidationReport:
        try:
            self._results()
            self._scan()
            if not self.violations:
                self._match()
            if not self.violations:
                self._execute()
        except _Stop:
            pass
        plan = self.plan
        return ValidationReport(
            algorithm=plan.algorithm,
            ranks=self.p,
            chunks=self.k,
            ops=sum(len(prog) for prog in plan.programs),
            steps=len(self.steps),
            transfers=self.transfers,
            collectives=self.ncoll,
            result_ranks=len(plan.result_ranks),
            violations=tuple(self.violations),
        )

    def _results(self) -> None:
        plan, p, V = self.plan, self.p, ViolationKind
        rr = plan.result_ranks
        if not rr:
            self._add(V.BAD_RESULT_RANKS, None, None, "result_ranks is empty: no rank would hold the result")
        elif len(set(rr)) != len(rr) or any(not _is_int(r) or not 0 <= r < p for r in rr):
            self._add(V.BAD_RESULT_RANKS, None, None,
                      f"result_ranks {list(rr)[:16]} must be distinct ranks in [0, {p})")
        cs = plan.contributors
        if cs is not None and (not cs or len(set(cs)) != len(cs) or any(not _is_int(c) or not 0 <= c < p
                                                                        for c in cs)):
            self._add(V.BAD_RESULT_RANKS, None, None,
                      f"contributors {list(cs)[:16]} must be distinct ranks in [0, {p}), at least one")

    # -- one pass over every op: fields, steps, groups; flat arrays for the rest -------------

    def _scan(self) -> None:
        plan, p, k, raw = self.plan, self.p, self.k, self.raw
        send_k, merge_k, copy_k = OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY
        compute_k = OpKind.COMPUTE
        ops: list[Any] = []
        code: list[int] = []
        peer_a: list[int] = []
        chunk_a: list[int] = []
        block_a: list[int] = []
        group_of: list[int] = []
        g_compute: list[int] = []  # per step: its COMPUTE's gid, or -1
        g_start: list[int] = []
        g_rank: list[int] = []
        offset = [0] * (p + 1)
        first_group = [0] * (p + 1)
        sends: dict[int, list[int]] = {}
        recvs: dict[int, list[int]] = {}
        colls: list[list[int]] = [[] for _ in range(p)]
        steps = self.steps
        for r, prog in enumerate(plan.programs):
            offset[r] = len(ops)
            first_group[r] = len(g_start)
            prev = -1
            gstart = 0
            for i, op in enumerate(prog):
                gid = len(ops)
                ops.append(op)
                kind, step, peer, chunk, block = op.kind, op.step, op.peer, op.chunk, op.block
                if type(step) is not int or step < 0:
                    self._add(ViolationKind.BAD_OP, r, i, f"step must be an integer >= 0, got {step!r}")
                elif step != prev:
                    problem = order_problem(prev, step)
                    if problem is not None:
                        self._add(ViolationKind.STEP_ORDER, r, i, problem)
                    if i - gstart > 1:
                        self._group(r, prog, gstart, i)
                    gstart = i
                    g_start.append(gid)
                    g_compute.append(-1)
                    g_rank.append(r)
                    steps.add(step)
                    prev = step
                group_of.append(len(g_start) - 1)
                clean = op.coll is None and op.reduce is None and op.part is None
                chunk_ok = chunk is None or (type(chunk) is int and 0 <= chunk < k)
                if kind is send_k or kind is merge_k or kind is copy_k:
                    c = _SEND if kind is send_k else (_MERGE if kind is merge_k else _COPY)
                    if not (clean and chunk_ok and type(peer) is int and 0 <= peer < p and peer != r
                            and block is None):
                        self._op(r, i, op)
                        if not (type(peer) is int and 0 <= peer < p):
                            peer = None  # reported; keep it out of the matching
                    if peer is not None:
                        key = r * p + peer if c == _SEND else peer * p + r
                        table = sends if c == _SEND else recvs
                        lst = table.get(key)
                        if lst is None:
                            table[key] = [gid]
                        else:
                            lst.append(gid)
                elif kind is compute_k:
                    c = _COMPUTE
                    if g_compute and g_compute[-1] < 0:
                        g_compute[-1] = gid
                    if not (clean and chunk is None and peer is None and not raw and block is None):
                        self._op(r, i, op)
                else:
                    c = _COLL
                    colls[r].append(gid)
                    self._op(r, i, op)
                code.append(c)
                peer_a.append(peer if peer is not None else -1)
                chunk_a.append(chunk if chunk is not None else -1)
                block_a.append(block if block is not None else -1)
            if len(prog) - gstart > 1:
                self._group(r, prog, gstart, len(prog))
        offset[p] = len(ops)
        first_group[p] = len(g_start)
        g_start.append(len(ops))
        self.ops, self.code, self.peer_a, self.chunk_a, self.block_a = ops, code, peer_a, chunk_a, block_a
        self.group_of, self.g_start, self.g_rank, self.g_compute = group_of, g_start, g_rank, g_compute
        self.offset, self.first_group = offset, first_group
        self.sends, self.recvs, self.colls = sends, recvs, colls

    def _op(self, r: int, i: int, op: Any) -> None:
        """Say precisely what is wrong with one op (the scan's fast path found something)."""
        V, p, k = ViolationKind, self.p, self.k
        kind = op.kind
        if kind is not OpKind.COLLECTIVE and (op.coll is not None or op.reduce is not None or op.part is not None):
            self._add(V.BAD_OP, r, i, "coll/reduce/part belong to collective ops only")
        chunk, block, peer = op.chunk, op.block, op.peer
        if chunk is not None and (not _is_int(chunk) or not 0 <= chunk < k):
            self._add(V.CHUNK_RANGE, r, i, f"chunk {chunk!r} is out of range: the plan has {k} chunks")
        if block is not None:
            if self.raw:
                self._add(V.BAD_OP, r, i, "a raw payload has no KV blocks")
            elif not _is_int(block) or not 0 <= block < p:
                self._add(V.BLOCK_RANGE, r, i, f"block {block!r} is out of range: there are {p} KV blocks")
        if kind in (OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY):
            if not _is_int(peer) or not 0 <= peer < p:
                self._add(V.PEER_RANGE, r, i, f"peer {peer!r} is out of range: the plan has {p} ranks")
            elif peer == r:
                self._add(V.SELF_SEND, r, i, "a rank cannot send to or receive from itself")
            if block is not None:
                if kind is OpKind.RECV_MERGE:
                    self._add(V.BAD_OP, r, i, "a KV block is received with recv_copy, not recv_merge")
                if chunk is not None:
                    self._add(V.BAD_OP, r, i, "a KV block transfer carries no chunk (chunk must be null)")
            return
        if kind is OpKind.COMPUTE:
            if peer is not None:
                self._add(V.BAD_OP, r, i, "compute takes no peer")
            if self.raw:
                self._add(V.BAD_OP, r, i, "a raw payload plan has no compute (its ranks start with their buffer)")
            if chunk is not None:
                self._add(V.BAD_OP, r, i, "compute covers every chunk (chunk must be null)")
            return
        # COLLECTIVE
        if block is not None:
            self._add(V.BAD_OP, r, i, "a collective carries no KV block")
        form = COLLECTIVE_FORMS.get((op.coll, op.reduce, op.part))
        what = f"{op.coll} {op.reduce} {op.part}"
        if form is None:
            forms = ", ".join(" ".join(k) for k, f in COLLECTIVE_FORMS.items() if self.plan.workload.kind in f.payloads)
            self._add(V.BAD_COLLECTIVE, r, i, f"{what} is not a valid collective; for this payload: {forms}")
            return
        if self.plan.workload.kind not in form.payloads:
            self._add(V.BAD_COLLECTIVE, r, i, f"{what} is not a valid collective for a {self.plan.workload.kind} "
                                              "payload")
        if form.effect == "root":
            if not _is_int(peer) or not 0 <= peer < p:
                self._add(V.PEER_RANGE, r, i, f"a reduce names its root as peer, in [0, {p}); got {peer!r}")
        elif peer is not None:
            self._add(V.BAD_OP, r, i, f"{what} takes no peer")
        if op.coll == "alltoall" and chunk is not None:
            self._add(V.BAD_COLLECTIVE, r, i, f"{what} exchanges every rank's rows at once (chunk must be null)")
        if (form.effect == "owner" or form.group == "dcp") and self.plan.layout != "heads":
            self._add(V.BAD_COLLECTIVE, r, i, f"{what} leaves each rank its own rows: it needs a heads layout plan")

    def _group(self, r: int, prog: Any, start: int, stop: int) -> None:
        """The step rules (``treeattn.plan.steps``) of a step holding several ops."""
        found = step_problem(prog, start, stop)
        if found is not None:
            self._add(ViolationKind(found.kind), r, found.index, found.message)

    # -- matching: FIFO per ordered pair, collectives in the same order ----------------------

    def _where(self, gid: int) -> tuple[int, int]:
        r = self.g_rank[self.group_of[gid]]
        return r, gid - self.offset[r]

    def _match(self) -> None:
        plan, p, V = self.plan, self.p, ViolationKind
        ops, chunk_a, block_a = self.ops, self.chunk_a, self.block_a
        sends, recvs = self.sends, self.recvs
        mate = [-1] * len(ops)
        found: list[tuple[int, int, ViolationKind, str]] = []
        transfers = 0
        for key in sorted(sends.keys() | recvs.keys()):
            a, b = divmod(key, p)
            ss, rs = sends.get(key, ()), recvs.get(key, ())
            n = min(len(ss), len(rs))
            transfers += n
            for j in range(n):
                s, q = ss[j], rs[j]
                mate[s] = q
                mate[q] = s
                if chunk_a[s] != chunk_a[q] or block_a[s] != block_a[q]:
                    def what(o: Any) -> str:
                        return f"block {o.block}" if o.block is not None else (
                            "all chunks" if o.chunk is None else f"chunk {o.chunk}")
                    rb, jb = self._where(q)
                    ra, ia = self._where(s)
                    found.append((ra, ia, V.MISMATCH,
                                  f"send #{j} from rank {a} to rank {b} carries {what(ops[s])} but the receive it "
                                  f"matches (rank {rb} op {jb}) expects {what(ops[q])}"))
            if len(ss) > n:
                ra, ia = self._where(ss[n])
                found.append((ra, ia, V.UNMATCHED_SEND,
                              f"rank {b} posts only {len(rs)} receive(s) from rank {a} but rank {a} sends "
                              f"{len(ss)}; this send has no matching receive"))
            elif len(rs) > n:
                rb, jb = self._where(rs[n])
                found.append((rb, jb, V.UNMATCHED_RECV,
                              f"rank {a} sends only {len(ss)} message(s) to rank {b} but rank {b} posts "
                              f"{len(rs)} receives; this receive has no matching send"))
        colls = self.colls
        ref = colls[0] if colls else []
        for r, mine in enumerate(colls):
            for n in range(max(len(mine), len(ref))):
                if n >= len(mine) or n >= len(ref):
                    idx = mine[n] - self.offset[r] if n < len(mine) else -1
                    found.append((r, idx, V.COLLECTIVE_MISMATCH,
                                  f"rank {r} issues {len(mine)} collective(s) but rank 0 issues {len(ref)}; every "
                                  "rank issues the same collectives in the same order"))
                    break
                x, y = ops[mine[n]], ops[ref[n]]
                if (x.coll, x.reduce, x.part, x.chunk, x.peer) != (y.coll, y.reduce, y.part, y.chunk, y.peer):
                    found.append((r, mine[n] - self.offset[r], V.COLLECTIVE_MISMATCH,
                                  f"collective #{n} differs from rank 0's ({_describe(y)})"))
                    break
        self.ncoll = len(ref)
        self.transfers = transfers
        self.mate = mate
        for r, i, kind, text in sorted(found, key=lambda f: (f[0], f[1])):
            self._add(kind, r, i if i >= 0 else None, text)
        del plan

    # -- execution ---------------------------------------------------------------------------

    def _execute(self) -> None:
        plan, p, k, V = self.plan, self.p, self.k, ViolationKind
        ops, code, peer_a, chunk_a, block_a = self.ops, self.code, self.peer_a, self.chunk_a, self.block_a
        group_of, g_start, first_group, offset, mate = (self.group_of, self.g_start, self.first_group,
                                                        self.offset, self.mate)
        g_compute = self.g_compute
        n_groups = len(g_start) - 1
        want = (1 << p) - 1 if plan.contributors is None else sum(1 << c for c in set(plan.contributors))
        acc = [[1 << r] * k if self.raw else [0] * k for r in range(p)]
        held = [1 << r for r in range(p)]
        pending = [0] * n_groups
        inbox: list[list[tuple[int, Any]]] = [[] for _ in range(p)]
        cur = [-1] * p  # group now posted (-1: none yet)
        finished = [False] * p
        coll_index = [0] * p
        arrivals: dict[int, int] = {}
        groups: dict[int, tuple[str, set[str], list[int]]] = {}
        dcp_lse: list[tuple[int, int] | None] = [None]  # the rows of the last lse gather no sum has used
        owner = plan.owner
        ready: deque[int] = deque()
        all_chunks = range(k)
        tracker = self.tracker
        if tracker is not None:
            tracker.attach(self)

        def value_of(sender: int, gid: int) -> Any:
            b = block_a[gid]
            if b >= 0:
                if not held[sender] >> b & 1:
                    self._add(V.BLOCK_NOT_HELD, sender, gid - offset[sender],
                              f"rank {sender} does not hold KV block {b} when this step begins")
                return b
            a = acc[sender]
            ch = chunk_a[gid]
            if ch < 0:
                for c in all_chunks:
                    if not a[c]:
                        self._add(V.EMPTY_SEND, sender, gid - offset[sender],
                                  f"chunk {c} holds no contribution yet (nothing computed or received)", chunk=c)
                return tuple(a)
            v = a[ch]
            if not v:
                self._add(V.EMPTY_SEND, sender, gid - offset[sender],
                          "the chunk holds no contribution yet (nothing computed or received)")
            return v

        def post(r: int, g: int) -> None:
            cur[r] = g
            start, stop = g_start[g], g_start[g + 1]
            if code[start] == _COLL:
                pending[g] = 1
                n = coll_index[r]
                coll_index[r] = n + 1
                arrivals[n] = arrivals.get(n, 0) + 1
                if arrivals[n] == p:
                    collective(ops[start])
                return
            left = stop - start
            for gid in range(start, stop):
                c = code[gid]
                if c == _COMPUTE:
                    left -= 1
                    continue
                m = mate[gid]
                q = peer_a[gid]
                gq = cur[q]
                if gq == group_of[m]:
                    if c == _SEND:
                        inbox[q].append((m, value_of(r, gid), tracker and tracker.sent(r, gid)))
                    else:
                        inbox[r].append((gid, value_of(q, m), tracker and tracker.sent(q, m)))
                    left -= 1
                    pending[gq] -= 1
                    if not pending[gq]:
                        ready.append(q)
            pending[g] = left
            if not left:
                ready.append(r)

        def union(c: int) -> int:
            total = 0
            for r in range(p):
                m = acc[r][c]
                i = g_start[cur[r]] - offset[r]
                if not m:
                    self._add(V.EMPTY_SEND, r, i, f"rank {r} enters the collective with nothing in chunk {c}",
                              chunk=c)
                if total & m:
                    self._add(V.DOUBLE_COUNT, r, i,
                              f"the collective merges contributions of ranks {_ranks_of(total & m)} twice in "
                              f"chunk {c} (rank {r} and an earlier rank both hold them)", chunk=c)
                total |= m
            return total

        def apply(op: Any, effect: str, c: int, total: int, root: int | None) -> None:
            if tracker is not None:
                tracker.collective(op, c, effect, root)
            if effect == "all":
                for r in range(p):
                    acc[r][c] = total
            elif effect == "owner":
                acc[owner(c)][c] = total
            elif effect == "root":
                acc[root][c] = total

        def in_order(op: Any, form: Any, chunks: Iterable[int]) -> None:
            """The order the executor needs within a group (``exec.collectives``): a trio's sums
            after the lse max of their rows (the weights exp(lse - max) depend on it), a pair's
            reduce-scatter over the rows of the last lse gather no reduce-scatter has used (it
            corrects by that gather's lse; each gather replaces the one before)."""
            what, where = f"{op.coll} {op.reduce} {op.part}", g_start[cur[0]] - offset[0]
            if form.group == "trio" and form.part_name != "lse":
                c = next((c for c in chunks if not ((st := groups.get(c)) and "lse" in st[1])), None)
                if c is not None:
                    self._add(V.TRIO, 0, where, f"{what} has no allreduce max lse of chunk {c} before it (none since "
                                                "the chunk's last trio completed): its weights exp(lse - max) need "
                                                "the max first", chunk=c)
            elif form.group == "dcp":
                rows = plan.chunk_range(op.chunk)
                if form.part_name == "lse":
                    dcp_lse[0] = rows
                    return
                if dcp_lse[0] != rows:
                    last = ("no allgather copy lse is left unused before it" if dcp_lse[0] is None else
                            f"the last allgather copy lse before it gathered rows {dcp_lse[0][0]}-{dcp_lse[0][1] - 1} "
                            "(each gather replaces the one before)")
                    self._add(V.TRIO, 0, where, f"{what} over rows {rows[0]}-{rows[1] - 1}: {last}; it corrects the "
                                                "outputs by the lse gathered over its own rows")
                dcp_lse[0] = None

        def collective(op: Any) -> None:
            form = COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)]
            chunks = all_chunks if op.chunk is None else (op.chunk,)
            if form.group is not None:
                in_order(op, form, chunks)
            for c in chunks:
                if form.effect == "none":
                    continue
                if form.group is None:
                    apply(op, form.effect, c, union(c), op.peer)
                    continue
                snap = [acc[r][c] for r in range(p)]
                state = groups.get(c)
                if state is None:
                    union(c)  # reports empty or overlapping inputs at the first part
                    groups[c] = (form.group, {form.part_name}, snap)
                    continue
                name, parts, first = state
                label = "the lse/num/den trio" if name == "trio" else "the lse/num pair"
                where = g_start[cur[0]] - offset[0]
                if name != form.group:
                    self._add(V.TRIO, 0, where, f"{op.coll} {op.reduce} {op.part} mixes into {label} of chunk {c}, "
                                                f"which is not complete (done: {', '.join(sorted(parts))})", chunk=c)
                if form.part_name in parts:
                    self._add(V.TRIO, 0, where, f"{op.coll} {op.reduce} {op.part} repeats in chunk {c} before "
                                                f"{label} is complete (done: {', '.join(sorted(parts))})", chunk=c)
                if snap != first:
                    r = next(r for r in range(p) if snap[r] != first[r])
                    self._add(V.TRIO, r, g_start[cur[r]] - offset[r],
                              f"rank {r}'s chunk {c} changed between the parts of {label}; all of them must run "
                              "over the same accumulators", chunk=c)
                parts.add(form.part_name)
                need, effect = GROUPS[name]
                if parts < need:
                    continue
                del groups[c]
                apply(op, effect, c, union(c), None)
            for r in range(p):
                pending[cur[r]] = 0
                ready.append(r)

        def finish_step(r: int) -> None:
            g = cur[r]
            a = acc[r]
            # A COMPUTE reads a block held when the step began, before the step's received
            # blocks are stored.
            start = g_compute[g]
            if start >= 0:
                b = block_a[start]
                if b < 0:
                    b = r
                if not held[r] >> b & 1:
                    self._add(V.BLOCK_NOT_HELD, r, start - offset[r],
                              f"rank {r} does not hold KV block {b} when this step begins")
                bit = 1 << b
                for c in all_chunks:
                    if a[c] & bit:
                        self._add(V.DOUBLE_COUNT, r, start - offset[r],
                                  f"the partial over block {b} is already merged into chunk {c}", chunk=c)
                    a[c] |= bit
            box = inbox[r]
            if len(box) > 1:
                box.sort(key=lambda item: item[0])
            if tracker is not None:
                tracker.finish(r, g, box)
            if box:
                for gid, val, _ in box:
                    b = block_a[gid]
                    if b >= 0:
                        held[r] |= 1 << b
                        continue
                    ch = chunk_a[gid]
                    merge = code[gid] == _MERGE
                    for c in (all_chunks if ch < 0 else (ch,)):
                        m = val[c] if ch < 0 else val
                        if merge:
                            x = a[c]
                            if x & m:
                                self._add(V.DOUBLE_COUNT, r, gid - offset[r],
                                          f"merging chunk {c} counts the contributions of ranks "
                                          f"{_ranks_of(x & m)} twice (already held)", chunk=c)
                            a[c] = x | m
                        else:
                            a[c] = m
                inbox[r] = []
            if g + 1 < first_group[r + 1]:
                post(r, g + 1)
            else:
                finished[r] = True

        for r in range(p):
            if first_group[r] < first_group[r + 1]:
                post(r, first_group[r])
            else:
                finished[r] = True
        while ready:
            finish_step(ready.popleft())

        if not all(finished):
            self._deadlock(cur, finished, coll_index)
        for c, (name, parts, _) in sorted(groups.items()):
            label = "the lse/num/den trio" if name == "trio" else "the lse/num pair"
            self._add(V.TRIO, None, None, f"{label} of chunk {c} is incomplete: only {', '.join(sorted(parts))} ran")
        for r in plan.result_ranks:
            for c in plan.owned_chunks(r):
                m = acc[r][c]
                if m == want:
                    continue
                if want & ~m:
                    self._add(V.MISSING, r, None,
                              f"chunk {c} ends without the contributions of ranks {_ranks_of(want & ~m)}", chunk=c)
                else:
                    self._add(V.EXTRA, r, None,
                              f"chunk {c} ends holding contributions of ranks {_ranks_of(m & ~want)}, which are "
                              "not contributors of this plan", chunk=c)

    def _deadlock(self, cur: list[int], finished: list[bool], coll_index: list[int]) -> None:
        p, ops, offset, g_start, group_of, mate = (self.p, self.ops, self.offset, self.g_start, self.group_of,
                                                   self.mate)
        blocked = [r for r in range(p) if not finished[r]]

        def waits(r: int) -> tuple[int, int, str]:
            """(op index, rank waited on, what) of the first op of r's current step still pending."""
            g = cur[r]
            for gid in range(g_start[g], g_start[g + 1]):
                op = ops[gid]
                if op.kind is OpKind.COLLECTIVE:
                    n = coll_index[r] - 1
                    late = next(q for q in range(p) if coll_index[q] <= n)
                    return gid - offset[r], late, f"waits in collective #{n} for rank {late}"
                if op.kind is not OpKind.COMPUTE and cur[op.peer] < group_of[mate[gid]]:
                    return gid - offset[r], op.peer, f"waits to {_describe(op)}"
            raise AssertionError("a blocked rank has no pending op")

        chain: list[int] = []
        seen: dict[int, int] = {}
        r = blocked[0]
        while r not in seen:
            seen[r] = len(chain)
            chain.append(r)
            r = waits(r)[1]
        cycle = chain[seen[r]:]
        parts = []
        for q in cycle[:6]:
            i, _, text = waits(q)
            parts.append(f"rank {q} at step {ops[offset[q] + i].step} (op {i}) {text}")
        more = f"; ... ({len(cycle)} ranks in the cycle)" if len(cycle) > 6 else ""
        head = cycle[0]
        self._add(ViolationKind.DEADLOCK, head, waits(head)[0],
                  f"deadlock, {len(blocked)} of {p} ranks blocked: " + "; ".join(parts) + more, located=False)


def given_partial_problem(plan: Plan) -> str | None:
    """Why ``plan`` cannot merge partials computed elsewhere (None when it can): every rank
    must compute once, over its own KV block (a ``Merger`` takes that partial from the model;
    ``simulate(..., given_partials=True)`` times such a call), which a raw payload has none of."""
    if plan.is_raw:
        return f"plan {plan.algorithm!r} reduces a raw payload: it has no partials to be given"
    if plan.contributors is not None and set(plan.contributors) != set(range(plan.ranks)):
        left = sorted(set(range(plan.ranks)) - set(plan.contributors))
        return (f"plan {plan.algorithm!r} merges the partials of its contributors only, not of rank"
                f"{'s' if len(left) > 1 else ''} {', '.join(map(str, left[:8]))}{' ...' if len(left) > 8 else ''}: "
                "a Merger merges every rank's partial (drop the plan's contributors, or build it anew)")
    for r, prog in enumerate(plan.programs):
        computes = [op for op in prog if op.kind is OpKind.COMPUTE]
        if len(computes) != 1 or computes[0].block not in (None, r):
            return (f"plan {plan.algorithm!r} computes over KV blocks of other ranks (it moves KV, not partials); "
                    "a Merger merges partials: use a plan that merges them (e.g. treeattn.search_plan)")
    return None
