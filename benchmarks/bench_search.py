"""Quality and speed of the planner (``treeattn.search.search``).

1. Quality, for llama-3.1-8b at B in {1, 16, 128} and N in {128K, 1M} on every shipped
   topology (``list_presets()``, files and families at their defaults; a family whose
   default is the same machine as a file, by fingerprint, is run once):
   - the pick's predicted time and its ratio to the lower bound (``cost.bounds``);
   - the best *standard family* (star, chain, k-ary 2/3/4/8/16, binomial and butterfly in
     natural and interleaved orders, ring), each at its best chunk count. Schedules whose
     exact floor (``Evaluator.floor_us``) is already above the pick are not simulated: they
     cannot beat it, and the table says ``> pick``;
   - the library's three all-reduces (``allreduce3``) and all-gather + merge, timed as the
     simulator times collectives (NCCL's model on GPUs, gloo's schedules on host ranks).
   It checks that the pick is never slower than the best standard family nor than
   ``allreduce3``, counts the cases where all-gather + merge beats the pick, and prints the
   median and p90 ratio to the bound.
2. Multi-node at B = 1 (DGX H100 x 2 and x 16): the pick's speedup over ``allreduce3``.
3. Speed: wall and CPU seconds of ``search`` for 8, 128 and 1,024 ranks (DGX H100 x 1,
   x 16, x 128), B = 1 and B = 128, N = 128K, one layer (so that B = 128 fits 8 GPUs).
Cases whose KV cache (every layer) does not fit a device are left out of 1., and named.

    .venv/bin/python benchmarks/bench_search.py             # everything (80 s on 2 busy cores)
    .venv/bin/python benchmarks/bench_search.py --part speed
    .venv/bin/python benchmarks/bench_search.py --part quality --batches 1 --seq-lens 128K
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from rich.console import Console
from rich.table import Table

from treeattn.cli.script import ArgumentParser, count_list, run
from treeattn.cost.memory import check_kv_fits
from treeattn.errors import InputError
from treeattn.search import Evaluator, search
from treeattn.search.candidates import layout_of, standard_schedules
from treeattn.search.evaluate import chunk_choices, sweep_chunks
from treeattn.search.workload_file import parse_tokens
from treeattn.topology.library import list_presets, resolve
from treeattn.workload import Workload

MODEL = "llama-3.1-8b"


def _workload(p: int, batch: int, n: int, layers: int | None = None) -> Workload:
    return Workload.create(ranks=p, seq_len=n, batch=batch, model=MODEL, layers=layers)


def best_standard(topo, w: Workload, pick_us: float) -> tuple[float, str]:
    """Best standard family at its best chunk count; (inf, '') when every one is floor-pruned."""
    ev = Evaluator(topo, w)
    lay = layout_of(topo)
    choices = chunk_choices(w, topo.num_ranks)
    best, label = math.inf, ""
    for sched in standard_schedules(lay, w, small=False):
        c, t = sweep_chunks(ev, sched, choices, patience=2, cutoff=lambda: pick_us * (1 + 1e-9))
        if t < best:
            best, label = t, f"{sched.family} {sched.describe} c={c}"
    return best, label


def quality(con: Console, batches: list[int], seq_lens: list[int]) -> None:
    seen: dict[str, str] = {}
    specs = []
    for pre in list_presets():
        topo = resolve(pre.name)
        if topo.fingerprint in seen:
            con.print(f"[dim]{pre.name} ({pre.source}) is the same machine as {seen[topo.fingerprint]}: skipped[/]")
            continue
        seen[topo.fingerprint] = pre.name
        specs.append(pre.name)
    table = Table(title=f"Planner quality, {MODEL} (µs per layer, compute included)")
    for col in ("topology", "p", "B", "N", "pick", "family", "x bound", "best standard", "3 all-reduces",
                "all-gather", "ok"):
        table.add_column(col, justify="left" if col in ("topology", "family") else "right")
    ratios, failures, gather_wins, unfit = [], [], [], []
    started = time.perf_counter()
    for name in specs:
        topo = resolve(name)
        p = topo.num_ranks
        for b in batches:
            for n in seq_lens:
                w = _workload(p, b, n)  # bad shapes end the run: only memory leaves a case out
                try:
                    check_kv_fits(w, topo)
                except InputError:  # no schedule can run it: the model's KV alone overflows a device
                    unfit.append(f"{name} B={b} N={n // 1024}K")
                    continue
                res = search(topo, w)
                pick = res.best.predicted_us
                std, _ = best_standard(topo, w, pick)
                ar3 = res.baselines["allreduce3_nccl_us"]
                ok = pick <= std * (1 + 1e-9) and pick <= ar3 * (1 + 1e-9)
                if not ok:
                    failures.append((name, b, n))
                if res.baselines["allgather_merge_us"] < pick:
                    gather_wins.append((name, b, n))
                ratio = res.candidates[0].ratio_to_bound
                ratios.append(ratio)
                table.add_row(name, str(p), str(b), f"{n // 1024}K", f"{pick:.1f}", res.candidates[0].algorithm,
                              f"{ratio:.3f}", "> pick" if math.isinf(std) else f"{std:.1f}", f"{ar3:.1f}",
                              f"{res.baselines['allgather_merge_us']:.1f}", "yes" if ok else "NO")
    con.print(table)
    if unfit:
        con.print(f"{len(unfit)} case(s) left out, their KV cache ({MODEL}, every layer) larger than a device's "
                  f"memory: {', '.join(unfit)}")
    con.print(f"{len(ratios)} cases in {time.perf_counter() - started:.0f} s; ratio to the lower bound: "
              f"median {statistics.median(ratios):.3f}, p90 {sorted(ratios)[int(0.9 * (len(ratios) - 1))]:.3f}, "
              f"max {max(ratios):.3f}")
    con.print("pick never slower than the best standard family and the library's three all-reduces: "
              + ("yes" if not failures else f"NO in {len(failures)} case(s): {failures}"))
    con.print(f"all-gather + merge faster than the pick in {len(gather_wins)} case(s): {gather_wins}")


def multinode(con: Console) -> None:
    table = Table(title=f"Multi-node at B = 1, {MODEL}: pick vs the paper's three all-reduces (NCCL model)")
    for col in ("topology", "p", "N", "pick µs", "family", "3 all-reduces µs", "speedup"):
        table.add_column(col, justify="left" if col in ("topology", "family") else "right")
    for name in ("dgx-h100-2node", "dgx-h100-16node"):
        topo = resolve(name)
        for n in (128 * 1024, 1024 * 1024):
            res = search(topo, _workload(topo.num_ranks, 1, n))
            ar3 = res.baselines["allreduce3_nccl_us"]
            table.add_row(name, str(topo.num_ranks), f"{n // 1024}K", f"{res.best.predicted_us:.1f}",
                          res.candidates[0].algorithm, f"{ar3:.1f}", f"{ar3 / res.best.predicted_us:.2f}x")
    con.print(table)


def speed(con: Console) -> None:
    # One layer of KV, so that B = 128 fits on 8 GPUs too: what search() does does not depend
    # on the layer count, only its memory check does.
    table = Table(title="Planner speed: search() after the topology is loaded (baselines included; one layer)")
    for col in ("topology", "ranks", "B", "wall s", "cpu s", "simulations", "schedules", "pick µs"):
        table.add_column(col, justify="left" if col == "topology" else "right")
    for name in ("dgx-h100", "dgx-h100-16node", "dgx-h100:nodes=128"):
        topo = resolve(name)
        for b in (1, 128):
            w = _workload(topo.num_ranks, b, 128 * 1024, layers=1)
            t0, c0 = time.perf_counter(), time.process_time()
            res = search(topo, w)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            table.add_row(name, str(topo.num_ranks), str(b), f"{wall:.2f}", f"{cpu:.2f}",
                          str(res.stats["simulations"]), str(res.stats["schedules"]),
                          f"{res.best.predicted_us:.1f}")
    con.print(table)


def main() -> None:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("all", "quality", "multinode", "speed"), default="all")
    ap.add_argument("--batches", type=count_list, default="1,16,128")
    ap.add_argument("--seq-lens", default="128K,1M")
    args = ap.parse_args()
    con = Console(highlight=False, width=160)
    batches = args.batches
    lens = [parse_tokens(x, where="--seq-lens", least=1) for x in args.seq_lens.split(",")]
    if args.part in ("all", "speed"):
        speed(con)
    if args.part in ("all", "multinode"):
        multinode(con)
    if args.part in ("all", "quality"):
        quality(con, batches, lens)


if __name__ == "__main__":
    sys.exit(run(main))
