"""Opposite transfers on one rank pair: one direction, both at once on one process group (one
gloo TCP connection), both at once on two groups (a connection per direction).

Run (root): treeattn emulate exec topologies/emu-2x4.yaml --ranks 0,4 -- .venv/bin/python \
    results/validate-emu/experiments/duplex.py
Rank 0 prints the times in ms of 4 tries each; 512 KiB at 40 Mbit/s is 105 ms one way.
"""
import os
import time

import torch
import torch.distributed as dist

r = int(os.environ["RANK"])
dist.init_process_group("gloo")
N = int(os.environ.get("NB", 524288))
a, b = torch.zeros(N // 4), torch.zeros(N // 4)
g2 = dist.new_group([0, 1])


def one():
    if r == 0:
        dist.send(a, 1)
    else:
        dist.recv(b, 0)


def both_one_group():
    for w in [dist.isend(a, 1 - r), dist.irecv(b, 1 - r)]:
        w.wait()


def both_two_groups():
    ops = [dist.isend(a, 1), dist.irecv(b, 1, group=g2)] if r == 0 else [dist.isend(a, 0, group=g2), dist.irecv(b, 0)]
    for w in ops:
        w.wait()


res = {}
for name, f in (("one way", one), ("both, one connection", both_one_group), ("both, two connections", both_two_groups)):
    ts = []
    for _ in range(4):
        dist.barrier()
        t = time.perf_counter()
        f()
        dist.barrier()
        ts.append(round((time.perf_counter() - t) * 1e3, 1))
    res[name] = ts
if r == 0:
    print(res, flush=True)
dist.destroy_process_group()
