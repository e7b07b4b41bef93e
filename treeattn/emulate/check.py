"""Check a running emulated cluster: the kernel's routes, the path packets take, and the
shaped rates.

* Routes: ``ip route get PEER`` in every rank namespace names the interface the layout chose.
* Rates: for each link class (kind and rate) one rank pair whose path has that link as its
  bottleneck sends for a while; the receiver's payload rate is compared with the link's
  ``bw_gbps x scale``. The interfaces' byte counters show which links the flow crossed,
  compared with ``Topology.route``.
* Sharing: where two rank pairs with four distinct ranks share their bottleneck link, both
  send at once; max-min fairness gives each half of it.
* Latency: a 64-byte ping-pong over each measured pair (what the real stack adds; no netem).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

from treeattn.emulate.cluster import Cluster
from treeattn.emulate.commands import Step
from treeattn.emulate.netns import run_step, tx_bytes
from treeattn.emulate.spawn import run_in_namespaces
from treeattn.errors import ExecutionError

__all__ = ["FlowResult", "CheckReport", "check_routes", "pick_flows", "check"]

_PORT = 5201


@dataclass(frozen=True, slots=True)
class FlowResult:
    """One measured flow (or one of two flows measured together)."""

    label: str
    """Link class measured: kind and rate, or ``shared LINK``."""
    src: int
    dst: int
    bottleneck: str
    """The link expected to limit it, ``SRC->DST``."""
    expected_mbit: float
    """Payload rate it should get: the link's bw_gbps x scale (halved when shared)."""
    measured_mbit: float
    path_ok: bool | None
    """Byte counters show exactly the links of Topology.route (None: not checked)."""
    rtt_us: float | None = None
    """Median round trip of a 64-byte ping-pong over the same pair."""

    @property
    def ratio(self) -> float:
        return self.measured_mbit / self.expected_mbit if self.expected_mbit else 0.0

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "src": self.src,
            "dst": self.dst,
            "bottleneck": self.bottleneck,
            "expected_mbit": round(self.expected_mbit, 3),
            "measured_mbit": round(self.measured_mbit, 3),
            "ratio": round(self.ratio, 4),
            "path_ok": self.path_ok,
            "rtt_us": None if self.rtt_us is None else round(self.rtt_us, 1),
        }


@dataclass(frozen=True)
class CheckReport:
    """Everything ``check`` found."""

    run_id: str
    topology: str
    scale: float
    route_errors: tuple[str, ...]
    flows: tuple[FlowResult, ...]

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "topology": self.topology,
            "scale": self.scale,
            "routes_ok": not self.route_errors,
            "route_errors": list(self.route_errors),
            "flows": [f.to_dict() for f in self.flows],
        }


def check_routes(cluster: Cluster) -> list[str]:
    """Mismatches between ``ip route get`` and the layout's chosen interface, one per line."""
    errors = []
    for r in cluster.layout.ranks:
        lines = [f"route get {ip}" for ip, _ in r.routes]
        if not lines:
            continue
        out = run_step(Step(("ip", "-n", r.ns, "-b", "-"), "\n".join(lines) + "\n"))
        got = re.findall(r"^(\S+) .*?\bdev (\S+)", out, flags=re.M)
        kernel = dict(got)
        for ip, ifname in r.routes:
            if kernel.get(ip) != ifname:
                errors.append(f"rank {r.rank} reaches {ip} via {kernel.get(ip)!r}, layout says {ifname!r}")
    return errors


Pair = tuple[int, int]


def pick_flows(cluster: Cluster) -> tuple[list[tuple[str, int, int, int]], list[tuple[int, Pair, Pair]]]:
    """Which flows to measure.

    Returns:
        ``singles``: (label, src, dst, bottleneck link) per link class, fastest class first;
        ``shared``: (link, pair, pair) for the first link two disjoint pairs share as bottleneck.
    """
    topo, layout = cluster.topology, cluster.layout
    rate = {s.link: s.rate_bit for s in layout.shapers}

    def bottleneck(path: tuple[int, ...]) -> int:
        return min(path, key=lambda i: (rate[i], i))

    classes: dict[tuple[str, int], int] = {}
    for s in layout.shapers:
        classes.setdefault((topo.links[s.link].kind.value, s.rate_bit), s.link)
    singles = []
    for (kind, r), _ in sorted(classes.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        for (a, b), path in sorted(layout.paths.items()):
            bn = bottleneck(path)
            if rate[bn] == r and topo.links[bn].kind.value == kind:
                singles.append((f"{kind} {topo.links[bn].bw_gbps * layout.scale * 8000:g} Mbit/s", a, b, bn))
                break
    shared = []
    for s in layout.shapers:
        cands = [pr for pr in s.pairs if rate[bottleneck(layout.paths[pr])] == s.rate_bit]
        found = next(((p1, p2) for k, p1 in enumerate(cands) for p2 in cands[k + 1:]
                      if len({*p1, *p2}) == 4), None)
        if found:
            shared.append((s.link, *found))
            break
    return singles, shared


def _measure(cluster: Cluster, pairs: list[tuple[int, int]], seconds: float) -> list[float]:
    """Run one flow per pair at once; payload rate of each in bytes/s (over the last four
    fifths of the time all of them were sending, when there are several)."""
    py = sys.executable
    cmd: dict[int, list[str]] = {}
    for k, (a, b) in enumerate(pairs):
        port = _PORT + k
        cmd[b] = [py, "-m", "treeattn.emulate._tput", "recv", str(port)]
        cmd[a] = [py, "-m", "treeattn.emulate._tput", "send", cluster.rank(b).ip, str(port), str(seconds)]
    res = run_in_namespaces(cluster, cmd.get, timeout_s=seconds + 60, check=True)
    by_rank = {r.rank: r for r in res}
    reports = [json.loads(by_rank[b].stdout.strip().splitlines()[-1]) for _, b in pairs]
    if len(pairs) == 1:
        return [reports[0]["rate_bps"]]
    begin = max(rep["samples"][0][0] for rep in reports)
    end = min(rep["samples"][-1][0] for rep in reports)
    begin += 0.2 * (end - begin)
    if end - begin <= 0:
        raise ExecutionError("the flows measured together did not overlap in time; use a longer --seconds")
    return [(_bytes_at(rep["samples"], end) - _bytes_at(rep["samples"], begin)) / (end - begin) for rep in reports]


def _bytes_at(samples: list[list[float]], t: float) -> float:
    """Bytes received by time ``t``, interpolated between samples."""
    prev = samples[0]
    for cur in samples[1:]:
        if cur[0] >= t:
            span = cur[0] - prev[0]
            return prev[1] + (cur[1] - prev[1]) * ((t - prev[0]) / span if span > 0 else 1.0)
        prev = cur
    return samples[-1][1]


def _rtt(cluster: Cluster, a: int, b: int, rounds: int = 200) -> float:
    py = sys.executable
    cmd = {b: [py, "-m", "treeattn.emulate._tput", "echo", str(_PORT), str(rounds)],
           a: [py, "-m", "treeattn.emulate._tput", "ping", cluster.rank(b).ip, str(_PORT), str(rounds), "64"]}
    res = run_in_namespaces(cluster, cmd.get, timeout_s=60, check=True)
    return json.loads(res[0 if a < b else 1].stdout.strip().splitlines()[-1])["rtt_us_median"]


def _counters(cluster: Cluster) -> dict[tuple[str, str], int]:
    out = {}
    for ns in cluster.layout.namespaces:
        for ifname, n in tx_bytes(ns).items():
            out[(ns, ifname)] = n
    return out


def _crossed(cluster: Cluster, before: dict, after: dict, nbytes: float) -> tuple[set[int], list[str]]:
    """Links whose sending interface moved at least half the flow's bytes; unknown interfaces."""
    link_of = cluster.layout.iface_link()
    links, unknown = set(), []
    for key, n in after.items():
        if key[1] == "lo" or key[1].startswith("br") or n - before.get(key, 0) < nbytes / 2:
            continue
        if key in link_of:
            links.add(link_of[key])
        else:
            unknown.append(f"{key[0]}/{key[1]}")
    return links, unknown


def check(cluster: Cluster, *, seconds: float = 1.0, shared: bool = True, latency: bool = True) -> CheckReport:
    """Check routes, paths and shaped rates of a running cluster.

    Args:
        cluster: from ``up`` or ``emulated``.
        seconds: how long each flow sends.
        shared: also measure two flows sharing a bottleneck, when the topology has one.
        latency: also measure a 64-byte round trip over each single-flow pair.

    Returns:
        The report; rates are payload Mbit/s (10^6 bit/s).
    """
    if seconds <= 0:
        raise ExecutionError(f"--seconds must be > 0, got {seconds}")
    topo, layout = cluster.topology, cluster.layout
    singles, pairs_shared = pick_flows(cluster) if cluster.num_ranks > 1 else ([], [])
    flows = []
    for label, a, b, bn in singles:
        before = _counters(cluster)
        (rate,) = _measure(cluster, [(a, b)], seconds)
        after = _counters(cluster)
        moved = rate * seconds * 0.5
        links, unknown = _crossed(cluster, before, after, moved)
        ok = not unknown and links == set(layout.paths[(a, b)])
        ln = topo.links[bn]
        rtt = _rtt(cluster, a, b) if latency else None
        flows.append(FlowResult(label, a, b, f"{ln.src}->{ln.dst}", ln.bw_gbps * layout.scale * 8000,
                                rate * 8 / 1e6, ok, rtt))
    if shared:
        for link, p1, p2 in pairs_shared:
            ln = topo.links[link]
            rates = _measure(cluster, [p1, p2], seconds)
            for (a, b), rate in zip((p1, p2), rates, strict=True):
                flows.append(FlowResult(f"shared {ln.src}->{ln.dst}", a, b, f"{ln.src}->{ln.dst}",
                                        ln.bw_gbps * layout.scale * 8000 / 2, rate * 8 / 1e6, None))
    return CheckReport(cluster.run_id, topo.name, layout.scale, tuple(check_routes(cluster)), tuple(flows))
