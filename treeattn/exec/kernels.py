"""The local kernels of a merge schedule, fused: one compiled kernel per call on CUDA.

Every merge the executor, the baselines and ``Merger`` run goes through here: the merge of a
stack of k received partials into an accumulator (``merge_into``), the merge of a stack into
a new partial (``merged``), the weighted rows (w o, w) the library-collective forms sum
(``weighted``) and their finish (``finish``). Each is one pure function of its inputs,
compiled by ``torch.compile`` (inductor: Triton on CUDA, C++ on the CPU) with dynamic shapes,
so one compilation serves every chunk size and fan-in; the eager functions of
``treeattn.exec.merge`` are the same arithmetic as about a dozen separate kernels.

Which runs: compiled on CUDA, eager on the CPU (``benchmarks/bench_merge_kernel.py``
measures both; eager wins there at the sizes the CPU ranks merge, and a compile per process
would cost seconds). ``TREEATTN_MERGE=eager`` or ``fused`` overrides it everywhere (the GPU
check measures both).

Legend as in ``treeattn.exec.merge``: packed partials ``(rows, D + 1)``, ``[:, D]`` the lse;
an empty row is (0, -inf). Inputs may be fp32, bf16, fp16 or fp8; the arithmetic is fp32.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from treeattn.exec import merge as eager

__all__ = ["MODES", "mode", "fused_on", "merge_into", "merged", "weighted", "finish", "compiled", "warm"]

MODES = ("auto", "fused", "eager")
_ENV = "TREEATTN_MERGE"
_FLOAT_MIN = torch.finfo(torch.float32).min
_NEG_INF = float("-inf")


def mode() -> str:
    """``auto`` (compiled on CUDA only), ``fused`` or ``eager``: from ``TREEATTN_MERGE``."""
    value = os.environ.get(_ENV, "auto") or "auto"
    if value not in MODES:
        raise ValueError(f"{_ENV}={value!r}; choose one of {', '.join(MODES)}")
    return value


def fused_on(device: torch.device) -> bool:
    """Whether the merges on ``device`` run as compiled kernels."""
    m = mode()
    return m == "fused" or (m == "auto" and device.type == "cuda")


# -- the arithmetic, one function each (the eager module's order of operations) -----------------

def _merge_into(acc: torch.Tensor, stack: torch.Tensor) -> None:
    parts = stack.float()
    oa, la = acc[:, :-1], acc[:, -1]
    ob, lb = parts[..., :-1], parts[..., -1]
    m = torch.maximum(la, lb.amax(dim=0))
    # The shift is clamped finite, so an empty side (-inf) weighs exp(-inf) = 0, never exp(nan).
    shift = m.clamp(min=_FLOAT_MIN)
    wa = torch.exp(la - shift)
    wb = torch.exp(lb - shift)
    total = wb.sum(dim=0) + wa
    inv = 1.0 / total.clamp(min=1.0)  # total >= 1 unless every side is empty (then o = 0)
    o = oa * (wa * inv).unsqueeze(1) + (ob * wb.unsqueeze(-1)).sum(dim=0) * inv.unsqueeze(1)
    acc.copy_(torch.cat([o, (torch.log(total) + m).unsqueeze(1)], dim=1))


def _merged(stack: torch.Tensor) -> torch.Tensor:
    parts = stack.float()
    o, lse = parts[..., :-1], parts[..., -1]
    m = lse.amax(dim=0)
    w = torch.exp(lse - m.clamp(min=_FLOAT_MIN))
    total = w.sum(dim=0)
    out_o = (o * (w / total.clamp(min=1.0)).unsqueeze(-1)).sum(dim=0)
    return torch.cat([out_o, (m + torch.log(total)).unsqueeze(1)], dim=1)


def _weights(lse: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), torch.exp(lse - shift))


def _weighted(part: torch.Tensor, m: torch.Tensor, dtype: torch.dtype, with_weight: bool) -> torch.Tensor:
    w = _weights(part[:, -1], m)
    o = w.unsqueeze(1) * part[:, :-1]
    return (torch.cat([o, w.unsqueeze(1)], dim=1) if with_weight else o).to(dtype)


def _finish(part: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    num, den = num.float(), den.float()
    live = den > 0
    safe = torch.where(live, den, torch.ones_like(den))
    o = torch.where(live.unsqueeze(1), num / safe.unsqueeze(1), torch.zeros_like(num))
    lse = torch.where(live, m + torch.log(safe), torch.full_like(m, _NEG_INF))
    part.copy_(torch.cat([o, lse.unsqueeze(1)], dim=1))


_COMPILED: dict[str, Callable] = {}


def compiled(name: str) -> Callable:
    """The compiled form of one of the functions above (compiled on first use, per process)."""
    fn = _COMPILED.get(name)
    if fn is None:
        fn = _COMPILED[name] = torch.compile({"merge_into": _merge_into, "merged": _merged,
                                              "weighted": _weighted, "finish": _finish}[name],
                                             dynamic=True, fullgraph=True)
    return fn


def _unbacked(*dims: tuple[torch.Tensor, int]) -> None:
    """Compile for any size of these dims, 0 and 1 included (dynamic shapes otherwise
    specialise sizes 0 and 1: a chunk of one row, or one received partial, would recompile
    in the middle of a run)."""
    mark = getattr(torch._dynamo.decorators, "mark_unbacked", torch._dynamo.maybe_mark_dynamic)
    for t, dim in dims:
        mark(t, dim)


def _plain(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors as aliases that are not views (same storage and strides): a compiled
    function guards on a view's base, and the executor's row slices have bases of every shape."""
    return tuple(t.detach() for t in tensors)


_FAILED: dict[str, str] = {}
"""Kernels whose compilation failed in this process (name: why); they run eager."""


def warm(device: torch.device, wire: torch.dtype) -> None:
    """Compile every fused kernel the executor may call on ``device`` with partials of ``wire``
    on the wire, before the ranks communicate (a compile takes seconds; a peer waiting on a
    rank that compiles would hit its timeout). Nothing happens where the merges run eager. A
    kernel that does not compile here (say, fp8 on a GPU without fp8 conversions) runs eager
    from then on, and one line on stderr says so."""
    if not fused_on(device):
        return
    acc = eager.empty_partial(2, 8, device)
    m = torch.zeros(2, device=device)
    calls = [("merge_into", lambda d=d: merge_into(acc, torch.zeros((2, 2, 9), dtype=d, device=device)))
             for d in dict.fromkeys((torch.float32, wire))]
    calls += [("merged", lambda: merged(torch.zeros((2, 2, 9), dtype=wire, device=device))),
              ("weighted", lambda: (weighted(acc, m, wire), weighted(acc, m, wire, False))),
              ("finish", lambda: finish(acc, m, torch.zeros((2, 8), device=device), torch.ones(2, device=device)))]
    for d in dict.fromkeys((torch.float32, wire)):  # the sums of (w o, w) rows: views of one buffer
        total = torch.ones((2, 9), dtype=d, device=device)
        calls.append(("finish", lambda t=total: finish(acc, m, t[:, :-1], t[:, -1])))
    for name, call in calls:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - any compile failure leaves that kernel eager
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _FAILED[name] = reason
            print(f"treeattn: the fused {name} kernel does not compile here ({reason}); it runs eager",
                  file=sys.stderr, flush=True)


def _fused(name: str, device: torch.device) -> bool:
    return fused_on(device) and name not in _FAILED


# -- what the executor calls ------------------------------------------------------------------

def merge_into(acc: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
    """``acc <- acc (+) stack[0] (+) ... (+) stack[k-1]`` in place (``(rows, D + 1)`` fp32 and
    ``(k, rows, D + 1)``); the rules of ``treeattn.exec.merge.merge_into``."""
    if stack.dim() != acc.dim() + 1 or stack.shape[1:] != acc.shape:
        raise ValueError(f"merge of a packed partial {tuple(acc.shape)} with a stack {tuple(stack.shape)}")
    if acc.shape[0] == 0:
        return acc
    if _fused("merge_into", acc.device):
        a, st = _plain(acc, stack)
        _unbacked((a, 0), (st, 0), (st, 1))
        compiled("merge_into")(a, st)
        return acc
    return eager.merge_many_into(acc, stack)


def merged(stack: torch.Tensor) -> torch.Tensor:
    """The merge of a stack ``(k, rows, D + 1)`` of partials, as a new fp32 partial."""
    if stack.shape[1] == 0 or not _fused("merged", stack.device):
        return eager.merge_many(stack)
    (st,) = _plain(stack)
    _unbacked((st, 0), (st, 1))
    return compiled("merged")(st)


def weighted(part: torch.Tensor, m: torch.Tensor, dtype: torch.dtype, with_weight: bool = True) -> torch.Tensor:
    """Rows ``(w o, w)`` (or ``w o`` alone) in ``dtype``, w = exp(lse - m): 0 for empty rows,
    and no exp(nan) where every rank is empty (m = -inf)."""
    if part.shape[0] == 0 or not _fused("weighted", part.device):
        w = _weights(part[:, -1], m)
        o = w.unsqueeze(1) * part[:, :-1]
        return (torch.cat([o, w.unsqueeze(1)], dim=1) if with_weight else o).to(dtype)
    p, mm = _plain(part, m)
    _unbacked((p, 0), (mm, 0))
    return compiled("weighted")(p, mm, dtype, with_weight)


def finish(part: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    """``part <- (num / den, m + log den)`` in place; the empty partial where den = 0."""
    if part.shape[0] == 0:
        return
    if _fused("finish", part.device):
        args = _plain(part, m, num, den)
        _unbacked(*((t, 0) for t in args))
        compiled("finish")(*args)
        return
    _finish_eager(part, m, num.float(), den.float())


def _finish_eager(part: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    live = den > 0
    safe = torch.where(live, den, torch.ones_like(den))
    part[:, :-1] = torch.where(live.unsqueeze(1), num / safe.unsqueeze(1), torch.zeros_like(num))
    part[:, -1] = torch.where(live, m + torch.log(safe), torch.full_like(m, _NEG_INF))
