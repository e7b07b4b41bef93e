"""Planned merge vs ring attention vs three all-reduces vs all-gather + merge (``treeattn compare``).

The published setting: DGX H100 nodes (1, 2, 4 and 16 of them: 8 to 128 ranks), 16 heads
of dimension 128 in bf16 (no GQA), one sequence, sequence lengths 32K to 1M. Prints the
predicted per-layer times (local compute included), the speedup of the planned merge over
ring attention and over the three all-reduces, peak memory and bytes moved, and checks
that the speedup over ring attention grows with the sequence length (at every rank count)
and with the rank count (at every sequence length), as the published results do.

    .venv/bin/python benchmarks/bench_compare.py
    .venv/bin/python benchmarks/bench_compare.py --csv results/compare.csv --png results/compare.png
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from treeattn.search.compare import compare, expand_topologies, plot_speedup, write_csv
from treeattn.search.workload_file import parse_tokens
from treeattn.topology.library import resolve
from treeattn.units import format_size
from treeattn.workload import Workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="dgx-h100:nodes={1,2,4,16}")
    ap.add_argument("--seq-lens", default="32K,128K,512K,1M")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--csv")
    ap.add_argument("--png")
    args = ap.parse_args()
    con = Console(highlight=False, width=170)
    topos = [resolve(s) for s in expand_topologies(args.topology)]
    lens = [parse_tokens(x) for x in args.seq_lens.split(",")]

    def make(p: int, n: int) -> Workload:
        return Workload.create(ranks=p, seq_len=n, batch=args.batch, q_heads=16, kv_heads=16, head_dim=128,
                               kv_dtype="bf16")

    started = time.perf_counter()
    rows = compare(topos, lens, make)
    elapsed = time.perf_counter() - started
    by = {}
    for r in rows:
        by.setdefault((r.ranks, r.seq_len), {})[r.method] = r
    table = Table(title=f"Predicted per-layer decode attention, 16 heads x 128, bf16, B={args.batch} (us)")
    for col in ("ranks", "N", "planned", "family", "ring attn", "3 all-reduces", "all-gather", "x vs ring",
                "x vs 3 AR", "peak plan / ring", "moved plan / ring"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for (p, n), m in sorted(by.items()):
        pl, ring = m["planned"], m["ring-attention"]
        table.add_row(str(p), f"{n // 1024}K", f"{pl.predicted_us:.1f}", pl.detail, f"{ring.predicted_us:.1f}",
                      f"{m['allreduce3'].predicted_us:.1f}", f"{m['allgather-merge'].predicted_us:.1f}",
                      f"{ring.predicted_us / pl.predicted_us:.1f}",
                      f"{m['allreduce3'].predicted_us / pl.predicted_us:.2f}",
                      f"{format_size(pl.peak_bytes)} / {format_size(ring.peak_bytes)}",
                      f"{format_size(pl.bytes_moved)} / {format_size(ring.bytes_moved)}")
    con.print(table)
    speed = {k: v["ring-attention"].predicted_us / v["planned"].predicted_us for k, v in by.items()}
    ranks = sorted({p for p, _ in speed})
    grows_n = all(speed[(p, a)] < speed[(p, b)] for p in ranks for a, b in zip(lens, lens[1:], strict=False))
    grows_p = all(speed[(a, n)] < speed[(b, n)] for n in lens for a, b in zip(ranks, ranks[1:], strict=False))
    yes = {True: "yes", False: "NO"}
    con.print(f"speedup over ring attention grows with sequence length at every rank count: {yes[grows_n]}")
    con.print(f"speedup over ring attention grows with rank count at every sequence length: {yes[grows_p]}")
    con.print(f"{len(rows)} rows in {elapsed:.1f} s")
    if args.csv:
        write_csv(rows, args.csv)
        con.print(f"wrote {args.csv}")
    if args.png:
        plot_speedup(rows, args.png)
        con.print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
