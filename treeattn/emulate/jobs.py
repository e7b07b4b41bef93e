"""Run an executor ``Job`` (treeattn.exec) with each rank inside its namespace.

The ranks run the executor's own worker entry point (``python -m treeattn.exec.worker
RUN_DIR``) with ``ip netns exec NS`` in front, MASTER_ADDR = rank 0's address and
GLOO_SOCKET_IFNAME = the rank's interface; failures are reported by the executor's
``rank_failure``, so both launchers name the failing rank the same way.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from treeattn.emulate.cluster import Cluster
from treeattn.emulate.spawn import RankResult, run_in_namespaces
from treeattn.errors import InputError, TreeattnError
from treeattn.interrupts import shielded

if TYPE_CHECKING:
    from treeattn.exec.runner import Job, JobResult, Progress

__all__ = ["launch_in_cluster"]


def launch_in_cluster(cluster: Cluster, job: Job, *, timeout_s: float = 1800.0,
                      progress: Progress | None = None) -> JobResult:
    """Run ``job`` on the cluster's ranks and return rank 0's result.

    Args:
        cluster: a running emulated cluster with as many ranks as the job's plans.
        job: plans and options, as for ``treeattn.exec.launch.launch``.
        timeout_s: limit for the whole job (each rank also keeps the job's own deadlines).
        progress: ``progress(runs done, runs known, what)`` as rank 0 gets on (as ``launch``).

    Returns:
        The ``JobResult`` rank 0 wrote.

    Raises:
        InputError: rank counts differ, or a rank reported bad input.
        ExecutionError: a rank failed, died or timed out (the message names the first, and
            the folder that keeps every rank's output).
    """
    from treeattn.exec.launch import (
        GRACE_S,
        available_bytes,
        host_memory_problem,
        keep_output,
        relay_progress,
        run_directory,
    )

    n = job.ranks
    if n != cluster.num_ranks:
        raise InputError(f"the plan has {n} ranks but the emulated topology {cluster.topology.name!r} places "
                         f"{cluster.num_ranks}; pick a plan made for it or --ranks")
    # the namespaces' ranks all run on this host, as a local run's do
    problem = host_memory_problem(job, available_bytes())
    if problem:
        raise InputError(problem)
    tmp = run_directory("treeattn-emu-run-", job)
    kept = False
    try:
        threads = str(max(1, (os.cpu_count() or 1) // n))

        def env(r: int) -> dict[str, str]:
            return {"TREEATTN_PARENT_PID": str(os.getpid()),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}

        results = run_in_namespaces(cluster, lambda r: [sys.executable, "-m", "treeattn.exec.worker", str(tmp)],
                                    env, timeout_s=timeout_s, fail_fast_s=GRACE_S,
                                    tick=None if progress is None else relay_progress(tmp, progress))
        if any(res.returncode for res in results):
            failure = _failure(tmp, results)
            kept = failure.exit_code != 2  # bad input is said in full by the message
            if not kept:
                raise failure
            try:
                for res in results:
                    (tmp / f"rank{res.rank}.log").write_text(res.stdout + res.stderr)
            except OSError:  # a full disk: the failure is said without logs, and their folder goes
                kept = False
                raise failure from None
            raise keep_output(tmp, failure)
        with open(tmp / "result.pkl", "rb") as f:
            return pickle.load(f)
    finally:
        if not kept:
            with shielded():  # a second signal must not leave the run directory behind
                shutil.rmtree(tmp, ignore_errors=True)


def _failure(tmp: Path, results: tuple[RankResult, ...]) -> TreeattnError:
    from treeattn.exec.launch import rank_failure

    by_rank = {res.rank: res for res in results}

    def tail(r: int) -> str:
        res = by_rank[r]
        lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
        return f"; last output: {lines[-1][:300]}" if lines else ""

    codes = [by_rank[r].returncode for r in sorted(by_rank)]
    # Only the ranks the spawner stopped: one killed from outside (OOM killer, kill -9) is the cause.
    stopped = {res.rank for res in results if res.stopped}
    return rank_failure(tmp, codes, stopped, tail)
