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

__all__ = ["join", "reach_store", "hosts_store", "MIN_LEFT_S"]

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
    if not hosts_store(rank) and addr and port.isdigit():  # else torch's rendezvous names what is missing
        reach_store(addr, int(port), rank, deadline, setup_s, clock)
    store, rank, world = next(dist.rendezvous("env://", rank, world, timeout=left()))
    store.set_timeout(left())
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
