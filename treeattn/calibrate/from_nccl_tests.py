"""``treeattn calibrate --from-nccl-tests``: the same per-class parameters, fitted from saved
nccl-tests / rccl-tests logs instead of live ping-pong (pure: no torch).

Each log is fitted by ``nccl_tests.calibrate_from_log`` (ring model of ``fit``: per-step
latency ``alpha_step`` and per-link bus bandwidth ``beta_link``) and mapped onto a route class
of the topology, placing the log's ``n`` ranks on the topology's first ``n``:

* one node (every rank on one node): the class of the slowest ring hop ``i -> i+1``.
  ``alpha_step`` is its alpha. ``beta_link`` is what one rank drives into the fabric, over all
  its links of that kind (NCCL spreads its channels over them): the class's bottleneck link
  gets ``beta_link x link bw / (sum of the rank's out-links of that class)``, e.g. the whole
  figure for an NVSwitch port, one seventh for one of MI300X's seven xGMI links.
* several nodes: the class from rank 0 to the first rank of another node (rail-aligned on
  rail-optimized fabrics). A ring of ``s`` steps has ``s_net = s (Nn-1)/(n-1)`` network steps
  (2(Nn-1) for all-reduce); with the one-node alpha known (an earlier log, else the
  topology's overhead + route latency), ``alpha_net = (alpha - (s - s_net) alpha_intra) / s_net``.
  ``beta_link`` is a node's egress: the bottleneck link gets ``beta_link x link bw / (sum of the
  network out-links of the NICs rank 0's node uses)``; sendrecv's, what the one stream that
  leaves a node got over its one NIC: the bottleneck link gets ``beta_link``; alltoall's, with
  ``g`` of the ``n`` ranks on a node each sending ``(n - g) / n`` of its buffer to the other
  nodes at once, is ``(n - 1) / (g (n - g))`` of that node's egress's rate, the node with the
  most to send for its egress setting the time: the bottleneck link gets ``beta_link x
  g (n - g) / (n - 1)`` of that node's egress's share.

Two logs that fit one class: the one with more sizes is kept, then a sendrecv, then by file
name, whatever the order they were given in.

nccl-tests cannot tell the software overhead from the latency: ``overhead_us`` stays as it is
and the route latencies take the rest of alpha. A log whose sizes all lie past the size whose
transfer takes as long as the latency (the fitted one, ``CollectiveFit.latency_measured``, or
the topology's where that is smaller: ``_latency_seen``), or whose latency comes out
negative, cannot tell the latency either: its class keeps the topology's route latency, as
does a network class whose share of the latency comes out below the overhead. One-node logs
are applied first.

``half_split`` checks the fit itself: lines fitted per size band (``SIZE_BANDS``) on every
other size of a log predict the sizes in between (results/published/README.md has the
figures on the published corpus, ``benchmarks/bench_calibrate_half_split.py`` makes them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from treeattn.calibrate.apply_fit import ClassParams, FittedParams, apply_fit
from treeattn.calibrate.fit import COLLECTIVE_MODELS, CollectiveFit
from treeattn.calibrate.log_machine import other_devices, other_hosts, other_vendor, selection_like_hosts
from treeattn.calibrate.nccl_tests import (
    NcclTestsLog,
    calibrate_from_log,
    launch_notes,
    printed_version,
    read_nccl_tests,
)
from treeattn.cost import nccl_fabric, nccl_rates
from treeattn.cost.nccl_env import (
    P2P_SETTINGS,
    allowed_by_env,
    function_list,
    p2p_level_from_env,
    setting_meaning,
)
from treeattn.errors import InputError, ProbeError
from treeattn.topology.model import CALIBRATED_BY, Link, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import allows, nccl_release, newer_note, parse_version, version_flag
from treeattn.units import format_size

__all__ = ["LogFit", "NcclCalibration", "calibrate_from_nccl_tests", "SIZE_BANDS", "HalfSplit", "half_split"]


@dataclass(frozen=True, slots=True)
class LogFit:
    """One log, its collective fit and the route class it was written into."""

    source: str
    fit: CollectiveFit
    scope: str
    """``node`` (one node) or ``network`` (several)."""
    route_class: str
    hops: tuple[tuple[str, float], ...]
    alpha_us: float
    """Per-message alpha of the class: the one written, or the topology's where the log's
    latency the log does not measure was left unwritten."""
    beta_gbps: float
    """Bottleneck link bandwidth written for the class."""
    notes: tuple[str, ...] = ()
    latency_written: bool = True
    """Whether the log measured the class's latency (else ``alpha_us`` is the topology's)."""
    shm: bool = False
    """Whether the class's route goes through NCCL's shared-memory transport (GPUs without
    peer-to-peer): the log's bus bandwidth is then the host's ``cost.shm_gbps``, and no link
    is written (calibration changes links by kind and rate: the PCIe links to the NICs too)."""

    def to_dict(self) -> dict:
        return {"source": self.source, "scope": self.scope, "route_class": self.route_class,
                "hops": [list(h) for h in self.hops], "class_alpha_us": self.alpha_us,
                "latency_written": self.latency_written, "shm": self.shm,
                "class_beta_gbps": self.beta_gbps, **self.fit.to_dict(), "notes": list(self.notes)}


@dataclass(frozen=True)
class NcclCalibration:
    topology: Topology
    logs: tuple[LogFit, ...]
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        cost = self.topology.cost
        return {"topology": self.topology.name, "fingerprint": self.topology.fingerprint,
                "cost": {"overhead_us": cost.overhead_us, "launch_us": cost.launch_us,
                         "mem_efficiency": cost.mem_efficiency},
                "logs": [lf.to_dict() for lf in self.logs], "warnings": list(self.warnings)}


def _hops(topo: Topology, a: int, b: int) -> tuple[tuple[str, float], ...]:
    return tuple((ln.kind.value, float(ln.bw_gbps)) for ln in topo.route_links(a, b))


def _alpha_of(topo: Topology, a: int, b: int) -> float:
    return topo.cost.overhead_us + topo.route_latency_us(a, b)


def _rated(ln: Link) -> float:
    """A link's hardware figure: its rating where a calibration kept one, else its rate. The
    share of a log's bandwidth each link gets is taken from these, so that a topology
    calibrated again from the same log gets the same rates (the fitted ones would move the
    shares where a node's links differ: 25 and 50 GB/s NICs)."""
    return ln.rated_gbps if ln.rated_gbps is not None else ln.bw_gbps


def _node_egress(topo: Topology, ranks: Sequence[int], other: int) -> float:
    """Sum of network out-link bandwidth of the NICs ``ranks`` use to reach rank ``other``."""
    nics: set[str] = set()
    for r in ranks:
        for ln in topo.route_links(r, other):
            if ln.cls is LinkClass.NETWORK:
                nics.add(ln.src)
                break
    return sum(_rated(ln) for ln in topo.links if ln.src in nics and ln.cls is LinkClass.NETWORK)


def _alltoall_load(topo: Topology, n: int) -> float:
    """An alltoall's bytes across its slowest node's egress per byte of its busbw, per GB/s of
    that egress: each of a node's g ranks sends (n - g) / n of its buffer to other nodes' ranks,
    all at once, so busbw ((n - 1) / n of the buffer in a rank's time) is the egress's rate x
    (n - 1) / (g (n - g)); the node with the most to send for its egress sets the time."""
    per_node: dict[object, list[int]] = {}
    for r in range(n):
        per_node.setdefault(topo.rank_device(r).node, []).append(r)
    loads = []
    for ranks in per_node.values():
        other = next(r for r in range(n) if r not in ranks)
        egress = _node_egress(topo, ranks, other)
        g = len(ranks)
        if egress > 0:
            loads.append(g * (n - g) / (n - 1) / egress)
    return max(loads, default=0.0)


def _rank_out(topo: Topology, rank: int, cls: LinkClass) -> float:
    dev = topo.ranks[rank]
    return sum(_rated(ln) for ln in topo.links if ln.src == dev and ln.cls is cls and ln.src != ln.dst) or 0.0


def calibrate_from_nccl_tests(topo: Topology, paths: Sequence[str | Path], spec: str | None = None,
                              version: str | None = None, env: dict[str, str] | None = None,
                              partial: bool = False) -> NcclCalibration:
    """Fit the topology's route classes from nccl-tests logs (see the module docstring).

    Args:
        topo: the topology the logs were measured on (at least as many ranks as each log).
        paths: nccl-tests / rccl-tests output files (``all_reduce_perf``, ``sendrecv_perf``, ...).
        spec: how the user named ``topo`` (``--topology``), for a selection of its ranks a
            refusal suggests; default its name.
        version: the NCCL release the logs ran with where they print none (``--nccl-version``):
            the fitted topology's ``cost.nccl_version`` (``_with_release``).
        env: NCCL settings the logs ran with (``--env``), beside those a log records: what the
            warnings say of the algorithm NCCL ran (the fit takes a ring).
        partial: fit a log that ends inside its table on its whole rows (``--partial``),
            warning that it does, instead of refusing it.

    Returns:
        The fitted topology and one ``LogFit`` per log.

    Raises:
        ProbeError: a log is damaged or cannot be fitted.
        InputError: no logs, or a log ran on more ranks than the topology places.
    """
    if not paths:
        raise InputError("--from-nccl-tests needs at least one log file")
    if version is not None:
        version = version_flag(version)
    fab = nccl_fabric.fabric(topo)  # RCCL's GPUs (fab.rccl) whether or not a log says it ran rccl-tests
    parsed = []
    logs_read: list[NcclTestsLog] = []
    ring_notes: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        if Path(path).resolve() in seen:  # as check-model: one run would count as two
            raise InputError(f"{path}: given twice")
        seen.add(Path(path).resolve())
        log = _with_env(read_nccl_tests(path, partial), env or {})
        logs_read.append(log)
        if log.cut_short:  # its largest sizes, which set the rate, may be the ones missing
            ring_notes.append(f"{log.source}: {log.cut_short}: fitted on those rows (--partial)")
        cf = calibrate_from_log(log, likely=topo.num_ranks)
        if said := _not_a_ring(log, cf.collective):
            ring_notes.append(said)
        p2p = {k: v for k, v in log.env if k in P2P_SETTINGS and v.strip()}
        try:
            level = p2p_level_from_env(p2p) if p2p else None
        except InputError:
            level = "?"
        if level is not None:  # a level NCCL routes by (NCCL_P2P_DISABLE=0 sets none)
            ring_notes.append(f"{log.source}: the run recorded {', '.join(f'{k}={v}' for k, v in sorted(p2p.items()))}"
                              ": the fit takes the routes the topology's P2P level gives (its cost.p2p_level), "
                              "whatever these set")
        if not (log.rccl or fab.rccl) and (rccl := sorted(k for k in (env or {}) if k.startswith("RCCL_"))):
            ring_notes.append(f"{log.source}: --env {', '.join(rccl)}: RCCL's settings, and this log ran NCCL: "
                              "they change nothing here")
        n = cf.ranks
        if n > topo.num_ranks:
            raise InputError(f"{log.source}: the log ran on {n} ranks but topology {topo.name!r} places "
                             f"{topo.num_ranks}; give the topology it ran on (e.g. a family spec with more nodes)")
        if other := other_devices(log, topo) or other_vendor(log, topo):  # rates for another machine's links
            raise InputError(f"{path}: {other}; give the topology it ran on")
        if other := other_hosts(log, topo, n):  # a one-node ring would be fitted as the network's, or back
            like = selection_like_hosts(log, topo, spec or topo.name)
            hint = f" (e.g. '{like}')" if like else ""
            raise InputError(f"{path}: {other}; give the topology it ran on{hint}")
        nodes = {topo.rank_device(r).node for r in range(n)}
        parsed.append((len(nodes) > 1, log, cf))
    chosen: dict[tuple, LogFit] = {}
    warnings: list[str] = sorted(ring_notes)  # as the logs' fits below, whatever the order given
    intra_alpha: float | None = None
    # One-node logs first (the network's fits divide out their latency); where two logs fit one
    # class the first is kept: the one with more sizes, then a sendrecv (one stream: a link's
    # rate as it stands), then by file name, so the logs' order on the command line does not count.
    def preference(x: tuple[bool, NcclTestsLog, CollectiveFit]) -> tuple:
        network, log, cf = x
        return network, -cf.points, cf.collective != "sendrecv", Path(log.source).name, log.source

    for network, log, cf in sorted(parsed, key=preference):
        source = log.source
        lf = _network_fit(topo, source, cf, intra_alpha) if network else _node_fit(topo, source, cf)
        if said := (_over_line_rate(topo, lf) if network else _over_pcie_rate(topo, lf) if lf.shm
                    else _over_fabric_rate(topo, lf)):
            warnings.append(said)
        # the over-rating warning of one node's links names NVLS as what ran already
        nvls_said = bool(said) and not network and not lf.shm
        if not lf.shm and cf.collective == "all_reduce" and (said := _under_rating(topo, lf, network)):
            warnings.append(said)
        warnings.extend(_doubts(topo, fab, log, lf, network, printed_version(log) or version or "", nvls_said))
        if not network:
            intra_alpha = lf.alpha_us if intra_alpha is None else intra_alpha
        old = chosen.get(lf.hops)
        if old is not None:
            keep, drop = (old, lf) if old.fit.points >= lf.fit.points else (lf, old)
            warnings.append(f"{drop.source} and {keep.source} both fit class {lf.route_class}: kept {keep.source} "
                            f"({keep.fit.points} sizes; the more sizes, then a sendrecv, then the file name decide)")
            lf = keep
        chosen[lf.hops] = lf
    logs = tuple(chosen.values())
    params = FittedParams(
        classes=tuple(ClassParams(lf.hops, lf.alpha_us if lf.latency_written else None, lf.beta_gbps)
                      for lf in logs if not lf.shm),
        # The logs by name: a path as given (a home folder) has no place in a file others read.
        source=f"{CALIBRATED_BY} --from-nccl-tests " + " ".join(Path(lf.source).name for lf in logs),
        shm_gbps=next((lf.fit.beta_link_gbps for lf in logs if lf.shm), None),
        landed_by_copy=False,
    )
    fitted, notes = apply_fit(topo, params)
    fitted = _with_release(fitted, logs_read, warnings, version)
    return NcclCalibration(fitted, logs, tuple(warnings + notes))


ENV_READ = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "RCCL_MSCCL_ENABLE", "RCCL_MSCCL_ENABLE_SINGLE_PROCESS")
"""The settings ``--env`` may give a fit from logs: those that choose the algorithm NCCL (or
RCCL) ran, which its warnings read (the fit takes a ring); the others change no figure of it."""


def _with_env(log: NcclTestsLog, env: dict[str, str]) -> NcclTestsLog:
    """``log`` with the settings ``--env`` gives beside those it records.

    Raises:
        InputError: a setting the fit does not read (``ENV_READ``), or one the log records
            with another meaning."""
    recorded = dict(log.env)
    for name, value in env.items():
        if name not in ENV_READ:
            raise InputError(f"--env {name}={value}: a fit from logs reads only {', '.join(ENV_READ)} (which "
                             "algorithm ran); routes through host memory are the topology's (cost.p2p_level)"
                             if name.startswith("NCCL_P2P") else
                             f"--env {name}={value}: a fit from logs reads only {', '.join(ENV_READ)} (which "
                             "algorithm ran)")
        try:
            differs = name in recorded and setting_meaning(name, recorded[name]) != setting_meaning(name, value)
        except InputError as exc:
            raise InputError(f"--env {name}={value}: {log.source} records {name}={recorded[name]}, which the model "
                             f"cannot read: {exc}") from None
        if differs:
            raise InputError(f"--env {name}={value}: {log.source} records {name}={recorded[name]}")
    return dataclasses.replace(log, env=tuple(sorted({**recorded, **env}.items()))) if env else log


def _doubts(topo: Topology, fab: nccl_fabric.NcclFabric, log: NcclTestsLog, lf: LogFit, network: bool, release: str,
            nvls_said: bool) -> list[str]:
    """What makes a log's fit other than its links' figures, written as they stand: a network
    latency far above the topology's route (another cost sets the small sizes), a latency of
    calls launched otherwise than one by one (``-G``, ``-a``) or of a process's launches of
    several GPUs (``-g``), an all-reduce NCCL runs with another algorithm than the ring the fit
    takes (``_other_algorithm``; ``fab``: ``topo``'s, ``release``: the log's, printed or given,
    else empty; not NVLS where ``nvls_said``: a warning named it already)."""
    out = []
    n = lf.fit.ranks
    if network and lf.latency_written:
        other = next(r for r in range(n) if topo.rank_device(r).node != topo.rank_device(0).node)
        route = _alpha_of(topo, 0, other)
        if lf.alpha_us > 4 * route and lf.alpha_us - route > 10:
            out.append(f"{lf.source}: network alpha {lf.alpha_us:.3g} µs is {lf.alpha_us / route:.0f} times the "
                       f"topology's route ({route:.3g} µs), and plans across nodes are timed with it: a cost other "
                       "than the network's sets such a log's small sizes (a virtual NIC, TCP sockets, a disturbed "
                       "run); check it against the log's small rows")
    if lf.latency_written:
        out.extend(f"{lf.source}: {how}: the latency fitted is theirs, below that of calls launched one by one "
                   "(nccl-tests' default, what a plan's calls pay)" for how in launch_notes(log))
    if log.n_gpus > 1 and lf.latency_written:
        out.append(f"{lf.source}: one process drove {log.n_gpus} GPUs (-g {log.n_gpus}), launching a call's kernels "
                   "one after another, which sets its small sizes (check-model times those launches): the latency "
                   "fitted is theirs as much as the links'; a log of one process a GPU gives the links'")
    if said := _other_algorithm(topo, fab, log, lf, release, nvls_said):
        out.append(said)
    return out


_ALGORITHM_NAMES = {"nvls": "NVLink SHARP (NVLS)", "tree": "its tree",
                    "nvlstree": "NVLink SHARP in the node and a tree across (NVLSTree)",
                    "allpairs": "RCCL's MSCCL all-pairs"}


def _other_algorithm(topo: Topology, fab: nccl_fabric.NcclFabric, log: NcclTestsLog, lf: LogFit, release: str,
                     nvls_said: bool) -> str:
    """A warning where, by the model's reading of NCCL's tuner (at the log's release, with its
    settings, reduction and GPUs a process), NCCL runs an all-reduce log's sizes from 1 MiB,
    which set the fitted rate, with another algorithm than the ring the fit takes; empty
    elsewhere, and where the log's settings allow no ring (``_not_a_ring`` says so)."""
    from treeattn.cost import nccl

    if lf.fit.collective != "all_reduce" or lf.fit.ranks != topo.num_ranks:
        return ""
    env = dict(log.env)
    try:
        if "ring" not in allowed_by_env(env)[0]:
            return ""
        rccl_release = parse_version(release) if release and log.rccl else None
    except InputError:
        return ""
    if release and not log.rccl:
        try:
            fab = dataclasses.replace(fab, nccl_release=nccl_release(release))
        except InputError:
            pass  # older than the model's figures: the topology's release, as check-model takes it
    row = log.rows[-1]
    reduction = (row.dtype or "float", row.redop if row.redop not in ("", "none") else "sum")
    picked: dict[str, list[int]] = {}
    for r in log.rows:
        if r.size_bytes < 1 << 20:
            continue
        try:
            est = nccl.pick(fab, "allreduce", r.size_bytes, env=env, reduction=reduction, rccl_release=rccl_release,
                            ranks_per_process=max(1, log.n_threads) * max(1, log.n_gpus))
        except InputError:
            return ""
        if est.algorithm is not nccl.Algorithm.RING:
            picked.setdefault(est.algorithm.value, []).append(r.size_bytes)
    if not picked or (nvls_said and set(picked) & {"nvls", "nvlstree"}):
        return ""
    runs = ", ".join(f"{_ALGORITHM_NAMES[a]} at {format_size(min(sz))}"
                     + (f"-{format_size(max(sz))}" if len(sz) > 1 else "") for a, sz in picked.items())
    library = "RCCL" if log.rccl or fab.rccl else "NCCL"
    how = f"by the model's reading of {library}'s tuner" + (", among what NCCL_ALGO allows" if "NCCL_ALGO" in env
                                                            else "")
    rate = "the host-memory rate fitted is" if lf.shm else "the links get"
    # what keeps each off: MSCCL's all-pairs runs whatever NCCL_ALGO says (treeattn.cost.nccl_env)
    off = (["NCCL_ALGO=Ring"] if set(picked) - {"allpairs"} else []) + (
        ["NCCL_NVLS_ENABLE=0"] if set(picked) & {"nvls", "nvlstree"} else []) + (
        ["RCCL_MSCCL_ENABLE=0"] if "allpairs" in picked else [])
    return (f"{lf.source}: on {topo.name} {library} runs this all-reduce with {runs}, not a ring ({how}): the fit "
            f"takes a ring, so {rate} those algorithms' rate; an all-gather, reduce-scatter or sendrecv log, or a "
            f"run with {' or '.join(off)}, gives theirs")


_RING_FITS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
              "broadcast": "broadcast", "reduce": "reduce"}
"""The collectives whose fit takes NCCL's ring, by the function names ``NCCL_ALGO`` lists use;
the others (sendrecv, alltoall, ...) are sends and receives, which no algorithm setting touches."""


def _not_a_ring(log: NcclTestsLog, collective: str) -> str:
    """A warning where the run's environment (as nccl-tests' JSON records it, or ``--env``
    gives it) kept NCCL off the ring the fit of ``collective`` assumes: ``NCCL_ALGO`` without
    it, or (NCCL 2.24's per-function lists, ``tree;allreduce:ring``) without it for that
    collective; empty elsewhere."""
    value = dict(log.env).get("NCCL_ALGO", "").strip()
    func = _RING_FITS.get(collective)
    if not value or func is None:
        return ""
    chosen = function_list(value, func)
    if chosen is None or not chosen.strip():
        return ""  # no list for this collective: NCCL's default, which offers the ring
    try:
        algos, _ = allowed_by_env({"NCCL_ALGO": chosen})
    except InputError:
        return f"{log.source}: the run ran with NCCL_ALGO={value}, which NCCL does not read; the fit takes a ring"
    if "ring" in algos:
        return ""
    return (f"{log.source}: the run ran with NCCL_ALGO={value}: NCCL ran no ring for {collective}, and the fit takes "
            "one, so its rates are the other algorithm's")


def _with_release(topo: Topology, logs: list[NcclTestsLog], warnings: list[str],
                  given: str | None = None) -> Topology:
    """``topo`` naming the NCCL release its logs printed (``cost.nccl_version``), or ``given``
    (``--nccl-version``) where none prints one, which the NCCL model's release-dependent figures
    follow, so that ``plan`` and ``nccl-model`` model the NCCL the logs ran on, as
    ``check-model`` does; a release the topology names already, or logs of several releases,
    are said and left as they are. RCCL's releases are not NCCL's (RCCL 2.22.3 is no NCCL
    2.22.3): rccl-tests logs leave the field as it is.

    Raises:
        InputError: a log prints a release ``given`` does not allow (an rccl-tests log: RCCL's)."""
    nccl_logs = [log for log in logs if not log.rccl]
    printed = sorted({v for v in map(printed_version, nccl_logs) if v})
    if given is not None:
        for log in logs:
            if (v := printed_version(log)) and not allows(given, v):
                raise InputError(f"--nccl-version {given}: {log.source} prints {'RCCL' if log.rccl else 'NCCL'} {v}")
        if not nccl_logs:
            warnings.append(f"--nccl-version {given}: the logs ran RCCL, whose releases are not NCCL's: the "
                            "topology's cost.nccl_version (NCCL's) is left as it is")
    silent = sum(not printed_version(log) for log in nccl_logs)
    if given is not None and not printed and nccl_logs:
        printed, silent = [given], 0
    if not printed:
        return topo
    if silent:
        warnings.append(f"{silent} of the logs print no NCCL version: taken as the others' ({', '.join(printed)})")
    if topo.cost.nccl_version is not None:
        if any(parse_version(v) != parse_version(topo.cost.nccl_version) for v in printed):
            warnings.append(f"the logs ran on NCCL {', '.join(printed)}; the topology's cost.nccl_version "
                            f"{topo.cost.nccl_version} is kept")
        return topo
    if len(printed) > 1:
        warnings.append(f"the logs ran on NCCL {', '.join(printed)}: cost.nccl_version left unset (the model's "
                        "newest release); set it to the cluster's")
        return topo
    try:
        nccl_release(printed[0])
    except InputError as exc:
        warnings.append(f"{exc}: cost.nccl_version left unset (the model's newest release)")
        return topo
    if newer := newer_note(printed[0]):
        warnings.append(newer)
    return dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, nccl_version=printed[0]))


def _figure_link(topo: Topology, lf: LogFit, network: bool) -> Link | None:
    """The link of ``lf``'s class with the lowest hardware figure (``_rated``): a network class's
    slowest network port on the route from rank 0 to the first rank of another node, a one-node
    class's slowest link on its slowest ring hop (``_slowest_hop``); None where the topology
    was measured before without the hardware's figures (nothing to hold the fit to)."""
    if network:
        other = next(r for r in range(lf.fit.ranks) if topo.rank_device(r).node != topo.rank_device(0).node)
        links = [ln for ln in topo.route_links(0, other) if ln.cls is LinkClass.NETWORK]
    else:
        links = list(topo.route_links(*_slowest_hop(topo, lf.fit.ranks)))
    if not links:
        return None
    link = min(links, key=_rated)
    if link.rated_gbps is None and topo.cost.link_rates != "datasheet":
        return None
    return link


def _over_line_rate(topo: Topology, lf: LogFit) -> str:
    """A warning where a network class got more than the line rate of its route's slowest
    network port: the log ran on faster or more NICs than the topology's (or reduced in the
    network, SHARP), and its rate would be written into ports that cannot carry it."""
    port = _figure_link(topo, lf, network=True)
    if port is None:
        return ""
    line = _rated(port)
    if lf.beta_gbps <= 1.05 * line:
        return ""
    return (f"{lf.source}: the network class got {lf.beta_gbps:.4g} GB/s a port, above the {line:g} GB/s "
            f"({line * 8:g} Gb/s) line rate of {port.src}'s {port.kind.value} port: the log ran on faster or more "
            "NICs than the topology has (check its NIC count and rates: probe's --ibstat, --nic-gbps, --nics), or "
            "with in-network reduction (SHARP); the fitted rate is written as it is")


def _over_pcie_rate(topo: Topology, lf: LogFit) -> str:
    """A warning where a ring through host memory (NCCL's shared-memory transport, ``lf.shm``)
    got more than a PCIe link of its GPUs carries: each GPU's data goes up its PCIe link into
    host memory and the next GPU's comes down its own, so the bus bandwidth cannot beat the
    slowest GPU's PCIe link, at its nominal rate where its generation and width are known
    (``nccl_rates.pcie_nominal_gbps``, docs/hardware.md), else its hardware figure (as
    ``_over_line_rate``; none for a link measured before without one). Such a rate came from
    GPUs that moved their data peer-to-peer or over NVLink, not through host memory, and
    would be written as the host's ``cost.shm_gbps``."""
    bounds = []
    for r in range(lf.fit.ranks):
        dev = topo.ranks[r]
        for ln in topo.links:
            if ln.src == dev and ln.kind is LinkKind.PCIE:
                bound = nccl_rates.pcie_nominal_gbps(ln)
                if bound is None and (ln.rated_gbps is not None or topo.cost.link_rates == "datasheet"):
                    bound = _rated(ln)
                if bound is not None:
                    bounds.append((bound, ln))
    if not bounds:
        return ""
    bound, link = min(bounds, key=lambda x: x[0])
    if lf.beta_gbps <= 1.05 * bound:
        return ""
    what = (f"PCIe {link.generation}.0 x{link.width} nominal" if nccl_rates.pcie_nominal_gbps(link) is not None
            else "its rate")
    return (f"{lf.source}: the ring through host memory (NCCL's shared-memory transport) got {lf.beta_gbps:.4g} "
            f"GB/s, above the {bound:.4g} GB/s ({what}) of the PCIe link {link.src}->{link.dst}, which its "
            "data crosses to and from host memory: the log's GPUs must have moved it peer-to-peer or over NVLink, "
            "not through host memory as the topology has them (check its GPUs' p2p, fabric and cost.p2p_level, "
            "and the log's NCCL_P2P_DISABLE/NCCL_P2P_LEVEL); the fitted rate is written as cost.shm_gbps as it is")


def _over_fabric_rate(topo: Topology, lf: LogFit) -> str:
    """A warning where a one-node class got more than its bottleneck link's hardware figure
    (as ``_over_line_rate``): no ring moves more than its links carry, so the log ran what the
    ring fit does not model, most likely NVLink SHARP (NVLS: the switch reduces, NCCL's default
    all-reduce on NVSwitch H100/H200/GB200 nodes from 2.17), whose bus bandwidth would be
    written as the links' rate."""
    link = _figure_link(topo, lf, network=False)
    if link is None or lf.beta_gbps <= 1.05 * _rated(link):
        return ""
    nvls = link.kind is LinkKind.NVLINK
    return (f"{lf.source}: the {lf.route_class} class got {lf.beta_gbps:.4g} GB/s a link, above the {_rated(link):g} "
            f"GB/s of {link.src}'s {link.kind.value} link: the ring the fit assumes cannot move that, so the log ran "
            + ("another algorithm, most likely NVLink SHARP (NVLS, NCCL's default all-reduce on NVSwitch nodes), "
               if nvls else "another algorithm than the ring, ")
            + "or the topology's links are slower than the machine's; calibrate from an all_gather, reduce_scatter or "
            + ("sendrecv log, or one run with NCCL_NVLS_ENABLE=0" if nvls else "sendrecv log")
            + "; the fitted rate is written as it is")


UNDER_RATING = 0.5
"""An all-reduce log's fitted rate below this share of its link's hardware figure is said
(``_under_rating``; the other collectives' fits are not judged by it). The published corpus's all-reduce
tables, each fitted whole onto its mapping's topology, give
0.63-1.08 of the figure on fabrics their sources call sound; under 0.5 come an unscored
degraded 2-node run (nccl-tests issue 290: 0.25 and 0.40) and one-node A100 logs that stop at
32-128 MiB, short of their bandwidth (0.41-0.51)."""


def _under_rating(topo: Topology, lf: LogFit, network: bool) -> str:
    """A warning where a class got under ``UNDER_RATING`` of its bottleneck link's hardware
    figure: the model of NCCL's collectives (the baselines, ``nccl-model``, ``check-model``)
    reads the figures, not the fitted rates (docs/nccl-model.md), so it goes on predicting them
    faster than the log ran; such a rate is a fabric that runs below its hardware (a degraded
    link, fewer NICs in use) or a topology that names faster hardware than the machine's."""
    link = _figure_link(topo, lf, network)
    if link is None or lf.beta_gbps >= UNDER_RATING * _rated(link):
        return ""
    largest = format_size(lf.fit.size_range[1])
    return (f"{lf.source}: the {lf.route_class} class got {lf.beta_gbps:.4g} GB/s a link, under half the "
            f"{_rated(link):g} GB/s of {link.src}'s {link.kind.value} link: treeattn's transfers will be timed at "
            "the fitted rate, while the model of NCCL's collectives (the baselines, nccl-model, check-model) keeps "
            "the hardware figure and predicts them faster than this log ran. A log that stops short of its "
            f"bandwidth fits low (this one's largest size is {largest}); otherwise check the fabric (a degraded "
            "link, fewer NICs in use) or the topology's rates")


def _slowest_hop(topo: Topology, n: int) -> tuple[int, int]:
    """The ring hop ``i -> i+1`` of a one-node log's ``n`` ranks with the slowest route (the
    longest of equals, then the first): the class a one-node log is fitted into."""
    ring = [(i, (i + 1) % n) for i in range(n)]
    return min(ring, key=lambda p: (topo.route_bw_gbps(*p), -len(topo.route(*p)), p))


def _node_fit(topo: Topology, source: str, cf: CollectiveFit) -> LogFit:
    n = cf.ranks
    a, b = _slowest_hop(topo, n)
    hops = _hops(topo, a, b)
    notes = list(cf.warnings)
    first = topo.route_links(a, b)[0]
    out = _rank_out(topo, a, first.cls)
    low = min(map(_rated, topo.route_links(a, b)))
    share = low / out if out > 0 else 1.0
    reason = nccl_rates.shm_reason(topo, a, b)
    if reason is not None:  # what the ring moved is the host's, not the links': they keep their figures
        why = ("GPUs without peer-to-peer" if reason == nccl_rates.SHM_NO_P2P else
               f"GPUs further apart than NCCL's P2P level, {nccl_rates.p2p_level(topo, topo.rank_device(a).node)}")
        notes.append(f"its ring runs through host memory ({why}): {cf.beta_link_gbps:.4g} "
                     "GB/s is the host's shared-memory rate (cost.shm_gbps); the links keep their rates and latency")
        return LogFit(source, cf, "node", ">".join(k for k, _ in hops), hops, _alpha_of(topo, a, b),
                      cf.beta_link_gbps, tuple(notes), False, True)
    prior = COLLECTIVE_MODELS[cf.collective].steps(n) * _alpha_of(topo, a, b)
    alpha, written = _class_alpha(cf.alpha_step_us if _latency_seen(cf, prior, notes) else None,
                                  "per-step latency", topo, (a, b), notes)
    return LogFit(source, cf, "node", ">".join(k for k, _ in hops), hops, alpha, cf.beta_link_gbps * share,
                  tuple(notes), written)


def _network_fit(topo: Topology, source: str, cf: CollectiveFit, intra_alpha: float | None) -> LogFit:
    n = cf.ranks
    node0 = topo.rank_device(0).node
    local = [r for r in range(n) if topo.rank_device(r).node == node0]
    other = next(r for r in range(n) if topo.rank_device(r).node != node0)
    hops = _hops(topo, 0, other)
    nn = len({topo.rank_device(r).node for r in range(n)})
    notes = list(cf.warnings)
    # the topology's latency for the collective as _network_alpha divides it: its network
    # steps at the network route's alpha, the rest at the node's
    s_net, s_node = _network_steps(cf, nn)
    prior = s_net * _alpha_of(topo, 0, other) + (s_node * _alpha_of(topo, *local[:2]) if len(local) > 1 else 0.0)
    alpha, written = _class_alpha(_network_alpha(cf, topo, local, nn, intra_alpha, notes)
                                  if _latency_seen(cf, prior, notes) else None,
                                  "network alpha", topo, (0, other), notes)
    egress = _node_egress(topo, local, other)
    low = min(map(_rated, topo.route_links(0, other)))
    # sendrecv's busbw is what one rank's stream to the next got: the ring crosses a node's
    # edge once, over one NIC, not spread over the node's egress as a collective's rings are
    if cf.collective == "sendrecv":
        share = 1.0
    elif cf.collective == "alltoall":
        share = low * _alltoall_load(topo, n)
    else:
        share = low / egress if egress > 0 else 1.0
    return LogFit(source, cf, "network", ">".join(k for k, _ in hops), hops, alpha, cf.beta_link_gbps * share,
                  tuple(notes), written)


def _latency_seen(cf: CollectiveFit, prior: float, notes: list[str]) -> bool:
    """Whether the log's rows determine its latency: ``CollectiveFit.latency_measured``, and
    its smallest size is at or below the half-bandwidth size at ``prior``, the topology's
    latency for the collective (its steps at the route alphas the fit is divided into), where
    that is the smaller. The fitted latency alone cannot judge itself: a log of large sizes
    only fits the offset of its ramp to the asymptote (384 µs for an 8-GPU sendrecv from 32
    MiB), which widens the sizes it calls latency-bound with it."""
    if not cf.latency_measured:
        return False
    # latency_measured holds the smallest size within the fitted latency's half-bandwidth
    # size, so a prior above the fitted latency passes here too
    at_prior = prior * cf.fit.beta_gbps * 1e3
    if cf.size_range[0] <= at_prior:
        return True
    notes.append(f"latency {cf.fit.alpha_us:.3g} µs not measured: the smallest size "
                 f"({cf.size_range[0] / 2**20:.3g} MiB) is past the half-bandwidth size at the topology's "
                 f"latency ({prior:.3g} µs a call: {at_prior / 2**20:.3g} MiB), where "
                 "the line's offset is the ramp to its bandwidth, not a latency")
    return False


def _class_alpha(alpha: float | None, what: str, topo: Topology, pair: tuple[int, int],
                 notes: list[str]) -> tuple[float, bool]:
    """(the class's alpha, whether the log measured it): ``alpha`` where the log measured one
    at least the overhead (nccl-tests cannot tell the two apart), else the topology's route."""
    if alpha is not None and alpha < topo.cost.overhead_us:
        notes.append(f"{what} {alpha:.3g} µs is below the overhead {topo.cost.overhead_us:g} µs")
        alpha = None
    if alpha is not None:
        return alpha, True
    kept = _alpha_of(topo, *pair)
    notes.append(f"route latency kept from the topology (alpha {kept:.3g} µs)")
    return kept, False


def _network_alpha(cf: CollectiveFit, topo: Topology, local: list[int], nodes: int, intra_alpha: float | None,
                   notes: list[str]) -> float:
    """A network hop's share of the log's latency: its network steps' share of the ring's,
    the rest at the one-node alpha (an earlier log's, else the topology's)."""
    s_net, s_node = _network_steps(cf, nodes)
    if intra_alpha is None and s_node and len(local) > 1:
        intra_alpha = _alpha_of(topo, local[0], local[1])
        notes.append(f"one-node alpha {intra_alpha:.3g} µs taken from the topology (no one-node log given)")
    return (cf.fit.alpha_us - s_node * (intra_alpha or 0.0)) / s_net


def _network_steps(cf: CollectiveFit, nodes: int) -> tuple[float, float]:
    """(network steps, one-node steps) of the log's collective over ``nodes`` nodes: a
    sendrecv's one step is the network's; a ring's steps cross the network in the share
    ``(nodes - 1) / (n - 1)`` of its hops."""
    if cf.collective == "sendrecv":
        return 1.0, 0.0
    steps = COLLECTIVE_MODELS[cf.collective].steps(cf.ranks)
    s_net = steps * (nodes - 1) / (cf.ranks - 1)
    return s_net, steps - s_net


# Size bands fitted apart: NCCL changes protocol and algorithm with size (LL up to tens of
# KiB, LL128 or trees to tens of MiB, Simple rings or NVLS beyond), so one latency and one
# bandwidth cannot follow a whole sweep; each band's line can.
SIZE_BANDS = ((1, 64 << 10), ((64 << 10) + 1, 16 << 20), ((16 << 20) + 1, None))


@dataclass(frozen=True, slots=True)
class HalfSplit:
    """Fit on every other size of a log, predict the sizes in between."""

    source: str
    bands: tuple[tuple[int, int | None, CollectiveFit], ...]
    """(first size, last size or None, the fit of the training rows in that band)."""
    held_out: tuple[tuple[int, float, float], ...]
    """(size, measured us, predicted us) per held-out row."""

    @property
    def errors(self) -> list[float]:
        return [pred / meas - 1 for _, meas, pred in self.held_out]


def _band_of(bands: Sequence[tuple[int, int | None, CollectiveFit]], size: int) -> CollectiveFit:
    """The band holding ``size``, else the nearest one."""
    def gap(b: tuple[int, int | None, CollectiveFit]) -> float:
        lo, hi, _ = b
        return max(lo - size, 0, size - hi if hi is not None else 0)
    return min(bands, key=gap)[2]


def half_split(log: NcclTestsLog, collective: str | None = None, ranks: int | None = None) -> HalfSplit:
    """Fit ``SIZE_BANDS`` lines (``calibrate_from_log``) on the even-numbered rows of ``log``
    and predict the odd-numbered ones (the faster of out-of-place and in-place each).

    Raises:
        ProbeError: fewer than four rows, or no band with two training sizes.
    """
    if len(log.rows) < 4:
        raise ProbeError(f"{log.source}: {len(log.rows)} rows; a half split needs at least 4")
    train = dataclasses.replace(log, rows=log.rows[0::2])
    bands = []
    for lo, hi in SIZE_BANDS:
        try:
            bands.append((lo, hi, calibrate_from_log(train, collective=collective, ranks=ranks, min_bytes=lo,
                                                     max_bytes=hi)))
        except ProbeError:
            continue  # fewer than two training sizes in this band: its neighbours cover it
    if not bands:
        raise ProbeError(f"{log.source}: no size band holds two training rows")
    held = []
    for r in log.rows[1::2]:
        times = [t.time_us for t in (r.out_of_place, r.in_place) if t is not None and not t.wrong]
        if times:
            held.append((r.size_bytes, min(times), _band_of(bands, r.size_bytes).fit.predict_us(r.size_bytes)))
    return HalfSplit(log.source, tuple(bands), tuple(held))
