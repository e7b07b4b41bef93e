"""The sentences ``treeattn topo show`` prints about domains, the network, its NICs and
the transfer rates, from ``topology_summary``'s data; each line within 80 columns."""

from __future__ import annotations

import textwrap

from treeattn.cost import nccl_p2p, nccl_rates, nccl_tuning
from treeattn.topology import LinkClass, LinkKind, Topology
from treeattn.topology.model import link_class

__all__ = ["domain_shares", "gbps", "network_lines", "rate_lines", "shm_sentence", "wrap"]

_SHARES = {"device": "one host device", "pcie-switch": "a PCIe switch", "socket": "a CPU socket",
           "node": "one machine"}
_ABOVE = {"spine": "spines", "core": "core switches"}
_ABOVE_ONE = {"spine": "spine", "core": "core switch"}


def _above(tier: str, count: int) -> str:
    """The switches of ``tier`` above the leaves, as the text names them (one, or several)."""
    return (_ABOVE_ONE.get(tier, f"{tier} switch") if count == 1 else _ABOVE.get(tier, f"{tier} switches"))
_BELOW = {"nic": "NICs", "host": "hosts"}


def gbps(x: float) -> str:
    """A rate to 4 significant digits, never in exponent form (41.9048 -> 41.9)."""
    return f"{float(f'{x:.4g}'):g}"


def wrap(text: str, indent: str = "  ") -> list[str]:
    """``text`` in lines of at most 80 columns, the later ones indented by ``indent``."""
    return textwrap.wrap(text, 80, subsequent_indent=indent, break_on_hyphens=False)


def domain_shares(level: dict, summary: dict) -> str:
    """What the ranks of one group of a ``domains`` level have in common."""
    kind = level["kind"]
    if kind == "fabric":
        names = [n for k, n in (("nvlink", "NVLink"), ("xgmi", "xGMI")) if k in summary["links"]]
        via = " through NVSwitches" if summary["devices"].get("nvswitch") else ""
        return f"an {'/'.join(names) or 'GPU'} fabric{via}"
    if kind != "leaf":
        return _SHARES[kind]
    spans, net = level["leaves"], summary["network"]
    if spans == [1]:
        return "one leaf switch"
    # A leaf group joins nodes whose NICs share leaves; on a rail-optimized fabric each rail
    # has leaves of its own, so the group spans several and traffic between them goes above.
    above = [_above(t, n) for t, n in net["switches"].items() if t != "leaf"]
    how = f"through the {' and '.join(above)}" if above else "over links between leaves"
    rails = ", one rail each" if net["rail_optimized"] else ""
    return f"{' or '.join(map(str, spans))} leaf switches{rails}; between leaves {how}"


def network_lines(summary: dict) -> list[str]:
    """The switch fabric and how the ranks' network traffic spreads over the NICs."""
    out: list[str] = []
    net, nics = summary["network"], summary["nics"]
    if net is not None and net["switches"]["leaf"]:
        sw = dict(net["switches"])
        leaves = sw.pop("leaf")
        above = " and ".join(_above(t, n) for t, n in sw.items()) or "links between leaves"
        lo, hi = net["per_leaf"][0], net["per_leaf"][-1]
        below = " and ".join(_BELOW.get(k, k) for k in net["below"])
        text = (f"Network: {leaves} leaf switch{'es' if leaves != 1 else ''} with "
                f"{lo if lo == hi else f'{lo} to {hi}'} {below}{' each' if leaves != 1 else ''}")
        for tier, n in sw.items():
            text += f", {n} {tier} switch{'es' if n != 1 else ''}"
        if ratio := net.get("oversubscription"):  # a leaf's bandwidth down to its NICs over up to the spines
            lo_r, hi_r = ratio
            text += ("; non-blocking (a leaf's uplinks carry what its NICs do)" if hi_r <= 1.0 else
                     f"; leaves oversubscribed {lo_r:g}:1" + (f" to {hi_r:g}:1" if hi_r != lo_r else "")
                     + " (down to the NICs over up to the switches above)")
        if net["rail_optimized"]:
            text += (f"; rail-optimized, {net['rails']} rails: NIC k of every node sits on a leaf of rail k, so "
                     f"network traffic between rails goes through the {above}")
        out += wrap(text + ".")
    if nics is not None:
        parts = []
        # NICs carrying ranks first, then the idle ones (under "0")
        for k, count in sorted(nics["ranks_per_nic"].items(), key=lambda kv: kv[0] == "0"):
            verb = "carry" if count != 1 else "carries"
            if k == "0":
                names = nics["idle"]
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                parts.append(f"{count} {verb} none ({shown})")
            else:
                shared = ", sharing its links" if k != "1" else ""
                parts.append(f"{count} {verb} {k} rank{'s' if k != '1' else ''} each{shared}")
        out += wrap(f"NICs on the network: {nics['nics']}; a rank's network traffic leaves through one (its "
                     f"device's nic, else the nearest over PCIe): {'; '.join(parts)}.")
    return out


def rate_lines(topo: Topology, shm_pairs: int = 0) -> list[str]:
    """What the transfer rates ``topo show`` prints are made of on ``topo`` (``shm_pairs``:
    how many rank pairs NCCL's shared-memory transport carries, ``nccl_rates.shm_pairs``)."""
    kinds = {ln.kind for ln in topo.links}
    if nccl_rates.p2p_link_gbps(topo) is None:
        parts, where = ["its links at their bw_gbps"], ""
    else:  # the kinds nccl_rates.p2p_link_gbps rates, as it rates them
        rated = [n for k, n in ((LinkKind.NVLINK, "NVLink"), (LinkKind.XGMI, "xGMI"), (LinkKind.PCIE, "PCIe"))
                 if k in kinds]
        parts = [f"{' and '.join(rated)} links as NCCL rates them"] if rated else []
        if any(link_class(k) is LinkClass.NETWORK for k in kinds):
            parts.append(f"network ports at {nccl_tuning.NET_ACHIEVED[nccl_tuning.Protocol.SIMPLE]:g} of their speed")
        if any(k not in _RATED and link_class(k) is not LinkClass.NETWORK for k in kinds):
            parts.append("other links at their bw_gbps")
        where = " (docs/nccl-model.md)"
    if any(ln.flow_gbps is not None for ln in topo.links):
        parts.append("one flow at most a link's flow_gbps")
    if shm_pairs:
        parts.append("GPU pairs NCCL does not connect peer-to-peer at most its shared-memory rate (below)")
    text = f"GB/s: what one message moves at alone on its route: {', '.join(parts)}"
    if nccl_p2p.applies(topo):
        over = " over links no log fitted" if topo.fitted_links else ""
        text += f"; NCCL's channels cap a send{over} further by its size"
    return wrap(text + where + ".")


_RATED = frozenset({LinkKind.NVLINK, LinkKind.XGMI, LinkKind.PCIE})


def shm_sentence(topo: Topology) -> str:
    """Which rank pairs of ``topo`` NCCL moves through host memory (``nccl_rates.shm_pair_gbps``)
    and why: a GPU without peer-to-peer at either end, or a path longer than NCCL's P2P level
    (both, counted, where some pairs have each reason); empty where none does. Pairs of
    different nodes never do, so only each node's pairs are looked at."""
    shm = no_p2p = 0
    levels: list[str] = []  # of the nodes where the level puts pairs through host memory
    for node, a, b in nccl_rates.node_pairs(topo):
        if nccl_rates.shm_pair_gbps(topo, a, b) < float("inf"):
            shm += 1
            if nccl_rates.shm_reason(topo, a, b) == nccl_rates.SHM_NO_P2P:
                no_p2p += 1
            elif (level := nccl_rates.p2p_level(topo, node)) not in levels:
                levels.append(level)
    if not shm:
        return ""
    level = f"further apart than NCCL's P2P level ({', '.join(levels)}) connects peer-to-peer"
    why = ("have no GPU peer-to-peer" if no_p2p == shm else f"are {level}" if not no_p2p
           else f"({no_p2p} with a GPU without peer-to-peer, {shm - no_p2p} {level})")
    n = topo.num_ranks
    return (f"{shm} of {n * (n - 1)} rank pairs {why}: NCCL moves their data through host memory, at most "
            f"{nccl_rates.shm_rate_gbps(topo):g} GB/s a pair (docs/nccl-model.md).")
