"""Fit measured - predicted = a + b x (messages the busiest rank sends or receives) over the
sweep's candidate plans of each topology in this folder (analysis only: nothing is fed back).

Run: .venv/bin/python results/validate-emu/experiments/residuals.py results/validate-emu
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from treeattn.plan.ir import OpKind
from treeattn.topology.io import load_topology
from treeattn.validate import case_plans, default_cases

folder = Path(sys.argv[1])
rows = pd.read_csv(folder / "rows.csv")
out = []
for name in dict.fromkeys(rows["topology"]):
    cal = load_topology(folder / "calibration" / f"{name}.yaml")
    for c in default_cases(cal, tokens_per_rank=32, long_tokens_per_rank=0):
        for m in case_plans(cal, c.workload).methods:
            msgs = max(sum(op.kind in (OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY) for op in prog)
                       for prog in m.plan.programs)
            hit = rows[(rows.topology == name) & (rows.case == c.name) & (rows.method == m.method)]
            if len(hit):
                out.append((name, msgs, hit.iloc[0].predicted_us, hit.iloc[0].measured_median_us))
df = pd.DataFrame(out, columns=["topology", "msgs", "pred", "meas"])
for name, g in df.groupby("topology", sort=False):
    x = np.vstack([np.ones(len(g)), g.msgs]).T
    y = (g.meas - g.pred).to_numpy()
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    r2 = 1 - ((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    print(f"{name}: measured - predicted = {coef[0]:.0f} us + {coef[1]:.0f} us x messages on the busiest rank "
          f"(R2 {r2:.2f}, {len(g)} plans)")
