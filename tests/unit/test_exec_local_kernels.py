"""The kernels the simulator charges a rank's steps (``cost.program``: merges, copies, the
conversions before a post, the end-of-run rounding; a collective's local merge and
``collective_kernels``) are those the executor launches on a GPU, where the merge arithmetic
is one compiled kernel a call (``exec.kernels``): counted here as the torch ops the executor
dispatches, a compiled call as one, views and empty allocations as none. Nothing is sent
(the buffers' contents do not matter), and a library call launches nothing of ours."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.test_cost_helpers import switch_topo
from tests.unit.test_plan_helpers import REF, extra_params
from treeattn.cost.compute import ComputeModel
from treeattn.cost.program import compile_plan
from treeattn.exec import kernels
from treeattn.exec.attention import torch_dtype
from treeattn.exec.interpreter import PlanExecutor, RankInputs
from treeattn.exec.merge import empty_partial
from treeattn.plan import OpKind, build
from treeattn.plan.ir import COLLECTIVE_FORMS, collective_kernels
from treeattn.workload import RawPayload, Workload

# Ops that launch nothing: views, and allocations (the pool's buffers).
_FREE = {"view", "_unsafe_view", "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "as_strided",
         "expand", "t", "transpose", "permute", "empty", "empty_strided", "unbind", "split", "lift_fresh"}


class _Launches(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not self.paused and func.overloadpacket.__name__ not in _FREE:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Unsent:
    """A communicator that posts nothing (every message counts as empty) and whose
    collectives leave their outputs as they are, but for what ``exec.comm.Comm`` launches
    itself: an fp8 reduction's conversion to fp32 and back."""

    cuda = False
    backend = "gloo"

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.device = rank, world, torch.device("cpu")

    def post(self, posts: list) -> list:
        return [None] * len(posts)

    def all_reduce(self, tensor, op, what, widen=False):  # noqa: ANN001, ANN201
        return _widened(tensor, tensor, widen)

    def all_gather(self, tensor, what, out):  # noqa: ANN001, ANN201
        tensor.contiguous()
        return out

    def reduce(self, tensor, root, op, what, widen=False):  # noqa: ANN001, ANN201
        return _widened(tensor, tensor, widen)

    def reduce_scatter(self, out, tensor, op, what, widen=False):  # noqa: ANN001, ANN201
        return _widened(out, tensor[:out.shape[0]], widen)

    def all_to_all(self, out, tensor, splits, what):  # noqa: ANN001, ANN201
        tensor.contiguous()
        return out


def _widened(out, tensor, widen):  # noqa: ANN001, ANN202
    if tensor.dtype.itemsize == 1:  # fp8: reduced through an fp32 copy, converted back into ``out`` unless widened
        wide = tensor.float()
        return wide if widen else out.copy_(wide)
    return out


def _launches(plan, rank: int, monkeypatch) -> int:
    mode = _Launches()

    def one_kernel(name):  # noqa: ANN001, ANN202
        def call(*args, **kw):  # noqa: ANN002, ANN003, ANN202
            mode.paused += 1
            try:
                out = kernels._FUNCTIONS[name](*args, **kw)
            finally:
                mode.paused -= 1
            mode.count += 1
            return out
        return call

    monkeypatch.setattr(kernels, "fused_on", lambda device: True)
    monkeypatch.setattr(kernels, "compiled", one_kernel)
    monkeypatch.setattr(kernels, "_unbacked", lambda *dims: None)
    w = plan.workload
    if plan.is_raw:  # the buffer is restored outside the run (``prepare``)
        inputs = RankInputs(raw=torch.ones(w.rows, dtype=torch_dtype(w.dtype)))
    else:
        inputs = RankInputs(partial=empty_partial(w.rows, w.head_dim).normal_())
    ex = PlanExecutor(plan, _Unsent(rank, plan.ranks), inputs, timed=False)
    assert plan.is_raw or ex.in_place  # the given partial is the accumulator: landing it launches nothing
    ex.prepare()
    with mode:
        ex.run()
    return mode.count


def _charged(plan, rank: int) -> int:
    topo = switch_topo(plan.ranks, launch=7.0, mem_bw=100.0)
    prog = compile_plan(plan, plan.ranks, ComputeModel.of(plan.workload, topo))
    total = sum(k for b, k in zip(prog.merge_b[rank], prog.merge_k[rank], strict=True) if b)
    for op in plan.programs[rank]:
        if op.kind is OpKind.COLLECTIVE and op.part != "q":  # the local merge (``gather_merge_us``) is one launch;
            # the query's gather is skipped where the partial is given, as here (a Merger's)
            total += collective_kernels(plan, op, rank) + COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].local_merge
    return total


# bf16 at an odd D: the lse on the wire is not aligned, so a merge copies it out first; fp8's
# library sums go through fp32 (and finish from it)
@pytest.mark.parametrize(("dtype", "head_dim"), [("fp32", 16), ("bf16", 16), ("bf16", 15), ("fp8", 16)])
@pytest.mark.parametrize(("name", "result", "chunks"), [
    ("tree", "all", 1), ("tree", "heads", 4), ("binomial", "all", 3), ("butterfly", "all", 1),
    ("ring", "all", 4), ("ring", "heads", 4), ("direct", "all", 1), ("direct", "heads", 4),
    ("hierarchical", "all", 1), ("multirail", "all", 1), ("multirail", "all", 2), ("star", "root", 1),
    ("allreduce2", "all", 1), ("allreduce2", "root", 1), ("allreduce2", "heads", 4), ("allreduce3", "all", 1),
    ("allgather-merge", "all", 1), ("dcp-a2a", "heads", 4),
    ("dcp-ag-rs", "heads", 4),
])
# 6 heads over 4 ranks: heads segments of 2, 2, 1, 1 heads (at B = 4, so that 4 chunks fit in one)
@pytest.mark.parametrize(("q_heads", "batch"), [(8, 2), (6, 4)])
def test_the_simulator_charges_the_kernels_the_executor_launches(name, result, chunks, dtype, head_dim, q_heads,
                                                                 batch, monkeypatch):
    p = 4
    w = Workload(batch=batch, q_heads=q_heads, kv_heads=2, head_dim=head_dim, split=(64,) * p, partial_dtype=dtype)
    plan = build(name, w, REF, chunks=chunks, result=result, **extra_params(name, p))
    for r in range(p):
        assert _launches(plan, r, monkeypatch) == _charged(plan, r), (name, result, chunks, dtype, head_dim, q_heads, r)


@pytest.mark.parametrize("nbytes", [256, 232])  # 232 bytes: 58 elements, segments of 15, 15, 14, 14
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8"])
@pytest.mark.parametrize(("name", "result", "chunks"), [
    ("tree", "all", 1), ("tree", "heads", 4), ("star", "root", 1), ("binomial", "all", 3), ("butterfly", "all", 1),
    ("ring", "all", 4), ("direct", "all", 1), ("direct", "heads", 4), ("hierarchical", "all", 1),
    ("allreduce", "all", 1), ("allreduce", "root", 1), ("allreduce", "heads", 4), ("allgather-merge", "all", 1),
])
def test_raw_payload_plans_are_charged_the_kernels_they_launch(name, result, chunks, dtype, nbytes, monkeypatch):
    # a raw sum of k received parts is one kernel, as a merge is (``kernels.add_stack_into``)
    p = 4
    plan = build(name, RawPayload(nbytes=nbytes, ranks=p, dtype=dtype), REF, chunks=chunks, result=result,
                 **extra_params(name, p))
    for r in range(p):
        assert _launches(plan, r, monkeypatch) == _charged(plan, r), (name, result, chunks, dtype, nbytes, r)


def test_a_padded_reduce_scatters_copies_are_charged_one_pass_over_its_rows(monkeypatch):
    # 6 heads over 4 ranks: two runs of equal segments (2, 2 | 1, 1), two copies that together
    # move the rows once (``Plan.padded_runs``); the other kernels of the form move them once each.
    from treeattn.cost.simulate import simulate
    from treeattn.plan.ir import message_bytes, padding_kernels
    from treeattn.topology.library import resolve

    p = 4
    topo = resolve("dgx-h100[ranks 0-3]")
    w = Workload(batch=4, q_heads=6, kv_heads=2, head_dim=16, split=(64,) * p)
    plan = build("allreduce2", w, REF, chunks=4, result="heads")
    (op,) = [op for op in plan.programs[0] if op.kind is OpKind.COLLECTIVE and op.coll == "reducescatter"]
    pad, kernels = padding_kernels(plan, op), collective_kernels(plan, op, 0)
    assert pad == len(plan.padded_runs) == 2 and kernels > pad
    calls = []
    real = ComputeModel.step_local_us
    monkeypatch.setattr(ComputeModel, "step_local_us",
                        lambda self, r, b, k=1: calls.append((r, b, k)) or real(self, r, b, k))
    simulate(plan, topo, timeline=False)
    nbytes = message_bytes(plan, op)
    assert (0, 2 * (kernels - pad + 1) * nbytes, kernels) in calls
    assert not any(c[1] == 2 * kernels * nbytes and c[2] == kernels for c in calls)  # not a pass per copy
