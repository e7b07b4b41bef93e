"""What a run refuses before it starts anything: more NCCL ranks than GPUs, CUDA graphs without NCCL."""

from __future__ import annotations

import pytest

from treeattn.errors import InputError
from treeattn.exec.launch import launch_local
from treeattn.exec.runner import Job, PlanJob, RunOptions, placement_problem
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import Workload


def test_more_ranks_than_gpus_is_named():
    assert placement_problem(8, 4).startswith("8 ranks, 4 GPUs on this node: NCCL needs one GPU per rank")
    assert placement_problem(2, 1).startswith("2 ranks, 1 GPU on this node")
    assert placement_problem(4, 4) is None and placement_problem(1, 8) is None


def test_graphs_need_nccl():
    with pytest.raises(InputError, match="CUDA graphs need the NCCL backend") as info:
        RunOptions(backend="gloo", graph=True)
    assert info.value.exit_code == 2
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(3, 3), kv_dtype="fp32")
    job = Job((PlanJob("p", build("star", w, TopologyRef("a", "b"))),), RunOptions(graph=True))
    with pytest.raises(InputError, match="CUDA graphs need the NCCL backend"):
        launch_local(job)  # refused before a process starts (this machine has no CUDA: gloo)
