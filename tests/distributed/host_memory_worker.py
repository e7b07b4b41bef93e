"""One rank of a two-rank run under the RANK/WORLD_SIZE launcher, each rank its own host, whose
host has 1 byte available on rank 1 only (``python -m tests.distributed.host_memory_worker RANK
PORT``): prints how long it took and the error it raised, or "ran"."""

from __future__ import annotations

import os
import sys
import time

import treeattn.exec.launch as launch_module
from treeattn.errors import InputError
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import RawPayload


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    os.environ.update(env)
    plan = build("star", RawPayload(nbytes=1 << 20, ranks=2), TopologyRef("a", "b"))
    job = Job((PlanJob("star-1MiB", plan),), RunOptions(repeats=1, warmup=0, setup_timeout_s=60))
    if rank == 1:
        launch_module.available_bytes = lambda: 1
    start = time.monotonic()
    try:
        launch_module.launch(job, env)
    except InputError as exc:
        print(f"{time.monotonic() - start:.1f} {exc}", flush=True)
        return
    print("ran", flush=True)


if __name__ == "__main__":
    main()
