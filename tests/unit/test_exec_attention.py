"""Inputs, local partials and the reference of treeattn.exec (single process, no torch.distributed)."""

from __future__ import annotations

import math

import pytest
import torch

from treeattn.errors import InputError
from treeattn.exec.attention import (
    make_kv,
    make_kv_shard,
    make_query,
    make_raw,
    partial_attention,
    reference_attention,
    reference_raw,
    resolve_kernel,
)
from treeattn.exec.merge import empty_partial, merge_into, unpack_heads
from treeattn.exec.runner import relative_error, tolerance
from treeattn.workload import RawPayload, Workload


def wl(split, kv_dtype="fp32", batch=2, hq=8, hkv=2, d=16, partial="fp32"):
    return Workload(batch=batch, q_heads=hq, kv_heads=hkv, head_dim=d, split=tuple(split), kv_dtype=kv_dtype,
                    partial_dtype=partial)


def test_inputs_are_deterministic_and_split_independent():
    a, b = wl((300, 0, 5, 700)), wl((1, 1004, 0, 0))
    assert torch.equal(make_query(a, 3), make_query(b, 3))
    assert not torch.equal(make_query(a, 3), make_query(a, 4))
    for w in (a, b):
        shards = torch.cat([make_kv_shard(w, r, 3) for r in range(w.ranks)], dim=3)
        assert torch.equal(shards, make_kv(w, 0, w.seq_len, 3))
    assert make_kv_shard(a, 1, 3).shape == (2, 2, 2, 0, 16)
    # Token t holds the same K/V whoever holds it.
    assert torch.equal(make_kv_shard(a, 0, 3), make_kv(b, 0, 300, 3))
    assert torch.equal(make_kv_shard(a, 3, 3), make_kv_shard(b, 1, 3)[:, :, :, 305 - 1 : 1005 - 1])


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
    ref = reference_attention(w, 9)
    # The explicit kernel accumulates in fp32 from the same (rounded) inputs: fp32-level error.
    assert relative_error(acc, ref, raw=False) < 1e-5


def test_sdpa_bf16_within_the_bf16_tolerance():
    w = wl((200, 300), kv_dtype="bf16")
    q = make_query(w, 2)
    acc = empty_partial(w.rows, w.head_dim)
    for r in range(2):
        merge_into(acc, partial_attention(q, make_kv_shard(w, r, 2), "sdpa"))
    err = relative_error(acc, reference_attention(w, 2), raw=False)
    assert err < tolerance(w) == 2e-2


def test_reference_of_some_contributors():
    w = wl((30, 40, 50))
    q = make_query(w, 5)
    ref1 = reference_attention(w, 5, ranks=(1,))
    assert relative_error(partial_attention(q, make_kv_shard(w, 1, 5)), ref1, raw=False) < 1e-5
    acc = partial_attention(q, make_kv_shard(w, 0, 5))
    merge_into(acc, partial_attention(q, make_kv_shard(w, 2, 5)))
    assert relative_error(acc, reference_attention(w, 5, ranks=(0, 2)), raw=False) < 1e-5


def test_relative_error_flags_wrong_and_nan_results():
    w = wl((10, 10))
    ref = reference_attention(w, 0)
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
    assert relative_error(total, reference_raw(p, 0), raw=True) == 0.0
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
