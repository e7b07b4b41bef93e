"""One rank of a two-rank run of a raw payload's plan under the RANK/WORLD_SIZE launcher
(``python -m tests.distributed.footprint_worker RANK PORT NBYTES [--baselines] [--heads]``): prints the
rank's peak resident set (VmHWM, bytes) once the run is done, and what ``exec.footprint``
counted for it."""

from __future__ import annotations

import os
import sys

from tests.rss import peak_bytes
from treeattn.exec.footprint import job_bytes
from treeattn.exec.launch import launch
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import RawPayload


def main() -> None:
    rank, port, nbytes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    os.environ.update(env)
    result = "heads" if "--heads" in sys.argv else "all"
    plan = build("ring", RawPayload(nbytes=nbytes, ranks=2), TopologyRef("a", "b"), result=result)
    job = Job((PlanJob("ring", plan),), RunOptions(repeats=2, warmup=1, setup_timeout_s=60,
                                                   baselines="--baselines" in sys.argv))
    launch(job, env)
    print(peak_bytes(), job_bytes(job, [rank]), flush=True)


if __name__ == "__main__":
    main()
