"""The iproute2 commands that build a Layout (pure: text only, run by ``cluster.up``).

Each ``Step`` is one process: an argv and, for ``ip -b -`` / ``tc -b -`` batches, the lines
fed on stdin. One batch per namespace and phase keeps ``up`` near a hundred milliseconds.

Shaping of one link (HTB, the only shaper besides tbf built into these kernels):

    root 1: htb default 2
    └── 1:1   rate R ceil R               the link
        ├── 1:2   rate R/(n+2) ceil R     anything unclassified (ARP)
        ├── 1:3   rate R/(n+2) ceil R     packets under 128 bytes (TCP ACKs, gloo's notices),
        │         prio 0                  matched before the pairs' filters
        └── 1:10.. rate R/(n+2) ceil R    one class per rank pair crossing the link (u32 on
                                          source and destination address)

Classes borrow the idle share of the others in equal quanta, so flows active together get
max-min fair shares of R, as the cost model assumes; a single flow gets all of R. The small
packets' class keeps a link full duplex, as the links it stands for are: without it the ACKs
of a transfer a -> b queue behind b -> a's data in b's pair class (a frame is 300 us at
40 Mbit/s, not the microseconds of the real link), and both directions at once took twice as
long as one (``results/validate-emu/experiments/duplex.py``). Buckets
are ``BURST_S`` of R deep, and every veth hands the shaper one frame per packet (no GSO).
"""

from __future__ import annotations

from dataclasses import dataclass

from treeattn.emulate.layout import Layout, rank_ip

__all__ = ["Step", "setup_steps", "SYSCTLS"]

SYSCTLS = (
    # No IPv6: no router solicitations or DAD traffic in the byte counters, no DAD delays.
    ("net/ipv6/conf/all/disable_ipv6", "1"),
    ("net/ipv6/conf/default/disable_ipv6", "1"),
    # A rank answers ARP and accepts packets on whichever interface a route brings them.
    ("net/ipv4/conf/all/rp_filter", "0"),
    ("net/ipv4/conf/default/rp_filter", "0"),
)
GSO_MAX_BYTES = 1500
"""Largest packet the stack hands a veth: one MTU, so shapers see frames, not 64 KB bursts."""
BURST_S = 100e-6
"""Token bucket depth in seconds of the link's rate. HTB's timers wake up late by tens of
microseconds and a shallower bucket loses the tokens of that delay (measured here: 400 Mbit/s
reached 88 % with a 100-byte bucket, 91-98 % with 50 us, 99 % with 100 us). Together with the
one packet HTB sends on credit, a message can get up to one frame plus this much ahead of
the shaped rate when the link was idle."""
BURST_MIN_BYTES = 100
QUANTUM_BYTES = 15140
"""HTB quantum of every class: ten full frames, equal so idle bandwidth is split evenly."""


@dataclass(frozen=True, slots=True)
class Step:
    """One command; ``stdin`` holds batch lines when the argv reads them from ``-``."""

    argv: tuple[str, ...]
    stdin: str | None = None


def _batch(tool: str, ns: str | None, lines: list[str]) -> Step:
    argv = (tool,) + (("-n", ns) if ns else ()) + ("-b", "-")
    return Step(argv, "\n".join(lines) + "\n")


def setup_steps(layout: Layout) -> list[Step]:
    """Commands that create ``layout`` from nothing, in order.

    Args:
        layout: from ``plan_layout``.

    Returns:
        Steps: namespaces, sysctls, bridges, veth pairs, addresses and routes, shapers.
    """
    steps = [_batch("ip", None, [f"netns add {ns}" for ns in layout.namespaces])]
    script = "; ".join(f"echo {v} > /proc/sys/{k}" for k, v in SYSCTLS)
    steps += [Step(("ip", "netns", "exec", ns, "sh", "-c", script)) for ns in layout.namespaces]
    if layout.fabric_ns:
        lines = []
        for br, dev in layout.bridges:
            lines += [f"link add {br} type bridge stp_state 0", f'link set {br} alias "{dev}"', f"link set {br} up"]
        steps.append(_batch("ip", layout.fabric_ns, lines))
    creators: dict[str, list[str]] = {}
    for c in layout.cables:
        creators.setdefault(c.a.ns, []).append(f"link add {c.a.ifname} type veth peer name {c.b.ifname} netns {c.b.ns}")
    steps += [_batch("ip", ns, lines) for ns, lines in creators.items()]
    config: dict[str, list[str]] = {ns: [] for ns in layout.namespaces}
    for c in layout.cables:
        for end in (c.a, c.b):
            # One frame per packet: HTB lets a packet through on credit and charges it after, so
            # a 64 KB GSO packet would cross an idle link at memory speed.
            config[end.ns].append(f"link set {end.ifname} gso_max_segs 1 gso_max_size {GSO_MAX_BYTES}")
            if end.bridge:
                config[end.ns] += [f"link set {end.ifname} master {end.bridge}", f"link set {end.ifname} up"]
    for r in layout.ranks:
        lines = ["link set lo up"]
        for ifname in r.ifaces:
            lines += [f"addr add {r.ip}/32 dev {ifname}", f"link set {ifname} up"]
        lines += [f"route add {ip}/32 dev {ifname} src {r.ip}" for ip, ifname in r.routes]
        config[r.ns] += lines
    steps += [_batch("ip", ns, lines) for ns, lines in config.items() if lines]
    shaping: dict[str, list[str]] = {}
    for s in layout.shapers:
        share = max(s.rate_bit // (len(s.pairs) + 2), 8000)
        dev = f"dev {s.ifname}"
        burst = max(BURST_MIN_BYTES, int(s.rate_bit / 8 * BURST_S))
        q = f"quantum {QUANTUM_BYTES} burst {burst} cburst {burst}"
        lines = [
            f"qdisc add {dev} root handle 1: htb default 2",
            f"class add {dev} parent 1: classid 1:1 htb rate {s.rate_bit}bit ceil {s.rate_bit}bit {q}",
            f"class add {dev} parent 1:1 classid 1:2 htb rate {share}bit ceil {s.rate_bit}bit {q}",
            f"class add {dev} parent 1:1 classid 1:3 htb rate {share}bit ceil {s.rate_bit}bit {q} prio 0",
            # IPv4 total length (bytes 2-3 of the header) below 128.
            f"filter add {dev} parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff80 at 2 flowid 1:3",
        ]
        for k, (a, b) in enumerate(s.pairs):
            minor = f"{k + 16:x}"
            lines += [
                f"class add {dev} parent 1:1 classid 1:{minor} htb rate {share}bit ceil {s.rate_bit}bit {q}",
                f"filter add {dev} parent 1: protocol ip prio 2 u32 match ip src {rank_ip(a)}/32 "
                f"match ip dst {rank_ip(b)}/32 flowid 1:{minor}",
            ]
        shaping.setdefault(s.ns, []).extend(lines)
    steps += [_batch("tc", ns, lines) for ns, lines in shaping.items()]
    return steps
