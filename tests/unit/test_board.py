"""The shared-memory board ranks of one host meet on (``treeattn.exec.board``): real
processes, a real file; no torch."""

from __future__ import annotations

import multiprocessing as mp
import struct

import pytest

from treeattn.exec.board import HostBoard


def _meet(path: str, rank: int, world: int, rounds: int, out) -> None:  # noqa: ANN001 - a Queue
    board = HostBoard(path, rank, world)
    got = [board.meet(float(10 * k + rank), float(rank), 30.0) for k in range(rounds)]
    board.close()
    out.put((rank, got))


def test_every_rank_gets_the_latest_clock_and_the_worst_delay(tmp_path):
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
    want = [(float(10 * k + world - 1), float(world - 1)) for k in range(rounds)]
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
    struct.pack_into("<qddq", other._mm, (2 + 1) * 32, 1, 5.0, 0.0, 12345)
    board = HostBoard(path, 0, 2)
    with pytest.raises(TimeoutError):
        board.meet(1.0, 0.0, 0.2)
    assert other.meet(5.0, 0.0, 5.0) == (5.0, 0.0)  # rank 1 posts for real: both see it
    board.close()
    other.close()


def test_create_refuses_an_existing_file(tmp_path):
    path = str(tmp_path / "board")
    HostBoard.create(path, 2)
    with pytest.raises(FileExistsError):
        HostBoard.create(path, 2)
