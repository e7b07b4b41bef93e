"""A Merger on NCCL: called inside the caller's CUDA graph capture (after a warm-up call), its
replays give what eager calls give; its calls do not wait for the GPU until more than
CALLS_AHEAD earlier ones are unfinished; and a GPU that does not finish a call within the
timeout makes a later call raise by then."""

from __future__ import annotations

import datetime
import gc
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.gpu.conftest import need_gpus
from treeattn.errors import ExecutionError
from treeattn.exec.comm import CALLS_AHEAD
from treeattn.exec.launch import free_port
from treeattn.exec.merger import Merger
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import Workload

REF = TopologyRef("cuda:test", "sha256:test")
B, HQ, D = 2, 8, 64


def workload(p: int) -> Workload:
    return Workload(batch=B, q_heads=HQ, kv_heads=2, head_dim=D, split=(50,) * p, kv_dtype="bf16",
                    partial_dtype="bf16")


def same(a: tuple, b: tuple) -> bool:
    return all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b, strict=True))


def captured_equals_eager(plan, seed: int) -> None:  # noqa: ANN001
    """Every rank: a Merger called inside a capture of the caller's, replayed, against eager calls."""
    eager, merger = Merger(plan, graph=False), Merger(plan)
    o = torch.empty(B, HQ, D, device="cuda")
    lse = torch.empty(B, HQ, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def fill() -> None:  # new inputs in the buffers the caller's graph reads
        o.copy_(torch.randn(B, HQ, D, device="cuda", generator=gen))
        lse.copy_(torch.randn(B, HQ, device="cuda", generator=gen) * 4)

    for _ in range(2):  # warm-up: the first call allocates, the second captures the Merger's own graph
        fill()
        assert same(merger(o, lse), eager(o, lse))
    assert merger.graph
    held = len(merger._comm.calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        got = merger(o, lse)
    assert len(merger._comm.calls) == held and not merger._comm._pending  # no markers from the capture
    for _ in range(3):
        fill()
        graph.replay()
        assert same(got, eager(o, lse))
    fill()  # and calls outside the capture still replay the Merger's own graph
    assert same(merger(o, lse), eager(o, lse))
    torch.cuda.synchronize()


def test_merger_inside_the_callers_graph_capture_equals_eager(nccl_world_of_one):
    captured_equals_eager(build("allreduce2", workload(1), REF), seed=0)  # NCCL collectives in the caller's graph


def test_first_call_inside_a_capture_is_refused(nccl_world_of_one):
    merger = Merger(build("allreduce2", workload(1), REF))
    o, lse = torch.zeros(B, HQ, D, device="cuda"), torch.zeros(B, HQ, device="cuda")
    with pytest.raises(RuntimeError, match="first called inside a CUDA graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"):
            merger(o, lse)
    merger(o, lse)  # outside a capture it works
    torch.cuda.synchronize()


def _two_ranks(rank: int, port: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", rank))
    for name, kw in (("binomial", {"chunks": 2}), ("allreduce2", {})):
        captured_equals_eager(build(name, workload(2), REF, **kw), seed=rank)
    # Only on success: a failure's traceback holds graphs that captured NCCL ops, for which
    # NCCL's teardown would wait (pytorch#115388): the test would hang instead of failing.
    gc.collect()
    dist.destroy_process_group()


def test_two_ranks_inside_the_callers_graph_capture_equal_eager():
    need_gpus(2)
    mp.spawn(_two_ranks, args=(free_port(),), nprocs=2)  # point-to-point batches inside the caller's graph


def cycles_per_s() -> float:
    """The rate of ``torch.cuda._sleep``'s cycles on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**8)
    end.record()
    end.synchronize()
    return 10**8 / (start.elapsed_time(end) / 1e3)


def busy_merger(graph: bool, timeout_s: float) -> tuple[Merger, torch.Tensor, torch.Tensor, float]:
    merger = Merger(build("allreduce2", workload(1), REF), graph=graph, timeout_s=timeout_s)
    o, lse = torch.randn(B, HQ, D, device="cuda"), torch.randn(B, HQ, device="cuda")
    for _ in range(2):  # allocate; capture (graph)
        merger(o, lse)
    torch.cuda.synchronize()
    return merger, o, lse, cycles_per_s()


@pytest.mark.parametrize("graph", [True, False])
def test_calls_run_ahead_of_a_busy_gpu_up_to_calls_ahead(nccl_world_of_one, graph):
    merger, o, lse, rate = busy_merger(graph, timeout_s=30.0)
    want = merger(o, lse)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(rate))  # the GPU is busy for a second before the next calls
    t = time.perf_counter()
    outs = [merger(o, lse) for _ in range(CALLS_AHEAD + 1)]
    ahead = time.perf_counter() - t
    assert ahead < 0.3 and len(merger._comm.calls) == CALLS_AHEAD + 1  # none of them waited
    outs.append(merger(o, lse))  # more than CALLS_AHEAD unfinished: this one waits for the oldest
    assert time.perf_counter() - t > 0.7 and len(merger._comm.calls) == CALLS_AHEAD + 1
    torch.cuda.synchronize()
    assert all(same(out, want) for out in outs)


@pytest.mark.parametrize("graph", [True, False])
def test_a_call_the_gpu_does_not_finish_in_time_raises_within_the_timeout(nccl_world_of_one, graph):
    merger, o, lse, rate = busy_merger(graph, timeout_s=0.5)
    torch.cuda._sleep(int(3 * rate))  # the GPU stalls for 3 s, past the timeout
    t = time.perf_counter()
    calls = 0
    with pytest.raises(ExecutionError) as info:
        while calls < 20:
            merger(o, lse)
            calls += 1
    took = time.perf_counter() - t
    torch.cuda.synchronize()  # let the stall end before the group is torn down
    assert calls == CALLS_AHEAD + 1 and 0.5 < took < 1.5, (calls, took)
    text = str(info.value)
    if graph:
        assert text.startswith("rank 0: the Merger's program of plan 'allreduce2' (a CUDA graph replay; which of "
                               f"its ops is not known: {CALLS_AHEAD} later call(s) replayed it again) failed: "
                               "Timed out after 0.5 s (NCCL)"), text
    else:
        # Found by the next call's check of the earlier calls (merger.py _merge_once), which says so.
        assert text.startswith("rank 0: collective ") and ("failed: Timed out after 0.5 s (NCCL) (an earlier call (the "
                                                           "device runs up to 3 behind): ") in text, text
