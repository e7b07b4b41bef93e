"""Candidate schedules from every family of docs/design.md section 6, for one topology.

Legend: p ranks; a *level* is a partition of the ranks from ``treeattn.topology.domains``
(NVLink island, PCIe switch, socket, node, leaf), finest first; a *rail* is the set of
ranks whose NIC has the same index in its node. Orders: ``natural`` is 0..p-1 (domain
major, as the topologies number ranks), ``interleaved`` deals the ranks round-robin over
the coarsest level's groups so that tree positions far apart stay inside one group.

Families: star, chain, kary (several fan-outs), binomial (two orders), butterfly
(recursive doubling), ring (reduce-scatter + all-gather), hierarchical (reduce inside the
fastest domain first, level by level), multirail forests (rows split over trees that each
cross the network on their own rail), double binary trees (a two-tree forest whose
inner ranks in one tree are leaves in the other) and direct exchange (every rank sends its
partial to every other at once; grouped: inside each domain first, then along rails).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeattn.plan.trees import double_binary_parents
from treeattn.search.evaluate import Schedule
from treeattn.search.trees import ROOT, hierarchical
from treeattn.topology.domains import domains, rails
from treeattn.topology.model import Topology
from treeattn.workload import Payload

__all__ = [
    "Layout",
    "layout_of",
    "interleaved_order",
    "standard_schedules",
    "hierarchical_schedule",
    "multirail_schedules",
    "double_binary_parents",
    "double_binary_schedules",
    "direct_schedules",
    "HIER_SHAPES",
    "DIRECT_MAX_MESSAGES",
]

DIRECT_MAX_MESSAGES = 8192
"""Direct exchanges sending more messages than this (at one chunk) are not generated: a flat
exchange over p ranks sends p(p-1), and building and simulating them grows with that."""

HIER_SHAPES: tuple[tuple[str, int], ...] = (("star", 2), ("binomial", 2), ("chain", 2), ("kary", 2), ("kary", 4))
"""(shape, fan-out) tried at each level of a hierarchy."""


@dataclass(frozen=True)
class Layout:
    """What the candidate generators need to know about a topology."""

    p: int
    levels: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    """(kind, groups) per nontrivial level, finest first (a level of one group is dropped)."""
    rails: tuple[tuple[int, ...], ...]
    """Ranks per NIC rail; empty when ranks have no NICs."""
    nodes: tuple[tuple[int, ...], ...]
    """Ranks per machine, by node index."""
    node_of: tuple[int, ...]
    """Index into ``nodes`` of each rank's machine."""

    @property
    def near(self) -> list[list[int]]:
        """For each rank, the other ranks of its finest group (move targets)."""
        out: list[list[int]] = [[] for _ in range(self.p)]
        if self.levels:
            for g in self.levels[0][1]:
                for r in g:
                    out[r] = [x for x in g if x != r][:32]
        return out


def layout_of(topo: Topology) -> Layout:
    """Levels, rails and nodes of ``topo`` (``treeattn.topology.domains``)."""
    p = topo.num_ranks
    levels = tuple((lv.kind.value, lv.groups) for lv in domains(topo) if len(lv.groups) > 1)
    nodes = topo.node_ranks
    node_of = [0] * p
    for i, members in enumerate(nodes):
        for r in members:
            node_of[r] = i
    return Layout(p, levels, tuple(rails(topo)), nodes, tuple(node_of))


def interleaved_order(lay: Layout) -> list[int] | None:
    """Ranks dealt round-robin over the coarsest level's groups (None when there is no level)."""
    if not lay.levels:
        return None
    groups = [list(g) for g in lay.levels[-1][1]]
    out: list[int] = []
    i = 0
    while len(out) < lay.p:
        for g in groups:
            if i < len(g):
                out.append(g[i])
        i += 1
    return out


def standard_schedules(lay: Layout, payload: Payload, *, small: bool) -> list[Schedule]:
    """Star, chain, kary, binomial, butterfly and ring schedules.

    Args:
        lay: the topology's layout.
        payload: used for the ring's row requirement.
        small: fewer orders and fan-outs (large p).
    """
    p = lay.p
    out = [Schedule("star", "star", {"root": 0}, {"root": 0}),
           Schedule("chain", "chain", {"root": 0}, {"root": 0}, chain_steps=2 * (p - 1))]
    orders: list[tuple[str, list[int] | None]] = [("natural", None)]
    inter = interleaved_order(lay)
    if inter is not None and inter != list(range(p)):
        orders.append(("interleaved", inter))
    fanouts = [k for k in ((2, 4, 8) if small else (2, 3, 4, 8, 16)) if k < p - 1]
    for name, order in orders:
        kw = {"order": order} if order is not None else {"root": 0}
        out.append(Schedule("binomial", "binomial", kw, {"order": name}))
        out.append(Schedule("butterfly", "butterfly", {"order": order} if order else {}, {"order": name}))
        for k in fanouts if (name == "natural" or not small) else fanouts[:1]:
            out.append(Schedule("kary", "kary", {**kw, "fanout": k}, {"order": name, "fanout": k}))
    if p > 1 and payload.rows >= p:
        out.append(Schedule("ring", "ring", {}, {"order": "natural"}, rows_per_chunk=p, chain_steps=2 * (p - 1)))
    return out


def hierarchical_schedule(
    lay: Layout, level_ids: Sequence[int], shapes: Sequence[tuple[str, int]], root: int = 0
) -> Schedule:
    """A tree reducing inside the chosen levels' groups first, then across their leaders.

    Args:
        lay: the layout.
        level_ids: indices into ``lay.levels``, finest first.
        shapes: (shape, fan-out) per chosen level plus one for the top.
        root: the rank the reduction ends at.

    Returns:
        A schedule of the builder's ``hierarchical`` algorithm when one level with one
        fan-out suffices, else of ``tree`` with the parent list.
    """
    chosen = [lay.levels[i] for i in level_ids]
    describe = {
        "levels": "+".join(kind for kind, _ in chosen),
        "shapes": "/".join(s if s != "kary" else f"kary{k}" for s, k in shapes),
        "root": root,
    }
    if len(chosen) == 1 and (shapes[0][0] != "kary" or shapes[1][0] != "kary" or shapes[0][1] == shapes[1][1]):
        fan = next((k for s, k in shapes if s == "kary"), 2)
        kw = {"groups": [list(g) for g in chosen[0][1]], "intra": shapes[0][0], "inter": shapes[1][0], "root": root}
        if fan != 2:
            kw["fanout"] = fan
        return Schedule("hierarchical", "hierarchical", kw, describe)
    par = hierarchical(lay.p, [g for _, g in chosen], shapes, root=root)
    return Schedule("hierarchical", "tree", {"parents": list(par)}, describe)


def _node_tree(lay: Layout, leaders: Sequence[int], intra: str, inter: str, inter_fan: int) -> list[int]:
    """A tree: inside each node star/binomial/chain to that node's leader, then across leaders."""
    from treeattn.search.trees import shape

    par = [ROOT] * lay.p
    for node, leader in zip(lay.nodes, leaders, strict=True):
        members = [leader] + [r for r in node if r != leader]
        t = shape(intra, len(members))
        for i, q in enumerate(t):
            if q != ROOT:
                par[members[i]] = members[q]
    t = shape(inter, len(leaders), inter_fan)
    for i, q in enumerate(t):
        if q != ROOT:
            par[leaders[i]] = leaders[q]
    return par


def multirail_schedules(lay: Layout, *, small: bool) -> list[Schedule]:
    """Forests that split the rows over T trees, tree t crossing the network on its own rail.

    Tree t reduces inside every node to that node's rank on rail t (a star or binomial),
    then across those ranks (star, binomial or k-ary), so the T trees drive T NICs per node
    at once. With one node (or no NICs) the trees are rooted at spread-out ranks instead,
    which turns the star into a reduce-scatter-like pattern over the fabric.
    """
    out: list[Schedule] = []
    p = lay.p
    node_rails = [r for r in lay.rails if len(r) == len(lay.nodes)] if len(lay.nodes) > 1 else []
    if node_rails and all(len(set(r)) == len(lay.nodes) for r in node_rails):
        count = len(node_rails)
        tree_counts = sorted({t for t in (2, 4, 8, 16, count) if 2 <= t <= count})
        inters = [("star", 2), ("binomial", 2), ("kary", 4)] + ([] if small else [("kary", 2), ("kary", 8)])
        for t_count in tree_counts:
            picked = [node_rails[i * count // t_count] for i in range(t_count)]
            for intra in ("star", "binomial"):
                for inter, fan in inters:
                    forest = []
                    for rail in picked:
                        leader_of = {lay.node_of[r]: r for r in rail}
                        leaders = [leader_of[i] for i in range(len(lay.nodes))]
                        forest.append(_node_tree(lay, leaders, intra, inter, fan))
                    label = inter if inter != "kary" else f"kary{fan}"
                    out.append(Schedule("multirail", "multirail", {"parents": forest},
                                        {"trees": t_count, "intra": intra, "inter": label, "leaders": "rails"},
                                        rows_per_chunk=t_count))
    else:
        for t_count in sorted({t for t in (2, 4, 8, p) if 2 <= t <= p and (not small or t <= 8)}):
            for shape_name in ("star", "binomial"):
                out.append(Schedule("multirail", "multirail", {"trees": t_count, "shape": shape_name},
                                    {"trees": t_count, "shape": shape_name}, rows_per_chunk=t_count))
    return out


def double_binary_schedules(lay: Layout) -> list[Schedule]:
    """Double binary trees: over all ranks, and (several nodes) across nodes with a chain
    or star inside each node, tree B using another rail's rank as each node's leader."""
    out: list[Schedule] = []
    p = lay.p
    if p >= 3:
        a, b = double_binary_parents(p)
        out.append(Schedule("double-binary", "multirail", {"parents": [a, b]}, {"scope": "all ranks"},
                            rows_per_chunk=2))
    if len(lay.nodes) >= 2 and all(len(n) == len(lay.nodes[0]) for n in lay.nodes):
        m = len(lay.nodes)
        a, b = double_binary_parents(m)
        width = len(lay.nodes[0])
        for intra in ("chain", "star"):
            forest = []
            for tree, pick in ((a, 0), (b, width // 2)):
                leaders = [n[pick] for n in lay.nodes]
                par = _node_tree(lay, leaders, intra, "star", 2)
                for i, q in enumerate(tree):
                    par[leaders[i]] = ROOT if q == ROOT else leaders[q]
                forest.append(par)
            out.append(Schedule("double-binary", "multirail", {"parents": forest},
                                {"scope": "across nodes", "intra": intra}, rows_per_chunk=2))
    return out


def _direct_messages(groups: Sequence[Sequence[int]]) -> int:
    inside = sum(len(g) * (len(g) - 1) for g in groups)
    across = sum(len(g) for g in groups) * (len(groups) - 1) if len(groups) > 1 else 0
    return inside + across


def direct_schedules(lay: Layout) -> list[Schedule]:
    """Direct exchanges: flat, grouped by each domain level (exchange inside the group, then
    with the same position of every other group), by node with members in rail order
    (then along rails), by rail (across nodes first, then inside the node), and by k
    adjacent rails for each k dividing the rail count. Exchanges
    of more than ``DIRECT_MAX_MESSAGES`` messages are left out."""
    p = lay.p
    if p < 2:
        return []
    options: list[tuple[list[list[int]] | None, dict]] = [(None, {"groups": "none"})]
    for kind, groups in lay.levels:
        options.append(([list(g) for g in groups], {"groups": kind}))
    covered = sorted(r for rail in lay.rails for r in rail) == list(range(p))
    if len(lay.nodes) > 1 and lay.rails and covered:
        rail_of = {r: i for i, rail in enumerate(lay.rails) for r in rail}
        by_rail = [sorted(node, key=lambda r: (rail_of[r], r)) for node in lay.nodes]
        options.append((by_rail, {"groups": "node", "then": "rails"}))
        options.append(([list(rail) for rail in lay.rails], {"groups": "rail", "then": "node"}))
        # k adjacent rails a group (its members node by node): the exchange inside a group
        # crosses nodes on k rails at once, the one across groups stays inside each node.
        n = len(lay.rails)
        for k in (k for k in range(2, n) if n % k == 0):
            groups = [sorted((r for rail in lay.rails[i:i + k] for r in rail), key=lambda r: (lay.node_of[r], r))
                      for i in range(0, n, k)]
            options.append((groups, {"groups": "rails", "rails_per_group": k, "then": "node"}))
    out: list[Schedule] = []
    seen: set[str] = set()
    for groups, describe in options:
        count = _direct_messages(groups if groups is not None else [list(range(p))])
        if count > DIRECT_MAX_MESSAGES:
            continue
        sched = Schedule("direct", "direct", {"groups": groups} if groups is not None else {}, describe)
        if sched.key not in seen:
            seen.add(sched.key)
            out.append(sched)
    return out
