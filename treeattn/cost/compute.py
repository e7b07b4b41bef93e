"""Compute model: what the local work of a plan costs on a rank's device (docs/design.md section 5).

Both kernels are memory-bound, so a kernel costs a fixed launch plus the bytes it moves
over the device's memory bandwidth times a share:

* partial attention over KV block j on rank r:
  ``attn_launch + (kv_bytes(j) + q_bytes + partial_bytes) / (mem_bw(r) * attn_share)``,
  where q is B x Hq x D elements of the KV dtype and the partial written is the whole
  (o, lse) of the payload; the fixed cost and the share are the attention kernel's (below).
  A block with zero tokens costs the fixed cost only (the kernel still runs to write the
  empty partial).
* a merge (or raw sum) of k partials of n rows each, received in one step, into the
  accumulator: on a GPU one fused kernel (``treeattn.exec.kernels``) reads the k partials
  and reads and writes the accumulator's n rows, ``(k * n * row_bytes + 2 * n * acc_row) /
  (mem_bw(r) * mem_efficiency)`` (``merge_us``; for one fp32 partial, 3 x its bytes); on a
  host, the eager ops move 3 x the received bytes, the line calibration fits. A RECV_COPY
  of n rows into the accumulator reads and writes them: ``2 * n * row_bytes / ...`` (a
  received KV block is kept where it landed: free). The merges and copies of one step run
  after its transfers: the partials received for one chunk are merged as one kernel (the
  executor stacks them), and each copy is one more, so such a step pays ``launch_us`` per
  kernel plus the sum of their byte terms (``step_local_us``; ``treeattn.cost.program``
  counts them).

The attention kernel's fixed cost is ``cost.attn_launch_us`` where set (calibration's
timing of the kernel, or the family's fit to published decode kernels), else ``launch_us``;
its bandwidth a measured ``cost.attn_gbps``, else the device's memory bandwidth x
``cost.attn_efficiency`` where set (the families' fit on that GPU generation,
docs/attention-model.md), else x ``mem_efficiency``. On GPUs a published fit covers, each of
``attn_launch_us`` and ``attn_efficiency`` the cost leaves unset is the fit's
(``attention_fits.applied_attention_fit``): a hand-written file of H100s times attention as
the dgx-h100 family does. Merges and copies
keep ``launch_us`` and ``mem_efficiency``.

The device is the one the rank is placed on (a GPU, or a host for CPU-only runs). A
device whose ``mem_bw_gbps`` is 0 (hosts may leave it unset) has its memory time not
modelled: its kernels cost the launch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treeattn.topology.attention_fits import fitted_figures
from treeattn.topology.model import DeviceKind, Topology
from treeattn.workload import Payload, Workload

__all__ = ["ComputeModel"]


@dataclass(frozen=True, slots=True)
class ComputeModel:
    """Per-rank kernel costs of one payload on one topology (build with ``ComputeModel.of``)."""

    payload: Payload
    launch_us: float
    """Fixed cost of one kernel (``topo.cost.launch_us``)."""
    eff_bw_gbps: tuple[float, ...]
    """Per rank: device memory bandwidth x efficiency; 0 = memory time not modelled."""
    best_bw_gbps: float = 0.0
    """The fastest rank's effective bandwidth; 0 when some rank's memory time is not modelled
    (then the fastest any kernel can run is its launch)."""
    attn_launch_us: float | None = None
    attn_bw_gbps: float | None = None
    """The attention kernel's own launch and bandwidth when calibrated (every rank)."""
    attn_next_launch_us: float | None = None
    """The launch of a rank's later COMPUTE ops in one run (``cost.attn_next_launch_us``)."""
    attn_eff_bw_gbps: tuple[float, ...] = ()
    """Per rank: memory bandwidth x ``cost.attn_efficiency`` when the topology sets it or its
    GPUs' published fit applies (else empty: the attention kernel reads at ``eff_bw_gbps``)."""
    fused: tuple[bool, ...] = ()
    """Per rank: whether its merges are one fused kernel each (GPU ranks, ``merge_us``'s
    bytes); else (hosts, or empty) the eager ops' byte term, 3 x the received bytes."""
    given_partials: bool = False
    """Whether each rank's own partial is given, as a ``Merger`` call takes it from the model's
    attention kernel: the COMPUTE over the rank's own KV block then costs nothing."""

    @classmethod
    def of(cls, payload: Payload, topo: Topology, given_partials: bool = False) -> ComputeModel:
        """The compute model of ``payload`` on ``topo``'s rank devices.

        Args:
            payload: the workload (attention shape) or raw payload.
            topo: the topology; its ``cost`` supplies launch and efficiency.
            given_partials: each rank's own partial is given (``ComputeModel.given_partials``).

        Returns:
            A ComputeModel with one effective bandwidth per rank.
        """
        eff = topo.cost.mem_efficiency
        bws = tuple(topo.rank_device(r).mem_bw_gbps * eff for r in range(topo.num_ranks))
        best = max(bws) if bws and min(bws) > 0 else 0.0
        # Each figure the cost leaves unset is the GPUs' published fit's, where one applies.
        fitted = fitted_figures(topo)
        attn_launch = fitted.get("attn_launch_us", topo.cost.attn_launch_us)
        attn = fitted.get("attn_efficiency", topo.cost.attn_efficiency)
        attn_bws = () if attn is None else tuple(b / eff * attn for b in bws)
        fused = tuple(topo.rank_device(r).kind is DeviceKind.GPU for r in range(topo.num_ranks))
        return cls(payload=payload, launch_us=topo.cost.launch_us, eff_bw_gbps=bws, best_bw_gbps=best,
                   attn_launch_us=attn_launch, attn_bw_gbps=topo.cost.attn_gbps,
                   attn_next_launch_us=topo.cost.attn_next_launch_us, attn_eff_bw_gbps=attn_bws, fused=fused,
                   given_partials=given_partials)

    def merge_bytes(self, rank: int, received: int, acc: int) -> int:
        """Bytes a merge on ``rank`` moves for ``received`` bytes of partials into ``acc``
        bytes of accumulator rows: one fused kernel reads the partials and reads and writes
        the accumulator once (``merge_us``); the eager ops move 3 x the partials' bytes."""
        return received + 2 * acc if self.fuses(rank) else 3 * received

    def fuses(self, rank: int) -> bool:
        """Whether ``rank`` merges with one fused kernel (a GPU), not eager ops (a host)."""
        return bool(self.fused) and self.fused[rank]

    @property
    def _attn_launch_us(self) -> float:
        return self.launch_us if self.attn_launch_us is None else self.attn_launch_us

    @property
    def _next_launch_us(self) -> float:
        return self._attn_launch_us if self.attn_next_launch_us is None else self.attn_next_launch_us

    def _mem_us(self, rank: int, nbytes: float) -> float:
        bw = self.eff_bw_gbps[rank]
        return nbytes / (bw * 1e3) if bw > 0 else 0.0

    def attention_terms(self, rank: int) -> tuple[float, float]:
        """(fixed cost of the rank's first COMPUTE in us, the bandwidth it reads at in GB/s; 0:
        memory time not modelled): a measured ``attn_gbps``, else memory bandwidth x
        ``attn_efficiency``, else x ``mem_efficiency``."""
        if self.attn_bw_gbps is not None:
            bw = self.attn_bw_gbps
        elif self.attn_eff_bw_gbps and self.attn_eff_bw_gbps[rank] > 0:
            bw = self.attn_eff_bw_gbps[rank]
        else:
            bw = self.eff_bw_gbps[rank]
        return self._attn_launch_us, bw

    def partial_bytes(self, block: int) -> int:
        """Bytes the partial-attention kernel over KV ``block`` moves (0 for an empty block)."""
        w = self.payload
        if not isinstance(w, Workload):
            return 0
        kv = w.kv_bytes(block)
        if kv == 0:
            return 0
        return kv + w.query_bytes + w.payload_bytes

    def partial_us(self, rank: int, block: int | None = None, later: bool = False) -> float:
        """Time of the COMPUTE of KV ``block`` (default: the rank's own shard) on ``rank``.

        Args:
            rank: the rank whose device runs the kernel.
            block: KV block computed over; None = ``rank``'s own.
            later: not the rank's first COMPUTE of the run (``attn_next_launch_us`` applies).

        Returns:
            Microseconds: launch plus memory time (launch only for zero tokens or raw payloads;
            0 for the rank's own block where partials are given).
        """
        b = rank if block is None else block
        if self.given_partials and b == rank:
            return 0.0
        nbytes = self.partial_bytes(b)
        launch = self._next_launch_us if later else self._attn_launch_us
        bw = self.attention_terms(rank)[1]
        return launch + (nbytes / (bw * 1e3) if bw > 0 else 0.0)

    def min_partial_us(self, block: int) -> float:
        """The fastest any rank could compute KV ``block`` (for lower bounds)."""
        nbytes = self.partial_bytes(block)
        bw = self.best_bw_gbps if self.attn_bw_gbps is None else self.attn_bw_gbps
        if self.attn_bw_gbps is None and self.attn_eff_bw_gbps and self.best_bw_gbps > 0:
            bw = max(self.attn_eff_bw_gbps)
        launch = min(self._attn_launch_us, self._next_launch_us)
        if nbytes == 0 or bw <= 0:
            return launch
        return launch + nbytes / (bw * 1e3)

    def step_local_us(self, rank: int, moved_bytes: int, kernels: int = 1) -> float:
        """A step's local work: ``kernels`` launches (``treeattn.cost.program`` counts them:
        merges, copies, conversions) plus the memory time of ``moved_bytes`` (each merge's
        ``merge_bytes``, 2 x the copied bytes, and what the conversions read and write); 0 when
        it moves nothing."""
        if moved_bytes <= 0:
            return 0.0
        return kernels * self.launch_us + self._mem_us(rank, moved_bytes)

    def step_local_many_us(self, ranks: np.ndarray, moved_bytes: np.ndarray, kernels: np.ndarray) -> np.ndarray:
        """``step_local_us`` of many steps at once (arrays of ranks, bytes and kernels), with
        the same arithmetic, so each element equals the scalar call's result."""
        bw = np.asarray(self.eff_bw_gbps, dtype=np.float64)[ranks]
        ok = bw > 0
        mem = np.zeros(len(ranks))
        np.divide(moved_bytes, bw * 1e3, out=mem, where=ok)
        out = kernels * self.launch_us + mem
        out[moved_bytes <= 0] = 0.0
        return out

    def merge_us(self, rank: int, rows: int, parts: int) -> float:
        """The fused merge of ``parts`` received partials of ``rows`` rows into the accumulator
        on ``rank``: one launch plus the fp32 accumulator read and written and the parts read
        (in the partial dtype); 0 when nothing is merged.

        Args:
            rank: the merging rank.
            rows: rows of the chunk.
            parts: partials received for it in one step (k).

        Returns:
            Microseconds.
        """
        if rows <= 0 or parts <= 0:
            return 0.0
        w = self.payload
        return self.launch_us + self._mem_us(rank, rows * (2 * w.acc_row_bytes + parts * w.row_bytes))

    def gather_merge_us(self, rank: int, share_bytes: int, parts: int) -> float:
        """Local merge after an all-gather of ``parts`` partials of ``share_bytes`` each:
        read all of them, write one."""
        if parts <= 1:
            return 0.0
        return self.launch_us + self._mem_us(rank, (parts + 1) * share_bytes)
