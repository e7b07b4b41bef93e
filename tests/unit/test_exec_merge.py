"""Properties of the merge operator (treeattn.exec.merge) on packed partials."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treeattn.exec import merge as merge_module
from treeattn.exec.merge import (
    empty_partial,
    from_wire,
    merge,
    merge_into,
    merge_many,
    merge_many_into,
    pack,
    split_wire,
    sum_into,
    sum_many_into,
    to_wire,
    unpack,
    wire_cols,
    wired,
)

NEG_INF = float("-inf")
MODERATE = st.floats(min_value=-80.0, max_value=80.0, allow_nan=False, width=32)
EXTREME = st.one_of(
    st.sampled_from([NEG_INF, 3.0e38, -3.0e38, 1.0e30, -1.0e30, 88.0, -88.0, 0.0]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
OUT = st.floats(min_value=-100.0, max_value=100.0, allow_nan=False, width=32)


@pytest.fixture(autouse=True, scope="module", params=["product and sum", "multiply-add per partial"])
def weighted_sum_form(request):
    """Every property holds for both eager forms of the weighted sum over a stack (small
    stacks take the first, large ones the second: ``merge._EAGER_SUM_MAX``)."""
    keep = merge_module._EAGER_SUM_MAX
    merge_module._EAGER_SUM_MAX = keep if request.param == "product and sum" else -1
    yield request.param
    merge_module._EAGER_SUM_MAX = keep


@st.composite
def partials(draw, k: int = 1, lse=MODERATE, empty_ok: bool = True):
    """k packed partials with the same (rows, D + 1) shape."""
    rows = draw(st.integers(1, 5))
    d = draw(st.integers(1, 6))
    out = []
    for _ in range(k):
        o = torch.tensor(draw(st.lists(OUT, min_size=rows * d, max_size=rows * d))).reshape(rows, d)
        values = st.one_of(lse, st.just(NEG_INF)) if empty_ok else lse
        lse_t = torch.tensor(draw(st.lists(values, min_size=rows, max_size=rows)), dtype=torch.float32)
        # An empty row (lse = -inf) holds o = 0, as a rank without tokens produces.
        o[torch.isneginf(lse_t)] = 0.0
        out.append(pack(o, lse_t))
    return out


def assert_close(a: torch.Tensor, b: torch.Tensor, rtol: float = 2e-5) -> None:
    oa, la = unpack(a)
    ob, lb = unpack(b)
    assert torch.equal(torch.isneginf(la), torch.isneginf(lb))
    scale = max(1.0, oa.abs().max().item(), ob.abs().max().item())
    assert (oa - ob).abs().max().item() <= rtol * scale
    finite = torch.isfinite(la)
    assert torch.allclose(la[finite], lb[finite], rtol=rtol, atol=rtol)


def exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The merge written from docs/design.md section 1 in fp64 with logsumexp (moderate inputs)."""
    oa, la = (t.double() for t in unpack(a))
    ob, lb = (t.double() for t in unpack(b))
    lse = torch.logsumexp(torch.stack([la, lb]), dim=0)
    wa = torch.where(torch.isneginf(la), 0.0, torch.exp(la - lse))
    wb = torch.where(torch.isneginf(lb), 0.0, torch.exp(lb - lse))
    o = torch.where(torch.isneginf(lse)[:, None], 0.0, wa[:, None] * oa + wb[:, None] * ob)
    return pack(o, lse)


@settings(max_examples=80, deadline=None)
@given(partials(k=2))
def test_merge_matches_the_formula(parts):
    a, b = parts
    assert_close(merge(a, b), exact(a, b).float())


@settings(max_examples=80, deadline=None)
@given(partials(k=2))
def test_commutative(parts):
    a, b = parts
    assert_close(merge(a, b), merge(b, a))


@settings(max_examples=80, deadline=None)
@given(partials(k=3))
def test_associative(parts):
    a, b, c = parts
    assert_close(merge(merge(a, b), c), merge(a, merge(b, c)), rtol=5e-5)


@settings(max_examples=100, deadline=None)
@given(partials(k=1, lse=EXTREME))
def test_empty_is_exactly_the_identity(parts):
    (a,) = parts
    e = empty_partial(a.shape[0], a.shape[1] - 1)
    assert torch.equal(merge(a, e), a)
    assert torch.equal(merge(e, a), a)


def test_two_empty_rows_give_empty_not_nan():
    e = empty_partial(4, 3)
    out = merge(e, e)
    assert torch.equal(out[:, :3], torch.zeros(4, 3))
    assert torch.isneginf(out[:, 3]).all()
    many = merge_many(torch.stack([e, e, e]))
    assert torch.equal(many, out)


@settings(max_examples=100, deadline=None)
@given(partials(k=3, lse=EXTREME))
def test_never_nan_for_extreme_logits(parts):
    a, b, c = parts
    for out in (merge(a, b), merge(merge(a, b), c), merge_many(torch.stack(parts))):
        assert not torch.isnan(out).any()
        o, lse = unpack(out)
        assert o.abs().max().item() <= 100.0 * (1 + 1e-5)  # a convex combination of the inputs
        assert not torch.isposinf(lse).any()


def test_large_logits_of_opposite_sign_do_not_overflow():
    a = pack(torch.tensor([[1.0, 2.0]]), torch.tensor([3.0e38]))
    b = pack(torch.tensor([[5.0, 6.0]]), torch.tensor([-3.0e38]))
    assert torch.equal(merge(a, b), a)
    assert torch.equal(merge(b, a), a)
    same = merge(a, a)
    assert torch.equal(same[:, :2], a[:, :2]) and same[0, 2].item() == pytest.approx(3.0e38, rel=1e-6)


@settings(max_examples=100, deadline=None)
@given(partials(k=2), st.integers(1, 5))
def test_chunks_merged_separately_equal_the_whole(parts, chunks):
    a, b = parts
    whole = merge(a, b)
    acc = a.clone()
    rows = a.shape[0]
    bounds = sorted({0, rows, *[(rows * i) // chunks for i in range(chunks)]})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        merge_into(acc[lo:hi], b[lo:hi])  # in place into row slices of the accumulator
    assert torch.equal(acc, whole)


@settings(max_examples=100, deadline=None)
@given(partials(k=4))
def test_merge_many_equals_a_fold(parts):
    acc = parts[0].clone()
    for p in parts[1:]:
        merge_into(acc, p)
    assert_close(merge_many(torch.stack(parts)), acc, rtol=5e-5)


def _one_by_one_and_at_once(parts, k):
    one_by_one = parts[0].clone()
    for p in parts[1 : k + 1]:
        merge_into(one_by_one, p)
    return one_by_one, merge_many_into(parts[0].clone(), torch.stack(parts[1 : k + 1]))


@settings(max_examples=100, deadline=None)
@given(partials(k=5), st.integers(1, 4))
def test_merge_many_into_equals_merging_one_by_one(parts, k):
    # What a step receiving k partials for one chunk does, against the merges one at a time.
    one_by_one, at_once = _one_by_one_and_at_once(parts, k)
    assert_close(at_once, one_by_one, rtol=5e-5)


@settings(max_examples=100, deadline=None)
@given(partials(k=5, lse=EXTREME), st.integers(1, 4))
def test_merge_many_into_never_nan_and_keeps_empty_rows(parts, k):
    one_by_one, at_once = _one_by_one_and_at_once(parts, k)
    assert not torch.isnan(at_once).any()
    assert torch.equal(torch.isneginf(unpack(at_once)[1]), torch.isneginf(unpack(one_by_one)[1]))


@settings(max_examples=60, deadline=None)
@given(partials(k=4))
def test_merge_many_into_is_exact_for_one_and_tolerates_16_bit(parts):
    a, b = parts[0].clone(), parts[0].clone()
    merge_many_into(a, parts[1].unsqueeze(0))
    merge_into(b, parts[1])
    assert torch.equal(a, b)
    # 16-bit wire partials are merged through fp32: as if their outputs were upcast first
    stack = torch.stack(parts[1:])
    narrow = merge_many_into(parts[0].clone(), wired(stack, torch.bfloat16))
    assert torch.equal(narrow, merge_many_into(parts[0].clone(), _rounded(stack, torch.bfloat16)))


def test_merge_many_into_rejects_a_stack_of_other_rows():
    with pytest.raises(ValueError, match="stack"):
        merge_many_into(empty_partial(2, 3), torch.stack([empty_partial(3, 3)]))


def test_raw_sum_of_a_stack_in_place():
    acc = torch.tensor([1.0, 2.0])
    sum_many_into(acc, torch.tensor([[3.0, -2.0], [1.0, 1.0]]))
    assert acc.tolist() == [5.0, 1.0]
    f8 = torch.tensor([1.0, -1.0]).to(torch.float8_e4m3fn)
    sum_many_into(f8, torch.tensor([[2.0, 1.0], [1.0, 1.0]]).to(torch.float8_e4m3fn))
    assert f8.float().tolist() == [4.0, 1.0]


def test_merge_takes_16_bit_wire_partials():
    a = pack(torch.tensor([[1.0, -1.0]]), torch.tensor([0.5]))
    b = pack(torch.tensor([[3.0, 1.0]]), torch.tensor([0.5]))
    out = merge(a, wired(b, torch.bfloat16))
    assert out.dtype == torch.float32
    assert out[0, :2].tolist() == [2.0, 0.0]
    assert out[0, 2].item() == pytest.approx(0.5 + math.log(2.0), abs=1e-6)


def test_merge_takes_fp8_wire_partials_as_if_upcast():
    """A plan with partial_dtype fp8 receives fp8 partials: merged through fp32 (torch promotes
    no fp8 type, so ``w * o`` on the fp8 rows themselves raises)."""
    g, rows = torch.Generator().manual_seed(0), 3
    acc = pack(torch.randn(rows, 32, generator=g), torch.randn(rows, generator=g))
    packed = torch.stack([pack(torch.randn(rows, 32, generator=g), torch.randn(rows, generator=g))
                          for _ in range(3)])
    stack = wired(packed, torch.float8_e4m3fn)
    got = merge_many_into(acc.clone(), stack)
    assert torch.equal(got, merge_many_into(acc.clone(), _rounded(packed, torch.float8_e4m3fn)))
    assert torch.equal(merge(acc, stack[0]), merge(acc, _rounded(packed, torch.float8_e4m3fn)[0]))


def _rounded(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Packed fp32 rows with their outputs rounded to ``dtype`` and their lse as they are:
    what the wire carries, upcast."""
    out = packed.clone()
    out[..., :-1] = out[..., :-1].to(dtype).float()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_the_wire_form_keeps_the_lse_in_fp32(dtype):
    g = torch.Generator().manual_seed(1)
    packed = pack(torch.randn(5, 6, generator=g), torch.randn(5, generator=g) * 30 + 40)
    packed[2, -1] = float("-inf")
    packed[2, :-1] = 0.0
    rows = wired(packed, dtype)
    assert rows.dtype == dtype and rows.shape == (5, wire_cols(6, dtype)) == (5, 6 + max(1, 4 // dtype.itemsize))
    o, lse = split_wire(rows)
    assert torch.equal(lse, packed[:, -1]) and torch.equal(o.float(), packed[:, :-1].to(dtype).float())
    back = from_wire(torch.empty_like(packed), rows)
    assert torch.equal(back, _rounded(packed, dtype))
    assert torch.equal(to_wire(torch.empty_like(rows), packed).view(torch.uint8), rows.view(torch.uint8))


def _copied_split(stack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``split_wire`` with the lse always copied out of the rows (what the view must equal)."""
    d = stack.shape[-1] - wire_cols(0, stack.dtype)
    lse = torch.empty((*stack.shape[:-1], 1), dtype=torch.float32)
    lse.view(torch.uint8).copy_(stack.view(torch.uint8)[..., d * stack.dtype.itemsize:])
    return stack[..., :d], lse[..., 0]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _wire_stack(k: int, rows: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """k partials of ``rows`` rows in wire form (an empty row among them) and an accumulator."""
    g = torch.Generator().manual_seed(k * 100 + d)
    packed = pack(torch.randn(k * rows, d, generator=g), torch.randn(k * rows, generator=g) * 30 + 40)
    packed[1, -1], packed[1, :-1] = NEG_INF, 0.0
    acc = pack(torch.randn(rows, d, generator=g), torch.randn(rows, generator=g) * 30 + 40)
    return wired(packed, dtype).view(k, rows, -1), acc


@pytest.mark.parametrize(("dtype", "d", "view"), [
    (torch.bfloat16, 8, True), (torch.float16, 128, True), (torch.float8_e4m3fn, 8, True),
    (torch.float8_e4m3fn, 64, True),
    # an odd D (2-byte dtypes) or one not a multiple of 4 (fp8) puts the lse off a 4-byte boundary
    (torch.bfloat16, 7, False), (torch.float16, 5, False), (torch.float8_e4m3fn, 6, False),
    (torch.float8_e4m3fn, 5, False)])
def test_split_wire_views_the_lse_where_it_is_aligned_and_copies_it_otherwise(dtype, d, view):
    stack, acc = _wire_stack(3, 5, d, dtype)
    o, lse = split_wire(stack)
    want_o, want_lse = _copied_split(stack)
    assert torch.equal(_bits(lse), _bits(want_lse)) and o.data_ptr() == want_o.data_ptr() == stack.data_ptr()
    shares = lse.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    assert shares == view
    if view:
        assert lse.data_ptr() == stack.data_ptr() + d * dtype.itemsize and lse.stride() == (
            stack.stride(0) * dtype.itemsize // 4, stack.stride(1) * dtype.itemsize // 4)
    # the merges read the same bits either way
    assert torch.equal(_bits(merge_many_into(acc.clone(), stack)),
                       _bits(merge_module.merge_stack(acc.clone(), want_o, want_lse, True)))
    assert torch.equal(_bits(merge_many(stack)), _bits(merge_module.merge_stack(
        torch.empty_like(acc), want_o, want_lse, False)))


def test_split_wire_views_a_row_slice_and_copies_rows_that_start_off_a_4_byte_boundary():
    stack, _ = _wire_stack(2, 6, 8, torch.bfloat16)
    part = stack[:, 2:5]  # rows of 20 bytes: every slice of whole rows stays aligned
    assert split_wire(part)[1].untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    assert torch.equal(_bits(split_wire(part)[1]), _bits(_copied_split(part)[1]))
    flat = torch.zeros(stack.numel() + 1, dtype=torch.bfloat16)
    shifted = flat[1:].view(stack.shape)  # the same rows two bytes further on
    shifted.copy_(stack)
    lse = split_wire(shifted)[1]
    assert lse.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
    assert torch.equal(_bits(lse), _bits(split_wire(stack)[1]))


def test_a_16_bit_wire_merges_at_long_context_lse_as_closely_as_its_outputs_allow():
    # lse of tens (long context, large logits): rounded to bf16 (spacing 0.25 at 32-64) it put
    # the weights 8 % off; kept fp32, the merge is as close as bf16 outputs allow.
    g = torch.Generator().manual_seed(0)
    k, rows, d = 8, 256, 128
    parts = torch.cat([torch.randn(k, rows, d, generator=g) * 0.3,
                       (40 + math.log(16384) + torch.randn(k, rows, generator=g) * 0.5).unsqueeze(-1)], dim=-1)
    exact = merge_many(parts)
    got = merge_many(wired(parts, torch.bfloat16))
    err = ((got[:, :-1] - exact[:, :-1]).abs().max() / exact[:, :-1].abs().max()).item()
    assert err < 5e-3, err
    assert (got[:, -1] - exact[:, -1]).abs().max().item() < 1e-4


def test_pack_heads_takes_an_fp8_output():
    o, lse = torch.randn(2, 4, 8).to(torch.float8_e4m3fn), torch.randn(2, 4)
    packed = merge_module.pack_heads(o, lse)
    assert torch.equal(packed, merge_module.pack_heads(o.float(), lse))


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="stack"):
        merge_into(empty_partial(2, 3), empty_partial(3, 3))
    with pytest.raises(ValueError, match=r"wire form: 5 columns"):  # bf16 rows as if packed fp32
        merge_into(empty_partial(2, 3), empty_partial(2, 3).to(torch.bfloat16))


def test_raw_sum_in_place_and_fp8_through_fp32():
    acc = torch.tensor([1.0, 2.0])
    sum_into(acc, torch.tensor([3.0, -2.0]))
    assert acc.tolist() == [4.0, 0.0]
    f8 = torch.tensor([1.0, -1.0]).to(torch.float8_e4m3fn)
    sum_into(f8, torch.tensor([2.0, 1.0]).to(torch.float8_e4m3fn))
    assert f8.float().tolist() == [3.0, 0.0]


def test_the_dcp_correction_takes_the_log_sum_exp_of_every_ranks_lse():
    from treeattn.exec.merge import corrected

    torch.manual_seed(0)
    lses = torch.randn(3, 6) * 20
    lses[:, 1] = float("-inf")  # every rank empty there: total -inf, weight 0
    lses[0, 2] = float("-inf")
    part = torch.randn(6, 9)
    part[:, -1] = lses[1]
    total, wo = corrected(part, lses, torch.float32)
    want = torch.logsumexp(lses, dim=0)
    assert torch.equal(torch.isinf(total), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(total[finite], want[finite], rtol=1e-6, atol=0)
    assert torch.allclose(wo, part[:, :-1] * torch.exp(lses[1] - want).nan_to_num(0.0).unsqueeze(1), rtol=1e-5)
    assert torch.equal(wo[1], torch.zeros(8))
