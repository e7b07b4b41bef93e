"""``treeattn.exec.rendezvous``: one set-up deadline for joining the process group (the
processes that keep it, and those that do not, are in ``tests/distributed/test_exec_cli.py``)."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch
import torch.distributed as dist

from treeattn.errors import ExecutionError
from treeattn.exec.launch import free_port
from treeattn.exec.rendezvous import MIN_LEFT_S, agent_store, hosts_store, join, reach_store, wait_joined


class _Clock:
    """A clock that moves only when slept on (and ``step`` per look, to stand for work)."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step, self.slept = 100.0, step, []

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_a_store_nobody_serves_is_given_up_on_at_the_deadline_naming_the_address():
    clock, port = _Clock(), free_port()
    with pytest.raises(ExecutionError) as caught:
        reach_store("127.0.0.1", port, 3, clock.now + 10, 10, clock=clock, sleep=clock.sleep)
    assert str(caught.value).startswith(f"rank 3 could not reach the rendezvous at 127.0.0.1:{port} "
                                        "(MASTER_ADDR:MASTER_PORT) within the 10 s set-up deadline: connection refused")
    assert sum(clock.slept) == pytest.approx(10)  # it kept trying until then, and no longer
    assert max(clock.slept) <= 1.0


def test_a_name_that_does_not_resolve_or_answer_is_said(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(socket, "create_connection", _raises(socket.gaierror(-2, "Name or service not known")))
    with pytest.raises(ExecutionError, match=r"within the 0\.5 s set-up deadline: cannot resolve 'node-0' \(Name or "):
        reach_store("node-0", 29500, 1, clock.now + 0.5, 0.5, clock=clock, sleep=clock.sleep)
    monkeypatch.setattr(socket, "create_connection", _raises(TimeoutError("timed out")))
    with pytest.raises(ExecutionError, match=r"within the 2 s set-up deadline: no answer \(the rank that serves it"):
        reach_store("10.0.0.1", 29500, 1, clock.now + 2, 2, clock=clock, sleep=clock.sleep)


def _raises(exc: Exception):
    def connect(*args, **kwargs):
        raise exc
    return connect


def test_only_rank_0_serves_the_store_unless_torchruns_agent_does():
    assert hosts_store(0, {}) and not hosts_store(1, {})
    assert not hosts_store(0, {"TORCHELASTIC_USE_AGENT_STORE": "True"})


def test_the_group_gets_what_is_left_and_keeps_the_whole_deadline_after(monkeypatch):
    # 9.95 s of a 10 s deadline gone by the time the group is made: it is given the rest (at
    # least MIN_LEFT_S), then its collectives and its store wait the whole deadline again.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    given = {}
    made = dist.init_process_group

    def spy(*args, **kwargs):
        given["timeout"] = kwargs["timeout"]
        return made(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", spy)
    clock = _Clock(step=9.95 / 4)  # four looks after the start: by the group's, 9.95 s gone
    join("gloo", 0, 1, 10.0, clock=clock)
    try:
        assert given["timeout"] == datetime.timedelta(seconds=MIN_LEFT_S)
        group = dist.distributed_c10d._get_default_group()
        assert group._get_backend(torch.device("cpu")).options._timeout == datetime.timedelta(seconds=10)
        assert dist.distributed_c10d._get_default_store().timeout == datetime.timedelta(seconds=10)
    finally:
        dist.destroy_process_group()


def test_a_connection_that_lands_on_itself_is_not_the_store(monkeypatch):
    # TCP's simultaneous open: a connection to a free port of this host's ephemeral range may
    # get that port as its own, and "connect" to itself while nothing listens.
    class _Self:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def getsockname(self):
            return ("127.0.0.1", 40000)

        def getpeername(self):
            return ("127.0.0.1", 40000)

    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: _Self())
    clock = _Clock()
    with pytest.raises(ExecutionError, match="within the 2 s set-up deadline: connection refused"):
        reach_store("127.0.0.1", 40000, 1, clock.now + 2, 2, clock=clock, sleep=clock.sleep)


def _server(world: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", free_port(), world, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=5))


def test_ranks_that_never_joined_are_named_by_the_ranks_that_waited():
    # Before: torch's store on rank 0 said "2/3 clients joined", and no rank said which was missing.
    import threading

    store = _server(3)
    client = dist.TCPStore("127.0.0.1", store.port, 3, is_master=False, timeout=datetime.timedelta(seconds=5))
    got = []

    def rank1() -> None:  # waits longer than rank 0: it reads rank 0's verdict
        try:
            wait_joined(client, 1, 3, datetime.timedelta(seconds=20), 30, host=False)
        except ExecutionError as exc:
            got.append(str(exc))

    t = threading.Thread(target=rank1)
    t.start()
    with pytest.raises(ExecutionError) as caught:
        wait_joined(store, 0, 3, datetime.timedelta(seconds=0.5), 30, host=True)
    t.join(10)
    said = ("rank 2 of 3 did not connect within the 30 s set-up deadline (rank {} waited; a rank that never connected "
            "hung, died or was not started; treeattn run takes a longer deadline with --setup-timeout)")
    assert str(caught.value) == said.format(0)
    assert got == [said.format(1)]  # read before rank 0 ended (it waits for that), not "lost the store"


def test_a_rank_whose_deadline_comes_first_names_the_missing_ranks_itself():
    store = _server(4)
    client = dist.TCPStore("127.0.0.1", store.port, 4, is_master=False, timeout=datetime.timedelta(seconds=5))
    wait = datetime.timedelta(seconds=0.2)
    with pytest.raises(ExecutionError, match=r"^ranks 0-1, 3 of 4 did not connect .* \(rank 2 waited; "):
        wait_joined(client, 2, 4, wait, 30, host=False)
    for r in (0, 1, 3):
        client.set(f"treeattn/setup/joined/{r}", b"1")
    wait_joined(client, 2, 4, wait, 30, host=False)  # every rank there, rank 0 not yet done: the group's wait follows


def test_under_torchruns_agent_no_rank_serves_the_store():
    assert agent_store({"TORCHELASTIC_USE_AGENT_STORE": "True"}) and not agent_store({})
    assert not hosts_store(0, {"TORCHELASTIC_USE_AGENT_STORE": "True"}) and hosts_store(0, {})


def test_a_store_that_goes_away_while_the_ranks_meet_is_said():
    store = _server(3)
    client = dist.TCPStore("127.0.0.1", store.port, 3, is_master=False, timeout=datetime.timedelta(seconds=5))
    del store  # rank 0, which served it, died
    with pytest.raises(ExecutionError, match=r"^rank 2 lost the rendezvous store while the ranks connected \(.*\): "
                                             r"the rank that serves it, rank 0 or torchrun's agent, died or ended$"):
        wait_joined(client, 2, 3, datetime.timedelta(seconds=2), 5, host=False)


def test_a_rank_that_comes_after_rank_0_gave_up_says_so():
    # A review: it said itself "did not connect", though it waited in the store.
    store = _server(3)
    with pytest.raises(ExecutionError, match=r"^ranks 1-2 of 3 did not connect "):
        wait_joined(store, 0, 3, datetime.timedelta(seconds=0.2), 10, host=True)
    client = dist.TCPStore("127.0.0.1", store.port, 3, is_master=False, timeout=datetime.timedelta(seconds=5))
    with pytest.raises(ExecutionError) as caught:
        wait_joined(client, 2, 3, datetime.timedelta(seconds=2), 10, host=False)
    assert str(caught.value) == ("rank 2 reached the store after rank 0's set-up deadline had passed (10 s; rank 0 "
                                 "gave up on 1): start every rank within the deadline, or give a longer one with "
                                 "--setup-timeout")


def test_a_name_that_does_not_resolve_is_waited_for_and_said_early(monkeypatch):
    # A new host's DNS record may come after its peers start: waited for within the deadline;
    # a mistyped name is said after UNRESOLVED_WARN_S (once), not first at the deadline.
    from treeattn.exec.rendezvous import UNRESOLVED_WARN_S, wait_resolvable

    lookups, comes_at = [], [12]

    def getaddrinfo(host, *args, **kwargs):
        lookups.append(host)
        if len(lookups) < comes_at[0]:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    clock, said = _Clock(), []
    wait_resolvable("node-0", 1, clock.now + 60, 60, clock=clock, sleep=clock.sleep, warn=said.append)
    assert len(lookups) == 12 and UNRESOLVED_WARN_S <= sum(clock.slept) < 60  # it came: no error
    assert said == ["warning: rank 1: MASTER_ADDR=node-0 does not resolve (name or service not known); waiting for "
                    "it until the 60 s set-up deadline (a mistyped name? Ctrl-C stops)"]
    lookups.clear()
    comes_at[0] = 10**9  # never
    clock, said = _Clock(), []
    with pytest.raises(ExecutionError) as caught:
        wait_resolvable("node-0", 2, clock.now + 8, 8, clock=clock, sleep=clock.sleep, warn=said.append)
    assert str(caught.value) == ("rank 2 could not resolve MASTER_ADDR=node-0 within the 8 s set-up deadline: name "
                                 "or service not known (a mistyped host name, or one whose DNS record never came; "
                                 "treeattn run takes a longer deadline with --setup-timeout)")
    assert len(said) == 1 and sum(clock.slept) == pytest.approx(8)
