"""One locally started rank: ``python -m treeattn.exec.worker RUN_DIR`` (see ``launch_local``).

Reads ``RUN_DIR/job.pkl`` and its rank from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; rank 0
writes ``RUN_DIR/result.pkl``. On any error it writes ``RUN_DIR/rank<R>.error.json`` (``kind``
is ``comm`` when it only lost a peer), prints the traceback to its log and exits at once with
status 1, skipping teardown that could block on a dead peer. ``interrupts.WRAP_UP_SIGNAL``
from the launcher stops it the same way, except where the job wraps up (``RunOptions.wrap_up``)
and its methods have begun: then it and the stopping signals ask the ranks to stop together
and keep the runs done, through to the result's writing.

``python -m treeattn.exec.worker RUN_DIR --ranks N`` starts all N ranks from one interpreter
instead (``fork_ranks``): it imports torch once and forks them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path

from treeattn.errors import TreeattnError
from treeattn.exec.board import RankExited
from treeattn.exec.comm import CommError
from treeattn.exec.runner import Progress, run_rank
from treeattn.interrupts import WRAP_UP_SIGNAL, raise_interrupt, wrap_up_on_signals

__all__ = ["main", "fork_ranks", "progress_file", "read_progress", "PROGRESS_FILE", "PIDS_FILE"]

PROGRESS_FILE = "progress"
"""In the run directory: rank 0's ``runs done, runs known, what`` (``read_progress``)."""
_WRITE_EVERY_S = 0.5
PIDS_FILE = "pids"
"""In the run directory: the process ids of the ranks ``fork_ranks`` started, in rank order."""
_ADOPTION_S = 30.0
"""How long a forked rank waits to become the launcher's child before it gives up."""

_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Timed out waiting", "Broken pipe",
              # NCCL: a peer's communicator failed, was aborted, or its watchdog timed out
              "NCCL communicator was aborted", "ncclRemoteError", "remote process exited", "Watchdog caught collective")


def failure_kind(exc: BaseException) -> str:
    """What a rank's failure was, for ``launch.rank_failure``, which names a rank of the first
    kind first: ``error`` (anything but communication), ``comm`` (a wait of this rank's own
    failed: a timeout), ``lost`` (a peer's end: its process gone, its connection closed, the
    knock-on of another rank's failure)."""
    if (isinstance(exc, RankExited) or isinstance(exc.__cause__, RankExited)  # the board's wait, as Comm words it
            or any(marker in str(exc) for marker in _PEER_LOST)):
        return "lost"
    return "comm" if isinstance(exc, CommError) else "error"


def _die_with_parent() -> None:
    # NOTE: Linux only; elsewhere the parent's watchdog and the op deadlines still apply.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get("TREEATTN_PARENT_PID")
    if parent and os.getppid() != int(parent):
        os._exit(1)  # the parent died before prctl took effect


def progress_file(run_dir: Path) -> Progress:
    """A ``run_rank`` progress that writes the latest figures to ``RUN_DIR/progress`` (whole:
    a new file renamed over the old), at most every ``_WRITE_EVERY_S``, at the last run and
    whenever the stage (``what`` before its ``:``) changes, for the launcher to show and to know
    when the ranks time runs (``launch_local``)."""
    last: list = [-math.inf, None]

    def write(done: int, total: int, what: str) -> None:
        now = time.monotonic()
        stage = what.partition(":")[0]
        if now - last[0] < _WRITE_EVERY_S and done < total and stage == last[1]:
            return
        last[:] = [now, stage]
        tmp = run_dir / f"{PROGRESS_FILE}.tmp"
        tmp.write_text(json.dumps([done, total, what]))
        tmp.replace(run_dir / PROGRESS_FILE)

    return write


def read_progress(run_dir: Path) -> tuple[int, int, str] | None:
    """What rank 0 last wrote (``progress_file``), or None: nothing yet, or unreadable."""
    try:
        done, total, what = json.loads((run_dir / PROGRESS_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return int(done), int(total), str(what)


def fork_ranks(run_dir: Path, world: int) -> None:
    """Fork the ``world`` ranks of a local run from this process, write their process ids to
    ``RUN_DIR/pids`` and exit.

    Every rank would otherwise import torch itself: seconds of CPU each, which ranks started
    together on a small host spend competing for its cores. This interpreter has imported it
    and run nothing with it yet (torch's intra-op threads not started, no device touched), so
    its forks start ready. Each rank writes to ``RUN_DIR/rank<R>.log`` and waits until it is
    the launcher's child: the launcher is the children's subreaper (``launch_local``), so this
    process's exit hands them to it, and only then do they tie their lives to it
    (``_die_with_parent``).
    """
    _die_with_parent()
    sys.stdout.flush()
    sys.stderr.flush()
    pids, me = [], os.getpid()
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _forked_rank(run_dir, rank, world, me)
        pids.append(pid)
    tmp = run_dir / f"{PIDS_FILE}.tmp"
    tmp.write_text(" ".join(map(str, pids)))
    tmp.rename(run_dir / PIDS_FILE)
    os._exit(0)


def _forked_rank(run_dir: Path, rank: int, world: int, starter: int) -> None:
    try:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        log = os.open(run_dir / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        deadline = time.monotonic() + _ADOPTION_S
        while os.getppid() == starter and time.monotonic() < deadline:
            time.sleep(0.001)
    except BaseException:  # noqa: BLE001 - a forked child must never return into its parent's code
        os._exit(1)
    _run(run_dir, rank)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0])
    if args[1:2] == ["--ranks"]:
        fork_ranks(run_dir, int(args[2]))
    _run(run_dir, int(os.environ["RANK"]))


def _run(run_dir: Path, rank: int) -> None:
    """Run ``rank`` of the job in ``run_dir`` and exit (0, or 1 with its error report)."""
    _die_with_parent()
    try:
        signal.signal(WRAP_UP_SIGNAL, raise_interrupt)  # its default action kills without a report
        job = pickle.loads((run_dir / "job.pkl").read_bytes())
        # run_rank makes it keep the runs done once they begin
        with wrap_up_on_signals(keeping=False) if job.options.wrap_up else contextlib.nullcontext():
            result = run_rank(job, rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0")),
                              progress=progress_file(run_dir) if rank == 0 else None)
            if rank == 0:
                tmp = run_dir / "result.pkl.tmp"
                tmp.write_bytes(pickle.dumps(result))
                tmp.rename(run_dir / "result.pkl")
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported, then exit fast
        traceback.print_exc()
        text = str(exc).strip()
        report = {
            "rank": rank,
            "kind": failure_kind(exc),
            "message": text if isinstance(exc, TreeattnError) else f"{type(exc).__name__}: {text}",
            "exit_code": getattr(exc, "exit_code", 1),
        }
        (run_dir / f"rank{rank}.error.json").write_text(json.dumps(report))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
