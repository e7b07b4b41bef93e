"""``Merger``'s ``timeout_s`` is checked where it is given: a value no deadline can hold is a
``ValueError`` naming it, not an ``OverflowError`` from deep in the transport; ``check_order``
takes a bool and, on one rank, merges as without it (tests/distributed: on two)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import treeattn
from treeattn.exec.deadline import LONGEST_TIMEOUT_S
from treeattn.exec.launch import free_port


@pytest.fixture
def gloo_world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64)
    dist.destroy_process_group()


@pytest.mark.parametrize("timeout_s", [float("inf"), 1e300, datetime.timedelta.max.total_seconds(), 1e10])
def test_a_timeout_past_any_deadline_is_refused_by_name(gloo_world_of_one, timeout_s):
    with pytest.raises(ValueError, match=r"^Merger: timeout_s must be at most 1e\+09 seconds, got "):
        treeattn.Merger(gloo_world_of_one, timeout_s=timeout_s)


def test_the_longest_timeout_still_merges(gloo_world_of_one):
    merge = treeattn.Merger(gloo_world_of_one, timeout_s=LONGEST_TIMEOUT_S)
    o, lse = torch.randn(1, 32, 64), torch.randn(1, 32)
    out, out_lse = merge(o, lse)
    assert torch.equal(out, o) and torch.equal(out_lse, lse)


@pytest.mark.parametrize(("timeout_s", "watchdog_s"), [(7.0, 14.0), (LONGEST_TIMEOUT_S, LONGEST_TIMEOUT_S)])
def test_the_pair_communicators_watchdog_outlasts_the_mergers_own_deadline(gloo_world_of_one, timeout_s, watchdog_s):
    # NCCL's watchdog counts from enqueue and takes the process down: with the Merger's own
    # timeout it would end a rank before a later call's ExecutionError named the operation.
    merge = treeattn.Merger(gloo_world_of_one, timeout_s=timeout_s)
    assert merge._comm.watchdog == datetime.timedelta(seconds=watchdog_s)
    assert merge._comm.op_timeout == datetime.timedelta(seconds=timeout_s)


@pytest.mark.parametrize("check_order", ["yes", 1, None])
def test_check_order_takes_a_bool_only(gloo_world_of_one, check_order):
    with pytest.raises(TypeError, match=r"Merger: check_order must be True or False, got "):
        treeattn.Merger(gloo_world_of_one, check_order=check_order)


def test_one_rank_checking_its_order_merges_as_without(gloo_world_of_one):
    merge = treeattn.Merger(gloo_world_of_one, check_order=True)
    w = merge.plan.workload
    o, lse = torch.randn(w.batch, w.q_heads, w.head_dim), torch.randn(w.batch, w.q_heads)
    for _ in range(2):
        got_o, got_lse = merge(o, lse)
        assert torch.equal(got_o, o) and torch.equal(got_lse, lse)
