"""``Merger``'s errors say what a decode loop should do: a smaller batch than the plan's is
answered with how to serve it, and ranks holding different plans are told every field that
may differ (not only B, Hq and Dv, which are often the same)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import treeattn
from treeattn.errors import PlanFormatError
from treeattn.exec.launch import free_port


@pytest.fixture
def gloo_world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_a_smaller_batch_is_refused_with_how_to_serve_it(gloo_world_of_one):
    # Continuous batching hands a Merger built for batch B fewer rows: the error says to pad
    # with empty rows (lse = -inf) or build a Merger per batch size, and padding does merge.
    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=4, seq_len=64)
    merge = treeattn.Merger(plan)
    o, lse = torch.randn(2, 32, 64), torch.randn(2, 32)
    with pytest.raises(ValueError, match=r"got \(2, 32, 64\); a Merger serves one batch size: pad the batch to B "
                                         r"with rows of lse = -inf"):
        merge(o, lse)
    with pytest.raises(ValueError, match=r"got \(4, 16, 64\)$"):  # not a batch mismatch: no hint
        merge(torch.randn(4, 16, 64), torch.randn(4, 16))
    pad_o = torch.cat([o, torch.full((2, 32, 64), float("nan"))])
    pad_l = torch.cat([lse, torch.full((2, 32), float("-inf"))])
    out, out_lse = merge(pad_o, pad_l)
    assert torch.equal(out[:2], o) and torch.equal(out_lse[:2], lse)
    assert not out[2:].any() and bool((out_lse[2:] == float("-inf")).all())


def test_ranks_with_different_plans_are_told_what_this_ranks_plan_is(gloo_world_of_one, monkeypatch):
    # Plans that differ only in their wire dtype: the error names it, not only B, Hq and Dv,
    # which are then the same on every rank.
    from treeattn.exec import comm

    monkeypatch.setattr(comm.Comm, "digests", lambda self, text, what: [1, 2])
    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64, partial_dtype="bf16")
    with pytest.raises(ValueError, match=r"rank 1 differs from rank 0; this rank's is '\w[\w-]*', B=1, Hq=32, "
                                         r"Dv=64, partial_dtype=bf16, result=all, chunks=1, check_order=False\)"):
        treeattn.Merger(plan)


def test_a_timeout_of_another_type_and_an_empty_plan_path_say_what_they_need(gloo_world_of_one):
    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64)
    with pytest.raises(ValueError, match=r"^Merger: timeout_s must be a number of seconds > 0, got '5'$"):
        treeattn.Merger(plan, timeout_s="5")
    with pytest.raises(PlanFormatError, match=r"^no plan: the path or text given is empty \(''\)$"):
        treeattn.Merger("")
    with pytest.raises(PlanFormatError, match=r"^no plan: the path or text given is empty"):
        treeattn.load_plan("  ")


@pytest.mark.parametrize("subgroup", [False, True])
def test_a_merger_of_a_destroyed_group_refuses_a_call_in_the_world_made_again(gloo_world_of_one, subgroup):
    # After destroy_process_group and init_process_group, the old Merger's group, None for the
    # world, named the new world: its calls ran there, and, where the processes' ranks had moved,
    # returned other ranks' rows without an error.
    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64)
    merge = treeattn.Merger(plan, dist.new_group([0]) if subgroup else None)
    o, lse = torch.randn(1, 32, 64), torch.randn(1, 32)
    assert torch.equal(merge(o, lse)[0], o)
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    with pytest.raises(ValueError, match=r"^Merger: called after torch.distributed.destroy_process_group\(\); a "
                                         r"Merger serves the process group it was built in: build a new one after "
                                         r"init_process_group$"):
        merge(o, lse)
    assert torch.equal(treeattn.Merger(plan)(o, lse)[0], o)


def test_a_merger_of_a_destroyed_subgroup_refuses_a_call(gloo_world_of_one):
    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64)
    sub = dist.new_group([0])
    merge = treeattn.Merger(plan, sub)
    dist.destroy_process_group(sub)
    with pytest.raises(ValueError, match=r"^Merger: called after torch.distributed.destroy_process_group\(\)"):
        merge(torch.randn(1, 32, 64), torch.randn(1, 32))


def test_a_merger_kept_to_the_end_lets_go_of_its_process_groups_as_the_interpreter_exits(gloo_world_of_one):
    # A model that keeps its Mergers to the end held the groups destroy_process_group had
    # destroyed; freed in the interpreter's teardown they aborted the process (SIGABRT, torchrun
    # failing the job: 5 runs in 12 of two ranks; 0 in 24 with this). At exit every live Merger
    # drops them, while torch is whole.
    import gc

    from treeattn.exec import merger as merger_module

    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64)
    sub = dist.new_group([0])
    merge = treeattn.Merger(plan, sub)
    merge(torch.randn(1, 32, 64), torch.randn(1, 32))
    assert merge in merger_module._LIVE
    merger_module._let_go_at_exit()
    gc.collect()
    held = [r for r in gc.get_referrers(sub) if isinstance(r, dict) and r.get("plan") is plan]
    assert not held and merge._comm is None and merge._group is None


def test_a_merger_takes_its_plan_file_as_any_path_object(gloo_world_of_one, tmp_path):
    # load_plan takes any os.PathLike; the Merger had refused all but pathlib's (new-user trial)
    import os

    class Where(os.PathLike):
        def __init__(self, path: str) -> None:
            self.path = path

        def __fspath__(self) -> str:
            return self.path

    plan = treeattn.search_plan("cpu:ranks=1", "llama-3.2-1b", batch=1, seq_len=64)
    treeattn.save_plan(plan, tmp_path / "p.yaml")
    merge = treeattn.Merger(Where(str(tmp_path / "p.yaml")))
    assert merge.plan == treeattn.load_plan(tmp_path / "p.yaml")


def test_a_world_kept_by_torch_distributed_nn_is_let_go_at_exit(tmp_path):
    # torch.distributed.nn, imported after init_process_group (transformers imports it with its
    # models), holds the world as its functions' default group past destroy_process_group: its
    # gloo threads lived on into the interpreter's teardown, where one rank of the HF example
    # ended in SIGABRT. The exit hook lets it go: no gloo thread is left after it.
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "world.py"
    script.write_text(f"""
import atexit, datetime, glob
def threads():
    names = sorted(open(f).read().strip() for f in glob.glob("/proc/self/task/*/comm"))
    print("gloo threads at exit:", [n for n in names if "gloo" in n])
atexit.register(threads)  # before treeattn's hook: runs after it
import torch.distributed as dist
import treeattn.exec.merger
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
import torch.distributed.nn
dist.barrier()
dist.destroy_process_group()
""")
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert res.returncode == 0, res.stderr
    assert "gloo threads at exit: []" in res.stdout, res.stdout + res.stderr
