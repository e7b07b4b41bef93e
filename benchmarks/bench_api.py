"""Per-call cost of ``treeattn.Merger`` against the same schedule written by hand on torch.distributed.

Four gloo ranks on this machine. The schedule: all-gather of every rank's (o, lse), then a
local merge (the ``allgather-merge`` plan); by hand that is one ``all_gather_single``
of the packed rows and a few torch ops. The two are called alternately in one loop (A, B,
A, B, ...), after a warm-up, so both see the host's slow and fast spells; each call is
timed on every rank and the table shows, per method, the median over calls of the slowest
rank's time, the ratio Merger / by hand, and the load average.

    .venv/bin/python benchmarks/bench_api.py            # Llama-3.1-8B heads, B=1 and B=16
    .venv/bin/python benchmarks/bench_api.py --calls 2000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import treeattn
from treeattn.cli.script import ArgumentParser, count, count_list, run
from treeattn.exec.launch import free_port
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import Workload

RANKS = 4


def by_hand(o: torch.Tensor, lse: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All-gather + merge, as a user writes it on torch.distributed."""
    mine = torch.cat([o.float(), lse.unsqueeze(-1)], dim=-1)
    every = torch.empty((world * mine.shape[0], *mine.shape[1:]), dtype=mine.dtype)
    dist.all_gather_single(every.view(-1), mine.view(-1))
    every = every.view(world, *mine.shape)
    lses = every[..., -1]
    m = lses.amax(dim=0)
    w = torch.exp(lses - m)
    total = w.sum(dim=0)
    out = (every[..., :-1] * w.unsqueeze(-1)).sum(dim=0) / total.unsqueeze(-1)
    return out.to(o.dtype), m + torch.log(total)


def rank_main(rank: int, port: int, batches: list[int], calls: int, out: dict) -> None:  # noqa: ANN001
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    for batch in batches:
        w = Workload(batch=batch, q_heads=32, kv_heads=8, head_dim=128, split=(1024,) * RANKS)
        merger = treeattn.Merger(build("allgather-merge", w, TopologyRef("cpu", "")))
        g = torch.Generator().manual_seed(rank)
        o, lse = torch.randn(batch, 32, 128, generator=g), torch.randn(batch, 32, generator=g)
        a, b = merger(o, lse), by_hand(o, lse, RANKS)
        assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-5)
        times: dict[str, list[float]] = {"Merger": [], "by hand": []}
        for i in range(calls + 50):
            for name in (("Merger", "by hand") if i % 2 else ("by hand", "Merger")):
                dist.barrier()
                t0 = time.perf_counter()
                merger(o, lse) if name == "Merger" else by_hand(o, lse, RANKS)
                if i >= 50:
                    times[name].append(time.perf_counter() - t0)
        slowest = {}
        for name, ts in times.items():
            local = torch.tensor(ts, dtype=torch.float64)
            dist.all_reduce(local, op=dist.ReduceOp.MAX)
            slowest[name] = statistics.median(local.tolist()) * 1e6
        if rank == 0:
            out[batch] = slowest
    dist.destroy_process_group()


def main() -> None:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=count, default=1000, help="timed calls of each method per batch size")
    ap.add_argument("--batches", type=count_list, default=[1, 16])
    args = ap.parse_args()
    batches = args.batches
    port = free_port()
    manager = mp.Manager()
    out = manager.dict()
    load = os.getloadavg()
    mp.spawn(rank_main, args=(port, batches, args.calls, out), nprocs=RANKS)
    print(f"{RANKS} gloo ranks, all-gather + merge of Llama-3.1-8B partials (32 heads x 128), {args.calls} calls "
          f"each; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'B':>4} {'Merger us':>10} {'by hand us':>11} {'ratio':>6}")
    for batch in batches:
        r = out[batch]
        print(f"{batch:>4} {r['Merger']:>10.1f} {r['by hand']:>11.1f} {r['Merger'] / r['by hand']:>6.3f}")


if __name__ == "__main__":
    sys.exit(run(main))
