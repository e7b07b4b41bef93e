"""Measured decode-attention time per method on local CPU ranks (gloo), llama-3.1-8b shapes.

For each batch size: the planned merge (the search's pick for ``cpu:ranks=P``, or without
the search the builders' family and chunk count the simulator ranks best) and the baselines
``treeattn run --baselines`` runs beside it (the paper's three all-reduces, two all-reduces,
all-gather + merge and ring attention), each executed for real, checked
against the single-process reference and timed (median and p10-p90 of the per-iteration
maximum over ranks). Every method includes the local partial over the rank's KV shard.
Rows are also written to ``--out`` (default results/runs/bench_run-<time>.csv), checked before
anything runs.

    .venv/bin/python benchmarks/bench_run.py                     # B in {1, 64}, N = 64K per rank
    .venv/bin/python benchmarks/bench_run.py --quick             # small shapes (12 s to 1 min)
    .venv/bin/python benchmarks/bench_run.py --tokens-per-rank 16  # merge-bound: communication only

NOTE: B = 64 with 64K tokens per rank needs 17 GB of bf16 K/V per rank (68 GB for 4 ranks,
twice that while ring attention holds two blocks); the script halves N for a batch size until
a rank's K/V fits ``--max-kv-gb`` (1 GB unless raised, whatever the machine's memory: by
default B = 64 runs 2K tokens per rank) and says so in the table.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from treeattn.cli.paths import output_file
from treeattn.cli.script import ArgumentParser, count, count_list, run
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError
from treeattn.exec.launch import launch
from treeattn.exec.predict import plan_baselines, predict
from treeattn.exec.results import COLUMNS, appendable_problem, result_rows, write_csv
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.topology.library import resolve
from treeattn.workload import Workload

FAMILIES = ("star", "chain", "kary", "binomial", "butterfly", "ring", "hierarchical")


def best_plan(w: Workload, topo):  # noqa: ANN001, ANN201 - Topology in, Plan out
    """The search's pick (``treeattn.search.search``), else the builders' family x chunk
    count with the least simulated time."""
    try:
        from treeattn.search import search
    except ImportError:
        search = None
    if search is not None:
        return search(topo, w).best
    best = None
    for name in FAMILIES:
        for chunks in (1, 2, 4, 8):
            extra = {"group_size": 2} if name == "hierarchical" else {}
            try:
                plan = build(name, w, topo, chunks=chunks, **extra)
            except Exception:  # noqa: BLE001 - a family that cannot take these parameters is skipped
                continue
            us = simulate(plan, topo, timeline=False).predicted_us
            if best is None or us < best[0]:
                best = (us, plan)
    return best[1]


KV_BYTES_PER_TOKEN = 2 * 8 * 128 * 2
"""K and V of one token of one sequence: Llama-3.1-8B's 8 KV heads of 128, bf16."""


def kv_tokens(batch: int, tokens: int, max_kv_gb: float) -> int:
    """KV tokens per rank at batch size ``batch``: ``tokens``, halved until a rank's K/V fits
    ``max_kv_gb``.

    Raises:
        InputError: not even one token a rank fits the budget.
    """
    one = KV_BYTES_PER_TOKEN * batch
    if one > max_kv_gb * 1e9:
        raise InputError(f"--max-kv-gb {max_kv_gb:g} is too small for the requested context: one token per rank "
                         f"at B = {batch} needs {one} bytes of K/V ({one / 1e9:.3g} GB); raise --max-kv-gb")
    n = tokens
    while KV_BYTES_PER_TOKEN * batch * n > max_kv_gb * 1e9:
        n //= 2
    return n


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=count, default=4)
    ap.add_argument("--batches", type=count_list, default="1,64")
    ap.add_argument("--tokens-per-rank", type=count, default=65536)
    ap.add_argument("--max-kv-gb", type=float, default=1.0, help="cap on one rank's K+V shard (GB)")
    ap.add_argument("--repeats", type=count, default=10)
    ap.add_argument("--warmup", type=lambda x: count(x, 0), default=2)
    ap.add_argument("--quick", action="store_true", help="B in {1, 4}, 1K tokens per rank, 3 repeats")
    ap.add_argument("--out", type=Path, default=None, help="CSV to append the rows to (default "
                    "results/runs/bench_run-TIME.csv)")
    args = ap.parse_args()
    if not args.max_kv_gb > 0:  # also NaN
        ap.error(f"--max-kv-gb {args.max_kv_gb}: give a size in GB over 0")
    if args.quick:
        args.batches, args.tokens_per_rank, args.repeats, args.warmup = [1, 4], 1024, 3, 1
    # Every batch's context is cut to the budget up front: one that no token fits is refused
    # before any batch runs.
    tokens = {batch: kv_tokens(batch, args.tokens_per_rank, args.max_kv_gb) for batch in args.batches}
    name = f"bench_run-{time.strftime('%Y%m%d-%H%M%S')}.csv"
    out = output_file(args.out if args.out is not None else Path("results") / "runs" / name, "--out", name)
    problem = appendable_problem(out, COLUMNS)  # rows under another header would land under the wrong names
    if problem:
        raise InputError(f"--out: {problem}")
    p = args.ranks
    topo = resolve(f"cpu:ranks={p}")
    console = Console(width=160)
    console.print(f"{p} local ranks, gloo, {os.cpu_count()} CPU cores; llama-3.1-8b (Hq 32, Hkv 8, D 128), bf16 KV")
    table = Table(title="measured per decode step and layer (µs): median ± half p10-p90, max over ranks")
    for col in ("B", "N/rank", "method", "measured", "±", "predicted", "correct", "plan / allreduce3",
                "plan / ring-attn"):
        table.add_column(col, justify="left" if col in ("method", "correct") else "right")
    frames = []
    for batch in args.batches:
        kv_bytes = KV_BYTES_PER_TOKEN * batch * args.tokens_per_rank
        n = tokens[batch]
        w = Workload.create(ranks=p, seq_len=n * p, batch=batch, model="llama-3.1-8b", kv_dtype="bf16")
        plan = best_plan(w, topo)
        label = f"B{batch}-{plan.algorithm}-c{plan.chunks}"
        console.print(f"B={batch}: plan {plan.algorithm} chunks={plan.chunks} params={plan.params}")
        options = RunOptions(repeats=args.repeats, warmup=args.warmup, timeout_s=600, setup_timeout_s=1800,
                             baselines=True, check="root")
        t0 = time.time()
        # The baselines `treeattn run --baselines` runs beside this plan, on the topology's ring.
        methods, ring = plan_baselines(plan, topo)
        result = launch(Job((PlanJob(label, plan, ring_order=ring),), options))
        pred = predict(plan, topo, methods)
        frame = result_rows(result, {label: plan}, {label: pred}, f"bench_run-B{batch}")
        frames.append(frame)
        us = dict(zip(frame["method"], frame["measured_median_us"], strict=True))
        note = "" if n == args.tokens_per_rank else f" (cut from {args.tokens_per_rank}: {kv_bytes / 1e9:.0f} GB)"
        for r in frame.itertuples():
            name = f"plan: {plan.algorithm} c{plan.chunks}" if r.method == "plan" else r.method
            table.add_row(str(batch), f"{n}{note}", name, f"{r.measured_median_us:,.0f}", f"{r.spread_us / 2:,.0f}",
                          "—" if r.predicted_us is None or r.predicted_us != r.predicted_us
                          else f"{r.predicted_us:,.0f}",
                          f"{'yes' if r.correct else 'NO'} {r.max_rel_err:.0e}",
                          f"{us['plan'] / us['allreduce3']:.2f}" if r.method == "plan" else "",
                          f"{us['plan'] / us['ring-attention']:.2f}" if r.method == "plan" else "")
        console.print(f"B={batch}: {time.time() - t0:.0f} s wall for the run")
    console.print(table)
    for frame in frames:
        write_csv(frame, out)
    console.print(f"rows: {out}  (command: {' '.join([Path(sys.executable).name, *sys.argv])})")


if __name__ == "__main__":
    sys.exit(run(main))
