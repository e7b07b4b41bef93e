"""How far apart the ranks leave the runner's barrier (a gloo all-reduce of one float), on the
host's shared monotonic clock: every iteration time the executor reports includes it.

Run (root): treeattn emulate exec topologies/emu-2x4.yaml -- .venv/bin/python \
    results/validate-emu/experiments/barrier_skew.py
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
flag = torch.zeros(1)
spread = []
for _ in range(30):
    dist.all_reduce(flag)  # what treeattn.exec.comm.Comm.barrier does on CPU
    t = torch.tensor([time.perf_counter()], dtype=torch.float64)
    got = [torch.zeros(1, dtype=torch.float64) for _ in range(n)]
    dist.all_gather(got, t)
    ts = [g.item() for g in got]
    spread.append((max(ts) - min(ts)) * 1e6)
    time.sleep(0.01)
if r == 0:
    spread.sort()
    print(f"barrier exit skew: median {statistics.median(spread):.0f} us, p10 {spread[3]:.0f}, p90 {spread[26]:.0f}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
dist.destroy_process_group()
