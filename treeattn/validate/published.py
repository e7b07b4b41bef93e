"""Score the GPU cost model on published nccl-tests tables (``treeattn check-model``).

Every row of every table (``treeattn.validate.corpus``) is predicted on the table's topology:

* all-reduce, all-gather, reduce-scatter, broadcast, reduce: NCCL's pick in the table's NCCL
  environment and release (``treeattn.cost.nccl.pick``; the release from the table's
  ``library_version``, the model's newest without one), without the per-call ``overhead_us`` the
  simulator adds (nccl-tests times a back-to-back loop, where issuing overlaps);
* sendrecv and alltoall: the simulator's point-to-point model on a plan of the exchange made
  of SEND/RECV ops: sendrecv is rank r -> r+1 (nccl-tests' ring shift) with the whole
  buffer, alltoall 1/R of the buffer to every peer at once (``treeattn.cost.library.alltoall_us``,
  as a plan's all-to-all is timed); the time is
  when the last message lands (the merge a plan applies afterwards is not part of it).

A table run by one process driving G GPUs (``nGpus G`` in its header, nccl-tests ``-g G``)
launches the G kernels of a call one after another while the GPUs run the previous call: a
call takes the longer of the two (8 x H100 of one node with ``-g 8``: 34-38 us from 8 B to 256
KiB, whatever the collective). Each launch costs ``GROUP_LAUNCH_US`` and ``GROUP_CHANNEL_US``
for each channel the call runs on (NCCL prepares a call's work channel by channel): the same
8 x H100 take 35 us on one channel, 40-44 us on 24 (1 MiB). Releases older than 2.22 write a
call's work once per channel: there each channel beyond the first adds ``GROUP_WORK_STRUCT_US``
(8 A100s under NCCL < 2.11: 76-80 us on 24 channels). Other ``-g`` tables keep
growing with the size under that floor (8 A100s with ``-g 8``: 35 us at 8 B, 56 at 512 KiB):
the floor is a lower bound there, which on that table's NCCL 2.19.3 ``GROUP_WORK_STRUCT_US``
lifts 1.5 and 4.7 % above its 256 and 512 KiB rows. RCCL launches through HIP, at
``RCCL_GROUP_LAUNCH_US`` a GPU (8 x MI300X with ``-g 8``: 34-46 us from 8 B to 256 KiB).

nccl-tests times a loop of calls issued back to back: an all-reduce's call ends on every rank
at about the same time, but broadcast and reduce are pipelined chains, whose next call
starts along the chain while its far end still works on the last one; such a call costs the
base latency and one hop, not every hop (``nccl.chain_call_latency_us``; 32 H100 over 4 nodes
broadcast 8-512 B in 9-10 us, where one call's chain takes 33 us).

The error of a row is predicted / published - 1 on time (published: the faster of the
row's out-of-place and in-place timings). Rows are grouped by size regime (nccl-tests' size:
the whole buffer; all-gather and alltoall count every rank's part) and by collective; each
group reports the median and 90th percentile of |error| and the median signed error.
Tables marked ``scored: false`` (a degraded fabric, a source's own warning) are predicted
and listed per source but left out of the groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from treeattn.calibrate.log_machine import example_selection, hosts_listed
from treeattn.cost import nccl, nccl_env, nccl_fabric, nccl_p2p, nccl_rates
from treeattn.cost.library import alltoall_us, last_landing_us
from treeattn.errors import InputError, TopologyError
from treeattn.plan.ir import Plan, TopologyRef
from treeattn.plan.schedule import Programs
from treeattn.topology.library import resolve
from treeattn.topology.model import Topology
from treeattn.topology.nccl_version import Release, release_text
from treeattn.validate.corpus import POINT_TO_POINT, PublishedTable
from treeattn.workload import RawPayload

__all__ = ["GROUP_LAUNCH_US", "GROUP_CHANNEL_US", "RCCL_GROUP_LAUNCH_US", "GROUP_WORK_STRUCT_US", "SHARED_WORK_FROM",
           "POINT_TO_POINT", "REGIMES", "RowResult", "predict_table", "table_p2p_level",
           "predict_corpus", "summarize", "group_launch_us", "plot_corpus", "table_releases", "p2p_time_us"]

KIB, MIB = 1024, 1024 * 1024
REGIMES = ("<=64KiB", "64KiB-1MiB", "1-16MiB", "16-256MiB", ">=256MiB")
_NCCL_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
               "broadcast": "broadcast", "reduce": "reduce"}


def regime(nbytes: int) -> str:
    """The size regime of a row: <= 64 KiB, (64 KiB, 1 MiB], (1, 16] MiB, (16, 256) MiB, >= 256 MiB."""
    if nbytes <= 64 * KIB:
        return REGIMES[0]
    if nbytes <= MIB:
        return REGIMES[1]
    if nbytes <= 16 * MIB:
        return REGIMES[2]
    if nbytes < 256 * MIB:
        return REGIMES[3]
    return REGIMES[4]


@dataclass(frozen=True, slots=True)
class RowResult:
    table: str
    source_id: str
    collective: str
    nbytes: int
    published_us: float
    predicted_us: float
    scored: bool
    how: str
    """What predicted it: ``ring/Simple`` (NCCL's pick) or ``p2p`` (the simulator)."""

    @property
    def error(self) -> float:
        return self.predicted_us / self.published_us - 1.0

    def to_dict(self) -> dict:
        return {"table": self.table, "collective": self.collective, "bytes": self.nbytes,
                "published_us": self.published_us, "predicted_us": round(self.predicted_us, 3),
                "error": round(self.error, 4), "scored": self.scored, "how": self.how}


# Host time per GPU of one call that a single thread issues to G GPUs (nccl-tests -g G),
# fitted on together-h100-1node's five -g 8 tables (NCCL 2.26): their 84 rows of 8 B-2 MiB that
# the model's call takes under 0.8 of the published time, per GPU 4.39 us + 0.034 us a channel
# (least squares; medians by channel count 4.39 / 4.42 / 4.64 / 4.71 / 4.95 / 5.18 us at 1 / 2 /
# 4 / 8 / 16 / 24 channels). Up to 1 MiB the channels follow the bytes; the two rows that tell
# them apart (all-gather and reduce-scatter at 2 MiB, on 24 channels as at 1 MiB: 5.00 and 5.27
# us a GPU, against 5.01 and 5.10) follow the channels. NCCL's host work for a call is per
# channel (enqueue.cc scheduleCollTasksToPlan: a work batch for each channel it runs on and,
# where the transport needs one, a proxy op). Not cost.launch_us (a kernel a rank's own process
# launches, which merges pay): a grouped call's host work per device.
GROUP_LAUNCH_US = 4.4
GROUP_CHANNEL_US = 0.034
# The same host time per GPU under RCCL, which launches each GPU's kernel through HIP
# (enqueue.cc ncclLaunchKernel: hipExtLaunchKernel with the communicator's done event, tag
# rocm-6.2.0): the median per GPU, less one channel's GROUP_CHANNEL_US, over
# amd-mi300x-acceptance-guide's 19 rows of 8 B-2 MiB that the modelled call takes under 0.8 of
# (AMD's own passing 8 x MI300X, one process, -g 8, RCCL of ROCm 6.2.0: 5.37 us; 4.2-5.7 us at
# 8 B-256 KiB, 6.5-7.5 at 512 KiB-2 MiB, where the model knows no RCCL channel count). Held
# out: rccl-issue-1562 (Azure MI300X VFs, RCCL 2.20.5), whose rows give 6.53 us.
RCCL_GROUP_LAUNCH_US = 5.4
# Before NCCL 2.22 the host writes a call's work once per channel: enqueue.cc uploadWork copies
# one ncclWork (512 bytes) per channel into the work FIFO (v2.18.3); 2.22.3 "compress[es] work
# structs so that they are shared between channels" and passes them as kernel arguments (its
# release notes). Each channel beyond the first then costs this much more a GPU, the median
# over superbench-a100-ndv4's 22 rows of 64 KiB-4 MiB on 2-24 channels that the modelled call
# takes under 0.8 of (NCCL < 2.11: broadcast and reduce sit at 76-80 us from 1 to 4 MiB on 24
# channels, 8 x 4.4 us at one). Medians by channel count 0.08 / 0.15 / 0.16 / 0.16 / 0.19 us
# at 2 / 4 / 8 / 16 / 24 channels.
GROUP_WORK_STRUCT_US = 0.16
# NCCL 2.8-2.11 also spend host time on each ncclSend and ncclRecv a grouped point-to-point call
# issues for a GPU (nccl-tests' alltoall: a send and a receive to each of its R peers, itself
# included; sendrecv: one of each): ncclSaveP2p checks the connectors of the peer's channels and
# allocates the call's entry (v2.8.4-1 enqueue.cc, src/include/p2p.h), and ncclGroupEnd
# schedules each part (group.cc scheduleSendRecv). Fitted on superbench-a100-ndv4's alltoall,
# the corpus's one table of grouped point-to-point calls on several GPUs a process (8 x A100,
# -g 8, NCCL < 2.11): the median over its rows of 32 B-2 MiB, flat at 85-90 us, of what each
# call adds a GPU to the launch floor; in-sample, so those rows' errors are no evidence.
# Charged where the model knows the calls' channels (2.8-2.11) and, as the launch floor, only
# with several GPUs a process; 2.10.3 on recycle the entries (group.cc), which may cost less,
# and which this one table (release "<2.11") cannot tell.
GROUP_P2P_CALL_US = 0.32
SHARED_WORK_FROM: Release = (2, 22, 3)
"""The first NCCL release whose calls share one work description between their channels (tag
v2.22.3-1, the first 2.22): a bound such as ``<2.22.3`` admits only older releases."""


def group_launch_us(gpus: int, channels: int | None, release: Release | None = None,
                    rccl: bool = False) -> float:
    """Host time of one call by a process driving ``gpus`` GPUs (nccl-tests -g G): their
    kernels launched one after another, each with its work on ``channels`` channels (one
    where the model does not know them), under NCCL ``release`` (None: a recent one; before
    ``SHARED_WORK_FROM`` each channel beyond the first adds ``GROUP_WORK_STRUCT_US``), or under
    RCCL (``RCCL_GROUP_LAUNCH_US`` a launch); 0 for one GPU a process."""
    if gpus <= 1:
        return 0.0
    channels = channels or 1
    per_channel_work = release is not None and release < SHARED_WORK_FROM
    launch = RCCL_GROUP_LAUNCH_US if rccl else GROUP_LAUNCH_US
    return gpus * (launch + GROUP_CHANNEL_US * channels
                   + (GROUP_WORK_STRUCT_US * (channels - 1) if per_channel_work else 0.0))


def p2p_calls(collective: str, ranks: int) -> int:
    """The ncclSend and ncclRecv calls nccl-tests' ``sendrecv`` or ``alltoall`` makes for one GPU."""
    return 2 * ranks if collective == "alltoall" else 2


def p2p_time_us(topo: Topology, collective: str, nbytes: int) -> float:
    """Time of nccl-tests' sendrecv or alltoall of ``nbytes`` (its size) on every rank of
    ``topo``, by the simulator's point-to-point model (see the module docstring)."""
    n = topo.num_ranks
    if collective == "sendrecv":
        payload = RawPayload(nbytes=max(nbytes, 4), ranks=n)
        progs = Programs(n)
        for r in range(n):
            progs.transfer(r, (r + 1) % n, 0, copy=True)
        plan = Plan("sendrecv", {}, payload, TopologyRef.of(topo), 1, progs.build(), tuple(range(n)))
    elif collective == "alltoall":
        return alltoall_us(topo, nbytes)
    else:
        raise InputError(f"{collective} is not a point-to-point exchange; use the NCCL model")
    return last_landing_us(plan, topo)


class _Topologies:
    """Each spec resolved and summarized once (families with many ranks take a while)."""

    def __init__(self) -> None:
        self.topos: dict[str, Topology] = {}
        self.fabrics: dict[str, nccl_fabric.NcclFabric] = {}

    def topo(self, t: PublishedTable) -> Topology:
        if t.topology not in self.topos:
            try:
                self.topos[t.topology] = resolve(t.topology)
            except TopologyError as exc:
                raise InputError(f"{t.name}: {exc}") from None
        topo = self.topos[t.topology]
        if topo.num_ranks != t.ranks:
            # a selection that places the ranks on nodes as the log's hosts hold them, where it says
            # (of the spec's own ranks: a spec that selects already is told to select fewer)
            example = example_selection(t.log, topo, t.topology, t.ranks)
            hosts = hosts_listed(t.log)
            fix = ("use a topology of that size" if t.ranks > topo.num_ranks else
                   f"select {t.ranks} of its ranks in its '[ranks ...]'" if "[" in t.topology else
                   f"use another size: no selection of its ranks places them as the log's {hosts} hosts hold them"
                   if example is None else
                   f"select ranks with '[ranks ...]' (e.g. '{example}'"
                   f"{', as the log places them on hosts' if hosts else ''}) or use another size")
            raise InputError(f"{t.name}: topology {t.topology!r} places {topo.num_ranks} ranks but the table ran "
                             f"on {t.ranks}; {fix}")
        return topo

    def p2p_topo(self, t: PublishedTable) -> Topology:
        """The table's topology at the table's NCCL release where it gives one (PXN's reach,
        ``nccl_p2p.router``), else the topology's, and at the P2P level its environment sets
        (``NCCL_P2P_DISABLE``, ``NCCL_P2P_LEVEL``); the same precedence as ``fabric``. A table
        of a release older than the model's figures keeps the topology's release but the P2P
        level NCCL's default had then (``nccl_rates.p2p_level``), which decides which pairs
        go through host memory."""
        return self._variant(t)[1]

    def _variant(self, t: PublishedTable) -> tuple[str, Topology]:
        topo = self.topo(t)
        cost = topo.cost
        if t.nccl_release is not None and cost.nccl_version != t.version:
            cost = cost.updated(nccl_version=t.version)
        level = _env_level(t)
        if level is None and t.nccl_release is None and t.nccl_bound is not None and cost.p2p_level is None:
            level = nccl_rates.p2p_level(topo, topo.rank_device(0).node, t.nccl_bound)
        if level is not None:
            cost = cost.updated(p2p_level=level)
        if cost == topo.cost:
            return t.topology, topo
        key = f"{t.topology}@{cost.nccl_version}@{cost.p2p_level}"
        if key not in self.topos:
            self.topos[key] = dataclasses.replace(topo, cost=cost)
        return key, self.topos[key]

    def fabric(self, t: PublishedTable) -> nccl_fabric.NcclFabric:
        """The table's topology summarized for NCCL's model, at the table's NCCL release where
        it gives one (else the topology's): its figures and its P2P level
        (``nccl_rates.p2p_level``: which pairs go through host memory) by release and
        environment."""
        key, topo = self._variant(t)
        if key not in self.fabrics:
            self.fabrics[key] = nccl_fabric.fabric(topo)
        fab, release = self.fabrics[key], t.nccl_release
        return fab if release is None else dataclasses.replace(fab, nccl_release=release)


def _env_level(t: PublishedTable) -> str | None:
    """The P2P level ``t``'s environment sets, read by its library at the newest release the
    table allows (``nccl_env.p2p_level_from_env``)."""
    try:
        return nccl_env.p2p_level_from_env(t.env, t.library, t.nccl_bound)
    except InputError as exc:
        raise InputError(f"{t.name}: {exc}") from None


def table_p2p_level(t: PublishedTable) -> tuple[Topology, str]:
    """The topology ``t``'s point-to-point rows are predicted on (``_Topologies.p2p_topo``: at
    its release and P2P level), and what sets that level: the table's ``NCCL_P2P_DISABLE`` /
    ``NCCL_P2P_LEVEL``, the topology's ``cost.p2p_level``, or NCCL's default at a release (the
    table's, or the older one its mapping bounds it by)."""
    cache = _Topologies()
    topo = cache.p2p_topo(t)
    if _env_level(t) is not None:
        # the setting that decides (NCCL_P2P_DISABLE=1 wins over any level), not those beside it
        disabled = {k: v for k, v in t.env.items() if k == "NCCL_P2P_DISABLE"}
        name = "NCCL_P2P_DISABLE" if nccl_env.p2p_level_from_env(disabled) == "LOC" else "NCCL_P2P_LEVEL"
        return topo, f"{name}={t.env[name]}"
    if cache.topo(t).cost.p2p_level is not None:
        return topo, "the topology's cost.p2p_level"
    old = t.nccl_release is None and t.nccl_bound is not None
    return topo, f"NCCL {release_text(t.nccl_bound if old else cache.fabric(t).nccl_release)}'s default"


def table_releases(tables: Iterable[PublishedTable]) -> dict[str, Release]:
    """The NCCL release the model predicts each table at (by name): the table's own, else its
    topology's (``cost.nccl_version``, by default the newest the model follows)."""
    cache = _Topologies()
    return {t.name: cache.fabric(t).nccl_release for t in tables}


def predict_table(t: PublishedTable, cache: _Topologies | None = None,
                  on_row: Callable[[], None] | None = None) -> list[RowResult]:
    """Predict every row of one table (see the module docstring); ``on_row()`` after each."""
    cache = cache or _Topologies()
    point_to_point = t.collective in POINT_TO_POINT
    topo = cache.p2p_topo(t) if point_to_point else cache.topo(t)
    rccl = cache.fabric(t).rccl  # the library the model takes for the GPUs (nccl_fabric), for its launches
    out = []
    for nbytes, published in t.points():
        channels = None
        if point_to_point:
            pred, how = p2p_time_us(topo, t.collective, nbytes), "p2p"
            channels = nccl_p2p.grouped_call_channels(topo, t.collective, nbytes, t.nccl_bound)
        else:
            fab = cache.fabric(t)
            est = nccl.pick(fab, _NCCL_NAMES[t.collective], nbytes, env=t.env, elem_bytes=t.elem_bytes,
                            ranks_per_process=max(1, t.log.n_threads) * max(1, t.log.n_gpus),
                            rccl_release=t.rccl_release, reduction=t.reduction)
            pred, how = est.time_us, f"{est.algorithm.value}/{est.protocol.value}"
            channels = nccl.run_channel_count(fab, est.algorithm, est.protocol, nbytes)
            if t.collective in ("broadcast", "reduce"):
                # Back to back, a chain's calls overlap along it (chain_call_latency_us).
                pred += nccl.chain_call_latency_us(fab, est.algorithm, est.protocol) - est.latency_us
                how += "+pipelined"
        launches = group_launch_us(t.log.n_gpus, channels, t.nccl_bound, rccl=rccl)
        if point_to_point and channels is not None and t.log.n_gpus > 1:  # NCCL 2.8-2.11 (grouped_call_channels)
            launches += t.log.n_gpus * p2p_calls(t.collective, t.ranks) * GROUP_P2P_CALL_US
        if launches > pred:
            pred, how = launches, f"{how}+launches"
        out.append(RowResult(t.name, t.source_id, t.collective, nbytes, published, pred, t.scored, how))
        if on_row is not None:
            on_row()
    return out


def predict_corpus(tables: Iterable[PublishedTable],
                   progress: Callable[[int, int, str], None] | None = None) -> list[RowResult]:
    """Predict every row of every table; ``progress(rows done, rows, table)`` after each row
    (one table's point-to-point rows can take minutes)."""
    cache = _Topologies()
    tables = list(tables)
    total = sum(len(t.points()) for t in tables)
    out: list[RowResult] = []
    done = 0
    for t in tables:
        def tick(name: str = t.name) -> None:
            nonlocal done
            done += 1
            progress(done, total, name)

        try:
            out += predict_table(t, cache, None if progress is None else tick)
        except InputError as exc:  # a rank selection, an environment the pick cannot meet: name the table
            raise InputError(str(exc) if str(exc).startswith(f"{t.name}: ") else f"{t.name}: {exc}") from None
    return out


def _pct(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(rows: list[RowResult]) -> dict:
    errs = [r.error for r in rows]
    if not errs:
        return {"rows": 0}
    absolute = [abs(e) for e in errs]
    return {"rows": len(errs), "median_abs": _pct(absolute, 0.5), "p90_abs": _pct(absolute, 0.9),
            "median_signed": _pct(errs, 0.5)}


def summarize(rows: list[RowResult]) -> dict:
    """Figures per regime, per collective, per regime x collective, per source (all rows
    of a source, scored or not) and over every scored row."""
    scored = [r for r in rows if r.scored]
    colls = sorted({r.collective for r in scored})
    by_source: dict[str, list[RowResult]] = {}
    for r in rows:
        by_source.setdefault(r.table, []).append(r)
    return {
        "all": _stats(scored),
        "regimes": {g: _stats([r for r in scored if regime(r.nbytes) == g]) for g in REGIMES},
        "collectives": {c: _stats([r for r in scored if r.collective == c]) for c in colls},
        "cells": {c: {g: _stats([r for r in scored if r.collective == c and regime(r.nbytes) == g])
                      for g in REGIMES} for c in colls},
        "tables": {name: {**_stats(rs), "scored": rs[0].scored} for name, rs in sorted(by_source.items())},
    }


_MARKERS = "s^Dv<>PX*phH"
"""The machines' markers ('o' is the corpus's), shapes with a face (an unscored row is drawn
hollow), none like another: past twelve machines they repeat (the legend pairs each with its
machine)."""


def plot_corpus(rows: list[RowResult], out: str | Path, measured: str = "published",
                machines: dict[str, str] | None = None) -> Path:
    """Predicted against published time, log-log, one colour per collective (scored rows
    filled, unscored ones hollow); ``measured`` names the times (``your``: the user's own logs).
    ``machines``: per table, the machine its log ran on, for logs of several machines: one
    marker a machine (a table not named there, a corpus table, takes the corpus's circle)."""
    import matplotlib

    from treeattn.figures import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    colls = sorted({r.collective for r in rows})
    cmap = plt.get_cmap("tab10")
    names = sorted(set((machines or {}).values()))
    marker = {name: _MARKERS[k % len(_MARKERS)] for k, name in enumerate(names)}
    for i, c in enumerate(colls):
        for scored in (True, False):
            label = c if scored else f"{c} (not scored)"
            for m in dict.fromkeys(["o", *marker.values()]):
                pts = [r for r in rows if r.collective == c and r.scored == scored
                       and marker.get((machines or {}).get(r.table, ""), "o") == m]
                if not pts:
                    continue
                xs = [r.published_us for r in pts]
                ys = [r.predicted_us for r in pts]
                ax.scatter(xs, ys, s=14, label=label, marker=m, color=cmap(i % 10),
                           facecolors=None if scored else "none")
                label = None  # one legend entry a collective
    lo = min(min(r.published_us, r.predicted_us) for r in rows) * 0.8
    hi = max(max(r.published_us, r.predicted_us) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    for f in (0.75, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.5, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{'published' if measured == 'published' else 'measured'} time (µs)")
    ax.set_ylabel("predicted time (µs)")
    title = f"treeattn's model against {measured} nccl-tests / rccl-tests rows"
    ax.set_title(f"{title} (dashed: +-25 %)" if measured == "published" else f"{title}\n(dashed: +-25 %)")
    if not marker:
        ax.legend(fontsize=8)
        return save_figure(fig, out)
    from matplotlib.lines import Line2D

    # the collectives' colours as circles, the machines' markers in black: each legend says one thing
    colours = [Line2D([], [], ls="", marker="o", color=h.get_facecolor()[0] if len(h.get_facecolor()) else
                      h.get_edgecolor()[0], markerfacecolor="none" if not len(h.get_facecolor()) else None, label=t)
               for h, t in zip(*ax.get_legend_handles_labels(), strict=True)]
    ax.add_artist(ax.legend(handles=colours, fontsize=8, loc="upper left"))
    corpus = [Line2D([], [], ls="", marker="o", color="black", label="published (corpus)")] if any(
        r.table not in machines for r in rows) else []
    ax.legend(handles=corpus + [Line2D([], [], ls="", marker=m, color="black", label=name)
                                for name, m in marker.items()],
              fontsize=8, loc="lower right", title="machine", title_fontsize=8)
    return save_figure(fig, out)
