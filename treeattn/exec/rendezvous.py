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
its mark in the store and waits for every rank's, so a rank that never came is named
(``wait_joined``), by every rank that did.

A rank that does not host the store first waits, within the deadline, until something
accepts TCP connections at ``MASTER_ADDR:MASTER_PORT`` (a bare connection, closed at once; the
store server ignores it), then lets torch connect with the time left; one that never can
fails with one line naming the address and why (refused, unresolved, no answer). A server
that goes away in the milliseconds between that connection and torch's still meets torch's
own retry. Later set-up steps (the plan check, NCCL's pair communicators, barriers) each have
the whole deadline, as they had: by then every rank has joined.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable

import torch.distributed as dist

from treeattn.errors import ExecutionError

__all__ = ["join", "reach_store", "hosts_store", "wait_joined", "MIN_LEFT_S"]

MIN_LEFT_S = 0.1
"""The least time a step is given once the store answered: torch's calls need a timeout above
zero, and a step whose peers are all there takes milliseconds."""

_PROBE_S = (0.05, 1.0)
"""First and longest pause between attempts to reach the store (doubling in between)."""


def hosts_store(rank: int, environ: dict[str, str] | None = None) -> bool:
    """Whether this process serves the rendezvous store itself: rank 0, unless torchrun's agent
    serves it (``TORCHELASTIC_USE_AGENT_STORE``, read as ``torch.distributed.rendezvous`` does)."""
    env = os.environ if environ is None else environ
    return rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)


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
    wait_joined(store, rank, world, left(), setup_s)
    # What init_process_group does with the store it makes (a prefix: the store may be shared).
    whole = datetime.timedelta(seconds=setup_s)
    # The group's timeout bounds gloo's connection of the ranks, and is later each collective's
    # (NCCL: its watchdog's); a torch that cannot set it again keeps the whole deadline here.
    restore = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                            timeout=left() if restore else whole, **(init or {}))
    store.set_timeout(whole)
    if restore:
        restore(whole)


def _joined_key(rank: int) -> str:
    # torchrun's agent keeps its store across restarts of the workers: a key of an earlier
    # attempt must not count as this one's
    return f"treeattn/setup/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/joined/{rank}"


def wait_joined(store: dist.Store, rank: int, world: int, timeout: datetime.timedelta, setup_s: float) -> None:
    """Mark ``rank`` as connected in ``store`` and wait, within ``timeout``, until every rank
    of ``world`` has; else raise ``ExecutionError`` naming the ranks that have not (one line).
    ``setup_s`` is the whole deadline's length, for the message."""
    try:
        store.set(_joined_key(rank), b"1")
        store.wait([_joined_key(r) for r in range(world)], timeout)
        return
    except (RuntimeError, dist.DistError) as exc:  # DistStoreError (timeout), DistNetworkError (store gone)
        failure = exc
    try:
        missing = [r for r in range(world) if not store.check([_joined_key(r)])]
    except (RuntimeError, dist.DistError):
        missing = None
    if missing is None:
        raise ExecutionError(
            f"rank {rank} lost the rendezvous store while the ranks connected ({_first_line(failure)}): the rank "
            "that serves it, rank 0 or torchrun's agent, died or ended") from None
    if not missing:  # every rank came just as the wait ended
        return
    which = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {_ranges(missing)}"
    raise ExecutionError(
        f"{which} of {world} did not connect within the {setup_s:g} s set-up deadline (rank {rank} waited; a rank "
        "that never connected hung, died or was not started; treeattn run takes a longer deadline with "
        "--setup-timeout)") from None


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


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
