"""Render a results folder: ``summary.json`` and the three plots, written into the folder."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from treeattn.errors import InputError
from treeattn.report.folder import SUMMARY_FILE, ResultsFolder, load_folder
from treeattn.report.plots import choose_timeline, plot_scatter, plot_speedups, plot_timeline
from treeattn.report.summary import BOOTSTRAP, TARGETS, summarize, summary_json
from treeattn.textfile import write_file

__all__ = ["SCATTER_FILE", "TIMELINE_PNG", "SPEEDUP_FILE", "README_FILE", "Rendered", "render_folder", "readme"]

SCATTER_FILE = "scatter.png"
TIMELINE_PNG = "timeline.png"
SPEEDUP_FILE = "speedup.png"
README_FILE = "README.md"


@dataclass(frozen=True)
class Rendered:
    """What ``render_folder`` read and wrote."""

    folder: ResultsFolder
    summary: dict
    files: tuple[Path, ...]
    timeline: tuple[str, str, str] | None
    """(topology, case, method) of the plan ``timeline.png`` shows (drawn by this render unless
    ``plots`` was off); None when the folder has no timeline to draw."""


def render_folder(path: str | Path, *, topology: str | None = None, case: str | None = None,
                  method: str | None = None, plots: bool = True) -> Rendered:
    """Summarize a results folder and draw its plots into it.

    Args:
        path: the folder (``rows.csv``, optionally ``timeline.csv`` and ``meta.json``).
        topology, case, method: which plan's timeline to draw (default: the primary
            topology's first pick that has one).
        plots: also write the PNGs (``summary.json`` is always written).

    Returns:
        The folder read, its summary and the files written.

    Raises:
        InputError: the folder is missing, malformed, or has no such timeline.
    """
    folder = load_folder(path)
    _check_readme_is_ours(folder.path / README_FILE)
    _check_summary_is_ours(folder.path / SUMMARY_FILE)
    # The README names the plan a render draws, drawn this time or not (--no-plots keeps the PNGs).
    key = choose_timeline(folder.rows, folder.timeline, topology, case, method)
    summary = summarize(folder.rows, folder.meta)
    names = [SUMMARY_FILE, *((SCATTER_FILE, SPEEDUP_FILE) if plots else ()),
             *((TIMELINE_PNG,) if plots and key is not None else ()), README_FILE]
    for name in names:  # every file it writes, before the first is written
        _check_writable(folder.path / name)
    files = [folder.path / SUMMARY_FILE]
    try:
        write_file(files[0], summary_json(summary))
        if plots:
            files.append(plot_scatter(folder.rows, folder.path / SCATTER_FILE))
            files.append(plot_speedups(folder.rows, folder.path / SPEEDUP_FILE))
            if key is not None:
                files.append(plot_timeline(folder.timeline, key, folder.path / TIMELINE_PNG))
        files.append(folder.path / README_FILE)
        write_file(files[-1], readme(folder, summary, key))
    except OSError as exc:  # the checks above found it writable: a full disk, say
        raise InputError(f"{exc.filename or folder.path}: cannot write it ({exc.strerror or exc})") from None
    return Rendered(folder, summary, tuple(files), key)


def _check_writable(path: Path) -> None:
    """Refuse a file ``render_folder`` writes that is a folder, or that it may not write."""
    if path.is_dir():
        raise InputError(f"{path}: a folder where report writes its {path.name}; move it away")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        where = path if path.exists() else path.parent
        raise InputError(f"{where}: not writable (report writes {path.name} into the results folder); "
                         "copy the folder somewhere writable and report that")


def _check_summary_is_ours(path: Path) -> None:
    """Refuse a folder whose summary.json is not one ``render_folder`` wrote: someone's own file."""
    if path.is_dir():
        return  # said by _check_writable
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        data = None
    if not (isinstance(data, dict) and {"cases", "rows", "targets"} <= data.keys()):
        raise InputError(f"{path} is not a summary.json treeattn report wrote; move it away (report writes its "
                         "summary there)")


_README_HEAD = "# Validation results: "
"""How the README.md ``readme`` writes begins: another there is someone's own, and kept."""


def _check_readme_is_ours(path: Path) -> None:
    """Refuse a folder whose README.md is not one ``readme`` wrote (before anything is written)."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_README_HEAD))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc}); report writes its summary there") from None
    if head != _README_HEAD.encode():
        raise InputError(f"{path} is not a README.md treeattn report wrote (it begins {head[:40]!r}); report writes "
                         "its summary there: move that file, or render a copy of the folder")


def _host_cpu(shares: dict | None) -> str:
    """``; while measuring: 12 % steal, 30 % softirq`` from a topology's ``host_cpu`` meta."""
    parts = []
    for phase in ("calibration", "measurement"):
        got = (shares or {}).get(phase)
        if got:
            parts.append(f"{phase}: CPU {got['busy']:.0%} busy, {got['steal']:.0%} stolen by the hypervisor, "
                         f"{got['softirq']:.0%} in packet processing")
    return "; " + "; ".join(parts) if parts else ""


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "not measured"
    if key.startswith("speedup"):
        return f"{value:.3g}x"
    if key == "error_cases":
        return f"{value:g}"
    return f"{value:.1%}"


def readme(folder: ResultsFolder, summary: dict, timeline: tuple[str, str, str] | None) -> str:
    """The folder's README.md: the command that made it, what was measured, the figures.

    Args:
        folder: the folder read back.
        summary: its ``summarize`` result.
        timeline: the plan drawn in ``timeline.png``.

    Returns:
        Markdown text (deterministic for the same rows and metadata).
    """
    meta = folder.meta
    lines = [f"{_README_HEAD}{folder.path.name}", ""]
    command = meta.get("command") or "(not recorded: made through the Python API)"
    lines += ["Made by (from the repository root, as root: it emulates clusters on network namespaces):", "",
              f"    {command}", "", "and rendered by", "", f"    treeattn report {folder.path}", ""]
    host = meta.get("host", {})
    if meta.get("started"):
        lines.append(f"Started {meta['started']} on a {host.get('cpus', '?')}-CPU {host.get('machine', '')} host.")
    for t in meta.get("topologies", []):
        pred = t.get("predicted_on", {})
        cal = pred.get("calibration", "?")
        lines.append(f"- **{t.get('name')}** ({t.get('ranks')} ranks, scale {t.get('scale')}): planned and "
                     f"predicted on {pred.get('name')} (calibration: {cal}); load average "
                     f"{t.get('load_avg_before', ['?'])[0]} before, {t.get('load_avg_after', ['?'])[0]} after; "
                     f"{t.get('wall_s')} s{_host_cpu(t.get('host_cpu'))}.")
    lines += ["", "Cases: " + ", ".join(dict.fromkeys(f"{c['case']} ({c['regime']}, B={c['batch']}, "
                                                   f"{c['tokens_per_rank']} tokens/rank)" for c in summary["cases"])),
              "", "## Figures", "", "| figure | value | target | reached |", "|---|---|---|---|"]
    for key, t in summary["targets"].items():
        op = ">=" if key.startswith("speedup") or key == "error_cases" else "<="
        reached = {True: "yes", False: "**no**", None: "not measured"}[t["reached"]]
        lines.append(f"| {key} | {_fmt(key, t['value'])} | {op} {_fmt(key, t['limit'])} | {reached} |")
    interval = summary["regret"].get("primary_max_interval")
    if interval:
        lines += ["", f"The worst case's regret over {BOOTSTRAP} resamplings of the measured rounds (the i-th "
                      f"iterations of every method together): 5th percentile {_fmt('regret', interval[0])}, 95th "
                      f"{_fmt('regret', interval[1])}."]
    by_topo = summary["regret"].get("by_topology") or {}
    if by_topo:
        lines += ["", "Regret on every topology (its worst case; target <= "
                      f"{_fmt('regret', TARGETS['regret_max'])}):", "",
                  "| topology | worst case | regret | 5th-95th percentile | cases | reached | against the baselines |",
                  "|---|---|---|---|---|---|---|"]
        for topo, r in by_topo.items():
            iv = r["interval"]
            reached = {True: "yes", False: "**no**", None: "not measured"}[r["reached"]]
            vs = r.get("baselines_max")
            against = "—" if vs is None else f"{_fmt('regret', vs)} ({r['baselines_case']})"
            lines.append(f"| {topo} | {r['case'] or '—'} | {_fmt('regret', r['max'])} | "
                         f"{_fmt('regret', iv[0]) + '–' + _fmt('regret', iv[1]) if iv else '—'} | {r['cases']} | "
                         f"{reached} | {against} |")
        lines += ["", "Against the baselines: in the case (named) where the pick fares worst against the fastest "
                      "measured baseline (the library's collectives, vLLM's methods, ring attention), the pick's "
                      "time over that baseline's, minus 1."]
    nominal = summary["errors"]["nominal"]
    lines += ["", f"Prediction error on the topology files' own figures (no calibration): median "
                  f"{_fmt('error', nominal['median'])}, p90 {_fmt('error', nominal['p90'])} over {nominal['n']} rows; "
                  f"against each row's 10th-percentile time instead of its median: median "
                  f"{_fmt('error', summary['errors']['p10']['median'])}, p90 "
                  f"{_fmt('error', summary['errors']['p10']['p90'])}.",
              "", "## Files", "",
              "- `rows.csv`: one row per topology, case and method: measured median (p10, p90) beside the prediction",
              "- `timeline.csv`: per-rank op timelines (measured and predicted) of the picks",
              "- `meta.json`: command, options, load averages, calibration fits",
              "- `calibration/`: the fitted topologies the plans were made for",
              "- `summary.json`: every figure (`treeattn report --json`)",
              "- `scatter.png`: predicted against measured, log-log, y = x",
              f"- `timeline.png`: {':'.join(timeline) if timeline else 'no timeline saved'}, predicted above measured",
              "- `speedup.png`: per case, each method's measured time over the pick's", ""]
    drawn = (SCATTER_FILE, SPEEDUP_FILE) + ((TIMELINE_PNG,) if timeline else ())
    missing = [name for name in drawn if not (folder.path / name).exists()]
    if missing:
        lines.insert(-1, f"- not drawn yet: {', '.join(missing)} (`treeattn report {folder.path}` draws them)")
    return "\n".join(lines)
