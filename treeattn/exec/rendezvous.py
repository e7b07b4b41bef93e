"""Joining the world's process group within one set-up deadline.

``run_rank`` creates the process group from the env:// variables (``MASTER_ADDR``,
``MASTER_PORT``) in steps that each wait for peers: connecting to the rendezvous store (rank 0
serves it, or torchrun's agent), then the backend's own connection of every rank (gloo's full
mesh, NCCL's communicator) through that store. Each step is given what is left of one
deadline, ``--setup-timeout`` counted from the start of the first, so a rank whose peers never
come gives up once, after about that deadline. Left to torch, each step waits the whole
timeout again, and so does torch's store client: a connection attempt that times out is
retried after a random back-off with the whole timeout once more (``TCPStore.cpp``), so a
rank pointed at an address nobody serves waited about twice the deadline, or more.

Rank 0, where it serves the store, does not wait in it for the others to connect (torch's
store counts them, "3/4 clients joined", but cannot say which is missing): every rank writes
its mark in the store, and rank 0 waits for every mark and then tells the others which ranks
never came (``wait_joined``), so every rank that came names them. Not under torchrun's agent,
whose store outlives a round of ranks and whose rendezvous started them all.

Every rank first waits, within the deadline, until ``MASTER_ADDR`` resolves (a new host's DNS
record may come after its peers start), saying once after ``UNRESOLVED_WARN_S`` that it waits.
A rank that does not host the store then waits until something
accepts TCP connections at ``MASTER_ADDR:MASTER_PORT`` (a bare connection, closed at once; the
store server ignores it), then lets torch connect with the time left; one that never can
fails with one line naming the address and why (refused, unresolved, no answer). A server
that goes away in the milliseconds between that connection and torch's still meets torch's
own retry. Later set-up steps (the plan check, NCCL's pair communicators, barriers) each have
the whole deadline, as they had: by then every rank has joined.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
import sys
import time
from collections.abc import Callable

import torch.distributed as dist

from treeattn.errors import ExecutionError

__all__ = ["join", "reach_store", "wait_resolvable", "hosts_store", "agent_store", "wait_joined", "first_line",
           "MIN_LEFT_S", "VERDICT_WAIT_S", "UNRESOLVED_WARN_S"]

MIN_LEFT_S = 0.1
"""The least time a step is given once the store answered: torch's calls need a timeout above
zero, and a step whose peers are all there takes milliseconds."""

_PROBE_S = (0.05, 1.0)
"""First and longest pause between attempts to reach the store (doubling in between)."""

UNRESOLVED_WARN_S = 5.0
"""How long a ``MASTER_ADDR`` may go unresolved before the rank says so (once) and waits on."""


def hosts_store(rank: int, environ: dict[str, str] | None = None) -> bool:
    """Whether this process serves the rendezvous store itself: rank 0, unless torchrun's agent
    serves it (``TORCHELASTIC_USE_AGENT_STORE``, read as ``torch.distributed.rendezvous`` does)."""
    return rank == 0 and not agent_store(environ)


def wait_resolvable(addr: str, rank: int, deadline: float, setup_s: float,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                    warn: Callable[[str], None] | None = None) -> None:
    """Return once ``addr`` resolves; raise ``ExecutionError`` (one line) where it did not before
    ``deadline``. A name that does not resolve may yet (a new host's DNS record comes after its
    peers start: a Kubernetes service, a cloud host), so it is waited for; past
    ``UNRESOLVED_WARN_S`` the rank says once that it waits (``warn``, default stderr), so that a
    mistyped name is seen at once rather than at the deadline."""
    start, pause, warned = None, _PROBE_S[0], False
    while True:
        try:
            socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
            return
        except socket.gaierror as exc:
            problem = (exc.strerror or str(exc)).lower()
        start = clock() if start is None else start  # the clock is read only once a lookup failed
        left = deadline - clock()
        if left <= 0:
            break
        if not warned and clock() - start >= UNRESOLVED_WARN_S:
            warned = True
            (warn or _stderr)(f"warning: rank {rank}: MASTER_ADDR={addr} does not resolve ({problem}); waiting for it "
                              f"until the {setup_s:g} s set-up deadline (a mistyped name? Ctrl-C stops)")
        sleep(min(pause, left))
        pause = min(2 * pause, _PROBE_S[1])
    raise ExecutionError(f"rank {rank} could not resolve MASTER_ADDR={addr} within the {setup_s:g} s set-up deadline: "
                         f"{problem} (a mistyped host name, or one whose DNS record never came; treeattn run takes "
                         "a longer deadline with --setup-timeout)")


def _stderr(line: str) -> None:
    if notice is not None:
        notice(line)
        return
    print(line, file=sys.stderr, flush=True)


notice: Callable[[str], None] | None = None
"""Where a rank says a line during the set-up (``wait_resolvable``'s warning) while its stderr
is held for torch's log (``exec.launch``, which points this past it); None: stderr."""


def reach_store(addr: str, port: int, rank: int, deadline: float, setup_s: float,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once something accepts a TCP connection at ``addr:port``; raise
    ``ExecutionError`` (one line) where nothing did before ``deadline`` (on ``clock``).
    ``setup_s`` is the whole deadline's length, for the message."""
    pause, last = _PROBE_S[0], "no attempt finished in time"
    while True:
        left = deadline - clock()
        if left <= 0:
            break
        try:
            with socket.create_connection((addr, port), timeout=left) as conn:
                # A connection to a free port in the ephemeral range of this host can land on
                # itself (TCP's simultaneous open): nothing listens, and while it lives it holds
                # the port the store's server is about to bind.
                if conn.getsockname() != conn.getpeername():
                    return
                last = "connection refused"
        except socket.gaierror as exc:
            last = f"cannot resolve {addr!r} ({exc.strerror or exc})"
        except TimeoutError:
            last = "no answer"
        except OSError as exc:
            last = (exc.strerror or str(exc)).lower()
        left = deadline - clock()
        if left <= 0:
            break
        sleep(min(pause, left))
        pause = min(2 * pause, _PROBE_S[1])
    raise ExecutionError(
        f"rank {rank} could not reach the rendezvous at {addr}:{port} (MASTER_ADDR:MASTER_PORT) within the "
        f"{setup_s:g} s set-up deadline: {last} (the rank that serves it, rank 0 or torchrun's agent, did not "
        "start or died, or the address is wrong; treeattn run takes a longer deadline with --setup-timeout)")


def join(backend: str, rank: int, world: int, setup_s: float, init: dict | None = None,
         clock: Callable[[], float] = time.monotonic) -> None:
    """``init_process_group`` from the env:// variables, every step within what is left of
    one ``setup_s`` deadline (see the module docstring). The group and its store keep the
    whole ``setup_s`` as their timeout afterwards, for what runs on them (each set-up
    collective, NCCL's watchdog)."""
    deadline = clock() + setup_s

    def left() -> datetime.timedelta:
        return datetime.timedelta(seconds=max(MIN_LEFT_S, deadline - clock()))

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    global stage  # noqa: PLW0603 - read by the launcher's watchdog (exec.launch)
    stage = "resolving MASTER_ADDR"
    if addr:
        wait_resolvable(addr, rank, deadline, setup_s, clock)
    stage = "reaching the rendezvous store"
    if addr and port.isdigit() and hosts_store(rank):
        # torch's env:// rendezvous, but the server does not wait for the clients: wait_joined does
        use_libuv = os.environ.get("USE_LIBUV", "1") == "1"
        store = dist.TCPStore(addr, int(port), world, is_master=True, timeout=left(), wait_for_workers=False,
                              multi_tenant=True, use_libuv=use_libuv)
    else:  # torch's rendezvous names what is missing
        if addr and port.isdigit():
            reach_store(addr, int(port), rank, deadline, setup_s, clock)
        store, rank, world = next(dist.rendezvous("env://", rank, world, timeout=left()))
    store.set_timeout(left())
    if not agent_store():  # torchrun's agent started every rank of the round it serves already
        stage = "waiting for every rank to reach the store"
        wait_joined(store, rank, world, left(), setup_s, host=hosts_store(rank))
    stage = "connecting the process group (the backend's connection of every pair of ranks)"
    # What init_process_group does with the store it makes (a prefix: the store may be shared).
    whole = datetime.timedelta(seconds=setup_s)
    # The group's timeout bounds gloo's connection of the ranks, and is later each collective's
    # (NCCL: its watchdog's); a torch that cannot set it again keeps the whole deadline here.
    restore = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    try:
        dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                                timeout=left() if restore else whole, **(init or {}))
    except dist.DistNetworkError as exc:
        # rank 0 may have given up on another rank at its own deadline and ended, its store with it
        raise ExecutionError(
            f"rank {rank} lost the rendezvous store while the process group connected ({first_line(str(exc))}): the "
            "rank that serves it, rank 0 or torchrun's agent, ended, having given up on another rank at its "
            "set-up deadline (its error names that rank) or died") from None
    except dist.DistStoreError as exc:
        # gloo waits for each rank's address under a key ending in that rank
        late = re.search(r"keys: \S*/(\d+)\s*$", str(exc).strip())
        if late is None:
            raise
        raise ExecutionError(
            f"rank {late[1]} of {world} reached the store but did not open the process group within the "
            f"{setup_s:g} s set-up deadline (rank {rank} waited; it died or hung after the ranks met)") from None
    stage = ""
    store.set_timeout(whole)
    if restore:
        restore(whole)


stage = ""
"""The set-up step this process is in (``join``), for the launcher's watchdog; "" outside one."""

_JOINED = "treeattn/setup/joined/{}"
_VERDICT = "treeattn/setup/verdict"
_SEEN = "treeattn/setup/seen/{}"
VERDICT_WAIT_S = 2.0
"""How long the store's rank waits, after its deadline, for the ranks that came to read which did not."""


def agent_store(environ: dict[str, str] | None = None) -> bool:
    """Whether torchrun's agent serves the store (``TORCHELASTIC_USE_AGENT_STORE``, read as
    ``torch.distributed.rendezvous`` does): it outlives a round of ranks, and started them all."""
    env = os.environ if environ is None else environ
    return env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def wait_joined(store: dist.Store, rank: int, world: int, timeout: datetime.timedelta, setup_s: float,
                host: bool) -> None:
    """Mark ``rank`` as come in ``store`` and wait, within ``timeout``, until every rank of
    ``world`` has; else raise ``ExecutionError`` naming the ranks that have not (one line).

    The rank that serves the store (``host``) waits for every mark, then writes its verdict (""
    or the missing ranks); the others wait for the verdict. At its deadline the host waits up to
    ``VERDICT_WAIT_S`` more for the ranks that came to read it: once it has ended, its store is
    gone. A rank whose own deadline comes first names the missing ranks itself. ``setup_s`` is
    the whole deadline's length, for the message."""
    try:
        store.set(_JOINED.format(rank), b"1")
        if not host:
            try:
                store.wait([_VERDICT], timeout)
            except dist.DistStoreError:  # its deadline came first: the store's rank still waits
                missing = _missing(store, world)
                if missing:
                    raise ExecutionError(_not_joined(missing, world, rank, setup_s)) from None
                return
            verdict = store.get(_VERDICT).decode()
            if verdict:
                store.set(_SEEN.format(rank), b"1")
                missing = [int(r) for r in verdict.split(",")]
                if rank in missing:  # came while rank 0 waited for the others to read its verdict
                    others = [r for r in missing if r != rank]
                    raise ExecutionError(
                        f"rank {rank} reached the store after rank 0's set-up deadline had passed ({setup_s:g} s; "
                        f"rank 0 gave up{' on ' + _ranges(others) if others else ''}): start every rank within "
                        "the deadline, or give a longer one with --setup-timeout")
                raise ExecutionError(_not_joined(missing, world, rank, setup_s))
            return
        try:
            store.wait([_JOINED.format(r) for r in range(world)], timeout)
            missing = []
        except dist.DistStoreError:
            missing = _missing(store, world)
        store.set(_VERDICT, ",".join(map(str, missing)).encode())
        if missing:
            came = [_SEEN.format(r) for r in range(world) if r not in missing and r != rank]
            with contextlib.suppress(dist.DistError):
                if came:
                    store.wait(came, datetime.timedelta(seconds=VERDICT_WAIT_S))
            raise ExecutionError(_not_joined(missing, world, rank, setup_s))
    except dist.DistNetworkError as exc:
        raise ExecutionError(_lost_store(rank, exc)) from None


def _missing(store: dist.Store, world: int) -> list[int]:
    return [r for r in range(world) if not store.check([_JOINED.format(r)])]


def _not_joined(missing: list[int], world: int, rank: int, setup_s: float) -> str:
    which = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {_ranges(missing)}"
    return (f"{which} of {world} did not connect within the {setup_s:g} s set-up deadline (rank {rank} waited; a "
            "rank that never connected hung, died or was not started; treeattn run takes a longer deadline with "
            "--setup-timeout)")


def _lost_store(rank: int, exc: BaseException) -> str:
    return (f"rank {rank} lost the rendezvous store while the ranks connected ({first_line(str(exc))}): the rank that "
            "serves it, rank 0 or torchrun's agent, died or ended")


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (torch's messages can run on with C++ frames)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _ranges(ranks: list[int]) -> str:
    """``0-3, 5``: sorted ranks, runs as ranges."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)
