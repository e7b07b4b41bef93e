"""What every rank does in a run: build inputs, run each method, check it, time it.

One process group runs a whole ``Job`` (several plans, each with its baselines), so tests
and benchmarks pay the process start-up once. Per method: one untimed run whose result is
checked, ``warmup`` untimed runs, then ``repeats`` timed runs. By default (``order``
``interleaved``) the timed runs of all methods are dealt out in rounds, each method once per
round: on a shared host a slow spell then lands on every method compared, not on one.
When all ranks share one host's monotonic clock, every run starts at one agreed instant
(``Comm.release``: a little after the last rank arrived, agreed through shared memory so a
rank that finished early sends nothing while others still run; everyone sleeps until then) and
its time runs from that instant to the moment the last rank finished; a rank that only
learns the instant after it has passed starts late, and then the run is timed from that
rank's start (the margin grows for the next run). Elsewhere a run starts after a barrier
and its time is the maximum over ranks of each rank's own wall time. The last
iteration's result is checked as well.

With ``wrap_up`` on, a signal (Ctrl-C, SIGTERM, ``interrupts.WRAP_UP_SIGNAL`` from a local
launcher) once the first timed run has begun asks to stop and keep what was measured (before, it
stops at once): every rank passes the request on at the next run's start (``Comm.release``, or
the barrier), so all stop before the same run, and each method with a timed run is finished
over its runs done (its first result checked, the last only where every run was done); the
``JobResult`` says which signal (``stopped``). A second signal some seconds later stops at
once, as without it.

On CUDA the end of a run is a CUDA event (``Comm.mark``), read once the device has passed it
(``Comm.settle``, which also enforces the op deadline), so nothing synchronises the host
inside a timed run; with ``graph`` on (NCCL's default) every method is captured as a CUDA
graph after its warm-up runs and the timed runs replay it (``treeattn.exec.graphs``).
Rank 0 returns the ``JobResult``; other ranks return None.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from treeattn.errors import InputError, PlanInvalidError
from treeattn.exec import kernels as fused
from treeattn.exec.attention import make_kv_shard, make_query, make_raw, resolve_kernel, torch_dtype
from treeattn.exec.baselines import run_attention_baseline, run_raw_baseline
from treeattn.exec.comm import BufferPool, Comm, CommError
from treeattn.exec.deadline import LONGEST_TIMEOUT_S, SETUP_TIMEOUT_S, check_iterations
from treeattn.exec.footprint import baseline_layout, memory_problem, method_checks, own_rows
from treeattn.exec.graphs import Graphed, capture
from treeattn.exec.interpreter import MeasuredOp, PlanExecutor, RankInputs
from treeattn.exec.issue_order import nccl_order_problem
from treeattn.exec.merge import unpack
from treeattn.exec.reference import FP64_BLOCK_ELEMENTS, Reference, compute_reference
from treeattn.exec.rendezvous import join
from treeattn.interrupts import WrapUp, raise_interrupt, wrap_up_on_signals
from treeattn.plan.baselines import baselines_for
from treeattn.plan.ir import OpKind, Plan
from treeattn.units import DType
from treeattn.workload import Payload, RawPayload, Workload

__all__ = ["RunOptions", "PlanJob", "Job", "Measurement", "JobResult", "Progress", "TIMED_RUNS", "tolerance",
           "relative_error", "run_rank", "placement_problem", "gpu_of", "check_against",
           "stop_wait_s"]

Progress = Callable[[int, int, str], None]
"""``progress(runs done, runs known, what)``: how far rank 0 has got (``run_rank``)."""
TIMED_RUNS = "timed runs"
"""How ``what`` begins once rank 0 times a run (before: its checked and warm-up runs)."""


_MIN_MARGIN_S = 0.002
_MAX_MARGIN_S = 0.05
"""Bounds of the time between the last rank's arrival and the agreed start of a run."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run measures and checks (the flags of ``treeattn run``)."""

    repeats: int = 10
    """Timed iterations per method (unless its ``PlanJob`` sets its own)."""
    warmup: int = 2
    """Untimed iterations before the timed ones (after the checked first run)."""
    timeout_s: float = 5.0
    """Deadline of one measured operation (a step's wait, one collective)."""
    setup_timeout_s: float = SETUP_TIMEOUT_S
    """Deadline of start-up, barriers, reference broadcast and result gathering."""
    backend: str | None = None
    """``gloo`` or ``nccl``; None follows the devices (NCCL when CUDA is present)."""
    check: str = "root"
    """``root``: the plan's first result rank checks (rank 0 for baselines); ``all``: every result
    rank. In a ``heads`` layout every rank checks its own rows either way."""
    seed: int = 0
    baselines: bool = False
    """Also run the baselines on the plan's workload (once per distinct workload in a job)."""
    kernel: str = "auto"
    """Local attention kernel (see ``treeattn.exec.attention.KERNELS``)."""
    order: str = "interleaved"
    """``interleaved``: after every method's checked and warm-up runs, ``repeats`` rounds that
    time each method once (shuffled per round), so methods compared with each other share the
    host's slow and fast spells; ``blocked``: each method's runs back to back."""
    graph: bool | None = None
    """Replay each method from a CUDA graph after its warm-up (NCCL only); None: on with NCCL."""
    wrap_up: bool = False
    """A signal while the methods run stops every rank before one run and keeps the runs done
    (``JobResult.stopped``), instead of ending the run at once with nothing (see the module)."""

    def __post_init__(self) -> None:
        check_iterations(self.repeats, self.warmup)
        for name, value in (("timeout", self.timeout_s), ("set-up timeout", self.setup_timeout_s)):
            if not 0 < value <= LONGEST_TIMEOUT_S:  # also NaN; inf would fail only in a rank, after the start
                raise InputError(f"{name} must be > 0 and at most {LONGEST_TIMEOUT_S:g} seconds, got {value}")
        if self.backend not in (None, "gloo", "nccl"):
            raise InputError(f"unknown backend {self.backend!r}; choose gloo or nccl")
        if self.check not in ("root", "all"):
            raise InputError(f"unknown check mode {self.check!r}; choose root or all")
        if self.order not in ("interleaved", "blocked"):
            raise InputError(f"unknown order {self.order!r}; choose interleaved or blocked")
        if self.graph and self.backend == "gloo":
            raise InputError("CUDA graphs need the NCCL backend (CUDA devices); use --no-graph with gloo")


@dataclass(frozen=True, slots=True)
class PlanJob:
    label: str
    """What rows call the plan (its file name)."""
    plan: Plan
    repeats: int | None = None
    """Timed runs of this plan and of the baselines run on its workload (None: the options')."""
    ring_order: tuple[int, ...] | None = None
    """The ring the ring-attention baseline runs on (``treeattn.search.rings.ring_order`` of the
    topology; None: rank order). The prediction builds its plan on the same ring."""
    named: str = ""
    """How an error before the run names the plan, where its label is no name a user gave
    (calibrate's cases, by the flag that sized them); "" for the label."""
    smaller: str = ""
    """What makes its payload smaller, for such an error's fix ("a lower --max-size"); "" for
    "a smaller payload"."""

    def __post_init__(self) -> None:
        if self.ring_order is not None and sorted(self.ring_order) != list(range(self.plan.ranks)):
            raise InputError(f"the ring order of {self.label!r} must list the {self.plan.ranks} ranks once each")
        if self.repeats is not None:
            check_iterations(self.repeats, where=f"of {self.label!r}")


@dataclass(frozen=True, slots=True)
class Job:
    plans: tuple[PlanJob, ...]
    options: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        if not self.plans:
            raise InputError("a run needs at least one plan")
        labels = [pj.label for pj in self.plans]
        if len(set(labels)) != len(labels):
            raise InputError(f"plan labels of one run must differ, got {labels}")
        counts = sorted({pj.plan.ranks for pj in self.plans})
        if len(counts) > 1:
            raise InputError(f"plans of one run must have the same rank count, got {counts}")

    @property
    def ranks(self) -> int:
        return self.plans[0].plan.ranks


@dataclass(frozen=True, slots=True)
class Measurement:
    """One method on one plan's workload: times (max over ranks per iteration) and check."""

    label: str
    method: str
    """``plan`` or a baseline name."""
    kernel: str
    """Local attention kernel used (``none`` for raw payloads)."""
    times_us: tuple[float, ...]
    max_rel_err: float
    """Largest relative error over the checked ranks and the two checked iterations."""
    tolerance: float
    checked_ranks: tuple[int, ...]
    timeline: tuple[MeasuredOp, ...] = ()
    """``plan`` only: every rank's ops in the last timed iteration."""
    cpu_us: tuple[float, ...] = ()
    """Per rank, the median over the timed iterations of the CPU time its process used
    (every thread, the library's included) from its start to its end."""
    starts_s: tuple[float, ...] = ()
    """When each timed iteration started on rank 0 (seconds on its monotonic clock): where the
    runs of one job's methods fell in time (see ``RunOptions.order``)."""
    same_bits: bool | None = None
    """Where every rank ends with the whole result (``all``): whether their first results were
    the same bits (tensor parallelism goes on from every rank's); None elsewhere."""

    @property
    def correct(self) -> bool:
        return self.max_rel_err <= self.tolerance

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_us)

    def quantile_us(self, q: float) -> float:
        """Linear-interpolated quantile of the iteration times."""
        ts = sorted(self.times_us)
        pos = q * (len(ts) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(ts) - 1)
        return ts[lo] + (ts[hi] - ts[lo]) * (pos - lo)

    @property
    def spread_us(self) -> float:
        """p90 - p10 of the iteration times."""
        return self.quantile_us(0.9) - self.quantile_us(0.1)


@dataclass(frozen=True, slots=True)
class JobResult:
    measurements: tuple[Measurement, ...]
    backend: str
    device: str
    world: int
    merge: str = "eager"
    """How the merges ran: ``fused`` (compiled kernels) or ``eager`` (``kernels.merge_label``:
    rank 0's, naming any kernel that did not compile)."""
    graphs: bool = False
    """Whether the timed runs replayed CUDA graphs: every method's (False where a capture failed)."""
    uncaptured: tuple[str, ...] = ()
    """With graphs asked for, the methods that ran eager because their capture failed."""
    stopped: int = 0
    """The signal that asked the run to stop (``RunOptions.wrap_up``), 0: none. Each measurement
    is over its runs done, ``len(times_us)`` of its ``repeats`` (all of them where the signal
    came after the last run's start)."""
    repeats: tuple[int, ...] = ()
    """The timed runs each measurement was to have, in their order."""
    untimed: tuple[str, ...] = ()
    """Where a signal stopped the run: the methods it stopped before their first timed run."""
    gpu_peak_bytes: tuple[int, ...] = ()
    """On CUDA, each rank's peak of torch's allocator over the run (``max_memory_allocated``:
    its tensors, not NCCL's own buffers nor the CUDA context), to set beside the memory check's
    count (``exec.footprint``); empty on the CPU."""

    @property
    def graphs_text(self) -> str:
        """``on``, ``off``, or ``on, but not for ...`` (the captures that failed)."""
        if self.uncaptured:
            return f"on, but not for {', '.join(self.uncaptured)} (capture failed: see the rank's log)"
        return "on" if self.graphs else "off"


_TOL = {DType.FP32: 1e-5, DType.BF16: 2e-2, DType.FP16: 2e-2, DType.FP8: 2e-2}


_UNIT_ROUNDOFF = {DType.FP32: 2.0**-24, DType.BF16: 2.0**-8, DType.FP16: 2.0**-11, DType.FP8: 2.0**-4}
"""Relative error of one rounding to each dtype (half its spacing; fp8 is e4m3)."""


def tolerance(payload: Payload, roundings: int = 1) -> float:
    """Largest accepted relative error: fp32 1e-5, 16-bit or 8-bit inputs or partials 2e-2,
    or, when more, the partials' ``roundings`` to their dtype on the wire at most (each one off
    by its unit roundoff; a merge, a convex combination, carries an error on and adds none):
    e4m3 partials are 6 % off after one; raw payloads are sums of small integers, exact in any
    order: 0."""
    if isinstance(payload, RawPayload):
        return 0.0
    worst = roundings * _UNIT_ROUNDOFF[payload.partial_dtype]
    # however many roundings: a result half off is no rounding's (nor is all zeros, 1 off)
    return max(_TOL[payload.kv_dtype], _TOL[payload.partial_dtype], min(worst, 0.5))


_SUMMING = ("allreduce", "reducescatter", "reduce")
"""Library collectives that sum (``sum_roundings``)."""


def sum_roundings(wire: DType, ranks: int) -> int:
    """Roundings to the wire's dtype in a library sum of ``ranks`` partials, counted for its sum
    of w o and its sum of w apart, since the result is their quotient: each a 16-bit dtype's
    input rounding and then each of a ring's p - 1 partial sums, which NCCL's and gloo's rings
    keep in that dtype; fp8 its input's alone (summed in fp32 and finished from that sum,
    ``Comm.all_reduce``'s ``widen``)."""
    return 2 * (1 if wire.nbytes == 1 else ranks)

_OFF_THE_WIRE = ("lse", "den", "q")
"""Parts a collective moves in their own dtype, never the wire's: the lse column and the
weights' sum (fp32, ``merge.lse_column``, ``merge.weights``) and the query (its input dtype)."""


def wire_roundings(plan: Plan) -> int:
    """The most times a partial of ``plan`` is rounded to the wire's dtype on its way: once a
    step that moves data (transfers and collectives), ``sum_roundings`` a step whose library
    collective sums the wire (as the baselines' own sums are allowed), none for a collective
    of a part that does not travel in the wire's dtype (``_OFF_THE_WIRE``)."""
    per_step: dict[int, int] = {}
    for prog in plan.programs:
        for op in prog:
            if op.kind is OpKind.COMPUTE:
                continue
            if op.kind is OpKind.COLLECTIVE and op.part in _OFF_THE_WIRE:
                count = 0
            elif op.kind is OpKind.COLLECTIVE and op.coll in _SUMMING and op.reduce in ("sum", "merge"):
                w = plan.workload
                count = sum_roundings(w.partial_dtype if isinstance(w, Workload) else w.dtype, plan.ranks)
            else:
                count = 1
            per_step[op.step] = max(per_step.get(op.step, 0), count)
    return max(1, sum(per_step.values()))


def relative_error(out: torch.Tensor, ref: torch.Tensor, raw: bool) -> float:
    """Max-norm relative error of ``out`` against ``ref``; for partials the larger of the
    output's error and the lse's (absolute below 1, relative above); NaN counts as infinite.
    Compared on the CPU, wherever either was made (a CUDA reference in the GPU tests)."""
    ref = ref.to("cpu", torch.float64)
    if raw:
        # Block by block through one fp64 buffer: the buffers of a raw payload are the size of
        # the plan's own, so a whole fp64 copy here would outweigh its working set.
        lo, hi = ref.aminmax()
        scale = max(abs(lo.item()), abs(hi.item()), 1e-30)
        flat_out, flat_ref, n = out.detach().reshape(-1), ref.reshape(-1), ref.numel()
        block = torch.empty(min(n, FP64_BLOCK_ELEMENTS), dtype=torch.float64)
        err = 0.0
        for start in range(0, n, FP64_BLOCK_ELEMENTS):
            stop = min(n, start + FP64_BLOCK_ELEMENTS)
            part = block[:stop - start].copy_(flat_out[start:stop])
            worst = part.sub_(flat_ref[start:stop]).abs_().max().item()
            if math.isnan(worst):
                return math.inf
            err = max(err, worst / scale)
        return err
    out = out.detach().to("cpu", torch.float64)
    o, lse = unpack(out)
    o_ref, lse_ref = unpack(ref)
    err_o = (o - o_ref).abs().max().item() / max(o_ref.abs().max().item(), 1e-30)
    both_empty = torch.isneginf(lse) & torch.isneginf(lse_ref)
    diff = torch.where(both_empty, torch.zeros_like(lse), (lse - lse_ref).abs())
    finite = lse_ref[torch.isfinite(lse_ref)]
    err_l = diff.max().item() / max(1.0, finite.abs().max().item() if finite.numel() else 1.0)
    err = max(err_o, err_l)
    return math.inf if math.isnan(err) else err


def check_against(out: torch.Tensor, ref: Reference, span: tuple[int, int] | None, sliced: bool, raw: bool) -> float:
    """``relative_error`` of a method's result on the rows the reference holds: every row, or
    those of ``span`` (a heads layout's rows; ``sliced``: ``out`` holds only them)."""
    start, stop = span if span is not None else (0, len(out))
    if ref.rows is None:  # every row: views, not an index of every row and a gathered copy
        return relative_error(out[:stop - start] if sliced else out[start:stop], ref.values[start:stop], raw)
    rows, expected = ref.span(start, stop)
    got = out[rows] if sliced else out[rows + start]
    return relative_error(got, expected, raw)


def placement_problem(local_ranks: int, gpus: int) -> str | None:
    """Why ``local_ranks`` NCCL ranks cannot run on a node with ``gpus`` GPUs (NCCL needs one
    GPU per rank: two ranks on one GPU fail in NCCL, or serialise), or None."""
    if local_ranks > gpus:
        return (f"{local_ranks} ranks, {gpus} GPU{'s' if gpus != 1 else ''} on this node: NCCL needs one GPU per rank; "
                "run fewer ranks per node or use --backend gloo")
    return None


def gpu_of(local_rank: int, local_ranks: int, gpus: int) -> tuple[int, str | None]:
    """The CUDA device of the ``local_rank``-th of ``local_ranks`` NCCL ranks a launcher placed
    on a node where this rank sees ``gpus``, and why it cannot run there (or None): its local
    rank's GPU; the one it sees where it sees one, but under torchrun, which shows each rank
    every GPU (srun's --gpus-per-task, a container a rank: each rank its own; ranks that see
    the same one are refused by NCCL's set-up, which names the duplicate GPU)."""
    if gpus == 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun shows each rank every GPU
        return 0, None
    return local_rank, placement_problem(max(local_ranks, local_rank + 1), gpus)


def pick_backend(options: RunOptions) -> tuple[str, torch.device]:
    """The run's backend (``--backend``, else NCCL where CUDA is visible) and its rank's first
    device, or InputError where this machine cannot run them: NCCL without a CUDA device, CUDA
    graphs without NCCL. ``treeattn run`` asks before it says anything about the run."""
    backend = options.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and not torch.cuda.is_available():
        raise InputError("backend nccl needs CUDA devices; none is visible (use --backend gloo)")
    if options.graph and backend != "nccl":
        raise InputError("CUDA graphs need the NCCL backend (CUDA devices); use --no-graph with gloo")
    return backend, torch.device("cpu")


def _released() -> torch.Tensor:
    raise RuntimeError("this method's CUDA graph was released with its process group")


@dataclass(eq=False)
class _Timed:
    """One method of a job on one rank: what runs, and what its runs measured."""

    label: str
    method: str
    fn: Callable[[], torch.Tensor]
    payload: Payload
    check_ranks: tuple[int, ...]
    repeats: int
    executor: PlanExecutor | None = None
    contributors: tuple[int, ...] | None = None
    prepare: Callable[[], None] = lambda: None
    rows: tuple[int, int] | None = None
    """The reference rows this rank's result holds (its heads); None: every row."""
    sliced: bool = False
    """The method returns only ``rows`` (else every row, of which ``rows`` are checked)."""
    roundings: int = 1
    """How many times a partial may be rounded on the wire (``tolerance``)."""
    everyone_holds: bool = False
    """Every rank ends with the whole result (``all``): their bits are compared (``finish``)."""
    digest: str = ""
    """This rank's first result's digest, where ``everyone_holds``."""
    margin: float = _MIN_MARGIN_S
    delay: float = 0.0
    first: torch.Tensor | None = None
    last: torch.Tensor | None = None
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)


class _RankRun:
    """State of one rank across the plans of a job."""

    def __init__(self, job: Job, comm: Comm, kernels: dict[str, str], graphs: bool = False,
                 progress: Progress | None = None) -> None:
        self.job = job
        self.opt = job.options
        self.comm = comm
        self.kernels = kernels
        self.graphs = graphs
        self.progress = progress
        self._runs = [0, 0]
        """Runs done and known so far (checked, warm-up and timed), for ``progress``."""
        self._refs: dict[tuple, tuple[frozenset[int], Reference | None]] = {}
        """Per payload: the ranks that hold its reference (the same on every rank) and this rank's copy."""
        self._inputs: dict[str, RankInputs] = {}
        self._baselines_done: set[tuple] = set()
        self._same_clock: bool | None = None
        self.wrap: WrapUp | None = None
        """Where a signal asks this rank to wrap up (``RunOptions.wrap_up``; ``run_rank`` sets it)."""
        self.known: list[_Timed] = []
        """The methods ``run`` has made so far."""
        self.stopped = 0
        """The signal every rank agreed to stop for (``_begin``), 0: none."""
        self.eager: list[str] = []
        """With graphs on, the methods whose capture failed (on some rank: then every rank runs
        them eager, ``treeattn.exec.graphs.capture``): the report must not say graphs for them."""

    def _shared_clock(self) -> bool:
        """Whether every rank runs under one kernel (same boot id), so their
        ``time.perf_counter`` readings (CLOCK_MONOTONIC) are comparable."""
        if self._same_clock is None:
            try:
                boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            except OSError:
                boot = ""
            # all digests equal: every rank read the same boot id, so all read one or none
            self._same_clock = bool(boot) and len(set(self.comm.digests(boot, "clock check"))) == 1
            if self._same_clock:
                self.comm.open_board()
        return self._same_clock

    def reference(self, payload: Payload, contributors: tuple[int, ...] | None,
                  checks: tuple[int, ...]) -> Reference | None:
        """The reference of ``payload`` on a rank of ``checks``; None elsewhere. Every rank calls
        it with the same arguments; the ranks compute it together when one of ``checks`` lacks
        it, and only those keep it (a raw payload's is its whole buffer in fp64)."""
        key = (repr(payload), self.opt.seed, contributors)
        holders, ref = self._refs.get(key, (frozenset(), None))
        missing = frozenset(checks) - holders
        if missing:
            inputs = self._inputs[repr(payload)]
            mine = inputs.raw if isinstance(payload, RawPayload) else inputs.kv
            got = compute_reference(self.comm, payload, self.opt.seed, mine, inputs.q, contributors,
                                    keep=self.comm.rank in missing)
            ref = got if got is not None else ref
            self._refs[key] = (holders | missing, ref)
        return ref if self.comm.rank in checks else None

    def _begin(self, t: _Timed) -> float:
        """Start one run of ``t``: every rank at one agreed instant (one host's clock) or
        after a barrier; returns this run's start on ``comm.now()``."""
        asked = (self.wrap.signum or 0) if self.wrap is not None else 0
        if not self._shared_clock():
            stop = self.comm.barrier(asked)
            if stop:
                raise _Stopped(stop)
            return self.comm.now()
        start, arrived, worst, stop = self.comm.release(t.margin, t.delay, asked)
        if stop:
            raise _Stopped(stop)
        t.delay = arrived - (start - t.margin)  # how long after the last rank arrived this one knew
        # Every rank sees the same worst delay, so all agree on the next margin.
        t.margin = min(_MAX_MARGIN_S, max(_MIN_MARGIN_S, 2.0 * worst))
        return max(start, arrived)

    def warm(self, t: _Timed) -> None:
        """The checked first run of ``t``, then its ``warmup`` untimed runs; with graphs on,
        then its capture (the timed runs replay it)."""
        t.prepare()
        self._begin(t)
        out = t.fn()
        if self.comm.rank in t.check_ranks:  # only a checking rank reads it (``finish``)
            t.first = out.clone()  # fn may return a buffer the next run reuses
        if t.everyone_holds:
            # hashed in place (on a GPU from one host copy): a copy of a raw payload's result
            # would be the size of the payload, which ``exec.footprint`` does not count
            t.digest = hashlib.sha256(out.detach().contiguous().view(torch.uint8).cpu().numpy()).hexdigest()
        self.comm.settle()
        for _ in range(self.opt.warmup):
            t.prepare()
            self._begin(t)
            t.fn()
            self.comm.settle()
        if self.graphs:
            t.prepare()
            ex = t.executor
            t.fn = capture(self.comm, t.fn, f"{t.method} of {t.label}", ex.replaying if ex is not None else None)
            if not isinstance(t.fn, Graphed):
                self.eager.append(f"{t.method} of {t.label}")

    def release_graphs(self) -> None:
        """Destroy every method's CUDA graph: NCCL's teardown waits until each graph that
        captured its operations is destroyed (pytorch#115388), so with two ranks or more
        ``destroy_process_group`` would wait forever while they are held."""
        if not any(isinstance(t.fn, Graphed) for t in self.known):
            return
        for t in self.known:
            if isinstance(t.fn, Graphed):
                t.fn = _released
        gc.collect()
        torch.cuda.synchronize(self.comm.device)

    def time_once(self, t: _Timed) -> None:
        """One timed run of ``t`` (``prepare`` outside the clock); the last one's result is kept."""
        if self.wrap is not None:  # from now on there is something to keep (before, a signal stops at once)
            self.wrap.keeping = True
        t.prepare()
        t.starts.append(self._begin(t))
        if t.executor is not None and self._shared_clock():
            t.executor.origin = t.starts[-1]  # one clock: timelines count from the agreed start
        cpu = time.process_time()
        origin = self.comm.origin()
        if t.executor is not None:
            t.executor.clock = origin  # one wait for the device a run, as the baselines have
        out = t.fn()
        end = self.comm.mark()
        # settle waits for the end itself: the last op's marker can pass with kernels still
        # queued behind it (a merge, the rounding), and the time of an event the device has not
        # passed cannot be read (CUDA's "not ready", which ``Comm.seconds`` would make NaN)
        self.comm.track(f"the end of {t.method} of {t.label}", end)
        self.comm.settle()  # the op deadlines, once the end is recorded: not inside the timed run
        t.ends.append(self.comm.seconds(end, origin))
        t.cpus.append(time.process_time() - cpu)
        if len(t.starts) == t.repeats and self.comm.rank in t.check_ranks:
            t.last = out.clone()  # methods timed after this one may reuse its buffers (a run cut short has none)

    def finish(self, t: _Timed) -> Measurement | None:
        """Check ``t``'s first and last results and gather every rank's times (on rank 0)."""
        comm, raw = self.comm, isinstance(t.payload, RawPayload)
        ref = self.reference(t.payload, t.contributors, t.check_ranks)
        err = -1.0
        if ref is not None:
            err = max(check_against(out, ref, t.rows, t.sliced, raw) for out in (t.first, t.last) if out is not None)
        local = torch.tensor([err, *t.starts, *t.ends, statistics.median(t.cpus) * 1e6], dtype=torch.float64,
                             device=comm.device)
        rows = comm.all_gather(local, f"{t.method} result gathering", setup=True).cpu()
        same_bits = len(set(comm.digests(t.digest, f"{t.method} result digests"))) == 1 if t.everyone_holds else None
        n = len(t.starts)  # the same on every rank: all stop before the same run
        t0, t1 = rows[:, 1:1 + n], rows[:, 1 + n:1 + 2 * n]
        if self._shared_clock():
            # One host, one monotonic clock: every rank started at the agreed instant (or
            # later, when it learnt it late: then from the latest start) and the step ends
            # when the last one finishes.
            times_us = ((t1.max(dim=0).values - t0.max(dim=0).values) * 1e6).tolist()
        else:
            times_us = ((t1 - t0).max(dim=0).values * 1e6).tolist()
        timeline: list = []
        if t.executor is not None:
            gathered: list = [None] * comm.world if comm.rank == 0 else None
            dist.gather_object(t.executor.timeline, gathered, dst=0)
            if comm.rank == 0:
                timeline = [x for per_rank in gathered for x in per_rank]
        if comm.rank != 0:
            return None
        errs = [e for e in rows[:, 0].tolist() if e >= 0]
        return Measurement(
            label=t.label,
            method=t.method,
            kernel=self.kernels.get(t.label, "none"),
            times_us=tuple(times_us),
            max_rel_err=max(errs) if errs else math.inf,
            tolerance=tolerance(t.payload, t.roundings),
            checked_ranks=tuple(t.check_ranks),
            timeline=tuple(timeline),
            cpu_us=tuple(rows[:, -1].tolist()),
            starts_s=tuple(t0[0].tolist()),
            same_bits=same_bits,
        )

    def methods(self, pj: PlanJob) -> list[_Timed]:
        """The plan of ``pj`` and, when asked and not done for its workload yet, its baselines."""
        plan, comm, opt = pj.plan, self.comm, self.opt
        w = plan.workload
        inputs = self._inputs.get(repr(w))
        if inputs is None and plan.is_raw:
            inputs = RankInputs(raw=make_raw(w, comm.rank, opt.seed, comm.device))
        elif inputs is None:
            inputs = RankInputs(q=make_query(w, opt.seed, comm.device), kv=make_kv_shard(w, comm.rank, opt.seed,
                                                                                        comm.device))
        self._inputs[repr(w)] = inputs
        kernel = self.kernels.get(pj.label, "explicit")
        executor = PlanExecutor(plan, comm, inputs, kernel)
        checks = method_checks(plan, opt.check)[0]
        rows = plan.segments[comm.rank] if plan.layout == "heads" else None
        repeats = pj.repeats or opt.repeats
        out = [_Timed(pj.label, "plan", executor.run, w, checks, repeats, executor,
                      getattr(plan, "contributors", None), executor.prepare, rows=rows, roundings=wire_roundings(plan),
                      everyone_holds=plan.result == "all")]
        if opt.baselines and (repr(w), plan.result, "baselines") not in self._baselines_done:
            self._baselines_done.add((repr(w), plan.result, "baselines"))
            for b in baselines_for(w, *baseline_layout(plan), pj.ring_order):
                kind = b.result
                everyone, sliced = method_checks(plan, opt.check, b)
                brows = own_rows(plan, comm.rank) if sliced else None
                if plan.is_raw:
                    out.append(self._raw_baseline(pj, b, inputs, w, everyone, repeats, brows))
                    continue
                wire = torch_dtype(w.partial_dtype)
                # One pool per baseline: a slot another baseline's iteration took (or grew, freeing
                # its storage) would be overwritten under, or gone from, this one's captured graph.
                pool = BufferPool(comm.device)

                def fn(b=b, wire=wire, w=w, pool=pool):
                    return run_attention_baseline(b.name, comm, inputs.q, inputs.kv, w, kernel, wire, pool,
                                                  result=b.result, root=b.kwargs.get("root", 0),
                                                  order=b.kwargs.get("order"))

                out.append(_Timed(pj.label, b.name, fn, w, everyone, repeats, prepare=pool.release_all, rows=brows,
                                  sliced=sliced, roundings=sum_roundings(w.partial_dtype, comm.world),
                                  everyone_holds=kind == "all"))
        return out

    def _raw_baseline(self, pj: PlanJob, b, inputs: RankInputs, w: Payload, checks: tuple[int, ...],  # noqa: ANN001
                      repeats: int, rows: tuple[int, int] | None) -> _Timed:
        """A raw payload's baseline (the library's all-reduce, reduce-scatter or reduce, or
        all-gather + sum), its buffers its own as an attention baseline's are (``methods``)."""
        work = torch.empty_like(inputs.raw)
        pool = BufferPool(self.comm.device)

        def prepare(work=work, buf=inputs.raw):
            pool.release_all()
            work.copy_(buf)

        def fn(work=work):
            return run_raw_baseline(b.name, self.comm, work, b.result, b.kwargs.get("root", 0), pool)

        return _Timed(pj.label, b.name, fn, w, checks, repeats, prepare=prepare, rows=rows,
                      sliced=b.result == "heads", everyone_holds=b.result == "all")

    def run(self) -> tuple[list[Measurement], list[int]]:
        """Measure every method of the job in the options' order; returns the measurements (rank
        0's) and the timed runs each was to have. With ``RunOptions.wrap_up``, a signal stops
        every rank before the same run (``stopped``) and the methods with timed runs are
        finished over those."""
        done: list[Measurement | None] = []
        repeats: list[int] = []
        timing: list[_Timed] = []  # methods whose timed runs have begun and are not finished
        try:
            if self.opt.order == "blocked":
                for pj in self.job.plans:  # one plan's inputs alive at a time
                    methods = self.methods(pj)
                    self._known(methods)
                    for t in methods:
                        self.warm(t)
                        self._ran(1 + self.opt.warmup, t, "checked and warm-up runs")
                        timing = [t]
                        for _ in range(t.repeats):
                            self.time_once(t)
                            self._ran(1, t, TIMED_RUNS)
                        timing = []
                        done.append(self.finish(t))
                        repeats.append(t.repeats)
            else:
                timed = [t for pj in self.job.plans for t in self.methods(pj)]
                self._known(timed)
                for t in timed:
                    self.warm(t)
                    self._ran(1 + self.opt.warmup, t, "checked and warm-up runs")
                timing = timed
                for i in interleaved_order([t.repeats for t in timed], self.opt.seed):
                    self.time_once(timed[i])
                    self._ran(1, timed[i], TIMED_RUNS)
                timing = []
                done = [self.finish(t) for t in timed]
                repeats = [t.repeats for t in timed]
        except _Stopped as stop:
            self.stopped = stop.signum
            for t in timing:
                if t.starts:
                    done.append(self.finish(t))
                    repeats.append(t.repeats)
        return [m for m in done if m is not None], repeats

    def _known(self, methods: list[_Timed]) -> None:
        self.known += methods
        self._runs[1] += sum(1 + self.opt.warmup + t.repeats for t in methods)
        if self.progress is not None:
            self.progress(self._runs[0], self._runs[1], "starting")

    def _ran(self, runs: int, t: _Timed, what: str) -> None:
        self._runs[0] += runs
        if self.progress is not None:
            self.progress(self._runs[0], self._runs[1], f"{what}: {t.method} of {t.label}")


def stop_wait_s(options: RunOptions) -> float:
    """How long ranks asked to wrap up may take to stop and hand over their runs: the run they
    are in (op deadlines) and the results' gathering (the set-up deadline)."""
    return options.setup_timeout_s + 2 * options.timeout_s


class _Stopped(Exception):  # noqa: N818 - a request, not an error
    """Every rank agreed to stop before the run it was about to start (``_RankRun._begin``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


def interleaved_order(repeats: Sequence[int], seed: int) -> list[int]:
    """Indices of the timed runs when methods are interleaved, method ``i`` timed
    ``repeats[i]`` times: rounds that each run every method with runs left once, in an order
    shuffled per round (the same on every rank for one seed), so that a slow spell of the
    host lands on all methods alike rather than on one method's block."""
    order: list[int] = []
    for r in range(max(repeats, default=0)):
        one = [i for i, n in enumerate(repeats) if n > r]
        random.Random(seed * 7919 + r).shuffle(one)
        order += one
    return order


def run_rank(job: Job, rank: int, world: int, local_rank: int = 0,
             rendezvous: contextlib.AbstractContextManager = contextlib.nullcontext(),
             progress: Progress | None = None, host_problem: str = "") -> JobResult | None:
    """Run ``job`` as rank ``rank`` of ``world`` (process group from the env:// variables).

    Args:
        job: the plans and options; every rank must get the same job.
        rank: this process's global rank.
        world: number of processes; must equal the plans' rank count.
        local_rank: index of this process on its machine (picks the CUDA device).
        rendezvous: a context the process group is created in (``launch`` holds torch's own
            log of a failed rendezvous there).
        progress: on rank 0, ``progress(runs done, runs known, what)`` after each run (between
            runs, outside the timed ones); other ranks ignore it.
        host_problem: why this rank's host cannot hold the run (``memory_problem``), or "" (on
            NCCL its GPU's is added here): once the ranks are connected, before anything is
            allocated, every rank raises the lowest rank's (a rank that stopped alone would leave
            its peers to the set-up deadline).

    Returns:
        The ``JobResult`` on rank 0, None elsewhere.
    """
    opt = job.options
    for pj in job.plans:
        if pj.plan.ranks != world:
            raise InputError(
                f"plan {pj.label!r} has {pj.plan.ranks} ranks but the launcher started {world} processes; "
                f"launch {pj.plan.ranks} (e.g. torchrun --nproc-per-node {pj.plan.ranks} -m treeattn run PLAN)"
            )
    backend, device = pick_backend(opt)
    graphs = backend == "nccl" if opt.graph is None else opt.graph
    if backend == "nccl":
        for pj in job.plans:  # the executor refuses them too; here before anything starts
            problem = nccl_order_problem(pj.plan)
            if problem:
                raise PlanInvalidError(problem)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
        index, problem = gpu_of(local_rank, local, torch.cuda.device_count())
        if problem:
            raise InputError(problem)
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        # Other processes may hold this GPU's memory, which the topology's mem_gb cannot know;
        # said by every rank once they connect, as a host's (``host_problem``).
        host_problem = host_problem or memory_problem(job, [rank], torch.cuda.mem_get_info(device)[0],
                                                      f"GPU {index} ({torch.cuda.get_device_name(device)})",
                                                      gpu=True) or ""
        # The watchdog's timeout is the set-up deadline: it counts from when a run was enqueued,
        # not from when its op could start, so the op deadline is kept by Comm.settle instead.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    kernels = {pj.label: resolve_kernel(opt.kernel, device, pj.plan.workload.kv_dtype, pj.plan.workload.head_dim,
                                        pj.plan.workload.value_dim)
               for pj in job.plans if isinstance(pj.plan.workload, Workload)}
    for pj in job.plans:
        if isinstance(pj.plan.workload, Workload):
            fused.warm(device, torch_dtype(pj.plan.workload.partial_dtype), pj.plan.workload.value_dim)
        else:
            fused.warm_sum(device, torch_dtype(pj.plan.workload.dtype))
    init = {"device_id": device} if backend == "nccl" else {}
    with rendezvous:  # one set-up deadline for the store and the group's connections
        join(backend, rank, world, opt.setup_timeout_s, init)
    comm = Comm(rank, world, backend, device, opt.timeout_s, opt.setup_timeout_s)
    _check_same_job(job, comm)
    problem = comm.first_text(host_problem, "memory check")
    if problem:
        raise InputError(problem)
    comm.open_pairs(_pairs(job))
    run = _RankRun(job, comm, kernels, graphs, progress if rank == 0 else None)
    # Through the teardown too: a request after the last run's start stops nothing, but says the
    # run was signalled, and must not end a rank whose results are gathered.
    with wrap_up_on_signals(keeping=False) if opt.wrap_up else contextlib.nullcontext() as run.wrap:
        if run.wrap is not None:
            run.wrap.stuck_grace_s = max(run.wrap.stuck_grace_s, stop_wait_s(opt))
        try:
            measurements, repeats = run.run()
            peaks: list[int] = []
            if comm.cuda:
                mine = torch.tensor([torch.cuda.max_memory_allocated(device)], dtype=torch.int64, device=device)
                peaks = comm.all_gather(mine, "memory peaks", setup=True).view(-1).tolist()
        except (CommError, RuntimeError):
            # A signal to every rank finds each in its own run: one still warming up stops at
            # once and its peers lose it; the stop was asked for, not a failure.
            if run.wrap is not None and run.wrap.signum is not None:
                raise_interrupt(run.wrap.signum, None)
            raise
        comm.barrier()
        run.release_graphs()
        # Only on success: after a peer's failure, tearing the group down can block.
        dist.destroy_process_group()
        stopped = run.stopped or ((run.wrap.signum or 0) if run.wrap is not None else 0)
    if run.stopped and not repeats:  # stopped before any timed run: nothing to keep
        raise_interrupt(run.stopped, None)
    if rank != 0:
        return None
    # What ran, not what was asked: a failed compile or capture says why only in the rank's log.
    return JobResult(tuple(measurements), backend, str(device), world, fused.merge_label(device),
                     graphs and not run.eager, tuple(run.eager), stopped=stopped, repeats=tuple(repeats),
                     untimed=tuple(t.method for t in run.known if not t.starts) if run.stopped else (),
                     gpu_peak_bytes=tuple(peaks))


def _check_same_job(job: Job, comm: Comm) -> None:
    """Raise ``InputError`` on every rank unless all ranks hold the same plans and options (one
    all-gather of a digest): under torchrun or SLURM each rank reads its own plan file and flags,
    and ranks that differ (a plan regenerated on one node, say) would exchange mismatched
    messages, which aborts a rank inside gloo and leaves the others waiting out the set-up deadline."""
    # What decides the messages: deadlines, the local kernel and a backend named or implied may differ.
    opt = dataclasses.replace(job.options, timeout_s=1.0, setup_timeout_s=1.0, kernel="auto", backend=None)
    what = [(pj.plan.workload, pj.plan.programs, pj.plan.chunks, pj.plan.layout, pj.plan.result_ranks,
             pj.plan.contributors, pj.repeats, pj.ring_order) for pj in job.plans]
    ranks = comm.differing(repr((what, opt)), "plan check")
    if ranks:
        raise InputError(f"the ranks hold different plans or run options ({ranks} from rank 0; this rank "
                         f"{comm.rank} runs {', '.join(repr(pj.label) for pj in job.plans)}): give every rank "
                         "the same plan file and options")


def _pairs(job: Job) -> set[tuple[int, int]]:
    """Every pair of ranks that exchanges point-to-point messages in ``job``: the plans' transfers,
    the ring-attention baseline's ring, and the reference's gather to rank 0."""
    out = {(0, r) for r in range(1, job.ranks)}
    for pj in job.plans:
        for r, prog in enumerate(pj.plan.programs):
            out |= {(r, op.peer) for op in prog if op.is_transfer}
        if job.options.baselines:
            ring = list(pj.ring_order or range(job.ranks))
            out |= {(a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)}
    return {(min(p), max(p)) for p in out if p[0] != p[1]}
