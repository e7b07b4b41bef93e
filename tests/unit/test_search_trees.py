"""Tree enumeration, shapes, hierarchies and local moves (no simulator involved)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeattn.errors import InfeasiblePlanError
from treeattn.search.moves import Move, apply_move, hill_climb, propose
from treeattn.search.trees import (
    ROOT,
    all_parent_lists,
    children_of,
    count_rooted_trees,
    depth_of,
    hierarchical,
    is_tree,
    place,
    root_of,
    shape,
    subtree_of,
)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6])
def test_enumeration_counts_rooted_labeled_trees(p):
    trees = list(all_parent_lists(p))
    assert len(trees) == p ** (p - 1) == count_rooted_trees(p)
    assert len(set(trees)) == len(trees)
    assert all(is_tree(t) for t in trees)
    # every rank is the root of exactly p^(p-2) of them (Cayley)
    roots = [root_of(t) for t in trees]
    assert all(roots.count(r) == len(trees) // p for r in range(p))


def test_enumeration_is_in_a_fixed_order():
    assert list(all_parent_lists(4)) == list(all_parent_lists(4))
    assert next(iter(all_parent_lists(3))) == (ROOT, 0, 0)


def test_is_tree_rejects_cycles_and_forests():
    assert not is_tree((ROOT, 2, 1))
    assert not is_tree((ROOT, ROOT, 0))
    assert not is_tree((1, 0, 0))
    assert not is_tree((ROOT, 1))


@pytest.mark.parametrize("kind", ["star", "chain", "kary", "binomial"])
@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_shapes_are_trees_rooted_at_position_zero(kind, n):
    t = shape(kind, n, fanout=3)
    assert is_tree(t) and t[0] == ROOT


def test_shape_depths():
    assert max(depth_of(shape("binomial", 16))) == 4
    assert max(depth_of(shape("chain", 5))) == 4
    assert max(depth_of(shape("star", 9))) == 1
    assert max(len(c) for c in children_of(shape("kary", 40, 3))) == 3
    with pytest.raises(InfeasiblePlanError):
        shape("spiral", 4)


def test_place_maps_positions_to_ranks():
    assert place(shape("chain", 3), [2, 0, 1], 3) == (2, 0, ROOT)
    with pytest.raises(InfeasiblePlanError):
        place(shape("chain", 3), [0, 0, 1], 3)


def test_hierarchical_reduces_inside_groups_first():
    levels = [[[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]]]
    par = hierarchical(8, levels, [("star", 2), ("chain", 2), ("binomial", 2)], root=5)
    assert is_tree(par) and root_of(par) == 5
    # finest groups: the non-leader sends to its partner
    assert par[1] == 0 and par[3] == 2 and par[4] == 5 and par[7] == 6
    # second level: group leaders inside each half; top: the halves' leaders
    assert par[2] == 0 and par[6] == 5 and par[0] == 5
    with pytest.raises(InfeasiblePlanError):
        hierarchical(4, [[[0, 1], [2]]], [("star", 2), ("star", 2)])


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(0, 10_000), st.integers(0, 40))
def test_moves_keep_a_tree(p, tree_index, seed):
    trees = list(all_parent_lists(min(p, 5)))
    par = trees[tree_index % len(trees)]
    if p > 5:
        par = hierarchical(p, [], [("binomial", 2)], root=seed % p)
    rng = random.Random(seed)
    for m in propose(par, rng, 12):
        nxt = apply_move(par, m)
        assert nxt is not None and nxt != par and is_tree(nxt)


def test_specific_moves():
    chain = (ROOT, 0, 1, 2)
    assert apply_move(chain, Move("lift", 2)) == (ROOT, 0, 0, 2)
    assert apply_move(chain, Move("reparent", 1, 3)) is None  # 3 is below 1: a cycle
    assert apply_move(chain, Move("reroot", 3)) == (1, 2, 3, ROOT)
    assert apply_move(chain, Move("swap", 0, 3)) == (2, 3, 1, ROOT)
    assert subtree_of(chain, 2) == {2, 3}


def test_hill_climb_finds_the_star_when_depth_costs():
    # Score: total depth (smooth: every lift helps) -> the optimum is the star.
    def score(par):
        return sum(depth_of(par))

    res = hill_climb(shape("chain", 6), score, random.Random(0), budget=400, per_round=20)
    assert res.score < score(shape("chain", 6))
    assert max(depth_of(res.par)) == 1 and res.score == 5
    again = hill_climb(shape("chain", 6), score, random.Random(0), budget=400, per_round=20)
    assert again == res
