"""The four ways to merge a sharded decode, side by side (docs/design.md section 2).

For each topology of a family sweep and each sequence length: the planned merge (the
``search`` pick), ring attention, the paper's three all-reduces (NCCL model) and all-gather
+ local merge, each as a plan timed by the simulator. Times are per layer and include the
local attention compute. Memory and traffic are read off the same plans:

* ``peak_bytes``: the most any rank holds at once of KV cache (its own shard plus KV blocks
  received and not yet passed on and computed), its partial, and the buffers its busiest
  step receives into (an all-gather holds all p partials; the three all-reduces reduce in
  place, one part at a time).
* ``bytes_moved``: bytes sent by all ranks together; a library collective is counted as
  its ring implementation sends (all-reduce 2(p-1)/p of the buffer per rank, all-gather
  (p-1) shares per rank).
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from treeattn.cost.simulate import simulate
from treeattn.errors import InputError
from treeattn.figures import save_figure
from treeattn.plan.ir import OpKind, Plan, message_bytes
from treeattn.search.evaluate import Evaluator, Schedule
from treeattn.search.search import search
from treeattn.topology.model import Topology
from treeattn.workload import Payload, Workload

__all__ = ["METHODS", "CompareRow", "expand_topologies", "plan_peak_bytes", "plan_bytes_moved", "compare",
           "write_csv", "plot_speedup"]

METHODS = ("planned", "ring-attention", "allreduce3", "allgather-merge")
"""Methods compared, in column order."""

_BRACES = re.compile(r"\{([^{}]*)\}")


def expand_topologies(spec: str, nodes: Sequence[int] | None = None) -> list[str]:
    """Topology specs of a sweep: ``dgx-h100:nodes={1,2,16}`` expands its braces; ``nodes``
    adds ``nodes=N`` to a family name (``dgx-h100`` with [1, 2] gives two specs).

    Args:
        spec: a family spec with optional ``{a,b,...}`` alternatives, a shipped name or a file.
        nodes: node counts for a family spec without braces.

    Returns:
        The specs, in the order written (brace alternatives vary fastest from the right).
    """
    if nodes:
        if "{" in spec:
            raise InputError("give node counts either as --nodes or as braces in --topology, not both")
        if "nodes=" in spec:
            raise InputError(f"--topology {spec!r} already sets nodes; drop --nodes or the nodes= setting")
        sep = "," if ":" in spec else ":"
        return [f"{spec}{sep}nodes={n}" for n in nodes]
    parts = _BRACES.split(spec)
    if len(parts) == 1:
        return [spec]
    options = [[x.strip() for x in alt.split(",") if x.strip()] for alt in parts[1::2]]
    if any(not o for o in options):
        raise InputError(f"--topology {spec!r} has an empty {{}}; write alternatives like nodes={{1,2,16}}")
    out = []
    for combo in itertools.product(*options):
        text = parts[0]
        for value, tail in zip(combo, parts[2::2], strict=True):
            text += value + tail
        out.append(text)
    return out


def plan_bytes_moved(plan: Plan) -> int:
    """Bytes all ranks send under ``plan`` (collectives as their ring implementation sends)."""
    p = plan.ranks
    total = 0
    for prog in plan.programs:
        for op in prog:
            if op.kind is OpKind.SEND:
                total += message_bytes(plan, op)
            elif op.kind is OpKind.COLLECTIVE:
                share = message_bytes(plan, op)
                total += 2 * (p - 1) * share // p if op.coll == "allreduce" else (p - 1) * share
    return total


def plan_peak_bytes(plan: Plan) -> int:
    """The most bytes any rank holds at once under ``plan`` (see the module docstring)."""
    w = plan.workload
    payload = w.payload_bytes
    worst = 0
    for r, prog in enumerate(plan.programs):
        own_kv = w.kv_bytes(r)
        steps: dict[int, list] = {}
        for op in prog:
            steps.setdefault(op.step, []).append(op)
        order = sorted(steps)
        # Foreign KV blocks are held from the step they arrive until their last use (send or compute).
        arrive: dict[int, int] = {}
        last_use: dict[int, int] = {}
        for s in order:
            for op in steps[s]:
                if op.block is None or op.block == r:
                    continue
                if op.kind is OpKind.RECV_COPY:
                    arrive.setdefault(op.block, s)
                last_use[op.block] = max(last_use.get(op.block, s), s)
        delta: dict[int, int] = {}
        for b, a in arrive.items():
            delta[a] = delta.get(a, 0) + w.kv_bytes(b)
            end = max(a, last_use.get(b, a))
            i = bisect.bisect_right(order, end)
            if i < len(order):
                delta[order[i]] = delta.get(order[i], 0) - w.kv_bytes(b)
        peak = held = 0
        for s in order:
            held += delta.get(s, 0)
            recv = 0
            for op in steps[s]:
                if op.kind in (OpKind.RECV_MERGE, OpKind.RECV_COPY) and op.block is None:
                    recv += message_bytes(plan, op)
                elif op.kind is OpKind.COLLECTIVE:
                    share = message_bytes(plan, op)
                    recv += plan.ranks * share if op.coll == "allgather" else share
            peak = max(peak, held + recv)
        worst = max(worst, own_kv + payload + peak)
    return worst


@dataclass(frozen=True, slots=True)
class CompareRow:
    """One method at one (topology, sequence length)."""

    topology: str
    ranks: int
    seq_len: int
    method: str
    predicted_us: float | None
    """Per layer, local compute included; None where the method could not be simulated."""
    speedup_vs_ring: float | None
    """Ring attention's time over this method's."""
    peak_bytes: int | None
    bytes_moved: int | None
    detail: str
    """The planned merge: the family picked; others: the builder."""

    def to_dict(self) -> dict[str, Any]:
        return {"topology": self.topology, "ranks": self.ranks, "seq_len": self.seq_len, "method": self.method,
                "predicted_us": self.predicted_us, "speedup_vs_ring": self.speedup_vs_ring,
                "peak_bytes": self.peak_bytes, "bytes_moved": self.bytes_moved, "detail": self.detail}


def compare(
    topologies: Sequence[Topology],
    seq_lens: Sequence[int],
    make_workload: Callable[[int, int], Payload],
    *,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[CompareRow]:
    """Time the four methods on every topology and sequence length.

    Args:
        topologies: the sweep's topologies (rank counts).
        seq_lens: sequence lengths N in tokens.
        make_workload: ``make_workload(ranks, seq_len)`` gives the decode shape.
        seed: the planner's seed.
        progress: ``progress(done, total, stage)``.

    Returns:
        Rows ordered by topology, then sequence length, then ``METHODS``.
    """
    rows: list[CompareRow] = []
    total = len(topologies) * len(seq_lens)
    done = 0
    for topo in topologies:
        for n in seq_lens:
            w = make_workload(topo.num_ranks, n)
            if not isinstance(w, Workload):
                raise InputError("compare needs a decode shape (--model or --heads/--head-dim), not --bytes")
            res = search(topo, w, seed=seed, top_k=1)
            ev = Evaluator(topo, w)
            plans: dict[str, Plan] = {"planned": res.best}
            times = {"planned": res.best.predicted_us}
            for name in METHODS[1:]:
                plans[name] = ev.plan(Schedule(name, name, {}), 1)
                times[name] = simulate(plans[name], topo, timeline=False).predicted_us
            ring = times["ring-attention"]
            for name in METHODS:
                t = times[name]
                detail = res.candidates[0].algorithm if name == "planned" else name
                rows.append(CompareRow(topo.name, topo.num_ranks, n, name, t, ring / t if t else None,
                                       plan_peak_bytes(plans[name]), plan_bytes_moved(plans[name]), detail))
            done += 1
            if progress is not None:
                progress(done, total, f"{topo.name} N={n}")
    return rows


def write_csv(rows: Sequence[CompareRow], path: Any) -> None:
    """Write the rows as CSV (one line per method), deterministic."""
    import csv

    fields = ["topology", "ranks", "seq_len", "method", "predicted_us", "speedup_vs_ring", "peak_bytes",
              "bytes_moved", "detail"]
    try:
        with open(path, "w", newline="") as fh:
            out = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
            out.writeheader()
            for row in rows:
                out.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v)
                              for k, v in row.to_dict().items()})
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def plot_speedup(rows: Sequence[CompareRow], path: Any) -> None:
    """Line plot of the planned merge's speedup over ring attention against sequence length,
    one line per rank count (and dashed: over the three all-reduces)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by: dict[tuple[int, str], dict[int, dict[str, float]]] = {}
    for r in rows:
        if r.predicted_us is not None:
            by.setdefault((r.ranks, r.topology), {}).setdefault(r.seq_len, {})[r.method] = r.predicted_us
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (ranks, _name), series in sorted(by.items()):
        xs = sorted(series)
        ring = [series[x]["ring-attention"] / series[x]["planned"] for x in xs]
        line = ax.plot(xs, ring, marker="o", label=f"{ranks} ranks: vs ring attention")[0]
        ar3 = [series[x]["allreduce3"] / series[x]["planned"] for x in xs]
        ax.plot(xs, ar3, marker=".", linestyle="--", color=line.get_color(), label=f"{ranks} ranks: vs 3 all-reduces")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("speedup of the planned merge (x)")
    ax.set_title("Predicted per-layer decode attention: planned merge speedup")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
