"""The figures of a validation: prediction error, the pick's regret and its speedups.

Definitions (every figure is computed from ``rows.csv`` alone, so the same rows give the
same summary, byte for byte):

* *error* of a row: ``|predicted - measured| / measured``, over rows with both times and a
  correct result; its median and 90th percentile (linear interpolation) over those rows.
* *regret* of a case: the pick's measured time over the fastest measured method of the case
  (candidates and baselines alike), minus 1; with every iteration's time in the rows, also its
  5th-95th percentile interval over ``BOOTSTRAP`` resamplings of the rounds (the i-th
  iterations of all methods together, as the runner interleaves them: a slow spell of the
  host stays shared), seeded, so the same rows give the same interval.
* *regret against the baselines* of a case: the pick's measured time over the fastest
  measured baseline (the library collectives, vLLM's methods, ring attention: what the pick
  is offered instead of), minus 1; negative where the pick is faster than all of them.
* *speedup over X*: X's measured time over the pick's.

``TARGETS`` are the issue's figures; ``summarize`` says of each whether it was reached. The
case-level ones are taken on the *primary* topology (the 2-node cluster: ``meta.json``'s
``primary_topology``, else the topology with the most ranks).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

__all__ = ["TARGETS", "LONG_CONTEXT_TOKENS", "error_frame", "case_frame", "primary_topology", "regret_by_topology",
           "summarize", "summary_json"]

TARGETS = {
    "speedup_allreduce3_b1_min": 1.5,
    "speedup_ring_attention_64k_min": 5.0,
    "regret_max": 0.10,
    "error_median_max": 0.15,
    "error_p90_max": 0.35,
    "error_cases_min": 30,
}
"""On the primary topology: the pick at least 1.5x faster than all-reduce x3 at B = 1 and 5x
faster than ring attention at 64K tokens per rank, regret at most 10 %; over every row:
median error at most 15 %, 90th percentile at most 35 %, over at least 30 rows."""

BOOTSTRAP = 2000
"""Resamplings behind a regret's interval."""

LONG_CONTEXT_TOKENS = 65536
"""Tokens per rank from which a case counts for the ring-attention target."""


def _ok(x: object) -> bool:
    return x is not None and isinstance(x, (int, float, np.floating, np.integer)) and math.isfinite(float(x))


def error_frame(rows: pd.DataFrame, column: str = "predicted_us") -> pd.DataFrame:
    """The rows that have a prediction, a measurement and a correct result, with ``error``
    (``|predicted - measured| / measured``) and ``signed_error`` (``(predicted - measured) / measured``).

    Args:
        rows: ``rows.csv`` as read by ``load_folder``.
        column: the prediction: ``predicted_us`` (the planning topology) or ``predicted_nominal_us``.
    """
    ok = rows["correct"] & rows[column].map(_ok) & rows["measured_median_us"].map(_ok)
    ok &= rows["measured_median_us"].astype(float) > 0
    out = rows[ok].copy()
    pred = out[column].astype(float)
    meas = out["measured_median_us"].astype(float)
    out["signed_error"] = (pred - meas) / meas
    out["error"] = out["signed_error"].abs()
    return out


def _p10_errors(rows: pd.DataFrame) -> pd.Series:
    """|predicted - p10| / p10: the error against the fastest tenth of the iterations (what
    interference from the rest of the host can only lengthen)."""
    err = error_frame(rows)
    if err.empty:
        return pd.Series(dtype=float)
    p10 = err["measured_p10_us"].astype(float)
    ok = p10 > 0
    return ((err["predicted_us"].astype(float) - p10).abs() / p10)[ok]


def _measured(case: pd.DataFrame, method: str) -> float | None:
    """The baseline ``method``'s measured time (a candidate family may share its name)."""
    hit = case[(case["method"] == method) & (case["role"] == "baseline") & case["correct"]]
    return float(hit["measured_median_us"].iloc[0]) if len(hit) else None


def _times(cell: object) -> np.ndarray | None:
    if not isinstance(cell, str) or not cell.strip():
        return None
    try:
        out = np.array([float(x) for x in cell.split()])
    except ValueError:
        return None
    return out if len(out) and np.isfinite(out).all() else None


def regret_interval(good: pd.DataFrame, pick_label: object) -> tuple[float, float] | None:
    """5th and 95th percentiles of the regret over ``BOOTSTRAP`` paired resamplings of the
    rounds, for the pick at index label ``pick_label`` of ``good`` (None without every
    method's iteration times, all of one count)."""
    series = [_times(c) for c in good["measured_times_us"]] if "measured_times_us" in good else []
    if not series or any(s is None for s in series) or len({len(s) for s in series}) != 1:
        return None
    labels = list(good.index)
    if pick_label not in labels:
        return None
    n = len(series[0])
    picks = np.random.default_rng(0).integers(0, n, size=(BOOTSTRAP, n))
    medians = np.stack([np.median(s[picks], axis=1) for s in series])
    regret = medians[labels.index(pick_label)] / medians.min(axis=0) - 1.0
    return float(np.quantile(regret, 0.05)), float(np.quantile(regret, 0.95))


def case_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (topology, case): the pick, the fastest measured method, regret and speedups.

    Returns:
        Columns ``topology, case, regime, batch, tokens_per_rank, payload_bytes, pick, pick_us,
        pick_predicted_us, best, best_us, regret, regret_low, regret_high, best_baseline,
        regret_baselines, speedup_allreduce3, speedup_allgather_merge, speedup_ring_attention`` (None
        where a method is missing;
        ``regret_low/high``: ``regret_interval``), in the rows' order.
    """
    out = []
    for (topo, case), grp in rows.groupby(["topology", "case"], sort=False):
        good = grp[grp["correct"] & grp["measured_median_us"].map(_ok)]
        picks = grp[grp["is_pick"]]
        pick = picks.iloc[0] if len(picks) else None
        pick_us = float(pick["measured_median_us"]) if pick is not None and bool(pick["correct"]) else None
        best = good.loc[good["measured_median_us"].astype(float).idxmin()] if len(good) else None
        bases = good[good["role"] == "baseline"]
        base = bases.loc[bases["measured_median_us"].astype(float).idxmin()] if len(bases) else None
        first = grp.iloc[0]
        interval = regret_interval(good, pick.name) if pick_us and pick is not None else None

        def speedup(method: str, pick_us: float | None = pick_us, grp: pd.DataFrame = grp) -> float | None:
            other = _measured(grp, method)
            return other / pick_us if other is not None and pick_us else None

        out.append({
            "topology": topo,
            "case": case,
            "regime": first["regime"],
            "batch": int(first["batch"]),
            "tokens_per_rank": int(first["tokens_per_rank"]),
            "payload_bytes": int(first["payload_bytes"]),
            "pick": None if pick is None else pick["method"],
            "pick_us": pick_us,
            "pick_predicted_us": None if pick is None or not _ok(pick["predicted_us"]) else float(pick["predicted_us"]),
            "best": None if best is None else best["method"],
            "best_us": None if best is None else float(best["measured_median_us"]),
            "regret": (pick_us / float(best["measured_median_us"]) - 1.0) if pick_us and best is not None else None,
            "regret_low": interval[0] if interval else None,
            "regret_high": interval[1] if interval else None,
            "best_baseline": None if base is None else base["method"],
            "regret_baselines": (pick_us / float(base["measured_median_us"]) - 1.0) if pick_us and base is not None
            else None,
            "speedup_allreduce3": speedup("allreduce3"),
            "speedup_allgather_merge": speedup("allgather-merge"),
            "speedup_ring_attention": speedup("ring-attention"),
        })
    return pd.DataFrame(out)


def primary_topology(rows: pd.DataFrame, meta: dict | None = None) -> str:
    """``meta['primary_topology']`` when it names a topology of the rows, else the one with the
    most ranks (the first of them in the rows on a tie)."""
    names = list(dict.fromkeys(rows["topology"]))
    wanted = (meta or {}).get("primary_topology")
    if wanted in names:
        return wanted
    ranks = {n: int(rows.loc[rows["topology"] == n, "ranks"].max()) for n in names}
    return max(names, key=lambda n: (ranks[n], -names.index(n)))


def _stats(errors: pd.Series) -> dict:
    if errors.empty:
        return {"n": 0, "median": None, "p90": None, "max": None}
    values = errors.astype(float).to_numpy()
    return {"n": int(values.size), "median": _r(float(np.median(values))),
            "p90": _r(float(np.percentile(values, 90))), "max": _r(float(values.max()))}


def _r(x: float | None, digits: int = 6) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _target(value: float | None, limit: float, at_least: bool) -> dict:
    reached = None if value is None else (value >= limit if at_least else value <= limit)
    return {"value": _r(value), "limit": limit, "reached": reached}


def summarize(rows: pd.DataFrame, meta: dict | None = None) -> dict:
    """Every figure of the validation (see the module docstring), as plain JSON data.

    Args:
        rows: ``rows.csv`` as read by ``load_folder``.
        meta: ``meta.json`` (for ``primary_topology``), optional.

    Returns:
        ``{"errors": ..., "cases": [...], "primary_topology": ..., "targets": ...}``.
    """
    err = error_frame(rows)
    cases = case_frame(rows)
    primary = primary_topology(rows, meta)
    errors = {
        "all": _stats(err["error"]),
        "signed_median": _r(float(err["signed_error"].median())) if len(err) else None,
        "by_topology": {t: _stats(g["error"]) for t, g in err.groupby("topology", sort=True)},
        "by_role": {t: _stats(g["error"]) for t, g in err.groupby("role", sort=True)},
        "by_regime": {t: _stats(g["error"]) for t, g in err.groupby("regime", sort=True)},
        "excluded_rows": int(len(rows) - len(err)),
        "nominal": _stats(error_frame(rows, "predicted_nominal_us")["error"]),
        "p10": _stats(_p10_errors(rows)),
    }
    prim = cases[cases["topology"] == primary] if len(cases) else cases
    sweep = prim[prim["regime"] == "sweep"] if len(prim) else prim
    b1 = sweep[sweep["batch"] == 1]["speedup_allreduce3"].dropna() if len(sweep) else pd.Series(dtype=float)
    long = prim[prim["tokens_per_rank"] >= LONG_CONTEXT_TOKENS]["speedup_ring_attention"].dropna() \
        if len(prim) else pd.Series(dtype=float)
    regrets = prim["regret"].dropna() if len(prim) else pd.Series(dtype=float)
    t = TARGETS
    targets = {
        "speedup_allreduce3_b1": _target(float(b1.min()) if len(b1) else None, t["speedup_allreduce3_b1_min"], True),
        "speedup_ring_attention_64k": _target(float(long.min()) if len(long) else None,
                                              t["speedup_ring_attention_64k_min"], True),
        "regret": _target(float(regrets.max()) if len(regrets) else None, t["regret_max"], False),
        "error_median": _target(errors["all"]["median"], t["error_median_max"], False),
        "error_p90": _target(errors["all"]["p90"], t["error_p90_max"], False),
        "error_cases": _target(float(errors["all"]["n"]), t["error_cases_min"], True),
    }
    case_rows = []
    for rec in cases.to_dict(orient="records"):
        case_rows.append({k: (_r(v) if isinstance(v, float) else v) for k, v in rec.items()})
    return {
        "rows": int(len(rows)),
        "topologies": sorted(set(rows["topology"])),
        "primary_topology": primary,
        "errors": errors,
        "cases": case_rows,
        "regret": {"primary_max": _r(float(regrets.max())) if len(regrets) else None,
                   "primary_max_interval": _worst_interval(prim),
                   "all_max": _r(float(cases["regret"].dropna().max())) if len(cases["regret"].dropna()) else None,
                   "by_topology": regret_by_topology(cases)},
        "targets": targets,
    }


def regret_by_topology(cases: pd.DataFrame) -> dict:
    """Per topology, its worst case's regret: ``{"max", "case", "interval", "cases",
    "reached", "baselines_max", "baselines_case"}`` (``reached``: against
    ``TARGETS["regret_max"]``; ``None`` without a measured pick; ``baselines_*``: the worst
    case's regret against the baselines alone, None without any)."""
    out: dict = {}
    if not len(cases):
        return out
    for topo, group in cases.groupby("topology", sort=True):
        got = group.dropna(subset=["regret"])
        if not len(got):
            out[topo] = {"max": None, "case": None, "interval": None, "cases": 0, "reached": None,
                         "baselines_max": None, "baselines_case": None}
            continue
        worst = got.loc[got["regret"].astype(float).idxmax()]
        value = float(worst["regret"])
        vs = got.dropna(subset=["regret_baselines"])
        vs_worst = vs.loc[vs["regret_baselines"].astype(float).idxmax()] if len(vs) else None
        out[topo] = {"max": _r(value), "case": worst["case"], "interval": _worst_interval(got),
                     "cases": int(len(got)), "reached": value <= TARGETS["regret_max"],
                     "baselines_max": None if vs_worst is None else _r(float(vs_worst["regret_baselines"])),
                     "baselines_case": None if vs_worst is None else vs_worst["case"]}
    return out


def _worst_interval(cases: pd.DataFrame) -> list[float] | None:
    """The regret interval of the case with the largest regret."""
    got = cases.dropna(subset=["regret"]) if len(cases) else cases
    if not len(got):
        return None
    worst = got.loc[got["regret"].astype(float).idxmax()]
    low, high = worst["regret_low"], worst["regret_high"]
    return [_r(float(low)), _r(float(high))] if _ok(low) and _ok(high) else None


def summary_json(summary: dict) -> str:
    """``summary`` as deterministic JSON (sorted keys, NaN as null, trailing newline)."""
    return json.dumps(_clean(summary), sort_keys=True, indent=2) + "\n"


def _clean(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value
