"""Start the ranks of a run: under torchrun or SLURM, or as local processes.

* torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): this
  process is one rank; it runs its part in-process. Its intra-op threads are torchrun's to
  set: torchrun sets ``OMP_NUM_THREADS=1`` for its workers where it starts more than one
  process per node and ``OMP_NUM_THREADS`` is not set (``torch.distributed.run``); with one
  process per node it sets nothing, and torch's own default holds.
* SLURM (``SLURM_PROCID``, ``SLURM_NTASKS`` > 1, ``SLURM_LOCALID``, plus ``MASTER_ADDR`` and
  ``MASTER_PORT`` that the batch script exports): likewise. srun sets no thread count, so
  unless ``OMP_NUM_THREADS`` is set a task takes ``SLURM_CPUS_PER_TASK`` threads, else its
  share of the CPUs (``slurm_threads``): those srun bound it to, or the node's usable CPUs
  divided among the node's tasks.
* Otherwise the plan's ranks are started here on 127.0.0.1 with a free TCP port, each on its
  own GPU under NCCL (more ranks than GPUs is refused before anything starts, as are gloo
  ranks whose buffers together exceed this host's available memory), each with
  ``OMP_NUM_THREADS`` set to the host's CPUs divided by the rank count unless it is set
  already. Under NCCL each rank is a ``python -m treeattn.exec.worker`` process of its own;
  gloo ranks are forked from one such process that imported torch once (``forked_ranks``),
  which on a small host halves a short run's CPU time, where this process can adopt them
  (Linux), else they too start one interpreter each. A watchdog polls them: when one exits with
  an error (it raised, or died), the others get a short grace to report, then are killed;
  no child outlives the run (they also die with their parent, through PR_SET_PDEATHSIG).
  The error names the rank that failed first, not the ranks that lost their peer, and the
  folder where every rank's full output is kept (``keep_output``). For a job that wraps up
  (``RunOptions.wrap_up``) a first signal is passed on to the ranks as
  ``interrupts.WRAP_UP_SIGNAL`` and the launcher waits (``stop_wait_s``) for them to stop
  together and hand over the runs done; a second signal, or that wait's end, kills them.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from treeattn.errors import ExecutionError, InputError, TreeattnError
from treeattn.exec import rendezvous
from treeattn.exec.footprint import memory_problem
from treeattn.exec.runner import (
    TIMED_RUNS,
    Job,
    JobResult,
    Progress,
    pick_backend,
    placement_problem,
    run_rank,
    stop_wait_s,
)
from treeattn.exec.worker import PIDS_FILE, read_progress
from treeattn.interrupts import (
    SAME_REQUEST_S,
    WRAP_UP_SIGNAL,
    WrapUp,
    hard_exit,
    raise_interrupt,
    shielded,
    stopping_signals,
    wrap_up_on_signals,
)

__all__ = ["RankEnv", "detect_env", "check_world", "slurm_bound", "slurm_threads", "launch", "launch_local",
           "free_port", "run_directory", "keep_output", "rank_failure", "GRACE_S", "available_bytes",
           "host_memory_problem", "relay_progress"]

_NOT_JOINED = re.compile(r"ranks? [\d, -]+ of \d+ did not connect within ")
"""``rendezvous.wait_joined``'s words for ranks that never connected: said by a rank that waited,
they name the ranks to blame (``rank_failure``)."""

GRACE_S = 1.0
"""After the first failed rank, how long the others get to exit and say why before the kill."""
_TICK_S = 0.5
"""How often the launcher looks at rank 0's progress file."""


@dataclass(frozen=True, slots=True)
class RankEnv:
    """Where an external launcher put this process."""

    launcher: str
    """``torchrun``, ``slurm`` or ``the RANK/WORLD_SIZE launcher``."""
    rank: int
    world: int
    local_rank: int


def detect_env(environ: dict[str, str] | None = None) -> RankEnv | None:
    """The external launcher's placement of this process, or None to launch locally.

    Args:
        environ: the environment to read (``os.environ`` by default).

    Returns:
        A ``RankEnv`` under torchrun or a multi-task SLURM step, else None.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        # torchrun marks its workers; other launchers (treeattn emulate, scripts) set the same variables.
        who = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "the RANK/WORLD_SIZE launcher"
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    elif "SLURM_PROCID" in env and _int(env, "SLURM_NTASKS", "1") > 1:
        who, names = "slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    else:
        return None
    _need(env, ("MASTER_ADDR", "MASTER_PORT"), "SLURM" if who == "slurm" else who)
    rank, world, local = (_int(env, n, "0" if n == names[2] else None) for n in names)
    # Out of range, a rank would wait for its peers until the set-up deadline (minutes), or
    # torch would fail with a traceback: refuse at once, naming the variable.
    if world < 1:
        raise InputError(f"{names[1]}={world} must be at least 1")
    if not 0 <= rank < world:
        raise InputError(f"{names[0]}={rank} is not a rank of {names[1]}={world}: it must be 0 to {world - 1}")
    if local < 0:
        raise InputError(f"{names[2]}={local} is negative")
    if not 1 <= _int(env, "MASTER_PORT") <= 65535:
        raise InputError(f"MASTER_PORT={env['MASTER_PORT']} is not a TCP port (1 to 65535)")
    _check_host(env["MASTER_ADDR"])
    return RankEnv(who, rank, world, local)


def _check_host(addr: str) -> None:
    """Refuse a ``MASTER_ADDR`` no lookup can ever resolve, as written: a bracketed IPv6
    address or a host with its port (torch takes neither), a control character, a label the
    IDNA codec refuses (empty or over 63 characters). A name that does not resolve (yet) is the
    rendezvous's to wait for within the set-up deadline (``rendezvous.wait_resolvable``): a new
    host's DNS record may come after its peers start."""
    shown = addr if addr.isprintable() else repr(addr)
    if addr.startswith("[") and addr.endswith("]"):
        raise InputError(f"MASTER_ADDR={shown}: write the address without brackets ({addr[1:-1]})")
    host, colon, port = addr.rpartition(":")
    if colon and port.isdigit() and host and ":" not in host:
        raise InputError(f"MASTER_ADDR={shown} holds a port: give the host alone ({host}) and the port in "
                         "MASTER_PORT")
    if not addr.isprintable() or any(c.isspace() for c in addr):
        raise InputError(f"MASTER_ADDR={shown} holds a space or a control character: no host is named so")
    try:
        addr.encode("idna")
    except UnicodeError as exc:  # what getaddrinfo raises for it, as a traceback
        raise InputError(f"MASTER_ADDR={shown} is no host name ({exc.__cause__ or exc})") from None


def slurm_bound(env) -> bool:  # noqa: ANN001 - a mapping
    """Whether srun bound this task to CPUs of its own, as its task/affinity plugin reports
    it: ``SLURM_CPU_BIND_TYPE`` (``none``, ``rank``, ``map_cpu:``, ``mask_cpu:``, ``cores``...,
    after ``--cpu-bind`` or auto binding) other than ``none``, or a ``SLURM_CPU_BIND_LIST`` of
    CPUs or masks. Fewer usable CPUs than the node has says nothing of it: a job's cgroup or a
    container limits every task of the node to the same CPUs."""
    kinds = {k.strip().rstrip(":").lower() for k in env.get("SLURM_CPU_BIND_TYPE", "").split(",")}
    kinds -= {"", "quiet", "verbose"}
    if "none" in kinds:
        return False
    return bool(kinds) or bool(env.get("SLURM_CPU_BIND_LIST", "").strip())


def slurm_threads(env, usable: int) -> int:  # noqa: ANN001 - a mapping
    """Intra-op threads for one SLURM task whose process may run on ``usable`` CPUs:
    ``SLURM_CPUS_PER_TASK`` where set; all ``usable`` where srun bound the task to CPUs of its
    own (``slurm_bound``); else the ``usable`` CPUs shared among the node's tasks
    (``SLURM_STEP_TASKS_PER_NODE``, e.g. ``4(x2),3``, at ``SLURM_NODEID``; one task where that
    cannot be read), never fewer than one."""
    given = env.get("SLURM_CPUS_PER_TASK", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if slurm_bound(env):
        return max(1, usable)
    counts: list[int] = []
    for part in env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")).split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            counts = []
            break
        counts += [int(m[1])] * int(m[2] or 1)
    node = env.get("SLURM_NODEID", "0")
    tasks = counts[int(node)] if node.isdigit() and int(node) < len(counts) else 1
    return max(1, usable // max(1, tasks))


def check_world(placed: RankEnv, ranks: int) -> None:
    """Refuse a launcher's world that is not the plan's ``ranks``: every rank would wait for
    peers that are not there, or hold a rank no program has."""
    if placed.world != ranks:
        raise InputError(f"{placed.launcher} started {placed.world} processes but the plan has {ranks} ranks; "
                         f"launch exactly {ranks}")


def _int(env, name: str, default: str | None = None) -> int:  # noqa: ANN001 - a mapping
    text = env.get(name, default)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise InputError(f"cannot read the launcher's variable {name}={text!r}: not an integer") from None


def _need(env, names: tuple[str, ...], who: str) -> None:  # noqa: ANN001 - a mapping
    missing = [n for n in names if not env.get(n)]
    if missing:
        verb, it = ("is", "it") if len(missing) == 1 else ("are", "them")
        raise InputError(f"{who} environment found but {', '.join(missing)} {verb} not set; export {it} "
                         "(e.g. MASTER_ADDR=$(hostname) MASTER_PORT=29500) before launching")


def launch(job: Job, environ: dict[str, str] | None = None, progress: Progress | None = None,
           setup_watchdog: bool = False) -> JobResult | None:
    """Run ``job`` on its ranks: in-process under torchrun/SLURM, else as local processes.

    Args:
        job: the plans (all with the same rank count) and options.
        environ: environment to detect a launcher in (``os.environ`` by default).
        progress: ``progress(runs done, runs known, what)`` as rank 0 gets on (``run_rank``): in
            this process where it is rank 0, from rank 0's process every half second or so where
            the ranks are started here.
        setup_watchdog: under torchrun or SLURM, end this process (``hard_exit``) where it is still
            setting up ``SETUP_GRACE_S`` past the set-up deadline (``_RendezvousLog``): for a
            command (``treeattn run``), not a program that calls this.

    Returns:
        The ``JobResult`` where this process is rank 0 (always for local launches), else None.

    Raises:
        InputError: the launcher's world size differs from the plans' rank count.
        ExecutionError: a rank failed or died (the message names it and, for a local run, the
            folder that keeps every rank's output).
    """
    placed = detect_env(environ)
    if placed is None:
        return launch_local(job, progress)
    check_world(placed, job.ranks)
    # each host's ranks; NCCL's check their GPU's memory too (run_rank)
    ranks = host_ranks(placed, environ or os.environ)
    span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
    if pick_backend(job.options)[0] == "gloo":
        host_problem = memory_problem(job, ranks, available_bytes(), f"the host of {span}") or ""
    else:
        host_problem = memory_problem(job, ranks, available_bytes(), f"the host of {span} (beside their GPUs)",
                                      beside_gpus=True) or ""
    if placed.launcher == "slurm":
        os.environ.update(RANK=str(placed.rank), WORLD_SIZE=str(placed.world), LOCAL_RANK=str(placed.local_rank))
        if "OMP_NUM_THREADS" not in os.environ:
            # srun sets no thread count: torch's default would give every task about as many
            # threads as the CPUs it may use, and the tasks of a node would contend for its
            # cores (5x slower on gloo here).
            torch.set_num_threads(slurm_threads(os.environ, len(os.sched_getaffinity(0))))
    held = _RendezvousLog(placed.rank, job.options.setup_timeout_s if setup_watchdog else None)
    try:
        return run_rank(job, placed.rank, placed.world, placed.local_rank, rendezvous=held, progress=progress,
                        host_problem=host_problem)
    except TreeattnError as exc:
        # set-up's errors in treeattn's words; where they name the ranks that never came, torch's
        # log holds only its store's timeouts
        if held.kept and isinstance(exc, ExecutionError) and not _NOT_JOINED.match(str(exc)):
            exc = ExecutionError(f"{exc} (torch's log of it: {held.kept})")
        elif held.kept:  # a log no message names is one no one reads: not left in the temporary folder
            with contextlib.suppress(OSError):
                os.unlink(held.kept)
        exc.exit_now = dist.is_initialized()  # run_rank tears the group down on success only
        raise exc from None
    except Exception as exc:  # noqa: BLE001 - torch's own (store, socket) errors: one line, not a traceback
        kept = f" (torch's log of it: {held.kept})" if held.kept else ""
        error = ExecutionError(_in_process_failure(placed.rank, exc) + kept)
        error.exit_now = dist.is_initialized()
        raise error from None
    except KeyboardInterrupt:  # the interrupt's one line names no log: none is left behind
        if held.kept:
            with contextlib.suppress(OSError):
                os.unlink(held.kept)
        raise


SETUP_GRACE_S = 5.0
"""How long past the set-up deadline a launcher's rank still waits in the process group's
creation before its watchdog ends the process (``_RendezvousLog``)."""


class _RendezvousLog:
    """What the process writes to its stderr (fd 2) while its process group is created: passed
    on once that succeeds, kept in a file (``kept``) that the error names when it fails. A rank
    that cannot reach its master gets dozens of lines of C++ frames from torch's store there,
    before treeattn's one line; a local run keeps every rank's output in its folder instead.

    And, given ``setup_s`` (None: none), a watchdog: a rank still inside the group's creation
    ``SETUP_GRACE_S`` after its ``setup_s`` deadline says so and ends (``hard_exit``, status
    1). Gloo's connection of every pair waits on a peer that died after the ranks met for
    several times the timeout it is given (about 5x here: 310 s for 60), in C++, where no
    signal reaches Python; a local run's launcher stops its ranks itself."""

    def __init__(self, rank: int, setup_s: float | None) -> None:
        self.rank = rank
        self.setup_s = setup_s
        self.kept: str | None = None
        self._lock = threading.Lock()
        self._over = False

    def __enter__(self) -> _RendezvousLog:
        sys.stderr.flush()
        self._held = tempfile.TemporaryFile()
        self._stderr = os.dup(2)
        os.dup2(self._held.fileno(), 2)
        rendezvous.notice = self._say
        self._timer = None if self.setup_s is None else threading.Timer(self.setup_s + SETUP_GRACE_S, self._abandon)
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, kind, exc, tb) -> None:  # noqa: ANN001 - the context protocol's
        with self._lock:  # once the watchdog has begun, it ends the process
            self._over = True
        if self._timer is not None:
            self._timer.cancel()
        rendezvous.notice = None
        sys.stderr.flush()
        os.dup2(self._stderr, 2)
        os.close(self._stderr)
        if exc is None:
            sys.stderr.buffer.write(self._text())  # whole, as it would have come
            sys.stderr.flush()
        else:
            self._keep()

    def _say(self, line: str) -> None:
        """A line of this rank's own during the set-up, past the held stderr (``rendezvous.notice``)."""
        with contextlib.suppress(OSError):
            os.write(self._stderr, (line + "\n").encode())

    def _text(self) -> bytes:
        with self._held:
            self._held.seek(0)
            return self._held.read()

    def _keep(self) -> None:
        text = self._text()
        if text.strip():
            fd, path = tempfile.mkstemp(prefix=f"treeattn-rank{self.rank}-rendezvous-", suffix=".log")
            with os.fdopen(fd, "wb") as f:
                f.write(text)
            self.kept = path

    def _abandon(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            with contextlib.suppress(OSError):
                self._keep()
            kept = f" (torch's log of it: {self.kept})" if self.kept else ""
            doing = rendezvous.stage or "setting up"
            line = (f"error: rank {self.rank} was still {doing} {SETUP_GRACE_S:g} s past its {self.setup_s:g} s "
                    f"set-up deadline (a peer, or the store's rank, died or hung meanwhile){kept}\n")
            with contextlib.suppress(OSError):
                os.write(self._stderr, line.encode())
            hard_exit(1)


def _in_process_failure(rank: int, exc: Exception) -> str:
    """One line for what a torch call of this rank raised (its message can run on with C++ frames)."""
    text = str(exc).strip()
    if "connectFullMesh" in text:  # a peer gone between the ranks' meeting and their connection
        return (f"rank {rank} could not connect to every other rank while the process group was made (a rank died "
                f"or hung after the ranks met): gloo: {rendezvous.first_line(text)}")
    return f"rank {rank} failed: {type(exc).__name__}: {rendezvous.first_line(text)}"


_LOWEST_PORT = 10000
"""The lowest port ``free_port`` offers: above the registered services most hosts run."""


def _ephemeral_low() -> int:
    """The first port of this host's ephemeral range (Linux: ``ip_local_port_range``), else IANA's 49152."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_port() -> int:
    """A TCP port that nothing holds on any address right now, for the store rank 0 serves.

    Drawn at random below the host's ephemeral range where that leaves room: a port the kernel
    hands out itself (binding port 0) is one it may give again, to any process's next
    connection or listener (gloo's own, on a host running several jobs), before rank 0 binds it;
    a port below the range is only ever taken by a process that asks for it by number."""
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randrange(_LOWEST_PORT, low)
            if _bindable(port):
                return port
    for _ in range(64):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        except OSError as exc:
            said = exc.strerror or exc
            raise ExecutionError(f"no TCP port for the ranks' store could be bound here: {said}") from None
        if _bindable(port):
            return port
    raise ExecutionError("no free TCP port for the ranks' store was found here")


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on every address, as the store (torch's TCPStore)
    binds it: a process listening on one address (a NIC's, 127.0.0.2) holds it there too."""
    families = [(socket.AF_INET6, "::"), (socket.AF_INET, "")] if socket.has_ipv6 else [(socket.AF_INET, "")]
    bound = 0
    for family, anywhere in families:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):  # no such family on this host
                continue
            return False
        with s:
            try:
                s.bind((anywhere, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    continue  # the family is there but unusable (IPv6 turned off): the other one decides
                return False
            bound += 1
    return bound > 0


def launch_local(job: Job, progress: Progress | None = None) -> JobResult:
    """Start ``job.ranks`` worker processes here, watch them, and return rank 0's result
    (``progress`` as ``launch`` says)."""
    n = job.ranks
    if pick_backend(job.options)[0] == "nccl":
        problem = placement_problem(n, torch.cuda.device_count()) or memory_problem(
            job, range(n), available_bytes(), "this host (beside the GPUs)", beside_gpus=True)
        if problem:
            raise InputError(problem)
    else:
        problem = host_memory_problem(job, available_bytes())
        if problem:
            raise InputError(problem)
    tmp = run_directory("treeattn-run-", job)
    procs: list = []
    # one request with the command's own (cli.run), whose rows it keeps once the ranks measure
    wrapping = contextlib.ExitStack()
    wrap = wrapping.enter_context(wrap_up_on_signals(keeping=False)) if job.options.wrap_up else None
    previous = _stop_on_signals() if wrap is None else {}
    kept = False
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TREEATTN_PARENT_PID=str(os.getpid()))
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
        if pick_backend(job.options)[0] == "nccl" or not forked_ranks(tmp, n, env, procs):
            for r in range(n):
                env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n))
                # held through the fork, where a signal's handler runs in an at-fork hook whose
                # exception Python drops; raised once the rank is recorded
                with open(tmp / f"rank{r}.log", "wb") as log, shielded():
                    procs.append(subprocess.Popen([sys.executable, "-m", "treeattn.exec.worker", str(tmp)],
                                                  env=env, stdout=log, stderr=subprocess.STDOUT))
        relay = None if progress is None else relay_progress(tmp, progress)
        killed = _watch(procs, relay, wrap, stop_wait_s(job.options) + GRACE_S, lambda: _timing(tmp))
        codes = [p.returncode for p in procs]
        # Rank 0 writes the result once every rank is past the last barrier: a rank that a
        # signal ended after that lost nothing.
        stopped = wrap is not None and wrap.signum is not None
        if stopped and not (tmp / "result.pkl").exists():  # killed, or stopped before a timed run
            raise_interrupt(wrap.signum, None)
        if any(codes) and not stopped:
            failure = rank_failure(tmp, codes, killed, lambda r: _log_tail(tmp, r))
            kept = failure.exit_code != 2  # bad input is said in full by the message
            raise keep_output(tmp, failure) if kept else failure
        if relay is not None:
            relay()  # rank 0's last runs, written as it ended
        with open(tmp / "result.pkl", "rb") as f:
            result = pickle.load(f)
    finally:
        try:
            # A second signal (Ctrl-C twice, `timeout` then its group) must not cut this short; a
            # first one is raised when it is done, under this launcher's handlers.
            with shielded():
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                # Bounded, 10 s for all: with signals held, ranks stuck in the kernel must not hold us.
                deadline = time.monotonic() + 10
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=max(0.0, deadline - time.monotonic()))
                if not kept:
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wrapping.close()
    if wrap is not None and wrap.signum is not None:  # the user's signal, not WRAP_UP_SIGNAL that passed it on
        result = dataclasses.replace(result, stopped=wrap.signum)
    return result


def forked_ranks(tmp: Path, n: int, env: dict[str, str], procs: list) -> bool:
    """Start the ``n`` ranks from one interpreter that imports torch once and forks them
    (``worker.fork_ranks``), appending them to ``procs``; False, with nothing started, where
    this process cannot adopt them (no child subreaper: not Linux) or might not learn how they
    exit: SIGCHLD ignored (the kernel reaps them) or handled (a handler may reap them first, as
    asyncio's child watchers that wait for any child do).

    The forking process runs in a process group of its own, which its ranks inherit: on any
    failure or signal while it works, the group is killed and what this process adopted of it
    reaped, before this raises.

    Raises:
        ExecutionError: the forking process failed (its last line of output is said).
    """
    if signal.getsignal(signal.SIGCHLD) is not signal.SIG_DFL:
        return False
    with _ADOPTING:
        was = _subreaper(True)
        if was is None:
            return False
        starter = None
        try:
            with open(tmp / "start.log", "wb") as log, shielded():  # as the ranks' Popen above
                starter = subprocess.Popen([sys.executable, "-m", "treeattn.exec.worker", str(tmp), "--ranks", str(n)],
                                           env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           process_group=0)
            code = starter.wait()
            pids = tmp / PIDS_FILE
            if code != 0 or not pids.exists():
                said = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
                raise ExecutionError(f"the ranks could not be started: the process that forks them {said}"
                                     f"{_last_output(tmp / 'start.log')}")
            procs.extend(_Adopted(int(pid)) for pid in pids.read_text().split())
        except BaseException:
            if starter is not None:
                _end_group(starter)
            raise
        finally:
            _subreaper(was)
    return True


_ADOPTING = threading.Lock()
"""Held while a forking process runs: whether orphans are adopted is the process's setting, so
two threads' launches must not set and restore it across each other."""


def _end_group(starter: subprocess.Popen) -> None:
    """Kill the forking process and every rank it forked (its process group), and reap those
    this process adopted."""
    with contextlib.suppress(OSError):
        os.killpg(starter.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-starter.pid, 0)
    starter.wait()


def _subreaper(on: bool) -> bool | None:
    """Set whether this process adopts its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``)
    and return what it was; None where that cannot be set."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int()
        if libc.prctl(37, ctypes.byref(was), 0, 0, 0) != 0 or libc.prctl(36, int(on), 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(was.value)


class _Adopted:
    """A rank that ``worker.fork_ranks`` forked and this process adopted: the part of
    ``subprocess.Popen`` the watchdog and the clean-up use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not adopted after all: it exits by itself (worker._die_with_parent)
                self.returncode = 1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _stop_on_signals() -> dict:
    """Make SIGTERM (``timeout``, a batch system ending the job) and SIGHUP (the terminal
    closed) unwind the launcher like Ctrl-C, so that it stops its ranks and removes its run
    directory; returns the handlers it replaced (none off the main thread, where a handler
    cannot be set). raise_interrupt notes the signal: the command exits 143 or 129 for it.
    A SIGHUP that ``nohup`` ignores stays ignored (``stopping_signals``)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, raise_interrupt) for sig in stopping_signals()}


def host_ranks(placed: RankEnv, environ: dict[str, str]) -> range:
    """The ranks on this process's host, as torchrun and srun (by default) place them, in
    blocks: ``LOCAL_WORLD_SIZE`` of them (torchrun), or this node's count in the step's
    ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``: per node), else the ones before this one on
    the host (what its local rank shows)."""
    first = placed.rank - placed.local_rank
    count = placed.local_rank + 1
    counts = _tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    node = environ.get("SLURM_NODEID", "")
    value = environ.get("LOCAL_WORLD_SIZE", "")
    if value.isdigit():
        count = max(count, int(value))
    elif counts and node.isdigit() and int(node) < len(counts):
        count = max(count, counts[int(node)])
    return range(max(0, first), min(placed.world, first + count))


def _tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks-per-node list (``2(x3),1`` is 2, 2, 2, 1), or [] where it is not one."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        n, _, times = part.partition("(x")
        if not n.isdigit() or (times and not times.rstrip(")").isdigit()):
            return []
        counts += [int(n)] * (int(times.rstrip(")")) if times else 1)
    return counts


def available_bytes() -> int | None:
    """This host's memory available to new processes (Linux ``MemAvailable``); None: unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_memory_problem(job: Job, available: int | None) -> str:
    """Why ``job``'s ranks, all on this host (gloo), cannot hold a plan's buffers in the
    ``available`` bytes, or "" (``footprint.memory_problem`` over every rank)."""
    return memory_problem(job, range(job.ranks), available, "this host") or ""


def relay_progress(tmp: Path, progress: Progress) -> Callable[[], None]:
    """What a launcher's watch calls between its looks (``_watch``, ``emulate.spawn``): passes
    rank 0's progress file in the run directory ``tmp`` on when it changed."""
    last: list[tuple[int, int, str] | None] = [None]

    def look() -> None:
        got = read_progress(tmp)
        if got is not None and got != last[0]:
            last[0] = got
            progress(*got)

    return look


def _timing(tmp: Path) -> bool:
    """Whether rank 0 has timed a run (its progress file, written as its first timed run ends):
    from then on a wrapped-up stop keeps something."""
    got = read_progress(tmp)
    return got is not None and got[2].startswith(TIMED_RUNS)


def _watch(procs: list, tick: Callable[[], None] | None = None, wrap: WrapUp | None = None,
           stop_wait: float = GRACE_S, measuring: Callable[[], bool] = lambda: True) -> set[int]:
    """Wait until every rank exits; once one fails, give the rest ``GRACE_S`` then kill them.
    Calls ``tick`` about every ``_TICK_S`` meanwhile. ``wrap`` keeps once the ranks time runs
    (``measuring``; before, a signal stops them at once: there is nothing to keep, and a rank
    may wait in its set-up, in C++, where no signal reaches Python); once it notes a request,
    each rank is sent ``WRAP_UP_SIGNAL`` and they get ``stop_wait`` seconds. Returns the ranks
    this watchdog killed."""
    failed_at = None
    killed: set[int] = set()
    told: set[int] = set()
    stop_by = None
    ticked = time.monotonic()
    while True:
        if tick is not None and time.monotonic() - ticked >= _TICK_S:
            ticked = time.monotonic()
            tick()
        if wrap is not None and not wrap.keeping and measuring():
            wrap.keeping = True
        if wrap is not None and wrap.signum is not None:
            if stop_by is None:
                stop_by = time.monotonic() + stop_wait
                sys.stderr.write(f"{signal.Signals(wrap.signum).name}: stopping the ranks before their next run to "
                                 f"keep what they timed (a second signal, {SAME_REQUEST_S:g} s or more later, stops "
                                 "at once)\n")
                sys.stderr.flush()
            for r, p in enumerate(procs):  # ranks started after the signal too
                if r not in told:
                    told.add(r)
                    p.send_signal(WRAP_UP_SIGNAL)
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return killed
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if (failed_at is not None and time.monotonic() - failed_at > GRACE_S
                or stop_by is not None and time.monotonic() > stop_by):
            for r, p in enumerate(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    killed.add(r)
            for p in procs:
                p.wait()
            return killed
        time.sleep(0.02)


def rank_failure(
    tmp: Path, codes: list[int], killed: set[int], log_tail: Callable[[int], str]
) -> InputError | ExecutionError:
    """The error of the rank that failed first, from the ranks' exit codes and the
    ``rankN.error.json`` reports they left in ``tmp``: a rank that died without a report or
    raised something else than a communication error, else one whose own wait failed (a
    timeout), else one that lost a peer, else one the watchdog stopped.

    Args:
        tmp: the run directory the workers wrote their reports into.
        codes: exit code per rank (negative: killed by that signal).
        killed: ranks the launcher stopped itself.
        log_tail: ``"; last output: ..."`` of a rank's output, or "".
    """
    reports: dict[int, dict] = {}
    for r in range(len(codes)):
        path = tmp / f"rank{r}.error.json"
        if path.exists():
            reports[r] = json.loads(path.read_text())
    failed = [r for r, c in enumerate(codes) if c != 0 and r not in killed]
    # The root cause: a rank that died silently or raised something else, then one whose own wait
    # failed; a rank that lost a peer saw another's failure (worker.failure_kind).
    order = {"comm": 1, "lost": 2}
    first = min(failed, key=lambda r: (order.get(reports.get(r, {}).get("kind"), 0), r)) if failed else min(killed)
    message = reports.get(first, {}).get("message", "")
    if _NOT_JOINED.match(message):  # names the ranks that never came, not the one that waited
        what = message
    elif first in reports:  # its first line: torch's messages run on with C++ frames (in the rank's log)
        what = f"rank {first} failed: {rendezvous.first_line(reports[first]['message'])}"
    elif codes[first] < 0:
        what = f"rank {first} was killed by signal {-codes[first]}{log_tail(first)}"
    else:
        what = f"rank {first} died with exit code {codes[first]} without reporting an error{log_tail(first)}"
    others = sorted(set(range(len(codes))) - {first})
    if others:
        what += f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
        what += f"{'were' if len(others) > 1 else 'was'} stopped)"
    if first in reports and reports[first].get("exit_code") == 2:
        return InputError(what)
    return ExecutionError(what)


def run_directory(prefix: str, job: Job) -> Path:
    """A new run directory in the temporary folder (``TMPDIR``), holding ``job.pkl`` for the
    ranks to read. A full disk, a file-size limit or an unwritable ``TMPDIR`` end the run
    before any rank starts, with one line (and no directory left).

    Raises:
        ExecutionError: the directory or the job file cannot be written.
    """
    try:
        tmp = Path(tempfile.mkdtemp(prefix=prefix))
    except OSError as exc:
        raise ExecutionError(f"cannot make the run's directory in {tempfile.gettempdir()} (TMPDIR): "
                             f"{exc.strerror or exc}") from None
    try:
        (tmp / "job.pkl").write_bytes(pickle.dumps(job))
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExecutionError(f"cannot write the run's job file {tmp / 'job.pkl'}: {exc.strerror or exc}") from None
    return tmp


def keep_output(tmp: Path, failure: TreeattnError) -> TreeattnError:
    """``failure`` saying where the run directory ``tmp`` is kept: the message holds a rank's
    last line, but NCCL_DEBUG output or a C++ stack is in the rest of its ``rankN.log``. The
    job and result files go (they can be large)."""
    for name in ("job.pkl", "result.pkl"):
        (tmp / name).unlink(missing_ok=True)
    return type(failure)(f"{failure}; every rank's output is kept in {tmp}")


def _log_tail(tmp: Path, rank: int) -> str:
    return _last_output(tmp / f"rank{rank}.log")


def _last_output(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f"; last output: {lines[-1][:300]}" if lines else ""
