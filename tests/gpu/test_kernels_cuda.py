"""One GPU: the fused merge and raw-sum kernels against eager on CUDA, how many kernels each launches,
the attention kernel the device's capability picks, and inputs drawn on the device."""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_exec_kernels import assert_ulp_close, partials
from treeattn.exec import kernels
from treeattn.exec.attention import make_kv_shard, make_query, partial_attention, resolve_kernel
from treeattn.exec.merge import merge_many, merge_many_into, sum_many_into
from treeattn.exec.reference import exact_attention
from treeattn.exec.runner import relative_error, tolerance
from treeattn.plan.ir import row_quantum
from treeattn.workload import RawPayload, Workload

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_merge_equals_eager_on_cuda(dtype, monkeypatch):
    monkeypatch.setenv("TREEATTN_MERGE", "fused")
    for seed, (k, rows) in enumerate([(1, 9), (3, 17), (2, 1), (4, 2048), (2, 0)]):
        acc = partials(1, rows, 128, torch.float32, 100 + seed)[0].to(CUDA)
        stack = partials(k, rows, 128, dtype, seed).to(CUDA)
        want = merge_many_into(acc.clone(), stack)
        got = kernels.merge_into(acc.clone(), stack)
        assert_ulp_close(got.cpu(), want.cpu())
        if rows:
            assert_ulp_close(kernels.merged(stack).cpu(), merge_many(stack).cpu())


def test_a_fused_merge_is_at_most_two_kernels(monkeypatch):
    monkeypatch.setenv("TREEATTN_MERGE", "fused")
    acc = partials(1, 512, 128, torch.float32, 1)[0].to(CUDA)
    stack = partials(4, 512, 128, torch.bfloat16, 2).to(CUDA)
    kernels.merge_into(acc, stack)  # compiled
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        kernels.merge_into(acc, stack)
        torch.cuda.synchronize()
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    eager_count = 13
    assert 1 <= len(launched) <= 2 < eager_count, [e.name for e in launched]


def _launches(call) -> list[str]:  # noqa: ANN001 - a call of one fused kernel
    call()  # compiled (or cached)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def test_a_fused_kernel_on_a_chunk_the_plan_cuts_launches_no_more_than_at_offset_0(monkeypatch):
    # The executor merges into row slices of its accumulator. Inductor compiles a kernel that
    # assumes 16-byte aligned inputs where its first inputs were (warm's, at offset 0), and copies
    # one that is not in and out around each call: two kernels the simulator does not charge. The
    # plan cuts its chunks where rows start on 16 bytes (``plan.ir.row_quantum``: every 4th row of
    # a D = 128 fp32 accumulator, every 4th fp32 element), and such a slice takes the kernel as is.
    monkeypatch.setenv("TREEATTN_MERGE", "fused")
    kernels.warm(CUDA, torch.bfloat16, 128)
    kernels.warm_sum(CUDA, torch.float32)
    w = Workload(batch=1, q_heads=32, kv_heads=8, head_dim=128, split=(64,))
    q = row_quantum(w)
    acc = partials(1, 512 + q, 128, torch.float32, 1)[0].to(CUDA)
    stack = partials(3, 512, 128, torch.bfloat16, 2).to(CUDA)
    at_zero = _launches(lambda: kernels.merge_into(acc[:512], stack))
    cut = _launches(lambda: kernels.merge_into(acc[q:512 + q], stack))  # starts 2064 bytes in
    assert len(cut) == len(at_zero), (at_zero, cut)
    q = row_quantum(RawPayload(nbytes=1 << 22, ranks=1))
    buf = torch.zeros(1 << 20, device=CUDA)
    parts = torch.ones((3, (1 << 20) - q), device=CUDA)
    assert len(_launches(lambda: kernels.add_stack_into(buf[q:], parts))) == len(
        _launches(lambda: kernels.add_stack_into(buf[:-q], parts)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_a_raw_sum_is_one_fused_kernel_equal_to_eager(dtype, monkeypatch):
    monkeypatch.setenv("TREEATTN_MERGE", "fused")
    stack = torch.randint(-3, 4, (5, 1 << 20), device=CUDA).to(dtype)  # small integers: exact sums
    acc = torch.randint(-3, 4, (1 << 20,), device=CUDA).to(dtype)
    want = sum_many_into(acc.clone(), stack)
    got = kernels.add_stack_into(acc.clone(), stack)  # compiled
    assert torch.equal(got.float(), want.float())
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        kernels.add_stack_into(got, stack)
        torch.cuda.synchronize()
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert 1 <= len(launched) <= 2, [e.name for e in launched]


def test_attention_kernel_by_capability_and_correct():
    w = Workload(batch=2, q_heads=32, kv_heads=8, head_dim=128, split=(3000,), kv_dtype="bf16")
    kernel = resolve_kernel("auto", CUDA, "bf16", 128)
    major, _ = torch.cuda.get_device_capability(CUDA)
    assert kernel in (("flash-attn", "sdpa-flash") if major >= 8 else ("explicit",))
    q, kv = make_query(w, 0, CUDA), make_kv_shard(w, 0, 0, CUDA)
    # The memory-efficient op (what a pre-sm80 GPU runs) on fp16 copies: bf16 values are exact in fp16.
    for name, dtype in ((kernel, torch.bfloat16), ("sdpa-efficient", torch.float16), ("explicit", torch.bfloat16)):
        assert resolve_kernel(name, CUDA, "fp16" if dtype == torch.float16 else "bf16", 128) == name
        got = partial_attention(q.to(dtype), kv.to(dtype), name)
        assert relative_error(got, exact_attention(q, [kv]), raw=False) < tolerance(w), name


def test_inputs_are_drawn_on_the_device_and_reproducible():
    w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=64, split=(1000, 24), kv_dtype="bf16")
    a = make_kv_shard(w, 1, 5, CUDA)
    assert a.device.type == "cuda" and torch.equal(a, make_kv_shard(w, 1, 5, CUDA))
    assert not torch.equal(make_kv_shard(w, 0, 5, CUDA)[:, :, :, :24], a)
    assert torch.equal(make_query(w, 5, CUDA), make_query(w, 5, CUDA))
