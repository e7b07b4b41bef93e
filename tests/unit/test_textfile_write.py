"""Output files are written whole or not at all: a write that fails (a full disk, a file size
limit) leaves the file there before byte for byte, and no temporary file beside it."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.cli_helpers import read_fifo
from treeattn import textfile
from treeattn.exec.results import write_csv

TREEATTN = str(Path(sys.executable).parent / "treeattn")
LIMIT = 4096  # bytes a process may write into one file (ulimit -f 4)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _failing_write(monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    """``os.write`` fails with ENOSPC once ``after`` bytes went out, as a full disk does."""
    real = os.write
    written = [0]

    def write(fd: int, data) -> int:  # noqa: ANN001 - bytes-like
        if written[0] + len(data) > after:
            n = real(fd, bytes(data)[: max(0, after - written[0])]) if after > written[0] else 0
            written[0] += n
            if n:
                return n
            raise OSError(28, "No space left on device")
        n = real(fd, data)
        written[0] += n
        return n

    monkeypatch.setattr(os, "write", write)


def test_write_file_replaces_whole_and_keeps_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    assert textfile.write_file(path, "é\n") == path and path.read_bytes() == "é\n".encode()
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask  # not mkstemp's 0600
    path.chmod(0o640)
    textfile.write_file(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]


def test_write_file_through_a_link_keeps_the_link(tmp_path: Path) -> None:
    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    textfile.write_file(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.yaml"
    path.write_bytes(b"old content\n" * 100)
    _failing_write(monkeypatch, after=100)
    with pytest.raises(OSError) as info:
        textfile.write_file(path, "x" * 10_000)
    assert info.value.filename == str(path)  # the file the user named, not the temporary one
    assert path.read_bytes() == b"old content\n" * 100
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


def test_a_failed_append_cuts_back_to_the_rows_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.csv"
    textfile.append_file(path, "1,2\n", header="a,b\n")
    textfile.append_file(path, "3,4\n", header="a,b\n")  # header only into an empty file
    assert path.read_text() == "a,b\n1,2\n3,4\n"
    _failing_write(monkeypatch, after=3)
    with pytest.raises(OSError):
        textfile.append_file(path, "5,6\n7,8\n")
    assert path.read_text() == "a,b\n1,2\n3,4\n"


def test_a_results_csv_append_over_the_size_limit_keeps_its_rows(tmp_path: Path) -> None:
    # In a child process: the limit is the process's, as ``ulimit -f`` sets it.
    path = tmp_path / "runs.csv"
    frame = pd.DataFrame({"a": range(3), "b": ["x"] * 3})
    write_csv(frame, path)
    before = path.read_bytes()
    code = ("import sys, pandas as pd; from pathlib import Path; from treeattn.exec.results import write_csv; "
            "write_csv(pd.DataFrame({'a': range(2000), 'b': ['y' * 10] * 2000}), Path(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_file_size)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert path.read_bytes() == before


@pytest.mark.parametrize("name", ["K.yaml", "K.json"])
def test_a_plan_that_cannot_be_written_leaves_the_old_plan(tmp_path: Path, name: str) -> None:
    """``ulimit -f 4; treeattn plan ... -o K.yaml`` over an existing plan of 11 KiB."""
    old = tmp_path / name
    old.write_bytes(b"format: treeattn-plan\n# a plan kept by the user\n" + b"x" * 11_000 + b"\n")
    before = old.read_bytes()
    proc = subprocess.run([TREEATTN, "plan", "-t", "dgx-h100-2node", "-m", "llama-3.1-8b", "-n", "256K",
                           "--no-progress", "-o", str(old)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, preexec_fn=_limit_file_size)
    assert proc.returncode == 2, proc.stderr
    assert "File too large" in proc.stderr and "Traceback" not in proc.stderr
    assert old.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_a_figure_that_cannot_be_written_leaves_the_old_image(tmp_path: Path) -> None:
    png = tmp_path / "t.png"
    png.write_bytes(b"\x89PNG old image")
    proc = subprocess.run([TREEATTN, "topo", "show", "dgx-h100-2node", "--png", str(png)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, preexec_fn=_limit_file_size)
    assert proc.returncode == 2, proc.stderr
    assert "File too large" in proc.stderr and "Traceback" not in proc.stderr
    assert png.read_bytes() == b"\x89PNG old image"
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]


def test_a_file_the_writer_may_not_write_is_refused_as_in_place(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kept.yaml"
    path.write_text("kept\n")
    path.chmod(0o444)
    # os.access as a user other than root sees it (root may write any file)
    monkeypatch.setattr(os, "access", lambda p, mode: os.stat(p).st_mode & 0o200 != 0 or not mode & os.W_OK)
    with pytest.raises(PermissionError):
        textfile.write_file(path, "new\n")
    assert path.read_text() == "kept\n"


def test_a_pipe_is_written_into_not_replaced(tmp_path: Path) -> None:
    # ``-o`` a FIFO that another program reads: a file renamed over it would leave the reader waiting.
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    reader, got = read_fifo(fifo)
    textfile.write_file(fifo, "plan\n")
    reader.join(10)
    assert got == [b"plan\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    reader, got = read_fifo(fifo)
    textfile.append_file(fifo, "1,2\n", header="a,b\n")
    reader.join(10)
    assert got == [b"a,b\n1,2\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.fifo"]


def test_rows_appended_to_the_null_device_are_dropped_without_error() -> None:
    # ``treeattn run --out /dev/null``: fsync refuses a device (EINVAL), and the run's rows must not fail on it.
    assert textfile.append_file(os.devnull, "1,2\n", header="a,b\n") == Path(os.devnull)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_is_written_into_not_replaced(tmp_path: Path) -> None:
    # As root, ``-o /dev/null`` renamed over would replace the system's null device with a plain file.
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    textfile.write_file(null, "plan\n")
    assert stat.S_ISCHR(null.stat().st_mode)


def _folder_refuses_new_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mkstemp`` fails as in a folder a user other than root may not add to (root may)."""
    def refused(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise PermissionError(13, os.strerror(13), str(kwargs.get("dir")))
    monkeypatch.setattr(textfile.tempfile, "mkstemp", refused)


def test_a_writable_file_in_a_folder_closed_to_new_files_is_written_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("old and longer\n")
    _folder_refuses_new_files(monkeypatch)
    textfile.write_file(path, "new\n")
    assert path.read_text() == "new\n"


def test_a_new_file_in_a_folder_closed_to_new_files_is_refused_by_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folder_refuses_new_files(monkeypatch)
    with pytest.raises(PermissionError) as err:
        textfile.write_file(tmp_path / "plan.yaml", "new\n")
    assert err.value.filename == str(tmp_path / "plan.yaml")
    assert list(tmp_path.iterdir()) == []
