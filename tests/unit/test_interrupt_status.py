"""A command ended by a signal exits with the shell's status for it (128 + the signal): SIGINT
130, SIGTERM 143, SIGHUP 129, as batch systems and ``timeout`` read it; one line, no traceback."""

from __future__ import annotations

import os
import signal

import pytest

from tests.cli_helpers import run_cli
from treeattn import interrupts
from treeattn.exec import launch as launch_mod
from treeattn.interrupts import WRAP_UP_SIGNAL, exit_status, interrupts_raise, shielded, wrap_up_on_signals
from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.topology.library import resolve
from treeattn.workload import Workload

SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]


@pytest.mark.parametrize(("sig", "status"), SIGNALS)
def test_exit_status_follows_the_signal(sig, status):
    with pytest.raises(KeyboardInterrupt) as caught, interrupts_raise():
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0.1)  # a handler runs at the next bytecode; this is only in case
    assert exit_status(caught.value) == status
    assert exit_status(KeyboardInterrupt()) == 130  # Ctrl-C's own


def _signalling(sig: int):
    """A stand-in for a command's work that sends this process ``sig`` (and lets it be handled)."""
    def work(*args, **kwargs):  # noqa: ANN002, ANN003, ARG001
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0.1)
    return work


@pytest.mark.parametrize(("sig", "status"), SIGNALS)
def test_a_signalled_validate_exits_with_the_signals_status(tmp_path, monkeypatch, sig, status):
    # Before: every signal gave 2, the status of bad input.
    import treeattn.validate

    monkeypatch.setattr(treeattn.validate, "validate", _signalling(sig))
    res = run_cli("validate", "emu-mesh", "--out", str(tmp_path / "o"), "--no-calibrate")
    assert res.exit_code == status, res.stderr
    # stopped before the first topology finished: nothing to name (the folder named was never written)
    assert res.stderr.strip().splitlines() == ["error: interrupted before the first topology finished: nothing was "
                                               "written"], res.stderr
    assert not (tmp_path / "o").exists()
    # an older run's rows in the folder are not this run's
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "rows.csv").write_text("topology\n")
    res = run_cli("validate", "emu-mesh", "--out", str(tmp_path / "o"), "--no-calibrate")
    assert res.stderr.strip().splitlines() == ["error: interrupted before the first topology finished: nothing was "
                                               "written"], res.stderr
    # a topology finished (its rows written, as run_validate does after each), then the signal

    def one_done(targets, out, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - validate's signature
        (out / "rows.csv").write_text("topology\nemu-mesh\n")
        _signalling(sig)()

    monkeypatch.setattr(treeattn.validate, "validate", one_done)
    res = run_cli("validate", "emu-mesh", "--out", str(tmp_path / "o"), "--no-calibrate")
    assert res.stderr.strip().splitlines() == [f"error: interrupted; the topologies finished so far are in "
                                               f"{tmp_path / 'o'}"], res.stderr


@pytest.mark.parametrize(("sig", "status"), SIGNALS[1:])
def test_a_signalled_run_exits_with_the_signals_status(tmp_path, monkeypatch, sig, status):
    # The launcher turns SIGTERM and SIGHUP into an interrupt (it stops its ranks and removes
    # its run directory); typer makes every interrupt a returned 130, which was the status.
    w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype="fp32")
    path = tmp_path / "plan.yaml"
    save_plan(build("binomial", w, resolve("cpu:ranks=2")), path)

    def launch(job, progress=None, setup_watchdog=False):  # noqa: ANN001, ANN202, ARG001 - launch's signature
        launch_mod.raise_interrupt(sig, None)

    monkeypatch.setattr(launch_mod, "launch", launch)
    res = run_cli("run", str(path), "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == status, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "aborted" and "Traceback" not in res.stderr
    # A later command in the same process does not inherit the signal.
    assert run_cli("run", str(tmp_path / "missing.yaml")).exit_code == 2


def _send(sig: int) -> None:
    os.kill(os.getpid(), sig)
    signal.sigtimedwait([], 0.1)  # the handler runs at the next bytecode; this is only in case


def test_a_wrap_up_request_is_noted_once_and_a_later_signal_stops_at_once(monkeypatch):
    # A terminal's Ctrl-C reaches a rank and its launcher, which passes it on: one request. A
    # stopping signal after SAME_REQUEST_S is a second Ctrl-C: it stops at once.
    monkeypatch.setattr(interrupts, "SAME_REQUEST_S", 0.3)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, WRAP_UP_SIGNAL)}
    with pytest.raises(KeyboardInterrupt) as caught, wrap_up_on_signals() as wrap:
        assert wrap.signum is None
        _send(signal.SIGINT)
        _send(WRAP_UP_SIGNAL)
        _send(signal.SIGTERM)  # within SAME_REQUEST_S: the same request
        assert wrap.signum == signal.SIGINT
        signal.sigtimedwait([], 0.4)
        _send(WRAP_UP_SIGNAL)  # the launcher's relay never stops at once
        assert wrap.signum == signal.SIGINT
        _send(signal.SIGTERM)
        pytest.fail("a second signal after SAME_REQUEST_S did not stop")
    assert exit_status(caught.value) == 143
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_a_wrap_up_stops_at_once_until_it_keeps_and_an_inner_one_is_the_outers():
    # A command's request stops its set-up at once (nothing to keep, and its wait may be in C++);
    # the runner's scope inside it makes it keep: one request a process.
    with wrap_up_on_signals(keeping=False) as outer:
        with pytest.raises(KeyboardInterrupt) as caught:
            _send(signal.SIGTERM)
        assert exit_status(caught.value) == 143 and outer.signum is None
        with wrap_up_on_signals() as inner:
            assert inner is outer and outer.keeping
        _send(signal.SIGTERM)
        assert outer.signum == signal.SIGTERM


def test_a_first_signal_during_a_cleanup_is_raised_once_the_cleanup_is_done():
    # Before: the shield ignored it, and the process went on as if nothing had been sent.
    done = []
    with pytest.raises(KeyboardInterrupt) as caught, interrupts_raise():
        with shielded():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1)
            done.append("cleanup")
        done.append("after")
    assert done == ["cleanup"] and exit_status(caught.value) == 143


def test_a_first_signal_held_through_a_body_that_raises_is_still_raised():
    # A fork that failed (Popen's OSError) with a signal held through it: the signal was dropped
    # with the error, and the command ended with the error's status, not the signal's.
    with pytest.raises(KeyboardInterrupt) as caught, interrupts_raise():
        with shielded():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1)
            raise OSError("the fork failed")
    assert exit_status(caught.value) == 143 and isinstance(caught.value.__context__, OSError)


def test_an_ip_step_is_held_through_its_fork_only():
    # run_step held the signal for the whole command (up to its 60 s timeout), not the fork.
    import threading
    import time

    from treeattn.emulate.commands import Step
    from treeattn.emulate.netns import run_step

    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interrupts_raise():
        run_step(Step(("sh", "-c", "sleep 5")))
    assert time.monotonic() - started < 2.0


def test_a_second_signal_during_the_cleanup_of_an_interrupt_is_dropped():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    done = []
    with pytest.raises(KeyboardInterrupt) as caught, interrupts_raise():
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            signal.sigtimedwait([], 0.1)
        finally:
            with shielded():
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0.1)
                done.append("cleanup")
    assert done == ["cleanup"] and exit_status(caught.value) == 129  # the first signal's, SIGHUP
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize(("sig", "status"), SIGNALS)
def test_every_command_says_it_was_stopped_by_a_signal(tmp_path, monkeypatch, sig, status):
    # Before: plan, compare, simulate... ended by SIGTERM or SIGHUP (torchrun's agent, srun,
    # timeout) died silently, with no cleanup; and a launcher's rank left its empty rows file.
    import treeattn.search

    monkeypatch.setattr(treeattn.search, "search", _signalling(sig))
    res = run_cli("plan", "-t", "cpu:ranks=2", "-m", "llama-3.2-1b", "-n", "1K", "-o", str(tmp_path / "p.json"))
    assert res.exit_code == status, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "aborted" and "Traceback" not in res.stderr
    assert not (tmp_path / "p.json").exists()


def test_a_sighup_that_nohup_ignores_stays_ignored():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupts_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            os.kill(os.getpid(), signal.SIGHUP)  # nohup's: the command goes on
            signal.sigtimedwait([], 0.1)
    finally:
        signal.signal(signal.SIGHUP, before)


_STUCK = """
import datetime, os, sys, time
import torch.distributed as dist
from treeattn.interrupts import before_hard_exit, ended_if_stuck, interrupts_raise
marker, where = sys.argv[1], sys.argv[2]
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
for attempt in range(2 if where == "again" else 1):  # again: a command after one that handled a signal
    with ended_if_stuck(), interrupts_raise(), before_hard_exit(lambda: open(marker, "w").write("cleaned")):
        print("waiting", flush=True)
        try:
            if where == "python" or (where == "again" and attempt == 0):
                while True:
                    time.sleep(0.01)
            elif where == "coalesced":  # C++ returns by itself, then one handler runs for two signals
                try:
                    store.wait(["never"], datetime.timedelta(seconds=0.8))
                except dist.DistStoreError:
                    pass
                while True:  # Python's loop runs the pending handler (a single sleep(30) would not)
                    time.sleep(0.01)
            else:
                store.wait(["never"], datetime.timedelta(seconds=60))  # in C++: no handler runs meanwhile
        except KeyboardInterrupt:
            time.sleep(3 if where != "again" else 0)  # longer than the grace: the handler ran, nothing cuts it short
            print("unwound", flush=True)
"""


@pytest.mark.parametrize("where", ["store", "python", "coalesced", "again"])
def test_a_signal_ends_a_main_thread_stuck_in_torch_within_seconds(tmp_path, where):
    # Before: a launched rank waiting in torch's store or gloo's set-up ran SIGTERM's handler
    # only when that call returned, at the set-up deadline (minutes), and torchrun's agent
    # killed it first, silently; the default action before handlers were set was immediate.
    # A review found two signals that ran one handler taken for a stuck one, and a command after
    # one that handled a signal never ended when stuck.
    import subprocess
    import sys
    import time

    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", _STUCK, str(marker), where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for attempt in range(2 if where == "again" else 1):
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(0.3)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if where == "coalesced":
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        if where == "again" and attempt == 0:
            assert proc.stdout.readline() == "unwound\n"
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t
    if where in ("python", "coalesced"):
        assert (proc.returncode, out, took > 2.9) == (0, "unwound\n", True), err
        assert not marker.exists()
        return
    assert (proc.returncode, out, err) == (143, "", "aborted\n") and took < 10, (took, err)
    assert marker.read_text() == "cleaned"


def test_ctrl_c_while_the_command_modules_load_is_one_line_and_130(tmp_path):
    # the signal handling comes with the command; before it, a Ctrl-C in the first few tenths of
    # a second printed a 35-line traceback. Here the SIGINT arrives as treeattn.cli.run is imported.
    import subprocess
    import sys

    script = ("import builtins, os, signal, sys\n"
              "real = builtins.__import__\n"
              "def hook(name, *a, **k):\n"
              "    if name == 'treeattn.cli.run':\n"
              "        os.kill(os.getpid(), signal.SIGINT)\n"
              "    return real(name, *a, **k)\n"
              "builtins.__import__ = hook\n"
              "sys.argv = ['treeattn', 'topo', 'list']\n"
              "from treeattn.entry import main\n"
              "main()\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 130 and res.stderr == "aborted\n" and res.stdout == "", res.stderr
