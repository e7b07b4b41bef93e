"""What a run of a job holds on its ranks, counted before anything is allocated (``job_bytes``),
and the refusal when a host or a GPU cannot hold it (``memory_problem``).

A run sets up every method before timing one, and each keeps what it set up to the end. Per rank:

* each payload's inputs, made once (the query and one layer's KV shard, or a raw buffer);
* each method's own buffers, the plan's and, with ``baselines``, every baseline's
  (``cost.memory.run_bytes`` of its plan, less the inputs);
* each method's checked results: the first run's and the last timed run's, copied on each rank
  that checks that method (``method_checks``) and kept until the run ends;
* the reference they are checked against (``exec.reference``), computed once the methods are
  timed: a raw payload's fp64 sum, kept by the ranks that check it, and while it is summed one
  block of ``FP64_BLOCK_ELEMENTS`` fp64 elements on every rank; an attention reference's packed
  rows, kept by those ranks and broadcast through every rank, and while it is computed, up to
  ``EXACT_MAX_KV_BYTES`` of KV, every shard gathered on rank 0 with the fp64 scores of one batch
  element (``exact_attention``), else each rank's fp64 block of ``reference.TOKENS`` tokens
  (``row_stats``);
* on gloo, the copy its all-gather or reduce-scatter makes inside the library call
  (``cost.memory.gloo_copy_bytes``), while a method runs;
* on a checking rank, the comparison's fp64 copies (``runner.relative_error``), in host
  memory, once the reference is made;
* where the explicit attention kernel runs, its working set (``_explicit_bytes``).

The copies inside the library calls are made while the methods run, the reference once they are
done: the larger of the two counts (in ``blocked`` order each method's reference is made, and
kept, before the next method runs: both). Before any of it, drawing the inputs holds a wider
copy of one of them (``_drawing_bytes``); the larger of that and the run counts. On an NCCL
rank the inputs, buffers and copies are on its GPU and the reference's kept rows in host
memory, which ``gpu=True`` leaves out (``host_bytes_beside_gpus`` counts it); on gloo everything
is in host memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from treeattn.cost.memory import gloo_copy_bytes, run_bytes
from treeattn.exec.attention import EXPLICIT_BLOCK_BYTES
from treeattn.exec.baselines import segments
from treeattn.exec.reference import EXACT_MAX_KV_BYTES, FP64_BLOCK_ELEMENTS, SAMPLED_ROWS, TOKENS
from treeattn.plan.baselines import Baseline, baselines_for, parse_result
from treeattn.plan.builders import build
from treeattn.plan.ir import OpKind
from treeattn.units import counted, format_size, format_sizes
from treeattn.workload import Payload, RawPayload, Workload

if TYPE_CHECKING:
    from treeattn.exec.runner import Job
    from treeattn.plan.ir import Plan

__all__ = ["job_bytes", "host_bytes_beside_gpus", "memory_problem", "method_checks", "baseline_layout", "own_rows",
           "reference_bytes", "gpu_peak_line"]

_FP64 = 8


def baseline_layout(plan: Plan) -> tuple[str, int | None]:
    """The layout (and root) of the baselines a plan is timed beside (``baselines_for``)."""
    if plan.result.startswith("ranks:"):
        return "all", None
    return parse_result(plan.result, plan.ranks)


def method_checks(plan: Plan, check: str, baseline: Baseline | None = None) -> tuple[tuple[int, ...], bool]:
    """The ranks that check a method's result (the plan's, or ``baseline``'s on its workload)
    under the run's ``check`` mode, and whether each holds only its own heads' rows (a
    ``heads`` baseline; a ``heads`` plan's accumulator has every row, each rank checking its own)."""
    world = plan.ranks
    if baseline is None:
        if plan.layout == "heads":
            return tuple(range(world)), False
        result_ranks = tuple(sorted(plan.result_ranks)) or (0,)
        return (result_ranks if check == "all" else result_ranks[:1]), False
    if baseline.result == "heads":
        return tuple(range(world)), True
    if baseline.result == "root":
        return (baseline.kwargs["root"],), False
    return (tuple(range(world)) if check == "all" else (0,)), False


def _input_bytes(payload: Payload, rank: int) -> int:
    """What a run makes once for every method of ``payload``: the query and the KV shard (one
    layer), or a raw payload's buffer."""
    if isinstance(payload, Workload):
        return payload.kv_bytes(rank) + payload.query_bytes
    return payload.payload_bytes


def _result_bytes(plan: Plan, rank: int, sliced: bool) -> int:
    """What one copy of a method's result holds on ``rank``: every row of the accumulator (fp32
    packed rows, or the raw payload's elements), or its own heads' rows where ``sliced`` (a
    narrower wire's result rows are counted at fp32: at most that)."""
    w = plan.workload
    rows = w.rows
    if sliced:
        start, stop = own_rows(plan, rank)
        rows = stop - start
    return rows * w.acc_row_bytes


def own_rows(plan: Plan, rank: int) -> tuple[int, int]:
    """The rows of ``rank``'s own heads, which a ``heads`` baseline of ``plan``'s payload leaves
    it (raw payloads: its segment of the elements)."""
    return plan.segments[rank] if plan.is_raw else segments(plan.workload, plan.ranks)[rank]


def _check_bytes(w: Payload) -> int:
    """What comparing a result with its reference holds in host memory (``runner.relative_error``):
    a raw payload's fp64 block; a copy of the rows in fp64, and the difference of the outputs
    and its magnitude (at most every row's)."""
    if isinstance(w, RawPayload):
        return min(w.rows, FP64_BLOCK_ELEMENTS) * _FP64
    return 3 * w.rows * (w.value_dim + 1) * _FP64


def reference_bytes(w: Payload, keepers: frozenset[int], contributors: frozenset[int] | None, rank: int,
                     gpu: bool) -> tuple[int, int]:
    """(kept, while computed) bytes of one reference on ``rank`` (see the module docstring)."""
    if isinstance(w, RawPayload):
        kept = 0 if gpu or rank not in keepers else w.rows * _FP64
        return kept, min(w.rows, FP64_BLOCK_ELEMENTS) * _FP64
    keeps = not gpu and rank in keepers
    who = range(w.ranks) if contributors is None else sorted(contributors)
    widest = max(w.head_dim, w.value_dim)
    if sum(w.kv_bytes(r) for r in range(w.ranks)) > EXACT_MAX_KV_BYTES:
        sampled = SAMPLED_ROWS + 2 * w.ranks  # at most: the first and last row of each rank's heads
        tokens = w.split[rank] if rank in who else 0
        stats = sampled * (w.value_dim + 2) * _FP64 * (w.ranks + 1)  # its own and every rank's, gathered
        return keeps * sampled * w.acc_row_bytes, stats + min(tokens, TOKENS) * widest * _FP64 + 3 * tokens * _FP64
    rows = w.rows * w.acc_row_bytes
    if rank != 0:
        return keeps * rows, rows  # the broadcast's buffer
    gathered = sum(w.kv_bytes(r) for r in who if r != 0)
    tokens = sum(w.split[r] for r in who)
    scores = w.q_heads * tokens * _FP64  # one batch element's
    # the largest shard's K or V of one batch element in fp64 (one buffer for every conversion,
    # held through), beside three of the scores' size (the scores, the scaled scores and the
    # log-sum-exp's own; or the scores, the shifted ones and the probabilities)
    shard = max((w.split[r] for r in who), default=0) * w.kv_heads * widest * _FP64
    results = w.rows * w.value_dim * _FP64  # the fp64 results of every batch element
    return keeps * rows, rows + gathered + results + 3 * scores + shard


def job_bytes(job: Job, ranks: Sequence[int], gpu: bool = False) -> int:
    """What ``ranks`` hold together at a run's fullest (the module docstring; ``gpu``: on an
    NCCL rank's GPU, the reference's kept rows left out)."""
    inputs, methods, references = _methods(job)
    workspace = max((_explicit_bytes(w, job.options.kernel) for w in inputs), default=0)
    return sum(_rank_bytes(r, inputs, methods, references, job.options.order == "blocked", gpu, workspace)
               for r in ranks)


def _explicit_bytes(w: Payload, kernel: str) -> int:
    """The explicit attention kernel's fp32 working set (``attention.EXPLICIT_BLOCK_BYTES`` at
    most), where it runs whatever the device (fp8 KV, Dv != D, or asked for): freed after each
    call, but kept by the allocator beside what is made after it (glibc's heap, a GPU's cache)."""
    if not isinstance(w, Workload) or (kernel != "explicit" and w.kv_dtype.nbytes > 1 and w.value_dim == w.head_dim):
        return 0
    group = w.q_heads // w.kv_heads
    need = 4 * w.batch * w.kv_heads * max(w.split) * (w.head_dim + w.value_dim + 2 * group)
    return min(need, EXPLICIT_BLOCK_BYTES)


def host_bytes_beside_gpus(job: Job, ranks: Sequence[int]) -> int:
    """What NCCL ranks ``ranks`` hold together in their host's memory, their GPUs holding the rest
    (``job_bytes`` with ``gpu``): the references the checking ranks keep, the comparison's fp64
    copies once they are made, and before, the host copy each rank hashes a result every rank
    holds from (``runner._RankRun.warm``)."""
    inputs, methods, references = _methods(job)
    total = 0
    for r in ranks:
        kept = sum(reference_bytes(w, frozenset(keepers), contributors, r, False)[0]
                   for (w, contributors), keepers in references.items())
        checking = max((_check_bytes(plan.workload) for plan, checks, *_ in methods if r in checks), default=0)
        hashed = max((_result_bytes(plan, r, False) for plan, _, _, _, every in methods if every), default=0)
        total += max(hashed, kept + checking)
    return total


def _methods(job: Job) -> tuple[list[Payload], list, dict]:
    """A job's payloads, its methods (plan, checking ranks, sliced, contributors, whether every
    rank holds its result) and its references (payload and contributors: the ranks that keep it)."""
    check = job.options.check
    methods: list[tuple[Plan, tuple[int, ...], bool, frozenset[int] | None, bool]] = []
    inputs: dict[str, Payload] = {}
    with_baselines: set[tuple[str, str]] = set()
    for pj in job.plans:
        plan, w = pj.plan, pj.plan.workload
        inputs.setdefault(repr(w), w)
        contributors = getattr(plan, "contributors", None)
        methods.append((plan, *method_checks(plan, check), None if contributors is None else frozenset(contributors),
                        plan.result == "all"))
        if job.options.baselines and (repr(w), plan.result) not in with_baselines:
            with_baselines.add((repr(w), plan.result))
            for b in baselines_for(w, *baseline_layout(plan), pj.ring_order):
                methods.append((build(b.name, w, plan.topology, **b.kwargs), *method_checks(plan, check, b), None,
                                b.result == "all"))
    references: dict[tuple[Payload, frozenset[int] | None], set[int]] = {}
    for plan, checks, _, contributors, _ in methods:
        references.setdefault((inputs[repr(plan.workload)], contributors), set()).update(checks)
    return list(inputs.values()), methods, references


def _rank_bytes(r: int, inputs: list[Payload], methods: list, references: dict, blocked: bool, gpu: bool,
                workspace: int) -> int:
    """``job_bytes`` of one rank: the larger of what it holds while it draws its inputs and
    while it runs the methods (the module docstring), ``workspace`` beside the latter."""
    have = sum(_input_bytes(w, r) for w in inputs)
    drawing = have + max((_drawing_bytes(w, r) for w in inputs), default=0)
    total = have + workspace
    for plan, checks, sliced, *_ in methods:
        # a raw plan's accumulator is a copy of its input: its own beside it
        total += run_bytes(plan, r) - (_input_bytes(plan.workload, r) if isinstance(plan.workload, Workload) else 0)
        if r in checks:
            total += 2 * _result_bytes(plan, r, sliced)
    made = [reference_bytes(w, frozenset(keepers), contributors, r, gpu)
            for (w, contributors), keepers in references.items()]
    running = 0 if gpu else max((gloo_copy_bytes(plan, op) for plan, *_ in methods for op in plan.programs[r]
                                 if op.kind is OpKind.COLLECTIVE), default=0)
    checking = 0 if gpu else max((_check_bytes(plan.workload) for plan, checks, *_ in methods if r in checks),
                                 default=0)
    kept = sum(k for k, _ in made)
    during = max(checking, *(d for _, d in made))
    if blocked:  # a method's reference is made, and kept, before the next method runs
        total += kept + max(running, during)
    else:
        total += max(running, kept + during)
    return max(total, drawing)


def _drawing_bytes(w: Payload, rank: int) -> int:
    """What drawing ``w``'s inputs on ``rank`` holds beside them (``exec.attention``): a raw
    buffer's int32 draw, an fp8 KV shard's fp16 one."""
    if isinstance(w, RawPayload):
        return w.rows * 4
    return 2 * w.kv_bytes(rank) if w.kv_dtype.nbytes == 1 else 0


def memory_problem(job: Job, ranks: Sequence[int], available: int | None, where: str, gpu: bool = False,
                   beside_gpus: bool = False) -> str | None:
    """Why ``ranks``, sharing ``available`` bytes of memory (``where``: a host, or one GPU with
    ``gpu``, or with ``beside_gpus`` the host of NCCL ranks, ``host_bytes_beside_gpus``), cannot
    hold a run of ``job`` at its fullest (``job_bytes``; the processes' own memory, torch's and
    the library's, comes on top), or None. Checked before
    anything is allocated (under a launcher, the verdict is shared once the ranks connect:
    ``runner.run_rank``), so nothing is measured first and no rank is left waiting on a peer
    that failed allocating."""
    if available is None:
        return None
    need = host_bytes_beside_gpus(job, ranks) if beside_gpus else job_bytes(job, ranks, gpu)
    if need <= available:
        return None
    pj = max(job.plans, key=lambda pj: sum(run_bytes(pj.plan, r) for r in ranks))  # named for the largest
    name = pj.named or pj.label
    if len(job.plans) > 1:
        name += f", with {counted(len(job.plans) - 1, 'other plan')} set up beside it"
    smaller = pj.smaller or "a smaller payload"
    who, fix = ((f"its {len(ranks)} ranks hold", f"use fewer ranks or {smaller}") if len(ranks) > 1
                else (f"rank {ranks[0]} holds", f"free that memory or use {smaller}"))
    if job.options.baselines:
        who += " (the baselines' buffers beside the plan's)"
        fix += ", or run without --baselines"
    if job.options.check == "all":  # each checking rank keeps the results it checks and the reference
        fix += ", or check on one rank (--check root)"
    needed, has = format_sizes(need, available)
    return f"{name}: {who} at least {needed} at once on {where}, which has {has} available; {fix}"


def gpu_peak_line(peaks: Sequence[int], job: Job) -> str:
    """The fullest rank's peak on its GPU (``runner.JobResult.gpu_peak_bytes``) beside what the
    memory check counted for that rank."""
    rank = max(range(len(peaks)), key=lambda r: peaks[r])
    return (f"GPU memory: the fullest rank, {rank}, peaked at {format_size(peaks[rank])} of tensors (torch's "
            f"allocator; NCCL's buffers and the CUDA context beside), where the memory check counted "
            f"{format_size(job_bytes(job, [rank], gpu=True))}")
