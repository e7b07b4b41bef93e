"""``Comm.open_pairs`` on NCCL: a pair's communicator is created by its two ranks alone, so it
must not be split from the default group's communicator (``ncclCommSplit`` is collective over
every rank of the default group). torch splits whenever the default group is bound to a device
(``init_process_group(device_id=...)``), so the binding is lifted while a pair is created, and
put back afterwards. torch's group creation and NCCL calls are replaced by recorders here."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from treeattn.exec import comm as comm_module
from treeattn.exec.comm import Comm


class _Default:
    """The default process group, as far as ``open_pairs`` reads it."""

    def __init__(self, bound: torch.device | None) -> None:
        self.bound_device_id = bound


class _Work:
    def wait(self, timeout=None) -> bool:  # noqa: ANN001 - a torch Work's signature
        return True


def test_pairs_are_created_with_the_default_groups_device_binding_lifted(monkeypatch):
    default = _Default(torch.device("cpu", 0))
    seen: list[tuple[list[int], object]] = []

    def new_group(ranks, **kw):  # noqa: ANN001, ANN003 - dist.new_group's signature
        seen.append((ranks, default.bound_device_id))
        return object()

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", lambda: default)
    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "P2POp", lambda *a, **kw: None)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [_Work()])
    monkeypatch.setattr(comm_module, "_PAIRS", {})
    comm = Comm(1, 3, "nccl", torch.device("cpu"), 1.0, 1.0)
    comm.open_pairs({(0, 1), (1, 2), (0, 2)})
    assert seen == [([0, 1], None), ([1, 2], None)]  # rank 1's pairs only, none split from the default group
    assert default.bound_device_id == torch.device("cpu", 0)  # and the binding is back


def test_an_unbound_default_group_is_left_alone(monkeypatch):
    default = _Default(None)
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", lambda: default)
    monkeypatch.setattr(dist, "new_group", lambda ranks, **kw: object())
    monkeypatch.setattr(dist, "P2POp", lambda *a, **kw: None)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [_Work()])
    monkeypatch.setattr(comm_module, "_PAIRS", {})
    Comm(0, 2, "nccl", torch.device("cpu"), 1.0, 1.0).open_pairs({(0, 1)})
    assert default.bound_device_id is None and set(comm_module._PAIRS) == {(0, 1)}


def test_pairs_made_under_an_earlier_default_group_are_not_reused(monkeypatch):
    # A process that destroys its default group and initialises again (a test fixture, a
    # restarted model) must not send on the old pairs' communicators.
    made: list[list[int]] = []
    worlds = [_Default(None), _Default(None)]
    now = [worlds[0]]
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", lambda: now[0])
    monkeypatch.setattr(dist, "new_group", lambda ranks, **kw: made.append(ranks) or object())
    monkeypatch.setattr(dist, "P2POp", lambda *a, **kw: None)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [_Work()])
    monkeypatch.setattr(comm_module, "_PAIRS", {})
    comm = Comm(0, 2, "nccl", torch.device("cpu"), 1.0, 1.0)
    comm.open_pairs({(0, 1)})
    comm.open_pairs({(0, 1)})  # made once per default group
    now[0] = worlds[1]
    comm.open_pairs({(0, 1)})
    assert made == [[0, 1], [0, 1]]


def test_pairs_take_the_watchdog_timeout_given_else_the_set_up_deadline(monkeypatch):
    timeouts: list[object] = []
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", lambda: _Default(None))
    monkeypatch.setattr(dist, "new_group", lambda ranks, **kw: timeouts.append(kw["timeout"]) or object())
    monkeypatch.setattr(dist, "P2POp", lambda *a, **kw: None)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [_Work()])
    for watchdog_s in (9.0, None):
        monkeypatch.setattr(comm_module, "_PAIRS", {})
        Comm(0, 2, "nccl", torch.device("cpu"), 1.0, 3.0, watchdog_s=watchdog_s).open_pairs({(0, 1)})
    assert timeouts == [datetime.timedelta(seconds=9), datetime.timedelta(seconds=3)]
