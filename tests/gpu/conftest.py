"""tests/gpu: CUDA and NCCL checks, skipped with the reason where CUDA is absent (scripts/gpu-check.sh
runs them on a GPU machine). Every test here is marked ``gpu``."""

from __future__ import annotations

import datetime
import gc

import pytest
import torch
import torch.distributed as dist

from treeattn.exec.launch import free_port


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest's signature
    here = __file__.rsplit("/", 1)[0]
    no_cuda = pytest.mark.skip(reason=f"needs CUDA: torch {torch.__version__} sees no CUDA device")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not gpus():
                item.add_marker(no_cuda)


def need_gpus(n: int) -> None:
    """Skip the calling test unless this node has ``n`` GPUs."""
    if gpus() < n:
        pytest.skip(f"needs {n} GPUs, this node has {gpus()}")


@pytest.fixture
def nccl_world_of_one():
    """An NCCL process group of this process alone, on GPU 0."""
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
    torch.cuda.set_device(0)
    yield
    # A test's frames (pytest.raises keeps one through its traceback) may still hold a Merger
    # whose CUDA graph captured NCCL ops, and NCCL's teardown waits for every such graph to be
    # destroyed (pytorch#115388): collect them first, or destroy_process_group hangs.
    gc.collect()
    torch.cuda.synchronize()
    dist.destroy_process_group()
