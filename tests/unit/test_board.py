"""The shared-memory board ranks of one host meet on (``treeattn.exec.board``): real
processes, a real file; no torch."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct
import time

import pytest

from treeattn.exec.board import HostBoard, RankExited, _gone, _stat


def _meet(path: str, rank: int, world: int, rounds: int, out) -> None:  # noqa: ANN001 - a Queue
    board = HostBoard(path, rank, world)
    # rank 1 asks to stop from round 30 on (its signal number): every rank sees it from then
    got = [board.meet(float(10 * k + rank), float(rank), 30.0, stop=15.0 if rank == 1 and k >= 30 else 0.0)
           for k in range(rounds)]
    board.close()
    out.put((rank, got))


def test_every_rank_gets_the_latest_clock_the_worst_delay_and_any_stop(tmp_path):
    world, rounds = 3, 40
    path = str(tmp_path / "board")
    HostBoard.create(path, world)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_meet, args=(path, r, world, rounds, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    want = [(float(10 * k + world - 1), float(world - 1), 15.0 if k >= 30 else 0.0) for k in range(rounds)]
    assert all(results[r] == want for r in range(world))


def test_a_rank_that_never_comes_makes_the_others_fail_at_the_deadline(tmp_path):
    path = str(tmp_path / "board")
    HostBoard.create(path, 2)
    board = HostBoard(path, 0, 2)
    with pytest.raises(TimeoutError, match=r"ranks \[1\]"):
        board.meet(1.0, 0.0, 0.2)
    board.close()


def test_a_half_written_slot_is_not_taken_for_a_posted_one(tmp_path):
    path = str(tmp_path / "board")
    HostBoard.create(path, 2)
    other = HostBoard(path, 1, 2)
    # Rank 1's slot of meeting 1 (bank 1) with the right iteration but a check that does not match.
    struct.pack_into("<qdddq", other._mm, (2 + 1) * 40, 1, 5.0, 0.0, 0.0, 12345)
    board = HostBoard(path, 0, 2)
    with pytest.raises(TimeoutError):
        board.meet(1.0, 0.0, 0.2)
    assert other.meet(5.0, 0.0, 5.0) == (5.0, 0.0, 0.0)  # rank 1 posts for real: both see it
    board.close()
    other.close()


def test_create_refuses_an_existing_file(tmp_path):
    path = str(tmp_path / "board")
    HostBoard.create(path, 2)
    with pytest.raises(FileExistsError):
        HostBoard.create(path, 2)


def _open_and_wait(path: str, rank: int, world: int, nap_s: float, ready, out) -> None:  # noqa: ANN001
    board = HostBoard(path, rank, world)
    ready.set()
    time.sleep(nap_s)  # a slow rank (or one killed here, before it meets)
    out.put(board.meet(7.0, 0.5, 30.0))
    board.close()


@pytest.mark.parametrize("reaped", [False, True], ids=["zombie", "reaped"])
def test_a_rank_killed_before_it_meets_fails_the_others_promptly_naming_it(tmp_path, reaped):
    """Where no launcher takes the group down (SLURM without --kill-on-bad-exit, ranks started
    by hand), a rank killed with -9 left the others waiting the whole set-up deadline (120 s)."""
    path = str(tmp_path / "board")
    HostBoard.create(path, 2)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    peer = ctx.Process(target=_open_and_wait, args=(path, 0, 2, 600.0, ready, out))
    peer.start()
    assert ready.wait(60)
    board = HostBoard(path, 1, 2)
    os.kill(peer.pid, signal.SIGKILL)
    if reaped:
        peer.join(10)
    # Not reaped: the peer is a zombie (our child), which os.kill(pid, 0) still finds.
    began = time.monotonic()
    with pytest.raises(RankExited, match=r"^rank 0 exited before the start of run 1"):
        board.meet(1.0, 0.0, 30.0)
    assert time.monotonic() - began < 5.0
    board.close()
    peer.join(10)


def test_a_slow_rank_that_still_runs_is_waited_for(tmp_path):
    path = str(tmp_path / "board")
    HostBoard.create(path, 2)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    peer = ctx.Process(target=_open_and_wait, args=(path, 0, 2, 1.5, ready, out))  # several looks
    peer.start()
    assert ready.wait(60)
    board = HostBoard(path, 1, 2)
    assert board.meet(1.0, 0.0, 30.0) == (7.0, 0.5, 0.0)
    assert out.get(timeout=30) == (7.0, 0.5, 0.0)
    peer.join(10)
    assert peer.exitcode == 0
    board.close()


def test_a_pid_taken_by_another_process_is_not_taken_for_the_rank():
    start = int(_stat(os.getpid())[19]) if os.path.isdir("/proc/self") else 0
    assert not _gone(os.getpid(), start)
    if start:
        assert _gone(os.getpid(), start + 1)  # same pid, another start time: the rank is gone
