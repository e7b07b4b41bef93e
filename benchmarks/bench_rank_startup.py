"""What treeattn adds to the start of every rank process, beside torch's own import.

Every rank under torchrun or SLURM, and every local NCCL rank, begins with ``import
treeattn.exec.worker`` in a fresh interpreter; a local gloo run pays it once for all its ranks,
which it forks (benchmarks/bench_rank_fork.py). This starts, alternately (A, B, A, B, ...), so
both see the host's slow and fast spells, a fresh interpreter that imports torch and torch.distributed
alone, and one that imports the worker; it prints the median CPU seconds (user + system of the
child) and wall seconds of each, their difference (treeattn's share of a rank's start) and the
load average. Nothing is asserted.

    .venv/bin/python benchmarks/bench_rank_startup.py             # 10 starts of each
    .venv/bin/python benchmarks/bench_rank_startup.py --starts 30
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time

from treeattn.cli.script import ArgumentParser, count, run

IMPORTS = {"torch alone": "import torch, torch.distributed", "treeattn.exec.worker": "import treeattn.exec.worker"}


def _start(code: str) -> tuple[float, float]:
    """(child CPU seconds, wall seconds) of one fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=count, default=10, help="fresh interpreters of each kind (default 10)")
    args = parser.parse_args()
    for code in IMPORTS.values():  # warm the page cache and the bytecode caches once, untimed
        _start(code)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in IMPORTS}
    for _ in range(args.starts):
        for name, code in IMPORTS.items():
            got[name].append(_start(code))
    cpu = {name: statistics.median(c for c, _ in runs) for name, runs in got.items()}
    wall = {name: statistics.median(w for _, w in runs) for name, runs in got.items()}
    print(f"{args.starts} starts of each, alternated; medians (load average {os.getloadavg()[0]:.2f})")
    for name in IMPORTS:
        print(f"  {name:<22} {cpu[name]:6.3f} s CPU  {wall[name]:6.3f} s wall")
    base, worker = IMPORTS
    print(f"  treeattn's share: {cpu[worker] - cpu[base]:+.3f} s CPU, {wall[worker] - wall[base]:+.3f} s wall a rank")


if __name__ == "__main__":
    sys.exit(run(main))
