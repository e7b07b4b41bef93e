"""Fits of ``treeattn calibrate`` (pure: numpy, no torch): ping-pong, overhead, compute.

The model inverted (the simulator's, ``treeattn.cost.simulate``): one message of ``n`` bytes
from rank a to rank b costs

    t(n) = overhead_us + sum(hop latency_us) + n / (bottleneck bw_gbps * 1e3)
         = alpha_us + n / (beta_gbps * 1e3)

A ping-pong plan of ``R`` round trips is ``m = 2R`` such messages one after the other. The
executor times a whole iteration (barrier, then the plan; the maximum over ranks), which
also holds what the model has not: the executor's set-up, which clones the payload
(``setup_us``, measured apart and subtracted), and the skew between ranks leaving the
barrier (a constant, fitted). So the ping-pong medians are fitted jointly over sizes and
round-trip counts:

    T(n, R) - setup_us(n) = skew_us + m * (alpha_us + n / (beta_gbps * 1e3)),   m = 2R

weighted by 1/T^2 (relative errors: small messages fix alpha, large ones beta), with skew
and alpha kept >= 0. With a single round-trip count the skew cannot be told from alpha and
is taken as 0. Each message of a ping-pong lands by RECV_COPY, whose copy into the
accumulator is then part of ``1/beta``.

Compute (``treeattn.cost.compute``): a merge of ``n`` received bytes costs
``launch_us + 3n / (mem_bw_gbps * mem_efficiency * 1e3)``; a fit of ``t`` against the bytes
moved (3n) gives ``launch_us`` (intercept) and the effective bandwidth (inverse slope).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from treeattn.errors import ProbeError

__all__ = ["PingPongPoint", "PingPongFit", "fit_pingpong", "overhead_from_sends", "relative_error"]


@dataclass(frozen=True, slots=True)
class PingPongPoint:
    """One ping-pong plan's measurement: median iteration time over the repeats."""

    nbytes: int
    round_trips: int
    median_us: float
    """Median over repeats of the per-iteration time (maximum over ranks)."""
    spread_us: float = 0.0
    """p90 - p10 of the iteration times."""
    setup_us: float = 0.0
    """Known per-iteration time outside the plan (the executor cloning the payload), subtracted."""

    @property
    def messages(self) -> int:
        return 2 * self.round_trips


@dataclass(frozen=True, slots=True)
class PingPongFit:
    """``T(n, R) = setup_us(n) + skew_us + 2R (alpha_us + n / (beta_gbps 1e3))`` fitted to ping-pong points."""

    alpha_us: float
    """Time of an empty message (overhead + route latency)."""
    beta_gbps: float
    """Bandwidth of the route (GB/s)."""
    skew_us: float
    """Per-iteration constant (barrier skew): not in the cost model."""
    r2: float
    """Coefficient of determination, relative metric (weights 1/T^2)."""
    residuals: tuple[float, ...]
    """Measured minus fitted iteration time per point, µs, in input order."""

    def predict_us(self, nbytes: float, round_trips: int, setup_us: float = 0.0) -> float:
        """Fitted iteration time of a ping-pong plan (``setup_us``: its known set-up time)."""
        return setup_us + self.skew_us + 2 * round_trips * self.message_us(nbytes)

    def message_us(self, nbytes: float) -> float:
        """Fitted time of one message (what the simulator charges)."""
        return self.alpha_us + nbytes / (self.beta_gbps * 1e3)

    def to_dict(self) -> dict:
        return {"alpha_us": self.alpha_us, "beta_gbps": self.beta_gbps, "skew_us": self.skew_us, "r2": self.r2,
                "residuals_us": list(self.residuals)}


def _check_points(points: Sequence[PingPongPoint]) -> None:
    if len({p.nbytes for p in points}) < 2:
        raise ProbeError(f"ping-pong fit needs at least two distinct sizes, got {sorted({p.nbytes for p in points})}")
    for p in points:
        if not (math.isfinite(p.median_us) and p.median_us > 0) or p.round_trips < 1 or p.nbytes < 0:
            raise ProbeError(f"ping-pong point {p} is not usable: sizes >= 0, round trips >= 1, times > 0 and finite")


def fit_pingpong(points: Sequence[PingPongPoint]) -> PingPongFit:
    """Least-squares fit of skew, latency and bandwidth to ping-pong medians.

    Args:
        points: medians at two or more sizes, with their known set-up times; two or more
            round-trip counts let the skew be fitted (else it is 0).

    Returns:
        The fit, with skew and alpha >= 0 (a negative one, from noise, is pinned at 0).

    Raises:
        ProbeError: fewer than two sizes, bad values, or times that do not grow with size.

    Examples:
        >>> pts = [PingPongPoint(n, r, 50 + n / 4e3 + 2 * r * (10 + n / 1e3), setup_us=n / 4e3)
        ...        for n in (0, 10**6) for r in (1, 4)]
        >>> f = fit_pingpong(pts)
        >>> [round(x, 6) for x in (f.skew_us, f.alpha_us, f.beta_gbps)]
        [50.0, 10.0, 1.0]
    """
    _check_points(points)
    n = np.array([p.nbytes for p in points], dtype=float)
    m = np.array([p.messages for p in points], dtype=float)
    t = np.array([p.median_us for p in points], dtype=float)
    y = t - np.array([p.setup_us for p in points], dtype=float)
    sw = 1.0 / t  # sqrt of the weights 1/T^2
    scale = float(np.max(n)) or 1.0  # keep the slope column near 1 next to the others
    # Skew and alpha are physical (>= 0): the best fit with the negative ones pinned at 0
    # (an exact non-negative least squares over these few active sets).
    cols = (np.ones_like(t), m)
    optional = (0, 1) if len({p.round_trips for p in points}) > 1 else (1,)
    best: tuple[float, list[float], float] | None = None
    for k in range(len(optional) + 1):
        for free in itertools.combinations(optional, k):
            coef = _solve([cols[i] for i in free] + [m * n / scale], sw, y)
            full = [0.0, 0.0]
            for i, c in zip(free, coef, strict=False):
                full[i] = c
            slope = coef[-1] / scale
            if min(full) < 0:
                continue
            sse = float(np.sum((sw * (y - full[0] - m * (full[1] + slope * n))) ** 2))
            if best is None or sse < best[0] - 1e-12 * abs(best[0]):
                best = (sse, full, slope)
    assert best is not None  # the set with nothing optional free is always feasible
    _, (skew, alpha), slope = best
    if not slope * float(np.ptp(n)) > 1e-9 * float(np.max(t)):
        raise ProbeError(
            f"ping-pong fit: time does not grow with size (slope {slope:.3g} µs/byte); measure larger messages "
            "(--max-size) or more repeats"
        )
    fitted = skew + m * (alpha + slope * n)
    res = y - fitted
    w = sw**2
    mean = float(np.sum(w * t) / np.sum(w))
    ss_tot = float(np.sum(w * (t - mean) ** 2))
    r2 = 1.0 - float(np.sum(w * res**2)) / ss_tot if ss_tot > 0 else 1.0
    return PingPongFit(float(alpha), float(1.0 / (slope * 1e3)), float(skew), r2, tuple(float(x) for x in res))


def _solve(cols: list[np.ndarray], sw: np.ndarray, t: np.ndarray) -> list[float]:
    design = np.column_stack([sw * c for c in cols])
    coef, *_ = np.linalg.lstsq(design, sw * t, rcond=None)
    return [float(c) for c in coef]


def overhead_from_sends(send_us: Sequence[float], alpha_us: float) -> tuple[float, list[str]]:
    """The backend's per-message software overhead: the median time a small SEND takes to
    complete on its sender (gloo: until the bytes are handed to the socket), capped at alpha.

    Args:
        send_us: sender-side completion times of small messages (µs).
        alpha_us: the fitted per-message time they are part of.

    Returns:
        The overhead (µs) and warnings.
    """
    warnings: list[str] = []
    samples = [s for s in send_us if math.isfinite(s) and s >= 0]
    if not samples:
        warnings.append("no sender-side timings of small messages: overhead taken as 0, all of alpha is latency")
        return 0.0, warnings
    o = statistics.median(samples)
    if o > alpha_us:
        warnings.append(f"sender overhead {o:.1f} µs exceeds the fitted per-message time {alpha_us:.1f} µs: "
                        "capped at it (route latency 0)")
        o = max(alpha_us, 0.0)
    return float(o), warnings


def relative_error(measured: float, predicted: float) -> float:
    """``(predicted - measured) / measured``."""
    return (predicted - measured) / measured
