"""What forking a local run's gloo ranks from one interpreter saves, against one interpreter each.

``launch`` forks a local gloo run's ranks from one process that imported torch once
(``treeattn.exec.launch.forked_ranks``); where it cannot adopt them, each rank is an interpreter
of its own that imports torch itself. This runs one short job (a binomial tree, 2 repeats)
both ways, alternately (A, B, A, B, ...) so both see the host's slow and fast spells, at each
rank count given, and prints the median CPU seconds of the ranks and the forking process
(user + system, as this process reaps them), the median wall seconds of ``launch``, the ratios
forked / one each, and the load average. Nothing is asserted.

    .venv/bin/python benchmarks/bench_rank_fork.py                 # 2 and 4 ranks, 5 runs each way
    .venv/bin/python benchmarks/bench_rank_fork.py --ranks 8 --runs 3
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

from treeattn.cli.script import ArgumentParser, count, count_list, run
from treeattn.exec import launch as launching
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import Workload

WAYS = ("forked", "one each")


def _one(job: Job, forked: bool) -> tuple[float, float]:
    """(CPU seconds of the processes the run started, wall seconds) of one ``launch``."""
    real = launching._subreaper
    if not forked:  # as on a host where this process cannot adopt the ranks
        launching._subreaper = lambda on: None  # noqa: ARG005
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        launching.launch(job)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        launching._subreaper = real
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=count_list, default=[2, 4], help="rank counts, comma-separated (default 2,4)")
    parser.add_argument("--runs", type=count, default=5, help="runs each way at each rank count (default 5)")
    args = parser.parse_args()
    if any(r < 2 for r in args.ranks):
        parser.error("--ranks: each count must be at least 2")
    print(f"{args.runs} runs each way, alternated; medians (load average {os.getloadavg()[0]:.2f})")
    for ranks in args.ranks:
        w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=64, split=(256,) * ranks, kv_dtype="fp32")
        plan = build("binomial", w, TopologyRef("cpu:bench", "sha256:bench"))
        job = Job((PlanJob("p", plan),), RunOptions(repeats=2, warmup=1))
        _one(job, True)  # warm the page cache and the bytecode caches once, untimed
        got: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for _ in range(args.runs):
            for way in WAYS:
                got[way].append(_one(job, way == "forked"))
        cpu = {way: statistics.median(c for c, _ in runs) for way, runs in got.items()}
        wall = {way: statistics.median(w for _, w in runs) for way, runs in got.items()}
        for way in WAYS:
            print(f"  {ranks} ranks, {way:<9} {cpu[way]:6.2f} s CPU  {wall[way]:6.2f} s wall")
        print(f"  {ranks} ranks, forked / one each: CPU {cpu['forked'] / cpu['one each']:.2f}x, "
              f"wall {wall['forked'] / wall['one each']:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(run(main))
