"""Measured against predicted, op by op and rank by rank, for a few candidates of one case,
inside the emulation (root). Prints each candidate's median, its prediction, the CPU time
each rank used against the CPU the model charges it, then every op's post and done times
beside the simulator's start and end (µs from the iteration's start).

Run (the candidates are method names of the case; `+`-joined names match any part):
  .venv/bin/python results/validate-emu/experiments/case_timelines.py topologies/emu-2x4.yaml \
      results/validate-emu/calibration/emu-2x4.yaml B16 hierarchical,multirail,double-binary,kary
"""
import sys

from treeattn.cost.simulate import simulate
from treeattn.emulate import emulated
from treeattn.emulate.jobs import launch_in_cluster
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.topology import load
from treeattn.validate.cases import default_cases
from treeattn.validate.methods import case_plans
from treeattn.validate.run import realtime_priority

topo, fit = load(sys.argv[1]), load(sys.argv[2])
case = {c.name: c for c in default_cases(fit)}[sys.argv[3]]
wanted = sys.argv[4].split(",")
plans = {k: m.plan for m in case_plans(fit, case.workload, seed=0).methods for k in wanted
         if k in m.method.split("+")}
opts = RunOptions(repeats=9, warmup=2, timeout_s=300, setup_timeout_s=120, backend="gloo", seed=0)
with emulated(topo, scale=1.0, reuse=True) as cluster, realtime_priority(True):
    res = launch_in_cluster(cluster, Job(tuple(PlanJob(k, p) for k, p in plans.items()), opts), timeout_s=3600)
for m in res.measurements:
    sim = simulate(plans[m.label], fit)
    print(f"== {m.label}: measured median {m.median_us:.0f} us, predicted {sim.predicted_us:.0f}")
    print(f"   CPU per rank measured {[round(c) for c in m.cpu_us]}")
    print(f"   CPU per rank charged  {[round(c) for c in sim.cpu_us]}")
    pred = {(x.rank, x.op): x for x in sim.timeline}
    for t in sorted(m.timeline, key=lambda t: (t.rank, t.index)):
        p = pred[t.rank, t.index]
        print(f"  r{t.rank} #{t.index:<2} {t.op.kind.value:10s} step {t.op.step} peer {t.op.peer!s:4s} "
              f"measured {t.post_us:7.0f} {t.done_us:7.0f}   predicted {p.start_us:7.0f} {p.end_us:7.0f}")
