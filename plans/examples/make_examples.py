"""Regenerate the example plans in this folder (deterministic: same bytes every run).

Usage: ``.venv/bin/python plans/examples/make_examples.py``. Each plan names the shipped
topology it was made for (its fingerprint changes if that topology file changes).
"""

from __future__ import annotations

from pathlib import Path

from treeattn.plan import TopologyRef, build, check
from treeattn.plan.io import save_plan
from treeattn.topology.library import resolve
from treeattn.workload import RawPayload, Workload

HERE = Path(__file__).parent


def main() -> None:
    h100 = TopologyRef.of(resolve("dgx-h100"))
    two = TopologyRef.of(resolve("dgx-h100-2node"))
    cpu = TopologyRef.of(resolve("cpu-4"))
    w8 = Workload.create(ranks=8, seq_len=131072, batch=1, model="llama-3.1-8b")
    w16 = Workload.create(ranks=16, seq_len=262144, batch=4, model="llama-3.1-8b")
    w4 = Workload.create(ranks=4, seq_len=4096, batch=1, q_heads=8, kv_heads=2, head_dim=64)
    plans = {
        "dgx-h100-binomial.yaml": build("binomial", w8, h100, chunks=2),
        "dgx-h100-allreduce3.yaml": build("allreduce3", w8, h100),
        "dgx-h100-ring-attention.yaml": build("ring-attention", w8, h100),
        "dgx-h100-2node-hierarchical.yaml": build("hierarchical", w16, two, chunks=4, group_size=8,
                                                  intra="star", inter="chain"),
        "dgx-h100-2node-multirail.json": build("multirail", w16, two, chunks=2, roots=[0, 8]),
        "cpu-4-chain.yaml": build("chain", w4, cpu, chunks=4),
        "cpu-4-broadcast-raw.yaml": build("broadcast", RawPayload(nbytes=1 << 20, ranks=4), cpu, chunks=4),
    }
    for name, plan in plans.items():
        check(plan)
        save_plan(plan, HERE / name)
        print(HERE / name)


if __name__ == "__main__":
    main()
