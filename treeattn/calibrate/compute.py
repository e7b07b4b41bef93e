"""Compute microbenchmarks of ``treeattn calibrate``: the executor's own kernels, timed in
this process (imports torch).

Kernels, and the bytes the compute model (``treeattn.cost.compute``) says each moves:

* ``sum``: ``treeattn.exec.merge.sum_into`` on fp32 buffers of ``n`` bytes (raw payload
  plans): reads two, writes one, ``3n``;
* ``merge``: ``treeattn.exec.merge.merge_into`` on packed partials (D = 128) of ``n`` bytes
  (attention plans): ``3n``;
* ``attention``: ``treeattn.exec.attention.partial_attention`` with the kernel runs use by
  default (``auto``: torch's fused sdpa on CPU) of one row set of the given heads (default
  llama-3.1-8b's: B 1, Hq 32, Hkv 8, D 128; bf16 KV) over ``n`` bytes of KV: KV + q + the
  partial written (the bytes a KV byte costs depend on the heads: time the shape you plan);
* ``clone``: a copy of ``n`` bytes into a fresh buffer (page faults included): ``2n``; no
  plan op, it prices copying a payload outside the interpreter.

The line ``t = launch_us + moved / (eff_bw_gbps 1e3)`` is fitted in two parts, because
caches bend it: sizes that fit in cache run far faster per byte than the memory-bound sizes
where a merge's time matters. ``launch_us`` is the median time of the sizes moving at most
``LAUNCH_BYTES``; the bandwidth is the least-squares slope (absolute errors, through that
intercept) over the sizes moving at least ``MEMORY_BYTES`` (all sizes above the launch ones
when none is that large). ``treeattn.calibrate.apply_fit`` turns the bandwidth into
``mem_efficiency``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from treeattn.calibrate.fit import Fit, fit_alpha_beta
from treeattn.errors import InputError, ProbeError
from treeattn.exec.attention import make_kv_shard, make_query, partial_attention, resolve_kernel
from treeattn.exec.merge import merge_into, sum_into
from treeattn.workload import Workload

__all__ = ["KERNELS", "ComputePoint", "ComputeFit", "measure_compute", "fit_compute", "poor_fit_note", "rank_threads"]

KERNELS = ("sum", "merge", "attention", "clone")
LAUNCH_BYTES = 64 << 10
MEMORY_BYTES = 3 << 20
_D = 128
LLAMA_HEADS = (32, 8, 128)
"""(q heads, KV heads, head dim) the attention kernel is timed with by default."""


def kv_bytes_per_token(heads: tuple[int, int, int]) -> int:
    """KV bytes of one token with ``heads`` = (q heads, KV heads, head dim): K and V, bf16."""
    return 2 * heads[1] * heads[2] * 2


@dataclass(frozen=True, slots=True)
class ComputePoint:
    nbytes: int
    """Payload size the kernel works on (the merged buffer, or the KV read)."""
    moved_bytes: int
    """Bytes the compute model charges for it."""
    median_us: float


@dataclass(frozen=True, slots=True)
class ComputeFit:
    """``t = launch_us + moved_bytes / (eff_bw_gbps * 1e3)`` for one kernel."""

    kernel: str
    threads: int
    points: tuple[ComputePoint, ...]
    fit: Fit

    @property
    def launch_us(self) -> float:
        return max(0.0, self.fit.alpha_us)

    @property
    def eff_bw_gbps(self) -> float:
        return self.fit.beta_gbps

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "threads": self.threads, "launch_us": self.launch_us,
                "eff_bw_gbps": self.eff_bw_gbps, "alpha_us": self.fit.alpha_us, "r2": self.fit.r2,
                "points": [{"nbytes": p.nbytes, "moved_bytes": p.moved_bytes, "median_us": p.median_us,
                            "fitted_us": self.fit.predict_us(p.moved_bytes)} for p in self.points]}


def kernel_fits(kernel: str, nbytes: int, heads: tuple[int, int, int] = LLAMA_HEADS) -> bool:
    """Whether ``kernel`` can run at about ``nbytes`` (one merge row, one attention token)."""
    if kernel == "merge":
        return nbytes // (4 * (_D + 1)) >= 1
    if kernel == "attention":
        return nbytes // kv_bytes_per_token(heads) >= 1
    return True


def _case(kernel: str, nbytes: int, gen: torch.Generator, device: torch.device,
          heads: tuple[int, int, int] = LLAMA_HEADS) -> tuple[int, int, Callable[[], object]] | None:
    """(size, bytes moved, one call) for ``kernel`` at about ``nbytes``; None when too small."""
    if not kernel_fits(kernel, nbytes, heads):
        return None
    if kernel in ("sum", "clone"):
        n = max(1, nbytes // 4)
        acc, other = (torch.rand(n, generator=gen).to(device) for _ in range(2))
        if kernel == "clone":
            return 4 * n, 2 * 4 * n, acc.clone
        return 4 * n, 3 * 4 * n, lambda: sum_into(acc, other)
    if kernel == "merge":
        rows = nbytes // (4 * (_D + 1))
        acc, other = (torch.randn(rows, _D + 1, generator=gen).to(device) for _ in range(2))
        size = 4 * rows * (_D + 1)
        return size, 3 * size, lambda: merge_into(acc, other)
    hq, hkv, d = heads
    tokens = nbytes // kv_bytes_per_token(heads)
    w = Workload(batch=1, q_heads=hq, kv_heads=hkv, head_dim=d, split=(tokens,), kv_dtype="bf16")
    q, kv = make_query(w, 0, device), make_kv_shard(w, 0, 0, device)
    moved = w.kv_bytes(0) + w.query_bytes + w.payload_bytes
    kernel = resolve_kernel("auto", device, w.kv_dtype)
    return w.kv_bytes(0), moved, lambda: partial_attention(q, kv, kernel)


def measure_compute(kernel: str, sizes: Sequence[int], *, repeats: int = 10, threads: int | None = None,
                    budget_s: float = 5.0, device: str = "cpu",
                    heads: tuple[int, int, int] = LLAMA_HEADS) -> ComputeFit:
    """Time ``kernel`` at each size (median of ``repeats`` calls after one warm-up) and fit it.

    Args:
        kernel: ``sum``, ``merge``, ``attention`` or ``clone``.
        sizes: payload sizes in bytes (too small ones are skipped).
        repeats: timed calls per size (fewer when a size would exceed ``budget_s``).
        threads: torch threads while timing (default: what each local rank gets,
            cpu_count // ranks, is the caller's to pass; None keeps the current setting).
        budget_s: rough time limit per size.
        device: where the kernel runs (``cuda`` after an NCCL run: the ranks' GPU).
        heads: (q heads, KV heads, head dim) of the ``attention`` kernel.

    Returns:
        The fit (``launch_us`` and effective bandwidth) and its points.
    """
    if kernel not in KERNELS:
        raise InputError(f"unknown compute kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    gen = torch.Generator().manual_seed(0)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    points: list[ComputePoint] = []
    try:
        for nbytes in sorted(set(sizes)):
            case = _case(kernel, nbytes, gen, dev, heads)
            if case is None:
                continue
            size, moved, call = case
            sync()
            t0 = time.perf_counter()
            call()  # warm-up (allocations, first-touch)
            sync()
            once = time.perf_counter() - t0
            n = max(3, min(repeats, int(budget_s / max(once, 1e-6))))
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                call()
                sync()
                times.append((time.perf_counter() - t0) * 1e6)
            points.append(ComputePoint(size, moved, statistics.median(times)))
    finally:
        torch.set_num_threads(old)
    if len(points) < 2:
        raise InputError(f"compute kernel {kernel}: need at least two sizes it can run at, got {len(points)}; "
                         "raise --max-size")
    return ComputeFit(kernel, threads or torch.get_num_threads(), tuple(points), fit_compute(points))


def fit_compute(points: Sequence[ComputePoint]) -> Fit:
    """Launch from the small sizes, bandwidth from the large ones (module docstring).

    Args:
        points: at least two sizes.

    Returns:
        The line as a ``Fit`` (r2 and residuals over all points, relative metric).
    """
    small = [p.median_us for p in points if p.moved_bytes <= LAUNCH_BYTES] or [min(p.median_us for p in points)]
    launch = statistics.median(small)
    big = [p for p in points if p.moved_bytes >= MEMORY_BYTES] or [p for p in points if p.moved_bytes > LAUNCH_BYTES]
    if not big:
        return fit_alpha_beta([p.moved_bytes for p in points], [p.median_us for p in points])
    x = np.array([p.moved_bytes for p in big], dtype=float)
    y = np.array([p.median_us - launch for p in big])
    slope = float(np.dot(x, y) / np.dot(x, x))
    if not slope > 0:
        raise ProbeError(f"compute fit: the large sizes take no longer than the launch ({launch:.3g} µs); "
                         "raise --max-size")
    t = np.array([p.median_us for p in points])
    res = t - (launch + slope * np.array([p.moved_bytes for p in points], dtype=float))
    w = 1.0 / t**2
    mean = float(np.sum(w * t) / np.sum(w))
    ss_tot = float(np.sum(w * (t - mean) ** 2))
    r2 = 1.0 - float(np.sum(w * res**2)) / ss_tot if ss_tot > 0 else 1.0
    return Fit(float(launch), 1.0 / (slope * 1e3), r2, tuple(float(r) for r in res))


def poor_fit_note(fit: ComputeFit, terms: str) -> str | None:
    """A warning where the kernel's timings do not follow ``launch + bytes / bandwidth``: the
    line explains less of them than their mean does (R² below 0), so the ``terms`` written
    from it describe the kernel poorly; None otherwise. A kernel whose time is not set by the
    bytes it moves (arithmetic-bound: multi-head latent attention's wide heads on a CPU) fits
    this way."""
    if fit.fit.r2 >= 0:
        return None
    return (f"the {fit.kernel} kernel's timings do not follow launch + bytes / bandwidth (R² {fit.fit.r2:.3g}: "
            f"the line explains less than their mean); {terms} are written from it, and predictions that use "
            "them are unreliable")


def rank_threads(ranks: int) -> int:
    """Threads each locally launched rank gets (``treeattn.exec.launch.launch_local``)."""
    env = os.environ.get("OMP_NUM_THREADS")
    if env and env.isdigit():
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(1, ranks))
