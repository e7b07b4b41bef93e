"""How `treeattn plan` scales: 8, 128, 1,024 and 16,384 ranks, side by side in one run.

Each case runs `treeattn plan -t dgx-h100:nodes=N -m llama-3.1-405b -b B -n SEQ --json` in a
child process of its own and prints:

* ``plan s``: wall seconds of the command inside the process (topology, search, baselines,
  writing the plan), and ``cpu s``, the child's whole CPU time (user + system, start-up
  included): on a shared machine the steadier figure;
* ``proc s``: wall seconds of the whole child process (interpreter start and imports included);
* ``peak``: the child's resident-set high-water mark (``ru_maxrss`` from ``os.wait4``);
* ``file``: the plan file's size;
* the pick (family, parameters, chunks) and its predicted time.

The load average is printed before and after (other work on the machine slows every case
alike, which is why the cases run side by side). ``--record FILE`` writes the picks and
predicted times as JSON; ``--against FILE`` compares the picks with a recorded run (the
committed ``results/scale/baseline.json`` was recorded before the scale work). Its verdicts
("same pick", "no worse") compare two runs' cost models as well as their searches: against a
recording made before the simulator changed, as ``baseline.json`` now is, they differ for that
reason alone.

    .venv/bin/python benchmarks/bench_scale.py                       # every case (4.7 min on 2 busy cores)
    .venv/bin/python benchmarks/bench_scale.py --ranks 8,128,1024 --against results/scale/baseline.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "llama-3.1-405b"
GPUS_PER_NODE = 8
CASES: dict[int, tuple[tuple[int, str], ...]] = {
    8: ((1, "1M"), (128, "8K")),
    128: ((1, "1M"), (128, "8K")),
    1024: ((1, "1M"), (128, "8K")),
    16384: ((1, "16M"),),
}
"""Ranks -> (batch, sequence length) cases. B = 128 uses short sequences so that the KV
cache of 128 sequences fits on 8 GPUs."""


def _child(args: list[str]) -> None:
    """Run one `treeattn plan` in this process; print its timing as the last line."""
    from treeattn.cli import main

    started = time.perf_counter()
    try:
        main(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    wall = time.perf_counter() - started
    sys.stdout.write("\n" + json.dumps({"plan_s": wall}) + "\n")


def _run(ranks: int, batch: int, seq: str, out: Path, src: Path | None = None) -> dict:
    # The child's output goes to files and it is reaped by wait4, which gives its own rusage
    # (RUSAGE_CHILDREN would give the largest of every child so far).
    nodes = ranks // GPUS_PER_NODE
    args = ["plan", "-t", f"dgx-h100:nodes={nodes}", "-m", MODEL, "-b", str(batch), "-n", seq, "--json",
            "--no-progress", "-o", str(out)]
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        started = time.perf_counter()
        env = dict(os.environ)
        if src is not None:  # another checkout's treeattn (the code before a change)
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(src), env.get("PYTHONPATH")) if x)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(args)]
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc_s = time.perf_counter() - started
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if proc.returncode != 0:
        raise SystemExit(f"case {ranks} ranks B={batch} failed (exit {proc.returncode}):\n{stderr[-2000:]}")
    text, _, last = stdout.rstrip().rpartition("\n")
    best = json.loads(text)["best"]
    return {
        "ranks": ranks, "batch": batch, "seq_len": seq, "plan_s": json.loads(last)["plan_s"], "proc_s": proc_s,
        "cpu_s": usage.ru_utime + usage.ru_stime, "peak_bytes": usage.ru_maxrss * 1024,
        "file_bytes": out.stat().st_size, "family": best["algorithm"], "params": best["params"],
        "chunks": best["chunks"], "predicted_us": best["predicted_us"],
    }


def _pick(row: dict) -> str:
    params = json.dumps(row["params"], sort_keys=True, separators=(",", ":"))
    if len(params) > 60:
        params = params[:57] + "..."
    return f"{row['family']} {params} c={row['chunks']}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _line(label: str, row: dict) -> str:
    return (f"{label:<7}{row['ranks']:>6} {row['batch']:>4} {row['seq_len']:>4} {row['plan_s']:7.2f} "
            f"{row['cpu_s']:7.2f} {row['proc_s']:7.2f} {row['peak_bytes'] / 2**20:8.0f} "
            f"{row['file_bytes'] / 2**20:8.2f}  {row['predicted_us']:12.3f}  {_pick(row)}")


def _versus(was: dict, row: dict, what: str) -> str:
    same = (was["family"], was["params"], was["chunks"]) == (row["family"], row["params"], row["chunks"])
    ratio = row["predicted_us"] / was["predicted_us"]
    verdict = "same pick" if same else f"{what} picked {_pick(was)}"
    worse = "no worse" if ratio <= 1 + 1e-12 else "WORSE"
    return (f"{'':>7}vs {what}: time x{row['plan_s'] / was['plan_s']:.3f}, cpu x{row['cpu_s'] / was['cpu_s']:.3f}, "
            f"peak x{row['peak_bytes'] / was['peak_bytes']:.2f}, file x{row['file_bytes'] / was['file_bytes']:.3f}; "
            f"predicted x{ratio:.6f} ({verdict}; {worse})")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
        return
    # Imported here, not above: a child of --before runs another checkout's treeattn, which may
    # not have it.
    from treeattn.cli.paths import output_file
    from treeattn.cli.script import ArgumentParser
    from treeattn.errors import InputError

    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=",".join(map(str, CASES)), help="Rank counts, of 8, 128, 1024, 16384.")
    parser.add_argument("--before", type=Path, help="A checkout of the code before a change: each case runs "
                        "there too, just before this checkout's run, and the two are compared.")
    parser.add_argument("--record", type=Path, help="Write the rows (picks, predicted times, figures) as JSON "
                        "(this checkout's; with --before, that code's rows under 'before').")
    parser.add_argument("--against", type=Path, help="Compare picks and predicted times with a recorded run.")
    args = parser.parse_args()
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        parser.error(f"--ranks {args.ranks!r}: give rank counts separated by commas, of {', '.join(map(str, CASES))}")
    unknown = [p for p in ranks if p not in CASES]
    if unknown:
        parser.error(f"--ranks: no case for {unknown}; choose from {', '.join(map(str, CASES))}")
    if args.before is not None and not (args.before / "treeattn" / "__init__.py").is_file():
        parser.error(f"--before {args.before}: no treeattn package there")
    recorded = {}
    if args.against is not None:
        if not args.against.is_file():
            parser.error(f"--against {args.against}: no such file")
        try:
            recorded = {(r["ranks"], r["batch"]): r for r in json.loads(args.against.read_text())["rows"]}
        except (ValueError, KeyError, TypeError) as exc:
            parser.error(f"--against {args.against}: not a --record file ({type(exc).__name__}: {exc})")
    if args.record is not None:  # checked before the minutes of planning, not after
        try:
            args.record = output_file(args.record, "--record", "scale.json")
        except InputError as exc:
            parser.error(str(exc))
    print(f"treeattn plan -t dgx-h100:nodes=N -m {MODEL} -b B -n SEQ; load average before: {_load()}")
    print(f"{'':<7}{'ranks':>6} {'B':>4} {'N':>4} {'plan s':>7} {'cpu s':>7} {'proc s':>7} {'peak MB':>8} "
          f"{'file MB':>8}  {'predicted µs':>12}  pick")
    rows, before_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for p in ranks:
            for batch, seq in CASES[p]:
                out = Path(tmp) / f"plan-{p}-{batch}.yaml"
                was = recorded.get((p, batch))
                if args.before is not None:
                    was = _run(p, batch, seq, out, args.before)
                    before_rows.append(was)
                    print(_line("before", was), flush=True)
                row = _run(p, batch, seq, out)
                rows.append(row)
                print(_line("now" if args.before is not None else "", row), flush=True)
                if was is not None:
                    print(_versus(was, row, "before" if args.before is not None else "recorded"), flush=True)
    print(f"load average after: {_load()}")
    if args.record is not None:
        data = {"model": MODEL, "load_after": _load(), "rows": rows}
        if before_rows:
            data["before"] = before_rows
        from treeattn.textfile import write_file

        write_file(args.record, json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
