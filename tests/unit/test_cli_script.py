"""Scripts in benchmarks/ refuse bad input as the CLI does: one line on stderr, exit 2, no
traceback (``treeattn.cli.script``)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from treeattn.cli.script import ArgumentParser, count, count_list, run, size_list
from treeattn.errors import ExecutionError, InputError
from treeattn.probe.hardware import GPU_SPECS, gpu_spec
from treeattn.topology.library import resolve

ROOT = Path(__file__).resolve().parents[2]

# A bad value per script, refused before any work.
BAD = {
    "bench_api.py": ["--calls", "0"],
    "bench_calibrate.py": ["--sizes", "16KB,lots"],
    "bench_calibrate_half_split.py": ["--out", "/proc/none/table.txt"],
    "bench_compare.py": ["--out", "/proc/none"],
    "bench_merge_kernel.py": ["--k", "1,0"],
    "bench_plan.py": ["--ranks", "-1"],
    "bench_rank_fork.py": ["--ranks", "2,1"],
    "bench_rank_startup.py": ["--starts", "0"],
    "bench_run.py": ["--batches", "1,x"],
    "bench_run_memory.py": ["--out", "/proc/none/table.txt"],
    "bench_scale.py": ["--ranks", "8,9"],
    "bench_search.py": ["--part", "quality", "--seq-lens", "lots"],
    "bench_simulate.py": ["--nodes", "0"],
    "gpu_check.py": ["--out", "/tmp/x", "--repeats", "0"],
    "refit_host.py": ["/proc/none"],
    "topology_scale.py": ["nosuch:nodes=2"],
}


def test_every_script_has_a_bad_case() -> None:
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(BAD)


@pytest.mark.parametrize("script", sorted(BAD))
def test_a_script_refuses_bad_input_in_one_line(script: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *BAD[script]], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"{script}: error: ") and "Traceback" not in proc.stderr


def test_parser_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    ap = ArgumentParser(prog="x.py")
    ap.add_argument("--n", type=count)
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--n", "zero"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "x.py: error: argument --n: 'zero' is not a whole number (see --help)\n"


def test_counts_and_lists() -> None:
    assert count("3") == 3 and count("0", 0) == 0 and count_list("1, 16,128") == [1, 16, 128]
    assert size_list("16KB,1MiB") == [16_000, 1 << 20]
    for fn, text in ((count, "0"), (count, "1.5"), (count_list, "1,,2"), (count_list, "1,-2"), (size_list, "0"),
                     (size_list, "1MB,lots")):
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)


def test_run_renders_library_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py"])

    def bad() -> None:
        raise InputError("--ranks 3: no\n  such case")

    def failed() -> None:
        raise ExecutionError("rank 1 died")

    assert run(bad) == 2 and capsys.readouterr().err == "x.py: error: --ranks 3: no such case\n"
    assert run(failed) == 1 and capsys.readouterr().err == "x.py: error: rank 1 died\n"
    assert run(lambda: None) == 0 and run(lambda: 3) == 3


def test_bench_plan_checks_its_algorithms_before_printing() -> None:
    # A header on stdout followed by an error would read as the start of a result table.
    script = ROOT / "benchmarks" / "bench_plan.py"
    proc = subprocess.run([sys.executable, str(script), "--algorithms", "binomial,bogus"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("bench_plan.py: error: --algorithms: unknown algorithm 'bogus'")


def _gpu_check():  # noqa: ANN202 - the script's module
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "gpus", "topology"), [
    ("NVIDIA H200", 8, "hgx-h200"),
    ("NVIDIA H100 80GB HBM3", 2, "dgx-h100"),
    ("AMD Instinct MI300X", 4, "mi300x"),
    ("NVIDIA GeForce RTX 4090", 2, "rtx4090"),
])
def test_gpu_check_models_a_gpu_on_the_library_topology_of_its_spec(name: str, gpus: int, topology: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU is read by the probe's name lookup, so every GPU the library has a topology of
    # (MI300X, RTX 4090 too) is modelled on its own figures, not on an H100's.
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: gpus)
    topo = gpu_check.topology(None)
    gpu_models = {d.model for d in topo.devices if d.kind == "gpu"}
    assert topo.name.startswith(topology) and topo.num_ranks == gpus, topo.name
    assert gpu_models == {gpu_spec(name).model}


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA H100 PCIe", "NVIDIA L40S"])
def test_gpu_check_refuses_a_gpu_no_library_topology_models(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Modelled on another GPU's figures (GH200 on an H200's) the check's ratios would compare
    # against the wrong memory bandwidth, unsaid.
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InputError, match=f"no library topology models the GPU '{name}'.*give --topology"):
        gpu_check.topology(None)


def test_gpu_check_library_topologies_have_the_gpus_memory_bandwidth() -> None:
    # The modelled kernel times follow the GPU's memory bandwidth: a topology stands in for a
    # GPU only where its GPUs have about the GPU's.
    for model, topology in _gpu_check().LIBRARY_TOPOLOGY.items():
        bws = {d.mem_bw_gbps for d in resolve(topology).devices if d.kind == "gpu"}
        assert len(bws) == 1 and abs(bws.pop() / GPU_SPECS[model].mem_bw_gbps - 1) < 0.05, (model, topology)


def test_gpu_check_reads_every_flag_before_making_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "o"), "--topology",
                                      str(tmp_path / "none.yaml")])
    assert run(gpu_check.main) == 2
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "message"), [
    # a budget no token fits: the context cannot be cut to it, whatever the split
    (["--max-kv-gb", "1e-9"], "bench_run.py: error: --max-kv-gb 1e-09 is too small for the requested context: one "
     "token per rank at B = 1 needs 4096 bytes of K/V"),
    (["--batches", "1,64", "--max-kv-gb", "1e-5"], "--max-kv-gb 1e-05 is too small for the requested context: one "
     "token per rank at B = 64 needs 262144 bytes"),
    # where the rows go is checked before the minutes of runs, not after them
    (["--quick", "--out", "/proc/none/rows.csv"], "bench_run.py: error: --out '/proc/none/rows.csv': cannot create "
     "folder '/proc/none'"),
])
def test_bench_run_refuses_what_it_cannot_do_before_running(args: list[str], message: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_run.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(message) or message in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "holds no tokens" not in proc.stderr, proc.stderr
    assert proc.stdout == "" and not (tmp_path / "results").exists()
