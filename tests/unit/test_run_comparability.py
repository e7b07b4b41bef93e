"""Before running, ``treeattn run`` says when predicted and measured cannot be compared
(a GPU plan on CPU ranks) and when the prediction is on figures not fitted to this machine."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn import cli
from treeattn.exec import launch as launch_mod
from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.topology.io import dump_topology
from treeattn.topology.library import resolve
from treeattn.topology.model import CALIBRATED_BY
from treeattn.workload import Workload


@pytest.fixture()
def said_before_launch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What stderr held when the ranks would have started."""
    seen: list[str] = []

    def launch(job, progress=None, setup_watchdog=False):  # noqa: ANN001, ARG001
        seen.append(cli.err_console.file.getvalue())
        sys.exit(0)

    monkeypatch.setattr(launch_mod, "launch", launch)
    return seen


def _plan(tmp_path: Path, spec: str, ranks: int) -> Path:
    w = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(16,) * ranks, kv_dtype="fp32")
    return save_plan(build("star", w, resolve(spec)), tmp_path / "p.yaml")


def test_a_gpu_plan_on_cpu_ranks_is_called_not_comparable(tmp_path: Path, said_before_launch: list[str]) -> None:
    res = run_cli("run", str(_plan(tmp_path, "dgx-h100", 8)), "--backend", "gloo")
    assert res.exit_code == 0
    assert "a GPU machine" in said_before_launch[0] and "not comparable" in said_before_launch[0]


def test_an_uncalibrated_prediction_is_marked_with_what_to_run(tmp_path: Path, said_before_launch: list[str]) -> None:
    assert run_cli("run", str(_plan(tmp_path, "cpu:ranks=2", 2))).exit_code == 0
    assert "uncalibrated" in said_before_launch[0]
    assert "treeattn calibrate --topology cpu:ranks=2,cores=" in said_before_launch[0]


def test_the_command_it_suggests_survives_a_paste_into_a_shell(tmp_path: Path,
                                                               said_before_launch: list[str]) -> None:
    # A rank selection's name holds a space: unquoted, the shell splits it into two arguments.
    plan = _plan(tmp_path, "emu-2x4", 8)
    assert run_cli("run", str(plan), "-t", "emu-2x4[ranks 0-7]").exit_code == 0
    said = " ".join(said_before_launch[0].split())
    assert "treeattn calibrate --topology 'emu-2x4[ranks 0-7]' --compute attention" in said, said


def test_a_calibrated_topology_gets_no_note(tmp_path: Path, said_before_launch: list[str]) -> None:
    topo = resolve("cpu:ranks=2,cores=2")
    fitted = dataclasses.replace(topo, name="mine", sources=(f"{CALIBRATED_BY}: gloo ping-pong on 2 ranks",))
    (tmp_path / "mine.yaml").write_text(dump_topology(fitted))
    plan = _plan(tmp_path, str(tmp_path / "mine.yaml"), 2)
    assert run_cli("run", str(plan), "-t", str(tmp_path / "mine.yaml")).exit_code == 0
    assert "uncalibrated" not in said_before_launch[0] and "comparable" not in said_before_launch[0]


def test_the_cpu_family_names_the_cores_it_was_built_for() -> None:
    here = resolve("cpu:ranks=4")
    assert here.name == f"cpu:ranks=4,cores={here.cost.host.host_cores}" and here.cost.host.host_cores >= 1
    assert resolve(here.name).fingerprint == here.fingerprint
    two = resolve("cpu:ranks=4,cores=2")
    assert two.cost.host.host_cores == 2 and two.cost.host.cpu_us > 0 and two.cost.attn_gbps is not None
    assert not two.calibrated and two.fingerprint == resolve("cpu-4").fingerprint


def test_an_mla_plan_on_cpu_ranks_is_warned_about():
    from treeattn.exec.predict import latent_on_cpu_note
    from treeattn.plan.builders import build
    from treeattn.workload import Workload

    cpu, gpu = resolve("cpu-4"), resolve("dgx-h100:nodes=1")
    mla = Workload.create(ranks=4, seq_len=64, model="deepseek-v3")
    note = latent_on_cpu_note(build("star", mla, cpu), cpu)
    # 2 x 128 x (576 + 512) FLOPs a token over its 576 bf16 values: 242 a byte.
    assert note is not None and note.startswith("an MLA workload's attention does 242 FLOPs a byte of its cache")
    gqa = Workload.create(ranks=4, seq_len=64, model="llama-3.1-8b")
    assert latent_on_cpu_note(build("star", gqa, cpu), cpu) is None
    mla8 = Workload.create(ranks=8, seq_len=64, model="deepseek-v3")
    assert latent_on_cpu_note(build("star", mla8, gpu), gpu) is None  # GPUs: FlashMLA's own bound, documented
    assert latent_on_cpu_note(build("star", mla, cpu), None) is None  # nothing predicted
