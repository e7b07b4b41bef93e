"""Thin wrappers over ``ip`` and ``tc``: preflight, running steps, finding and removing
namespaces and the processes inside them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from treeattn.emulate.commands import Step
from treeattn.errors import EmulationError
from treeattn.interrupts import shielded

__all__ = [
    "require_netns",
    "run_step",
    "list_namespaces",
    "namespace_inode",
    "pids_in_netns",
    "kill_pids",
    "delete_namespace",
    "tx_bytes",
]

NETNS_DIR = Path("/run/netns")


def require_netns() -> None:
    """Raise ``EmulationError`` unless this process is root and iproute2 is installed."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise EmulationError(
            f"treeattn emulate needs iproute2 ({' and '.join(missing)} not found on PATH); "
            "install it, e.g. apt-get install iproute2"
        )
    if os.geteuid() != 0:
        raise EmulationError(
            "treeattn emulate needs root to create network namespaces and shape links; run it with sudo"
        )


def run_step(step: Step) -> str:
    """Run one command; raise ``EmulationError`` with its stderr when it fails."""
    try:
        # the fork alone held: a signal inside it would be dropped (``spawn.run_in_namespaces``)
        with shielded():
            proc = subprocess.Popen(step.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
    except OSError as exc:
        raise EmulationError(f"{' '.join(step.argv)} failed: {exc}") from None
    try:
        out, err = proc.communicate(step.stdin, timeout=60)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        raise EmulationError(f"{' '.join(step.argv)} failed: {exc}") from None
    except BaseException:  # an interrupt while it runs: not left behind
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        msg = " ".join((err or out).split())[:400]
        raise EmulationError(f"{' '.join(step.argv)} failed: {msg}")
    return out


def list_namespaces() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def namespace_inode(ns: str) -> int | None:
    """Inode identifying the namespace (what ``/proc/PID/ns/net`` links to), None if gone."""
    try:
        return os.stat(NETNS_DIR / ns).st_ino
    except OSError:
        return None


def pids_in_netns(inodes: set[int]) -> list[int]:
    """Processes whose network namespace is one of ``inodes`` (zombies have none)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            target = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if target.startswith("net:[") and int(target[5:-1]) in inodes:
            out.append(int(entry))
    return sorted(out)


def kill_pids(pids: list[int], grace_s: float = 1.0) -> list[int]:
    """SIGTERM, wait up to ``grace_s`` for them to go, then SIGKILL; returns those signalled."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    alive = list(sent)
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [pid for pid in alive if _alive(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return sent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def delete_namespace(ns: str) -> None:
    """``ip netns del`` (its interfaces, and the veth peers of those, go with it)."""
    if (NETNS_DIR / ns).exists():
        run_step(Step(("ip", "netns", "del", ns)))


def tx_bytes(ns: str) -> dict[str, int]:
    """Bytes each interface of ``ns`` has sent."""
    out = run_step(Step(("ip", "-n", ns, "-s", "-j", "link", "show")))
    return {e["ifname"]: int(e["stats64"]["tx"]["bytes"]) for e in json.loads(out)}
