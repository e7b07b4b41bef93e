"""Every option that reads a file, fed what users feed it by mistake: random bytes,
truncations, other encodings, folders, empty and missing files. The answer is always the
input accepted (exit 0) or exit status 2 with one line on stderr; never a traceback.

Work that would start after a valid input (launching ranks, emulating, calibrating) is
stubbed out: only the reading is under test here.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "fixtures" / "probe"
NCCL = ROOT / "tests" / "fixtures" / "nccl-tests"
WORKLOAD = "workload:\n  model: llama-3.1-8b\n  batch: 2\n  seq_len: 4K\n  kv_dtype: bf16  # é\n"
ROWS = ROOT / "results" / "validate-emu" / "rows.csv"
HGX = str(PROBE / "nvidia-smi-topo-m.hgx-h100-della.txt")


def _done(*args: object, **kwargs: object) -> None:
    sys.exit(0)


# option -> (valid file text, argv for a file path, what to stub as (module, attribute))
READERS: dict[str, tuple[str, Callable[[str], list[str]], list[tuple[str, str]]]] = {
    "topo validate TOPOLOGY": ((ROOT / "topologies" / "cpu-4.yaml").read_text(),
                               lambda p: ["topo", "validate", p], []),
    "plan --topology": ((ROOT / "topologies" / "emu-2x4.yaml").read_text(),
                        lambda p: ["plan", "-t", p, "-m", "llama-3.1-8b", "-n", "1K", "-a", "star", "-o", p + ".out"],
                        []),
    "plan --workload": (WORKLOAD, lambda p: ["plan", "-t", "cpu-4", "--workload", p, "-a", "star", "-o", p + ".out"],
                        []),
    "compare --workload": (WORKLOAD, lambda p: ["compare", "-t", "cpu-4", "--workload", p, "--seq-lens", "1K"],
                           [("treeattn.search.compare", "compare")]),
    "verify PLAN": ((ROOT / "plans" / "examples" / "cpu-4-chain.yaml").read_text(), lambda p: ["verify", p], []),
    "simulate PLAN": ((ROOT / "plans" / "examples" / "dgx-h100-2node-multirail.json").read_text(),
                      lambda p: ["simulate", p], []),
    "simulate --topology": ((ROOT / "topologies" / "cpu-4.yaml").read_text(),
                            lambda p: ["simulate", str(ROOT / "plans" / "examples" / "cpu-4-chain.yaml"), "-t", p],
                            []),
    "run PLAN": ((ROOT / "plans" / "examples" / "cpu-4-chain.yaml").read_text(), lambda p: ["run", p],
                 [("treeattn.exec.launch", "launch")]),
    "emulate run PLAN": ((ROOT / "plans" / "examples" / "cpu-4-chain.yaml").read_text(),
                         lambda p: ["emulate", "run", "cpu-4", p], [("treeattn.emulate", "emulated")]),
    "emulate up TOPOLOGY": ((ROOT / "topologies" / "emu-2x4.yaml").read_text(), lambda p: ["emulate", "up", p],
                            [("treeattn.emulate", "up")]),
    "validate --calibrated": ((ROOT / "topologies" / "emu-2x4.yaml").read_text(),
                              lambda p: ["validate", "emu-2x4", "--calibrated", p, "-o", p + ".out"],
                              [("treeattn.validate", "validate")]),
    "calibrate --from-nccl-tests": ((NCCL / "all_reduce_perf.8xh100-1node.txt").read_text(),
                                    lambda p: ["calibrate", "-t", "dgx-h100", "--from-nccl-tests", p], []),
    "probe --from-nvidia-smi": ((PROBE / "nvidia-smi-topo-m.dgx-a100.txt").read_text(),
                                lambda p: ["probe", "--from-nvidia-smi", p, "--gpu-model", "A100-SXM4-80GB"], []),
    "probe --nvlink-status": ((PROBE / "nvidia-smi-nvlink-status.h100-gpu0.txt").read_text(),
                              lambda p: ["probe", "--from-nvidia-smi", HGX, "--gpu-model", "H100-SXM5-80GB",
                                         "--nvlink-status", p], []),
    "probe --gpu-names": ("NVIDIA H100 80GB HBM3\n" * 8,
                          lambda p: ["probe", "--from-nvidia-smi", HGX, "--gpu-names", p], []),
    "probe --from-rocm-smi": ((PROBE / "rocm-smi-showtopo.8x-mi308x.txt").read_text(),
                              lambda p: ["probe", "--from-rocm-smi", p, "--gpu-model", "MI300X"], []),
    "probe --from-nccl-xml": ((PROBE / "nccl-topo.ibm-gx3d-8xh100.xml").read_text(),
                              lambda p: ["probe", "--from-nccl-xml", p, "--gpu-model", "H100-SXM5-80GB"], []),
    "probe --ibstat": ((PROBE / "ibstat.cx6-hdr200-partial.nccl-tests-128.txt").read_text(),
                       lambda p: ["probe", "--from-nvidia-smi", str(PROBE / "nvidia-smi-topo-m.dgx-a100.txt"),
                                  "--gpu-model", "A100-SXM4-80GB", "--ibstat", p], []),
    "report RESULTS (rows.csv)": (ROWS.read_text(), lambda p: ["report", str(Path(p).parent), "--no-plots"], []),
}


def _check(res, what: str) -> None:  # noqa: ANN001 - a CliResult
    assert "Traceback" not in res.stderr + res.stdout, (what, res.stderr[-2000:])
    assert res.exit_code in (0, 2), (what, res.exit_code, res.stderr[-2000:])
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (what, res.stderr[-2000:])


def _feed(tmp: Path, name: str, data: bytes | None, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    text, argv, stubs = READERS[name]
    for module, attr in stubs:
        monkeypatch.setattr(importlib.import_module(module), attr, _done)
    folder = tmp / "in"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    path = folder / ("rows.csv" if name.startswith("report") else "input.yaml")
    if data is None:
        path.mkdir()  # a folder where a file should be
    else:
        path.write_bytes(data)
    _check(run_cli(*argv(str(path))), f"{name}: {data[:80]!r}" if data is not None else f"{name}: a folder")


@pytest.mark.parametrize("name", sorted(READERS))
def test_fixed_mistakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    text = READERS[name][0]
    for data in (None, b"", b"\x00" * 16, b"\xff\xfe" + text.encode("utf-16-le"), text.encode("utf-16"),
                 text.replace("e", "\u00e9").encode("latin-1"), b"\xef\xbb\xbf" + text.encode(),
                 text.encode()[: len(text) // 2], "\n".join(text.splitlines()[:3]).encode()):
        _feed(tmp_path, name, data, monkeypatch)
    missing = run_cli(*READERS[name][1](str(tmp_path / "no-such-file.yaml")))
    _check(missing, f"{name}: a missing file")
    assert missing.exit_code == 2


@pytest.mark.parametrize("name", sorted(READERS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@example(data=None)
def test_random_bytes_and_cuts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, data) -> None:  # noqa: ANN001
    text = READERS[name][0].encode()
    if data is None:  # the valid file itself is accepted
        _feed(tmp_path, name, text, monkeypatch)
        return
    kind = data.draw(st.sampled_from(["bytes", "cut", "flip"]))
    if kind == "bytes":
        blob = data.draw(st.binary(max_size=400))
    elif kind == "cut":
        blob = text[: data.draw(st.integers(0, len(text)))]
    else:
        at = data.draw(st.integers(0, max(0, len(text) - 1)))
        blob = text[:at] + data.draw(st.binary(min_size=1, max_size=8)) + text[at + 1:]
    _feed(tmp_path, name, blob, monkeypatch)


def test_an_input_that_never_ends_is_refused_not_read_forever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device or pipe with no end (``/dev/zero``, ``<(yes)``) is one located error, not a hang
    that reads until memory runs out."""
    import os
    import threading

    from treeattn import textfile

    res = run_cli("topo", "validate", "/dev/zero")
    assert res.exit_code == 2 and "binary data (a NUL byte at offset 0)" in res.stderr
    monkeypatch.setattr(textfile, "MAX_TEXT_BYTES", 4 << 20)
    fifo = tmp_path / "yes"
    os.mkfifo(fifo)
    stop = threading.Event()

    def feed() -> None:  # 'yes' until the reader leaves
        try:
            with fifo.open("wb") as f:
                while not stop.is_set():
                    f.write(b"y\n" * 65536)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    res = run_cli("topo", "validate", str(fifo))
    stop.set()
    assert res.exit_code == 2 and "more than" in res.stderr and str(fifo) in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_running_out_of_memory_is_one_line_not_a_traceback(monkeypatch, tmp_path):
    # A 250 MB explicit plan read under `ulimit -v` ran out of memory in the YAML reader and
    # ended in a MemoryError traceback.
    import treeattn.plan.io as plan_io

    def exhausted(*_args, **_kwargs):  # noqa: ANN202 - stands for a reader that runs out of memory
        raise MemoryError

    monkeypatch.setattr(plan_io, "load_plan", exhausted)
    plan = tmp_path / "p.yaml"
    plan.write_text("format: treeattn-plan\n")
    res = run_cli("verify", str(plan))
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: out of memory: this command needed more than the process may use")
