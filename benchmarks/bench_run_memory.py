"""What `treeattn run`'s ranks hold against what its memory check counts (``exec.footprint``).

    .venv/bin/python benchmarks/bench_run_memory.py [--out FILE] [--json]

Each case plans on two ranks of the shipped ``cpu-4`` topology and runs the plan on two gloo
ranks (``treeattn run --repeats 2 --warmup 1``); while it runs, every rank's peak resident set
(``VmHWM`` of its worker process, read from /proc every 20 ms) is kept. A rank's growth is its
peak less that rank's peak in a run of a tiny payload of the same kind (1 KiB, or 1K tokens:
the process itself, torch, gloo and the compiled kernels), and is printed beside the count
(``job_bytes``) less the tiny run's count. Linux only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from treeattn.cli.paths import output_file
from treeattn.cli.run import load_checked
from treeattn.cli.script import ArgumentParser, run
from treeattn.exec.footprint import job_bytes
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.exec.worker import PIDS_FILE
from treeattn.textfile import write_file

TREEATTN = [sys.executable, "-m", "treeattn"]
MIB = 1 << 20
ATTENTION = ["-m", "llama-3.1-8b", "-b", "2"]
MQA = ["--heads", "128", "--kv-heads", "1", "--head-dim", "128"]
FP8 = "@fp8"
"""Stands for a raw fp8 workload file (``_case`` writes it)."""
CASES = [  # (name, plan arguments, the tiny payload's, run flags)
    ("raw 128 MiB ring", ["--bytes", "128MiB", "--algorithm", "ring"], ["--bytes", "1KiB", "--algorithm", "ring"], []),
    ("raw 128 MiB ring, baselines", ["--bytes", "128MiB", "--algorithm", "ring"],
     ["--bytes", "1KiB", "--algorithm", "ring"], ["--baselines"]),
    ("raw 128 MiB ring heads, baselines", ["--bytes", "128MiB", "--algorithm", "ring", "--result", "heads"],
     ["--bytes", "1KiB", "--algorithm", "ring", "--result", "heads"], ["--baselines"]),
    ("raw 128 MiB star root, check all", ["--bytes", "128MiB", "--algorithm", "star", "--result", "root"],
     ["--bytes", "1KiB", "--algorithm", "star", "--result", "root"], ["--check", "all"]),
    ("raw 128 MiB ring, baselines, blocked", ["--bytes", "128MiB", "--algorithm", "ring"],
     ["--bytes", "1KiB", "--algorithm", "ring"], ["--baselines", "--check", "all", "--order", "blocked"]),
    ("raw fp8 128 MiB star root", ["--workload", FP8, "--bytes", "128MiB", "--algorithm", "star", "--result", "root"],
     ["--workload", FP8, "--bytes", "1KiB", "--algorithm", "star", "--result", "root"], []),
    ("raw fp8 128 MiB ring, baselines", ["--workload", FP8, "--bytes", "128MiB", "--algorithm", "ring"],
     ["--workload", FP8, "--bytes", "1KiB", "--algorithm", "ring"], ["--baselines"]),
    ("llama-3.1-8b B=2 24K (exact reference)", [*ATTENTION, "-n", "24K"], [*ATTENTION, "-n", "1K"], []),
    ("llama-3.1-8b B=2 24K, baselines", [*ATTENTION, "-n", "24K"], [*ATTENTION, "-n", "1K"], ["--baselines"]),
    ("llama-3.1-8b B=2 64K (sampled rows)", [*ATTENTION, "-n", "64K"], [*ATTENTION, "-n", "1K"], []),
    ("llama-3.1-8b B=2 64K, baselines", [*ATTENTION, "-n", "64K"], [*ATTENTION, "-n", "1K"], ["--baselines"]),
    ("MQA 128 heads, 1 KV head, 256K root (exact)", [*MQA, "-n", "256K", "--result", "root"],
     [*MQA, "-n", "1K", "--result", "root"], []),
    ("llama-3.1-8b fp8 KV B=2 48K root", [*ATTENTION, "--kv-dtype", "fp8", "-n", "48K", "--result", "root"],
     [*ATTENTION, "--kv-dtype", "fp8", "-n", "1K", "--result", "root"], []),
]


def _rank_of(pid: int, runs: Path) -> int | None:
    """The rank a worker process runs: its place in the run directory's ``pids`` (ranks forked
    from one interpreter), else its environment's RANK (ranks started one by one)."""
    for pids in runs.glob(f"*/{PIDS_FILE}"):
        listed = [int(p) for p in pids.read_text().split()]
        if pid in listed:
            return listed.index(pid)
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(item[5:]) for item in env if item.startswith(b"RANK=")), None)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _peaks(cmd: list[str], runs: Path) -> dict[int, int]:
    """Run ``cmd`` with its temporary files in ``runs``; each rank's peak resident set (bytes)."""
    runs.mkdir(exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(runs)})
    peaks: dict[int, int] = {}
    ranks: dict[int, int] = {}
    while proc.poll() is None:
        for pid in _descendants(proc.pid):
            if pid not in ranks:
                rank = _rank_of(pid, runs)
                if rank is None:
                    continue
                ranks[pid] = rank
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            hwm = [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")]
            if hwm:  # none once it has exited (a zombie)
                peaks[ranks[pid]] = max(peaks.get(ranks[pid], 0), hwm[0])
        time.sleep(0.02)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.read().strip()}")
    return peaks


def _case(tmp: Path, plan_args: list[str], flags: list[str]) -> tuple[dict[int, int], list[int]]:
    """One run's peaks per rank and the count per rank."""
    path, fp8 = tmp / "plan.yaml", tmp / "fp8.yaml"
    fp8.write_text("kind: raw\nop: sum\ndtype: fp8\n")
    plan_args = [str(fp8) if a == FP8 else a for a in plan_args]
    subprocess.run([*TREEATTN, "plan", "-t", "cpu-4", "--ranks", "0,1", *plan_args, "-o", str(path)], check=True,
                   capture_output=True)
    peaks = _peaks([*TREEATTN, "run", str(path), "--repeats", "2", "--warmup", "1", "--out",
                    str(tmp / "rows.csv"), *flags], tmp / "runs")
    opts = RunOptions(baselines="--baselines" in flags, check="all" if "--check" in flags else "root",
                      order="blocked" if "blocked" in flags else "interleaved")
    job = Job((PlanJob("p", load_checked(path)),), opts)
    (tmp / "rows.csv").unlink(missing_ok=True)
    return peaks, [job_bytes(job, [r]) for r in range(2)]


def main() -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON (case, rank, held_mib, counted_mib) "
                    "at the end instead of the table as it goes")
    args = ap.parse_args()
    out = output_file(args.out, "--out", "run-memory.txt") if args.out else None
    lines = [f"{'case':44} {'rank':>4} {'held MiB':>9} {'counted MiB':>12} {'held - counted':>15}"]
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, plan_args, tiny_args, flags in CASES:
            peaks, counts = _case(Path(tmp), plan_args, flags)
            base, base_counts = _case(Path(tmp), tiny_args, flags)
            for r in range(2):
                held, counted = (peaks[r] - base[r]) / MIB, (counts[r] - base_counts[r]) / MIB
                lines.append(f"{name:44} {r:>4} {held:>9.1f} {counted:>12.1f} {held - counted:>+15.1f}")
                records.append({"case": name, "rank": r, "held_mib": round(held, 1), "counted_mib": round(counted, 1)})
                if not args.json:
                    print(lines[-1], flush=True)
    if args.json:
        print(json.dumps(records, indent=2))
    text = "\n".join(lines) + "\n"
    if out is not None:
        write_file(out, text)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
