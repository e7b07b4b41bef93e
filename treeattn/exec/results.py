"""Tidy result rows of a run (one per plan x method) and the op timeline, as pandas frames.

Columns of a result row: ``run_id``, ``plan`` (file name), ``algorithm``, ``topology``
(predicted on), ``workload`` (compact shape), ``method`` (``plan`` or a baseline), ``ranks``,
``backend``, ``predicted_us``, ``measured_median_us`` (median over iterations of the max
over ranks), ``spread_us`` (p90 - p10), ``rel_error`` ((measured - predicted) / predicted),
``correct``, ``max_rel_err`` (numerical error against the single-process reference),
``tolerance`` (the most it may be: ``treeattn.exec.runner.tolerance``), ``same_bits``
(where every rank ends with the whole result: whether all of them got the same bits; empty
elsewhere).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from pathlib import Path

import pandas as pd

from treeattn.exec.predict import Predictions
from treeattn.exec.runner import JobResult
from treeattn.plan.ir import Plan
from treeattn.textfile import append_file
from treeattn.workload import Payload, RawPayload, even_split

__all__ = ["COLUMNS", "TIMELINE_COLUMNS", "workload_label", "new_run_id", "new_run_file", "result_rows",
           "timeline_rows", "appendable_problem", "write_csv", "rows_records"]

COLUMNS = ("run_id", "plan", "algorithm", "topology", "workload", "method", "ranks", "backend", "predicted_us",
           "measured_median_us", "spread_us", "rel_error", "correct", "max_rel_err", "tolerance", "same_bits",
           "timed_runs")
TIMELINE_COLUMNS = ("run_id", "plan", "rank", "op_index", "step", "kind", "peer", "chunk", "block", "post_us",
                    "done_us")


def workload_label(payload: Payload) -> str:
    """Compact text of a payload, e.g. ``llama-3.1-8b B1 Hq32/8 D128 N262144 bf16/fp32`` (``D576
    Dv512 latent`` for MLA) plus ``split=...`` when uneven; ``raw 16000B fp32 sum`` for raw
    payloads."""
    if isinstance(payload, RawPayload):
        return f"raw {payload.nbytes}B {payload.dtype.value} {payload.op.value}"
    w = payload
    dv = "" if w.v_head_dim is None else f" Dv{w.value_dim}"
    text = (f"{w.model + ' ' if w.model else ''}B{w.batch} Hq{w.q_heads}/{w.kv_heads} D{w.head_dim}{dv}"
            f"{' latent' if w.kv_latent else ''} N{w.seq_len} {w.kv_dtype.value}/{w.partial_dtype.value}")
    if tuple(w.split) != even_split(w.seq_len, w.ranks):
        text += " split=" + ",".join(map(str, w.split))
    return text


def _stem(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def new_run_id(label: str) -> str:
    """``YYYYmmdd-HHMMSS-<label>``: sortable, and names the plan. Not unique by itself: two
    runs of one plan in one second get the same; ``new_run_file`` gives one no other run has."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_stem(label)}"


def new_run_file(folder: Path, label: str) -> tuple[str, Path]:
    """A run id no other run in ``folder`` has, and its rows file ``folder/RUN-ID.csv``, made
    here (empty) so that no other run takes it.

    The id is ``new_run_id``'s; when that file is taken (a run of the same plan started in the
    same second) the second gets a count, ``YYYYmmdd-HHMMSS.2-<label>``, so the ids still sort
    by time and the first run's file is never written by another.

    Args:
        folder: where the rows files go (created with its parents).
        label: names the plan.

    Returns:
        The run id and the new, empty file.

    Raises:
        OSError: the folder or the file cannot be made.
    """
    folder.mkdir(parents=True, exist_ok=True)
    stamp, stem = time.strftime("%Y%m%d-%H%M%S"), _stem(label)
    for n in itertools.count(1):  # ends at the first name no run has taken
        run_id = f"{stamp}-{stem}" if n == 1 else f"{stamp}.{n}-{stem}"
        path = folder / f"{run_id}.csv"
        if path.with_name(f"{run_id}.timeline.csv").exists():  # another run's timeline: its name is taken too
            continue
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return run_id, path
    raise AssertionError("itertools.count ended")


def _num(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def result_rows(result: JobResult, plans: dict[str, Plan], predictions: dict[str, Predictions],
                run_id: str) -> pd.DataFrame:
    """One row per measurement.

    Args:
        result: rank 0's ``JobResult``.
        plans: the plans by label.
        predictions: ``Predictions`` by plan label.
        run_id: the run's id.

    Returns:
        A frame with ``COLUMNS``.
    """
    rows = []
    for m in result.measurements:
        plan = plans[m.label]
        pred = predictions.get(m.label)
        predicted = pred.us.get(m.method) if pred is not None else None
        rel = (m.median_us - predicted) / predicted if predicted else None
        rows.append({
            "run_id": run_id,
            "plan": m.label,
            "algorithm": plan.algorithm,
            "topology": pred.topology if pred is not None else plan.topology.name,
            "workload": workload_label(plan.workload),
            "method": m.method,
            "ranks": plan.ranks,
            "backend": result.backend,
            "predicted_us": _num(predicted),
            "measured_median_us": _num(m.median_us),
            "spread_us": _num(m.spread_us),
            "rel_error": _num(rel, 4),
            "correct": bool(m.correct),
            "max_rel_err": float(f"{m.max_rel_err:.3e}") if math.isfinite(m.max_rel_err) else None,
            "tolerance": float(f"{m.tolerance:.3e}"),
            "same_bits": m.same_bits,
            "timed_runs": len(m.times_us),  # fewer than asked where a signal stopped the run
        })
    return pd.DataFrame(rows, columns=list(COLUMNS))


def timeline_rows(result: JobResult, run_id: str) -> pd.DataFrame:
    """Every op of the plan's last timed iteration on every rank (post and completion, µs)."""
    rows = []
    for m in result.measurements:
        for t in sorted(m.timeline, key=lambda t: (t.rank, t.index)):
            rows.append({
                "run_id": run_id, "plan": m.label, "rank": t.rank, "op_index": t.index, "step": t.op.step,
                "kind": t.op.kind.value, "peer": t.op.peer, "chunk": t.op.chunk, "block": t.op.block,
                "post_us": round(t.post_us, 3), "done_us": round(t.done_us, 3),
            })
    # peer, chunk and block are missing on some ops (compute has no peer): as plain ints they
    # would turn float where one is missing, and the CSV would read "peer 2.0".
    return pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS)).astype({"peer": "Int64", "chunk": "Int64",
                                                                      "block": "Int64"})


def appendable_problem(path: Path, columns: tuple[str, ...]) -> str | None:
    """Why rows of ``columns`` cannot be appended to ``path`` (a CSV with another header, say
    from an older treeattn: the rows would land under the wrong names), or None."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        with path.open("rb") as f:
            first = f.readline(4096)
    except FileNotFoundError:  # an empty file another rank's check made and removed meanwhile
        return None
    try:
        header = first.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        header = ""
    if not header or not header.replace("\t", " ").isprintable():  # binary data, or no header: its bytes say nothing
        return f"{str(path)!r} is not a CSV file of rows (its first line is no header); give a new file"
    if header != ",".join(columns):
        theirs = header.split(",")
        lacks = [c for c in columns if c not in theirs]
        more = [c for c in theirs if c not in columns]
        parts = [f"{word} {', '.join(names[:4])}{'...' if len(names) > 4 else ''}"
                 for word, names in (("no", lacks), ("also", more)) if names]
        what = "; ".join(parts) or "in another order"
        older = " (an older treeattn's, say)" if lacks and not more else ""
        return f"{str(path)!r} holds rows of other columns{older}: {what}; give a new file"
    return None


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Append ``frame`` to ``path`` (header only when the file is empty), creating folders.

    Whole rows or none: a write that fails leaves the file as it was (``append_file``), and
    runs appending to one file at once do not interleave their rows or both write a header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_file(path, frame.to_csv(index=False, header=False), header=frame.iloc[:0].to_csv(index=False))


def rows_records(frame: pd.DataFrame) -> list[dict]:
    """The rows as plain dicts (missing numbers as None)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in frame.astype(object).to_dict(orient="records")]
