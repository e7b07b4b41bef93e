"""One rule for every output path, checked before any work: missing folders are created, a
folder means a file inside it, images get .png, and the path printed is the file written."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import read_fifo, run_cli
from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.topology.library import resolve
from treeattn.workload import Workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"
W = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(4, 4), kv_dtype="fp32")
LOG = Path(__file__).parents[1] / "fixtures" / "nccl-tests" / "all_reduce_perf.8xh100-1node.txt"
SHAPE = ("-m", "llama-3.1-8b", "-n", "1K", "--no-progress")


@pytest.fixture()
def plan(tmp_path: Path) -> Path:
    return save_plan(build("star", W, resolve("cpu:ranks=2,cores=2")), tmp_path / "p.yaml")


# (command before the output flag, the flag, the work that must not start: module, attribute)
CASES = [
    (("plan", "-t", "cpu-4", *SHAPE), "--out", "treeattn.search", "search"),
    (("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "--seq-lens", "1K"), "--csv", "treeattn.search.compare",
     "compare"),
    (("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "--seq-lens", "1K"), "--png", "treeattn.search.compare",
     "compare"),
    (("simulate", "PLAN"), "--timeline", "treeattn.cost.simulate", "simulate"),
    (("topo", "show", "cpu-4"), "--png", "treeattn.cli.topo", "topology_summary"),
    (("calibrate", "-t", "cpu:ranks=2"), "--out", "treeattn.calibrate.live", "calibrate"),
    (("calibrate", "-t", "cpu:ranks=2"), "--png", "treeattn.calibrate.live", "calibrate"),
    (("calibrate", "-t", "dgx-h100", "--from-nccl-tests", str(LOG)), "--out", "treeattn.calibrate.from_nccl_tests",
     "calibrate_from_nccl_tests"),
    (("probe", "--ranks", "2"), "--out", "treeattn.cli.probe", "probe"),
    (("run", "PLAN"), "--out", "treeattn.exec.launch", "launch"),
    (("emulate", "run", "cpu:ranks=2", "PLAN"), "--out", "treeattn.emulate", "emulated"),
    (("validate", "cpu:ranks=2"), "--out", "treeattn.validate", "validate"),
]


@pytest.mark.parametrize("args, flag, module, name", CASES, ids=lambda x: x if isinstance(x, str) else " ".join(x[:2]))
def test_an_unwritable_output_is_refused_before_any_work(tmp_path: Path, plan: Path, monkeypatch: pytest.MonkeyPatch,
                                                         args: tuple[str, ...], flag: str, module: str,
                                                         name: str) -> None:
    import importlib

    def no_work(*a, **k):  # noqa: ANN002, ANN003
        raise AssertionError(f"{module}.{name} ran before the output was checked")

    monkeypatch.setattr(importlib.import_module(module), name, no_work)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = tuple(str(plan) if a == "PLAN" else a for a in args)
    res = run_cli(*args, flag, str(blocker / "sub" / "out.x"))
    assert res.exit_code == 2, res.stderr
    assert res.stderr.count("\n") == 1 and flag in res.stderr and "cannot create folder" in res.stderr
    assert f"{str(blocker)!r} is a file" in res.stderr, res.stderr  # which part of the path is in the way


def test_a_file_where_the_folder_would_be_is_named(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    res = run_cli("topo", "show", "cpu-4", "--png", str(tmp_path / "a-file" / "t.png"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.rstrip().endswith(f"cannot create folder {str(tmp_path / 'a-file')!r}: a file has that name")


def test_missing_folders_are_created(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "p.yaml"
    assert run_cli("plan", "-t", "cpu-4", *SHAPE, "-a", "star", "--out", str(out)).exit_code == 0
    assert out.is_file()


def test_a_command_refused_after_its_output_was_checked_takes_back_the_folders_it_made(tmp_path: Path,
                                                                                       plan: Path) -> None:
    # run checks --out (making its folders) before it resolves the topology it predicts on
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "new" / "deeper" / "rows.csv"
    res = run_cli("run", str(plan), "--out", str(out), "--topology", "no-such-topology")
    assert res.exit_code == 2 and "unknown topology 'no-such-topology'" in res.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["kept", "p.yaml"]
    # a folder that holds what a failed command wrote stays
    (tmp_path / "kept" / "new").mkdir()
    (tmp_path / "kept" / "new" / "other.csv").write_text("")
    assert run_cli("run", str(plan), "--out", str(out), "--topology", "no-such-topology").exit_code == 2
    assert not (tmp_path / "kept" / "new" / "deeper").exists() and (tmp_path / "kept" / "new" / "other.csv").exists()


@pytest.mark.parametrize("existing", [False, True])
def test_a_name_too_long_is_bad_input_and_leaves_no_folder_behind(tmp_path: Path, existing: bool) -> None:
    # the folder before the name is made (when missing) before the name is refused: it goes too
    if existing:
        (tmp_path / "new").mkdir()
    name = "x" * (os.pathconf(tmp_path, "PC_NAME_MAX") + 1)
    res = run_cli("topo", "show", "cpu-4", "--png", str(tmp_path / "new" / name / "t.png"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--png" in res.stderr and os.strerror(errno.ENAMETOOLONG) in res.stderr
    assert [p.name for p in tmp_path.iterdir()] == (["new"] if existing else [])


@pytest.mark.parametrize("args, flag", [
    (("simulate", "PLAN"), "--timeline"),
    (("topo", "show", "cpu-4"), "--png"),
    (("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "--seq-lens", "1K"), "--png"),
])
def test_images_are_written_where_printed(tmp_path: Path, plan: Path, args: tuple[str, ...], flag: str) -> None:
    args = tuple(str(plan) if a == "PLAN" else a for a in args)
    bare = tmp_path / "x" / "tl"  # no suffix: .png is added, and the printed path says so
    res = run_cli(*args, flag, str(bare))
    assert res.exit_code == 0, res.stderr
    written = bare.with_name("tl.png")
    assert written.is_file() and str(written) in res.stdout and not bare.exists()
    folder = tmp_path / "dir"
    folder.mkdir()
    res = run_cli(*args, flag, str(folder), "--json")
    assert res.exit_code == 0, res.stderr
    inside = list(folder.iterdir())
    assert len(inside) == 1 and inside[0].suffix == ".png" and str(inside[0]) in res.stdout
    assert not tmp_path.joinpath("dir.png").exists()
    json.loads(res.stdout)


@pytest.mark.parametrize("args, module, name", [(("run", "PLAN"), "treeattn.exec.launch", "launch"),
                                                (("emulate", "run", "cpu:ranks=2", "PLAN"), "treeattn.emulate",
                                                 "emulated")])
def test_a_run_never_appends_rows_under_another_header(tmp_path: Path, plan: Path, monkeypatch: pytest.MonkeyPatch,
                                                       args: tuple[str, ...], module: str, name: str) -> None:
    # A run appends to --out; rows of this treeattn's columns under an older header would be
    # read under the wrong names, so the run stops before it starts.
    import importlib

    from treeattn.exec.results import COLUMNS

    def no_work(*a, **k):  # noqa: ANN002, ANN003
        raise AssertionError(f"{module}.{name} ran before the output was checked")

    monkeypatch.setattr(importlib.import_module(module), name, no_work)
    old = tmp_path / "runs.csv"
    old.write_text(",".join(COLUMNS[:-1]) + "\n" + ",".join(["x"] * (len(COLUMNS) - 1)) + "\n")
    args = tuple(str(plan) if a == "PLAN" else a for a in args)
    res = run_cli(*args, "--out", str(old))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    # the file of an older treeattn (no timed_runs, here) says which columns it lacks
    assert f"--out: {str(old)!r} holds rows of other columns (an older treeattn's, say): no {COLUMNS[-1]}; give a " \
           "new file" in res.stderr, res.stderr
    timeline = tmp_path / "fresh.timeline.csv"  # its timeline beside it counts too
    timeline.write_text("a,b\n1,2\n")
    res = run_cli(*args, "--out", str(tmp_path / "fresh.csv"))
    assert res.exit_code == 2 and f"{str(timeline)!r} holds rows of other columns" in res.stderr, res.stderr
    # binary data (or a first line that is no header) is said so, not echoed back
    for data in (b"\xff\xfe\x00\x9c\x80,\x01\nrest", b"\n\nx,y\n"):
        (tmp_path / "odd.csv").write_bytes(data)
        res = run_cli(*args, "--out", str(tmp_path / "odd.csv"))
        assert res.exit_code == 2 and res.stderr.strip().endswith(
            f"{str(tmp_path / 'odd.csv')!r} is not a CSV file of rows (its first line is no header); give a new "
            "file"), res.stderr


@pytest.mark.parametrize("args, module, name", [(("run", "PLAN"), "treeattn.exec.launch", "launch"),
                                                (("emulate", "run", "cpu:ranks=2", "PLAN"), "treeattn.emulate",
                                                 "emulated"),
                                                (("plan", "-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "16K"),
                                                 "treeattn.search", "search")])
def test_an_output_that_cannot_be_written_stops_the_command_before_its_work(tmp_path: Path, plan: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    args: tuple[str, ...], module: str,
                                                                    name: str) -> None:
    # A read-only file system (or, for root, /sys) passes every permission check; a run's rows
    # were written only after the run, which then ended in a traceback and lost them, and a
    # plan was refused only after its search.
    import importlib

    def no_work(*a, **k):  # noqa: ANN002, ANN003
        raise AssertionError(f"{module}.{name} ran before the output was checked")

    monkeypatch.setattr(importlib.import_module(module), name, no_work)
    target = tmp_path / "ro" / ("plan.yaml" if args[0] == "plan" else "runs.csv")
    real_open = Path.open

    def read_only(self: Path, mode: str = "r", *a, **k):  # noqa: ANN002, ANN003, ANN202
        if self.parent == target.parent and mode != "r":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_open(self, mode, *a, **k)

    monkeypatch.setattr(Path, "open", read_only)
    args = tuple(str(plan) if a == "PLAN" else a for a in args)
    res = run_cli(*args, "--out", str(target))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"cannot write --out {str(target)!r}: {os.strerror(errno.EROFS)}" in res.stderr
    assert not target.parent.exists()  # nor the folder made for it


def test_an_empty_output_path_is_refused_and_a_trailing_slash_names_a_folder(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shape = ("-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "16K")
    # typer read "" as Path("."): the plan went into the current folder
    res = run_cli("plan", *shape, "-o", "")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "an empty path" in res.stderr, res.stderr
    assert not list(tmp_path.iterdir())
    # a missing folder given with its slash was a file of that name
    res = run_cli("plan", *shape, "-o", "new/plans/")
    assert res.exit_code == 0, res.stderr
    assert [p.name for p in (tmp_path / "new" / "plans").iterdir()] == ["dgx-h100.llama-3.1-8b.b1.n16K.yaml"]
    res = run_cli("topo", "show", "dgx-h100", "--png", "figs/")
    assert res.exit_code == 0 and (tmp_path / "figs" / "dgx-h100.png").is_file(), res.stderr


def test_an_output_through_a_dangling_link_keeps_the_link(tmp_path: Path) -> None:
    # The check opened the link (making its target) and then removed the name it opened: the
    # link was gone, an empty target left behind, and the plan written as a plain file.
    (tmp_path / "real").mkdir()
    link = tmp_path / "p.yaml"
    link.symlink_to(Path("real") / "target.yaml")
    res = run_cli("plan", "-t", "dgx-h100", *SHAPE, "-o", str(link))
    assert res.exit_code == 0, res.stderr
    assert link.is_symlink() and (tmp_path / "real" / "target.yaml").read_text().startswith("# treeattn plan")


def test_a_pipe_given_as_the_output_is_checked_without_opening_it(tmp_path: Path) -> None:
    # Opened and closed to see it is writable, a FIFO would tell its reader the output had
    # ended: the plan written after the search would then wait for a reader that has gone.
    from treeattn.cli.paths import output_file
    from treeattn.textfile import write_file

    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    reader, got = read_fifo(fifo)
    assert output_file(fifo, "--out", "plan.yaml") == fifo
    reader.join(0.5)
    assert reader.is_alive() and got == []
    write_file(fifo, "plan\n")
    reader.join(10)
    assert got == [b"plan\n"]


@pytest.mark.parametrize("out", ["-", "./-"])
def test_a_dash_is_standard_output(tmp_path: Path, out: str) -> None:
    # as most tools read it: it wrote a file named '-' in the working folder
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "treeattn", "plan", "-t", "cpu:ranks=2", *SHAPE, "-o", out, "--json"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# treeattn plan") and '"plan_path": "/dev/stdout"' in res.stderr
    assert not (tmp_path / "-").exists()
    res = subprocess.run([sys.executable, "-m", "treeattn", "plan", "-t", "cpu:ranks=2", *SHAPE, "-o",
                          str(tmp_path / "-")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and (tmp_path / "-").read_text().startswith("# treeattn plan"), res.stderr


def test_a_link_to_a_pipe_is_written_as_named(tmp_path: Path) -> None:
    # /dev/stdout on a pipe is a link to /proc/PID/fd/1, itself a link to 'pipe:[N]', which is no
    # path: written through to that name, `plan -o /dev/stdout | ...` said "No such file or directory".
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "treeattn", "plan", "-t", "cpu:ranks=2", *SHAPE, "-o", "/dev/stdout",
                          "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # stdout carries the plan alone (`| treeattn verify /dev/stdin`); the command's own output goes to stderr
    assert res.stdout.startswith("# treeattn plan") and '"plan_path": "/dev/stdout"' in res.stderr
    check = subprocess.run([sys.executable, "-m", "treeattn", "verify", "/dev/stdin"], input=res.stdout,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert check.returncode == 0 and check.stdout.startswith("/dev/stdin: valid "), check.stderr
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "out"
    link.symlink_to(f"/proc/{os.getpid()}/fd/999")  # resolves, as /dev/stdout does, to no path
    from treeattn.cli.paths import output_file
    from treeattn.textfile import write_file

    reader, got = read_fifo(fifo)
    fd = os.open(fifo, os.O_WRONLY)
    try:
        os.dup2(fd, 999)
        assert output_file(link, "--out", "plan.yaml") == link
        write_file(link, "plan\n")
    finally:
        os.close(999)
        os.close(fd)
    reader.join(10)
    assert got == [b"plan\n"]


def test_a_plan_written_into_a_pipe_names_its_topology_file_by_its_absolute_path(tmp_path: Path) -> None:
    # relative to the pipe's folder (/proc/PID/fd) the path led nowhere once the plan was saved
    # more than three folders deep: `plan -o /dev/stdout | tee a/b/c/p.yaml`, then simulate it
    import subprocess
    import sys

    shutil.copy(Path(__file__).parents[2] / "topologies" / "dgx-h100.yaml", tmp_path / "mine.yaml")
    res = subprocess.run([sys.executable, "-m", "treeattn", "plan", "-t", "mine.yaml", *SHAPE, "-o", "/dev/stdout"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f'source: "{tmp_path / "mine.yaml"}"' in res.stdout
    deep = tmp_path / "a" / "b" / "c" / "d" / "p.yaml"
    deep.parent.mkdir(parents=True)
    deep.write_text(res.stdout)
    sim = subprocess.run([sys.executable, "-m", "treeattn", "simulate", str(deep), "--json"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path / "a")
    assert sim.returncode == 0, sim.stderr
    # a plan written to a file keeps naming it relative to the plan's folder, to move with it
    res = subprocess.run([sys.executable, "-m", "treeattn", "plan", "-t", "mine.yaml", *SHAPE, "-o", str(deep)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and 'source: "../../../../mine.yaml"' in deep.read_text(), res.stderr


def test_a_device_given_for_an_image_is_written_as_named_with_no_suffix_added():
    from treeattn.cli.paths import output_file

    # /dev/null.png would be a plain file made in /dev (as root, beside the device)
    assert output_file(Path("/dev/null"), "--png", "t.png", suffix=".png") == Path("/dev/null")
    assert not Path("/dev/null.png").exists()


@pytest.mark.parametrize("args, flag", [
    (("simulate", "PLAN"), "--timeline"),
    (("topo", "show", "cpu-4"), "--png"),
    (("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "--seq-lens", "1K"), "--png"),
    (("check-model", "LOG", "-t", "cpu-4"), "--png"),
])
@pytest.mark.parametrize("name", ["x.txt", "x.SVG", "x.pdf"])
def test_an_image_named_as_another_kind_of_file_is_refused(tmp_path: Path, plan: Path, args: tuple[str, ...],
                                                           flag: str, name: str) -> None:
    # `topo show --png x.txt` wrote x.txt.png; every image option refuses it, before any work.
    args = tuple(str(plan) if a == "PLAN" else str(tmp_path / "log.txt") if a == "LOG" else a for a in args)
    res = run_cli(*args, flag, str(tmp_path / name))
    assert res.exit_code == 2, res.stderr
    suffix = name.rsplit(".", 1)[1]
    assert res.stderr == (f"error: {flag} {str(tmp_path / name)!r}: a .{suffix} name for a PNG image; end it in "
                          ".png (or leave the suffix out: .png is added)\n"), res.stderr
    assert [p.name for p in tmp_path.iterdir()] == [plan.name]  # nothing written


@pytest.mark.parametrize("args, flag, name, kind, ends", [
    (("run", "PLAN", "--timeout", "30"), "--out", "rows.png", "CSV", ".csv"),
    (("plan", "-t", "cpu-4", *SHAPE), "--out", "p.png", "plan", ".yaml or .json"),
    (("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "--seq-lens", "1K"), "--csv", "c.json", "CSV", ".csv"),
    (("calibrate", "--from-nccl-tests", "LOG", "-t", "dgx-h100"), "--out", "t.csv", "YAML", ".yaml"),
])
def test_a_text_output_named_as_another_kind_of_file_is_refused(tmp_path: Path, plan: Path, args: tuple[str, ...],
                                                                flag: str, name: str, kind: str, ends: str) -> None:
    # `run --out x.png` and `plan -o p.png` wrote a CSV and a plan into a .png, as named
    args = tuple(str(plan) if a == "PLAN" else str(LOG) if a == "LOG" else a for a in args)
    res = run_cli(*args, flag, str(tmp_path / name))
    assert res.exit_code == 2, res.stderr
    suffix = name.rsplit(".", 1)[1]
    want = f"error: {flag} {str(tmp_path / name)!r}: a .{suffix} name for a {kind} file; end it in {ends}\n"
    assert res.stderr == want, res.stderr
    assert [p.name for p in tmp_path.iterdir()] == [plan.name]  # nothing written


@pytest.mark.parametrize("name", ["p.yaml", "p.json", "p.txt", "p.out", "p"])
def test_a_plan_named_as_a_plan_or_plain_text_is_written(tmp_path: Path, name: str) -> None:
    res = run_cli("plan", "-t", "cpu-4", *SHAPE, "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / name).is_file()


# -- the ranks of one run check one --out at once (torchrun, SLURM) ------------------------------


def test_a_file_another_ranks_check_removes_is_no_error_and_not_left_behind(tmp_path, monkeypatch):
    from treeattn.cli.paths import appendable, output_file

    out = tmp_path / "rows.csv"
    out.touch()  # another rank's check made it and is about to remove it
    real_open, calls = os.open, []

    def racing_open(path, flags, *args):
        if flags & os.O_APPEND and not calls:
            calls.append(path)
            Path(path).unlink()  # ... which it does between our two opens
            raise FileNotFoundError(errno.ENOENT, "gone", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", racing_open)
    appendable(out, "--out")
    assert calls and not out.exists()  # made again here and removed, not left empty

    out.touch()
    real_access = os.access

    def racing_access(path, mode):
        if Path(path) == out:
            out.unlink(missing_ok=True)  # removed between the exists() and the access check
        return real_access(path, mode)

    monkeypatch.setattr(os, "access", racing_access)
    assert output_file(out, "--out", "rows.csv", kind="CSV") == out


def test_concurrent_rows_path_checks_neither_fail_nor_leave_files(tmp_path):
    # Two processes check one --out as two ranks of a run do; each check makes and removes the
    # CSV and its timeline beside it (the race was 1 run in 15 under torchrun).
    code = ("import sys; from pathlib import Path; from treeattn.cli.run import rows_path\n"
            "for _ in range(1500): rows_path(Path(sys.argv[1]), 'id')\n")
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "x.csv")], stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    errs = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert list(tmp_path.iterdir()) == []


def test_probe_calibrate_and_compare_keep_a_file_at_their_output_that_is_not_theirs(tmp_path):
    # Each replaced it without a word (a plan, notes, someone's CSV), as plan -o does not.
    notes, rows = tmp_path / "notes.yaml", tmp_path / "salaries.csv"
    notes.write_text("important notes\n")
    rows.write_text("name,salary\nalice,100\n")
    for args, kept, said in (
        (("probe", "-o", str(notes)), notes, "the file there is not a treeattn topology"),
        (("calibrate", "-t", "dgx-h100", "--from-nccl-tests", str(FIXTURES / "all_reduce_perf.1node.txt"),
          "-o", str(notes)), notes, "the file there is not a treeattn topology"),
        (("compare", "-t", "cpu:ranks=2", "-m", "llama-3.2-1b", "-n", "1K", "--csv", str(rows)), rows,
         "the file there is not a treeattn compare CSV"),
    ):
        before = kept.read_bytes()
        res = run_cli(*args)
        assert res.exit_code == 2 and said in res.stderr, (args, res.stderr)
        assert kept.read_bytes() == before
    plan = save_plan(build("star", W, resolve("cpu:ranks=2")), tmp_path / "plan.yaml")  # it has a name and a node
    before = plan.read_bytes()
    res = run_cli("probe", "-o", str(plan))
    assert res.exit_code == 2 and "the file there is not a treeattn topology" in res.stderr, res.stderr
    assert plan.read_bytes() == before
    topo = tmp_path / "topo.yaml"
    for _ in range(2):  # its own output is written over
        assert run_cli("probe", "-o", str(topo)).exit_code == 0
    family = tmp_path / "family.yaml"  # a topology in any form treeattn reads, here a family's, unnamed
    family.write_text("family: cpu\nparams: {ranks: 4}\n")
    assert run_cli("probe", "-o", str(family)).exit_code == 0
    script = tmp_path / "script.yaml"  # its lines read as keys, but it is no YAML mapping
    script.write_text('name: str = "run-7"\ndevices: list[int] = [0, 1]\nprint(name, devices)\n')
    res = run_cli("probe", "-o", str(script))
    assert res.exit_code == 2 and "not a treeattn topology" in res.stderr, res.stderr
    assert script.read_text().startswith("name: str")
    csv = tmp_path / "c.csv"
    for _ in range(2):
        res = run_cli("compare", "-t", "cpu:ranks=2", "-m", "llama-3.2-1b", "-n", "1K", "--csv", str(csv))
        assert res.exit_code == 0, res.stderr
