"""Inputs, local partials, kernel choice and the references of treeattn.exec (single process, no
torch.distributed)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.rss import can_reset_peak, peak_growth_bytes
from treeattn.errors import InputError
from treeattn.exec.attention import (
    EXPLICIT_BLOCK_BYTES,
    _explicit,
    choose_kernel,
    make_kv_shard,
    make_query,
    make_raw,
    partial_attention,
    resolve_kernel,
)
from treeattn.exec.merge import empty_partial, merge_into, unpack_heads
from treeattn.exec.reference import Reference, combine_stats, exact_attention, row_stats, sample_rows
from treeattn.exec.runner import check_against, relative_error, tolerance
from treeattn.plan.ir import TopologyRef
from treeattn.workload import RawPayload, Workload


def wl(split, kv_dtype="fp32", batch=2, hq=8, hkv=2, d=16, partial="fp32"):
    return Workload(batch=batch, q_heads=hq, kv_heads=hkv, head_dim=d, split=tuple(split), kv_dtype=kv_dtype,
                    partial_dtype=partial)


def test_inputs_are_reproducible_per_rank():
    a, b = wl((300, 0, 5, 700)), wl((300, 1004, 0, 0))
    assert torch.equal(make_query(a, 3), make_query(b, 3))  # every rank holds the same q
    assert not torch.equal(make_query(a, 3), make_query(a, 4))
    # A shard depends on (seed, rank, its own shape) only: rank 0 holds 300 tokens in both.
    assert torch.equal(make_kv_shard(a, 0, 3), make_kv_shard(b, 0, 3))
    assert torch.equal(make_kv_shard(a, 3, 3), make_kv_shard(a, 3, 3))
    assert not torch.equal(make_kv_shard(a, 0, 3), make_kv_shard(a, 0, 4))
    assert not torch.equal(make_kv_shard(a, 2, 3), make_kv_shard(a, 3, 3)[:, :, :, :5])
    assert make_kv_shard(a, 1, 3).shape == (2, 2, 2, 0, 16)
    for dtype, torch_dt in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        assert make_kv_shard(wl((9,), kv_dtype=dtype), 0, 1).dtype == torch_dt


def shards(w, seed):
    return [make_kv_shard(w, r, seed) for r in range(w.ranks)]


def test_empty_shard_gives_the_identity():
    w = wl((4, 0))
    part = partial_attention(make_query(w, 0), make_kv_shard(w, 1, 0))
    assert torch.equal(part, empty_partial(w.rows, w.head_dim))


def explicit_gqa(q, kv):
    """Attention with K/V repeated to every query head (the usual GQA definition), fp64."""
    g = q.shape[1] // kv.shape[2]
    k = kv[0].double().repeat_interleave(g, dim=1)
    v = kv[1].double().repeat_interleave(g, dim=1)
    s = torch.einsum("bhd,bhnd->bhn", q.double(), k) / math.sqrt(q.shape[-1])
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), v), torch.logsumexp(s, -1)


@pytest.mark.parametrize("kernel", ["explicit", "sdpa"])
@pytest.mark.parametrize("hkv", [1, 2, 8])
def test_partial_is_gqa_attention(kernel, hkv):
    w = wl((37,), hkv=hkv)
    q, kv = make_query(w, 1), make_kv_shard(w, 0, 1)
    o, lse = unpack_heads(partial_attention(q, kv, kernel), w.batch)  # rows are head-major
    o_ref, lse_ref = explicit_gqa(q, kv)
    assert torch.allclose(o.double(), o_ref, atol=1e-5)
    assert torch.allclose(lse.double(), lse_ref, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8"])
def test_merged_shards_equal_the_reference(dtype):
    w = wl((300, 0, 5, 700, 1), kv_dtype=dtype)
    q = make_query(w, 9)
    acc = empty_partial(w.rows, w.head_dim)
    for r in range(w.ranks):
        merge_into(acc, partial_attention(q, make_kv_shard(w, r, 9), "explicit"))
    ref = exact_attention(q, shards(w, 9))
    # The explicit kernel accumulates in fp32 from the same (rounded) inputs: fp32-level error.
    assert relative_error(acc, ref, raw=False) < 1e-5


def test_sdpa_bf16_within_the_bf16_tolerance():
    w = wl((200, 300), kv_dtype="bf16")
    q = make_query(w, 2)
    acc = empty_partial(w.rows, w.head_dim)
    for r in range(2):
        merge_into(acc, partial_attention(q, make_kv_shard(w, r, 2), "sdpa"))
    err = relative_error(acc, exact_attention(q, shards(w, 2)), raw=False)
    assert err < tolerance(w) == 2e-2


def test_reference_of_some_contributors():
    w = wl((30, 40, 50))
    q = make_query(w, 5)
    kv = shards(w, 5)
    ref1 = exact_attention(q, [kv[1]])
    assert relative_error(partial_attention(q, kv[1]), ref1, raw=False) < 1e-5
    acc = partial_attention(q, kv[0])
    merge_into(acc, partial_attention(q, kv[2]))
    assert relative_error(acc, exact_attention(q, [kv[0], kv[2]]), raw=False) < 1e-5


def test_attention_partial_refuses_an_empty_head_dimension():
    from treeattn.exec.attention import attention_partial

    with pytest.raises(ValueError, match="head dimension must be at least 1"):
        attention_partial(torch.zeros(1, 2, 0), torch.zeros(1, 1, 3, 0), torch.zeros(1, 1, 3, 0))



def test_attention_partial_wants_q_in_the_caches_dtype_but_takes_any_q_with_fp8():
    from treeattn.exec.attention import attention_partial

    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen)
    with pytest.raises(TypeError, match=r"q is torch.float32 and k, v torch.bfloat16: give q in the cache's dtype"):
        attention_partial(q, k.bfloat16(), k.bfloat16())
    with pytest.raises(TypeError, match="give q in the cache's dtype"):  # an empty shard's rank refuses as its peers
        attention_partial(q, k[:, :, :0].bfloat16(), k[:, :, :0].bfloat16())
    o, _ = attention_partial(q, k.bfloat16(), k[..., :4].bfloat16())  # Dv != D: fp32 matmuls, any q
    assert o.dtype == torch.float32
    k8 = k.to(torch.float8_e4m3fn)
    o, lse = attention_partial(q, k8, k8)  # fp32 matmuls over the fp8 cache, q at its own precision
    ref_o, ref_lse = attention_partial(q, k8.float(), k8.float())
    assert o.dtype == torch.float32 and torch.allclose(o, ref_o, atol=1e-6) and torch.allclose(lse, ref_lse, atol=1e-6)

def test_the_tolerance_grows_with_the_roundings_a_narrow_wire_makes():
    from treeattn.exec.runner import wire_roundings
    from treeattn.plan.builders import build

    assert tolerance(wl((10, 10))) == 1e-5
    fp8 = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(10,) * 4, kv_dtype="bf16", partial_dtype="fp8")
    assert tolerance(fp8) == 2.0**-4 and tolerance(fp8, 3) == 3 * 2.0**-4
    bf16 = dataclasses.replace(fp8, partial_dtype="bf16")
    assert tolerance(bf16, 3) == 2e-2 and tolerance(bf16, 8) == 8 * 2.0**-8
    ref = TopologyRef("t", "sha256:0")
    # star: the leaves send, then the root sends the result back; a chain of 4: 3 + 3 hops
    assert wire_roundings(build("star", fp8, ref)) == 2
    assert wire_roundings(build("chain", fp8, ref)) == 6
    # a library sum rounds the weighted partial to the wire, then, in a 16-bit dtype, each of a
    # ring's 3 partial sums back to it (NCCL and gloo keep them in it): once a rank; fp8 is
    # summed in fp32 and finished from that sum: its input's rounding alone; each for the sum
    # of w o and of w, whose quotient the result is
    assert wire_roundings(build("allreduce2", bf16, ref)) == 8
    assert wire_roundings(build("allreduce2", fp8, ref)) == 2
    assert wire_roundings(build("allreduce2", bf16, ref, result="heads")) == 8
    assert wire_roundings(build("allgather-merge", fp8, ref)) == 1
    # the lse's max, the weights' sum and the gathered query move in fp32 or the input's dtype:
    # only the sum of w o rounds to the wire, as allreduce2's one sum
    assert wire_roundings(build("allreduce3", bf16, ref)) == 8
    assert wire_roundings(build("dcp-ag-rs", bf16, ref, result="heads")) == 8
    # a raw payload's sum too (its check is exact: tolerance 0)
    assert wire_roundings(build("allreduce", RawPayload(nbytes=64, ranks=4, dtype="bf16"), ref)) == 8
    # however many roundings, a result half off is wrong (all zeros is 1 off)
    assert tolerance(bf16, 256) == 0.5


def test_relative_error_flags_wrong_and_nan_results():
    w = wl((10, 10))
    ref = exact_attention(make_query(w, 0), shards(w, 0))
    wrong = ref.clone()
    wrong[3, 0] += 0.5
    assert relative_error(wrong, ref, raw=False) > 1e-2
    bad = ref.clone()
    bad[0, 0] = float("nan")
    assert relative_error(bad, ref, raw=False) == math.inf
    shifted = ref.clone()
    shifted[:, -1] += 1e-3  # an lse off by 1e-3 is wrong for fp32
    assert relative_error(shifted, ref, raw=False) > tolerance(w)


def test_raw_buffers_are_small_integers_and_sum_exactly():
    p = RawPayload(nbytes=64, ranks=3, dtype="bf16")
    bufs = [make_raw(p, r, 0) for r in range(3)]
    assert all(b.dtype == torch.bfloat16 and b.shape == (32,) for b in bufs)
    assert all(torch.equal(b.float(), b.float().round()) for b in bufs)
    total = bufs[0].clone()
    for b in bufs[1:]:
        total += b
    assert relative_error(total, sum(b.double() for b in bufs), raw=True) == 0.0
    assert torch.equal(make_raw(p, 1, 0), bufs[1]) and not torch.equal(bufs[0], bufs[1])
    assert tolerance(p) == 0.0


def test_kernel_resolution():
    assert resolve_kernel("auto", "cpu", "fp8") == "explicit"
    assert resolve_kernel("auto", "cpu", "bf16") in ("sdpa", "explicit")
    with pytest.raises(InputError, match="flash-attn"):
        resolve_kernel("flash-attn", "cpu", "bf16")
    with pytest.raises(InputError, match="sdpa"):
        resolve_kernel("sdpa", "cpu", "fp8")
    with pytest.raises(InputError, match="unknown"):
        resolve_kernel("magic", "cpu")


@pytest.mark.parametrize(("cap", "dtype", "d", "flash_attn", "want"), [
    ((9, 0), "bf16", 128, True, "flash-attn"),
    ((9, 0), "bf16", 128, False, "sdpa-flash"),
    ((8, 0), "fp16", 64, False, "sdpa-flash"),
    ((7, 0), "fp16", 128, True, "sdpa-efficient"),  # V100: no flash kernels
    ((7, 0), "bf16", 128, False, "explicit"),  # nor bf16 in the memory-efficient one
    ((9, 0), "fp32", 128, False, "sdpa-efficient"),
    ((9, 0), "fp8", 128, True, "explicit"),
    ((9, 0), "bf16", 12, True, "explicit"),  # a head dim the fused ops do not take
])
def test_attention_kernel_follows_the_device_capability(cap, dtype, d, flash_attn, want):
    assert choose_kernel("auto", "cuda", dtype, d, cap, flash_attn) == want


def test_named_kernels_are_checked_against_the_device():
    assert choose_kernel("sdpa", "cuda", "bf16", 128, (9, 0)) == "sdpa-flash"
    assert choose_kernel("sdpa", "cuda", "fp16", 128, (7, 5)) == "sdpa-efficient"
    with pytest.raises(InputError, match=r"kernel sdpa-flash does not take fp16 KV .* \(sm70\)"):
        choose_kernel("sdpa-flash", "cuda", "fp16", 128, (7, 0))
    with pytest.raises(InputError, match="flash-attn"):
        choose_kernel("flash-attn", "cuda", "bf16", 128, (9, 0), flash_attn=False)
    assert choose_kernel("explicit", "cuda", "fp8", 128, (9, 0)) == "explicit"


def test_sampled_rows_equal_the_exact_reference():
    w = wl((300, 0, 5, 700, 1), batch=3)
    q, kv = make_query(w, 4), shards(w, 4)
    exact = exact_attention(q, kv)
    rows = sample_rows(w, 4, w.ranks, count=10)
    assert rows.tolist() == sorted(set(rows.tolist())) and rows[0] == 0 and rows[-1] == w.rows - 1
    combined = combine_stats(torch.stack([row_stats(q, s, rows) for s in kv]))
    assert relative_error(combined, exact[rows], raw=False) < 1e-6  # fp64 work, rounded to fp32
    assert torch.allclose(combined.double(), exact[rows].double(), rtol=1e-6, atol=1e-6)
    # Every rank empty: the empty partial.
    nothing = combine_stats(torch.stack([row_stats(q, kv[1], rows)] * 2))
    assert torch.equal(nothing, empty_partial(len(rows), w.head_dim))


def test_a_check_reads_only_the_rows_the_reference_holds():
    w = wl((20, 30))
    q, kv = make_query(w, 1), shards(w, 1)
    exact = exact_attention(q, kv)
    rows = torch.tensor([0, 5, 9, 15])
    ref = Reference(exact[rows], rows)
    out = exact.clone()
    out[1] += 1.0  # a row the sample does not hold
    assert check_against(out, ref, None, False, raw=False) == 0.0
    out[9, 0] += 1.0
    assert check_against(out, ref, None, False, raw=False) > 1e-3
    # A heads layout: rows [8, 16) of this rank, given alone (sliced) or within every row.
    assert check_against(exact[8:16], ref, (8, 16), True, raw=False) == 0.0
    assert check_against(out, ref, (8, 16), False, raw=False) > 1e-3
    assert check_against(exact, Reference(exact), (8, 16), False, raw=False) == 0.0


@pytest.mark.parametrize("tokens_per_block", [1, 7, 37, 1000])
def test_explicit_kernel_block_by_block_is_attention(tokens_per_block):
    w = wl((37,), hkv=2, kv_dtype="bf16")
    q, kv = make_query(w, 3), make_kv_shard(w, 0, 3)
    qf = q.reshape(w.batch, 2, 4, w.head_dim).float()
    per_token = 4 * w.batch * 2 * (2 * w.head_dim + 2 * 4)
    o, lse = _explicit(qf, kv[0], kv[1], 1 / math.sqrt(w.head_dim), block_bytes=tokens_per_block * per_token)
    o_ref, lse_ref = explicit_gqa(q, kv)
    assert torch.allclose(o.reshape(w.batch, 8, w.head_dim).double(), o_ref, atol=1e-5)
    assert torch.allclose(lse.reshape(w.batch, 8).double(), lse_ref, atol=1e-5)


@pytest.mark.skipif(not can_reset_peak(), reason="needs Linux's /proc/self/clear_refs and VmHWM")
def test_explicit_kernel_holds_a_block_not_an_fp32_copy_of_the_shard():
    # fp8 KV runs the explicit kernel (on CUDA too); the fp32 copy of a 128 MiB fp8 shard's
    # keys, then of its values, is 256 MiB (the kernel grew the resident set by 293 MiB
    # before it went block by block), which no plan's memory check counts.
    w = wl((1 << 17,), kv_dtype="fp8", batch=2, hq=8, hkv=2, d=128)
    q, kv = make_query(w, 4), make_kv_shard(w, 0, 4)
    assert kv.numel() == 128 << 20
    grew = peak_growth_bytes(lambda: partial_attention(q, kv, "explicit"))
    # A block's copies (the allocator keeps some of a freed block resident: 130 MiB here).
    assert grew < 3 * EXPLICIT_BLOCK_BYTES, f"the explicit kernel grew the resident set by {grew / 2**20:.0f} MiB"
