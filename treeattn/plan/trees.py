"""Rooted trees over ranks, written as parent lists.

A *parent list* ``parents`` has one entry per rank: ``parents[r]`` is the rank r sends its
partial to, and ``-1`` (``None`` is accepted on input) marks the root. A *position* is a
place in a canonical tree shape (position 0 is the root); ``order[i]`` is the rank placed
at position ``i``, so one shape gives many trees. Without ``order`` the positions are the
ranks rotated to start at the root: ``order = (root, root + 1, ..., root - 1) mod p``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeattn.errors import InfeasiblePlanError

__all__ = [
    "SHAPES",
    "TreeInfo",
    "check_parents",
    "tree_info",
    "positions",
    "parents_star",
    "parents_chain",
    "parents_kary",
    "parents_binomial",
    "parents_of_shape",
    "double_binary_parents",
]

SHAPES = ("star", "chain", "kary", "binomial")
"""Canonical tree shapes a parent list can be generated from."""


def positions(p: int, root: int | None = None, order: Sequence[int] | None = None) -> list[int]:
    """The rank at each tree position (position 0 is the root).

    Args:
        p: number of ranks.
        root: the root rank; default 0, or ``order[0]`` when ``order`` is given.
        order: a permutation of ``range(p)``; when given with ``root``, ``order[0]`` must be it.

    Returns:
        ``order`` as a list (checked), or the ranks rotated to start at ``root``.
    """
    if p < 1:
        raise InfeasiblePlanError(f"a tree needs at least one rank, got {p}")
    if order is None:
        r0 = 0 if root is None else root
        if not isinstance(r0, int) or not 0 <= r0 < p:
            raise InfeasiblePlanError(f"root {r0!r} is out of range: there are {p} ranks")
        return [(r0 + i) % p for i in range(p)]
    out = list(order)
    if len(out) != p or sorted(out) != list(range(p)):
        raise InfeasiblePlanError(f"order must be a permutation of the {p} ranks 0..{p - 1}, got {out[:16]}"
                                  + (" ..." if len(out) > 16 else ""))
    if root is not None and out[0] != root:
        raise InfeasiblePlanError(f"root {root} conflicts with order[0] = {out[0]}: order[0] is the root")
    return out


def _place(shape_parent: list[int], pos: list[int]) -> list[int]:
    """A parent list over positions (-1 at the root, wherever it is) as one over the ranks ``pos`` places."""
    parents = [-1] * len(pos)
    for i, q in enumerate(shape_parent):
        if q >= 0:
            parents[pos[i]] = pos[q]
    return parents


def parents_star(p: int, root: int | None = None, order: Sequence[int] | None = None) -> list[int]:
    """Every rank sends straight to the root (depth 1).

    Args:
        p: ranks. root: the root rank (default 0). order: ranks by position (see module doc).

    Returns:
        The parent list (``-1`` at the root).
    """
    return _place([-1] + [0] * (p - 1), positions(p, root, order))


def parents_chain(p: int, root: int | None = None, order: Sequence[int] | None = None) -> list[int]:
    """Position i sends to position i - 1 (depth p - 1).

    Args:
        p: ranks. root: the root rank (default 0). order: ranks by position.

    Returns:
        The parent list.
    """
    return _place([-1] + list(range(p - 1)), positions(p, root, order))


def parents_kary(p: int, root: int | None = None, order: Sequence[int] | None = None, *,
                 fanout: int = 2) -> list[int]:
    """Complete k-ary tree in heap layout: position i sends to (i - 1) // fanout.

    Args:
        p: ranks. root: the root rank. order: ranks by position. fanout: children per node (>= 1).

    Returns:
        The parent list.
    """
    if not isinstance(fanout, int) or fanout < 1:
        raise InfeasiblePlanError(f"fanout must be an integer >= 1, got {fanout!r}")
    return _place([-1] + [(i - 1) // fanout for i in range(1, p)], positions(p, root, order))


def parents_binomial(p: int, root: int | None = None, order: Sequence[int] | None = None) -> list[int]:
    """Binomial tree: position i sends to i with its lowest set bit cleared (depth ceil(log2 p)).

    Odd positions are leaves that send to their even neighbour first, as MPI's binomial
    reduce does, so the first round stays between adjacent ranks.

    Args:
        p: ranks. root: the root rank. order: ranks by position.

    Returns:
        The parent list.
    """
    return _place([-1] + [i & (i - 1) for i in range(1, p)], positions(p, root, order))


def parents_of_shape(shape: str, p: int, *, root: int | None = None, order: Sequence[int] | None = None,
                     fanout: int = 2) -> list[int]:
    """Parent list of a named shape (one of ``SHAPES``).

    Args:
        shape: ``star``, ``chain``, ``kary`` or ``binomial``.
        p: ranks. root: the root rank. order: ranks by position. fanout: for ``kary``.

    Returns:
        The parent list.
    """
    if shape == "star":
        return parents_star(p, root, order)
    if shape == "chain":
        return parents_chain(p, root, order)
    if shape == "kary":
        return parents_kary(p, root, order, fanout=fanout)
    if shape == "binomial":
        return parents_binomial(p, root, order)
    raise InfeasiblePlanError(f"unknown tree shape {shape!r}; choose one of {', '.join(SHAPES)}")


@dataclass(frozen=True, slots=True)
class TreeInfo:
    """A checked parent list with what schedules need."""

    parents: tuple[int, ...]
    """Normalised parent list (``-1`` at the root)."""
    root: int
    children: tuple[tuple[int, ...], ...]
    """Children of each rank, ascending."""
    depth: tuple[int, ...]
    """Edges from the root."""
    height: tuple[int, ...]
    """Edges of the longest path down to a leaf (0 for a leaf)."""
    bfs: tuple[int, ...]
    """Ranks in breadth-first order from the root."""


def check_parents(parents: Sequence[int | None], p: int | None = None) -> list[int]:
    """Check a parent list names one tree over all ranks and normalise it.

    Args:
        parents: ``parents[r]`` is rank r's parent; ``-1`` or ``None`` marks the root.
        p: the expected number of ranks (default ``len(parents)``).

    Returns:
        The parent list with ``-1`` at the root.

    Raises:
        InfeasiblePlanError: wrong length, no or several roots, out-of-range parent, cycle.
    """
    return list(tree_info(parents, p).parents)


def tree_info(parents: Sequence[int | None], p: int | None = None) -> TreeInfo:
    """Check ``parents`` (see ``check_parents``) and compute children, depths and heights.

    Args:
        parents: the parent list. p: the expected number of ranks.

    Returns:
        A ``TreeInfo``.
    """
    n = len(parents)
    if p is not None and n != p:
        raise InfeasiblePlanError(f"the parent list names {n} ranks but there are {p}")
    if n < 1:
        raise InfeasiblePlanError("the parent list is empty")
    norm = [-1 if x is None else x for x in parents]
    roots = [r for r, x in enumerate(norm) if x == -1]
    if len(roots) != 1:
        raise InfeasiblePlanError(f"a parent list needs exactly one root (-1), found {len(roots)}: {roots[:8]}")
    children: list[list[int]] = [[] for _ in range(n)]
    for r, x in enumerate(norm):
        if x == -1:
            continue
        if type(x) is not int or not 0 <= x < n:
            # by rank, not by the list's index: the index is the rank, and the CLI counts items from 1
            raise InfeasiblePlanError(f"rank {r}'s parent {x!r} is not a rank in [0, {n})")
        if x == r:
            raise InfeasiblePlanError(f"rank {r} is its own parent")
        children[x].append(r)
    root = roots[0]
    depth = [-1] * n
    depth[root] = 0
    bfs = [root]
    for r in bfs:  # grows while iterating
        d = depth[r] + 1
        for c in children[r]:
            depth[c] = d
            bfs.append(c)
    if len(bfs) != n:
        lost = next(r for r in range(n) if depth[r] < 0)
        cycle, r = [], lost
        while r not in cycle:
            cycle.append(r)
            r = norm[r]
        loop = cycle[cycle.index(r):] + [r]
        raise InfeasiblePlanError("the parent list has a cycle: " + " -> ".join(map(str, loop))
                                  + f"; {n - len(bfs)} rank(s) never reach root {root}")
    height = [0] * n
    for r in reversed(bfs):
        x = norm[r]
        if x >= 0 and height[x] < height[r] + 1:
            height[x] = height[r] + 1
    return TreeInfo(tuple(norm), root, tuple(tuple(c) for c in children), tuple(depth), tuple(height), tuple(bfs))


def reroot(parents: Sequence[int | None], root: int) -> list[int]:
    """The same tree (the same edges) hanging from ``root``: the edges on the path from
    ``root`` up to the old root are reversed.

    Args:
        parents: a parent list. root: the new root.

    Returns:
        The parent list rooted at ``root``.
    """
    out = list(tree_info(parents).parents)
    if type(root) is not int or not 0 <= root < len(out):
        raise InfeasiblePlanError(f"root {root!r} is out of range: there are {len(out)} ranks")
    prev, r = -1, root
    while r != -1:
        up = out[r]
        out[r] = prev
        prev, r = r, up
    return out


def rotated(order: Sequence[int], first: int) -> list[int]:
    """``order`` rotated so that rank ``first`` comes first (the tree positions re-rooted there)."""
    i = list(order).index(first)
    return list(order[i:]) + list(order[:i])


def double_binary_parents(n: int, order: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """NCCL's double binary tree over positions 0..n-1 (src/graph/trees.cc, ncclGetDtree).

    Tree A is the in-order binary tree whose leaves are the odd positions (a position's
    parent clears its lowest set bit and sets the next one up); tree B mirrors it (even n)
    or shifts it by one (odd n), so a position inner in one tree is a leaf in the other.

    Args:
        n: number of ranks.
        order: the rank at each position (default: rank i at position i).

    Returns:
        Two parent lists over the ranks.
    """

    def btree(i: int) -> int:
        if i == 0:
            return -1
        bit = i & -i
        up = (i ^ bit) | (bit << 1)
        return up if up < n else i ^ bit

    def moved(i: int) -> int:  # where tree B puts tree A's position i
        return n - 1 - i if n % 2 == 0 else (i + 1) % n

    a = [btree(i) for i in range(n)]
    b = [-1] * n
    for i, q in enumerate(a):
        b[moved(i)] = -1 if q == -1 else moved(q)
    if order is None:
        return a, b
    pos = positions(n, None, order)
    return _place(a, pos), _place(b, pos)
