"""The ``--png`` figure of ``treeattn calibrate``: per route class, the measured time of one
message against the fitted line ``alpha + n / beta`` (log-log), and the relative residuals."""

from __future__ import annotations

from pathlib import Path

from treeattn.calibrate.live import CalibrationReport
from treeattn.figures import save_figure

__all__ = ["plot_calibration"]


def plot_calibration(report: CalibrationReport, path: Path) -> None:
    """Draw the fit of every class into ``path`` (PNG).

    Args:
        report: from ``calibrate``.
        path: the file to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True, height_ratios=(3, 1))
    for i, c in enumerate(report.classes):
        color = f"C{i}"
        f = c.fit
        for r in sorted({p.round_trips for p in c.points}):
            pts = sorted((p for p in c.points if p.round_trips == r), key=lambda p: p.nbytes)
            xs = [max(p.nbytes, 1) for p in pts]
            ys = [(p.median_us - p.setup_us - f.skew_us) / p.messages for p in pts]
            top.plot(xs, ys, "o" if r == min(p.round_trips for p in c.points) else "s", color=color, alpha=0.7,
                     label=f"{c.route_class.name} {c.route_class.pair}: measured, {r} round trip{'s' * (r > 1)}")
            res = [(p.median_us - f.predict_us(p.nbytes, p.round_trips, p.setup_us)) / p.median_us for p in pts]
            bottom.plot(xs, res, "o" if r == 1 else "s", color=color, alpha=0.7)
        sizes = sorted({max(p.nbytes, 1) for p in c.points})
        grid = [sizes[0] * (sizes[-1] / sizes[0]) ** (k / 100) for k in range(101)]
        top.plot(grid, [f.message_us(x) for x in grid], "-", color=color,
                 label=f"fit: α {f.alpha_us:.1f} µs, β {f.beta_gbps:.3g} GB/s, R² {f.r2:.3f}")
    top.set_xscale("log")
    top.set_yscale("log")
    top.set_ylabel("one message (µs), per-iteration terms removed")
    top.set_title(f"treeattn calibrate: {report.measured_on}, {report.topology.num_ranks} ranks, {report.backend}")
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=7)
    bottom.axhline(0.0, color="k", lw=0.8)
    bottom.set_xscale("log")
    bottom.set_xlabel("message size (bytes)")
    bottom.set_ylabel("residual / measured")
    bottom.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
