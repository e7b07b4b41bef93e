"""Write fitted parameters into a Topology (pure: no torch, no measurement).

What goes where. The simulator's time for one ping-pong message (it lands by RECV_COPY):
``t = overhead_us + sum(hop latency_us) + bytes / bottleneck bw_gbps + copy``, where the
copy is ``launch_us + 2 bytes / (mem_bw_gbps * mem_efficiency)`` of the receiving rank's
device. apply_fit inverts that:

* A route class (hops = the (kind, bw_gbps) of each link on the route) fitted with
  ``alpha_us`` and ``beta_gbps``:

  - latency: the links of every hop get ``latency_us`` such that the route's latency sum
    equals ``alpha_us - launch_us - overhead_us``; hops whose (kind, bw) an earlier class
    already set keep theirs, the rest share the remainder equally (clamped at 0, with a
    warning); an alpha of None leaves them as they are;
  - bandwidth: the wire rate ``w`` with ``1/w = 1/beta_gbps - 2/copy bandwidth``; the
    bottleneck hops (lowest bw_gbps in the class) get ``w``; other hops of the route below
    ``w`` are raised to it, so that the route's bottleneck is ``w``.

  Links are changed by signature: every link of the topology with the hop's (kind, bw_gbps)
  gets the new value, so all routes of a class move together. Classes are applied in order of
  hop count (fewest first): short routes fix the links they share with longer ones.
  On GPU ranks, a link whose rate or latency changes keeps the one it had as ``rated_gbps`` /
  ``rated_latency_us``: the hardware's, which NCCL's collective model reads
  (``Topology.rated``); not on a topology already measured without them (its rates are no
  hardware's), nor on host ranks (gloo reads the measured rates).
* Links no class fitted: a measured topology's rates are read as they are, so on a datasheet
  GPU topology each takes the rate a transfer reaches on it there (``cost.nccl_rates.transfer_gbps``:
  NCCL's rating of NVLink or PCIe, a network port's achieved share), keeping the datasheet
  figure as its rating; NCCL's shared-memory cap of GPUs without peer-to-peer, which applies
  at datasheet rates, is written as ``cost.shm_gbps`` where no fit gives one. On GPU ranks
  the links a class fitted are marked ``fitted``: NCCL's per-channel cap on one send
  (``cost.nccl_p2p``) bounds sends over the others, as at datasheet rates, and not those over
  a fitted link, whose rate has NCCL's channels in it. A log of the network alone then leaves
  the NVLink pairs as fast as they were.
* ``overhead_us``, ``launch_us``: into ``topo.cost``.
* The compute model's effective memory bandwidth: ``mem_efficiency = effective / mem_bw_gbps``
  of the rank devices; when that exceeds 1 (or the device has no figure), the rank devices'
  ``mem_bw_gbps`` becomes the effective bandwidth and ``mem_efficiency`` 1.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from treeattn.cost.nccl_rates import SHM_GBPS, shm_rate_applies, transfer_gbps
from treeattn.errors import InputError
from treeattn.topology.model import Link, Topology

__all__ = ["ClassParams", "FittedParams", "apply_fit"]

Hop = tuple[str, float]


@dataclass(frozen=True, slots=True)
class ClassParams:
    """Fitted message parameters of one route class."""

    hops: tuple[Hop, ...]
    """(link kind, bw_gbps) of each hop, as in the topology before fitting."""
    alpha_us: float | None
    """Time of an empty message over the route, overhead included; None: not measured (the
    route's latencies stay as they are)."""
    beta_gbps: float
    """Bandwidth of the route."""

    def __post_init__(self) -> None:
        if not self.hops:
            raise InputError("a route class needs at least one hop")
        alpha_ok = self.alpha_us is None or math.isfinite(self.alpha_us)
        if not (alpha_ok and math.isfinite(self.beta_gbps) and self.beta_gbps > 0):
            raise InputError(f"class {self.hops}: alpha must be finite and beta > 0, got {self.alpha_us}, "
                             f"{self.beta_gbps}")


@dataclass(frozen=True, slots=True)
class FittedParams:
    """Everything a calibration fitted; None leaves the topology's value as it is."""

    classes: tuple[ClassParams, ...] = ()
    overhead_us: float | None = None
    launch_us: float | None = None
    mem_eff_bw_gbps: float | None = None
    """Effective memory bandwidth of a merge on the rank devices (GB/s)."""
    source: str = ""
    """What the figures came from (added to the topology's ``sources``)."""
    attn_launch_us: float | None = None
    attn_gbps: float | None = None
    """The attention kernel's own launch and effective bandwidth, when timed apart."""
    shm_gbps: float | None = None
    """What NCCL's shared-memory transport moved between GPUs without peer-to-peer, GB/s of
    bus bandwidth (``CostParams.shm_gbps``), where a log measured such a pair."""
    landed_by_copy: bool = True
    """The alphas and betas were measured through the executor, whose ping-pong lands each
    message by RECV_COPY (the copy is taken out of them); False for nccl-tests logs."""


def _sig(kind: str, bw: float) -> Hop:
    return (str(kind), float(bw))


def apply_fit(topo: Topology, fit: FittedParams, *, name: str | None = None) -> tuple[Topology, list[str]]:
    """A copy of ``topo`` carrying the fitted parameters (see the module docstring).

    Args:
        topo: the topology measured (or the one a log is mapped onto).
        fit: the fitted parameters.
        name: the new topology's name (default ``<name>-calibrated``, or ``<name>`` where it
            already ends so).

    Returns:
        The new topology (routable, same devices, links and ranks) and warnings about what
        could not be applied exactly.

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> t = resolve("cpu:ranks=2")
        >>> fit = FittedParams((ClassParams((("loopback", 2.0),), 50.0, 1.5),), overhead_us=20.0, launch_us=10.0,
        ...                    mem_eff_bw_gbps=6.0)
        >>> new, _ = apply_fit(t, fit)
        >>> new.links[0].latency_us, round(new.links[0].bw_gbps, 6), new.cost.overhead_us
        (20.0, 3.0, 20.0)
    """
    warnings: list[str] = []
    overhead = topo.cost.overhead_us if fit.overhead_us is None else max(0.0, float(fit.overhead_us))
    launch = topo.cost.launch_us if fit.launch_us is None else max(0.0, float(fit.launch_us))
    devices, eff = _memory(topo, fit.mem_eff_bw_gbps, warnings)
    by_name = {d.name: d for d in devices}
    copy_bw = min((by_name[name].mem_bw_gbps for name in set(topo.ranks)), default=0.0) * eff
    if not fit.landed_by_copy:
        launch_in_alpha, copy_bw = 0.0, 0.0
    else:
        launch_in_alpha = launch
    lat: dict[Hop, float] = {}
    bw: dict[Hop, float] = {}
    present = {_sig(ln.kind.value, ln.bw_gbps) for ln in topo.links}
    for cls in sorted(fit.classes, key=lambda c: len(c.hops)):
        hops = [_sig(k, b) for k, b in cls.hops]
        label = ">".join(k for k, _ in hops)
        missing = [h for h in hops if h not in present]
        if missing:
            raise InputError(f"route class {label}: topology {topo.name!r} has no {missing[0][0]} link of "
                             f"{missing[0][1]:g} GB/s; fit and apply on the same topology")
        # A ping-pong message lands by RECV_COPY, which the simulator charges as a copy (a
        # launch plus reading and writing the bytes): take it out of alpha and beta.
        if cls.alpha_us is not None:
            _latency(hops, cls.alpha_us - launch_in_alpha - overhead, lat, label, warnings)
        _bandwidth(hops, _wire_gbps(cls.beta_gbps, copy_bw, label, warnings), bw, label, warnings)
    # Ratings are what NCCL's model reads (GPU ranks; gloo reads the measured rates). A topology
    # measured before without keeping them no longer knows the hardware's: none are invented.
    unrated = topo.cost.link_rates == "measured" and topo.rated is topo
    keep = topo.on_gpus and not unrated
    if fit.classes and topo.on_gpus and unrated:
        warnings.append(f"{topo.name!r} was calibrated without keeping its links' hardware ratings (rated_gbps): "
                        "NCCL's model reads the measured rates; calibrate the datasheet topology to keep them")
    # The rate each link reached before, which one no class fitted keeps once rates are measured.
    reach = transfer_gbps(topo) if fit.classes else tuple(ln.bw_gbps for ln in topo.links)
    # Fitted before: a measured file that marks no link (written before the mark) had them all.
    before = topo.fitted_links
    links = [_measured(ln, lat, bw, keep, was, topo.on_gpus, i in before)
             for i, (ln, was) in enumerate(zip(topo.links, reach, strict=True))]
    cost = dataclasses.replace(topo.cost, overhead_us=overhead, launch_us=launch, mem_efficiency=eff,
                               link_rates="measured" if fit.classes else topo.cost.link_rates)
    if fit.shm_gbps is not None:
        cost = dataclasses.replace(cost, shm_gbps=float(fit.shm_gbps))
    elif fit.classes and cost.shm_gbps is None and shm_rate_applies(topo):
        cost = dataclasses.replace(cost, shm_gbps=SHM_GBPS)
    if fit.attn_launch_us is not None and fit.attn_gbps is not None:
        cost = dataclasses.replace(cost, attn_launch_us=max(0.0, float(fit.attn_launch_us)),
                                   attn_gbps=float(fit.attn_gbps))
    # Calibrated again (a calibrated file as the topology), it is named and sourced once.
    sources = tuple(topo.sources) + ((fit.source,) if fit.source and fit.source not in topo.sources else ())
    # A family member's name is a spec (cpu:ranks=4,cores=2); the fitted topology is no member.
    plain = re.sub(r"[^A-Za-z0-9_.-]+", "-", topo.name.replace("=", "")).strip("-")
    plain = plain if plain.endswith("-calibrated") else f"{plain}-calibrated"
    new = Topology(name=name or plain, devices=devices, links=tuple(links), ranks=topo.ranks,
                   description=topo.description, sources=sources, cost=cost)
    new.check_routable()
    return new, warnings


def _measured(ln: Link, lat: dict[Hop, float], bw: dict[Hop, float], keep: bool, reached: float,
              mark: bool, fitted_before: bool) -> Link:
    """``ln`` with its fitted latency and rate (else ``reached``, the rate a transfer reached
    on it before), keeping (``keep``) what it had before as its rating (a link calibrated
    twice keeps the first: the hardware's), and marked ``fitted`` (``mark``: GPU ranks, where
    NCCL's per-channel cap on a send reads the mark) where a fit set its rate now or before."""
    s = _sig(ln.kind.value, ln.bw_gbps)
    latency, rate = lat.get(s, ln.latency_us), bw.get(s, reached)
    ln = dataclasses.replace(ln, fitted=mark and (fitted_before or s in bw))
    if not keep:
        return dataclasses.replace(ln, latency_us=latency, bw_gbps=rate)
    rated_gbps = ln.rated_gbps if ln.rated_gbps is not None or rate == ln.bw_gbps else ln.bw_gbps
    rated_lat = ln.rated_latency_us if ln.rated_latency_us is not None or latency == ln.latency_us else ln.latency_us
    return dataclasses.replace(ln, latency_us=latency, bw_gbps=rate, rated_gbps=rated_gbps, rated_latency_us=rated_lat)


def _wire_gbps(beta: float, copy_bw: float, label: str, warnings: list[str]) -> float:
    """The link rate that, with the receiver's copy at ``copy_bw`` after it, gives ``beta``."""
    if copy_bw <= 0:
        return beta
    inv = 1 / beta - 2 / copy_bw
    if inv <= 0.05 / beta:
        warnings.append(f"route class {label}: beta {beta:.3g} GB/s leaves no time for the receiver's copy at "
                        f"{copy_bw:.3g} GB/s; kept beta for the link")
        return beta
    return 1 / inv


def _latency(hops: Sequence[Hop], total: float, lat: dict[Hop, float], label: str, warnings: list[str]) -> None:
    fixed = sum(lat[h] for h in hops if h in lat)
    free = [h for h in hops if h not in lat]
    if not free:
        if abs(fixed - total) > 0.05 * max(abs(total), 1.0):
            warnings.append(f"class {label}: its links were set by shorter classes to a latency sum of {fixed:.2f} µs; "
                            f"this class measured {total:.2f} µs (alpha - overhead), not applied")
        return
    each = (total - fixed) / len(free)
    if each < 0:
        warnings.append(f"class {label}: alpha - overhead leaves {total - fixed:.2f} µs for its links' latency; "
                        "set to 0 (the overhead or shorter classes account for all of alpha)")
        each = 0.0
    for h in free:
        lat[h] = each  # a signature listed twice on the route gets `each` per crossing


def _bandwidth(hops: Sequence[Hop], beta: float, bw: dict[Hop, float], label: str, warnings: list[str]) -> None:
    low = min(b for _, b in hops)
    for h in dict.fromkeys(hops):
        if h not in bw and (h[1] == low or h[1] < beta):
            bw[h] = beta
    got = min(bw.get(h, h[1]) for h in hops)
    if abs(got - beta) > 0.05 * beta:
        warnings.append(f"class {label}: shorter classes set its links so that its bottleneck is {got:.3g} GB/s; "
                        f"this class measured {beta:.3g} GB/s, not applied")


def _memory(topo: Topology, eff_bw: float | None, warnings: list[str]):  # noqa: ANN202 - (devices, efficiency)
    if eff_bw is None:
        return topo.devices, topo.cost.mem_efficiency
    if not (math.isfinite(eff_bw) and eff_bw > 0):
        raise InputError(f"effective memory bandwidth must be > 0, got {eff_bw}")
    rank_devs = set(topo.ranks)
    mem = topo.device(topo.ranks[0]).mem_bw_gbps
    if mem > 0 and eff_bw <= mem:
        return topo.devices, eff_bw / mem
    warnings.append(f"measured merge bandwidth {eff_bw:.3g} GB/s exceeds the rank devices' mem_bw_gbps {mem:g}: "
                    "mem_bw_gbps set to it, mem_efficiency 1")
    devices = tuple(dataclasses.replace(d, mem_bw_gbps=eff_bw) if d.name in rank_devs else d for d in topo.devices)
    return devices, 1.0
