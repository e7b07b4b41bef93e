"""Fit latency and bandwidth to timings: the alpha-beta model, plain and per collective.

Plain (a ping-pong, one message): ``t_us = alpha_us + bytes / (beta_gbps * 1e3)``.

A collective over ``n`` ranks, as its ring algorithm moves data (nccl-tests' bus-bandwidth
conventions, docs/hardware.md "Benchmark conventions"):

    T(M) = s(n) * alpha_step + v(n) * M / beta_link

with ``M`` the size nccl-tests prints (the whole buffer), ``s(n)`` the sequential steps and
``v(n)`` the fraction of ``M`` each link carries:

    all_reduce            s = 2(n-1)   v = 2(n-1)/n   (reduce-scatter then all-gather, M/n per step)
    all_gather,
    reduce_scatter,
    alltoall, gather,
    scatter               s = n-1      v = (n-1)/n
    broadcast, reduce     s = n-1      v = 1          (pipelined chain: M crosses every link once)
    sendrecv              s = 1        v = 1

A straight-line fit ``T = a + b*M`` inverts it: ``alpha_step = a / s`` and
``beta_link = v / (b * 1e3)``; ``beta_link`` is then the asymptotic *bus* bandwidth nccl-tests
reports. NCCL switches algorithms and protocols with size (LL, LL128, Simple; ring, tree,
NVLS), so one line over all sizes is an average; restrict the size range to study one regime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from treeattn.errors import ProbeError

__all__ = ["Fit", "Weighting", "fit_alpha_beta", "CollectiveModel", "COLLECTIVE_MODELS", "CollectiveFit",
           "fit_collective"]


class Weighting(StrEnum):
    """``relative`` minimizes relative errors (each size counts alike, so small messages fix
    the latency); ``absolute`` minimizes errors in µs (large messages dominate)."""

    RELATIVE = "relative"
    ABSOLUTE = "absolute"


@dataclass(frozen=True, slots=True)
class Fit:
    """``t_us = alpha_us + bytes / (beta_gbps * 1e3)`` fitted to points."""

    alpha_us: float
    """Intercept: time of an empty message (µs); may come out negative on data without small sizes."""
    beta_gbps: float
    """Inverse slope: GB/s."""
    r2: float
    """Coefficient of determination in the fitted (weighted) metric."""
    residuals: tuple[float, ...]
    """Measured minus fitted time per point, µs, in input order."""

    def predict_us(self, nbytes: float) -> float:
        return self.alpha_us + nbytes / (self.beta_gbps * 1e3)


def fit_alpha_beta(
    sizes_bytes: Sequence[float], times_us: Sequence[float], *, weighting: Weighting = Weighting.RELATIVE
) -> Fit:
    """Least-squares fit of latency and bandwidth to (bytes, µs) points.

    Args:
        sizes_bytes: message sizes, >= 0, at least two distinct.
        times_us: measured times, > 0, same length.
        weighting: ``relative`` (weights 1/t², the default) or ``absolute``.

    Returns:
        The fit; exact (residuals 0, r2 1) on points that follow the model.

    Raises:
        ProbeError: too few points, mismatched lengths, non-finite or non-positive values,
            or times that do not grow with size (no bandwidth to fit).

    Examples:
        >>> f = fit_alpha_beta([0, 1e6, 2e6], [5.0, 15.0, 25.0])
        >>> round(f.alpha_us, 6), round(f.beta_gbps, 6)
        (5.0, 100.0)
    """
    x = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_us, dtype=float)
    if x.shape != t.shape or x.ndim != 1:
        raise ProbeError(f"fit needs as many times as sizes, got {x.size} sizes and {t.size} times")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(t))):
        raise ProbeError("fit: sizes and times must be finite numbers")
    if np.any(x < 0) or np.any(t <= 0):
        raise ProbeError("fit: sizes must be >= 0 and times > 0")
    if np.unique(x).size < 2:
        raise ProbeError(f"fit needs at least two distinct sizes, got {np.unique(x).size}")
    w = 1.0 / t**2 if Weighting(weighting) is Weighting.RELATIVE else np.ones_like(t)
    sw = np.sqrt(w)
    scale = float(np.max(x))  # scale the slope column: sizes reach 1e10 next to an intercept of 1
    design = np.column_stack([sw, sw * x / scale])
    (a, b_scaled), *_ = np.linalg.lstsq(design, sw * t, rcond=None)
    b = b_scaled / scale
    # A slope whose growth over the size range is rounding noise is no slope at all.
    if not b * float(np.ptp(x)) > 1e-9 * float(np.max(t)):
        raise ProbeError(
            f"fit: time does not grow with size (slope {b:.3g} µs/byte); no bandwidth can be fitted "
            "from these points (too few sizes, or all latency-bound)"
        )
    fitted = a + b * x
    res = t - fitted
    mean = float(np.sum(w * t) / np.sum(w))
    ss_tot = float(np.sum(w * (t - mean) ** 2))
    ss_res = float(np.sum(w * res**2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return Fit(float(a), float(1.0 / (b * 1e3)), r2, tuple(float(r) for r in res))


@dataclass(frozen=True, slots=True)
class CollectiveModel:
    """Step count, per-link volume fraction and nccl-tests busbw factor of a collective."""

    name: str
    steps: Callable[[int], float]
    volume: Callable[[int], float]
    busbw_factor: Callable[[int], float]
    formula: str


def _ring_all(n: int) -> float:
    return (n - 1) / n


COLLECTIVE_MODELS: dict[str, CollectiveModel] = {
    m.name: m
    for m in (
        CollectiveModel("all_reduce", lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1) / n,
                        "T = 2(n-1)·α + 2(n-1)/n · M/β"),
        *(CollectiveModel(c, lambda n: n - 1, _ring_all, _ring_all, "T = (n-1)·α + (n-1)/n · M/β")
          for c in ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter")),
        *(CollectiveModel(c, lambda n: n - 1, lambda n: 1.0, lambda n: 1.0, "T = (n-1)·α + M/β")
          for c in ("broadcast", "reduce")),
        CollectiveModel("sendrecv", lambda n: 1, lambda n: 1.0, lambda n: 1.0, "T = α + M/β"),
    )
}


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """A collective's timings fitted and turned into per-step latency and per-link bandwidth."""

    collective: str
    ranks: int
    fit: Fit
    """The raw line: ``alpha_us`` the whole collective's latency, ``beta_gbps`` its algbw limit."""
    alpha_step_us: float
    """Latency of one step (one hop of the ring): ``fit.alpha_us / s(n)``."""
    beta_link_gbps: float
    """Bandwidth of one link (asymptotic bus bandwidth): ``v(n) * fit.beta_gbps``."""
    model: str
    points: int
    size_range: tuple[int, int]
    warnings: tuple[str, ...] = ()

    @property
    def half_bandwidth_bytes(self) -> float:
        """The size whose transfer takes as long as the latency (Hockney's n_1/2)."""
        return self.fit.alpha_us * self.fit.beta_gbps * 1e3

    @property
    def latency_measured(self) -> bool:
        """Whether the rows determine the latency: it is not negative, and some size is at or
        below ``half_bandwidth_bytes`` (past it, the rows see the latency only as their line's
        offset, where any ramp to the asymptote lands too)."""
        return self.fit.alpha_us >= 0 and self.size_range[0] <= self.half_bandwidth_bytes

    def to_dict(self) -> dict:
        return {
            "collective": self.collective, "ranks": self.ranks, "model": self.model, "points": self.points,
            "size_range_bytes": list(self.size_range),
            "alpha_us": self.fit.alpha_us, "algbw_gbps": self.fit.beta_gbps, "r2": self.fit.r2,
            "alpha_step_us": self.alpha_step_us, "beta_link_gbps": self.beta_link_gbps,
            "warnings": list(self.warnings),
        }


def fit_collective(
    sizes_bytes: Sequence[float],
    times_us: Sequence[float],
    collective: str,
    ranks: int,
    *,
    weighting: Weighting = Weighting.RELATIVE,
) -> CollectiveFit:
    """Fit a collective's (size, time) points and invert its model (module docstring).

    Args:
        sizes_bytes: sizes as nccl-tests prints them (whole buffer).
        times_us: times, µs.
        collective: a key of ``COLLECTIVE_MODELS`` (``all_reduce``, ``all_gather``, ...).
        ranks: ranks taking part (>= 2).
        weighting: see ``Weighting``.

    Returns:
        The fit and the per-step latency / per-link bandwidth it implies.
    """
    model = COLLECTIVE_MODELS.get(collective)
    if model is None:
        raise ProbeError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVE_MODELS)}")
    if ranks < 2:
        raise ProbeError(f"a collective needs >= 2 ranks to fit, got {ranks}")
    fit = fit_alpha_beta(sizes_bytes, times_us, weighting=weighting)
    sizes = [int(s) for s in sizes_bytes]
    out = CollectiveFit(
        collective, ranks, fit, fit.alpha_us / model.steps(ranks), fit.beta_gbps * model.volume(ranks),
        model.formula, len(sizes), (min(sizes), max(sizes)),
    )
    if fit.alpha_us < 0:
        why = (f"negative latency {fit.alpha_us:.3g} µs: the sizes are all bandwidth-bound, "
               "so latency is not identifiable from them")
    elif not out.latency_measured:
        why = (f"latency {fit.alpha_us:.3g} µs extrapolated: every size is past the half-bandwidth size "
               f"({out.half_bandwidth_bytes / 2**20:.3g} MiB), where transfers outlast it")
    else:
        return out
    return dataclasses.replace(out, warnings=(why,))
