"""Execute plans on real ranks with torch.distributed (the only layer besides calibrate/ that imports torch).

Modules, bottom up:

* ``merge``: the merge operator of docs/design.md section 1 on packed ``(rows, D + 1)`` partials.
* ``kernels``: the merges as fused compiled kernels (CUDA), or the eager ops (CPU).
* ``attention``: inputs (q, KV shards, raw buffers) drawn on the device from a seed, the local
  partial (explicit, torch's fused ops by device capability, or flash-attn).
* ``reference``: what a run is checked against (exact, or sampled rows above a size).
* ``comm``: tagged point-to-point and collectives with deadlines, device-side time marks.
* ``graphs``: a rank's program captured as a CUDA graph and replayed.
* ``interpreter``: ``PlanExecutor``, one rank's program of a Plan, op by op, timed.
* ``baselines``: all-reduce x3, all-gather + merge, ring attention, library all-reduce,
  on code paths of their own.
* ``runner``: what every rank does in a run (inputs, check, warm-up, timed repeats).
* ``launch`` / ``worker``: local processes with a fault watchdog, or torchrun/SLURM ranks.
* ``predict`` / ``results``: the simulator's prediction per method; tidy result rows.

Typical use::

    from treeattn.exec.launch import launch
    from treeattn.exec.runner import Job, PlanJob, RunOptions

    result = launch(Job((PlanJob("plan.yaml", plan),), RunOptions(baselines=True)))
    for m in result.measurements:
        print(m.method, m.median_us, m.correct)
"""
