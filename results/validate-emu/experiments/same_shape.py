"""How far apart one tree measures against itself: emu-2x4's tree candidates grouped by shape
up to the topology's symmetry, with each copy's measured median (analysis only).

On emu-2x4 the ranks of a node are interchangeable (each has its own NIC, every link alike)
and so are the two nodes, so two tree plans are the same plan up to renaming ranks when every
rank does the same ops in the same order with the same roles (parent, k-th child), and the
same edges cross between the nodes.
The families' searches often end in such copies; their medians differ by the host's noise.

Run: .venv/bin/python results/validate-emu/experiments/same_shape.py results/validate-emu
"""
import sys

import pandas as pd

from treeattn.topology import load
from treeattn.validate.cases import default_cases
from treeattn.validate.methods import case_plans


def shape(plan, node: list[int]) -> str:
    """The plan written with ranks named by their role: each rank's ops in program order, its
    peers as "parent" or "child k" (children numbered as the rank first meets them), and
    whether each child sits on the other node."""
    parents = list(plan.params["parents"])
    progs = plan.programs

    def enc(v: int) -> str:
        kids: list[int] = []
        for op in progs[v]:
            if op.peer is not None and op.peer != parents[v] and op.peer not in kids:
                kids.append(op.peer)
        ops = ",".join(f"{op.kind.value}:{op.step}:" + ("p" if op.peer == parents[v] else
                                                         "-" if op.peer is None else str(kids.index(op.peer)))
                       for op in progs[v])
        return "[" + ops + "|" + "".join(("x" if node[c] != node[v] else "l") + enc(c) for c in kids) + "]"

    return enc(parents.index(-1))


for folder in sys.argv[1:]:
    fit = load(f"{folder}/calibration/emu-2x4.yaml")
    node = [fit.rank_device(r).node for r in range(fit.num_ranks)]
    rows = pd.read_csv(f"{folder}/rows.csv")
    rows = rows[rows.topology == "emu-2x4"]
    for case in default_cases(fit):
        groups: dict[str, list[tuple[str, float]]] = {}
        for m in case_plans(fit, case.workload, seed=0).methods:
            hit = rows[(rows.case == case.name) & (rows.method == m.method)]
            if m.plan.algorithm == "tree" and len(hit):
                key = shape(m.plan, node)
                groups.setdefault(key, []).append((m.method + (" (pick)" if m.is_pick else ""),
                                                   float(hit.iloc[0].measured_median_us)))
        for copies in groups.values():
            if len(copies) > 1:
                meds = [t for _, t in copies]
                print(f"{case.name}: {len(copies)} copies, slowest/fastest {max(meds) / min(meds) - 1:.1%}:",
                      ", ".join(f"{name} {t / 1000:.2f} ms" for name, t in copies))
