"""The merge operator of docs/design.md section 1 on packed partials.

Legend: a *packed* partial is a ``(rows, D + 1)`` fp32 tensor, row ``r`` = (o_r, lse_r):
``[:, :D]`` the output, ``[:, D]`` the log-sum-exp. Rows are head-major (row = h * B + b,
``pack_heads``), so a chunk of rows (``Plan.chunk_range``) is one contiguous slice and so is
a range of query heads. The *empty* partial is (0, -inf): the identity of the merge.
"""

from __future__ import annotations

import torch

__all__ = ["empty_partial", "clear_partial", "pack", "unpack", "pack_heads", "pack_heads_into", "unpack_heads",
           "merge_into", "merge", "merge_many", "merge_many_into", "sum_into", "sum_many_into"]

_NEG_INF = float("-inf")
_FLOAT_MIN = torch.finfo(torch.float32).min


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


def pack_heads(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Pack a model's ``o (B, Hq, D)`` and ``lse (B, Hq)`` into head-major rows ``(Hq * B, D + 1)`` fp32."""
    bsz, hq, d = o.shape
    return pack_heads_into(torch.empty(hq * bsz, d + 1, dtype=torch.float32, device=o.device), o, lse)


def pack_heads_into(out: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``pack_heads`` into an existing ``(Hq * B, D + 1)`` buffer (no allocation)."""
    bsz, hq, d = o.shape
    view = out.view(hq, bsz, d + 1)
    view[:, :, :d].copy_(o.transpose(0, 1))
    view[:, :, d].copy_(lse.transpose(0, 1))
    return out


def unpack_heads(packed: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``o (B, H, D)`` and ``lse (B, H)`` of head-major packed rows ``(H * B, D + 1)``."""
    rows, d1 = packed.shape
    view = packed.view(rows // batch, batch, d1).transpose(0, 1)
    return view[..., :-1], view[..., -1]


def merge_into(acc: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``acc <- acc (+) other``, in place, row by row (fp32).

    Stable for logits of any finite magnitude; (x, -inf) is exactly the identity for any
    finite x; two empty rows give (0, -inf); never NaN for finite outputs and lse in
    [-inf, +inf).

    Args:
        acc: packed partial (a tensor or a contiguous row slice of one), updated in place.
        other: packed partial with the same shape (any float dtype; merged in fp32).

    Returns:
        ``acc``.
    """
    if acc.shape != other.shape:
        raise ValueError(f"merge of packed partials with shapes {tuple(acc.shape)} and {tuple(other.shape)}")
    oa, la = unpack(acc)
    ob, lb = unpack(other if other.dtype == torch.float32 else other.float())
    m = torch.maximum(la, lb)
    # Shift by the row max so the larger weight is exactly 1 (no overflow); clamping the
    # shift keeps it finite, so an empty side (-inf) gets weight exp(-inf) = 0, not exp(nan).
    shift = m.clamp(min=_FLOAT_MIN)
    wa = (la - shift).exp_()
    wb = (lb - shift).exp_()
    total = wa + wb
    # m + log(0) = -inf + -inf = -inf: two empty rows stay empty without a branch.
    la.copy_(torch.log(total).add_(m))
    # total >= 1 unless both sides are empty (then 0): dividing by max(total, 1) makes o = 0 there.
    inv = total.clamp_(min=1.0).reciprocal_()
    oa.mul_(wa.mul_(inv).unsqueeze(1)).addcmul_(ob, wb.mul_(inv).unsqueeze(1))
    return acc


def merge(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (+) b`` as a new tensor (see ``merge_into``)."""
    return merge_into(a.to(dtype=torch.float32).clone(), b)


def merge_many(parts: torch.Tensor) -> torch.Tensor:
    """Merge ``k`` packed partials at once (same rules as ``merge_into``).

    Args:
        parts: ``(k, rows, D + 1)``, k >= 1.

    Returns:
        ``(rows, D + 1)``: the merge of all k.
    """
    parts = parts.to(dtype=torch.float32)
    o, lse = parts[..., :-1], parts[..., -1]
    m = lse.max(dim=0).values
    w = torch.exp(lse - m.clamp(min=_FLOAT_MIN))
    total = w.sum(dim=0)
    out_o = (o * (w / total.clamp(min=1.0)).unsqueeze(-1)).sum(dim=0)
    return torch.cat([out_o, (m + torch.log(total)).unsqueeze(1)], dim=1)


def merge_many_into(acc: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """``acc <- acc (+) parts[0] (+) ... (+) parts[k-1]``, in place, as one pass (fp32).

    A step that receives k partials for one chunk merges them with one set of kernels
    instead of k (the same rules as ``merge_into``; k = 1 is exactly ``merge_into``).

    Args:
        acc: packed partial ``(rows, D + 1)`` (a tensor or a contiguous row slice of one).
        parts: ``(k, rows, D + 1)``, any float dtype.

    Returns:
        ``acc``.
    """
    if parts.dim() != acc.dim() + 1 or parts.shape[1:] != acc.shape:
        raise ValueError(f"merge of a packed partial {tuple(acc.shape)} with a stack {tuple(parts.shape)}")
    if parts.shape[0] == 1:
        return merge_into(acc, parts[0])
    parts = parts if parts.dtype == torch.float32 else parts.float()
    oa, la = unpack(acc)
    ob, lb = parts[..., :-1], parts[..., -1]
    m = torch.maximum(la, lb.amax(dim=0))
    shift = m.clamp(min=_FLOAT_MIN)
    wa = (la - shift).exp_()
    wb = (lb - shift).exp_()
    total = wb.sum(dim=0).add_(wa)
    la.copy_(torch.log(total).add_(m))
    inv = total.clamp_(min=1.0).reciprocal_()
    others = (ob * wb.unsqueeze(-1)).sum(dim=0)
    oa.mul_(wa.mul_(inv).unsqueeze(1)).add_(others.mul_(inv.unsqueeze(1)))
    return acc


def sum_into(acc: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``acc <- acc + other`` in place (raw payload plans); fp8 is summed through fp32."""
    if acc.dtype.itemsize == 1 and acc.is_floating_point():
        acc.copy_((acc.float() + other.float()).to(acc.dtype))
    else:
        acc.add_(other)
    return acc


def sum_many_into(acc: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """``acc <- acc + parts[0] + ... + parts[k-1]`` in place, as one pass (raw payloads)."""
    if parts.shape[0] == 1:
        return sum_into(acc, parts[0])
    if acc.dtype.itemsize == 1 and acc.is_floating_point():
        acc.copy_((acc.float() + parts.float().sum(dim=0)).to(acc.dtype))
    else:
        acc.add_(parts.sum(dim=0))
    return acc
