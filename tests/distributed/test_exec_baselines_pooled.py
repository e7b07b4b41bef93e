"""The baselines take their buffers from a pool of their own, as the plan's executor does, on
real gloo ranks (``baselines_worker``).

A buffer allocated per timed iteration pays fresh pages on CPU ranks that the plan, whose
buffers are pooled, does not pay, and under a CUDA graph a buffer must keep the address the
capture recorded. Each baseline gives the bits of its allocation-per-call form, takes the
same addresses on its second iteration, and owns its pool: a slot shared with another
baseline is written by that one's iterations while this one's captured graph still replays
into it (or freed under it, when the other grows it).
"""

from __future__ import annotations

import pytest

from tests.distributed.test_api import run

P = 3


@pytest.fixture(scope="module")
def pooled(tmp_path_factory) -> list[list[dict]]:  # noqa: ANN001
    return run("baselines_pooled", P, tmp_path_factory.mktemp("pooled"))


@pytest.fixture(scope="module")
def runner_pools(tmp_path_factory) -> list[dict]:  # noqa: ANN001
    return [items[0] for items in run("baselines_runner_pools", P, tmp_path_factory.mktemp("runner"))]


def test_every_baseline_gives_the_bits_of_its_allocating_form(pooled):
    labels = {item["label"].split()[0] for item in pooled[0]}
    assert labels == {"allreduce3", "allreduce2", "allgather-merge", "dcp-ag-rs", "dcp-a2a", "library"}
    for rank, items in enumerate(pooled):
        for item in items:
            assert item["dtype"] == [item["expected_dtype"]] * 2, (rank, item["label"])
            assert item["equal"] == [True, True], f"rank {rank}, {item['label']}: not the old bits"


def test_every_baseline_takes_the_same_pooled_buffers_each_iteration(pooled):
    for rank, items in enumerate(pooled):
        for item in items:
            label = item["label"]
            # all-reduce and reduce run in the caller's buffer, and a reduce-scatter of even shares
            # (24 elements on 3 ranks) too, into the caller's rows (cost.memory counts nothing)
            if label.startswith("library") and (not label.startswith("library heads") or " 96 B " in label):
                assert item["takes"] == 0, label
                continue
            assert item["takes"] > 0, f"rank {rank}, {label}: nothing came from the pool"
            assert item["same_addresses"], f"rank {rank}, {label}: other addresses on the second iteration"
            assert item["held"][0] == item["held"][1], f"rank {rank}, {label}: the second iteration took a new slot"


def test_each_baseline_of_a_run_has_a_pool_of_its_own(runner_pools):
    for rank, got in enumerate(runner_pools):
        methods, log = got["methods"], got["log"]
        # 4 for all, 4 for heads, the raw payload's reduce-scatter, and its all-reduce and all-gather + sum
        assert len(methods) == 11, methods
        # No two baselines were lent overlapping bytes, though each ran twice, in turn.
        spans: dict[str, set[tuple[int, int]]] = {}
        for method, _, _, start, end in log:
            spans.setdefault(method, set()).add((start, end))
        aliased = sorted({(a, b) for a in spans for b in spans if a < b
                          for s0, e0 in spans[a] for s1, e1 in spans[b] if s0 < e1 and s1 < e0})
        assert not aliased, f"rank {rank}: buffers of two baselines alias: {aliased}"
        pools: dict[int, set[str]] = {}
        for method, _, pool, _, _ in log:
            pools.setdefault(pool, set()).add(method)
        assert all(len(users) == 1 for users in pools.values()), f"rank {rank}: pools shared: {pools.values()}"
        in_place = {"rawall allreduce"}  # the library's all-reduce sums in the caller's buffer
        assert set(spans) == set(methods) - in_place, f"rank {rank}: pooled: {set(spans)}, methods: {methods}"
        for method in methods:  # and each one's second iteration was lent its first's buffers
            per_it = [[(s, e) for m, i, _, s, e in log if m == method and i == it] for it in (0, 1)]
            assert per_it[0] == per_it[1], f"rank {rank}, {method}: other buffers on the second iteration"


def test_a_raw_payloads_allgather_merge_gathers_every_rank(runner_pools):
    # Its prediction is the all-gather + sum plan's, so what runs must be that, not an all-reduce.
    for rank, got in enumerate(runner_pools):
        lent = [end - start for method, it, _, start, end in got["log"]
                if method == "rawall allgather-merge" and it == 0]
        assert lent == [P * 4 * 23], f"rank {rank}: the gathered stack: {lent}"
