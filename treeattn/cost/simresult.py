"""What the simulator (``treeattn.cost.simulate``) returns: per-op timings and the prediction."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OpTiming", "SimResult"]


@dataclass(frozen=True, slots=True)
class OpTiming:
    """When one op ran."""

    rank: int
    op: int
    """Index in the rank's program."""
    kind: str
    peer: int | None
    chunk: int | None
    start_us: float
    """Transfers: when both sides had posted; collectives: when the last rank arrived."""
    end_us: float
    bytes: int

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "op": self.op,
            "kind": self.kind,
            "peer": self.peer,
            "chunk": self.chunk,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "bytes": self.bytes,
        }


@dataclass(frozen=True, slots=True)
class SimResult:
    """What the simulator predicts for one plan on one topology."""

    predicted_us: float
    """When the last rank finishes."""
    per_rank_finish_us: tuple[float, ...]
    critical_path: tuple[tuple[int, int], ...]
    """(rank, op index) pairs, earliest first, ending at the last op of the last rank to finish."""
    timeline: tuple[OpTiming, ...] | None
    """Every op's timing (rank-major order) when asked for, else None."""
    events: int
    """Events processed (a size measure for benchmarks)."""
    transfers: int
    """Messages sent (an empty message is not: ``treeattn.cost.simulate``)."""
    cpu_us: tuple[float, ...] = ()
    """Per rank, the CPU work the host model charged it (messages, steps, computes, merges,
    and its share of host collectives); zeros where ranks are not on host CPUs."""

    def to_dict(self, *, timeline: bool = False) -> dict:
        out = {
            "predicted_us": self.predicted_us,
            "per_rank_finish_us": list(self.per_rank_finish_us),
            "critical_path": [list(x) for x in self.critical_path],
            "events": self.events,
            "transfers": self.transfers,
        }
        if timeline and self.timeline is not None:
            out["timeline"] = [t.to_dict() for t in self.timeline]
        return out
