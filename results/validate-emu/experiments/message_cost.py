"""What one message costs the rank that handles it: 4-byte star and butterfly plans (and a B = 1
attention star) on 2, 4 and 8 local ranks over loopback, through the executor and its runner.
No emulation; run it under `chrt -r 10` to keep the rest of the host from delaying the ranks.

Run: chrt -r 10 .venv/bin/python results/validate-emu/experiments/message_cost.py
"""
import os

from treeattn.exec.launch import launch_local
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import RawPayload, Workload

ref = TopologyRef("cpu", "sha256:0")
for p in (2, 4, 8):
    plans = {f"raw4-{a}-p{p}": build(a, RawPayload(nbytes=4, ranks=p), ref) for a in ("star", "butterfly")}
    w = Workload.create(ranks=p, seq_len=32 * p, batch=1, q_heads=8, kv_heads=1, head_dim=32)
    plans[f"att-star-p{p}"] = build("star", w, ref)
    res = launch_local(Job(tuple(PlanJob(k, v) for k, v in plans.items()),
                           RunOptions(repeats=20, warmup=3, backend="gloo")))
    for m in res.measurements:
        ts = sorted(m.times_us)
        print(f"{m.label:18s} median {m.median_us:7.0f} us  min {ts[0]:6.0f}  p90 {m.quantile_us(0.9):7.0f}",
              flush=True)
print("load", os.getloadavg())
