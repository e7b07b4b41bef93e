"""A wheel install (not a checkout) still finds the shipped topologies and the published corpus."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from treeattn.validate.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[2]


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def test_wheel_ships_the_topologies(tmp_path: Path):
    pytest.importorskip("setuptools")
    # Build from a copy of the tracked files: the checkout's own build folders stay untouched.
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    for name in files:
        if name.startswith(("treeattn/", "topologies/", "results/published/")) or name in (
                "pyproject.toml", "README.md", "LICENSE"):
            dest = src / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((ROOT / name).read_bytes())
    ours = importlib.metadata.distribution("treeattn").locate_file("")
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src), cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("treeattn-*.whl"))
    prefix = tmp_path / "prefix"
    # --ignore-installed: without it pip uninstalls the treeattn running these tests first.
    done = _pip("install", "--no-deps", "--no-index", "--ignore-installed", "--prefix", str(prefix), str(wheel),
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Uninstalling" not in done.stdout and importlib.metadata.distribution("treeattn").locate_file("") == ours
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    shipped = sorted(p.name for p in (ROOT / "topologies").glob("*.yaml"))
    probe = ("from treeattn.topology.library import shipped_files, topologies_dir, resolve; "
             "print(topologies_dir()); print(' '.join(sorted(p.name for p in shipped_files().values()))); "
             "print(resolve('emu-2x4').num_ranks); "
             "from treeattn.validate.corpus import corpus_dir, load_corpus; print(corpus_dir()); "
             "print(len(load_corpus()))")
    env = {k: v for k, v in os.environ.items() if k not in ("TREEATTN_TOPOLOGIES", "TREEATTN_PUBLISHED")}
    res = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(purelib)})
    assert res.returncode == 0, res.stderr[-2000:]
    where, names, ranks, corpus, tables = res.stdout.splitlines()
    assert Path(where) == prefix / "share" / "treeattn" / "topologies"
    assert names.split() == shipped and ranks == "8"
    assert Path(corpus) == prefix / "share" / "treeattn" / "published"
    assert int(tables) == len(load_corpus())
