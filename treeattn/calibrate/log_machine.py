"""What an nccl-tests log says of the machine it ran on, against a topology it is read onto.

Its device lines name the GPUs (``other_devices``, ``other_vendor``: another machine's); its
``#  Rank`` lines put the ranks on hosts (``other_hosts``: placed otherwise than the topology's
first ranks; ``ranks_like_hosts`` / ``selection_like_hosts``: the ``[ranks ...]`` selection that
places them as the log does). ``check-model`` notes a disagreement on a log's line; ``calibrate``
refuses the log, since its rates would be written into another machine's links.
"""

from __future__ import annotations

import re

from treeattn.calibrate.nccl_tests import NcclTestsLog
from treeattn.errors import TopologyError
from treeattn.topology.families import FAMILIES, parse_family_spec
from treeattn.topology.library import resolve
from treeattn.topology.model import DeviceKind, LinkKind, Topology

__all__ = ["example_selection", "hosts_listed", "other_devices", "other_hosts", "other_vendor", "ranks_like_hosts",
           "selection_like_hosts"]


def other_devices(log: NcclTestsLog, topo: Topology) -> str:
    """What is wrong where the log's device lines name GPUs other than the topology's (its
    model's product number, ``H100`` of ``H100-SXM5-80GB``, ends no word of them, nor two
    words run together: ``RTX4090``), or the topology has no GPU rank; empty where they agree,
    or the log or the topology does not say (no device lines, names without a product number
    such as ``NVIDIA Graphics Device``, probe's ``unknown-gpu``). ``check-model`` notes it;
    ``calibrate`` refuses. rccl-tests' output (AMD GPUs) disagrees with NVLink, device lines or not."""
    if log.rccl and any(ln.kind is LinkKind.NVLINK for ln in topo.links):
        return f"the log ran rccl-tests (AMD GPUs); {topo.name}'s GPUs are joined by NVLink (NVIDIA's)"
    names = sorted({d.name for d in log.devices if d.name})
    if not names:
        return ""
    gpus = sorted({d.model for d in map(topo.rank_device, range(topo.num_ranks)) if d.kind is DeviceKind.GPU})
    if not gpus:
        return f"the log ran on {', '.join(names)}; {topo.name}'s ranks are no GPUs"
    known = [m for m in gpus if m and m != "unknown-gpu"]  # probe's name for a GPU it could not tell
    keys = [next((t for t in _words(m) if any(c.isdigit() for c in t)), m.upper()) for m in known]
    # Whole words of the device names, or their ends (GB200 for B200): H20 is not H200, nor A10 A100.
    # A name with no number in it (GB200s on early drivers print "NVIDIA Graphics Device") says nothing.
    split = [_words(n) for n in names if any(c.isdigit() for c in n)]
    words = {w for ws in split for w in ws} | {a + b for ws in split for a, b in zip(ws, ws[1:], strict=False)}
    if not keys or not split or any(w.endswith(k) for k in keys for w in words):
        return ""
    return f"the log ran on {', '.join(names)}, not {topo.name}'s {', '.join(gpus)}"


def other_hosts(log: NcclTestsLog, topo: Topology, n: int) -> str:
    """What is wrong where the log's ``#  Rank`` lines put its ``n`` ranks on hosts otherwise
    than the topology puts its first ``n`` ranks on nodes (a one-node log read onto a topology
    of 4 GPUs a node, a two-node log onto one node, ranks dealt round-robin over the nodes);
    empty where they agree, or the log does not list every rank with its host. ``calibrate``
    refuses such a log."""
    hosts = {d.rank: d.host for d in log.devices}
    if sorted(hosts) != list(range(n)) or not all(hosts.values()):
        return ""
    nodes = [topo.rank_device(r).node for r in range(n)]
    pairs = {(hosts[r], nodes[r]) for r in range(n)}
    on_hosts, on_nodes = len(set(hosts.values())), len(set(nodes))
    if len(pairs) == on_hosts == on_nodes:
        return ""
    if on_hosts != on_nodes:
        return (f"the log ran its {n} ranks on {on_hosts} host(s) ({', '.join(sorted(set(hosts.values())))}), "
                f"but {topo.name!r} places ranks 0-{n - 1} on {on_nodes} node(s)")
    a, b = next((a, b) for a in range(n) for b in range(a + 1, n)
                if (hosts[a] == hosts[b]) != (nodes[a] == nodes[b]))
    same = "one host" if hosts[a] == hosts[b] else "different hosts"
    where = "one node" if nodes[a] == nodes[b] else "different nodes"
    return f"the log ran ranks {a} and {b} on {same}, but {topo.name!r} places them on {where}"


def selection_like_hosts(log: NcclTestsLog, topo: Topology, spec: str) -> str | None:
    """``spec[ranks ...]`` with ``ranks_like_hosts``' selection of ``topo`` (named ``spec``), the
    hint where a log's ranks sit on hosts otherwise than the topology's first ranks on nodes
    (fewer ranks, or the same ranks dealt round-robin); None where ``spec`` selects ranks
    already (its ranks are not the family's), the log's hosts do not say, or the selection
    would be the topology as it is."""
    if "[" in spec:
        return None
    like = None if len(log.devices) > topo.num_ranks else ranks_like_hosts(log, topo)
    if like is None and (bigger := _family_on_hosts(spec, hosts_listed(log), topo)) is not None:
        spec, topo = bigger, resolve(bigger)
        like = ranks_like_hosts(log, topo)
    return None if like is None else spec if like == f"0-{topo.num_ranks - 1}" else f"{spec}[ranks {like}]"


def example_selection(log: NcclTestsLog, topo: Topology, spec: str, ranks: int) -> str | None:
    """A selection of ``spec`` (not one already) for a log of ``ranks`` ranks, to suggest: the one
    that places them as its hosts hold them (``selection_like_hosts``), else, where its
    ``#  Rank`` lines do not say, its first ``ranks``; None where they say and no selection
    places them."""
    like = selection_like_hosts(log, topo, spec)
    return like if like or hosts_listed(log) else f"{spec}[ranks 0-{ranks - 1}]"


def _family_on_hosts(spec: str, hosts: int, topo: Topology) -> str | None:
    """``spec``'s family with as many nodes as the log's ``hosts`` (``dgx-h100:nodes=2`` for
    ``dgx-h100`` and two hosts), where ``spec`` names a family with a ``nodes`` parameter (a
    shipped file of a family's name, such as ``dgx-h100``, counts) and ``topo`` (its topology)
    has fewer nodes; None elsewhere."""
    nodes = len({topo.rank_device(r).node for r in range(topo.num_ranks)})
    name, _, rest = spec.strip().partition(":")
    family = FAMILIES.get(name)
    if hosts <= nodes or family is None or "nodes" not in {p.name for p in family.params}:
        return None
    try:
        _, params = parse_family_spec(spec.strip())
    except TopologyError:
        return None
    params["nodes"] = str(hosts)
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in params.items())


def _hosts(log: NcclTestsLog) -> dict[int, str] | None:
    """Each rank's host, where a log's ``#  Rank`` lines list every rank (two or more) with its
    host; None where they do not."""
    hosts = {d.rank: d.host for d in log.devices}
    if len(hosts) < 2 or sorted(hosts) != list(range(len(hosts))) or not all(hosts.values()):
        return None
    return hosts


def hosts_listed(log: NcclTestsLog) -> int:
    """How many hosts a log's ``#  Rank`` lines put its ranks on, where they list every rank
    with its host; 0 where they do not."""
    hosts = _hosts(log)
    return 0 if hosts is None else len(set(hosts.values()))


def ranks_like_hosts(log: NcclTestsLog, topo: Topology) -> str | None:
    """A ``[ranks ...]`` selection of ``topo`` that puts the log's ranks on nodes as its
    ``#  Rank`` lines put them on hosts (``"0,8"`` for one rank on each of two hosts,
    ``"0-3,8-11"`` for four, ``"0,8,1,9"`` for four dealt round-robin: a selection renumbers
    the ranks in the order it lists them): each host, in the order of its first rank, takes
    the next of the topology's nodes, and each rank the next rank of its host's node; None
    where the log does not list each rank with its host, or the topology has too few nodes or
    ranks a node for them."""
    hosts = _hosts(log)
    if hosts is None:
        return None
    n = len(hosts)
    per_node: dict[object, list[int]] = {}
    for r in range(topo.num_ranks):
        per_node.setdefault(topo.rank_device(r).node, []).append(r)
    order = list(dict.fromkeys(hosts[r] for r in range(n)))
    if len(order) > len(per_node):
        return None
    node_ranks = dict(zip(order, per_node.values(), strict=False))
    taken = dict.fromkeys(order, 0)
    picked = []
    for r in range(n):
        host = hosts[r]
        if taken[host] >= len(node_ranks[host]):
            return None
        picked.append(node_ranks[host][taken[host]])
        taken[host] += 1
    spans: list[list[int]] = []
    for r in picked:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def other_vendor(log: NcclTestsLog, topo: Topology) -> str:
    """What is wrong where the log's device lines name one vendor's GPUs (``NVIDIA ...``,
    ``AMD ...``) and the topology's GPU fabric is the other's (xGMI, NVLink): a probed topology
    whose GPU model is unknown (``unknown-gpu``), which ``other_devices`` cannot tell from a log,
    still says which; empty where they agree or either does not say."""
    names = sorted({d.name for d in log.devices if d.name})
    fabric = {ln.kind for ln in topo.links} & {LinkKind.NVLINK, LinkKind.XGMI}
    named = {v for n in names for v in ("NVIDIA", "AMD") if v in _words(n)}
    if len(fabric) != 1 or len(named) != 1:
        return ""
    wired = "NVIDIA" if fabric == {LinkKind.NVLINK} else "AMD"
    if named == {wired}:
        return ""
    return (f"the log ran on {', '.join(names)}; {topo.name}'s GPUs are joined by "
            f"{'NVLink' if wired == 'NVIDIA' else 'xGMI'} ({wired}'s)")


def _words(name: str) -> list[str]:
    """``name``'s words, upper case, split at anything but letters and digits (``H100 SXM``, ``H100_SXM``)."""
    return [w for w in re.split(r"[^0-9A-Z]+", name.upper()) if w]
