"""Failures of a local run: a rank that raises, dies or hangs stops the whole run with an
error naming it, and no worker process outlives ``launch``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from treeattn.errors import ExecutionError, InputError
from treeattn.exec.interpreter import FAULT_ENV
from treeattn.exec.launch import detect_env, free_port, launch, slurm_threads
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.workload import Workload

REF = TopologyRef("cpu:test", "sha256:test")
W3 = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(5, 6, 7), kv_dtype="fp32")


def children() -> list[int]:
    """Pids of live processes whose parent is this test process."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def run_with_fault(monkeypatch, tmp_path: Path, fault: str, plan: Plan | None = None,
                   timeout_s: float = 30.0) -> str:
    """The error's message up to where it says the ranks' output is kept, after checking
    that folder holds every rank's log and nothing else of the run is left."""
    monkeypatch.setenv(FAULT_ENV, fault)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plan = plan or build("binomial", W3, REF, chunks=2)
    before = set(children())  # e.g. the resource tracker an earlier test's multiprocessing left
    with pytest.raises(ExecutionError) as info:
        launch(Job((PlanJob("p", plan),), RunOptions(repeats=3, warmup=1, timeout_s=timeout_s)))
    assert set(children()) <= before
    assert info.value.exit_code == 1
    text, kept = str(info.value).split("; every rank's output is kept in ")
    (folder,) = tmp_path.glob("treeattn-run-*")
    assert kept == str(folder)
    assert {p.name for p in folder.glob("rank*.log")} == {f"rank{r}.log" for r in range(plan.workload.ranks)}
    assert not list(folder.glob("*.pkl"))
    return text


def test_rank_that_raises_is_named(monkeypatch, tmp_path):
    # Rank 1's 3rd op (the first ops run in the checked, untimed iteration).
    text = run_with_fault(monkeypatch, tmp_path, "1:2:raise")
    assert text.startswith("rank 1 failed: injected fault on rank 1"), text
    assert text.endswith("(ranks 0, 2 were stopped)")


def test_rank_that_dies_is_named(monkeypatch, tmp_path):
    # Rank 2 dies in a timed iteration, while its peers wait on it.
    text = run_with_fault(monkeypatch, tmp_path, "2:9:exit")
    assert text.startswith("rank 2 died with exit code 17"), text


def test_hung_peer_times_out(monkeypatch, tmp_path):
    # Rank 0 waits for a message rank 1 never sends: rank 0's op deadline fires.
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(3, 3), kv_dtype="fp32")
    programs = ((Op(OpKind.COMPUTE, 0), Op(OpKind.RECV_MERGE, 1, peer=1)), (Op(OpKind.COMPUTE, 0),))
    plan = Plan("broken", {}, w, REF, 1, programs, (0,))
    text = run_with_fault(monkeypatch, tmp_path, "", plan, timeout_s=1.0)
    assert text.startswith("rank 0 failed: rank 0: recv_merge chunk None with rank 1 (step 1) failed: Timed out"), text
    assert text.endswith("(rank 1 was stopped)")


def test_a_host_short_of_memory_stops_every_rank_at_once_with_its_reason():
    # Under a launcher each host checks its own ranks; one that stopped alone would leave its
    # peers to the set-up deadline (60 s here), blaming a rank that "did not connect".
    import subprocess
    import sys

    from treeattn.exec.launch import free_port

    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.host_memory_worker", str(r), port],
                              cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    for out in outs:
        took, _, message = out.partition(" ")
        assert message.startswith("star-1MiB: rank 1 holds at least ") and "on the host of rank 1, which has 1 B" \
            in message, out
        assert float(took) < 20, out


def test_world_size_mismatch_under_a_launcher():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "TORCHELASTIC_RUN_ID": "t"}
    with pytest.raises(InputError, match="torchrun started 2 processes but the plan has 3 ranks") as info:
        launch(Job((PlanJob("p", build("star", W3, REF)),)), environ=env)
    assert info.value.exit_code == 2


def test_launcher_detection():
    assert detect_env({}) is None
    plain = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "5"}
    assert detect_env(plain).launcher == "the RANK/WORLD_SIZE launcher" and detect_env(plain).local_rank == 0
    assert detect_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "MASTER_ADDR": "localhost",
             "MASTER_PORT": "5"}
    placed = detect_env(slurm)
    assert (placed.launcher, placed.rank, placed.world, placed.local_rank) == ("slurm", 3, 4, 1)
    with pytest.raises(InputError, match="MASTER_ADDR, MASTER_PORT are not set"):
        detect_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


@pytest.mark.parametrize(("env", "usable", "threads"), [
    ({"SLURM_CPUS_PER_TASK": "6", "SLURM_STEP_TASKS_PER_NODE": "8"}, 64, 6),  # asked for
    # srun bound the task to CPUs of its own (auto binding reports mask_cpu)
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": "0xFFFF"}, 16, 16),
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPU_BIND_TYPE": "cores"}, 2, 2),
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "0,1"}, 1, 1),
    # fewer usable CPUs than the node has, but not bound (a cgroup or container limit): the
    # node's tasks share them
    ({"SLURM_STEP_TASKS_PER_NODE": "8"}, 16, 2),
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPU_BIND_TYPE": "none", "SLURM_CPU_BIND_LIST": ""}, 16, 2),
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPU_BIND_TYPE": ""}, 64, 8),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}, 64, 21),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "1"}, 64, 16),
    ({"SLURM_TASKS_PER_NODE": "3"}, 2, 1),  # never below one thread
    ({"SLURM_STEP_TASKS_PER_NODE": "odd"}, 64, 64),  # unreadable: counted as one task a node
    ({}, 64, 64),
])
def test_slurm_task_threads(env, usable, threads):
    assert slurm_threads(env, usable) == threads


def test_slurm_tasks_share_the_cores(tmp_path):
    # Two real tasks as srun starts them on one node, unbound: each takes half the usable CPUs
    # (torch's default is about all of them, which the two tasks would contend for). The
    # tasks are told the node has 64 CPUs more than they may use, as in a container or under a
    # job's cgroup, whatever this host has: that alone does not make them bound.
    code = ("import os, torch\nos.cpu_count = lambda: len(os.sched_getaffinity(0)) + 64\n"
            "from treeattn.exec.launch import launch\n"
            "from treeattn.exec.runner import Job, PlanJob, RunOptions\n"
            "from treeattn.plan.builders import build\nfrom treeattn.topology.library import resolve\n"
            "from treeattn.workload import Workload\n"
            "w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 7), kv_dtype='fp32')\n"
            "launch(Job((PlanJob('p', build('star', w, resolve('cpu:ranks=2'))),), RunOptions(repeats=1, warmup=0)))\n"
            "print(torch.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC", "OMP_")) and k not in ("RANK", "WORLD_SIZE")}
    env.update(SLURM_NTASKS="2", SLURM_STEP_TASKS_PER_NODE="2", SLURM_NODEID="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, text=True, cwd=tmp_path)
             for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    usable = len(os.sched_getaffinity(0))
    assert [o.split()[-1] for o in outs] == [str(max(1, usable // 2))] * 2, outs


@pytest.mark.parametrize(("nproc", "threads"), [(2, "1"), (1, "unset")])
def test_torchrun_sets_one_thread_only_with_several_processes_a_node(nproc, threads):
    # treeattn.exec.launch leaves the thread count to torchrun, whose rule its docstring states.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC", "OMP_"))}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(nproc), "--no-python", "sh", "-c", 'echo "threads=${OMP_NUM_THREADS:-unset}"'],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.findall(r"threads=(\S+)", res.stdout) == [threads] * nproc, res.stdout


@pytest.mark.parametrize(("changed", "message"), [
    ({"RANK": "2"}, "RANK=2 is not a rank of WORLD_SIZE=2: it must be 0 to 1"),
    ({"RANK": "-1"}, "RANK=-1 is not a rank of WORLD_SIZE=2"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 is negative"),
    ({"LOCAL_RANK": "x"}, "variable LOCAL_RANK='x': not an integer"),
    ({"MASTER_PORT": "abc"}, "variable MASTER_PORT='abc': not an integer"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a TCP port"),
    # A host no lookup can ever find as written (torch's traceback, or a wait to the deadline);
    # a name that does not resolve yet is waited for (test_exec_cli, test_exec_rendezvous).
    ({"MASTER_ADDR": "x" * 64}, f"MASTER_ADDR={'x' * 64} is no host name (label too long)"),
    ({"MASTER_ADDR": "[::1]"}, "MASTER_ADDR=[::1]: write the address without brackets (::1)"),
    ({"MASTER_ADDR": "node-0:29500"}, "MASTER_ADDR=node-0:29500 holds a port: give the host alone (node-0) and the "
                                      "port in MASTER_PORT"),
    ({"MASTER_ADDR": "node-0\n"}, "MASTER_ADDR='node-0\\n' holds a space or a control character"),
    ({"RANK": None, "WORLD_SIZE": None, "SLURM_PROCID": "4", "SLURM_NTASKS": "4"},
     "SLURM_PROCID=4 is not a rank of SLURM_NTASKS=4"),
    ({"RANK": None, "WORLD_SIZE": None, "SLURM_PROCID": "0", "SLURM_NTASKS": "two"}, "variable SLURM_NTASKS='two'"),
])
def test_launcher_variables_out_of_range_are_refused(changed, message):
    # Passed on, a rank out of range waits for peers until the set-up deadline (minutes) and a
    # bad port fails inside torch with a traceback: refused here, naming the variable.
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    env = {k: v for k, v in {**env, **changed}.items() if v is not None}
    with pytest.raises(InputError, match=re.escape(message)):
        detect_env(env)


def test_the_launchers_cleanup_is_not_cut_short_by_a_second_signal(monkeypatch, tmp_path):
    # `timeout` signals the launcher and then its process group, and a user presses Ctrl-C
    # twice: a signal landing while the launcher stops its ranks and removes its run directory
    # would leave that directory behind. The first signal (SIGHUP here, as the ranks end) starts
    # the cleanup; a second (SIGTERM, inside it) is held and dropped, and the first is raised.
    import shutil
    import signal

    import treeattn.exec.launch as launch_mod
    from treeattn.interrupts import exit_status

    removed = []
    rmtree, watch = shutil.rmtree, launch_mod._watch

    def rmtree_signalled(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - shutil.rmtree's signature
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.1)  # the handler runs at the next bytecode; this is only in case
        rmtree(path, *args, **kwargs)
        removed.append(path)

    def watch_signalled(*args, **kwargs):  # noqa: ANN002, ANN003
        killed = watch(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGHUP)
        signal.sigtimedwait([], 0.1)
        return killed

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shutil, "rmtree", rmtree_signalled)
    monkeypatch.setattr(launch_mod, "_watch", watch_signalled)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(KeyboardInterrupt) as caught:
        launch(Job((PlanJob("p", build("star", W3, REF)),), RunOptions(repeats=1, warmup=0)))
    assert exit_status(caught.value) == 129  # the first signal's
    assert len(removed) == 1 and not list(tmp_path.glob("treeattn-run-*"))
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_a_signal_while_a_finished_run_cleans_up_stops_the_caller_after_the_cleanup(monkeypatch, tmp_path):
    # A SIGTERM (`timeout`) that lands while launch stops its ranks and removes its run
    # directory after a run that ended: before, it was ignored there and lost, and a command
    # that launches one run after another went on. Now launch finishes its cleanup, then raises it.
    import shutil
    import signal

    from treeattn.interrupts import exit_status

    rmtree = shutil.rmtree

    def rmtree_signalled(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        os.kill(os.getpid(), signal.SIGTERM)
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shutil, "rmtree", rmtree_signalled)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    before = set(children())
    with pytest.raises(KeyboardInterrupt) as caught:
        launch(Job((PlanJob("p", build("binomial", W3, REF)),), RunOptions(repeats=1, warmup=0)))
    assert exit_status(caught.value) == 143
    assert not list(tmp_path.glob("treeattn-run-*")) and set(children()) <= before
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def _footprints(nbytes: int, *flags: str) -> list[tuple[int, int]]:
    """Per rank of a two-rank run of a raw ring (``footprint_worker``): (its peak resident set,
    what ``exec.footprint`` counted for it)."""
    import subprocess
    import sys

    from treeattn.exec.launch import free_port

    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.footprint_worker", str(r), port, str(nbytes),
                               *flags], cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=180)[0].strip().splitlines()[-1].split() for p in procs]
    return [(int(a), int(b)) for a, b in outs]


def test_what_a_run_holds_is_what_the_memory_check_counts():
    # Beside each method's buffers a run holds its checked results (two copies on a checking
    # rank), the reference (a raw payload's fp64 sum on rank 0, which checks) and gloo's own copy
    # inside an all-gather (the all-gather + sum baseline) or a reduce-scatter (the library's,
    # for heads, whose in-place output the count takes). Each rank's growth over a run of 1 KiB
    # (the process itself: torch, gloo, the compiled kernels) against the count's, on 48 MiB:
    # with the baselines rank 0 holds 712 MiB beside the process, rank 1 408 (the count before
    # these terms said 312 on each, and the digest of a result every rank holds copied it: 48
    # MiB more on each).
    mib = 1 << 20
    base = _footprints(1 << 10, "--baselines")
    for flags in ((), ("--baselines",), ("--baselines", "--heads")):
        for rank, ((peak, counted), (peak0, counted0)) in enumerate(zip(_footprints(48 * mib, *flags), base,
                                                                        strict=True)):
            grew, count = peak - peak0, counted - counted0
            # seen: within -1..+37 MiB (glibc's and gloo's threads' arenas, the check's fp64
            # block after the reference's); the count before these terms was 65-400 MiB short
            assert abs(grew - count) <= 0.05 * count + 32 * mib, (flags, rank, grew / mib, count / mib)
