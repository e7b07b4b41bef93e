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
  merge of DESIGN.md section 1, or a sum for raw payloads); RECV_COPY overwrites it
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
  contribution exactly once.
"""

from __future__ import annotations

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
        try:
            object.__setattr__(self, "kind", OpKind(self.kind))
        except ValueError:
            kinds = ", ".join(k.value for k in OpKind)
            raise PlanFormatError(f"unknown op kind {self.kind!r}; choose one of {kinds}") from None
        if self.kind in (OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY) and self.peer is None:
            raise PlanFormatError(f"{self.kind.value} op needs a peer")
        if self.kind is OpKind.COLLECTIVE:
            if self.coll not in COLLECTIVES or self.reduce not in REDUCES or self.part not in PARTS:
                raise PlanFormatError(
                    f"collective op needs coll in {COLLECTIVES}, reduce in {REDUCES}, part in {PARTS}; "
                    f"got coll={self.coll!r} reduce={self.reduce!r} part={self.part!r}"
                )

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


@dataclass(frozen=True, slots=True)
class TopologyRef:
    """Which topology a plan was made for."""

    name: str
    fingerprint: str


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "programs", tuple(tuple(p) for p in self.programs))
        object.__setattr__(self, "result_ranks", tuple(self.result_ranks))
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


def chunk_rows(rows: int, chunks: int, chunk: int | None) -> tuple[int, int]:
    """Row range [start, stop) of ``chunk`` when ``rows`` are cut into ``chunks`` near-equal
    contiguous pieces (the first ``rows % chunks`` pieces one row longer); None = all rows."""
    if chunk is None:
        return 0, rows
    base, extra = divmod(rows, chunks)
    start = chunk * base + min(chunk, extra)
    return start, start + base + (1 if chunk < extra else 0)


def message_bytes(plan: Plan, op: Op) -> int:
    """Bytes one SEND/RECV or one rank's share of a COLLECTIVE moves."""
    w = plan.workload
    if op.block is not None and op.kind is not OpKind.COMPUTE:
        return w.kv_bytes(op.block)
    if op.kind is OpKind.COLLECTIVE:
        if op.part in ("lse", "den"):
            return w.rows * 4
        if op.part == "num" and isinstance(w, Workload):
            return w.rows * w.head_dim * w.partial_dtype.nbytes
        return w.payload_bytes
    start, stop = chunk_rows(w.rows, plan.chunks, op.chunk)
    return (stop - start) * w.row_bytes
