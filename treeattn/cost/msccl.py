"""RCCL's MSCCL all-pairs all-reduce on one node of 8 AMD GPUs with an xGMI link per pair.

RCCL (ROCm/rccl) runs an all-reduce through an MSCCL algorithm before its own tuner picks a
ring or tree whenever one of its algorithm files covers the call (``src/misc/msccl/
msccl_lifecycle.cc``: the size within the file's ``minBytes``-``maxBytes`` and the element
count a multiple of its ``nchunksperloop``), on machines whose topology enables MSCCL (the
8 x MI300X model in ``src/graph/rome_models.cc``). Its files for 8 GPUs
(``tools/msccl-algorithms/allreduce-allpairs-8n-*.xml``, in-place and out-of-place alike) are
one all-pairs algorithm: every GPU sends each peer its share over the xGMI link between them
and reduces what it receives, then sends each peer the reduced share (two steps). The LL
files cover up to 512 KiB; their Simple files (512 KiB-11 MiB and 14-16 MiB) are left to the
ring model, whose rate the all-pairs kernels have not been timed against.

Modelled here (LL only):

* when it runs: a single node of 8 ranks, every pair joined by its own xGMI link; LL
  (``ll-32tb``, 256 chunks a loop) for 1 B-64 KiB, (``ll-64tb``, 512 chunks) for 64 KiB + 1 B to
  512 KiB - 1 B, the count taken in 4-byte elements (nccl-tests' ``float``): a size that is
  not a multiple of 1 KiB (2 KiB for the second file) falls back to RCCL's ring or tree;
* its latency, from RCCL's own constants for a two-step algorithm: the LL base latency 12 us
  plus two xGMI hops of 0.8 us (``src/graph/tuning.cc``: ``baseLat`` and the ring LL row of
  tuning model 5, the MI300X's, which rates xGMI as its NVLink row): 13.6 us;
* its transfer: each step moves a share (1/8) of the buffer over every link at once; LL
  moves half a link's rate (8 bytes of every 16 are data), on NCCL's rating of an xGMI link.

Published MI300X runs (results/published) show the steps it predicts: 23 us at 512 B (RCCL's
ring), 12.8-13.7 us at 1 KiB, 16.6-16.9 us at 256 KiB, 24.8 us at 512 KiB (the Simple file).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALLPAIRS_LL", "ALLPAIRS_GPUS", "AllpairsFile", "allpairs_allreduce"]

ALLPAIRS_GPUS = 8
"""The GPU count RCCL's all-pairs algorithm files are written for."""

_ELEMENT = 4  # bytes of nccl-tests' default element (float)
_BASE_LL_US = 12.0  # tuning.cc baseLat, LL
_XGMI_LL_HOP_US = 0.8  # tuning.cc tuning_model_5 hwLat[NVLINK][RING][LL]
_LL_SHARE = 0.5  # LL carries 8 data bytes in every 16


@dataclass(frozen=True, slots=True)
class AllpairsFile:
    """One of RCCL's algorithm files: the sizes it covers and its chunks a loop."""

    min_bytes: int
    max_bytes: int
    chunks_per_loop: int

    def covers(self, nbytes: int) -> bool:
        count, rest = divmod(nbytes, _ELEMENT)
        return (self.min_bytes <= nbytes <= self.max_bytes and rest == 0 and count > 0
                and count % self.chunks_per_loop == 0)


ALLPAIRS_LL = (AllpairsFile(0, 65536, 256), AllpairsFile(65537, 524287, 512))
"""allreduce-allpairs-8n-ll-32tb.xml and -ll-64tb.xml (and their out-of-place -op twins)."""


def allpairs_allreduce(ranks: int, link_gbps: float, nbytes: int) -> tuple[float, float] | None:
    """(time, latency) in us of RCCL's all-pairs LL all-reduce of ``nbytes`` on ``ranks``
    GPUs whose every pair shares an xGMI link rated ``link_gbps``, or None where RCCL would
    not run it (another GPU count, no such link, a size no file covers)."""
    if ranks != ALLPAIRS_GPUS or link_gbps <= 0 or not any(f.covers(nbytes) for f in ALLPAIRS_LL):
        return None
    latency = _BASE_LL_US + 2 * _XGMI_LL_HOP_US
    per_link = 2 * nbytes / ranks
    return latency + per_link / (link_gbps * _LL_SHARE * 1e3), latency
