"""``Merger``: the plan's merge of this rank's attention partial, called by a model every decode step.

A model computes its rank's partial over its KV shard with whatever kernel it uses
(FlashAttention, FlashInfer, SDPA, ``treeattn.attention_partial``) and hands ``(o, lse)``
over; the Merger runs this rank's program of the plan (its COMPUTE takes the given
partial) and returns the merged rows the plan's result layout gives this rank.

Buffers: the packed input is allocated at construction, the accumulator and every receive
buffer on the first call, and the next calls reuse them all; each call returns fresh output tensors. The packed
input is the accumulator itself when the program's first use of the accumulator is its
COMPUTE (``PlanExecutor.in_place``), and the Merger takes no per-op timestamps.

On NCCL the merges are fused kernels (``treeattn.exec.kernels``) and, from the second call
on, the program is replayed from a CUDA graph captured then (``graph``). A call does not
wait for the device: it queries (without sleeping) whether the earlier calls' communication
has finished, and raises ``ExecutionError`` for one the device has not finished within
``timeout_s`` of the host first seeing it unfinished; only while more than ``CALLS_AHEAD``
(3) earlier calls are unfinished does it wait for the oldest (``treeattn.exec.deadline``).
So a dead or hung peer is reported by a later call within about ``timeout_s``, as long as
the model keeps calling; a host that itself waits on the device (say, to read a sampled
token) is stopped only by the NCCL watchdog of the communicator the operation runs on (the
Merger's pair communicators': ``WATCHDOG_FACTOR`` x ``timeout_s``; a collective's: the
group's), which watches eager NCCL work, not a CUDA graph's.

A Merger may be called inside the caller's CUDA graph capture (a whole decode step captured,
as vLLM and SGLang do): such a call runs the program eagerly into the caller's graph, and
neither checks earlier calls, nor records deadline markers, nor captures a graph of its own.
Call it once outside any capture first, on every rank, with the shapes the captured calls will
have (that call allocates the buffers all later calls reuse, sets up NCCL's communicators,
and compiles the fused merges: a compile inside a capture would break it), and capture at
the same calls on every rank. No deadline applies to the caller's replays: a hung peer hangs
them. The Merger must outlive the caller's graph, whose replays use its buffers, and so must its
process group: a replay does not call the Merger, so nothing checks that the group still exists. The Merger
captures its own graph with ``capture_error_mode="thread_local"`` (the process group's
watchdog thread may query events meanwhile); a caller whose capture fails that way can do
the same. With the whole step captured by the caller, ``graph=False`` saves the Merger's own
graph.

Call a Merger on one CUDA stream (the one current at each call): its buffers are reused from
call to call in that stream's order, and nothing else orders a call on another stream after
the one before it.

Not yet run on a GPU: the calls inside a caller's capture and the calls ahead of the device
above (``tests/gpu/test_merger_graphs.py`` is written for them); only the bookkeeping is
unit-tested, on CPU (``tests/unit/test_exec_deadline.py``).
"""

from __future__ import annotations

import atexit
import os
import sys
import types
import warnings
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from treeattn.errors import ExecutionError
from treeattn.exec import kernels
from treeattn.exec.attention import torch_dtype
from treeattn.exec.comm import Comm, CommError
from treeattn.exec.deadline import LONGEST_TIMEOUT_S
from treeattn.exec.graphs import Graphed, capture
from treeattn.exec.interpreter import PlanExecutor, RankInputs
from treeattn.exec.merge import clear_empty_rows, pack_heads_into, unpack_heads
from treeattn.plan.ir import Plan
from treeattn.plan.validate import given_partial_problem
from treeattn.workload import Workload

__all__ = ["Merger", "DEFAULT_TIMEOUT_S"]

_ORDER_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""By process group: whether its Mergers check their order (``Merger(check_order=...)``), as its
first Merger built said, for the group's life (a new group, ``dist.new_group``, may say otherwise)."""
_SKIPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""By process group (held weakly: a destroyed group must not outlive its use): the last call of
one of its Mergers refused on this rank for its arguments (``Merger._check_inputs``), unchecked
since, and the longest order check that may meet it (``Merger._check_length``). It counts as
made: its peers may have gone into that call, where this rank's next call would meet them a call
apart and merge the wrong partials (a loop that catches the error and goes on), so the group's
next call here first checks the order with every rank (``Merger._check_order``); where they all
refused it, they go on in step. A call that failed preparing (out of memory), before sending,
does not count: called again, it meets its peers' call. On NCCL a later call of another group,
whose pair communicators are shared, is not checked: the calls-in-order rule (README) stands."""
_LIVE: weakref.WeakSet = weakref.WeakSet()
"""Every Merger not yet collected (``_let_go_at_exit``)."""


def _let_go_at_exit() -> None:
    """As the interpreter exits, while torch is whole, every live Merger drops its process
    groups: one that ``destroy_process_group`` left alive only through a Merger (a model's, kept
    to the end) was otherwise freed in the interpreter's teardown, where gloo's threads abort
    the process ("terminate called without an active exception", SIGABRT: 4 decode loops in 11
    of a new-user trial, torchrun failing the job after every result was right; torch's own
    issue, pytorch/pytorch pull 179291). Registered after torch's import, so run before its."""
    for merger in list(_LIVE):
        merger._let_go()
    _BROKEN.clear()
    _SKIPPED.clear()
    _drop_stale_group_defaults()


def _drop_stale_group_defaults() -> None:
    """Put None (the default group, as they read it) in place of each destroyed process group
    that a ``torch.distributed`` function holds as a default argument: ``torch.distributed.nn.functional``
    takes ``group.WORLD`` as its functions' default when first imported, and imported after
    ``init_process_group`` (transformers imports it with its models) it keeps the world's group
    alive past ``destroy_process_group`` to the interpreter's teardown, the abort above."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torch.distributed" or name.startswith("torch.distributed.")):
            continue
        for fn in list(vars(module).values()):
            # type(), not isinstance: isinstance asks torch.distributed.reduce_op for its __class__, which warns
            defaults = fn.__defaults__ if type(fn) is types.FunctionType else None
            if defaults and any(isinstance(d, dist.ProcessGroup) and not _registered(d) for d in defaults):
                fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) and not _registered(d) else d
                                        for d in defaults)


atexit.register(_let_go_at_exit)

_BROKEN: dict[object, str] = {}
"""Why a process group's Mergers may not be called (by ``_broken_key``: the gloo group; on NCCL the
world, whose pair communicators every group shares): a call that failed or was interrupted once it
had begun communicating leaves its peers inside it, where any later call or construction there
would meet them out of step (gloo aborts the process)."""

DEFAULT_TIMEOUT_S = 30.0
"""How long a rank waits for one of its messages or collectives before it raises (gloo; on NCCL,
how long a call's communication may stay unfinished once a later call sees it: module docstring)."""
WATCHDOG_FACTOR = 2.0
"""The pair communicators' NCCL watchdog timeout over ``timeout_s``: the watchdog counts from an
operation's enqueue, the Merger's deadline from a later call first seeing it unfinished, and by
torch's default the watchdog takes the process down; with the same timeout it would end the
process before the Merger's ``ExecutionError`` named the operation."""


def _usable_device(device: torch.device | str, backend: str) -> torch.device:
    """``device`` as a torch device the Merger can allocate on and its backend can send from, or
    a ValueError naming it, before anything is allocated: left to torch, a CUDA device without
    CUDA or a meta device fails only at the first allocation, with an error naming no argument."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"Merger: device {device!r} is not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Merger: device {dev} cannot hold the merge's buffers; give cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Merger: device {dev} asked for, but this torch sees no CUDA device")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"Merger: device {dev} asked for, but this process sees {torch.cuda.device_count()} "
                         "CUDA device(s) (CUDA_VISIBLE_DEVICES renumbers them from 0)")
    if dev.type == "cuda":
        # The Merger's markers, its CUDA graph and a caller's capture work on the current
        # device's streams: on another device its own graph would capture none of the merge
        # (the merge's kernels and NCCL calls go to that device's stream) and its replays would
        # return this rank's partial unmerged. "cuda" is the current device, as torch puts it
        # (cuda:N: the inputs' device check compares with the tensors' own).
        current = torch.cuda.current_device()
        if dev.index is None:
            dev = torch.device("cuda", current)
        elif dev.index != current:
            raise ValueError(f"Merger: device {dev} is not the current CUDA device (cuda:{current}); call "
                             f"torch.cuda.set_device({dev.index}) before building and calling the Merger")
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError(f"Merger: an NCCL process group sends from CUDA devices, device is {dev}")
    # torch puts a tensor asked for on cpu:1 on cpu: the inputs' device check would then refuse
    # every call's tensors, which are on cpu.
    return torch.device("cpu") if dev.type == "cpu" else dev


def _backend_and_device(group: dist.ProcessGroup | None,
                        device: torch.device | str | None) -> tuple[str, torch.device | str]:
    """The backend that moves the Merger's tensors in ``group`` and their device (``device``,
    else the current CUDA device where the group sends CUDA tensors by NCCL and CUDA is present,
    else the CPU). A group of several backends, as ``init_process_group`` makes without one
    (``get_backend`` says 'undefined'; its config 'cpu:gloo,cuda:nccl'), sends each device's
    tensors by that device's backend: CUDA tensors by NCCL."""
    name = str(dist.get_backend(group))
    if name == "undefined" or ":" in name:
        config = str(dist.get_backend_config(group))
        by_type = dict(part.split(":", 1) for part in config.split(",") if ":" in part)
    else:
        by_type = {"cpu": name, "cuda": name}
    if device is None:
        cuda = by_type.get("cuda") == "nccl" and (by_type.get("cpu") == "nccl" or torch.cuda.is_available())
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = "cpu"  # _usable_device names it
    return by_type.get(kind, name), device


def _broken_key(backend: str, group: dist.ProcessGroup | None) -> object:
    """Where a failed call leaves Mergers uncallable (``_BROKEN``): its gloo group; on NCCL every
    Merger of the world (its pair communicators serve every group of it), until a new world."""
    if backend == "nccl":
        return ("nccl", dist.group.WORLD)
    return dist.group.WORLD if group is None else group


def _unusable(why: str, backend: str) -> str:
    """The error of a call or construction where Mergers may not be called (``_BROKEN``)."""
    if backend == "nccl":
        fix = ("destroy the process group and init it again (on NCCL a new group, dist.new_group, shares the "
               "world's pair communicators) and build new Mergers")
    else:
        fix = "start a new process group (dist.new_group, or destroy and init again) and build new Mergers on it"
    return (f"Merger: the process group's Mergers are not callable after {why}: its peers may still be inside "
            "that call, where any later call or construction on the group would meet them out of step (gloo aborts "
            f"the process); {fix}")


def _registered(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` is still one of torch.distributed's groups (not destroyed): looked up
    in torch's registry of groups where this torch has it (0.2 µs a call here), else asked of
    ``get_rank`` (2-3 µs: some 0.2 ms of host time a decode step of 80 layers)."""
    if not dist.is_initialized():
        return False
    groups = getattr(getattr(distributed_c10d, "_world", None), "pg_map", None)
    if isinstance(groups, dict):
        return group in groups
    try:
        dist.get_rank(group)
    except (ValueError, RuntimeError):  # 'Group ... is not registered'
        return False
    return True


class Merger:
    """The merge of one decode step's partials along ``plan``, on this rank.

    Args:
        plan: a ``Plan`` (``treeattn.load_plan``, ``treeattn.search_plan``) or a plan file's path.
        group: the process group whose rank i is plan rank i (default: the world); its size
            must be the plan's rank count.
        device: where the inputs live and the merge runs (default: the current CUDA device
            where the group sends CUDA tensors by NCCL, as one made by ``init_process_group``
            without a backend does on a CUDA machine; else the CPU). A CUDA device must be the
            current one (``torch.cuda.set_device``); ``cuda`` names it.
        timeout_s: how long a rank waits for one message or collective before raising
            ``treeattn.errors.ExecutionError`` (gloo: every wait; NCCL: a call's communication,
            checked by later calls, see the module docstring). A rank that raises before
            communicating (bad input) and lives on leaves the others to fail by this timeout
            rather than wait forever; one whose process ends fails their waits at once (gloo:
            its connections close).
        graph: replay the program from a CUDA graph from the second call on (NCCL only);
            None: on with NCCL. A capture that fails on any rank leaves every rank eager,
            with one line on stderr saying why (and ``graph`` False). Calls made inside the
            caller's CUDA graph capture neither capture nor replay it (module docstring).
        check_order: before each call, check with every rank that all make the same Merger's
            same call (one small all-gather, on NCCL a wait for the device: for debugging), and
            raise ``ExecutionError`` on every rank, before anything is sent, where they do not.
            Every rank gives the same, and every Merger of the group (else construction raises
            ValueError: a checked call would meet an unchecked one's collectives). Only the Mergers
            of one process group are told apart: calls of another group's Merger meet in no
            check and fail by the timeout. Calls inside a caller's CUDA graph capture are not
            checked. The message names Mergers by ``number``.

    Every rank of the group constructs its Merger at the same point of its program (on NCCL
    the ranks that exchange messages open a communicator per pair then).

    Raises:
        TypeError: a group that is not a ``torch.distributed.ProcessGroup`` (nor None).
        ValueError: no process group, a group whose size is not the plan's rank count, a raw
            payload plan, a plan that moves KV (ring attention) instead of partials,
            ``graph=True`` without NCCL, or a device that is not cpu or the current cuda
            device (cuda with NCCL).
        treeattn.errors.PlanFormatError: a plan path that cannot be read, or text that is no plan.
        treeattn.errors.PlanInvalidError: a plan that does not validate (``treeattn verify``).

    Examples:
        Every rank of a 4-rank group (torchrun, or ``torch.multiprocessing.spawn``)::

            plan = treeattn.search_plan("cpu:ranks=4", "llama-3.1-8b", batch=1, seq_len=16384)
            merge = treeattn.Merger(plan)
            o, lse = treeattn.attention_partial(q, k_shard, v_shard)   # this rank's KV
            o, lse = merge(o, lse)                                     # every rank: the exact attention
    """

    def __init__(self, plan: Plan | str | os.PathLike, group: dist.ProcessGroup | None = None,
                 device: torch.device | str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 graph: bool | None = None, check_order: bool = False) -> None:
        if isinstance(plan, os.PathLike) and not isinstance(plan, Path):
            plan = Path(os.fspath(plan))  # any path object, as load_plan takes
        if not isinstance(plan, (Plan, str, Path)):
            raise TypeError(f"Merger: plan must be a Plan, or a plan file's path or text, got {type(plan).__name__}")
        if not isinstance(plan, Plan):
            from treeattn.plan.io import load_plan

            plan = load_plan(plan)
        from treeattn.plan.bits import bit_groups, split_text

        split = bit_groups(plan)  # validates it too
        if not isinstance(plan.workload, Workload):
            raise ValueError(f"Merger merges attention partials; plan {plan.algorithm!r} reduces a raw payload")
        problem = given_partial_problem(plan)
        if problem:
            raise ValueError(problem)
        if split and plan.result == "all":
            warnings.warn(f"plan {plan.algorithm!r}: its ranks may end with different bits ({split_text(split)}), "
                          "merging the same partials in other orders or groupings; under tensor parallelism they "
                          "may then sample different tokens (treeattn.search_plan leaves such plans out)",
                          stacklevel=2)
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("Merger needs torch.distributed initialised (init_process_group) on every rank")
        if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER and not isinstance(
                group, dist.ProcessGroup):  # torch would say 'unhashable type: list' or 'Group 3 is not registered'
            # (new_group's answer on a rank outside it, NON_GROUP_MEMBER, is refused below, naming that)
            raise TypeError(f"Merger: group must be a torch.distributed ProcessGroup (dist.new_group(ranks)) or None "
                            f"(the world), got {type(group).__name__} {group!r}")
        if dist.get_rank(group) < 0:
            raise ValueError("Merger: this process is not a member of the process group it was given; only the "
                             "group's ranks construct its Merger")
        size = dist.get_world_size(group)
        if size != plan.ranks:
            raise ValueError(f"Merger: plan {plan.algorithm!r} has {plan.ranks} ranks but the process group has {size}")
        if not isinstance(check_order, bool):
            raise TypeError(f"Merger: check_order must be True or False, got {check_order!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"Merger: timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        if timeout_s > LONGEST_TIMEOUT_S:  # inf ('no timeout') included
            raise ValueError(f"Merger: timeout_s must be at most {LONGEST_TIMEOUT_S:g} seconds, got {timeout_s!r}")
        backend, device = _backend_and_device(group, device)
        broken = _BROKEN.get(_broken_key(backend, group))
        if broken is not None:
            raise ExecutionError(_unusable(broken, backend))
        if graph and backend != "nccl":
            raise ValueError(f"Merger: CUDA graphs need an NCCL process group, this one is {backend}")
        self.plan = plan
        self.device = _usable_device(device, backend)
        self.rank = dist.get_rank(group)
        self._group = dist.group.WORLD if group is None else group
        """The group itself, not None: after destroy_process_group and a new init_process_group,
        None would name the new world, whose ranks may be other processes."""
        w = plan.workload
        self._w = w
        # Normal tensors even under torch.inference_mode (a model's setup may build its Mergers
        # there): the calls update them in place, which inference tensors refuse outside it.
        with torch.inference_mode(False), torch.no_grad():
            self._partial = torch.empty(w.rows, w.value_dim + 1, dtype=torch.float32, device=self.device)
            self._comm = Comm(self.rank, size, "nccl" if backend == "nccl" else "gloo", self.device, timeout_s,
                              timeout_s, group=group, watchdog_s=min(WATCHDOG_FACTOR * timeout_s, LONGEST_TIMEOUT_S))
            group_mode = _ORDER_CHECKED.get(self._group)
            self._check_same_plan(plan, check_order, group_mode)  # every rank's recorded mode agreed too
            if group_mode is not None and group_mode != check_order:  # a checked call meets an unchecked one's
                raise ValueError(f"Merger: the Mergers of one process group check their order alike; this group's "
                                 f"first Merger has check_order={group_mode}, this one {check_order} (a new group, "
                                 "dist.new_group, may check otherwise)")
            _ORDER_CHECKED.setdefault(self._group, check_order)  # where every rank passed: the group's first
            self._exec = PlanExecutor(plan, self._comm, RankInputs(partial=self._partial), timed=False)
            self.wire_dtype = torch_dtype(w.partial_dtype)
            self._comm.open_pairs({(r, op.peer) for r, prog in enumerate(plan.programs) for op in prog
                                   if op.is_transfer})
            kernels.warm(self.device, self.wire_dtype, w.value_dim)
        self.graph = backend == "nccl" if graph is None else graph
        """Whether calls replay a CUDA graph of the Merger's own: as asked until the second call
        (outside a caller's capture) captures it, then whether that worked on every rank."""
        self._capture = self.graph
        self.check_order = check_order
        """Whether each call first checks, with every rank, that all call the same Merger's same call."""
        self._run = self._exec.run
        self._calls = 0
        """Calls made outside a caller's CUDA graph capture."""
        self._skipped = 0
        """Calls refused on this rank for their arguments: counted as made in the order check."""
        self._broken_key = _broken_key(backend, group)
        self._backend = backend
        if plan.layout == "heads":
            self.rows: tuple[int, int] | None = plan.segments[self.rank]
        else:
            self.rows = (0, w.rows) if self.rank in plan.result_ranks else None
        _LIVE.add(self)

    def _let_go(self) -> None:
        """Drop what holds the process groups (``_let_go_at_exit``); the Merger is not callable after."""
        self._exec = self._comm = self._group = self._run = self._broken_key = None

    def _check_same_plan(self, plan: Plan, check_order: bool, group_mode: bool | None) -> None:
        """Raise ValueError on every rank unless every rank of the group holds the same merge
        and ``check_order`` (one all-gather of a digest, at construction): ranks that built
        different plans (say, each searched with its own sequence length) would otherwise exchange
        mismatched messages, which hangs, aborts the process inside gloo, or silently returns
        wrong rows; a rank checking its order alone would take its peers' partials for the check."""
        w = plan.workload
        what = (plan.programs, plan.chunks, plan.layout, plan.result_ranks, plan.segments, w.batch, w.q_heads,
                w.value_dim, str(w.partial_dtype), check_order, group_mode)
        try:
            self._comm.claim_space("Merger plan check")
            ranks = self._comm.differing(repr(what), "Merger plan check")
        except CommError as exc:  # 'Merger plan check failed: Operation timed out!' says not what to look for
            limit = self._comm.setup_timeout.total_seconds()
            raise CommError(f"{exc} (Merger construction: every rank of the group constructs its Merger at the same "
                            f"point of its program; a rank that did not within timeout_s = {limit:g} s, or failed "
                            "before it, leaves the others here)") from exc
        if ranks:
            raise ValueError(f"Merger: the ranks of the group hold different plans or check_order ({ranks} from "
                             f"rank 0; this rank's is {plan.algorithm!r}, B={w.batch}, Hq={w.q_heads}, "
                             f"Dv={w.value_dim}, partial_dtype={w.partial_dtype}, result={plan.result}, "
                             f"chunks={plan.chunks}, check_order={check_order}): build every rank's Merger from one "
                             "plan, with the same check_order")

    def _failed(self, which: str) -> str:
        """What to look for where ``which`` call's communication failed."""
        limit = self._comm.op_timeout.total_seconds()
        ended = "; one whose process ended, at once (its connections close)" if not self._comm.cuda else ""
        return (f"{which}: every rank calls its Mergers in one order; a peer that raised before its call and lives "
                f"on, or stopped calling, leaves the others here after timeout_s = {limit:g} s{ended}")

    def synchronize(self) -> None:
        """Wait until the device has finished every earlier call's communication, each within
        ``timeout_s``, or raise ``ExecutionError`` naming what it waits on. Call it before the
        model itself waits on the device (reading a sampled token) and at shutdown, where no
        later call would notice a hung peer (module docstring). Not inside a CUDA graph capture.
        After it raised, the Merger may not be called again (as after a call that failed)."""
        try:
            self._comm.settle()
        except ExecutionError as exc:
            _BROKEN[self._broken_key] = f"synchronize of the group's Merger {self.number} ({type(exc).__name__})"
            raise

    @property
    def number(self) -> int:
        """This Merger's number among the Mergers built on its process group in this process
        (from 1, the same on every rank; the world's count goes on after a new
        ``init_process_group``): how ``check_order``'s error names it."""
        return self._comm.serial

    @property
    def heads(self) -> tuple[int, int] | None:
        """The query heads [first, last) this rank's result holds (None: no result here)."""
        if self.rows is None:
            return None
        return self.rows[0] // self._w.batch, self.rows[1] // self._w.batch

    def __call__(self, o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Merge this rank's partial with every other rank's.

        Args:
            o: ``(B, Hq, Dv)``, any float dtype: this rank's attention output over its KV shard.
            lse: ``(B, Hq)`` fp32: its log-sum-exp (natural log: a kernel's base-2 lse times
                ln 2). A row where the shard is empty has lse = -inf (``attention_partial``) or
                +inf (FlashAttention-2): either is merged as the empty partial (0, -inf),
                whatever its o (zeros, or NaN as some kernels give a fully masked row). A NaN
                lse is merged as given: that row is NaN in every rank's result.

        Returns:
            ``(o, lse)``, fresh tensors (o in o's dtype, lse fp32; merged in fp32 and sent in
            the plan's ``partial_dtype``, so a float64 o comes back at fp32 accuracy) holding
            what the plan's result layout gives this rank: every head (``all``, and the root of ``root``), its
            own heads ``(B, Hq_i, Dv)`` (``heads``, see ``heads``), or ``(None, None)``.

        Raises:
            TypeError / ValueError: a non-tensor or a sparse one, a wrong dtype, shape or device
                (checked before anything is sent; the call counts as made: the group's next call
                here first checks with every rank that theirs was refused too, ``_SKIPPED``); a
                call after ``destroy_process_group`` destroyed its group (the world's included,
                even where ``init_process_group`` made a new one).
            RuntimeError: the first call made inside a CUDA graph capture.
            treeattn.errors.ExecutionError: a peer failed or did not answer within the timeout
                (on NCCL: this call's or an earlier call's communication); with ``check_order``,
                ranks making different calls; any call of the group's Mergers after one failed,
                or was interrupted, once it had begun communicating.
        """
        try:
            self._check_inputs(o, lse)
        except (TypeError, ValueError) as exc:
            self._skip(exc)
            raise
        with torch.inference_mode(False), torch.no_grad():  # the buffers stay normal tensors (see __init__)
            return self._merge(o, lse)

    def _check_inputs(self, o: torch.Tensor, lse: torch.Tensor) -> None:
        """Raise TypeError / ValueError where ``o`` or ``lse`` is not what the plan merges (``__call__``)."""
        w = self._w
        for name, t in (("o", o), ("lse", lse)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"Merger: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.layout != torch.strided:  # torch's error would come from inside the packing, naming no argument
                raise TypeError(f"Merger: {name} must be a dense (strided) tensor, got layout {t.layout}")
        if not o.is_floating_point():
            raise TypeError(f"Merger: o must be a floating-point tensor, got {o.dtype}")
        if torch.is_grad_enabled() and (o.requires_grad or lse.requires_grad):
            raise ValueError("Merger: o or lse requires grad, and the merge is not differentiable: call it under "
                             "torch.no_grad() or torch.inference_mode() (or pass o.detach(), lse.detach())")
        if lse.dtype != torch.float32:
            raise TypeError(f"Merger: lse must be float32 (natural log), got {lse.dtype}")
        want = (w.batch, w.q_heads, w.value_dim)
        if tuple(o.shape) != want:
            # A smaller batch (continuous batching) is the likely mistake: say how to serve it.
            hint = ("; a Merger serves one batch size: pad the batch to B with rows of lse = -inf (they merge as "
                    "empty and come back as o = 0, lse = -inf), or build a Merger for each batch size"
                    if o.dim() == 3 and tuple(o.shape[1:]) == want[1:] and o.shape[0] != w.batch else "")
            raise ValueError(f"Merger: o must be (B, Hq, Dv) = {want} for plan {self.plan.algorithm!r}, "
                             f"got {tuple(o.shape)}{hint}")
        if tuple(lse.shape) != want[:2]:
            raise ValueError(f"Merger: lse must be (B, Hq) = {want[:2]}, got {tuple(lse.shape)}")
        for name, t in (("o", o), ("lse", lse)):
            if t.device != self.device:
                raise ValueError(f"Merger: {name} is on {t.device}, this Merger runs on {self.device}")
        if not _registered(self._group):  # torch would say so only once the program's first message is posted,
            # or, in a world made again by init_process_group, not at all: the old plan's messages would go to
            # whichever processes hold its ranks now
            raise ValueError("Merger: called after torch.distributed.destroy_process_group(); a Merger serves the "
                             "process group it was built in: build a new one after init_process_group")

    def _skip(self, exc: BaseException) -> None:
        """Count a call refused for its arguments as made (``_SKIPPED``)."""
        if self._group is None or not _registered(self._group):
            return  # no later call of the group's can run
        self._skipped += 1
        _SKIPPED[self._group] = (f"call {self._calls + self._skipped} of the group's Merger {self.number} was "
                                 f"refused on this rank ({type(exc).__name__}: its arguments)",
                                 self._check_length())

    def _merge(self, o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        broken = _BROKEN.get(self._broken_key)
        if broken is not None:
            raise ExecutionError(_unusable(broken, self._backend))
        call = self._calls + 1
        self._posted = self._comm.posted
        try:
            acc = self._merge_once(o, lse)
        except BaseException as exc:
            # Once it began communicating (or found an earlier call's communication failed), its
            # peers may be inside this call: any later call of the group's would meet them out of step.
            began = isinstance(exc, CommError) or self._comm.posted != self._posted
            if began and not getattr(exc, "nothing_sent", False):
                how = "failed" if isinstance(exc, Exception) else "was interrupted"
                _BROKEN[self._broken_key] = (f"call {call} of the group's Merger {self.number} {how} "
                                             f"({type(exc).__name__})")
            raise
        return self._mine(acc, o.dtype)

    def _merge_once(self, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        comm = self._comm
        skipped, longest = _SKIPPED.get(self._group, (None, 0))
        if comm.cuda and torch.cuda.is_current_stream_capturing():
            if skipped:
                raise RuntimeError(f"Merger: {skipped}; the group's next call checks with every rank that each "
                                   "skipped it, which cannot run inside a CUDA graph capture: call once outside it")
            return self._merge_captured(o, lse)
        if self.check_order or skipped:
            self._check_order(skipped, longest)
            _SKIPPED.pop(self._group, None)
            if not self.check_order:
                # Passed on every rank: every rank goes on into this call, so a failure preparing it
                # (out of memory) may be retried as where no check ran (``_merge``).
                self._posted = comm.posted
        try:
            comm.calls.check()  # the earlier calls' communication, within the timeout; waits only when far ahead
        except CommError as exc:
            raise CommError(f"{exc} ({self._failed('an earlier call (the device runs up to 3 behind)')})") from exc
        try:
            clear_empty_rows(pack_heads_into(self._partial, o, lse))
            self._exec.prepare()
            if self._capture and self._calls:
                self._capture = self.graph = False  # until the capture worked on every rank
                self._run = capture(comm, self._exec.run, f"the Merger's program of plan {self.plan.algorithm!r}",
                                    self._exec.replaying)
                self.graph = isinstance(self._run, Graphed)
            acc = self._run()
        except CommError as exc:  # the library's 'Operation timed out!' says not what to look for
            raise CommError(f"{exc} ({self._failed(f'Merger call {self._calls + 1} on this rank')})") from exc
        self._calls += 1
        comm.calls.add(comm.untracked(), self._run.name if isinstance(self._run, Graphed) else None)
        return acc

    def _check_order(self, skipped: str | None = None, longest: int = 0) -> None:
        """Raise ``ExecutionError`` on every rank unless every rank makes the same Merger's same
        call (one all-gather of (its number on the group, its calls, those refused for their
        arguments included), before anything is sent): calls in different orders would otherwise
        merge another Merger's partials wherever no tag tells them apart (a plan's collectives,
        NCCL), and return wrong rows. ``skipped``: the group's call refused on this rank for its
        arguments (``_SKIPPED``), said in the errors; where its peers went into that call
        instead, this check meets their messages, not theirs, and fails by the timeout (or the
        library aborts the process on a collective of another size: gloo)."""
        count = self._calls + self._skipped
        mine = torch.zeros(max(self._check_length(), longest), dtype=torch.int64, device=self.device)
        mine[:3] = torch.tensor([self._comm.serial, count, self._skipped], dtype=torch.int64)
        after = f" after {skipped}" if skipped else ""
        try:  # setup=True: on NCCL the host waits for it (and the calls before it) within the deadline
            gathered = self._comm.all_gather(mine, "Merger order check", setup=True).view(len(self.plan.programs), -1)
        except CommError as exc:
            raise CommError(f"{exc} ({self._failed(f'the order check of Merger call {count + 1}{after}')})") from exc
        every = gathered[:, :3].tolist()
        # A row that is no check's: a peer's message of another operation, taken into this buffer.
        real = [bool((row[3:] == 0).all()) and 0 < m < 1 << 31 and 0 <= k <= c < 1 << 48
                for row, (m, c, k) in zip(gathered.cpu(), every, strict=True)]
        if all(real) and all(row[:2] == every[self.rank][:2] for row in every):
            return
        calls = "; ".join((f"rank {r}: the group's Merger {m}, call {c + 1}" + (f" ({k} refused there for arguments)"
                                                                                  if k else "")) if ok else
                          f"rank {r}: inside another operation (the refused call's, where it went on)"
                          for r, ((m, c, k), ok) in enumerate(zip(every, real, strict=True)))
        how = ("nothing was sent: calls that meet in one order from here on merge as before (where a rank's call "
               "was refused for its arguments and its peers went on, only a new process group gets them in step)"
               if not all(real) or any(k for _, _, k in every) else
               "nothing was sent, so calls in one order from here on merge as before")
        w = self._w
        error = ExecutionError(f"Merger: the ranks make different calls ({calls}; this rank's Merger {self.number} "
                               f"merges plan {self.plan.algorithm!r}, B={w.batch}): every rank calls its Mergers in "
                               f"one order; {how}")
        error.nothing_sent = True  # every rank raises it here, in step: the group stays callable (``_merge``)
        raise error

    def _check_length(self) -> int:
        """The order check's int64 count: 3 with ``check_order`` (its peers' calls all begin with
        the same check); after a refused call without it, more than the plan's longest message
        (its packed partial of every row, and some), so that a peer still inside the refused
        call's collective, which takes a shorter message into its buffer without a word (gloo),
        receives a longer one and fails loudly rather than merge it. The check runs at the
        group's next call, of whichever Merger: it is as long as the refused Merger's (kept in
        ``_SKIPPED``) or its own, the longer."""
        if self.check_order:
            return 3
        w = self._w
        return 3 + w.rows * (w.value_dim + 1) + 8  # int64s: twice its fp32 partial's bytes, and 64 more

    def _merge_captured(self, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """A call inside the caller's CUDA graph capture: the program runs eagerly into it, with
        no deadline markers (its replays happen where no later call could check them)."""
        if not self._calls:
            raise RuntimeError("Merger: first called inside a CUDA graph capture; call it once outside the capture "
                               "first (on every rank): that call allocates the buffers the captured calls reuse")
        clear_empty_rows(pack_heads_into(self._partial, o, lse))
        self._exec.prepare()
        self._comm.tracking = False
        try:
            acc = self._exec.run()
        finally:
            self._comm.tracking = True
        return acc

    def _mine(self, acc: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This rank's result rows of the accumulator, as fresh tensors (o in ``dtype``)."""
        if self.rows is None:
            return None, None
        a, b = self.rows
        mine_o, mine_l = unpack_heads(acc[a:b], self._w.batch)
        return (mine_o.to(dtype, memory_format=torch.contiguous_format, copy=True),
                mine_l.to(torch.float32, memory_format=torch.contiguous_format, copy=True))
