"""The planned merge against every method it competes with (``treeattn compare``), in the paper's setting.

Two sweeps, predicted by the simulator (per layer, compute included):

* Llama-3.1-8B (32 query heads on 8 KV heads, bf16, B = 1) on 8, 16 and 128 H100s
  (``dgx-h100:nodes={1,2,16}``) at 128K and 1M tokens;
* the tree-attention paper's setting: 16 heads x 128, fp16, B = 1, 128 H100s, 160K to 5.12M
  tokens, one layer.

Then the heads layout against all on bandwidth-bound cases (Llama-3.1-8B, 1K tokens per
GPU, large batches): the merge's predicted time (the step's time less its attention
compute) and bytes moved by the best plan of each layout.

It prints the tables and, for the paper's setting, the tree's speedup over ring attention
and the ratio of ring attention's peak memory to the tree's beside the paper's "up to 8x"
and "2x less peak memory", with ring attention without overlap (each transfer a step of
its own) beside it: a ring that forwards the block it holds while the next one arrives
holds two foreign blocks beside its own shard, overlapped or not.

    .venv/bin/python benchmarks/bench_compare.py --out results/compare > results/compare/bench_compare.txt
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from treeattn.cli.paths import output_folder
from treeattn.cli.script import ArgumentParser, run
from treeattn.cost.compute import ComputeModel
from treeattn.cost.memory import peak_bytes
from treeattn.plan.builders import build
from treeattn.search.compare import compare, expand_topologies, plan_bytes_moved
from treeattn.search.rings import ring_order
from treeattn.search.search import search
from treeattn.textfile import write_file
from treeattn.topology.library import resolve
from treeattn.workload import Workload

PAPER_LENS = (160 << 10, 640 << 10, 1280 << 10, 2560 << 10, 5120 << 10)
"""The paper's sweep (5.12M = 5,242,880 tokens is its longest)."""

PAPER_TOPOLOGY = "dgx-h100:nodes=16"
"""128 H100s, the paper's largest run."""

COMMANDS = {
    "llama-3.1-8b": ["compare", "-t", "dgx-h100", "--nodes", "1,2,16", "-m", "llama-3.1-8b", "--seq-lens", "128K,1M",
                     "--no-progress"],
    "paper": ["compare", "-t", PAPER_TOPOLOGY, "--heads", "16", "--kv-heads", "16", "--head-dim", "128", "--kv-dtype",
              "fp16", "--partial-dtype", "fp16", "--seq-lens", "160K,640K,1280K,2560K,5120K", "--no-progress"],
}
"""The ``treeattn compare`` runs, by the name of the files they write (NAME.txt, NAME.csv)."""

HEADS_CASES = (("dgx-h100", 64), ("dgx-h100-2node", 64), ("dgx-h100-2node", 256), ("dgx-h100:nodes=4", 256),
               ("dgx-h100:nodes=4", 1))
"""(topology, batch) of the heads-against-all table."""


def paper(p: int, n: int) -> Workload:
    return Workload.create(ranks=p, seq_len=n, batch=1, q_heads=16, kv_heads=16, head_dim=128, kv_dtype="fp16",
                           partial_dtype="fp16")


def paper_table(lens: Sequence[int] = PAPER_LENS) -> list[str]:
    """The tree against ring attention in the paper's setting: title, header, a line per N
    (each line depends on its N alone, so a test can regenerate a few)."""
    topo = resolve(expand_topologies(PAPER_TOPOLOGY)[0])
    by = {(r.seq_len, r.method): r for r in compare([topo], lens, paper)}
    ring = ring_order(topo)[1]
    out = ["paper's setting, 128 H100s, 16 heads x 128, fp16: tree vs ring attention (paper: up to 8x faster, "
           "2x less peak memory)",
           f"{'N':>8} {'tree µs':>9} {'ring µs':>10} {'speedup':>8} {'mem ratio':>10} {'no-overlap ratio':>17}"]
    for n in lens:
        tree, ra = by[(n, "tree")], by[(n, "ring-attention")]
        serial = peak_bytes(build("ring-attention", paper(topo.num_ranks, n), topo, order=ring, overlap=False))
        out.append(f"{n // 1024:>7}K {tree.predicted_us:>9.1f} {ra.predicted_us:>10.1f} {ra.speedup_of_tree:>7.0f}x "
                   f"{ra.peak_bytes / tree.peak_bytes:>9.2f}x {serial / tree.peak_bytes:>16.2f}x")
    return out


def heads_table(cases: Sequence[tuple[str, int]] = HEADS_CASES) -> list[str]:
    """The heads layout against all: title, header, a line per (topology, batch)."""
    out = ["heads against all (Llama-3.1-8B, 1K tokens a GPU): the merge's time (compute taken out) and bytes moved",
           f"{'topology':>18} {'B':>4} {'all':>22} {'heads':>24} {'time':>6} {'bytes':>6}"]
    for spec, batch in cases:
        t = resolve(spec)
        w = Workload.create(ranks=t.num_ranks, seq_len=1024 * t.num_ranks, batch=batch, model="llama-3.1-8b")
        c = max(ComputeModel.of(w, t).partial_us(r) for r in range(t.num_ranks))
        got = {}
        for layout in ("all", "heads"):
            res = search(t, w, result=layout)
            # "(whole)": an all plan of which each rank keeps its own heads (``build``'s whole_rows)
            pick = res.candidates[0].algorithm + (" (whole)" if res.best.params.get("whole_rows") else "")
            got[layout] = (pick, res.best.predicted_us - c, plan_bytes_moved(res.best))
        (fa, ta, ba), (fh, th, bh) = got["all"], got["heads"]
        out.append(f"{spec:>18} {batch:>4} {fa:>12} {ta:>6.1f} µs {fh:>14} {th:>6.1f} µs {ta / th:>5.2f}x "
                   f"{ba / bh:>5.2f}x")
    return out


def main() -> None:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="folder for the CSVs and the command's tables")
    args = ap.parse_args()
    if args.out is not None:
        args.out = output_folder(args.out, "--out")
    t0 = time.perf_counter()
    cli = [str(Path(sys.executable).with_name("treeattn"))]
    # Tables are as wide as the console: 80 columns, whatever the shell exports (as the test
    # that regenerates some of them runs the CLI).
    env = {**os.environ, "COLUMNS": "80"}
    for name, argv in COMMANDS.items():
        extra = ["--csv", str(args.out / f"{name}.csv")] if args.out else []
        out = subprocess.run(cli + argv + extra, capture_output=True, text=True, check=True, env=env).stdout
        print(f"$ treeattn {' '.join(argv + extra)}\n{out}")
        if args.out:
            write_file(args.out / f"{name}.txt", f"$ treeattn {' '.join(argv + extra)}\n{out}")
    print("\n".join(paper_table()))
    print()
    print("\n".join(heads_table()))
    print(f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(run(main))
