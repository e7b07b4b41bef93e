"""The Plan IR: one schedule read by the validator, the simulator and the executor alike.

Words we use. A rank's *partial* is its (o_i, lse_i): ``rows`` independent rows (B x Hq)
of (D + 1) values, **head-major** (row = h * B + b), so that a contiguous range of query heads
is a contiguous range of rows. The rows are cut into ``chunks`` contiguous pieces
(``Plan.chunk_range``); chunk ``c`` of every rank covers the same rows. Each rank keeps an
*accumulator* per chunk: the merge of the contributions that reached it so far. A
*contribution* is one rank's partial (or, for ring attention, the partial over one KV
block; block j is rank j's KV shard).

Result layouts (``Plan.layout``, with ``result_ranks``): ``full`` (every result rank ends
with every row: ``all`` when every rank is a result rank, ``root:R`` when only R is) or
``heads`` (reduce-scatter semantics: rank i ends with the rows of its own query heads,
``head_split``: contiguous, as even as possible, larger shares first; for raw payloads the
same rule over elements). In a ``heads`` plan the chunks are aligned with the owners:
``chunks`` is a multiple of p, chunk c belongs to segment ``c // (chunks / p)`` (the rows of
rank ``c // (chunks / p)``), cut into pieces. Every cut falls where an accumulator row starts
at a multiple of 16 bytes wherever there are rows enough, so pieces differ by up to a few rows
(``chunk_rows``).

Semantics (every interpreter implements exactly this):

* A rank's program is an ordered tuple of ``Op``s with non-decreasing ``step``. The ops of
  one step are posted together (isend/irecv in one batch) and the step completes when all
  of them have completed; only then does the rank begin its next step.
* A transfer (a SEND and the RECV that matches it) starts when both sides have posted it.
  The k-th SEND from a to b matches the k-th RECV_* at b from a (FIFO per ordered pair);
  their ``chunk`` and ``block`` must agree.
* SEND carries the accumulator of ``chunk`` as it stood when the step began (or KV
  ``block`` when ``block`` is set). ``chunk=None`` sends every chunk in one message.
* RECV_MERGE merges the received rows into the accumulator at the end of the step (the
  merge of docs/design.md section 1, or a sum for raw payloads); RECV_COPY overwrites it
  (broadcast), or, with ``block`` set, stores that KV block.
* COMPUTE: the partial attention over KV ``block`` (default: the rank's own shard), merged
  into every chunk's accumulator at the end of its step. It may share a step with the
  step's transfers (at most one COMPUTE a step): it runs on the device while they run on
  the links, over a block the rank held when the step began (ring attention computes block
  k while block k + 1 arrives). A SEND of that step carries the accumulator without it.
* COLLECTIVE is a step of its own, issued by every rank in the same order; it stands for
  library collectives over all ranks (NCCL/gloo pick their algorithm). The valid forms,
  what they do and which library calls they are, are ``COLLECTIVE_FORMS``: the paper's
  trio (allreduce max lse, allreduce sum num, allreduce sum den: the merge of all
  accumulators once all three are done), ``allreduce R partial`` and ``allgather R
  partial`` (every rank: the merge of all), ``reducescatter R partial`` (each rank: the
  merge of all in its own chunks; ``heads`` plans), ``alltoall merge partial`` (the same
  effect as one library all-to-all of the rows by owner, then a local merge), ``reduce R
  partial`` (rank ``peer``: the merge of all), with R ``merge`` for attention and ``sum`` for
  raw payloads; and the
  decode-context-parallel pair (``allgather copy lse`` then ``reducescatter sum num``: each
  rank's own chunks) with ``allgather copy q`` (gathers the query; changes no accumulator).
* Attention plans start with empty accumulators and fill them by COMPUTE; raw payload
  plans (``RawPayload``) start with each rank's own buffer in every chunk.
* At the end every rank in ``result_ranks`` must hold, in every chunk it owns (every chunk
  in a ``full`` plan; its own segment in a ``heads`` plan), each rank's contribution
  exactly once (or, when ``Plan.contributors`` is set, exactly the contributions of those
  ranks: a broadcast from rank r has ``contributors=(r,)``).

Precisions the validator enforces (they follow from the rules above):

* Two ops of one step may not both write one chunk when one of them is a RECV_COPY (the
  result would depend on their order); several RECV_MERGE into one chunk are fine, and so
  is a COMPUTE beside them (it writes every chunk, so it may not share a step with a
  RECV_COPY of a chunk).
* A KV-block transfer (``block`` set) has ``chunk=None`` and is a SEND matched by a
  RECV_COPY; RECV_MERGE never carries a block. COMPUTE has ``chunk=None``. Raw payload
  plans have neither COMPUTE nor blocks. A rank initially holds its own KV block only;
  blocks it receives stay held (their memory is modelled by ``treeattn.cost.memory``).
* A SEND (or a COLLECTIVE) of a chunk whose accumulator is still empty is an error: it
  would ship the identity, and in an attention plan it means COMPUTE came too late.
* COLLECTIVE ``chunk`` (None = all chunks) restricts it to those rows. The trio and the
  pair each run over the same accumulators on every rank, and take effect once complete.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from treeattn.errors import PlanFormatError
from treeattn.units import DType
from treeattn.workload import Payload, RawPayload, Workload, even_split

__all__ = [
    "PLAN_VERSION",
    "REDUCTIONS",
    "widened",
    "collective_row_bytes",
    "exchanged_chunks",
    "exchanged_of",
    "stacked_exchanges",
    "stacked_of",
    "converted_of",
    "step_transfers",
    "contiguous_runs",
    "collective_kernels",
    "lse_copied",
    "wire_converted",
    "LAYOUTS",
    "COLLECTIVE_FORMS",
    "CollectiveForm",
    "OpKind",
    "Op",
    "TopologyRef",
    "Plan",
    "ROW_ALIGN_BYTES",
    "chunk_rows",
    "gc_paused",
    "head_split",
    "message_bytes",
    "element_bytes",
    "element_dtype",
    "row_bytes",
    "row_quantum",
]

PLAN_VERSION = 2
"""Only change this when the file format changes; ``plan.io`` upgrades older files."""


class OpKind(StrEnum):
    """What one operation of a rank's program does (see the module docstring)."""

    COMPUTE = "compute"
    SEND = "send"
    RECV_MERGE = "recv_merge"
    RECV_COPY = "recv_copy"
    COLLECTIVE = "collective"


COLLECTIVES = ("allreduce", "allgather", "reducescatter", "reduce", "alltoall")
REDUCES = ("max", "sum", "merge", "copy")
PARTS = ("lse", "num", "den", "partial", "q")
LAYOUTS = ("full", "heads")


@dataclass(frozen=True, slots=True)
class CollectiveForm:
    """What one valid (coll, reduce, part) COLLECTIVE does and which library calls it is.

    The validator applies ``effect``, the simulator times ``calls`` and the executor runs
    them: one table, so that a form cannot exist in one of them only."""

    payloads: tuple[str, ...]
    """Payload kinds it applies to (``attention``, ``raw``)."""
    effect: str
    """``all``: every rank gets the merge of all; ``owner``: each rank in its own chunks;
    ``root``: rank ``peer`` only; ``group``: a part of ``group``; ``none``: no accumulator
    changes (the query's all-gather)."""
    calls: tuple[tuple[str, str], ...]
    """The library calls, in order: (collective, what it carries per row: ``lse``/``den``
    one fp32, ``num`` D partial-dtype values, ``wnum`` D + 1 (the weighted output and its
    weight), ``partial`` a packed row, ``q`` the query)."""
    group: str | None = None
    """``trio`` or ``dcp``: the collectives that take effect together (``GROUPS``)."""
    part_name: str | None = None
    """Which part of its group it is."""
    local_merge: bool = False
    """Every rank merges what it received (all-gather of partials: every row, p times; the
    all-to-all: its own segment's rows, p times)."""
    kernels: int = 0
    """The other local kernels each rank launches around the calls (``exec.collectives``, on a
    GPU, where the merge arithmetic is one compiled kernel a call): copies of the lse out of the
    packed rows, the weights, ``finish``, results stored back. The simulator charges them as
    the executor's own merges and copies (``collective_kernels``)."""
    result_kernels: int = 0
    """Of ``kernels``, those only the ranks that get a result run (storing it: the root of a
    reduce, a chunk's owner)."""
    narrow_kernels: int = 0
    """Kernels more on a narrow wire (``Plan.narrow_wire``): partials converted to the wire
    dtype before the calls (two; a sum comes back to fp32 in the copy that stores it); and, where
    the wire's lse is not aligned (``lse_copied``), one more to copy it out of a received
    stack before the local merge."""


_ATT, _BOTH = ("attention",), ("attention", "raw")
COLLECTIVE_FORMS: dict[tuple[str, str, str], CollectiveForm] = {
    ("allreduce", "max", "lse"): CollectiveForm(_ATT, "group", (("allreduce", "lse"),), "trio", "lse", kernels=2),
    ("allreduce", "sum", "num"): CollectiveForm(_ATT, "group", (("allreduce", "num"),), "trio", "num", kernels=2),
    # The weights run eager (clamp, subtract, exp); the trio finishes after its last part.
    ("allreduce", "sum", "den"): CollectiveForm(_ATT, "group", (("allreduce", "den"),), "trio", "den", kernels=5),
    # (each rank then corrects its own output by the gathered lse: a local kernel)
    ("allgather", "copy", "lse"): CollectiveForm(_ATT, "group", (("allgather", "lse"),), "dcp", "lse",
                                                 local_merge=True, kernels=1),
    ("reducescatter", "sum", "num"): CollectiveForm(_ATT, "group", (("reducescatter", "num"),), "dcp", "num",
                                                     kernels=2),
    ("allgather", "copy", "q"): CollectiveForm(_ATT, "none", (("allgather", "q"),), kernels=3),
    # No library reduces with the merge: a max of the rows' lse first, then one sum of (w o, w).
    ("allreduce", "merge", "partial"): CollectiveForm(_ATT, "all", (("allreduce", "lse"), ("allreduce", "wnum")),
                                                      kernels=3),
    ("reducescatter", "merge", "partial"): CollectiveForm(_ATT, "owner",
                                                          (("allreduce", "lse"), ("reducescatter", "wnum")), kernels=3,
                                                          result_kernels=1),
    ("reduce", "merge", "partial"): CollectiveForm(_ATT, "root", (("allreduce", "lse"), ("reduce", "wnum")), kernels=3,
                                                   result_kernels=1),
    ("allgather", "merge", "partial"): CollectiveForm(_ATT, "all", (("allgather", "partial"),), local_merge=True,
                                                      narrow_kernels=2),
    # vLLM's all-to-all variant: rank j gets every rank's rows of its own segment, merges them.
    ("alltoall", "merge", "partial"): CollectiveForm(_ATT, "owner", (("alltoall", "partial"),), local_merge=True,
                                                     narrow_kernels=2),
    ("allreduce", "sum", "partial"): CollectiveForm(("raw",), "all", (("allreduce", "partial"),)),
    ("allgather", "sum", "partial"): CollectiveForm(("raw",), "all", (("allgather", "partial"),), local_merge=True),
    # raw sums land in place (``exec.collectives``); a padded reduce-scatter stores its rows (``padding_kernels``)
    ("reducescatter", "sum", "partial"): CollectiveForm(("raw",), "owner", (("reducescatter", "partial"),)),
    ("reduce", "sum", "partial"): CollectiveForm(("raw",), "root", (("reduce", "partial"),)),
}
"""Every valid COLLECTIVE, by (coll, reduce, part)."""

GROUPS: dict[str, tuple[frozenset[str], str]] = {
    "trio": (frozenset({"lse", "num", "den"}), "all"),
    "dcp": (frozenset({"lse", "num"}), "owner"),
}
"""Collectives that take effect together: their parts, and the effect once all have run."""


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of one rank's program."""

    kind: OpKind
    step: int
    """Ops of a rank sharing a step are posted together; steps never decrease."""
    peer: int | None = None
    """The other rank of a SEND or RECV_*; the root of a ``reduce`` COLLECTIVE."""
    chunk: int | None = None
    """Row chunk carried; None = all chunks in one message."""
    block: int | None = None
    """KV block (ring attention): sent, received, or computed over."""
    coll: str | None = None
    """COLLECTIVE only: ``allreduce``, ``allgather``, ``reducescatter`` or ``reduce``."""
    reduce: str | None = None
    """COLLECTIVE only: ``max``, ``sum``, ``merge`` or ``copy`` (a gather that reduces nothing)."""
    part: str | None = None
    """COLLECTIVE only: ``lse``, ``num``, ``den``, ``partial`` or ``q``."""

    def __post_init__(self) -> None:
        kind = self.kind
        if type(kind) is not OpKind:  # plans hold hundreds of thousands of ops: skip the enum call when we can
            try:
                kind = OpKind(kind)
            except ValueError:
                kinds = ", ".join(k.value for k in OpKind)
                raise PlanFormatError(f"unknown op kind {self.kind!r}; choose one of {kinds}") from None
            object.__setattr__(self, "kind", kind)
        if kind is OpKind.COLLECTIVE:
            if self.coll not in COLLECTIVES or self.reduce not in REDUCES or self.part not in PARTS:
                raise PlanFormatError(
                    f"collective op needs coll in {COLLECTIVES}, reduce in {REDUCES}, part in {PARTS}; "
                    f"got coll={self.coll!r} reduce={self.reduce!r} part={self.part!r}"
                )
        elif self.peer is None and kind is not OpKind.COMPUTE:
            raise PlanFormatError(f"{kind.value} op needs a peer")

    @property
    def is_transfer(self) -> bool:
        return self.kind in (OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "step": self.step}
        for key in ("peer", "chunk", "block", "coll", "reduce", "part"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


_new = object.__new__
_SETTERS = tuple(Op.__dict__[name].__set__ for name in ("kind", "step", "peer", "chunk", "block", "coll", "reduce",
                                                        "part"))


def _unchecked_op(kind: OpKind, step: int, peer: int | None = None, chunk: int | None = None,
                  block: int | None = None, coll: str | None = None, reduce: str | None = None,
                  part: str | None = None) -> Op:
    """An ``Op`` made without ``__post_init__``: for builders and the file loader, which make
    hundreds of thousands of ops whose fields they already checked (the validator re-checks
    every op anyway). ``kind`` must already be an ``OpKind``."""
    op = _new(Op)
    s = _SETTERS
    s[0](op, kind)
    s[1](op, step)
    s[2](op, peer)
    s[3](op, chunk)
    s[4](op, block)
    s[5](op, coll)
    s[6](op, reduce)
    s[7](op, part)
    return op


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while making or reading large plans (a search).

    A 16,384-rank plan allocates about a million small objects, none of them in cycles; the
    collector would rescan the growing heap again and again (2-5x the time of the work)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True, slots=True)
class TopologyRef:
    """Which topology a plan was made for."""

    name: str
    fingerprint: str
    source: str | None = None
    """Where to find it again when ``name`` does not (a topology file: its path relative to
    the plan file's folder, maybe with a ``[ranks ...]`` selection); None: by its name."""
    base: str | None = field(default=None, compare=False)
    """The folder a relative ``source`` is relative to: the plan file's, which ``load_plan``
    sets (not written into plans; ``treeattn.save_plan`` rebases the source on it)."""

    @classmethod
    def of(cls, topology: Any) -> TopologyRef:
        """The reference of a ``Topology`` (anything with ``name`` and ``fingerprint``)."""
        if isinstance(topology, TopologyRef):
            return topology
        return cls(name=topology.name, fingerprint=topology.fingerprint)


@dataclass(frozen=True, repr=False)
class Plan:
    """A versioned, self-describing schedule: per-rank programs plus what they were made for."""

    algorithm: str
    """Builder name (``star``, ``kary``, ``butterfly``, ..., ``allreduce3``)."""
    params: dict[str, Any]
    """Builder parameters (root, fanout, parent list, groups, ...): JSON scalars and lists."""
    workload: Payload
    topology: TopologyRef
    chunks: int
    """Row chunks the partial is cut into."""
    programs: tuple[tuple[Op, ...], ...]
    """programs[r]: rank r's operations in order."""
    result_ranks: tuple[int, ...]
    """Ranks that must end holding the full result (all ranks for an all-reduce pattern)."""
    predicted_us: float | None = None
    """Simulated time on ``topology`` when the plan was written (informational)."""
    version: int = PLAN_VERSION
    notes: dict[str, Any] = field(default_factory=dict)
    """Free-form, deterministic extras (search statistics, bounds)."""
    contributors: tuple[int, ...] | None = None
    """Ranks whose contributions the result must hold; None = every rank (a reduction).
    A broadcast from rank r sets ``(r,)``."""
    layout: str = "full"
    """``full``: each result rank ends with every row; ``heads``: each rank with its own
    query heads' rows (see the module docstring)."""

    def __repr__(self) -> str:
        # The programs of 32 ranks print as 230,000 characters: a summary, as verify's line.
        ops = sum(len(prog) for prog in self.programs)
        time = "" if self.predicted_us is None else f", predicted_us={self.predicted_us:.3f}"
        return (f"Plan(algorithm={self.algorithm!r}, params={self.params!r}, ranks={self.ranks}, "
                f"chunks={self.chunks}, result={self.result!r}, ops={ops}{time}, topology={self.topology.name!r}, "
                f"workload={self.workload!r})")

    def __post_init__(self) -> None:
        object.__setattr__(self, "programs", tuple(tuple(p) for p in self.programs))
        object.__setattr__(self, "result_ranks", tuple(self.result_ranks))
        if self.contributors is not None:
            object.__setattr__(self, "contributors", tuple(self.contributors))
        # Plain JSON data (lists, not tuples) so that a plan equals itself after a file round trip.
        object.__setattr__(self, "params", _plain(self.params, "plan.params"))
        object.__setattr__(self, "notes", _plain(self.notes, "plan.notes"))
        if self.predicted_us is not None:
            if (not isinstance(self.predicted_us, (int, float)) or not math.isfinite(self.predicted_us)
                    or self.predicted_us < 0):
                raise PlanFormatError(f"plan.predicted_us must be a finite number of microseconds, 0 or more, got "
                                      f"{self.predicted_us!r}")
            object.__setattr__(self, "predicted_us", float(self.predicted_us))
        if self.version != PLAN_VERSION:
            raise PlanFormatError(f"plan version {self.version} is not supported (this treeattn reads {PLAN_VERSION})")
        if not isinstance(self.chunks, int) or self.chunks < 1:
            raise PlanFormatError(f"plan.chunks must be a positive integer, got {self.chunks!r}")
        if self.chunks > self.workload.rows:
            raise PlanFormatError(f"plan.chunks ({self.chunks}) exceeds the payload's rows ({self.workload.rows})")
        if len(self.programs) != self.ranks:
            raise PlanFormatError(
                f"plan has {len(self.programs)} rank programs but its workload has {self.ranks} ranks"
            )
        if self.layout not in LAYOUTS:
            raise PlanFormatError(f"plan.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.layout == "heads":
            p = self.ranks
            units = self.workload.q_heads if isinstance(self.workload, Workload) else self.workload.rows
            if p > units:
                what = "query heads" if isinstance(self.workload, Workload) else "elements"
                raise PlanFormatError(f"a heads layout needs a share for every rank: {units} {what} over {p} ranks")
            if self.chunks % p:
                raise PlanFormatError(f"a heads layout plan cuts every rank's rows alike: plan.chunks ({self.chunks}) "
                                      f"must be a multiple of the {p} ranks")
            pieces = self.chunks // p
            short = min(stop - start for start, stop in self.segments)
            if pieces > short:
                raise PlanFormatError(f"plan.chunks ({self.chunks}) cuts a rank's {short} rows into {pieces} pieces; "
                                      "use fewer chunks")

    @property
    def ranks(self) -> int:
        return len(self.workload.split) if isinstance(self.workload, Workload) else self.workload.ranks

    @property
    def is_raw(self) -> bool:
        return isinstance(self.workload, RawPayload)

    @property
    def result(self) -> str:
        """The result layout in the CLI's words: ``all``, ``heads``, ``root:R`` (or the result
        ranks, ``ranks:0,3``, for a plan made by hand)."""
        if self.layout == "heads":
            return "heads"
        if len(self.result_ranks) == self.ranks:
            return "all"
        if len(self.result_ranks) == 1:
            return f"root:{self.result_ranks[0]}"
        return "ranks:" + ",".join(map(str, self.result_ranks))

    @cached_property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """Per rank, the rows [start, stop) it owns in a ``heads`` layout (``head_split``)."""
        w = self.workload
        unit = w.batch if isinstance(w, Workload) else 1
        shares = head_split(w.q_heads if isinstance(w, Workload) else w.rows, self.ranks)
        out, at = [], 0
        for n in shares:
            out.append((at * unit, (at + n) * unit))
            at += n
        return tuple(out)

    @cached_property
    def padded_runs(self) -> tuple[tuple[int, int, int], ...]:
        """Where the ``heads`` segments are uneven, a reduce-scatter to them pads each to the
        longest (the library scatters equal pieces): runs (first, stop, rows) of consecutive
        segments of one length, each moved into the padded input by one copy (the padding is
        left unwritten: it lands in rows the owner drops). Empty where the segments are even."""
        sizes = [b - a for a, b in self.segments]
        if min(sizes) == max(sizes):
            return ()
        runs: list[list[int]] = []
        for j, n in enumerate(sizes):
            if runs and runs[-1][2] == n:
                runs[-1][1] = j + 1
            else:
                runs.append([j, j + 1, n])
        return tuple((a, b, n) for a, b, n in runs)

    def owned_rows(self, chunk: int | None) -> tuple[int, ...]:
        """Per rank, how many rows of ``chunk`` (None: every row) lie in its own segment: what
        an all-to-all by owner delivers to each rank from every rank."""
        start, stop = self.chunk_range(chunk)
        return tuple(max(0, min(b, stop) - max(a, start)) for a, b in self.segments)

    def alltoall_bytes(self, chunk: int | None, what: str) -> int:
        """Bytes of an all-to-all by owner of ``chunk``'s rows as ``what`` (``row_bytes``),
        sized for the rank that owns the most: it receives that many from every rank (p
        pieces of its own rows), and every rank's buffer is counted at that size."""
        return self.ranks * max(self.owned_rows(chunk)) * row_bytes(self.workload, what)

    def chunk_range(self, chunk: int | None) -> tuple[int, int]:
        """Rows [start, stop) of ``chunk`` (None: every row); see the module docstring."""
        rows = self.workload.rows
        if chunk is None:
            return 0, rows
        quantum = row_quantum(self.workload)
        if self.layout != "heads":
            return chunk_rows(rows, self.chunks, chunk, quantum)
        pieces = self.chunks // self.ranks
        seg, piece = divmod(chunk, pieces)
        start, stop = self.segments[seg]
        return chunk_rows(stop - start, pieces, piece, quantum, start)

    @property
    def narrow_wire(self) -> bool:
        """Whether partials travel in a dtype narrower than the fp32 accumulator (``partial_dtype``)."""
        return not self.is_raw and self.workload.partial_dtype.nbytes < 4

    @cached_property
    def rounded_runs(self) -> tuple[tuple[int, int], ...]:
        """The rows every rank rounds to the partial dtype when a run ends, as contiguous runs
        [start, stop): those of the chunks some rank copies from another on a narrow wire. A
        copy lands rounded, so the rank it came from and those that merged the same rows round
        theirs too, and every rank ends with the same bits (``exec.interpreter``); the
        simulator charges the pass (``cost.program``)."""
        if not self.narrow_wire:
            return ()
        chunks = dict.fromkeys(op.chunk for prog in self.programs for op in prog
                               if op.kind is OpKind.RECV_COPY and op.block is None)
        return contiguous_runs(self.chunk_range(c) for c in chunks)

    def owned_chunks(self, rank: int) -> range:
        """The chunks ``rank`` must hold at the end when it is a result rank."""
        if self.layout != "heads":
            return range(self.chunks)
        pieces = self.chunks // self.ranks
        return range(rank * pieces, (rank + 1) * pieces)

    def owner(self, chunk: int) -> int | None:
        """The rank that owns ``chunk`` in a ``heads`` plan (None in a ``full`` plan)."""
        return chunk // (self.chunks // self.ranks) if self.layout == "heads" else None


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain JSON data: tuples become lists, dict keys must be strings, floats finite."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PlanFormatError(f"{where} has a non-string key {key!r}; plan files need string keys")
            out[key] = _plain(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, StrEnum):
        return value.value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PlanFormatError(f"{where} = {value!r}: plan files hold finite numbers only")
        return value
    raise PlanFormatError(f"{where} = {value!r} ({type(value).__name__}) is not plain JSON data")


def head_split(units: int, ranks: int) -> tuple[int, ...]:
    """How a ``heads`` layout shares ``units`` query heads (or raw elements) among ``ranks``:
    contiguous, as even as possible, larger shares first (32 heads over 3 ranks: 11, 11, 10)."""
    return even_split(units, ranks)


ROW_ALIGN_BYTES = 16
"""Where a chunk's rows start in the accumulator, where they can: a GPU kernel loads 16-byte
vectors, and a compiled kernel handed a row slice that starts elsewhere copies it in and out
around the call (inductor assumes the alignment its first inputs had)."""


def row_quantum(workload: Payload) -> int:
    """The fewest accumulator rows whose bytes make a multiple of ``ROW_ALIGN_BYTES`` (4 for
    packed fp32 partials at an even head dim, 4 fp32 or 8 bf16 elements of a raw payload)."""
    return ROW_ALIGN_BYTES // math.gcd(ROW_ALIGN_BYTES, workload.acc_row_bytes)


def chunk_rows(rows: int, chunks: int, chunk: int | None, quantum: int = 1, first: int = 0) -> tuple[int, int]:
    """Row range [start, stop) of ``chunk`` when rows [first, first + rows) are cut into
    ``chunks`` contiguous pieces; None = all of them.

    The cuts fall on multiples of ``quantum`` rows, and the whole quanta are shared as evenly
    as possible (the first pieces one quantum more), the rows before the first multiple going
    to the first piece and those after the last to the last. Where there are fewer whole quanta
    than pieces, the rows themselves are shared so (the first ``rows % chunks`` pieces one row
    longer)."""
    end = first + rows
    if chunk is None:
        return first, end
    lo, hi = -(-first // quantum), end // quantum
    if hi - lo < chunks:
        lo, hi, quantum = first, end, 1
    base, extra = divmod(hi - lo, chunks)

    def cut(i: int) -> int:
        return first if i == 0 else end if i == chunks else (lo + i * base + min(i, extra)) * quantum

    return cut(chunk), cut(chunk + 1)


def collective_kernels(plan: Plan, op: Op, rank: int | None = None) -> int:
    """The local kernels besides a merge that ``rank`` (None: a rank that gets a result)
    launches for COLLECTIVE ``op`` (``CollectiveForm.kernels``, less ``result_kernels`` where
    it gets none; ``narrow_kernels`` on a narrow wire; for each of its calls that reduces fp8
    through fp32 (``widened``) two, one for a partial's; and a reduce-scatter's padding,
    ``Plan.padded_runs``)."""
    form = COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)]
    kernels = form.kernels
    kernels += padding_kernels(plan, op)
    if rank is not None and form.result_kernels:
        to = op.peer if form.effect == "root" else None if op.chunk is None else plan.owner(op.chunk)
        kernels -= form.result_kernels if to is not None and rank != to else 0
    # an fp8 reduction goes through an fp32 copy and back (``exec.comm``): two kernels a call,
    # one where a partial's sum is finished from the fp32 sum (``Comm.all_reduce``'s widen)
    per = 2 if plan.is_raw else 1
    wide = per * sum(widened(plan.workload, coll, what) for coll, what in form.calls)
    if not plan.narrow_wire:
        return kernels + wide
    stack = form.local_merge and op.part == "partial" and lse_copied(plan.workload)
    return kernels + form.narrow_kernels + stack + wide


def padding_kernels(plan: Plan, op: Op) -> int:
    """The copies a COLLECTIVE ``op`` runs to pad uneven heads segments (``Plan.padded_runs``):
    one per run, together copying the rows once, and for a raw payload the store of the
    rank's summed rows (an even reduce-scatter sums into them in place)."""
    if op.coll != "reducescatter" or op.chunk is not None or not plan.padded_runs:
        return 0
    return len(plan.padded_runs) + plan.is_raw


def lse_copied(workload: Payload) -> bool:
    """Whether a merge of partials received on a narrow wire copies their lse out first
    (``exec.merge.split_wire``): where its fp32 bytes, after Dv values of the partial dtype,
    do not start at a multiple of 4 bytes (odd Dv in bf16 or fp16, Dv not a multiple of 4 in
    fp8); elsewhere the merge reads them in place."""
    return isinstance(workload, Workload) and workload.value_dim * workload.partial_dtype.nbytes % 4 != 0


def contiguous_runs(spans: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Row ranges [start, stop) joined into the fewest runs covering the same rows, in row
    order (ranges that touch or overlap join): what one kernel over a slice can treat at once."""
    runs: list[list[int]] = []
    for start, stop in sorted(spans):
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], stop)
        else:
            runs.append([start, stop])
    return tuple((a, b) for a, b in runs)


def wire_converted(plan: Plan, ops: Iterable[Op], exchanged: set[int | None]) -> tuple[int | None, ...]:
    """The chunks of the accumulator a rank's step (``ops``) sends converted to a narrow wire
    (``Plan.narrow_wire``): each once, however many peers it goes to; none on an fp32 wire.
    An exchanged chunk (``exchanged_chunks``) is converted into its stack instead."""
    if not plan.narrow_wire:
        return ()
    return converted_of(step_transfers(ops)[0], exchanged)


def converted_of(sent: dict[int | None, list[int | None]], exchanged: set[int | None]) -> tuple[int | None, ...]:
    """``wire_converted`` of a step on a narrow wire, from its ``step_transfers`` (``sent``)."""
    return tuple(c for c in sent if c not in exchanged)


def exchanged_chunks(ops: Iterable[Op]) -> set[int | None]:
    """The chunks one rank's step (``ops``: its ops of one step) exchanges: it sends the chunk
    to exactly the peers it merges it from, once each, and computes nothing beside. The ranks
    of an exchange each merge the same partials (direct, butterfly), so the executor merges
    them in rank order from a stack holding its own as sent, and every rank ends with the same
    bits; the stack's own slot is a message more in memory (``cost.memory``)."""
    sent, merged, computes = step_transfers(ops)
    return set() if computes else exchanged_of(sent, merged)


def step_transfers(ops: Iterable[Op]) -> tuple[dict[int | None, list[int | None]],
                                                dict[int | None, list[int | None]], bool]:
    """One rank's step read in one pass: per chunk, the peers it SENDs the accumulator of
    the chunk to and the peers it RECV_MERGEs it from (chunks in order of first appearance),
    and whether the step COMPUTEs (``exchanged_chunks``; ``cost.program`` reads every step
    of every candidate plan so)."""
    sent: dict[int | None, list[int | None]] = {}
    merged: dict[int | None, list[int | None]] = {}
    computes = False
    send, merge, compute = OpKind.SEND, OpKind.RECV_MERGE, OpKind.COMPUTE
    for op in ops:
        kind = op.kind
        if kind is send:
            if op.block is None:
                sent.setdefault(op.chunk, []).append(op.peer)
        elif kind is merge:
            merged.setdefault(op.chunk, []).append(op.peer)
        elif kind is compute:
            computes = True
    return sent, merged, computes


def exchanged_of(sent: dict[int | None, list[int | None]],
                 merged: dict[int | None, list[int | None]]) -> set[int | None]:
    """``exchanged_chunks`` of a step that does not COMPUTE, from its ``step_transfers``."""
    return {c for c, peers in merged.items()
            if len(set(peers)) == len(peers) and sorted(peers) == sorted(sent.get(c, []))}


def stacked_exchanges(plan: Plan, ops: Iterable[Op]) -> set[int | None]:
    """The exchanged chunks (``exchanged_chunks``) a rank's step merges from a stack holding
    its own slot: every one of a plan of partials; of a raw payload, those it gets from two
    peers or more. A raw sum of two, the accumulator and one part, gives the same bits either
    way round (IEEE addition commutes), so a butterfly's partners agree without the copy."""
    sent, merged, computes = step_transfers(ops)
    return set() if computes else stacked_of(plan.is_raw, sent, merged)


def stacked_of(raw: bool, sent: dict[int | None, list[int | None]],
               merged: dict[int | None, list[int | None]]) -> set[int | None]:
    """``stacked_exchanges`` of a step that does not COMPUTE, from its ``step_transfers``:
    of a raw payload (``raw``), the exchanged chunks it merges from two peers or more."""
    exchanged = exchanged_of(sent, merged)
    if not raw or not exchanged:
        return exchanged
    return {c for c in exchanged if len(merged[c]) >= 2}


def message_bytes(plan: Plan, op: Op) -> int:
    """Bytes one SEND/RECV or one rank's share of a COLLECTIVE moves (a COLLECTIVE's
    ``chunk`` restricts it to that chunk's rows, like a transfer's; the query's all-gather
    moves a rank's share of q: B x Hq x D values of the KV dtype over p)."""
    w = plan.workload
    if op.block is not None and op.kind is not OpKind.COMPUTE:
        return w.kv_bytes(op.block)
    if op.kind is OpKind.COLLECTIVE and op.part == "q" and isinstance(w, Workload):
        return -(-w.query_bytes // plan.ranks)
    start, stop = plan.chunk_range(op.chunk)
    return (stop - start) * row_bytes(w, op.part if op.kind is OpKind.COLLECTIVE else "partial")


def element_dtype(workload: Payload, what: str) -> DType:
    """The element type of a buffer of ``what`` (``row_bytes``'s names, ``q``): fp32 for
    ``lse``/``den``, the query's dtype (the KV cache's, as ``message_bytes`` counts it) for
    ``q``, else the partials' (a raw payload's own)."""
    if isinstance(workload, Workload):
        if what in ("lse", "den"):
            return DType.FP32
        return workload.kv_dtype if what == "q" else workload.partial_dtype
    return workload.dtype


def element_bytes(workload: Payload, what: str) -> int:
    """The element size of a buffer of ``what`` (``element_dtype``)."""
    return element_dtype(workload, what).nbytes


REDUCTIONS = ("allreduce", "reducescatter", "reduce")


def widened(workload: Payload, coll: str, what: str) -> bool:
    """Whether collective ``coll`` of ``what`` runs through fp32: a reduction of fp8, which no
    library reduces (``treeattn.exec.comm`` widens it, 4 bytes an element on the wire)."""
    return coll in REDUCTIONS and element_bytes(workload, what) == 1  # fp8: the one 1-byte dtype


def collective_row_bytes(workload: Payload, coll: str, what: str) -> int:
    """Bytes a row of ``what`` moves in collective ``coll`` (``row_bytes``, x 4 where widened)."""
    return row_bytes(workload, what) * (4 if widened(workload, coll, what) else 1)


def row_bytes(workload: Payload, what: str) -> int:
    """Bytes a row carries as ``what``: ``lse``/``den`` one fp32, ``num`` Dv values of the
    partial dtype, ``wnum`` Dv + 1 of them (the weighted output and its weight), else a
    packed row (``partial``)."""
    if isinstance(workload, Workload):
        if what in ("lse", "den"):
            return 4
        if what == "num":
            return workload.value_dim * workload.partial_dtype.nbytes
        if what == "wnum":  # summed by the collective: the weight too in the partial dtype
            return (workload.value_dim + 1) * workload.partial_dtype.nbytes
    return workload.row_bytes
