"""Plots of a results folder (matplotlib's Agg backend, PNG without a timestamp).

* ``plot_scatter``: predicted against measured time, log-log, every row, with y = x.
* ``plot_timeline``: one plan's per-rank op timeline, predicted above, measured below.
* ``plot_speedups``: per case, every method's measured time over the pick's (bars, log scale).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from treeattn.errors import InputError
from treeattn.figures import save_figure
from treeattn.report.summary import case_frame, error_frame

__all__ = ["plot_scatter", "plot_timeline", "plot_speedups", "timeline_choices", "choose_timeline"]

_KIND_COLOR = {"compute": "tab:green", "send": "tab:blue", "recv_merge": "tab:orange", "recv_copy": "tab:purple",
               "collective": "tab:red"}
_BASELINE_ORDER = ("allreduce3", "allgather-merge", "ring-attention")


def _plt():  # noqa: ANN202 - the pyplot module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:  # noqa: ANN001 - a Figure
    return save_figure(fig, path, dpi=110)


def plot_scatter(rows: pd.DataFrame, path: str | Path) -> Path:
    """Predicted (x) against measured (y) median time of every row, log-log, with y = x and
    the +-35 % band; colour by topology, marker by role (the picks starred).

    Args:
        rows: ``rows.csv`` as read by ``load_folder``.
        path: the PNG to write.

    Returns:
        The path written.
    """
    plt = _plt()
    err = error_frame(rows)
    fig, ax = plt.subplots(figsize=(7, 6))
    if err.empty:
        ax.text(0.5, 0.5, "no row has both a prediction and a correct measurement", ha="center",
                transform=ax.transAxes)
        return _save(fig, Path(path))
    pred = err["predicted_us"].astype(float) / 1e3
    meas = err["measured_median_us"].astype(float) / 1e3
    lo = min(pred.min(), meas.min()) / 1.5
    hi = max(pred.max(), meas.max()) * 1.5
    colors = plt.get_cmap("tab10")
    markers = {"candidate": "o", "baseline": "s"}
    for i, (topo, grp) in enumerate(err.groupby("topology", sort=True)):
        for role, sub in grp.groupby("role", sort=True):
            ax.scatter(sub["predicted_us"].astype(float) / 1e3, sub["measured_median_us"].astype(float) / 1e3,
                       color=colors(i % 10), marker=markers.get(role, "^"), s=28, alpha=0.8,
                       label=f"{topo} · {role}")
        picks = grp[grp["is_pick"]]
        if len(picks):
            ax.scatter(picks["predicted_us"].astype(float) / 1e3, picks["measured_median_us"].astype(float) / 1e3,
                       facecolors="none", edgecolors="black", marker="*", s=160, linewidths=0.8)
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=1, label="y = x")
    ax.plot(line, [v * 1.35 for v in line], color="gray", lw=0.6, ls="--", label="±35 %")
    ax.plot(line, [v / 1.35 for v in line], color="gray", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted (ms)")
    ax.set_ylabel("measured median (ms)")
    e = err["error"].astype(float)
    ax.set_title(f"{len(err)} rows · |error| median {e.median():.0%}, p90 {e.quantile(0.9):.0%} · ★ = pick")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _save(fig, Path(path))


def timeline_choices(timeline: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(topology, case, method) of every plan with both a measured and a predicted timeline."""
    if timeline.empty:
        return []
    keys = timeline.groupby(["topology", "case", "method"], sort=False)["source"].agg(lambda s: set(s))
    return [k for k, sources in keys.items() if {"measured", "predicted"} <= sources]


def choose_timeline(rows: pd.DataFrame, timeline: pd.DataFrame, topology: str | None = None,
                    case: str | None = None, method: str | None = None) -> tuple[str, str, str] | None:
    """The plan whose timeline to draw: the first that matches what is given, preferring the
    primary topology's picks (rows order). None when the folder has no timeline."""
    from treeattn.report.summary import primary_topology

    choices = timeline_choices(timeline)
    if not choices:
        return None
    picks = {(r.topology, r.case, r.method) for r in rows[rows["is_pick"]].itertuples()}
    primary = primary_topology(rows)
    ranked = sorted(choices, key=lambda k: (k[0] != primary, k not in picks, choices.index(k)))
    for key in ranked:
        if all(want is None or want == got for want, got in zip((topology, case, method), key, strict=True)):
            return key
    names = ", ".join(":".join(k) for k in choices[:8])
    raise InputError(f"no timeline for {topology or '*'}:{case or '*'}:{method or '*'}; this folder has {names}")


def plot_timeline(timeline: pd.DataFrame, key: tuple[str, str, str], path: str | Path) -> Path:
    """Per-rank Gantt chart of one plan: predicted (top) and measured (bottom), same time axis.

    Sends are drawn in the upper half of a rank's lane, receives in the lower half, compute
    and collectives across it. Measured times count from each rank's own start.

    Args:
        timeline: ``timeline.csv`` as read by ``load_folder``.
        key: (topology, case, method), e.g. from ``choose_timeline``.
        path: the PNG to write.

    Returns:
        The path written.
    """
    plt = _plt()
    from matplotlib.patches import Patch

    topo, case, method = key
    sel = timeline[(timeline["topology"] == topo) & (timeline["case"] == case) & (timeline["method"] == method)]
    if sel.empty:
        raise InputError(f"no timeline rows for {topo}:{case}:{method}")
    ranks = int(sel["rank"].max()) + 1
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.2 + 0.9 * max(2, min(ranks, 16))), sharex=True)
    end = float(sel["end_us"].max()) / 1e3
    for ax, source in zip(axes, ("predicted", "measured"), strict=True):
        part = sel[sel["source"] == source]
        for r in part.itertuples():
            kind = str(r.kind)
            y, h = r.rank - 0.4, 0.8
            if kind == "send":
                y, h = r.rank, 0.4
            elif kind.startswith("recv"):
                y, h = r.rank - 0.4, 0.4
            start = float(r.start_us) / 1e3
            width = max(float(r.end_us) / 1e3 - start, end * 1e-3)
            ax.broken_barh([(start, width)], (y, h), facecolors=_KIND_COLOR.get(kind, "gray"), alpha=0.55,
                           edgecolor="black", linewidth=0.2)
        finish = part.groupby("rank")["end_us"].max() / 1e3 if len(part) else pd.Series(dtype=float)
        total = f"{finish.max():.3g} ms" if len(finish) else "—"
        ax.set_title(f"{source}: last rank done at {total}", fontsize=9, loc="left")
        ax.set_ylabel("rank")
        ax.set_yticks(range(ranks))
        ax.set_ylim(ranks - 0.5, -0.5)
        ax.grid(True, axis="x", lw=0.3)
    axes[-1].set_xlabel("time from the rank's start (ms)")
    handles = [Patch(facecolor=c, alpha=0.55, label=k) for k, c in _KIND_COLOR.items()]
    axes[0].legend(handles=handles, fontsize=7, ncol=5, loc="upper right")
    fig.suptitle(f"{method} · {case} · {topo}", fontsize=10)
    fig.tight_layout()
    return _save(fig, Path(path))


def _method_order(methods: list[str]) -> list[str]:
    cands = sorted(m for m in methods if m not in _BASELINE_ORDER)
    return cands + [m for m in _BASELINE_ORDER if m in methods]


def plot_speedups(rows: pd.DataFrame, path: str | Path) -> Path:
    """Per topology, per case: each method's measured time over the pick's (above 1: the pick
    is that many times faster), log scale; the pick's own bar is 1 and outlined.

    Args:
        rows: ``rows.csv`` as read by ``load_folder``.
        path: the PNG to write.

    Returns:
        The path written.
    """
    plt = _plt()
    cases = case_frame(rows)
    topos = list(dict.fromkeys(rows["topology"]))
    methods = _method_order(sorted(set(rows["method"])))
    cmap = plt.get_cmap("tab20")
    color = {m: cmap(i % 20) for i, m in enumerate(methods)}
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(topos), 1, figsize=(12, 3.4 * len(topos)), squeeze=False)
    for ax, topo in zip(axes[:, 0], topos, strict=True):
        sub = rows[(rows["topology"] == topo) & rows["correct"]]
        tcases = cases[cases["topology"] == topo]
        names = list(tcases["case"])
        present = [m for m in methods if m in set(sub["method"])]
        width = 0.8 / max(1, len(present))
        for j, m in enumerate(present):
            xs, ys, picks = [], [], []
            for i, c in enumerate(names):
                pick_us = tcases.loc[tcases["case"] == c, "pick_us"].iloc[0]
                hit = sub[(sub["case"] == c) & (sub["method"] == m)]
                if len(hit) and pick_us is not None and not (isinstance(pick_us, float) and math.isnan(pick_us)):
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(float(hit["measured_median_us"].iloc[0]) / float(pick_us))
                    picks.append(bool(hit["is_pick"].iloc[0]))
            ax.bar(xs, ys, width=width, color=color[m],
                   edgecolor=["black" if p else "none" for p in picks], linewidth=1.0)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylabel("measured / pick's")
        ax.set_title(topo, fontsize=10, loc="left")
        ax.grid(True, axis="y", which="both", lw=0.3, alpha=0.5)
        handles = [Patch(facecolor=color[m], label=m) for m in present]
        handles.append(Patch(facecolor="white", edgecolor="black", label="the pick (= 1)"))
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return _save(fig, Path(path))
