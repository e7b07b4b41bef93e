"""The Plan IR: one schedule read by the validator, the simulator and the executor alike.

Words we use. A rank's *partial* is its (o_i, lse_i): ``rows`` independent rows (B x Hq)
of (D + 1) values. The rows are cut into ``chunks`` contiguous, near-equal pieces
(``chunk_rows``); chunk ``c`` of every rank covers the same rows. Each rank keeps an
*accumulator* per chunk: the merge of the contributions that reached it so far. A
*contribution* is one rank's partial (or, for ring attention, the partial over one KV
block; block j is rank j's KV shard).

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
* COMPUTE is a step of its own: the partial attention over KV ``block`` (default: the
  rank's own shard), merged into every chunk's accumulator.
* COLLECTIVE is a step of its own, issued by every rank in the same order; it stands for a
  library collective over all ranks (NCCL/gloo pick its algorithm). ``coll`` is
  ``allreduce`` or ``allgather``; ``reduce`` is ``max``/``sum``/``merge``; ``part`` names
  what it carries: ``lse`` (one fp32 value a row), ``num`` (the weighted output, D values a
  row), ``den`` (the weight, one value a row), ``partial`` (the whole partial). The paper's
  method is three: allreduce max lse, allreduce sum num, allreduce sum den; their effect
  is the merge of all accumulators once all three are done. ``allgather partial`` merges
  the gathered partials locally.
* Attention plans start with empty accumulators and fill them by COMPUTE; raw payload
  plans (``RawPayload``) start with each rank's own buffer in every chunk.
* At the end every rank in ``result_ranks`` must hold, in every chunk, each rank's
  contribution exactly once (or, when ``Plan.contributors`` is set, exactly the
  contributions of those ranks: a broadcast from rank r has ``contributors=(r,)``).

Precisions the validator enforces (they follow from the rules above):

* Two ops of one step may not both write one chunk when one of them is a RECV_COPY (the
  result would depend on their order); several RECV_MERGE into one chunk are fine.
* A KV-block transfer (``block`` set) has ``chunk=None`` and is a SEND matched by a
  RECV_COPY; RECV_MERGE never carries a block. COMPUTE has ``chunk=None``. Raw payload
  plans have neither COMPUTE nor blocks. A rank initially holds its own KV block only;
  blocks it receives stay held (memory is not modelled here).
* A SEND (or a COLLECTIVE) of a chunk whose accumulator is still empty is an error: it
  would ship the identity, and in an attention plan it means COMPUTE came too late.
* COLLECTIVE ``chunk`` (None = all chunks) restricts it to those rows. The valid forms:
  ``allreduce max lse``, ``allreduce sum num``, ``allreduce sum den`` (attention plans
  only: the trio; each of the three runs over the same accumulators on every rank, and
  they take effect once all three are done), ``allreduce R partial`` and
  ``allgather R partial`` with R the payload's reduce op (``merge`` for attention,
  ``sum`` for raw payloads): every rank's accumulator becomes the merge of all of them.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from treeattn.errors import PlanFormatError
from treeattn.workload import Payload, RawPayload, Workload

__all__ = [
    "PLAN_VERSION",
    "OpKind",
    "Op",
    "TopologyRef",
    "Plan",
    "chunk_rows",
    "message_bytes",
]

PLAN_VERSION = 1
"""Only change this when the file format changes; ``plan.io`` upgrades older files."""


class OpKind(StrEnum):
    """What one operation of a rank's program does (see the module docstring)."""

    COMPUTE = "compute"
    SEND = "send"
    RECV_MERGE = "recv_merge"
    RECV_COPY = "recv_copy"
    COLLECTIVE = "collective"


COLLECTIVES = ("allreduce", "allgather")
REDUCES = ("max", "sum", "merge")
PARTS = ("lse", "num", "den", "partial")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of one rank's program."""

    kind: OpKind
    step: int
    """Ops of a rank sharing a step are posted together; steps never decrease."""
    peer: int | None = None
    """The other rank of a SEND or RECV_*."""
    chunk: int | None = None
    """Row chunk carried; None = all chunks in one message."""
    block: int | None = None
    """KV block (ring attention): sent, received, or computed over."""
    coll: str | None = None
    """COLLECTIVE only: ``allreduce`` or ``allgather``."""
    reduce: str | None = None
    """COLLECTIVE only: ``max``, ``sum`` or ``merge``."""
    part: str | None = None
    """COLLECTIVE only: ``lse``, ``num``, ``den`` or ``partial``."""

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
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while making or reading a large plan.

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

    @classmethod
    def of(cls, topology: Any) -> TopologyRef:
        """The reference of a ``Topology`` (anything with ``name`` and ``fingerprint``)."""
        if isinstance(topology, TopologyRef):
            return topology
        return cls(name=topology.name, fingerprint=topology.fingerprint)


@dataclass(frozen=True)
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "programs", tuple(tuple(p) for p in self.programs))
        object.__setattr__(self, "result_ranks", tuple(self.result_ranks))
        if self.contributors is not None:
            object.__setattr__(self, "contributors", tuple(self.contributors))
        # Plain JSON data (lists, not tuples) so that a plan equals itself after a file round trip.
        object.__setattr__(self, "params", _plain(self.params, "plan.params"))
        object.__setattr__(self, "notes", _plain(self.notes, "plan.notes"))
        if self.predicted_us is not None:
            if not isinstance(self.predicted_us, (int, float)) or not math.isfinite(self.predicted_us):
                raise PlanFormatError(f"plan.predicted_us must be a finite number, got {self.predicted_us!r}")
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

    @property
    def ranks(self) -> int:
        return len(self.workload.split) if isinstance(self.workload, Workload) else self.workload.ranks

    @property
    def is_raw(self) -> bool:
        return isinstance(self.workload, RawPayload)


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


def chunk_rows(rows: int, chunks: int, chunk: int | None) -> tuple[int, int]:
    """Row range [start, stop) of ``chunk`` when ``rows`` are cut into ``chunks`` near-equal
    contiguous pieces (the first ``rows % chunks`` pieces one row longer); None = all rows."""
    if chunk is None:
        return 0, rows
    base, extra = divmod(rows, chunks)
    start = chunk * base + min(chunk, extra)
    return start, start + base + (1 if chunk < extra else 0)


def message_bytes(plan: Plan, op: Op) -> int:
    """Bytes one SEND/RECV or one rank's share of a COLLECTIVE moves (a COLLECTIVE's
    ``chunk`` restricts it to that chunk's rows, like a transfer's)."""
    w = plan.workload
    if op.block is not None and op.kind is not OpKind.COMPUTE:
        return w.kv_bytes(op.block)
    start, stop = chunk_rows(w.rows, plan.chunks, op.chunk)
    rows = stop - start
    if op.kind is OpKind.COLLECTIVE:
        if op.part in ("lse", "den"):
            return rows * 4
        if op.part == "num" and isinstance(w, Workload):
            return rows * w.head_dim * w.partial_dtype.nbytes
    return rows * w.row_bytes
