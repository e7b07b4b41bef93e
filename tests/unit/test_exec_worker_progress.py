"""Rank 0's progress file (``treeattn.exec.worker.progress_file``): what the local launcher shows
and how it knows the ranks time runs (``launch._timing``)."""

from __future__ import annotations

from treeattn.exec.runner import TIMED_RUNS
from treeattn.exec.worker import progress_file, read_progress


def test_a_new_stage_is_written_at_once_and_figures_within_one_at_most_every_half_second(tmp_path):
    # The launcher keeps a signalled run's rows once it reads that the ranks time runs: a
    # method's whole block of timed runs between two throttled writes left it unsaid (a later
    # Ctrl-C then stopped everything at once, the rows lost).
    write = progress_file(tmp_path)
    write(0, 10, "starting")
    write(3, 10, "checked and warm-up runs: plan of p.yaml")
    assert read_progress(tmp_path) == (3, 10, "checked and warm-up runs: plan of p.yaml")
    write(4, 10, f"{TIMED_RUNS}: plan of p.yaml")
    assert read_progress(tmp_path) == (4, 10, f"{TIMED_RUNS}: plan of p.yaml")
    write(5, 10, f"{TIMED_RUNS}: plan of p.yaml")  # the same stage within half a second: not written
    assert read_progress(tmp_path) == (4, 10, f"{TIMED_RUNS}: plan of p.yaml")
    write(10, 10, f"{TIMED_RUNS}: plan of p.yaml")  # the last run always is
    assert read_progress(tmp_path) == (10, 10, f"{TIMED_RUNS}: plan of p.yaml")
