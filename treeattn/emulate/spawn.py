"""Run a command per rank inside the rank namespaces (``ip netns exec``).

Each rank's process starts in a session of its own, so a Ctrl-C at the terminal reaches only
treeattn, which then stops every rank itself (SIGTERM, then SIGKILL) before the cluster goes.
Each also gets SIGKILL should treeattn die first (``kill -9``): ``ip netns exec`` execs the
command in place, so the rank is the direct child the signal is armed on.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from treeattn.emulate.cluster import MASTER_PORT, Cluster
from treeattn.errors import ExecutionError
from treeattn.interrupts import shielded

_TICK_S = 0.5
"""How often a watch with a ``tick`` calls it (the launcher's progress, as ``exec.launch`` looks)."""

__all__ = ["RankResult", "run_in_namespaces"]


@dataclass(frozen=True, slots=True)
class RankResult:
    """How one rank's command ended."""

    rank: int
    returncode: int
    stdout: str
    stderr: str
    stopped: bool = False  # signalled by run_in_namespaces itself (not a rank that died on its own)


def run_in_namespaces(
    cluster: Cluster,
    cmd_for_rank: Callable[[int], Sequence[str] | None],
    env_for_rank: Callable[[int], Mapping[str, str]] | None = None,
    *,
    timeout_s: float = 300.0,
    master_port: int = MASTER_PORT,
    fail_fast_s: float | None = 5.0,
    check: bool = False,
    cwd: str | None = None,
    tick: Callable[[], None] | None = None,
) -> tuple[RankResult, ...]:
    """Start ``cmd_for_rank(r)`` inside rank r's namespace for every rank, wait for all.

    Each process sees the caller's environment, then ``cluster.env(r)`` (RANK, WORLD_SIZE,
    MASTER_ADDR = rank 0's address, MASTER_PORT, GLOO_SOCKET_IFNAME = its interface, ...),
    then ``env_for_rank(r)``.

    Args:
        cluster: from ``up`` or ``emulated``.
        cmd_for_rank: argv for rank r, or None to start nothing there.
        env_for_rank: extra variables for rank r.
        timeout_s: the whole run's limit; past it every rank is stopped.
        master_port: rendezvous port on rank 0.
        fail_fast_s: once a rank exits non-zero, stop the others this many seconds later
            (they would wait for it forever); None waits for all.
        check: raise ``ExecutionError`` when a rank fails instead of returning.
        cwd: working directory of the ranks.
        tick: called about every ``_TICK_S`` while the ranks run (progress).

    Returns:
        One result per started rank, in rank order.

    Raises:
        ExecutionError: on timeout, or with ``check`` when a rank exits non-zero.
    """
    procs: dict[int, tuple[subprocess.Popen, object, object]] = {}
    stopped: set[int] = set()
    try:
        for r in range(cluster.num_ranks):
            argv = cmd_for_rank(r)
            if argv is None:
                continue
            env = dict(os.environ)
            env.update(cluster.env(r, master_port))
            if env_for_rank is not None:
                env.update(env_for_rank(r))
            out = tempfile.TemporaryFile(mode="w+b")
            err = tempfile.TemporaryFile(mode="w+b")
            # A signal landing inside the fork runs its handler in an at-fork hook, whose
            # exception Python drops: held here, it is raised once the rank is recorded.
            with shielded():
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", cluster.rank(r).ns, *argv],
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
                procs[r] = (proc, out, err)
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        ticked = time.monotonic()
        while any(p.poll() is None for p, _, _ in procs.values()):
            now = time.monotonic()
            if tick is not None and now - ticked >= _TICK_S:
                ticked = now
                tick()
            if failed_at is None and any(p.returncode not in (None, 0) for p, _, _ in procs.values()):
                failed_at = now
            if now > deadline:
                late = [r for r, (p, _, _) in procs.items() if p.poll() is None]
                raise ExecutionError(f"ranks {late} did not finish within {timeout_s:g} s; stopped them")
            if failed_at is not None and fail_fast_s is not None and now - failed_at > fail_fast_s:
                break
            time.sleep(0.02)
    finally:
        stopped = _stop([p for p, _, _ in procs.values()])
    results = []
    for r, (proc, out, err) in sorted(procs.items()):
        out.seek(0)
        err.seek(0)
        results.append(RankResult(r, proc.returncode, out.read().decode(errors="replace"),
                                  err.read().decode(errors="replace"), proc.pid in stopped))
        out.close()
        err.close()
    if check:
        bad = [res for res in results if res.returncode != 0]
        if bad:
            tail = " | ".join(bad[0].stderr.strip().splitlines()[-3:])
            raise ExecutionError(f"rank {bad[0].rank} exited with status {bad[0].returncode}: {tail}")
    return tuple(results)


def _die_with_parent() -> None:
    # NOTE: runs in the child between fork and exec; Linux only, silently skipped elsewhere.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(procs: list[subprocess.Popen]) -> set[int]:
    """SIGTERM each still-running process group, SIGKILL after a second, reap all; returns the
    pids it signalled."""
    running = [p for p in procs if p.poll() is None]
    signalled = {p.pid for p in running}
    for sig, wait_s in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        for p in running:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while running and time.monotonic() < deadline:
            time.sleep(0.02)
            running = [p for p in running if p.poll() is None]
    for p in procs:
        try:
            p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
    return signalled
