"""Rich tables of a validation summary (what ``treeattn report`` prints)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from treeattn.units import format_size

__all__ = ["errors_table", "cases_table", "targets_table", "regret_table"]


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.0%}" if signed else f"{x:.0%}"


def _pct1(x: float | None) -> str:
    """One decimal: a figure beside its target must not round onto it (15.1 % is not 15 %)."""
    return "—" if x is None else f"{x:.1%}"


def _ms(us: float | None) -> str:
    return "—" if us is None else f"{us / 1e3:,.3g}"


def _x(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:,.3g}×"


def errors_table(summary: dict) -> Table:
    """|predicted - measured| / measured: median, p90 and max, over all rows and by group."""
    e = summary["errors"]
    table = Table(title="Prediction error |predicted − measured| / measured")
    for col in ("rows", "n", "median", "p90", "max"):
        table.add_column(col, justify="left" if col == "rows" else "right")
    groups = [("all", e["all"])]
    for key in ("by_topology", "by_role", "by_regime"):
        groups += [(escape(f"{key[3:]}: {name}"), stats) for name, stats in e[key].items()]
    for name, s in groups:
        table.add_row(name, str(s["n"]), _pct(s["median"]), _pct(s["p90"]), _pct(s["max"]))
    for name, s in (("on the file's figures (uncalibrated)", e["nominal"]),
                    ("against each row's p10 time", e["p10"])):
        table.add_row(name, str(s["n"]), _pct(s["median"]), _pct(s["p90"]), _pct(s["max"]))
    table.caption = (f"signed median (predicted − measured)/measured {_pct(e['signed_median'], True)}; "
                     f"{e['excluded_rows']} rows without a prediction or a correct result left out")
    return table


def _regret(case: dict) -> str:
    """``12% (3–25%)``: the regret and its bootstrap interval, when the rows allow one."""
    low, high = case.get("regret_low"), case.get("regret_high")
    if low is None or high is None:
        return _pct(case["regret"])
    return f"{_pct(case['regret'])} ({_pct(low)}–{_pct(high)})"


def cases_table(summary: dict) -> Table:
    """Per case: the pick, its measured and predicted time, the fastest method, regret, speedups."""
    table = Table(title="Per case: the planner's pick against the fastest measured method and the baselines (ms)")
    for col in ("topology", "case", "payload", "pick", "measured", "predicted", "fastest", "regret", "× allreduce3",
                "× allgather", "× ring attn"):
        table.add_column(col, justify="left" if col in ("topology", "case", "pick", "fastest") else "right")
    for c in summary["cases"]:
        table.add_row(escape(c["topology"]), escape(c["case"]), format_size(c["payload_bytes"]), str(c["pick"]),
                      _ms(c["pick_us"]), _ms(c["pick_predicted_us"]), str(c["best"]), _regret(c),
                      _x(c["speedup_allreduce3"]), _x(c["speedup_allgather_merge"]), _x(c["speedup_ring_attention"]))
    return table


_TARGET_TEXT = {
    "speedup_allreduce3_b1": ("pick over all-reduce ×3 at B = 1 (worst case)", "≥", _x),
    "speedup_ring_attention_64k": ("pick over ring attention at ≥ 64K tokens/rank", "≥", _x),
    "regret": ("regret: pick / fastest measured − 1 (worst case)", "≤", _pct1),
    "error_median": ("median |error|, every row", "≤", _pct1),
    "error_p90": ("90th percentile |error|, every row", "≤", _pct1),
    "error_cases": ("rows with a prediction and a correct measurement", "≥", lambda v: f"{v:g}"),
}


def targets_table(summary: dict) -> Table:
    """The issue's figures: value, limit, reached."""
    table = Table(title=f"Targets (case figures on {escape(summary['primary_topology'])})")
    for col in ("figure", "value", "target", "reached"):
        table.add_column(col, justify="left" if col in ("figure", "reached") else "right")
    for key, t in summary["targets"].items():
        text, op, fmt = _TARGET_TEXT[key]
        reached = {True: "[green]yes[/]", False: "[bold red]no[/]", None: "[yellow]not measured[/]"}[t["reached"]]
        value = "—" if t["value"] is None else fmt(t["value"])
        interval = summary["regret"].get("primary_max_interval") if key == "regret" else None
        if interval and t["value"] is not None:
            value += f" ({fmt(interval[0])}–{fmt(interval[1])})"
        table.add_row(text, value, f"{op} {fmt(t['limit'])}", reached)
    if summary["regret"].get("primary_max_interval"):
        table.caption = "regret in brackets: 5th–95th percentile over resamplings of the measured rounds"
    return table


def regret_table(summary: dict) -> Table:
    """Per topology, its worst case's regret and interval, against the target."""
    limit = summary["targets"]["regret"]["limit"]
    table = Table(title=f"Regret on every topology (worst case; target ≤ {_pct(limit)})")
    for col in ("topology", "case", "regret", "interval", "reached", "vs baselines"):
        table.add_column(col, justify="right" if col in ("regret", "interval", "vs baselines") else "left")
    for topo, r in (summary["regret"].get("by_topology") or {}).items():
        iv = r["interval"]
        reached = {True: "[green]yes[/]", False: "[bold red]no[/]", None: "[yellow]not measured[/]"}[r["reached"]]
        vs = r.get("baselines_max")
        table.add_row(escape(topo), escape(str(r["case"] or "—")), _pct(r["max"]),
                      f"{_pct(iv[0])}–{_pct(iv[1])}" if iv else "—", reached,
                      "—" if vs is None else f"{_pct(vs)} ({escape(str(r['baselines_case']))})")
    table.caption = ("vs baselines: the case where the pick fares worst against the fastest baseline (library "
                     "collectives, vLLM's methods, ring attention): pick / that baseline − 1")
    return table
