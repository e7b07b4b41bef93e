"""How long the cost-model simulator takes at cluster scale (prints what it measures).

Usage: .venv/bin/python benchmarks/bench_simulate.py [--nodes 128,512,2048] [--algorithm binomial]
       [--chunks 4] [--profile]
(about 25 s at the defaults on the 2-core development machine)

For each ``dgx-h100:nodes=N`` (8 GPUs a node, rail-optimized fat tree) it builds one
tree-reduce + broadcast plan of Llama-3.1-8B decode partials (B = 1) and times
``simulate`` twice: cold (routes computed on the way) and warm (routes cached), without
the per-op timeline, then once with it, and ``lower_bounds``. Wall and CPU seconds are
printed: on a shared machine CPU time is the steadier figure. The last lines give the
growth of the warm time from one size to the next against the growth in ranks.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections.abc import Callable

from treeattn.cli.script import ArgumentParser, count, count_list, run
from treeattn.cost.bounds import lower_bounds
from treeattn.cost.simulate import simulate
from treeattn.plan.builders import build
from treeattn.topology.library import resolve
from treeattn.workload import Workload


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=count_list, default="128,512,2048",
                    help="comma-separated node counts (8 GPUs each)")
    ap.add_argument("--algorithm", default="binomial")
    ap.add_argument("--chunks", type=count, default=4)
    ap.add_argument("--profile", action="store_true", help="cProfile the warm run of the largest size")
    args = ap.parse_args()
    rows = []
    for nodes in args.nodes:
        spec = f"dgx-h100:nodes={nodes}"
        topo, t_topo, _ = timed(lambda spec=spec: resolve(spec))
        p = topo.num_ranks
        w = Workload.create(ranks=p, seq_len=p * 4096, model="llama-3.1-8b")
        plan, t_build, _ = timed(lambda w=w, topo=topo: build(args.algorithm, w, topo, chunks=args.chunks))
        ops = sum(len(prog) for prog in plan.programs)
        print(f"{spec}: {p} ranks, {len(topo.links)} links; {args.algorithm} chunks={args.chunks}: {ops} ops "
              f"(topology {t_topo:.2f} s, plan {t_build:.2f} s)")
        res, cold_w, cold_c = timed(lambda plan=plan, topo=topo: simulate(plan, topo, timeline=False))
        _, warm_w, warm_c = timed(lambda plan=plan, topo=topo: simulate(plan, topo, timeline=False))
        _, tl_w, tl_c = timed(lambda plan=plan, topo=topo: simulate(plan, topo, timeline=True))
        b, bd_w, bd_c = timed(lambda w=w, topo=topo: lower_bounds(w, topo))
        print(f"  simulate cold    {cold_w:7.2f} s wall {cold_c:7.2f} s cpu   predicted {res.predicted_us:.2f} us, "
              f"{res.events} events, {res.transfers} transfers")
        print(f"  simulate warm    {warm_w:7.2f} s wall {warm_c:7.2f} s cpu")
        print(f"  with timeline    {tl_w:7.2f} s wall {tl_c:7.2f} s cpu")
        print(f"  lower_bounds     {bd_w:7.2f} s wall {bd_c:7.2f} s cpu   bound {b.bound_us:.2f} us ({b.cut}), "
              f"gap {res.predicted_us / b.bound_us:.2f}x")
        rows.append((p, res.events, warm_w, warm_c))
        if args.profile and nodes == max(args.nodes):
            prof = cProfile.Profile()
            prof.runcall(simulate, plan, topo, timeline=False)
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    for (p0, e0, w0, c0), (p1, e1, w1, c1) in zip(rows, rows[1:], strict=False):
        print(f"growth {p0} -> {p1} ranks (x{p1 / p0:.1f}): events x{e1 / e0:.2f}, "
              f"warm wall x{w1 / w0:.2f}, warm cpu x{c1 / c0:.2f}")


if __name__ == "__main__":
    sys.exit(run(main))
