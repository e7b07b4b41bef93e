"""The fused merge kernels (treeattn.exec.kernels) compiled on the CPU against the eager ops.

Inductor compiles the same functions to C++ here and to Triton on CUDA; these tests check the
compiled arithmetic against the eager one on the inputs that break merges: empty rows (-inf),
empty shards (no rows), logits of +-1e4, fp32 and bf16 partials. tests/gpu repeats it on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from treeattn.exec import kernels
from treeattn.exec.merge import empty_partial, merge_many, merge_many_into, sum_many_into, wired

ULPS = 4
"""Largest difference accepted, in units of fp32 rounding of the larger magnitude (exp and log
may round differently once compiled; the arithmetic is the same)."""


def assert_ulp_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(torch.isneginf(a), torch.isneginf(b)) and not torch.isnan(a).any()
    finite = torch.isfinite(a)
    scale = torch.maximum(a[finite].abs(), b[finite].abs()).clamp(min=1.0)
    assert ((a[finite] - b[finite]).abs() <= ULPS * torch.finfo(torch.float32).eps * scale).all()


def partials(k: int, rows: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """k packed partials: lse of +-1e4 and moderate, empty rows (0, -inf) in some, none in others."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(k, rows, d + 1, generator=gen) * 3
    lse = torch.randn(k, rows, generator=gen) * 5
    if rows:
        lse[:, 0] = 1e4
        lse[:, rows // 2] = -1e4
        lse[torch.rand(k, rows, generator=gen) < 0.3] = float("-inf")
        lse[:, -1] = float("-inf")  # empty everywhere
    x[..., -1] = lse
    x[..., :-1][torch.isneginf(lse)] = 0.0
    return wired(x, dtype)


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setenv("TREEATTN_MERGE", "fused")
    assert kernels.fused_on(torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_merge_equals_eager(fused, dtype):
    for seed, (k, rows) in enumerate([(1, 9), (3, 17), (2, 1), (1, 1), (4, 64)]):
        acc = partials(1, rows, 16, torch.float32, 100 + seed)[0]
        stack = partials(k, rows, 16, dtype, seed)
        want = merge_many_into(acc.clone(), stack)
        got = kernels.merge_into(acc.clone(), stack)
        assert_ulp_close(got, want)
        assert_ulp_close(kernels.merged(stack), merge_many(stack))
    # An empty shard of rows merges nothing; a row slice of a larger accumulator merges in place.
    assert kernels.merge_into(empty_partial(0, 16), partials(2, 0, 16, dtype, 0)).shape == (0, 17)
    big = partials(1, 40, 16, torch.float32, 7)[0]
    want = big.clone()
    merge_many_into(want[10:25], partials(2, 15, 16, dtype, 8))
    kernels.merge_into(big[10:25], partials(2, 15, 16, dtype, 8))
    assert_ulp_close(big, want)


def test_compiled_weighted_rows_and_finish_equal_eager(fused, monkeypatch):
    part = partials(1, 33, 16, torch.float32, 3)[0]
    m = part[:, -1] + torch.rand(33)
    m[-1] = float("-inf")  # every rank empty on this row
    # Sums as the collectives produce them: den >= 1 (the largest lse weighs 1), and on a row
    # where every rank is empty den = 0 and num = 0 (every weight is 0).
    num, den = part[:, :-1] * 2.0, torch.rand(33) * 3 + 1.0
    den[3], num[3] = 0.0, 0.0
    got = [kernels.weighted(part, m, torch.bfloat16), kernels.weighted(part, m, torch.float32, with_weight=False)]
    out = part.clone()
    kernels.finish(out, m, num, den)
    monkeypatch.setenv("TREEATTN_MERGE", "eager")
    want = [kernels.weighted(part, m, torch.bfloat16), kernels.weighted(part, m, torch.float32, with_weight=False)]
    ref = part.clone()
    kernels.finish(ref, m, num, den)
    # bf16 rows: the same fp32 values rounded, so at most one bf16 step apart.
    assert ((got[0].float() - want[0].float()).abs() <= want[0].float().abs() * 2 ** -8).all()
    assert_ulp_close(got[1], want[1])
    assert_ulp_close(out, ref)
    assert torch.isneginf(out[3, -1]) and torch.equal(out[3, :-1], torch.zeros(16))


def test_one_compilation_serves_every_size(fused):
    from torch._dynamo.utils import counters

    kernels.warm(torch.device("cpu"), torch.float32)  # compiled (or cached): what a run compiles first
    before = counters["stats"]["unique_graphs"]
    for k, rows in [(1, 1), (2, 1), (1, 200), (7, 3), (3, 0)]:
        kernels.merge_into(empty_partial(rows, 16), partials(k, rows, 16, torch.float32, k))
    assert counters["stats"]["unique_graphs"] == before


def test_eager_on_the_cpu_by_default(monkeypatch):
    monkeypatch.delenv("TREEATTN_MERGE", raising=False)
    assert not kernels.fused_on(torch.device("cpu")) and kernels.fused_on(torch.device("cuda", 0))
    monkeypatch.setenv("TREEATTN_MERGE", "eager")
    assert not kernels.fused_on(torch.device("cuda", 0))
    monkeypatch.setenv("TREEATTN_MERGE", "fast")
    with pytest.raises(ValueError, match="TREEATTN_MERGE='fast'"):
        kernels.fused_on(torch.device("cpu"))


def test_the_compute_model_charges_the_fused_kernel():
    from treeattn.cost.compute import ComputeModel
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    topo = resolve("dgx-h100")
    for partial, wire_row in (("fp32", 129 * 4), ("bf16", 128 * 2 + 4)):  # the lse stays fp32 on the wire
        w = Workload(batch=64, q_heads=32, kv_heads=8, head_dim=128, split=(1024,) * 8, partial_dtype=partial)
        assert w.row_bytes == wire_row
        cm = ComputeModel.of(w, topo)
        rows, wire = 2048, 2048 * w.row_bytes
        for k in (1, 4):
            # the accumulator (fp32) read and written, the k partials read: one kernel
            want = cm.launch_us + cm._mem_us(0, 2 * rows * 129 * 4 + k * wire)
            assert abs(cm.merge_us(0, rows, k) - want) < 1e-9
        if partial == "fp32":  # one fp32 partial: what the step model's byte term charges
            assert abs(cm.merge_us(0, rows, 1) - cm.step_local_us(0, 3 * wire, 1)) < 1e-9
    assert cm.merge_us(0, 0, 3) == 0.0


@pytest.mark.parametrize("partial", ["fp32", "bf16"])
def test_a_step_merging_k_partials_is_charged_the_fused_kernel_on_a_gpu_and_the_eager_ops_on_a_host(partial):
    from treeattn.cost.compute import ComputeModel
    from treeattn.cost.program import compile_plan
    from treeattn.plan import build
    from treeattn.plan.ir import TopologyRef
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    w = Workload(batch=64, q_heads=32, kv_heads=8, head_dim=128, split=(1024,) * 8, partial_dtype=partial)
    plan = build("star", w, TopologyRef("t", "sha256:t"), root=0, result="root")  # 7 partials merged in one step
    for topo, fused in ((resolve("dgx-h100"), True), (resolve("cpu:ranks=8"), False)):
        cm = ComputeModel.of(w, topo)
        prog = compile_plan(plan, 8, cm)
        assert prog.merge_k[0] == [0, 1]  # the root's merge step: one kernel, nothing else
        charged = cm.step_local_us(0, prog.merge_b[0][1], 1)
        eager = cm.step_local_us(0, 3 * 7 * w.payload_bytes, 1)
        assert abs(charged - (cm.merge_us(0, w.rows, 7) if fused else eager)) < 1e-9
        assert (charged < eager) == fused


@pytest.mark.parametrize("partial", ["fp32", "bf16"])
def test_an_exchanged_chunk_on_a_gpu_is_charged_its_own_slot_not_the_accumulators_read(partial):
    # direct: each rank merges the stack of every rank's partial, its own as sent, into rows it
    # overwrites (kernels.merged_into): the k received, its own slot and the rows written.
    from treeattn.cost.compute import ComputeModel
    from treeattn.cost.program import compile_plan
    from treeattn.plan import build
    from treeattn.plan.ir import TopologyRef, exchanged_chunks
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    w = Workload(batch=64, q_heads=32, kv_heads=8, head_dim=128, split=(1024,) * 8, partial_dtype=partial)
    plan = build("direct", w, TopologyRef("t", "sha256:t"))
    step = [op for op in plan.programs[0] if op.step == 1]
    assert exchanged_chunks(step) == {0}
    for topo, fused in ((resolve("dgx-h100"), True), (resolve("cpu:ranks=8"), False)):
        prog = compile_plan(plan, 8, ComputeModel.of(w, topo))
        acc = w.rows * (w.head_dim + 1) * 4
        assert prog.merge_b[0][1] == (8 * w.payload_bytes + acc if fused else 3 * 7 * w.payload_bytes)


def test_warm_compiles_every_kernel_a_run_calls(fused):
    from torch._dynamo.utils import counters

    kernels.warm(torch.device("cpu"), torch.bfloat16)
    assert kernels._FAILED == {}
    before = counters["stats"]["unique_graphs"]
    part = partials(1, 3, 8, torch.float32, 0)[0]
    m = part[:, -1].clone()
    kernels.merge_into(part.clone(), partials(5, 3, 8, torch.bfloat16, 1))
    kernels.merged(partials(3, 3, 8, torch.bfloat16, 2))
    kernels.weighted(part, m, torch.bfloat16)
    kernels.finish(part.clone(), m, part[:, :-1], part[:, -1])
    kernels.finish(part.clone(), m, part[:, :-1].contiguous(), torch.ones(3))
    summed = partials(1, 3, 8, torch.float32, 3)[0].to(torch.bfloat16)  # rows (w o, w), not a partial
    kernels.finish(part.clone(), m, summed[:, :-1], summed[:, -1])
    # the three all-reduces' baseline: the sum of w o on the wire, the weights' in fp32
    kernels.finish(part.clone(), m, kernels.weighted(part, m, torch.bfloat16, with_weight=False), torch.ones(3))
    # a chunk of one row (a one-head segment at B = 1), a row slice of a larger accumulator
    one = partials(1, 4, 8, torch.float32, 4)[0]
    kernels.merge_into(one[2:3], partials(2, 1, 8, torch.bfloat16, 5))
    kernels.merge_into(one[1:2], partials(1, 1, 8, torch.float32, 6))
    kernels.merged(partials(2, 1, 8, torch.bfloat16, 7))
    kernels.weighted(one[3:4], m[:1], torch.bfloat16)
    kernels.finish(one[0:1], m[:1], part[:1, :-1], part[:1, -1])
    assert counters["stats"]["unique_graphs"] == before  # nothing left to compile mid-run


@pytest.mark.parametrize(("wire", "d"), [(torch.float8_e4m3fn, 8), (torch.bfloat16, 7)])
def test_warm_compiles_the_lse_layout_of_the_runs_head_dim(fused, wire, d):
    # A narrow wire's lse is a view of the rows where it is 4-byte aligned (fp8 at D = 8,
    # where the view's storage offset, 2, equals warm's row count) and a copy where it is
    # not (bf16 at D = 7); the compiled merge tells the two apart, and warm compiles the
    # run's own, so no row count or fan-in compiles anything mid-run.
    from torch._dynamo.utils import counters

    kernels.warm(torch.device("cpu"), wire, d)
    assert kernels._FAILED == {}
    before = counters["stats"]["unique_graphs"]
    for k, rows in [(1, 1), (2, 3), (5, 40)]:
        acc = partials(1, rows, d, torch.float32, 10 + k)[0]
        stack = partials(k, rows, d, wire, k)
        assert_ulp_close(kernels.merge_into(acc.clone(), stack), merge_many_into(acc.clone(), stack))
        assert_ulp_close(kernels.merged(stack), merge_many(stack))
    assert counters["stats"]["unique_graphs"] == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_a_raw_payloads_sum_is_one_compilation_equal_to_eager(fused, dtype):
    # Small integers sum exactly in every dtype, so the fused and the one-part-at-a-time sums agree
    # bit for bit; warm compiles what a raw run calls, for every length, fan-in and row slice.
    from torch._dynamo.utils import counters

    kernels.warm_sum(torch.device("cpu"), dtype)
    assert kernels._FAILED == {}
    before = counters["stats"]["unique_graphs"]
    gen = torch.Generator().manual_seed(0)
    for k, n in [(1, 1), (2, 5), (7, 300), (3, 0)]:
        stack = torch.randint(-3, 4, (k, n), generator=gen).to(dtype)
        buf = torch.randint(-3, 4, (n + 4,), generator=gen).to(dtype)
        want = buf.clone()
        sum_many_into(want[2:n + 2], stack)
        got = buf.clone()
        kernels.add_stack_into(got[2:n + 2], stack)
        assert torch.equal(got.float(), want.float())
        want[2:n + 2] = stack.float().sum(dim=0).to(dtype)
        kernels.sum_stack_into(got[2:n + 2], stack)
        assert torch.equal(got.float(), want.float())
    assert counters["stats"]["unique_graphs"] == before
