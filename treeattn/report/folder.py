"""The layout of a results folder (what ``treeattn validate`` writes and ``treeattn report`` reads).

A results folder holds:

* ``rows.csv``: one row per (topology, case, method): the method's measured median beside
  the simulator's prediction (``ROW_COLUMNS``).
* ``timeline.csv``: per-rank op timelines of some plans, measured and predicted
  (``TIMELINE_COLUMNS``); measured times count from each rank's own start of the iteration.
* ``meta.json``: how the rows were made (command, options, load average, calibration).
* ``summary.json``, ``scatter.png``, ``timeline.png``, ``speedup.png``: what ``report`` renders.

Words we use: a *case* is one workload on one topology; a *method* is one thing measured on
it: a candidate family's best plan (``role`` ``candidate``, ``method`` the family, or several
families joined by ``+`` when they gave the same plan) or a baseline (``role`` ``baseline``:
``allreduce3``, ``allgather-merge``, ``ring-attention``). ``is_pick`` marks the planner's choice.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from treeattn.errors import InputError

__all__ = [
    "ROWS_FILE",
    "TIMELINE_FILE",
    "META_FILE",
    "SUMMARY_FILE",
    "ROW_COLUMNS",
    "TIMELINE_COLUMNS",
    "ResultsFolder",
    "load_folder",
]

ROWS_FILE = "rows.csv"
TIMELINE_FILE = "timeline.csv"
META_FILE = "meta.json"
SUMMARY_FILE = "summary.json"

ROW_COLUMNS = (
    "topology", "case", "regime", "ranks", "batch", "q_heads", "kv_heads", "head_dim", "tokens_per_rank",
    "payload_bytes", "kv_bytes_per_rank", "method", "role", "is_pick", "algorithm", "chunks",
    "predicted_us", "predicted_nominal_us", "measured_median_us", "measured_p10_us", "measured_p90_us", "repeats",
    "correct", "max_rel_err", "measured_times_us",
)
"""``regime``: ``sweep`` (payloads from latency- to bandwidth-bound) or ``long-context``;
``payload_bytes``: one rank's partial; ``predicted_us``: the simulator on the topology the
plans were made for (calibrated when ``meta.json`` says so); ``predicted_nominal_us``: on the
emulated topology's own figures (the file's, times the scale); ``measured_times_us``: every
timed iteration, space separated, in the order they ran (with the runner's interleaved order
the i-th iterations of one topology's methods ran in the same round)."""

OPTIONAL_COLUMNS = ("measured_times_us",)
"""Columns folders made before them lack (read back as empty)."""

NUMERIC_COLUMNS = frozenset({
    "ranks", "batch", "q_heads", "kv_heads", "head_dim", "tokens_per_rank", "payload_bytes", "kv_bytes_per_rank",
    "chunks", "predicted_us", "predicted_nominal_us", "measured_median_us", "measured_p10_us", "measured_p90_us",
    "repeats", "max_rel_err", "rank", "op_index", "peer", "chunk", "start_us", "end_us",
})
"""Columns read as numbers (empty cells stay missing)."""

COUNT_COLUMNS = frozenset({"ranks", "batch", "q_heads", "kv_heads", "head_dim", "chunks", "repeats"})
"""Numbers that count something there is at least one of: whole, 1 or more."""
SIZE_COLUMNS = frozenset({"tokens_per_rank", "payload_bytes", "kv_bytes_per_rank", "rank", "op_index", "chunk"})
"""Numbers that count from 0: whole, not negative."""

TIMELINE_COLUMNS = ("topology", "case", "method", "source", "rank", "op_index", "kind", "peer", "chunk",
                    "start_us", "end_us")
"""``source``: ``measured`` (post and completion of each op on each rank, from its own start)
or ``predicted`` (the simulator's start and end)."""


@dataclass(frozen=True)
class ResultsFolder:
    """A results folder read back."""

    path: Path
    rows: pd.DataFrame
    timeline: pd.DataFrame
    """Empty (with the columns) when the folder has no timeline file."""
    meta: dict = field(default_factory=dict)


def _short_record(path: Path) -> int | None:
    """The line of the first record with fewer fields than the header (a file cut mid-row, which
    pandas would fill with missing values), or of a last record the file ends inside (no line
    end: cut within its last field, which reads as a shorter value), else None."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        last = None
        for record in reader:
            if record and len(record) < len(header):
                return reader.line_num
            last = reader.line_num if record else last
    if last is not None:
        with path.open("rb") as f:
            f.seek(-1, 2)
            if f.read(1) not in (b"\n", b"\r"):  # every writer of these files ends each row
                return last
    return None


def _read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
        short = _short_record(path)
    except (OSError, ValueError, csv.Error) as exc:  # pandas raises ValueError subclasses on bad CSV
        raise InputError(f"cannot read {path}: {exc}") from None
    if short is not None:
        raise InputError(f"{path}:{short}: the row has fewer fields than the header, or the file ends inside it: "
                         "the file was cut short? (a whole file ends each row with a line end)")
    for c in OPTIONAL_COLUMNS:
        if c in columns and c not in frame.columns:
            frame[c] = ""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{path} lacks the columns {', '.join(missing)}; is it a treeattn validate results file?")
    frame = frame[list(columns)]
    for col in NUMERIC_COLUMNS & set(columns):
        # A hand-edited or truncated number would otherwise surface later as a traceback.
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = frame[col].notna() & values.isna()
        if bad.any():
            line = int(bad.to_numpy().nonzero()[0][0]) + 2  # the header is line 1
            raise InputError(f"{path}:{line}: {col} is {frame[col][bad].iloc[0]!r}, not a number")
        if col.endswith("_us"):
            # A time is finite and not negative; a hand-edited one would skew every ratio silently.
            wrong = values.notna() & ~values.between(0.0, float("inf"), inclusive="left")
            if wrong.any():
                line = int(wrong.to_numpy().nonzero()[0][0]) + 2
                raise InputError(f"{path}:{line}: {col} is {float(values[wrong].iloc[0])!r}, not a time "
                                 "(microseconds, finite and not negative)")
        least = 1 if col in COUNT_COLUMNS else 0 if col in SIZE_COLUMNS else None
        if least is not None:
            # A hand-edited count (ranks -5) was read as it stood and drawn from.
            wrong = values.notna() & ((values < least) | (values != values.round()))
            if wrong.any():
                line = int(wrong.to_numpy().nonzero()[0][0]) + 2
                raise InputError(f"{path}:{line}: {col} is {values[wrong].iloc[0]:g}, not a whole number of at least "
                                 f"{least}")
        frame[col] = values
    return frame


def load_folder(path: str | Path) -> ResultsFolder:
    """Read a results folder (``rows.csv`` required; ``timeline.csv`` and ``meta.json`` optional).

    Args:
        path: the folder.

    Returns:
        The rows (``ROW_COLUMNS``, booleans parsed), the timeline and the metadata.

    Raises:
        InputError: the folder or its rows file is missing or malformed.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"results folder {str(folder)!r} is a file; give the folder `treeattn validate --out` wrote")
    if not folder.is_dir():
        raise InputError(f"results folder {str(folder)!r} does not exist (make one with `treeattn validate --out`)")
    rows_path = folder / ROWS_FILE
    if not rows_path.is_file():
        raise InputError(f"{folder} has no {ROWS_FILE}; report reads the folders treeattn validate writes (a run's "
                         "rows are its own CSV, results/runs/RUN-ID.csv: README, 'Output files')")
    rows = _read_csv(rows_path, ROW_COLUMNS)
    if rows.empty:
        raise InputError(f"{rows_path} holds no rows")
    for col in ("is_pick", "correct"):
        rows[col] = rows[col].map(_bool).astype(bool)
    for col in ("topology", "case", "method", "role", "regime", "algorithm"):
        rows[col] = rows[col].astype(str)
    tl_path = folder / TIMELINE_FILE
    timeline = _read_csv(tl_path, TIMELINE_COLUMNS) if tl_path.is_file() else pd.DataFrame(
        columns=list(TIMELINE_COLUMNS))
    meta: dict = {}
    meta_path = folder / META_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read {meta_path}: {exc}") from None
        except RecursionError:  # brackets opened thousands deep: no writer of meta.json
            raise InputError(f"cannot read {meta_path}: not JSON: nested too deeply") from None
    return ResultsFolder(folder, rows, timeline, meta)


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "nan"):
        return False
    raise InputError(f"expected true or false in a results file, got {value!r}")
