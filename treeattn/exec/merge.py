"""The merge operator of docs/design.md section 1 on packed partials.

Legend: a *packed* partial is a ``(rows, D + 1)`` fp32 tensor, row ``r`` = (o_r, lse_r):
``[:, :D]`` the output, ``[:, D]`` the log-sum-exp. Rows are head-major (row = h * B + b,
``pack_heads``), so a chunk of rows (``Plan.chunk_range``) is one contiguous slice and so is
a range of query heads. The *empty* partial is (0, -inf): the identity of the merge.

On the wire a partial travels in the plan's partial dtype, except its lse, which stays fp32
whatever that dtype (``to_wire``): a log-sum-exp grows with the context and the logits' scale
(tens at long context), where bf16's spacing is 0.125-0.25 and e4m3's 2-4, and a merge weighs
each partial by exp of its lse, so an lse rounded so would put every weight off by as much. A
row of a narrower dtype ends with the lse's four bytes in ``4 / itemsize`` of its columns
(``wire_cols``); fp32 rows are the packed rows themselves.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from treeattn.exec.comm import BufferPool

__all__ = ["empty_partial", "clear_partial", "pack", "unpack", "wire_cols", "to_wire", "wired", "lse_column",
           "sum_shift", "from_wire", "split_wire", "check_stack", "pack_heads", "pack_heads_into", "clear_empty_rows",
           "unpack_heads", "weights", "weighted", "corrected", "finish", "merge_stack", "merge_into", "merge",
           "merge_many", "merge_many_into", "sum_into", "sum_many_into", "sum_stack"]

_NEG_INF = float("-inf")
_FLOAT_MIN = torch.finfo(torch.float32).min
_FLOAT_TINY = torch.finfo(torch.float32).tiny
_EAGER_SUM_MAX = 1 << 16
"""The largest stack of outputs (elements) the eager merge sums as one product (``_add_weighted``)."""


def empty_partial(rows: int, head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The identity of the merge for ``rows`` rows: o = 0, lse = -inf.

    Args:
        rows: rows of the partial (B x Hq).
        head_dim: D.
        device: where the tensor lives.

    Returns:
        A ``(rows, D + 1)`` fp32 tensor.
    """
    return clear_partial(torch.empty(rows, head_dim + 1, dtype=torch.float32, device=device))


def clear_partial(out: torch.Tensor) -> torch.Tensor:
    """Set a packed partial ``(rows, D + 1)`` to the identity of the merge, in place."""
    out[:, :-1] = 0.0
    out[:, -1] = _NEG_INF
    return out


def pack(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Pack an output ``(..., D)`` and its log-sum-exp ``(...)`` into ``(rows, D + 1)`` fp32.

    Args:
        o: output, any leading shape (B, Hq) flattened into rows in order.
        lse: log-sum-exp with the same leading shape.

    Returns:
        The packed partial.
    """
    d = o.shape[-1]
    return torch.cat([o.reshape(-1, d).float(), lse.reshape(-1, 1).float()], dim=1)


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views (o, lse) of a packed partial: ``(rows, D)`` and ``(rows,)``."""
    return packed[:, :-1], packed[:, -1]


def wire_cols(head_dim: int, wire: torch.dtype) -> int:
    """Columns of a partial's row on the wire in ``wire``: D values and the fp32 lse's bytes."""
    return head_dim + max(1, 4 // wire.itemsize)


def _lse_bytes(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The bytes of the fp32 lse at the end of each row of a partial in wire form."""
    return rows.view(torch.uint8)[..., head_dim * rows.dtype.itemsize:]


def to_wire(out: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """Write packed fp32 rows ``(..., D + 1)`` into ``out``, their wire form in ``out``'s
    dtype ``(..., wire_cols(D, dtype))``: o converted, the lse's fp32 bytes as they are."""
    if out.dtype == torch.float32:
        return out.copy_(packed)
    d = packed.shape[-1] - 1
    out[..., :d].copy_(packed[..., :d])
    _lse_bytes(out, d).copy_(packed[..., d:].view(torch.uint8))
    return out


def wired(packed: torch.Tensor, wire: torch.dtype, pool: BufferPool | None = None) -> torch.Tensor:
    """Packed fp32 rows in their wire form in ``wire``: themselves for fp32, else a buffer of
    ``pool`` (per iteration: the run's buffers keep their addresses) or a new tensor."""
    if wire == torch.float32:
        return packed
    shape = (*packed.shape[:-1], wire_cols(packed.shape[-1] - 1, wire))
    out = pool.take(shape, wire) if pool is not None else torch.empty(shape, dtype=wire, device=packed.device)
    return to_wire(out, packed)


def lse_column(packed: torch.Tensor, pool: BufferPool | None = None, shift: float = 0.0) -> torch.Tensor:
    """The lse column of packed rows as a dense vector (a library reduces or gathers dense
    tensors; the column is strided), plus ``shift`` (``sum_shift``), in a buffer of ``pool``
    or a new tensor."""
    lse = packed[:, -1]
    if pool is None:
        return lse + shift if shift else lse.contiguous()
    out = pool.take((packed.shape[0],), packed.dtype)
    return torch.add(lse, shift, out=out) if shift else out.copy_(lse)


def sum_shift(wire: torch.dtype, ranks: int) -> float:
    """What the forms that sum weighted partials over ``ranks`` in the library (the two and
    three all-reduces) add to every lse before taking the max: log(ranks) for a 16-bit wire
    (bf16, fp16), which the libraries sum in its own dtype, else 0. Each weight exp(lse - max)
    is then at most 1/ranks, so the sums of w and of w o stay within 1 and the largest |o|:
    unshifted, p partials that each fit the dtype sum to up to p times it (4 ranks of o =
    20000 in fp16 came back inf). ``finish`` takes the shifted max, so the result is the same:
    lse = max + log(sum w). An fp8 wire is summed in fp32 and finished from that sum
    (``Comm.all_reduce``'s ``widen``): shifted, most of its weights would fall below e4m3's
    smallest normal number (2^-6) and lose their precision."""
    if ranks > 1 and torch.finfo(wire).bits == 16:
        return math.log(ranks)
    return 0.0


def _as_fp32(raw: torch.Tensor) -> torch.Tensor | None:
    """Bytes ``(..., 4)`` (last stride 1) as fp32 ``(..., 1)`` without a copy, or None where
    some element would not start at a multiple of 4 bytes: fp32 loads need that alignment
    (a GPU faults on a misaligned one), and torch refuses such a view."""
    if raw.data_ptr() % 4 or raw.storage_offset() % 4 or any(s % 4 for s in raw.stride()[:-1]):
        return None
    return raw.view(torch.float32)


def split_wire(stack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of partials in wire form ``(..., wire_cols)``: a view of the outputs in
    their dtype ``(..., D)`` and the lse in fp32 ``(...)``: a view of the rows too where every
    lse starts at a multiple of 4 bytes (fp32 rows; 2-byte dtypes with D even, fp8 with D a
    multiple of 4, in a buffer that starts so aligned, as the executor's do), else a copy."""
    if stack.dtype == torch.float32:
        return stack[..., :-1], stack[..., -1]
    d = stack.shape[-1] - wire_cols(0, stack.dtype)
    raw = _lse_bytes(stack, d)
    lse = _as_fp32(raw)
    if lse is None:
        lse = torch.empty((*stack.shape[:-1], 1), dtype=torch.float32, device=stack.device)
        lse.view(torch.uint8).copy_(raw)
    return stack[..., :d], lse[..., 0]


def from_wire(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Write partials in wire form ``rows`` into packed fp32 rows ``out`` (``to_wire`` undone)."""
    if rows.dtype == torch.float32:
        return out.copy_(rows)
    d = out.shape[-1] - 1
    out[..., :d].copy_(rows[..., :d])
    out[..., d:].view(torch.uint8).copy_(_lse_bytes(rows, d))
    return out


def pack_heads(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Pack a model's ``o (B, Hq, D)`` and ``lse (B, Hq)`` into head-major rows ``(Hq * B, D + 1)`` fp32."""
    bsz, hq, d = o.shape
    return pack_heads_into(torch.empty(hq * bsz, d + 1, dtype=torch.float32, device=o.device), o, lse)


def pack_heads_into(out: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``pack_heads`` into an existing ``(Hq * B, D + 1)`` buffer (no allocation)."""
    bsz, hq, d = o.shape
    if o.dtype.itemsize == 1:  # fp8: torch promotes no fp8 type, so cat would refuse to mix it with fp32
        o = o.float()
    torch.cat([o.transpose(0, 1), lse.transpose(0, 1).unsqueeze(-1)], dim=-1, out=out.view(hq, bsz, d + 1))
    return out


def clear_empty_rows(packed: torch.Tensor) -> torch.Tensor:
    """Set every row of packed rows ``(rows, D + 1)`` whose lse is infinite to the empty partial
    (0, -inf), in place: a kernel's row with no keys. FlashAttention-2 (unsplit) gives such a
    row lse = +inf, and some kernels o = NaN beside lse = -inf; merged as they are, either makes
    that row NaN on every rank (exp(inf - inf), 0 x NaN). A finite lse is left as it is."""
    lse = packed[:, -1]
    empty = lse.isinf()
    packed.masked_fill_(empty.unsqueeze(1), 0.0)
    lse.masked_fill_(empty, _NEG_INF)
    return packed


def unpack_heads(packed: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``o (B, H, D)`` and ``lse (B, H)`` of head-major packed rows ``(H * B, D + 1)``."""
    rows, d1 = packed.shape
    view = packed.view(rows // batch, batch, d1).transpose(0, 1)
    return view[..., :-1], view[..., -1]


def weights(lse: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The weights w = exp(lse - m) in fp32, for ``m`` >= every ``lse`` of the merge (its
    maximum, or its log-sum-exp): the largest weight is then exactly 1, an empty row
    (lse = -inf) weighs 0, and so does every row where all are empty (m = -inf: the shift
    is clamped finite, so it is exp(-inf), never exp(nan))."""
    return torch.exp(lse.float() - m.clamp(min=_FLOAT_MIN))


def weighted(part: torch.Tensor, m: torch.Tensor, dtype: torch.dtype, with_weight: bool = True) -> torch.Tensor:
    """The rows ``(w o, w)`` of a packed partial (or ``w o`` alone) in ``dtype``, w = ``weights(lse, m)``:
    what the library-collective forms sum across ranks before ``finish``."""
    w = weights(part[:, -1], m)
    o = part[:, :-1] * w.unsqueeze(1)
    return (torch.cat([o, w.unsqueeze(1)], dim=1) if with_weight else o).to(dtype)


def corrected(part: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode context parallel's correction of a rank's rows by every rank's lse (``lses``
    ``(p, rows)``): their log-sum-exp ``total`` (-inf where every rank is empty) and the rows'
    outputs weighted by exp(lse - total), ``w o`` in ``dtype``, which the ranks then sum."""
    # torch.logsumexp's arithmetic, without its branch on an empty input (which a compile for
    # any row count cannot take)
    m = lses.amax(dim=0)
    m = torch.where(m.abs() == float("inf"), 0.0, m)
    total = torch.log(torch.exp(lses - m).sum(dim=0)) + m
    return total, weighted(part, total, dtype, with_weight=False)


def _inverse(den: torch.Tensor) -> torch.Tensor:
    """1 / den for a sum of weights den of ``weights(lse, m)``: den is 0 (every contributor
    empty: then every w o is 0 too) or at least the largest weight (a sum of non-negative terms
    rounds to no less than its largest), which is 1 for m the largest lse and a normal number
    of the wire dtype for the library sums' shifted m (``sum_shift``), so 1 / max(den, fp32's
    smallest normal) is exact and makes an all-empty row's o = 0 without a branch."""
    return den.clamp(min=_FLOAT_TINY).reciprocal_()


def _set_lse(lse: torch.Tensor, m: torch.Tensor, den: torch.Tensor) -> None:
    """lse <- m + log den: -inf where den = 0 (log 0 = -inf, and m is finite or -inf)."""
    lse.copy_(torch.log(den).add_(m))


def finish(o: torch.Tensor, lse: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    """``o, lse <- num / den, m + log den`` in place (the output and lse columns of a packed
    partial), from sums num = sum of w o and den = sum of w with the weights of ``m`` (what
    the library-collective forms sum across ranks); any float dtype, fp32 arithmetic."""
    den = den.float()
    o.copy_(num).mul_(_inverse(den).unsqueeze(1))
    _set_lse(lse, m, den)


def _add_weighted(out: torch.Tensor, o: torch.Tensor, w: torch.Tensor, accumulate: bool) -> None:
    """``out (+)= sum_k w[k] o[k]`` for a stack ``o (k, rows, D)`` and weights ``w (k, rows, 1)``
    (``out`` overwritten unless ``accumulate``).

    Compiled, one reduction over k (inductor fuses it into the merge's kernel, for any k).
    Eager, the same product and sum while the stack is small (``_EAGER_SUM_MAX`` elements:
    there each kernel's dispatch costs more than its memory traffic, and this is three kernels
    where the other form is k + 1); above, one multiply-add per partial into ``out``, which
    reads each partial once and allocates nothing (the product would write and read a
    k-sized temporary)."""
    if torch.compiler.is_compiling() or o.numel() <= _EAGER_SUM_MAX:
        total = (o * w).sum(dim=0)
        out.add_(total) if accumulate else out.copy_(total)
        return
    pairs = zip(o.unbind(0), w.unbind(0), strict=True)
    if not accumulate:
        oj, wj = next(pairs)
        torch.mul(oj, wj, out=out)
    for oj, wj in pairs:
        out.addcmul_(oj, wj)


def merge_stack(out: torch.Tensor, parts: torch.Tensor, lse: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """The merge: ``out <- out (+) stack[0] (+) ... (+) stack[k-1]`` (``accumulate``) or
    ``out <- stack[0] (+) ... (+) stack[k-1]``, in place, row by row, in fp32, for a stack of
    k partials given as their outputs ``parts`` and their ``lse`` (``split_wire``).

    m = max lse, w = ``weights(lse, m)``, o = sum of w o / sum of w, lse = m + log sum of w
    (``finish``'s arithmetic, with the weights divided by their sum before they multiply the
    outputs: the outputs are read and written once each, in ``out``'s own rows). Stable for
    logits of any finite magnitude (no overflow), though the merged lse is fp32: its rounding,
    about |lse| x 6e-8, weighs a later merge's partials that much apart, so a plan that merges
    in several hops loses accuracy with |lse| (max error of o 3e-7 at |lse| near 0, 8e-4 at
    1e4 through a chain of 5 ranks, where one-pass merges keep 2e-7); (x, -inf) is exactly the
    identity for any finite x; empty rows everywhere give (0, -inf); never NaN for finite
    outputs and lse in [-inf, +inf).
    ``treeattn.exec.kernels`` compiles this function as it is.

    Args:
        out: packed partial ``(rows, D + 1)`` fp32 (a tensor or a contiguous row slice of one).
        parts: ``(k, rows, D)``, k >= 1, any float dtype.
        lse: ``(k, rows)`` fp32.
        accumulate: whether ``out``'s own rows take part (else they are overwritten).

    Returns:
        ``out``.
    """
    o, la = out[:, :-1], out[:, -1]
    m = lse.amax(dim=0)
    if accumulate:
        m = torch.maximum(m, la)
    w = weights(lse, m)
    den = w.sum(dim=0)
    if accumulate:
        wa = weights(la, m)
        den.add_(wa)
    inv = _inverse(den)
    if accumulate:
        o.mul_(wa.mul_(inv).unsqueeze(1))
    if parts.dtype.itemsize == 1:  # fp8 partials: torch promotes no fp8 type, so w * o would refuse them
        parts = parts.float()
    _add_weighted(o, parts, w.mul_(inv).unsqueeze(-1), accumulate)
    _set_lse(la, m, den)
    return out


def check_stack(out: torch.Tensor, stack: torch.Tensor) -> None:
    """Raise ValueError unless ``stack`` is a stack of partials in wire form of ``out``'s rows."""
    if stack.dim() != out.dim() + 1 or stack.shape[1:] != (out.shape[0], wire_cols(out.shape[1] - 1, stack.dtype)):
        raise ValueError(f"merge of a packed partial {tuple(out.shape)} with a stack {tuple(stack.shape)} "
                         f"of {stack.dtype} (wire form: {wire_cols(out.shape[1] - 1, stack.dtype)} columns)")


def merge_many_into(acc: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """``acc <- acc (+) parts[0] (+) ... (+) parts[k-1]``, in place, as one pass (``merge_stack``).

    Args:
        acc: packed partial ``(rows, D + 1)`` fp32 (a tensor or a contiguous row slice of one).
        parts: ``(k, rows, wire_cols)``, partials in wire form of any float dtype.

    Returns:
        ``acc``.
    """
    check_stack(acc, parts)
    return merge_stack(acc, *split_wire(parts), True)


def merge_into(acc: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``acc <- acc (+) other``, in place (``merge_stack`` with one partial; ``other`` in wire form)."""
    return merge_many_into(acc, other.unsqueeze(0))


def merge(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (+) b`` as a new fp32 tensor (see ``merge_stack``): ``a`` packed fp32 rows, ``b`` in wire form."""
    return merge_into(a.clone(), b)


def merge_many(parts: torch.Tensor) -> torch.Tensor:
    """The merge of ``k`` partials in wire form ``(k, rows, wire_cols)``, k >= 1, as a new fp32 ``(rows, D + 1)``."""
    o, lse = split_wire(parts)
    out = torch.empty((*o.shape[1:-1], o.shape[-1] + 1), dtype=torch.float32, device=parts.device)
    return merge_stack(out, o, lse, False)


WIDE_BLOCK = 1 << 18
"""Elements of an fp8 raw sum taken through fp32 at once (1 MiB of fp32): the fp32 copies of a
whole chunk, three at once, would hold 12 bytes an element of it, which the memory model
(``cost.memory``) does not count."""


def sum_into(acc: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``acc <- acc + other`` in place (raw payload plans: 1-D); fp8 is summed through fp32,
    ``WIDE_BLOCK`` elements at a time."""
    return sum_many_into(acc, other.unsqueeze(0))


def sum_many_into(acc: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """``acc <- acc + parts[0] + ... + parts[k-1]`` in place (raw payloads: ``acc`` 1-D).

    One part at a time: a sum of the stack first would be a temporary of the chunk's size,
    which the memory model (``cost.memory``) does not count; fp8 through fp32, ``WIDE_BLOCK``
    elements at a time."""
    if acc.dtype.itemsize == 1 and acc.is_floating_point():
        for start in range(0, acc.shape[0], WIDE_BLOCK):
            block = acc[start:start + WIDE_BLOCK]
            total = block.float()
            for part in parts:
                total.add_(part[start:start + WIDE_BLOCK].float())
            block.copy_(total.to(acc.dtype))
    else:
        for part in parts:
            acc.add_(part)
    return acc


def sum_stack(acc: torch.Tensor, parts: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """``acc <- acc + parts[0] + ... + parts[k-1]`` (``accumulate``) or ``acc <- parts[0] + ...
    + parts[k-1]``, in place, as one expression (raw payloads; fp8 through fp32).

    The form ``treeattn.exec.kernels`` compiles: inductor reduces over k in registers, one
    kernel and no temporary. Run eager it would allocate the stack's sum, which the memory
    model does not count: eager callers use ``sum_many_into``."""
    wide = acc.dtype.itemsize == 1 and acc.is_floating_point()
    total = (parts.float() if wide else parts).sum(dim=0)
    if accumulate:
        total = total + (acc.float() if wide else acc)
    acc.copy_(total)
    return acc
