"""What a run refuses before it starts anything: more NCCL ranks than GPUs, CUDA graphs without
NCCL, gloo ranks whose buffers this host's memory cannot hold, an NCCL rank whose GPU has too
little free memory."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.cli_helpers import run_cli
from treeattn.calibrate.live import CalibrateOptions
from treeattn.cost.memory import rank_peak_bytes, run_bytes
from treeattn.errors import InputError
from treeattn.exec.deadline import MAX_ITERATIONS
from treeattn.exec.footprint import job_bytes, memory_problem
from treeattn.exec.launch import host_memory_problem, launch_local
from treeattn.exec.reference import FP64_BLOCK_ELEMENTS
from treeattn.exec.runner import Job, PlanJob, RunOptions, gpu_of, placement_problem
from treeattn.plan.baselines import baselines_for
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.units import format_sizes
from treeattn.validate import ValidateOptions
from treeattn.workload import RawPayload, Workload


def test_more_ranks_than_gpus_is_named(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert placement_problem(8, 4).startswith("8 ranks, 4 GPUs on this node: NCCL needs one GPU per rank")
    assert placement_problem(2, 1).startswith("2 ranks, 1 GPU on this node")
    assert placement_problem(4, 4) is None and placement_problem(1, 8) is None
    # under a launcher: the local rank's GPU, or the one a rank sees (srun --gpus-per-task)
    assert gpu_of(3, 8, 8) == (3, None) and gpu_of(3, 4, 1) == (0, None)
    assert gpu_of(5, 8, 4)[1].startswith("8 ranks, 4 GPUs on this node")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun shows each rank every GPU
    assert gpu_of(1, 2, 1)[1].startswith("2 ranks, 1 GPU on this node")


@pytest.mark.parametrize("options", [{"repeats": 1_000_001}, {"warmup": 1_000_001}, {"repeats": 0}, {"warmup": -1}])
def test_iteration_counts_are_bounded(options):
    # A run builds its schedule (and the list of times) before the first run: a count without
    # bound would fill memory first.
    with pytest.raises(InputError, match="repeats must be 1 to 1000000 and warmup 0 to 1000000"):
        RunOptions(**options)
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(3, 3), kv_dtype="fp32")
    with pytest.raises(InputError, match="repeats of 'p' must be 1 to 1000000, got 1000001"):
        PlanJob("p", build("star", w, TopologyRef("a", "b")), repeats=1_000_001)


@pytest.mark.parametrize("options", [RunOptions, CalibrateOptions, ValidateOptions])
@pytest.mark.parametrize("counts", [{"repeats": MAX_ITERATIONS + 1}, {"warmup": MAX_ITERATIONS + 1},
                                    {"repeats": 0}, {"warmup": -1}])
def test_every_options_class_bounds_its_iteration_counts(options, counts):
    # run, calibrate and validate share one bound, checked when their options are built: a
    # count past it would otherwise be refused by the runner only after the ranks started.
    with pytest.raises(InputError, match="^repeats must be 1 to 1000000 and warmup 0 to 1000000, got ") as info:
        options(**counts)
    assert info.value.exit_code == 2


def test_graphs_need_nccl():
    with pytest.raises(InputError, match="CUDA graphs need the NCCL backend") as info:
        RunOptions(backend="gloo", graph=True)
    assert info.value.exit_code == 2
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(3, 3), kv_dtype="fp32")
    job = Job((PlanJob("p", build("star", w, TopologyRef("a", "b"))),), RunOptions(graph=True))
    with pytest.raises(InputError, match="CUDA graphs need the NCCL backend"):
        launch_local(job)  # refused before a process starts (this machine has no CUDA: gloo)


def test_a_run_past_this_hosts_memory_is_refused_before_a_rank_starts():
    # gloo ranks all run on this host: calibrate --max-size 64GiB on a 24 GiB machine measured
    # its smaller sizes, then failed allocating (or woke the OOM killer).
    raw = build("star", RawPayload(nbytes=64 << 20, ranks=2), TopologyRef("a", "b"))
    job = Job((PlanJob("star-64MiB", raw),), RunOptions())
    # each rank's input beside the plan's accumulator (a copy of it) and what it receives; the
    # check's: rank 0's two copies of its result and the fp64 sum it keeps, each rank's block of
    # the fp64 sum being made
    block = FP64_BLOCK_ELEMENTS * 8
    need = sum((64 << 20) + run_bytes(raw, r) + block for r in range(2)) + 2 * (64 << 20) + 2 * (64 << 20)
    assert need == job_bytes(job, [0, 1]) >= 8 * (64 << 20)
    # on a GPU the fp64 sum is kept in host memory
    assert job_bytes(job, [0], gpu=True) == job_bytes(job, [0]) - 2 * (64 << 20)
    assert host_memory_problem(job, need) == ""
    assert host_memory_problem(job, None) == ""
    assert host_memory_problem(job, need - 1) == (
        "star-64MiB: its 2 ranks hold at least {} at once on this host, which has {} available; use fewer "
        "ranks or a smaller payload".format(*format_sizes(need, need - 1)))
    assert format_sizes(need, need - 1) == ("672 MiB", "671.999999 MiB")  # not '384 MiB ... has 384 MiB'
    # One GPU (checked on each NCCL rank before the process group starts): that rank's buffers alone.
    one = job_bytes(job, [1])
    assert memory_problem(job, [1], one, "GPU 1 (H100)") is None
    assert memory_problem(job, [1], one - 1, "GPU 1 (H100)") == (
        "star-64MiB: rank 1 holds at least {} at once on GPU 1 (H100), which has {} available; free that memory "
        "or use a smaller payload".format(*format_sizes(one, one - 1)))
    res = run_cli("calibrate", "-t", "cpu:ranks=2", "--max-size", "1TiB", "--sizes", "3", "--compute", "none")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    # named by the flag that sized the case, not by the case's internal label
    assert res.stderr.startswith("error: the ping-pong case of 1 TiB (--max-size 1 TiB), with 10 other plans set up "
                                 "beside it: its 2 ranks hold at least "), res.stderr
    assert res.stderr.rstrip().endswith("available; use fewer ranks or a lower --max-size"), res.stderr


def test_a_run_with_baselines_holds_their_buffers_beside_the_plans():
    # A run sets up every method before timing one, and each keeps its buffers: ring attention
    # holds two foreign KV blocks, the all-reduces their sums; the inputs are made once.
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(3000, 1000), kv_dtype="fp32")
    plan = build("star", w, TopologyRef("a", "b"))
    # rank 1 checks no method (rank 0 does): beside its buffers, the reference's broadcast only
    alone = job_bytes(Job((PlanJob("p", plan),), RunOptions()), [1])
    assert alone == run_bytes(plan, 1) + w.rows * w.acc_row_bytes
    both = job_bytes(Job((PlanJob("p", plan),), RunOptions(baselines=True)), [1])
    ring = build("ring-attention", w, TopologyRef("a", "b"))
    inputs = w.kv_bytes(1) + w.batch * w.q_heads * w.head_dim * 4
    assert both - alone > run_bytes(ring, 1) - inputs >= w.kv_bytes(0)  # ring attention's alone holds a block
    # with --check all rank 1 checks every method too: a copy of its first and of its last result
    methods = 1 + len(baselines_for(w))
    every = job_bytes(Job((PlanJob("p", plan),), RunOptions(baselines=True, check="all")), [1], gpu=True)
    assert every - job_bytes(Job((PlanJob("p", plan),), RunOptions(baselines=True)), [1], gpu=True) == \
        2 * methods * w.rows * w.acc_row_bytes
    job = Job((PlanJob("p", plan),), RunOptions(baselines=True))
    problem = memory_problem(job, [0, 1], both, "this host")
    assert problem.startswith("p: its 2 ranks hold (the baselines' buffers beside the plan's) at least ")
    assert problem.endswith("use fewer ranks or a smaller payload, or run without --baselines")
    job = Job((PlanJob("p", plan),), RunOptions(check="all"))
    assert memory_problem(job, [1], 1, "this host").endswith(
        "free that memory or use a smaller payload, or check on one rank (--check root)")


def test_under_a_launcher_a_host_is_its_block_of_ranks():
    # torchrun and srun start the ranks themselves: each host checks its ranks (its block of
    # LOCAL_WORLD_SIZE or SLURM_NTASKS_PER_NODE; tests/distributed/test_exec_faults.py runs it)
    from treeattn.exec.launch import detect_env, host_ranks

    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999"}
    assert host_ranks(detect_env(env), env) == range(2, 4)
    assert host_ranks(detect_env(env), {**env, "LOCAL_WORLD_SIZE": "x"}) == range(2, 4)  # the ones up to it
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    assert host_ranks(detect_env(slurm), slurm) == range(4, 8)
    uneven = {**slurm, "SLURM_PROCID": "6", "SLURM_NODEID": "2", "SLURM_LOCALID": "0",
              "SLURM_STEP_TASKS_PER_NODE": "3(x2),2"}
    assert host_ranks(detect_env(uneven), uneven) == range(6, 8)
    assert host_ranks(detect_env(slurm), {**slurm, "SLURM_STEP_TASKS_PER_NODE": "4(x"}) == range(4, 6)


def test_a_run_holds_one_layer_of_its_kv_cache():
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(300, 100), kv_dtype="fp32", layers=32)
    plan = build("star", w, TopologyRef("a", "b"))
    for r in range(2):
        assert run_bytes(plan, r) == rank_peak_bytes(plan, r) - 31 * w.kv_bytes(r)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
@pytest.mark.parametrize(("flag", "needle"), [("--backend=nccl", "backend nccl needs CUDA devices"),
                                               ("--graph", "CUDA graphs need the NCCL backend")])
def test_run_refuses_a_backend_this_machine_cannot_run_in_one_line_before_anything_else(tmp_path, flag, needle):
    plan = tmp_path / "p.yaml"
    assert run_cli("plan", "-t", "cpu:ranks=2", "-m", "llama-3.2-1b", "-n", "4K", "-o", str(plan)).exit_code == 0
    res = run_cli("run", str(plan), flag, "--out", str(tmp_path / "rows.csv"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and needle in res.stderr, res.stderr
    assert not (tmp_path / "rows.csv").exists()


def test_python_m_treeattn_is_the_console_script(tmp_path):
    # What torchrun starts with -m (``torchrun --nproc-per-node N -m treeattn run PLAN``).
    missing = tmp_path / "none.yaml"
    res = subprocess.run([sys.executable, "-m", "treeattn", "run", str(missing)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"error: cannot read plan file '{missing}': no such file"


def test_a_rank_that_never_connects_is_not_blamed_on_the_rank_that_waited(tmp_path):
    # Rank 1 hung before it connected (kill -STOP): rank 0 waits for it in the store until the
    # deadline, and the launcher stops rank 1. The message names rank 1, and who waited.
    import json

    from treeattn.exec.launch import rank_failure

    message = ("rank 1 of 2 did not connect within the 121 s set-up deadline (rank 0 waited; a rank that never "
               "connected hung, died or was not started; treeattn run takes a longer deadline with --setup-timeout)")
    (tmp_path / "rank0.error.json").write_text(json.dumps({"rank": 0, "kind": "error", "message": message,
                                                            "exit_code": 1}))
    err = rank_failure(tmp_path, [1, -15], {1}, lambda r: "")
    assert str(err) == message + " (rank 1 was stopped)"


def test_a_ranks_multi_line_error_is_reported_in_one_line(tmp_path):
    import json

    from treeattn.exec.launch import rank_failure

    message = "RuntimeError: [enforce fail at ../gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes\n" \
              "Exception raised from ... (most recent call first):\nframe #0: c10::Error::Error(...)\n"
    (tmp_path / "rank1.error.json").write_text(json.dumps({"rank": 1, "kind": "error", "message": message,
                                                            "exit_code": 1}))
    err = rank_failure(tmp_path, [-9, 1], {0}, lambda r: "")
    assert str(err) == ("rank 1 failed: RuntimeError: [enforce fail at ../gloo/transport/tcp/pair.cc:446] "
                        "op.preamble.length <= op.nbytes (rank 0 was stopped)")


def test_run_help_names_the_set_up_deadline_the_runner_keeps():
    from treeattn.exec.runner import RunOptions

    text = " ".join(run_cli("run", "--help").stdout.replace("│", " ").split())
    option = text[text.index("--setup-timeout <float"):]
    option = option[:option.index("--graph")]
    assert f"[default: {RunOptions().setup_timeout_s}]" in option


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
def test_calibrate_refuses_a_gpu_topology_its_cpu_ranks_would_fit(tmp_path):
    # It measured loopback TCP and wrote it as the NVLink class of a "dgx-h100-calibrated".
    out = tmp_path / "c.yaml"
    res = run_cli("calibrate", "-t", "dgx-h100", "--out", str(out))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "places its ranks on GPUs, but they run here on CPU processes (gloo)" in res.stderr
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
@pytest.mark.parametrize("topology", [(), ("-t", "cpu:ranks=2")])
def test_calibrate_says_nccl_needs_cuda_before_any_topology_mismatch(topology):
    # On a machine without GPUs the missing CUDA is the problem to name, not a topology
    # mismatch (and never a topology called None).
    res = run_cli("calibrate", *topology, "--backend", "nccl")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "backend nccl needs CUDA devices" in res.stderr and "None" not in res.stderr


def test_a_launchers_wrong_world_is_refused_before_predictions_say_anything(tmp_path, monkeypatch):
    # torchrun with --nproc-per-node 3 for a plan of 2: one line, before the uncalibrated note
    # the predictions print (it came first, on the one rank that reports).
    plan = tmp_path / "p.yaml"
    assert run_cli("plan", "-t", "cpu:ranks=2", "-m", "llama-3.2-1b", "-n", "4K", "-o", str(plan)).exit_code == 0
    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "t"}.items():
        monkeypatch.setenv(key, value)
    res = run_cli("run", str(plan), "--out", str(tmp_path / "rows.csv"))
    assert res.exit_code == 2, res.stderr
    assert res.stderr == "error: torchrun started 3 processes but the plan has 2 ranks; launch exactly 2\n"
    assert not (tmp_path / "rows.csv").exists()


def test_a_rank_whose_wait_timed_out_is_named_before_the_peer_that_saw_it_exit(tmp_path):
    # `run --timeout 0.001`: rank 1's collective timed out and it exited; rank 0 then found it
    # gone. The error named rank 0's 'rank 1 exited before the start of run 3' (found by a
    # new-user trial), the cause only in rank 1's kept report.
    import json

    from treeattn.exec.board import RankExited
    from treeattn.exec.comm import CommError
    from treeattn.exec.launch import rank_failure
    from treeattn.exec.worker import failure_kind

    try:  # as Comm raises it: its CommError from the board's RankExited
        try:
            raise RankExited("rank 1 exited before the start of run 3 (process gone)")
        except RankExited as exc:
            raise CommError(f"rank 0: start release failed: {exc}") from exc
    except CommError as exc:
        gone = exc
    timed_out = CommError("rank 1: collective allgather merge partial (step 1) failed: Operation timed out!")
    assert (failure_kind(gone), failure_kind(timed_out), failure_kind(ValueError("bad shard"))) == (
        "lost", "comm", "error")
    assert failure_kind(CommError("rank 0: recv failed: Connection closed by peer")) == "lost"
    for r, exc in enumerate((gone, timed_out)):
        (tmp_path / f"rank{r}.error.json").write_text(json.dumps(
            {"rank": r, "kind": failure_kind(exc), "message": str(exc), "exit_code": 1}))
    err = rank_failure(tmp_path, [1, 1], set(), lambda r: "")
    assert str(err) == ("rank 1 failed: rank 1: collective allgather merge partial (step 1) failed: Operation "
                        "timed out! (rank 0 was stopped)"), str(err)


_WATCHED = """
import os, sys, time
from treeattn.exec import launch
from treeattn.interrupts import before_hard_exit
launch.SETUP_GRACE_S = 0.2
marker = sys.argv[1]
open(marker, "w").close()
with before_hard_exit(lambda: os.remove(marker)):
    with launch._RendezvousLog(3, 0.3):
        time.sleep(float(sys.argv[2]))
    time.sleep(1.0)
print("went on")
"""


@pytest.mark.parametrize("stuck", [True, False])
def test_a_launched_rank_stuck_connecting_past_the_deadline_ends_itself(tmp_path, stuck):
    # Gloo's connection of the ranks waited about 5x the set-up deadline for a peer that died
    # after the ranks met (310 s for 60), in C++: a watchdog ends the rank, with one line and
    # its cleanups (a run's empty rows file) done; a rank that got through is left alone.
    import time

    marker = tmp_path / "rows.csv"
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-c", _WATCHED, str(marker), "60" if stuck else "0"],
                         capture_output=True, text=True, timeout=120)
    if not stuck:
        assert (res.returncode, res.stdout, res.stderr) == (0, "went on\n", "") and marker.exists()
        return
    assert time.monotonic() - t < 30 and res.returncode == 1, res.stderr
    assert res.stderr == ("error: rank 3 was still setting up 0.2 s past its 0.3 s set-up deadline (a peer, or the "
                          "store's rank, died or hung meanwhile)\n")
    assert res.stdout == "" and not marker.exists()


def test_the_store_port_is_free_and_below_the_ephemeral_range(monkeypatch):
    import socket

    from treeattn.exec import launch as launching

    low = launching._ephemeral_low()
    ports = {launching.free_port() for _ in range(20)}
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing holds it
        assert launching._LOWEST_PORT <= port < low if low - launching._LOWEST_PORT >= 1000 else port > 0
    assert len(ports) > 1  # drawn, not one fixed port that two jobs would share
    # a port some process listens on at one address only is not free: the store binds them all
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        assert not launching._bindable(held.getsockname()[1])
    # a socket that cannot be made (out of descriptors) or a bind refused outright is no free port
    import errno

    real = socket.socket

    def no_descriptors(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(socket, "socket", no_descriptors)
    assert not launching._bindable(12345)
    monkeypatch.setattr(socket, "socket", real)
    # a host whose range leaves no room below it: the kernel's choice, as before
    monkeypatch.setattr(launching, "_ephemeral_low", lambda: launching._LOWEST_PORT + 10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", launching.free_port()))


def test_a_gpu_runs_peak_is_said_beside_the_count_for_the_fullest_rank():
    from treeattn.exec.footprint import gpu_peak_line

    raw = build("star", RawPayload(nbytes=64 << 20, ranks=2), TopologyRef("a", "b"))
    job = Job((PlanJob("star-64MiB", raw),), RunOptions())
    counted = format_sizes(job_bytes(job, [1], gpu=True), 1)[0]
    assert gpu_peak_line((300 << 20, 500 << 20), job) == (
        f"GPU memory: the fullest rank, 1, peaked at 500 MiB of tensors (torch's allocator; NCCL's buffers and the "
        f"CUDA context beside), where the memory check counted {counted}")


def test_in_blocked_order_a_reference_is_kept_beside_the_next_methods_copies():
    # The all-gather + sum baseline's gloo copy (its output, 128 MiB on 2 ranks) comes after the
    # plan's reference is made and kept (rank 0's fp64 sum, 128 MiB) in blocked order; in the
    # interleaved order every method has run before the first reference (its block, 16 MiB).
    raw = build("ring", RawPayload(nbytes=64 << 20, ranks=2), TopologyRef("a", "b"))
    one = [job_bytes(Job((PlanJob("ring", raw),), RunOptions(baselines=True, order=order)), [0])
           for order in ("interleaved", "blocked")]
    assert one[1] - one[0] == (128 + 128) - (128 + 16) << 20


def test_drawing_the_inputs_is_counted_where_it_is_the_fullest_moment():
    # make_raw draws int32 and converts: an fp8 buffer briefly needs 5 bytes an element, which on
    # a rank that neither checks nor sums much is more than the run holds after
    payload = RawPayload(nbytes=64 << 20, ranks=2, dtype="fp8")
    root = build("star", payload, TopologyRef("a", "b"), result="root")
    assert job_bytes(Job((PlanJob("star", root),), RunOptions()), [1]) == 5 * (64 << 20)


def test_nccl_ranks_hold_the_reference_and_the_results_hash_in_host_memory():
    # On NCCL the GPU check leaves out what lives in host memory: rank 0 (it checks) keeps the fp64
    # sum (128 MiB for 64 MiB of fp32) and compares a block at a time; every rank hashes a result
    # every rank holds from a host copy (64 MiB), before the reference is made.
    from treeattn.exec.footprint import host_bytes_beside_gpus

    raw = build("ring", RawPayload(nbytes=64 << 20, ranks=2), TopologyRef("a", "b"))
    job = Job((PlanJob("ring", raw),), RunOptions())
    block = FP64_BLOCK_ELEMENTS * 8
    assert host_bytes_beside_gpus(job, [0]) == (128 << 20) + block
    assert host_bytes_beside_gpus(job, [1]) == 64 << 20
    assert host_bytes_beside_gpus(job, [0, 1]) == (192 << 20) + block
    assert memory_problem(job, [0, 1], 1 << 20, "the host of ranks 0-1 (beside their GPUs)", beside_gpus=True) == (
        "ring: its 2 ranks hold at least {} at once on the host of ranks 0-1 (beside their GPUs), which has {} "
        "available; use fewer ranks or a smaller payload".format(*format_sizes((192 << 20) + block, 1 << 20)))


def test_the_explicit_kernels_working_set_is_counted_where_it_runs(monkeypatch):
    # fp8 KV runs the explicit matmuls on every device: their fp32 blocks (64 MiB at most) stay
    # with the allocator once freed (a 2-rank fp8 run's rank 0 held 64 MiB over the count)
    from treeattn.exec import footprint
    from treeattn.exec.attention import EXPLICIT_BLOCK_BYTES

    def count(kv_dtype: str, kernel: str = "auto") -> int:
        w = Workload(batch=2, q_heads=32, kv_heads=8, head_dim=128, split=(24576, 24576), kv_dtype=kv_dtype)
        return job_bytes(Job((PlanJob("p", build("star", w, TopologyRef("a", "b"))),), RunOptions(kernel=kernel)),
                         [0])

    bf16 = count("bf16")
    assert count("bf16", "explicit") - bf16 == EXPLICIT_BLOCK_BYTES
    fp8 = count("fp8")
    monkeypatch.setattr(footprint, "_explicit_bytes", lambda w, kernel: 0)
    assert fp8 - count("fp8") == EXPLICIT_BLOCK_BYTES
