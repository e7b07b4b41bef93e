"""Without --timeout, run and emulate run let an operation wait in proportion to the slowest
predicted method, so long contexts do not hit a fixed limit."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.exec.predict import TIMEOUT_FACTOR, Predictions, default_timeout_s
from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.topology.library import resolve
from treeattn.workload import Workload


def test_default_timeout_follows_the_slowest_prediction():
    slow = Predictions("t", {"plan": 2e6, "ring-attention": 9e6, "allreduce3": None})
    assert default_timeout_s(slow, 5.0) == pytest.approx(TIMEOUT_FACTOR * 9.0)
    assert default_timeout_s(Predictions("t", {"plan": 100.0}), 5.0) == 5.0
    assert default_timeout_s(None, 30.0) == 30.0


@pytest.fixture()
def long_context(tmp_path: Path) -> Path:
    """Ring attention's rotation at a long context on an emulated 10 Mbit/s cluster: minutes."""
    w = Workload(batch=1, q_heads=8, kv_heads=1, head_dim=32, split=(64 << 10,) * 8, kv_dtype="fp32")
    return save_plan(build("star", w, resolve("emu-2x4")), tmp_path / "long.yaml")


def _captured(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> list:
    import importlib

    seen: list = []

    def capture(*args, **kwargs):  # noqa: ANN002, ANN003, ARG001
        seen.append(next(a for a in args if hasattr(a, "options")).options)
        sys.exit(0)

    monkeypatch.setattr(importlib.import_module(module), name, capture)
    return seen


def test_run_derives_its_timeout(long_context: Path, monkeypatch: pytest.MonkeyPatch):
    seen = _captured(monkeypatch, "treeattn.exec.launch", "launch")
    assert run_cli("run", str(long_context), "--baselines").exit_code == 0
    assert seen[-1].timeout_s > 30.0  # the fixed 5 s would stop ring attention here
    assert run_cli("run", str(long_context), "--timeout", "7").exit_code == 0
    assert seen[-1].timeout_s == 7.0


def test_emulate_run_derives_its_timeout(long_context: Path, monkeypatch: pytest.MonkeyPatch):
    import treeattn.emulate as emulate

    monkeypatch.setattr(emulate, "emulated", lambda *a, **k: contextlib.nullcontext(None))
    seen = _captured(monkeypatch, "treeattn.emulate.jobs", "launch_in_cluster")
    assert run_cli("emulate", "run", "emu-2x4", str(long_context), "--baselines").exit_code == 0
    assert seen[-1].timeout_s > 60.0  # the fixed 30 s stopped ring attention's rotation


@pytest.mark.parametrize(("value", "said"), [("nan", "must be a number"), ("NaN", "must be a number"),
                                             ("-1", "must be at least 0.001"), ("inf", "must be at most 1e+09")])
def test_a_timeout_out_of_range_or_nan_is_said_as_such(tmp_path: Path, value: str, said: str):
    # NaN fails every comparison, so the range's check said "must be at most 1e+09" of it
    for flag in ("--timeout", "--setup-timeout"):
        res = run_cli("run", str(tmp_path / "p.yaml"), flag, value)
        assert res.exit_code == 2 and f"{flag} {said}, got '{value}'" in res.stderr, res.stderr
