"""The local arithmetic of a merge schedule, fused: one compiled kernel per call on CUDA.

Every merge the executor, the baselines and ``Merger`` run goes through here: the merge of a
stack of k partials into an accumulator (``merge_into``) or into a buffer of its own
(``merged_into``, ``merged``), the weighted rows (w o, w) the library-collective forms sum
(``weighted``), decode context parallel's correction by the gathered lse (``corrected``),
their finish (``finish``), and a raw payload's sum of a stack into its buffer (``add_stack_into``,
``sum_stack_into``). The arithmetic is ``treeattn.exec.merge``'s,
written once there: this module runs those functions either as they are (eager, a dozen
small kernels) or compiled by ``torch.compile`` (inductor: Triton on CUDA, C++ on the CPU)
with dynamic shapes, so one compilation serves every chunk size and fan-in.

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

__all__ = ["MODES", "mode", "fused_on", "merge_label", "merge_into", "merged_into", "merged", "weighted", "corrected",
           "finish", "add_stack_into", "sum_stack_into", "compiled", "warm", "warm_sum"]

MODES = ("auto", "fused", "eager")
_ENV = "TREEATTN_MERGE"


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


def _finish_packed(part: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    eager.finish(part[:, :-1], part[:, -1], m, num, den)


_FUNCTIONS: dict[str, Callable] = {"merge": eager.merge_stack, "weighted": eager.weighted, "corrected": eager.corrected,
                                   "finish": _finish_packed, "sum": eager.sum_stack}
"""What is compiled: the functions of ``treeattn.exec.merge`` themselves."""

_COMPILED: dict[str, Callable] = {}


def compiled(name: str) -> Callable:
    """The compiled form of a function of ``_FUNCTIONS`` (compiled on first use, per process)."""
    fn = _COMPILED.get(name)
    if fn is None:
        fn = _COMPILED[name] = torch.compile(_FUNCTIONS[name], dynamic=True, fullgraph=True)
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


def warm(device: torch.device, wire: torch.dtype, head_dim: int = 8) -> None:
    """Compile every fused kernel the executor may call on ``device`` with partials of ``wire``
    on the wire and ``head_dim`` values a row, before the ranks communicate (a compile takes
    seconds; a peer waiting on a rank that compiles would hit its timeout). The head dim
    decides whether a narrow wire's lse is a view of the rows or a copy
    (``treeattn.exec.merge.split_wire``), which a compiled kernel tells apart by its strides;
    every other size is dynamic. Nothing happens where the merges run eager. A kernel that
    does not compile here (say, fp8 on a GPU without fp8 conversions) runs eager from then
    on, and one line on stderr says so."""
    if not fused_on(device):
        return
    d = head_dim
    calls: list = []
    # Two row counts: a chunk of one row (a heads segment of one head at B = 1) compiles a
    # variant of its own (a size-1 column is dense, which the guards tell apart).
    for rows in (2, 1):
        acc = eager.empty_partial(rows, d, device)
        m = torch.zeros(rows, device=device)
        calls += [("merge", lambda dt=dt, acc=acc, n=rows: merge_into(
                      acc, torch.zeros((2, n, eager.wire_cols(d, dt)), dtype=dt, device=device)))
                  for dt in dict.fromkeys((torch.float32, wire))]
        calls += [("merge", lambda n=rows: merged(torch.zeros((2, n, eager.wire_cols(d, wire)), dtype=wire,
                                                              device=device))),
                  ("weighted", lambda acc=acc, m=m: (weighted(acc, m, wire), weighted(acc, m, wire, False))),
                  ("corrected", lambda acc=acc, n=rows: corrected(acc, torch.zeros((2, n), device=device), wire))]
        # the sums of w o apart from the weights' (fp32): widened (the plan's), or on the wire (a baseline's)
        calls += [("finish", lambda acc=acc, m=m, n=rows, dt=dt: finish(acc, m, torch.zeros((n, d), dtype=dt,
                                                                                          device=device),
                                                                        torch.ones(n, device=device)))
                  for dt in dict.fromkeys((torch.float32, wire))]
        for dt in dict.fromkeys((torch.float32, wire)):  # the sums of (w o, w) rows: views of one buffer
            total = torch.ones((rows, d + 1), dtype=dt, device=device)
            calls.append(("finish", lambda t=total, acc=acc, m=m: finish(acc, m, t[:, :-1], t[:, -1])))
    _compile(calls)


def warm_sum(device: torch.device, dtype: torch.dtype) -> None:
    """``warm`` for a raw payload plan of ``dtype``: its one fused kernel, the sum of a stack."""
    if not fused_on(device):
        return
    calls: list = []
    for rows in (2, 1):  # as ``warm``: a one-element chunk compiles a variant of its own
        buf = torch.zeros(rows, dtype=dtype, device=device)
        stack = torch.zeros((2, rows), dtype=dtype, device=device)
        calls.append(("sum", lambda b=buf, s=stack: (add_stack_into(b, s), sum_stack_into(b, s))))
    _compile(calls)


def _compile(calls: list) -> None:
    """Run each (name, call) once; a kernel whose call fails runs eager from then on (``warm``)."""
    for name, call in calls:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - any compile failure leaves that kernel eager
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _FAILED[name] = reason
            print(f"treeattn: the fused {name} kernel does not compile here ({reason}); it runs eager",
                  file=sys.stderr, flush=True)


def merge_label(device: torch.device) -> str:
    """How the merges on ``device`` ran, for a run's report: ``eager``, ``fused``, or ``fused``
    naming the kernels that did not compile and ran eager (``warm``): its line on stderr lands
    in a locally launched rank's log, which a run that succeeds removes, so the report is the
    one place that says so."""
    if not fused_on(device):
        return "eager"
    if not _FAILED:
        return "fused"
    return f"fused, but {', '.join(sorted(_FAILED))} eager (did not compile)"


def _fused(name: str, device: torch.device) -> bool:
    return fused_on(device) and name not in _FAILED


# -- what the executor calls ------------------------------------------------------------------

def _merge(out: torch.Tensor, stack: torch.Tensor, accumulate: bool) -> torch.Tensor:
    eager.check_stack(out, stack)
    if out.shape[0] == 0:
        return out
    parts, lse = eager.split_wire(stack)
    if _fused("merge", out.device):
        o, st, ls = _plain(out, parts, lse)
        # The lse's rows too: a backed size is equated with any other of equal value when
        # compiled (the lse view's storage offset is 2 for fp8 at D = 8, as warm's rows are),
        # and a run with other row counts would fail that guard and compile mid-run.
        _unbacked((o, 0), (st, 0), (st, 1), (ls, 0), (ls, 1))
        compiled("merge")(o, st, ls, accumulate)
        return out
    return eager.merge_stack(out, parts, lse, accumulate)


def merge_into(acc: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
    """``acc <- acc (+) stack[0] (+) ... (+) stack[k-1]`` in place (``(rows, D + 1)`` fp32 and
    ``(k, rows, wire_cols)`` in wire form): ``treeattn.exec.merge.merge_stack``."""
    return _merge(acc, stack, True)


def merged_into(out: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
    """``out <- stack[0] (+) ... (+) stack[k-1]`` in place (``out``'s rows do not take part)."""
    return _merge(out, stack, False)


def merged(stack: torch.Tensor) -> torch.Tensor:
    """The merge of a stack ``(k, rows, wire_cols)`` of partials in wire form, as a new fp32 partial."""
    d = stack.shape[-1] - eager.wire_cols(0, stack.dtype)
    return merged_into(torch.empty((stack.shape[1], d + 1), dtype=torch.float32, device=stack.device), stack)


def add_stack_into(acc: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
    """``acc <- acc + stack[0] + ... + stack[k-1]`` in place (a raw payload's buffer ``(rows,)``
    and a stack ``(k, rows)`` of its dtype): ``treeattn.exec.merge.sum_stack``."""
    return _sum(acc, stack, True)


def sum_stack_into(out: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
    """``out <- stack[0] + ... + stack[k-1]`` in place (``out``'s elements do not take part)."""
    return _sum(out, stack, False)


def _sum(out: torch.Tensor, stack: torch.Tensor, accumulate: bool) -> torch.Tensor:
    if out.shape[0] == 0:
        return out
    if _fused("sum", out.device):
        o, st = _plain(out, stack)
        _unbacked((o, 0), (st, 0), (st, 1))
        compiled("sum")(o, st, accumulate)
        return out
    if not accumulate:  # eager: the first part copied, the rest added one at a time (no temporary)
        out.copy_(stack[0])
        stack = stack[1:]
        if stack.shape[0] == 0:
            return out
    return eager.sum_many_into(out, stack)


def weighted(part: torch.Tensor, m: torch.Tensor, dtype: torch.dtype, with_weight: bool = True) -> torch.Tensor:
    """Rows ``(w o, w)`` (or ``w o`` alone) in ``dtype``: ``treeattn.exec.merge.weighted``."""
    if part.shape[0] == 0 or not _fused("weighted", part.device):
        return eager.weighted(part, m, dtype, with_weight)
    p, mm = _plain(part, m)
    _unbacked((p, 0), (mm, 0))
    return compiled("weighted")(p, mm, dtype, with_weight)


def corrected(part: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, w o) of decode context parallel's correction: ``treeattn.exec.merge.corrected``
    (eager, the log-sum-exp alone is nine kernels on a GPU)."""
    if part.shape[0] == 0 or not _fused("corrected", part.device):
        return eager.corrected(part, lses, dtype)
    p, ls = _plain(part, lses)
    _unbacked((p, 0), (ls, 0), (ls, 1))
    return compiled("corrected")(p, ls, dtype)


def finish(part: torch.Tensor, m: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    """``part <- (num / den, m + log den)`` in place: ``treeattn.exec.merge.finish`` on its columns."""
    if part.shape[0] == 0:
        return
    if _fused("finish", part.device):
        p, mm, n, d = _plain(part, m, num, den)
        _unbacked(*((t, 0) for t in (p, mm, n, d)))
        compiled("finish")(p, mm, n, d)
        return
    eager.finish(part[:, :-1], part[:, -1], m, num, den)
