"""Reduction trees as parent lists: enumeration, shapes, hierarchies.

Legend: a *parent list* ``par`` over p ranks has ``par[r]`` = the rank r sends its merged
partial to, and ``par[root] = -1``. A *shape* is a tree over positions 0..n-1 with position
0 the root; placing it on an *order* (a list of ranks) maps position i to ``order[i]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from treeattn.errors import InfeasiblePlanError

__all__ = [
    "ROOT",
    "SHAPES",
    "count_rooted_trees",
    "all_parent_lists",
    "prufer_edges",
    "children_of",
    "root_of",
    "depth_of",
    "subtree_of",
    "is_tree",
    "shape",
    "place",
    "hierarchical",
]

ROOT = -1
"""Parent of the root in a parent list."""

SHAPES = ("star", "chain", "kary", "binomial")
"""Single-level tree shapes, by position (``kary`` takes a fan-out)."""


def count_rooted_trees(p: int) -> int:
    """Rooted labeled trees on p vertices: p^(p-1) (Cayley's formula times the root)."""
    return p ** (p - 1) if p >= 1 else 0


def prufer_edges(seq: Sequence[int], n: int) -> list[tuple[int, int]]:
    """Edges of the labeled tree on n >= 2 vertices with Prüfer sequence ``seq`` (len n - 2)."""
    degree = [1] * n
    for v in seq:
        degree[v] += 1
    edges = []
    for v in seq:
        leaf = next(u for u in range(n) if degree[u] == 1)
        edges.append((leaf, v))
        degree[leaf] -= 1
        degree[v] -= 1
    u, w = (x for x in range(n) if degree[x] == 1)
    edges.append((u, w))
    return edges


def _orient(edges: list[tuple[int, int]], n: int, root: int) -> tuple[int, ...]:
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    par = [ROOT] * n
    seen = {root}
    stack = [root]
    while stack:
        u = stack.pop()
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                par[v] = u
                stack.append(v)
    return tuple(par)


def all_parent_lists(p: int) -> Iterator[tuple[int, ...]]:
    """Every rooted labeled tree on ranks 0..p-1, once each, in a fixed order.

    Args:
        p: number of ranks (>= 1). There are ``count_rooted_trees(p)`` = p^(p-1) of them.

    Returns:
        An iterator of parent lists (root first, then Prüfer sequences in lexicographic order).

    Examples:
        >>> sorted(all_parent_lists(2))
        [(-1, 0), (1, -1)]
    """
    if p < 1:
        raise InfeasiblePlanError(f"a tree needs at least one rank, got {p}")
    if p == 1:
        yield (ROOT,)
        return
    for root in range(p):
        for seq in itertools.product(range(p), repeat=p - 2):
            yield _orient(prufer_edges(seq, p), p, root)


def children_of(par: Sequence[int]) -> list[list[int]]:
    """``children[r]``: ranks whose parent is r, ascending."""
    kids: list[list[int]] = [[] for _ in par]
    for r, q in enumerate(par):
        if q != ROOT:
            kids[q].append(r)
    return kids


def root_of(par: Sequence[int]) -> int:
    roots = [r for r, q in enumerate(par) if q == ROOT]
    if len(roots) != 1:
        raise InfeasiblePlanError(f"a parent list needs exactly one root (-1), found {len(roots)}: {list(par)}")
    return roots[0]


def is_tree(par: Sequence[int]) -> bool:
    """True when ``par`` is one tree spanning all its ranks (one root, no cycle)."""
    n = len(par)
    if sum(1 for q in par if q == ROOT) != 1 or any(not (q == ROOT or 0 <= q < n) or q == r for r, q in enumerate(par)):
        return False
    return all(len(_path_to_root(par, r)) <= n for r in range(n))


def _path_to_root(par: Sequence[int], r: int) -> list[int]:
    path = [r]
    while par[path[-1]] != ROOT and len(path) <= len(par):
        path.append(par[path[-1]])
    return path


def depth_of(par: Sequence[int]) -> list[int]:
    """Hops from each rank to the root."""
    depth = [-1] * len(par)
    for r in range(len(par)):
        path = []
        v = r
        while depth[v] < 0 and par[v] != ROOT:
            path.append(v)
            v = par[v]
        if depth[v] < 0:
            depth[v] = 0
        for u in reversed(path):
            depth[u] = depth[par[u]] + 1
    return depth


def subtree_of(par: Sequence[int], v: int) -> set[int]:
    """v and every rank below it."""
    kids = children_of(par)
    out = {v}
    stack = [v]
    while stack:
        for c in kids[stack.pop()]:
            out.add(c)
            stack.append(c)
    return out


def shape(kind: str, n: int, fanout: int = 2) -> tuple[int, ...]:
    """Parent list by position of a single-level shape on n positions, root at position 0.

    Args:
        kind: ``star`` (all to 0), ``chain`` (i to i-1), ``kary`` (i to (i-1)//fanout, a heap),
            ``binomial`` (i to i with its lowest set bit cleared: log2 rounds of halving).
        n: positions.
        fanout: children per vertex for ``kary``.

    Returns:
        ``par`` with ``par[0] = -1``.
    """
    if n < 1:
        raise InfeasiblePlanError(f"a tree shape needs at least one position, got {n}")
    if kind == "star":
        return (ROOT, *([0] * (n - 1)))
    if kind == "chain":
        return (ROOT, *range(n - 1))
    if kind == "kary":
        if fanout < 1:
            raise InfeasiblePlanError(f"kary fan-out must be >= 1, got {fanout}")
        return (ROOT, *((i - 1) // fanout for i in range(1, n)))
    if kind == "binomial":
        return (ROOT, *(i & (i - 1) for i in range(1, n)))
    raise InfeasiblePlanError(f"unknown tree shape {kind!r}; choose one of {', '.join(SHAPES)}")


def place(par_by_pos: Sequence[int], order: Sequence[int], p: int) -> tuple[int, ...]:
    """Put a shape onto ranks: position i becomes rank ``order[i]``; ``order`` must cover 0..p-1."""
    if sorted(order) != list(range(p)):
        raise InfeasiblePlanError(f"rank order must be a permutation of 0..{p - 1}, got {list(order)}")
    out = [ROOT] * p
    for i, q in enumerate(par_by_pos):
        out[order[i]] = ROOT if q == ROOT else order[q]
    return tuple(out)


def hierarchical(
    p: int,
    levels: Sequence[Sequence[Sequence[int]]],
    shapes: Sequence[tuple[str, int]],
    root: int = 0,
) -> tuple[int, ...]:
    """A tree that reduces inside the finest groups first, then across their leaders, level by level.

    Args:
        p: ranks.
        levels: partitions of the ranks, finest first; each group of a level is a union of
            groups of the level before. A top level joining everything is implied.
        shapes: ``(kind, fanout)`` per level plus one for the implied top level
            (``len(levels) + 1`` entries).
        root: the rank at the top; it leads every group that holds it.

    Returns:
        The parent list.
    """
    if len(shapes) != len(levels) + 1:
        raise InfeasiblePlanError(f"hierarchical tree: {len(levels)} levels need {len(levels) + 1} shapes")
    par = [ROOT] * p
    # Leaders of the current units (a unit is a group of the level below, or a single rank).
    leader = {r: r for r in range(p)}
    unit_of = {r: r for r in range(p)}
    for lvl, (kind, fanout) in enumerate(shapes):
        groups = [list(range(p))] if lvl == len(levels) else [list(g) for g in levels[lvl]]
        new_unit_of: dict[int, int] = {}
        new_leader: dict[int, int] = {}
        for gi, group in enumerate(groups):
            root_unit = unit_of[root]
            units = sorted({unit_of[r] for r in group}, key=lambda u: (u != root_unit, leader[u]))
            heads = [leader[u] for u in units]
            tree = shape(kind, len(heads), fanout)
            for i, q in enumerate(tree):
                if q != ROOT:
                    par[heads[i]] = heads[q]
            for r in group:
                new_unit_of[r] = gi
            new_leader[gi] = heads[0]
        if sorted(new_unit_of) != list(range(p)):
            raise InfeasiblePlanError(f"hierarchical tree: level {lvl} does not cover every rank once")
        unit_of, leader = new_unit_of, new_leader
    return tuple(par)
