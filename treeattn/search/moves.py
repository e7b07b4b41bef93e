"""Local improvement of a reduction tree: moves on parent lists and a seeded hill climb.

Moves (docs/design.md section 6): *reparent* a subtree under another rank, *swap* two ranks'
places, *lift* a rank to its grandparent (raises that vertex's fan-out), *push* a rank under
a sibling (lowers its parent's fan-out), *reroot* at another rank. Each move yields a new
parent list that is still one tree; the climb scores neighbours with a caller's function
(the simulator) and keeps the best strict improvement until none is found or the budget of
scored trees is spent.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from treeattn.search.trees import ROOT, children_of, root_of, subtree_of

__all__ = ["Move", "apply_move", "propose", "ClimbResult", "hill_climb"]


@dataclass(frozen=True, slots=True)
class Move:
    """One edit of a parent list: ``kind`` in reparent/swap/lift/push/reroot on ranks ``a``, ``b``."""

    kind: str
    a: int
    b: int = ROOT

    def __str__(self) -> str:
        return f"{self.kind}({self.a},{self.b})" if self.b != ROOT else f"{self.kind}({self.a})"


def _reparent(par: Sequence[int], v: int, q: int) -> tuple[int, ...] | None:
    if par[v] == ROOT or q == v or par[v] == q or q in subtree_of(par, v):
        return None
    out = list(par)
    out[v] = q
    return tuple(out)


def _swap(par: Sequence[int], a: int, b: int) -> tuple[int, ...] | None:
    if a == b:
        return None
    sigma = list(range(len(par)))
    sigma[a], sigma[b] = b, a
    out = [ROOT] * len(par)
    for x, q in enumerate(par):
        out[sigma[x]] = ROOT if q == ROOT else sigma[q]
    return tuple(out)


def _reroot(par: Sequence[int], v: int) -> tuple[int, ...] | None:
    if par[v] == ROOT:
        return None
    out = list(par)
    prev, cur = ROOT, v
    while cur != ROOT:
        nxt = par[cur]
        out[cur] = prev
        prev, cur = cur, nxt
    return tuple(out)


def apply_move(par: Sequence[int], move: Move) -> tuple[int, ...] | None:
    """The parent list after ``move``, or None when the move does not apply (no-op or cycle)."""
    if move.kind == "reparent":
        return _reparent(par, move.a, move.b)
    if move.kind == "swap":
        out = _swap(par, move.a, move.b)
        return None if out == tuple(par) else out
    if move.kind == "lift":
        q = par[move.a]
        return None if q == ROOT or par[q] == ROOT else _reparent(par, move.a, par[q])
    if move.kind == "push":
        return _reparent(par, move.a, move.b)
    if move.kind == "reroot":
        return _reroot(par, move.a)
    raise ValueError(f"unknown move kind {move.kind!r}")


def propose(
    par: Sequence[int],
    rng: random.Random,
    limit: int,
    near: Sequence[Sequence[int]] | None = None,
) -> list[Move]:
    """Up to ``limit`` distinct applicable moves, a seeded sample biased to plausible ones.

    Args:
        par: the current tree.
        rng: the seeded generator (same seed, same proposals).
        limit: most moves returned.
        near: optional ``near[r]``: ranks close to r (same NVLink island, node...), tried as
            new parents and swap partners before random ones.

    Returns:
        Moves in proposal order (no duplicates, each applicable to ``par``).
    """
    p = len(par)
    if p < 2:
        return []
    kids = children_of(par)
    root = root_of(par)
    nonroot = [r for r in range(p) if r != root]
    out: list[Move] = []
    seen: set[Move] = set()

    def add(m: Move) -> None:
        if m not in seen and apply_move(par, m) is not None:
            seen.add(m)
            out.append(m)

    # Structured moves first: change a busy vertex's fan-out, lift deep ranks.
    busy = sorted(range(p), key=lambda r: (-len(kids[r]), r))[: max(1, min(4, p // 4))]
    for q in busy:
        cs = kids[q]
        if len(cs) >= 2:
            c = cs[rng.randrange(len(cs))]
            s = cs[rng.randrange(len(cs))]
            add(Move("push", c, s))
    for _ in range(min(4, p)):
        add(Move("lift", nonroot[rng.randrange(len(nonroot))]))
    if root != 0 or p <= 16:
        add(Move("reroot", rng.randrange(p)))
    tries = 0
    while len(out) < limit and tries < 8 * limit:
        tries += 1
        v = nonroot[rng.randrange(len(nonroot))]
        roll = rng.random()
        if near is not None and near[v] and roll < 0.5:
            w = near[v][rng.randrange(len(near[v]))]
        else:
            w = rng.randrange(p)
        if roll < 0.6:
            add(Move("reparent", v, w))
        elif roll < 0.9:
            add(Move("swap", min(v, w), max(v, w)))
        else:
            add(Move("reroot", v))
    return out[:limit]


@dataclass(frozen=True, slots=True)
class ClimbResult:
    """Where a hill climb ended."""

    par: tuple[int, ...]
    score: float
    evaluated: int
    """Trees scored (the start excluded)."""
    accepted: tuple[str, ...]
    """Moves taken, in order."""


def hill_climb(
    start: Sequence[int],
    score: Callable[[tuple[int, ...]], float],
    rng: random.Random,
    *,
    budget: int,
    per_round: int,
    near: Sequence[Sequence[int]] | None = None,
    start_score: float | None = None,
    on_move: Callable[[float], None] | None = None,
    patience: int = 2,
    kicks: int = 0,
) -> ClimbResult:
    """Best-improvement local search over sampled neighbourhoods, with optional kicks.

    Args:
        start: the initial tree.
        score: predicted time of a tree (lower is better); called at most ``budget`` times.
        rng: seeded generator: the climb is deterministic for a given seed and score.
        budget: trees scored in all.
        per_round: moves sampled per round; the best strict improvement (by more than
            1e-9 relative) is taken.
        near: see ``propose``.
        start_score: score of ``start`` if the caller has it already.
        on_move: told the current tree's score whenever it changes (``inf`` just before a
            kicked tree is scored): a caller may skip simulating trees that cannot beat it.
        patience: rounds without an improvement before the climb is stuck.
        kicks: when stuck, up to this many times restart from the best tree with two
            random moves applied (iterated local search), while budget remains.

    Returns:
        The best tree found, its score, trees scored and the moves from ``start`` to it.
    """
    cur = tuple(start)
    cur_score = score(cur) if start_score is None else start_score
    best_par, best_score = cur, cur_score
    path: list[str] = []
    best_path: list[str] = []
    evaluated = 0
    visited = {cur}
    stale = 0
    while evaluated < budget:
        moves = propose(cur, rng, min(per_round, budget - evaluated), near)
        found: tuple[float, tuple[int, ...], Move] | None = None
        for m in moves:
            nxt = apply_move(cur, m)
            if nxt is None or nxt in visited:
                continue
            visited.add(nxt)
            s = score(nxt)
            evaluated += 1
            if s < cur_score * (1 - 1e-9) and (found is None or s < found[0]):
                found = (s, nxt, m)
            if evaluated >= budget:
                break
        if found is not None:
            cur_score, cur = found[0], found[1]
            path.append(str(found[2]))
            stale = 0
            if cur_score < best_score:
                best_par, best_score, best_path = cur, cur_score, list(path)
            if on_move is not None:
                on_move(cur_score)
            continue
        stale += 1
        if stale < patience:
            continue
        if kicks <= 0 or evaluated >= budget:
            break
        kicks -= 1
        stale = 0
        cur, path = best_par, list(best_path)
        for m in propose(cur, rng, 2, near)[:2]:
            nxt = apply_move(cur, m)
            if nxt is not None:
                cur = nxt
                path.append("kick:" + str(m))
        if on_move is not None:
            on_move(math.inf)
        cur_score = score(cur)
        evaluated += 1
        visited.add(cur)
        if on_move is not None:
            on_move(cur_score)
        if cur_score < best_score:
            best_par, best_score, best_path = cur, cur_score, list(path)
    return ClimbResult(best_par, best_score, evaluated, tuple(best_path))
