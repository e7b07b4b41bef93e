"""CUDA graphs of a rank's program: captured once, replayed per decode step.

A rank's iteration on NCCL is dozens of small kernels and NCCL calls whose launch costs (a
few µs each from Python) would swamp 16 KB NVLink messages. ``Graphed`` captures one
iteration (point-to-point batches, collectives, merges, the timing and deadline markers)
into a CUDA graph after the eager warm-up runs (which compiled the kernels and opened the
communicators) and replays it: the inputs and the accumulator are buffers that every replay
reuses, so a replay computes what an eager run would. Every replay is followed by one marker
of its own, recorded outside the graph: the markers inside it are recorded again by each
replay, so only that one says when this replay finished while a later one is queued. A
torch whose capture cannot record them as graph nodes (before 2.5: ``comm.EXTERNAL_EVENTS``)
keeps none from inside the graph, since querying them later fails: that marker is the only one.

Every rank captures at the same point of its program and then all agree (one all-reduce): if
any rank's capture failed, every rank keeps running eager and each that failed says why in
one line on stderr (so ranks never mix a captured and an eager program).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from treeattn.errors import TreeattnError
from treeattn.exec.comm import EXTERNAL_EVENTS, Comm, _first_line

__all__ = ["Graphed", "capture"]


class Graphed:
    """``fn`` replayed from a CUDA graph (see ``capture``); calling it replays once and returns
    the captured output (the same tensor every time)."""

    def __init__(self, comm: Comm, graph: torch.cuda.CUDAGraph, out: object, marks: list,
                 before: Callable[[], None] | None, name: str) -> None:
        self.comm = comm
        self.graph = graph
        self.out = out
        self.marks = marks
        """The deadline markers recorded inside the graph (each replay records them again)."""
        self.before = before
        self.name = name

    def __call__(self) -> object:
        if self.before is not None:
            self.before()
        self.graph.replay()
        for mark in self.marks:
            self.comm.track(mark[1], mark[0])
        self.comm.track(f"the end of {self.name}")  # this replay's own marker, after the graph
        return self.out


def capture(comm: Comm, fn: Callable[[], object], name: str,
            before: Callable[[], None] | None = None) -> Callable[[], object]:
    """``fn`` captured as a CUDA graph, or ``fn`` itself when capture failed on any rank.

    Args:
        comm: the ranks (every one calls this at the same point, after warm-up runs of ``fn``).
        fn: one iteration; it must not synchronise the host with the device.
        name: what it is, for the line saying why a capture failed.
        before: host work to do before each replay (not captured), e.g. re-basing a timeline.

    Returns:
        A callable that runs one iteration.
    """
    reason = ""
    graphed = None
    # torch.cuda.graph's exit ends the capture before it restores the caller's stream: where
    # ending it raises, the capture's side stream would stay current for the rest of the process.
    stream = torch.cuda.current_stream(comm.device)
    try:
        comm.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog's thread may query events while this thread captures.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn()
        marks = comm.untracked()  # kept where this torch records them in the graph (EXTERNAL_EVENTS)
        graphed = Graphed(comm, graph, out, marks if EXTERNAL_EVENTS else [], before, name)
    except TreeattnError:  # the program's own failure (a fault injected in a test): not the capture's
        raise
    except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager
        comm.untracked()
        reason = _first_line(exc)
        _abandon()
        torch.cuda.set_stream(stream)
    ok = torch.tensor([0.0 if graphed is None else 1.0], device=comm.device)
    if comm.all_reduce(ok, "min", "CUDA graph agreement", setup=True).item() == 1.0:
        return graphed
    if graphed is None:
        print(f"rank {comm.rank}: CUDA graph capture of {name} failed ({reason}); running it eager",
              file=sys.stderr, flush=True)
    return fn


def _abandon() -> None:
    """Leave a capture that raised: the stream must not stay in capture mode."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        pass
