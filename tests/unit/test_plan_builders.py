"""Builders: every algorithm validates at many sizes; trees, pipelining and parameters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_plan_helpers import CHUNKS, RANKS, REF, attention, every_plan, extra_params, raw
from treeattn.errors import InfeasiblePlanError, InputError
from treeattn.plan import (
    ALGORITHMS,
    OpKind,
    build,
    check,
    check_parents,
    parents_binomial,
    parents_chain,
    parents_kary,
    parents_star,
    tree_plan,
    validate,
)
from treeattn.plan.compact import compact_args
from treeattn.plan.io import dump_plan
from treeattn.plan.trees import double_binary_parents
from treeattn.workload import Workload


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("chunks", CHUNKS)
def test_every_builder_validates(p: int, chunks: int) -> None:
    plans = every_plan(p, chunks)
    assert {plan.algorithm for plan in plans} == set(ALGORITHMS)
    for plan in plans:
        report = validate(plan)
        assert report.valid, (plan.algorithm, plan.workload.kind, plan.result_ranks, report.first)


def test_registry_describes_every_algorithm() -> None:
    baselines = {name for name, spec in ALGORITHMS.items() if spec.is_baseline}
    assert baselines == {"allreduce3", "allreduce2", "allreduce", "allgather-merge", "dcp-ag-rs", "dcp-a2a",
                         "ring-attention"}
    for name, spec in ALGORITHMS.items():
        assert spec.name == name and spec.description and "\n" not in spec.description
        assert all(param.description for param in spec.params)
        assert spec.to_dict()["name"] == name


def test_parent_list_helpers() -> None:
    assert parents_star(4) == [-1, 0, 0, 0]
    assert parents_chain(4, root=2) == [3, 0, -1, 2]
    assert parents_kary(7, fanout=3) == [-1, 0, 0, 0, 1, 1, 1]
    assert parents_binomial(8) == [-1, 0, 0, 2, 0, 4, 4, 6]
    assert parents_binomial(4, order=[3, 2, 1, 0]) == [1, 3, 3, -1]
    assert check_parents([None, 0, 1]) == [-1, 0, 1]


@pytest.mark.parametrize("parents, why", [
    ([-1, 1], "own parent"),
    ([-1, -1], "exactly one root"),
    ([-1, 5], "not a rank"),
    ([-1, 2, 1], "cycle: 1 -> 2 -> 1"),
])
def test_bad_parent_lists_are_refused(parents: list[int], why: str) -> None:
    with pytest.raises(InfeasiblePlanError, match=why):
        tree_plan(parents, attention(len(parents)), REF)


def test_chain_pipelines_in_depth_plus_chunks_minus_one_steps() -> None:
    p, k = 6, 4
    plan = build("chain", raw(p), REF, chunks=k, result="root")
    reduce_steps = {op.step for prog in plan.programs for op in prog}
    assert len(reduce_steps) == (p - 1) + k - 1
    full = build("chain", attention(p), REF, chunks=k)
    steps = {op.step for prog in full.programs for op in prog if op.kind is not OpKind.COMPUTE}
    # The root broadcasts chunk 0 as soon as it is reduced, while later chunks still arrive.
    assert len(steps) == 2 * (p - 1) + k - 1


def test_every_transfer_sits_in_the_same_step_on_both_sides() -> None:
    for plan in every_plan(7, 3):
        sent: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
        got: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
        for r, prog in enumerate(plan.programs):
            for op in prog:
                if op.kind is OpKind.SEND:
                    sent.setdefault((r, op.peer), []).append((op.step, op.chunk))
                elif op.kind in (OpKind.RECV_MERGE, OpKind.RECV_COPY):
                    got.setdefault((op.peer, r), []).append((op.step, op.chunk))
        assert sent == got, plan.algorithm


def test_root_result_and_root_choice() -> None:
    plan = build("binomial", attention(5), REF, chunks=2, root=3, result="root")
    assert plan.result_ranks == (3,) and plan.params["root"] == 3 and plan.params["parents"][3] == -1
    assert not any(op.kind is OpKind.RECV_COPY for prog in plan.programs for op in prog)
    check(plan)


def test_order_places_ranks_at_positions() -> None:
    plan = build("chain", attention(4), REF, order=[2, 0, 3, 1])
    assert plan.params["parents"] == [2, 3, -1, 0]
    with pytest.raises(InfeasiblePlanError, match="order\\[0\\]"):
        build("chain", attention(4), REF, order=[2, 0, 3, 1], root=1)
    with pytest.raises(InfeasiblePlanError, match="permutation"):
        build("star", attention(4), REF, order=[0, 0, 1, 2])


def test_hierarchical_reduces_inside_groups_first() -> None:
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    plan = build("hierarchical", attention(8), REF, groups=groups, root=5, intra="star", inter="chain")
    parents = plan.params["parents"]
    assert parents[5] == -1 and parents[0] == 5  # leader of group 0 sends to the root's group leader
    assert all(parents[r] == 0 for r in (1, 2, 3)) and all(parents[r] == 5 for r in (4, 6, 7))
    check(plan)
    with pytest.raises(InfeasiblePlanError, match="partition"):
        build("hierarchical", attention(8), REF, groups=[[0, 1], [1, 2, 3, 4, 5, 6, 7]])
    with pytest.raises(InputError, match="needs groups"):
        build("hierarchical", attention(8), REF)


def test_multirail_sends_chunk_c_over_tree_c_mod_t() -> None:
    plan = build("multirail", attention(8), REF, chunks=2, roots=[0, 5])
    assert plan.chunks == 4 and plan.params["roots"] == [0, 5]
    trees = plan.params["parents"]
    for r, prog in enumerate(plan.programs):
        for op in prog:
            if op.kind is OpKind.SEND:
                tree = trees[op.chunk % 2]
                assert tree[r] == op.peer or tree[op.peer] == r  # up to the parent or down to a child
    check(plan)
    default = build("multirail", attention(8), REF)
    interior = [{r for r in range(8) if r in par} for par in default.params["parents"]]
    assert not interior[0] & interior[1]  # each rank is interior in at most one of the two trees


def test_broadcast_copies_the_roots_buffer() -> None:
    plan = build("broadcast", raw(6), REF, chunks=3, root=4)
    assert plan.contributors == (4,) and plan.result_ranks == tuple(range(6))
    assert all(op.kind in (OpKind.SEND, OpKind.RECV_COPY) for prog in plan.programs for op in prog)
    check(plan)


def test_baselines_use_collectives_and_kv_blocks() -> None:
    trio = build("allreduce3", attention(4), REF)
    assert [op.part for op in trio.programs[2] if op.kind is OpKind.COLLECTIVE] == ["lse", "num", "den"]
    ring = build("ring-attention", attention(4), REF)
    computed = [op.block for op in ring.programs[1] if op.kind is OpKind.COMPUTE]
    assert computed == [None, 0, 3, 2]  # own block first, then each block passed along the ring


@pytest.mark.parametrize("call, error, text", [
    (lambda: build("nope", attention(2), REF), InputError, "unknown algorithm"),
    # families the search's candidates name, which no builder has
    (lambda: build("improved", attention(2), REF), InputError,
     "a tree the search reached by local moves: build it as 'tree' with the parents its candidate's "
     "build_params give"),
    (lambda: build("exhaustive", attention(2), REF), InputError, "found among every tree: build it as 'tree'"),
    (lambda: build("star", attention(2), REF, fanout=3), InputError, "takes no fanout"),
    (lambda: build("butterfly", attention(2), REF, root=1), InputError, "takes no root"),
    (lambda: build("kary", attention(2), REF, bogus=1), InputError, "no parameter 'bogus'"),
    (lambda: build("ring", attention(2), REF, result="root"), InfeasiblePlanError,
     "builds result all or heads, not root"),
    (lambda: build("allreduce3", raw(2), REF), InfeasiblePlanError, "attention"),
    (lambda: build("star", attention(2), REF, chunks=0), InputError, "chunks"),
    (lambda: build("ring", attention(16), REF, chunks=5), InfeasiblePlanError, "80 row chunks"),
    (lambda: build("tree", attention(2), REF), InputError, "needs parents"),
])
def test_builder_errors_say_what_is_wrong(call, error, text) -> None:
    with pytest.raises(error, match=text):
        call()


def test_builders_are_deterministic() -> None:
    for a, b in zip(every_plan(5, 3), every_plan(5, 3), strict=True):
        assert dump_plan(a) == dump_plan(b)


@st.composite
def random_trees(draw: st.DrawFn) -> list[int]:
    p = draw(st.integers(1, 24))
    parents_by_position = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, p)]
    perm = draw(st.permutations(range(p)))
    parents = [-1] * p
    for pos in range(1, p):
        parents[perm[pos]] = perm[parents_by_position[pos]]
    return parents


@settings(max_examples=150, deadline=None)
@given(random_trees(), st.integers(1, 5), st.sampled_from(["all", "root"]), st.booleans())
def test_any_tree_plan_validates(parents: list[int], chunks: int, result: str, is_raw: bool) -> None:
    p = len(parents)
    payload = raw(p) if is_raw else attention(p)
    plan = tree_plan(parents, payload, REF, chunks=chunks, result=result)
    assert validate(plan).valid, validate(plan).first
    assert plan.params["parents"] == parents


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(ALGORITHMS)), st.integers(1, 12), st.integers(1, 4), st.booleans(),
       st.permutations(range(12)))
def test_any_algorithm_at_any_size_validates(name: str, p: int, chunks: int, is_raw: bool, perm: list[int]) -> None:
    spec = ALGORITHMS[name]
    payload = raw(p) if is_raw else attention(p)
    if payload.kind not in spec.payloads:
        payload = attention(p) if is_raw else raw(p)
    kwargs: dict = {}
    names = {param.name for param in spec.params}
    if "order" in names:
        kwargs["order"] = [r for r in perm if r < p]
    if name == "tree":
        kwargs["parents"] = parents_binomial(p)
    if name == "hierarchical":
        kwargs["group_size"] = max(1, p // 3)
    plan = build(name, payload, REF, chunks=chunks, **kwargs)
    assert validate(plan).valid, validate(plan).first


# -- direct exchange ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("chunks", [1, 3, 4])
def test_direct_validates_flat_and_grouped(p: int, chunks: int) -> None:
    layouts: list[dict] = [{}, {"group_size": 2}, {"group_size": 3}, {"group_size": p}]
    if p % 4 == 0:
        # nodes of 4 listed by rail: rank n*4 + i is on rail i
        layouts.append({"groups": [[n * 4 + i for i in range(4)] for n in range(p // 4)]})
    for kwargs in layouts:
        for payload in (attention(p), raw(p)):
            plan = build("direct", payload, REF, chunks=chunks, **kwargs)
            report = validate(plan)
            assert report.valid, (kwargs, payload.kind, report.first)
            assert plan.result_ranks == tuple(range(p))


def test_direct_sends_every_partial_to_every_rank_in_one_step() -> None:
    p = 5
    plan = build("direct", attention(p), REF)
    for r, prog in enumerate(plan.programs):
        comm = [op for op in prog if op.kind is not OpKind.COMPUTE]
        assert {op.step for op in comm} == {1}
        assert sorted(op.peer for op in comm if op.kind is OpKind.SEND) == [q for q in range(p) if q != r]
        assert sorted(op.peer for op in comm if op.kind is OpKind.RECV_MERGE) == [q for q in range(p) if q != r]
    assert "groups" not in plan.params


def test_grouped_direct_exchanges_inside_groups_then_along_positions() -> None:
    groups = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    plan = build("direct", raw(12), REF, groups=groups, chunks=2)
    assert plan.params["groups"] == groups
    for r, prog in enumerate(plan.programs):
        g, i = divmod(r, 4)
        # chunk q of phase 1 at step q, of phase 2 at step 1 + q (raw payloads start at 0)
        phase1 = {op.peer for op in prog if op.kind is OpKind.SEND and op.step == op.chunk}
        phase2 = {op.peer for op in prog if op.kind is OpKind.SEND and op.step == op.chunk + 1}
        assert phase1 == {g * 4 + j for j in range(4)} - {r}
        assert phase2 == {h * 4 + i for h in range(3)} - {r}
    # unequal groups: position 2 of [4, 5, 6] takes group [7, 8]'s merge from its position 0
    uneven = build("direct", raw(9), REF, groups=[[0, 1, 2, 3], [4, 5, 6], [7, 8]])
    check(uneven)
    senders_to_6 = sorted(op.peer for op in uneven.programs[6] if op.kind is OpKind.RECV_MERGE and op.step == 1)
    assert senders_to_6 == [2, 7]


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_double_binary_is_multirail_over_nccls_two_trees_placed_by_order(p: int) -> None:
    w = attention(p)
    plan = build("double-binary", w, REF, chunks=2)
    a, b = double_binary_parents(p)
    same = build("multirail", w, REF, parents=[a, b], chunks=2)
    assert plan.algorithm == "double-binary" and plan.params == same.params and plan.programs == same.programs
    order = list(reversed(range(p)))  # position i is rank p-1-i
    turned = build("double-binary", w, REF, order=order)
    for tree, positions in zip(turned.params["parents"], (a, b), strict=True):
        assert tree == [-1 if positions[p - 1 - r] < 0 else p - 1 - positions[p - 1 - r] for r in range(p)]
    assert turned.params["order"] == order
    assert compact_args(turned) == {"chunks": 1, "result": "all", "order": order}


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_whole_rows_keeps_each_ranks_heads_of_the_all_plan(p: int) -> None:
    for name, spec in ALGORITHMS.items():
        for payload in (attention(p), raw(p)):
            if ("all" not in spec.results or payload.kind not in spec.payloads
                    or name in ("ring", "multirail", "double-binary")):
                continue
            full = build(name, payload, REF, **extra_params(name, p))
            plan = build(name, payload, REF, result="heads", whole_rows=True, **extra_params(name, p))
            assert validate(plan).valid, (name, payload.kind, validate(plan).first)
            assert plan.layout == "heads" and plan.chunks == p
            assert plan.params == {**full.params, "result": "heads", "whole_rows": True}
            # the same messages, each carrying every row
            assert [[(op.kind, op.step, op.peer, op.block) for op in prog] for prog in plan.programs] == \
                [[(op.kind, op.step, op.peer, op.block) for op in prog] for prog in full.programs]
            assert {op.chunk for prog in plan.programs for op in prog} == {None}
            assert compact_args(plan) is not None  # its builder makes it again from its params


def test_whole_rows_refusals() -> None:
    with pytest.raises(InputError, match="give result heads, not all"):
        build("binomial", attention(4), REF, whole_rows=True)
    with pytest.raises(InputError, match="whole_rows must be true or false, got 1"):
        build("binomial", attention(4), REF, result="heads", whole_rows=1)
    with pytest.raises(InfeasiblePlanError, match="it takes 1 chunk, not 2"):
        build("binomial", attention(4), REF, result="heads", whole_rows=True, chunks=2)
    with pytest.raises(InfeasiblePlanError, match="'dcp-a2a' builds no all plan"):
        build("dcp-a2a", attention(4), REF, result="heads", whole_rows=True)
    with pytest.raises(InfeasiblePlanError, match="ring cuts the rows into 4 even at chunks=1"):
        build("ring", attention(4), REF, result="heads", whole_rows=True)
    with pytest.raises(InfeasiblePlanError, match="16 query heads cannot go to 32 ranks"):
        build("binomial", attention(32), REF, result="heads", whole_rows=True)
    one = Workload(batch=1, q_heads=1, kv_heads=1, head_dim=8, split=(4, 4))
    with pytest.raises(InfeasiblePlanError, match="1 query head cannot go to 2 ranks"):
        build("binomial", one, REF, result="heads")


def test_direct_refuses_bad_groups() -> None:
    with pytest.raises(InfeasiblePlanError, match="partition"):
        build("direct", attention(4), REF, groups=[[0, 1], [1, 2, 3]])
    with pytest.raises(InputError, match="not both"):
        build("direct", attention(4), REF, groups=[[0, 1], [2, 3]], group_size=2)
    with pytest.raises(InputError, match="takes no root"):
        build("direct", attention(4), REF, root=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 3), st.booleans(), st.data())
def test_direct_over_any_partition_validates(p: int, chunks: int, is_raw: bool, data: st.DataObject) -> None:
    perm = data.draw(st.permutations(range(p)))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, p - 1)), max_size=p - 1)) if p > 1 else [])
    bounds = [0, *[c for c in cuts if c < p], p]
    groups = [perm[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    plan = build("direct", raw(p) if is_raw else attention(p), REF, chunks=chunks, groups=groups)
    assert validate(plan).valid, validate(plan).first


def test_too_many_heads_chunks_name_the_rows_the_ranks_hold() -> None:
    # 16 query heads at batch 4: 4 ranks hold 16 rows each; of 6 ranks some hold 8, the others 12.
    with pytest.raises(InfeasiblePlanError, match="binomial with 17 chunks cuts each rank's rows into 17 chunks, but "
                                                  "each rank holds 16 rows; use fewer chunks"):
        build("binomial", attention(4), REF, result="heads", chunks=17)
    with pytest.raises(InfeasiblePlanError, match="cuts each rank's rows into 9 chunks, but some ranks hold 8 rows"):
        build("binomial", attention(6), REF, result="heads", chunks=9)
