"""Bring an emulated cluster up and down, and remember what was made.

Every run writes ``/run/treeattn-emulate/RUNID.json`` *before* it creates anything, and
names everything ``ta-RUNID-...``; ``down`` removes what the state files and that prefix
name, killing every process inside those namespaces first, so it works after a crash or
``kill -9`` of the process that ran ``up``, and ``down`` of every run can be repeated (``down``
of one run id refuses an id that is not there: a typo must not read as a cluster removed). ``up`` and ``emulated`` clean
up themselves on an exception, Ctrl-C (SIGINT), SIGTERM or SIGHUP.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from treeattn.emulate.commands import setup_steps
from treeattn.emulate.layout import Layout, RankNet, ns_prefix, plan_layout
from treeattn.emulate.netns import (
    delete_namespace,
    kill_pids,
    list_namespaces,
    namespace_inode,
    pids_in_netns,
    require_netns,
    run_step,
)
from treeattn.errors import EmulationError, InputError
from treeattn.interrupts import interrupts_raise, shielded
from treeattn.topology.model import Topology

__all__ = [
    "STATE_DIR",
    "MASTER_PORT",
    "Cluster",
    "DownResult",
    "up",
    "down",
    "find_cluster",
    "list_clusters",
    "emulated",
]

STATE_DIR = Path("/run/treeattn-emulate")
MASTER_PORT = 29500
"""Rendezvous port; free in every fresh namespace, so runs never collide on it."""
_OURS = re.compile(r"^ta-([0-9a-f]{6})-")


@dataclass(frozen=True)
class Cluster:
    """A running emulated cluster: its layout and the topology it emulates."""

    layout: Layout
    topology: Topology
    state_path: Path = field(default=STATE_DIR)

    @property
    def run_id(self) -> str:
        return self.layout.run_id

    @property
    def num_ranks(self) -> int:
        return len(self.layout.ranks)

    def rank(self, r: int) -> RankNet:
        return self.layout.ranks[r]

    def env(self, r: int, master_port: int = MASTER_PORT) -> dict[str, str]:
        """torch.distributed variables for rank ``r`` (gloo bound to its interface)."""
        net = self.layout.ranks[r]
        return {
            "RANK": str(r),
            "WORLD_SIZE": str(self.num_ranks),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": self.layout.ranks[0].ip,
            "MASTER_PORT": str(master_port),
            "GLOO_SOCKET_IFNAME": net.gloo_iface,
            "TREEATTN_EMU_RUN": self.run_id,
            "TREEATTN_EMU_NS": net.ns,
            "TREEATTN_EMU_IP": net.ip,
        }


@dataclass(frozen=True, slots=True)
class DownResult:
    """What ``down`` removed."""

    run_ids: tuple[str, ...]
    namespaces: tuple[str, ...]
    killed: tuple[int, ...]
    left: tuple[str, ...] = ()
    """Runs ``down`` of every run left up: in use by a live command (their condition says which)."""


def _state_file(run_id: str) -> Path:
    return STATE_DIR / f"{run_id}.json"


def _write_state(layout: Layout, status: str, *, held: bool = False) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    data = {
        "run_id": layout.run_id,
        "status": status,
        "pid": os.getpid(),
        "started": _start_time(os.getpid()),
        "held": held,
        "topology": layout.topology,
        "fingerprint": layout.fingerprint,
        "scale": layout.scale,
        "namespaces": list(layout.namespaces),
        "ranks": [{"rank": r.rank, "ns": r.ns, "ip": r.ip, "iface": r.gloo_iface} for r in layout.ranks],
    }
    _save_state(data)


def _save_state(data: dict) -> None:
    """Write a run's state whole (a new file renamed over the old: a reader never sees half)."""
    path = _state_file(data["run_id"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    tmp.replace(path)


def list_clusters() -> list[dict]:
    """State of every run this machine remembers, plus runs known only by their namespaces."""
    states: dict[str, dict] = {}
    if STATE_DIR.is_dir():
        for path in sorted(STATE_DIR.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                states[data["run_id"]] = data
            except (OSError, ValueError, KeyError):
                continue
    live = list_namespaces()
    for ns in live:
        m = _OURS.match(ns)
        if m and m.group(1) not in states:
            states[m.group(1)] = {"run_id": m.group(1), "status": "orphaned", "namespaces": []}
    for data in states.values():
        prefix = ns_prefix(data["run_id"])
        data["live_namespaces"] = [ns for ns in live if ns.startswith(prefix)]
        data["condition"] = _condition(data, set(live))
    return [states[k] for k in sorted(states)]


def _condition(data: dict, live: set[str]) -> str:
    """What ``emulate status`` says of a run: its state file's word, where that still holds,
    else what became of it (a namespace deleted by hand, the process that was making it or
    held it for one command killed)."""
    status, pid = data.get("status", "?"), data.get("pid")
    if status == "creating" and not _alive(pid):
        return f"broken (pid {pid} ended while making it; treeattn emulate down removes it)"
    if status != "ready":
        return status
    made = data.get("namespaces", [])
    gone = [ns for ns in made if ns not in live]
    if gone:
        return f"damaged ({len(gone)} of {len(made)} namespaces gone: {gone[0]}; treeattn emulate down removes it)"
    user = data.get("user") or {}
    if _alive(user.get("pid"), user.get("started")):  # a command that found it up and runs on it
        return f"in use by pid {user['pid']}"
    if data.get("held"):  # brought up for one command, which removes it as it ends
        if _alive(pid, data.get("started")):
            return f"in use by pid {pid}"
        return f"ready (left by pid {pid}, which ended without removing it)"
    return status


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot: ``/proc/PID/stat`` field 22), which
    tells it from a later process given the same pid."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 and fields[19].isdigit() else None


def _alive(pid: object, started: object = None) -> bool:
    """Whether process ``pid`` runs, and is the one that started at ``started`` where given (a
    pid is reused): a zombie does not run (killed, it waits for a parent that may never reap
    it: in a container whose first process reaps none)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not Path(f"/proc/{pid}").exists():
        return False
    fields = _stat_fields(pid)
    if fields is None:
        return True  # there, but unreadable: another user's
    if fields[:1] in (["Z"], ["X"]):
        return False
    return not isinstance(started, int) or _start_time(pid) == started


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """This machine's emulate commands one at a time through it (an exclusive ``flock``)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _set_user(run_id: str, user: dict | None) -> None:
    """Record in run ``run_id``'s state the command that runs on it (None: none), for
    ``emulate status``, ``find_cluster`` and ``down`` of every run; a state gone is left gone."""
    try:
        data = json.loads(_state_file(run_id).read_text())
    except (OSError, ValueError):
        return
    data["user"] = user
    _save_state(data)


def new_run_id() -> str:
    return secrets.token_hex(3)


def up(topo: Topology, *, scale: float = 1.0, run_id: str | None = None, held: bool = False) -> Cluster:
    """Create the namespaces, bridges, veths, addresses, routes and shapers of ``topo``.

    Args:
        topo: the topology to emulate (one rank per device).
        scale: factor on every link's bandwidth.
        run_id: six hex digits; random when None.
        held: brought up for one command that removes it as it ends (``emulated``), as
            ``emulate status`` tells.

    Returns:
        The running cluster; it stays up until ``down``.

    Raises:
        EmulationError: not root, no iproute2, an unemulable topology, a run id in use, or
            a command that failed (everything made so far is removed first).
    """
    layout = plan_layout(topo, scale=scale, run_id=new_run_id() if run_id is None else run_id)
    require_netns()
    taken = [ns for ns in list_namespaces() if ns.startswith(layout.prefix)]
    if taken:
        raise EmulationError(
            f"run id {layout.run_id} is in use ({taken[0]}); run `treeattn emulate down --id {layout.run_id}` first"
        )
    _write_state(layout, "creating")
    try:
        with interrupts_raise():
            for step in setup_steps(layout):
                run_step(step)
    except BaseException:
        with shielded():
            _remove(layout.run_id, list(layout.namespaces))
        raise
    _write_state(layout, "ready", held=held)
    return Cluster(layout, topo, _state_file(layout.run_id))


def down(run_id: str | None = None) -> DownResult:
    """Remove a run (or every run) and kill the processes inside its namespaces.

    Args:
        run_id: the run to remove; None removes every ``ta-RUNID-`` namespace and state file
            but those of a cluster a live command brought up for itself and still runs on
            (``emulated``: a validate or an emulate run of another shell), which it leaves,
            naming them; ``run_id`` removes any.

    Returns:
        The run ids, namespaces and process ids it removed or killed.

    Raises:
        InputError: no run ``run_id`` is on this machine (neither a state file nor a namespace).
    """
    require_netns()
    known = {c["run_id"]: c for c in list_clusters()}
    if run_id is not None:
        ns_prefix(run_id)
        if run_id not in known:
            # A mistyped id would otherwise read as a cluster removed, with the real one still up.
            there = f"there are: {', '.join(sorted(known))} (treeattn emulate status)" if known else "there are none"
            raise InputError(f"no emulated cluster {run_id} on this machine; {there}")
        known = {run_id: known[run_id]}
    known, left = _removable(known, run_id)
    removed: list[str] = []
    killed: list[int] = []
    with shielded():
        for rid in sorted(known):
            c = known[rid]
            nss = sorted(set(c.get("namespaces", [])) | set(c.get("live_namespaces", [])))
            k, r = _remove(rid, nss)
            killed += k
            removed += r
    return DownResult(tuple(sorted(known)), tuple(removed), tuple(killed), left)


def _removable(known: dict[str, dict], run_id: str | None) -> tuple[dict[str, dict], tuple[str, ...]]:
    """Of the runs ``known`` (``list_clusters``, by id), those ``down(run_id)`` removes, and those
    it leaves: with no id, every run but one a live command holds (``_condition``: in use)."""
    left = tuple(rid for rid, c in sorted(known.items()) if run_id is None and c["condition"].startswith("in use"))
    return {rid: c for rid, c in known.items() if rid not in left}, left


def _remove(run_id: str, namespaces: list[str]) -> tuple[list[int], list[str]]:
    prefix = ns_prefix(run_id)
    nss = sorted(set(namespaces) | {ns for ns in list_namespaces() if ns.startswith(prefix)})
    inodes = {i for i in (namespace_inode(ns) for ns in nss) if i is not None}
    killed: list[int] = []
    deadline = time.monotonic() + 5.0
    while inodes:
        pids = [p for p in pids_in_netns(inodes) if p != os.getpid()]
        if not pids or time.monotonic() > deadline:
            break
        killed += kill_pids(pids, grace_s=1.0 if not killed else 0.2)
    removed = []
    errors = []
    for ns in nss:
        try:
            delete_namespace(ns)
            removed.append(ns)
        except EmulationError as exc:
            errors.append(str(exc))
    if not errors:
        _state_file(run_id).unlink(missing_ok=True)
    else:
        raise EmulationError(f"could not remove every namespace of run {run_id}: {errors[0]}")
    return sorted(set(killed)), removed


def find_cluster(topo: Topology, scale: float = 1.0) -> Cluster | None:
    """A ready run of this topology (same fingerprint and scale) whose namespaces all exist, and
    that no other command holds: it removes its cluster as it ends, with every rank inside."""
    live = set(list_namespaces())
    for c in list_clusters():
        if c.get("status") != "ready" or c.get("fingerprint") != topo.fingerprint or c.get("scale") != scale:
            continue
        if c["condition"].startswith("in use"):
            continue
        if not set(c["namespaces"]) <= live:
            continue
        layout = plan_layout(topo, scale=scale, run_id=c["run_id"])
        if list(layout.namespaces) == c["namespaces"]:
            return Cluster(layout, topo, _state_file(c["run_id"]))
    return None


@contextlib.contextmanager
def emulated(topo: Topology, *, scale: float = 1.0, reuse: bool = True) -> Iterator[Cluster]:
    """A running cluster for ``topo`` for the duration of the block.

    Args:
        topo: the topology.
        scale: factor on every link's bandwidth.
        reuse: use a cluster already ``up`` for this topology and scale (left running);
            otherwise (or when none is) bring one up and remove it on leaving, whatever
            ends the block (exception, Ctrl-C, SIGTERM, SIGHUP).

    Yields:
        The cluster.
    """
    with _state_lock():  # two commands must not both find one free and take it
        existing = find_cluster(topo, scale) if reuse else None
        if existing is not None:
            _set_user(existing.run_id, {"pid": os.getpid(), "started": _start_time(os.getpid())})
    if existing is not None:
        try:
            yield existing
        finally:
            with shielded():
                _set_user(existing.run_id, None)
        return
    require_netns()
    run_id = new_run_id()
    with interrupts_raise():
        try:
            yield up(topo, scale=scale, run_id=run_id, held=True)
        finally:
            with shielded():
                _remove(run_id, [])
