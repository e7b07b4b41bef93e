"""RCCL's MSCCL all-pairs all-reduce on one node of 8 AMD GPUs with an xGMI link per pair.

RCCL (ROCm/rccl) runs an all-reduce through an MSCCL algorithm before its own tuner picks a
ring or tree whenever one of its algorithm files covers the call (``src/misc/msccl/
msccl_lifecycle.cc``: the size within the file's ``minBytes``-``maxBytes`` and the element
count a multiple of its ``nchunksperloop``), on machines whose topology enables MSCCL (the
8 x MI300X model in ``src/graph/rome_models.cc``). Its files for 8 GPUs
(``tools/msccl-algorithms/allreduce-allpairs-8n-*.xml``) are one all-pairs algorithm: every
GPU sends each peer its share over the xGMI link between them and reduces what it receives,
then sends each peer the reduced share (two steps).

Modelled here:

* when it runs: before RCCL 2.21 only with every rank in a process of its own (RCCL 2.20.5,
  tag rocm-6.2.2, ``msccl_lifecycle.cc`` ``mscclCommCompatible``: two ranks with the same host
  and process hash make the communicator incompatible and ``mscclEnqueueCheck`` falls back to
  RCCL's tuner; so ROCm 6.0-6.2), not under nccl-tests' ``-g G`` or ``-t T``; from 2.21 (tag
  release-staging/rocm-rel-6.3, RCCL 2.21.5; commit 03a3ef3c "Enable single process mode by
  default") ``RCCL_MSCCL_ENABLE_SINGLE_PROCESS`` defaults to 1 and lifts it (AMD's RCCL README
  and usage tips still say the restriction is the default; the source says otherwise;
  ``single_process_blocks``). A single node of 8 ranks, every pair joined by its own xGMI link (RCCL's
  ``rome_model_79``, the one that enables MSCCL; its multi-node MI300X models do not), with
  the call's element count a multiple of the file's chunks a loop. In 4-byte elements (as
  nccl-tests' ``float``; ``elem_bytes`` says otherwise): LL up to 64 KiB (``ll-32tb``, 256
  chunks: from 1 KiB), LL from 64 KiB + 1 B to 512 KiB - 1 B (``ll-64tb``, 512 chunks),
  Simple from 512 KiB to 16 MiB (``simple-op``, out of place; in place ``simple`` to 11 MiB
  and ``simple_2`` from 14 MiB: an in-place call between, as torch.distributed makes, runs
  RCCL's ring, which the model does not tell apart); other sizes fall back to RCCL's ring or
  tree;
* its latency: RCCL does not time MSCCL; the model borrows its tuner's constants for a
  two-step algorithm: the protocol's base latency plus two xGMI hops
  (``src/graph/tuning.cc``: ``baseLat`` 12 us LL, 17 Simple, and the ring row of tuning
  model 5, the MI300X's, which rates xGMI as its NVLink row: 0.8 us LL, 2.1 Simple): 13.6 us
  LL, 21.2 us Simple;
* its transfer: each step moves a share (1/8) of the buffer over every link at once. LL
  moves half a link's rate (8 bytes of every 16 are data), on NCCL's rating of an xGMI link;
  Simple moves ``SIMPLE_ACHIEVED`` of it, fitted: the median rate per link the hisohara
  MI300X rows of 512 KiB-16 MiB imply after the latency above (34.5 GB/s of NCCL's 48); the
  ROCm blog's MI300X rows are held out of the fit (results/published/README.md).

Published MI300X runs (results/published) show where it runs: 23 us at 512 B (RCCL's ring,
which the model times at NCCL's 15 us), 12.8-13.7 us at 1 KiB, 16.6-16.9 us at 256 KiB,
24-25 us at 512 KiB (Simple).

Which RCCL: the files and rules of ROCm/rccl at commit 0cbce2a7 (2024-10-24, the 2.21 series,
which the corpus's MI300X runs of RCCL 2.20-2.22 bracket). AMD's RCCL documentation for
ROCm 7.13 (preview) and later says MSCCL was removed (read there, not checked in a newer
RCCL source): a topology of such a release is mistimed here (a topology
carries no RCCL release to tell). Not modelled: RCCL_MSCCL_FORCE_ENABLE (MSCCL elsewhere), the
average op (no MSCCL), NCCL_MAX_NCHANNELS below a file's channels (the file dropped), MSCCL++
under CUDA-graph capture (sum all-reduces up to 1 MiB), and RCCL's all-to-all files.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALLPAIRS_FILES", "ALLPAIRS_GPUS", "AllpairsFile", "SIMPLE_ACHIEVED", "SINGLE_PROCESS_FROM",
           "allpairs_allreduce", "single_process_blocks"]

ALLPAIRS_GPUS = 8
"""The GPU count RCCL's all-pairs algorithm files are written for."""

SIMPLE_ACHIEVED = 0.72
"""The share of NCCL's xGMI link rating the all-pairs Simple kernels move, fitted (see the
module docstring): 34.5 / 48 GB/s."""

SINGLE_PROCESS_FROM = (2, 21, 0)
"""The first RCCL series that runs MSCCL where one process drives several ranks: 2.21 (ROCm 6.3,
``RCCL_MSCCL_ENABLE_SINGLE_PROCESS`` default 1); 2.20.5 and older (ROCm 6.0-6.2) refuse it."""

# tuning.cc: baseLat (LL, Simple) and tuning_model_5 hwLat[NVLINK][RING] (LL, Simple)
_LATENCY_US = {"LL": 12.0 + 2 * 0.8, "Simple": 17.0 + 2 * 2.1}
_LL_SHARE = 0.5  # LL carries 8 data bytes in every 16


@dataclass(frozen=True, slots=True)
class AllpairsFile:
    """One of RCCL's algorithm files: its protocol, the sizes it covers and its chunks a loop."""

    protocol: str
    min_bytes: int
    max_bytes: int
    chunks_per_loop: int

    def covers(self, nbytes: int, elem_bytes: int = 4) -> bool:
        count, rest = divmod(nbytes, elem_bytes)
        return (self.min_bytes <= nbytes <= self.max_bytes and rest == 0 and count > 0
                and count % self.chunks_per_loop == 0)


ALLPAIRS_FILES = (AllpairsFile("LL", 0, 65536, 256), AllpairsFile("LL", 65537, 524287, 512),
                  AllpairsFile("Simple", 524288, 16777216, 512))
"""allreduce-allpairs-8n-ll-32tb.xml, -ll-64tb.xml (each with its out-of-place -op twin) and
-simple-op.xml (the in-place -simple.xml and -simple_2.xml cover 512 KiB-11 MiB and 14-16 MiB)."""


def single_process_blocks(ranks_per_process: int, rccl_release: tuple[int, int, int] | None,
                          enabled: bool = True) -> bool:
    """Whether RCCL ``rccl_release`` (None: unknown, taken as the 2.21 series this module follows)
    keeps MSCCL off a communicator where one process drives ``ranks_per_process`` ranks
    (nccl-tests' threads x GPUs a process): above 1 before ``SINGLE_PROCESS_FROM`` (2.20.5 has no
    setting for it: ``mscclCommCompatible`` refuses such a communicator whatever the
    environment), and from it where ``RCCL_MSCCL_ENABLE_SINGLE_PROCESS`` is 0 (``enabled``
    False; msccl_lifecycle.cc ``rcclParamMscclEnableSingleProcess``, default 1)."""
    if ranks_per_process <= 1:
        return False
    if rccl_release is not None and rccl_release < SINGLE_PROCESS_FROM:
        return True
    return not enabled


def allpairs_allreduce(ranks: int, link_gbps: float, nbytes: int,
                       elem_bytes: int = 4) -> tuple[str, float, float] | None:
    """(protocol, time, latency), times in us, of RCCL's all-pairs all-reduce of ``nbytes``
    (in elements of ``elem_bytes``: nccl-tests' float by default) on ``ranks`` GPUs whose
    every pair shares an xGMI link rated ``link_gbps``, or None where RCCL would not run it
    (another GPU count, no such link, a size no file covers)."""
    if ranks != ALLPAIRS_GPUS or link_gbps <= 0:
        return None
    proto = next((f.protocol for f in ALLPAIRS_FILES if f.covers(nbytes, elem_bytes)), None)
    if proto is None:
        return None
    latency = _LATENCY_US[proto]
    rate = link_gbps * (_LL_SHARE if proto == "LL" else SIMPLE_ACHIEVED)
    return proto, latency + 2 * nbytes / ranks / (rate * 1e3), latency
