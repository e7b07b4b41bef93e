"""The ways to merge a sharded decode, side by side (docs/design.md section 2), fairly.

For each topology of a family sweep and each sequence length, every method as a plan timed
by the simulator (per layer, local attention compute included):

* ``tree``: the planner's pick for the result layout (``search``);
* ``ring-attention``: KV blocks rotate, block k's attention overlapping block k + 1's
  transfer, on the topology's ring (``treeattn.search.rings``: along rails where that is
  least loaded; ``ring_order="rank"`` keeps rank order for comparison);
* ``ring``: the ring of partials (reduce-scatter + all-gather; the reduce-scatter alone for
  ``heads``) on the same ring, at its best chunk count;
* ``allreduce2``: all-reduce max, then one library sum (all-reduce, reduce-scatter for
  ``heads``, reduce for ``root``); ``allreduce3``: the paper's three all-reduces;
  ``allgather-merge``: Star Attention;
* ``dcp-ag-rs``, ``dcp-a2a``: vLLM's decode context parallel (they deliver ``heads``).

A method delivers the compared layout where it can, else its own (``CompareRow.result``).
Memory and traffic come off the same plans: ``peak_bytes`` (``treeattn.cost.memory``: the
KV cache of every layer, the query, the partial and what the busiest step holds) and
``bytes_moved`` (bytes all ranks send; a library collective counted as its ring
implementation sends: an all-reduce 2(p-1)/p of its buffer per rank, a reduce-scatter or a
reduce (p-1)/p, an all-gather p-1 shares).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treeattn.cost.memory import DEFAULT_MEM_FRACTION, memory_check
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError
from treeattn.figures import save_figure
from treeattn.plan.builders import ALGORITHMS, build
from treeattn.plan.ir import COLLECTIVE_FORMS, OpKind, Plan, collective_row_bytes, message_bytes
from treeattn.search.evaluate import Evaluator, Schedule, sweep_chunks
from treeattn.search.result import SearchResult
from treeattn.search.rings import ring_order
from treeattn.search.search import search
from treeattn.textfile import keep_foreign_file, write_file
from treeattn.topology.model import Topology
from treeattn.units import format_size
from treeattn.workload import Payload, Workload

__all__ = ["METHODS", "SHORT", "NOTES", "CompareRow", "expand_topologies", "plan_bytes_moved", "compare", "write_csv",
           "plot_speedup", "COMPARE_RING_MAX_RANKS"]

METHODS = ("tree", "ring-attention", "ring", "allreduce2", "allreduce3", "allgather-merge", "dcp-ag-rs", "dcp-a2a")
"""Methods compared, in column order."""
SHORT = {"tree": "tree", "ring-attention": "ringA", "ring": "ring", "allreduce2": "AR2", "allreduce3": "AR3",
         "allgather-merge": "AG+M", "dcp-ag-rs": "AG+RS", "dcp-a2a": "A2A"}
"""Column headers narrow enough for 80 columns."""

NOTES = {"tree": "the planner's pick (the fastest plan its search found)",
         "ring-attention": "ring attention: KV shards go p - 1 hops, overlapping attention",
         "ring": "ring of partials: reduce-scatter + all-gather, best chunk count",
         "allreduce2": "all-reduce max of lse, then one library sum of (w o, w)",
         "allreduce3": "the paper's three all-reduces: max of lse, sums of w o and w",
         "allgather-merge": "all-gather of every partial, merged locally (Star Attention)",
         "dcp-ag-rs": "vLLM DCP: attend, all-gather lse, reduce-scatter",
         "dcp-a2a": "vLLM DCP: one all-to-all of the partials by heads, local merge"}
"""What each method's row assumes, one line of at most 71 characters (the legend of the tables)."""

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
        from treeattn.topology.families import FAMILIES

        name = spec.split(":", 1)[0]
        if name not in FAMILIES:
            raise InputError(f"--nodes needs a family (--topology {', '.join(sorted(FAMILIES))}), not "
                             f"{spec!r}: a shipped topology or file has its node count")
        params = [p.name for p in FAMILIES[name].params]
        if "nodes" not in params:  # gb200-nvl72 grows by racks: 'has no parameter nodes' named a flag not typed
            size = next((p for p in params if p in ("racks", "ranks")), None)
            # racks are counted as nodes are (gb200-nvl72: a rack of 18 nodes); ranks are not
            counts = "{" + ",".join(map(str, nodes)) + "}" if size == "racks" else "{...}"
            how = f"; it grows by {size}: --topology '{name}:{size}={counts}'" if size else ""
            raise InputError(f"--nodes: family {name} has no node count (its parameters: {', '.join(params)}){how}")
        sep = "," if ":" in spec else ":"
        return [f"{spec}{sep}nodes={n}" for n in nodes]
    parts = _BRACES.split(spec)
    if len(parts) == 1:
        return [spec]
    options = [[x.strip() for x in alt.split(",")] for alt in parts[1::2]]
    if any(o == [""] for o in options):
        raise InputError(f"--topology {spec!r} has an empty {{}}; write alternatives like nodes={{1,2,16}}")
    for alt, o in zip(parts[1::2], options, strict=True):
        # {1,,16} is a typo for some count: dropping the empty item would compare one case fewer unsaid
        if "" in o:
            raise InputError(f"--topology {spec!r}: {{{alt}}} has an empty item {o.index('') + 1}; "
                             "write alternatives like nodes={1,2,16}")
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
    w = plan.workload
    for prog in plan.programs:
        for op in prog:
            if op.kind is OpKind.SEND:
                total += message_bytes(plan, op)
            elif op.kind is OpKind.COLLECTIVE:
                start, stop = plan.chunk_range(op.chunk)
                for coll, what in COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].calls:
                    rows = stop - start
                    buf = message_bytes(plan, op) if what == "q" else rows * collective_row_bytes(w, coll, what)
                    if coll == "allgather":
                        total += (p - 1) * buf
                    elif coll == "allreduce":
                        total += 2 * (p - 1) * buf // p
                    else:
                        total += (p - 1) * buf // p
    return total


@dataclass(frozen=True, slots=True)
class CompareRow:
    """One method at one (topology, sequence length)."""

    topology: str
    ranks: int
    seq_len: int
    method: str
    result: str
    """The layout the method delivered (``all``, ``heads``, ``root:R``)."""
    predicted_us: float | None
    """Per layer, local compute included; None where the method could not be built."""
    speedup_of_tree: float | None
    """This method's time over the tree's (how much faster the planned merge is)."""
    peak_bytes: int | None
    bytes_moved: int | None
    fits: bool | None
    """Its peak fits in the devices' memory (``mem_gb`` x the usable fraction); None when the
    method cannot run there at all (``detail`` says why)."""
    detail: str
    """The tree: the family picked; others: the builder and its chunk count."""

    def to_dict(self) -> dict[str, Any]:
        return {"topology": self.topology, "ranks": self.ranks, "seq_len": self.seq_len, "method": self.method,
                "result": self.result, "predicted_us": self.predicted_us, "speedup_of_tree": self.speedup_of_tree,
                "peak_bytes": self.peak_bytes, "bytes_moved": self.bytes_moved, "fits": self.fits,
                "detail": self.detail}


COMPARE_RING_MAX_RANKS = 2048
"""Ring attention's plan holds 3p(p - 1) operations (every rank sends, receives and attends
each of the p - 1 blocks it is passed): building and simulating it took 27 s and 1.5 GB at
1,024 ranks, 141 s and 5.9 GB at 2,048 (12.6 M operations; ``RING_OP_BYTES`` each) on the
2-core development machine, so 4,096 would take about 24 GB. ``compare`` leaves it out above
this many ranks, saying why."""
RING_OP_BYTES = 470
"""Peak memory per operation of a ring-attention plan built and simulated (5.91 GB at 12.6 M)."""


def _method_plan(name: str, topo: Topology, w: Workload, layout: str, root: int | None, ring: list[int],
                 ev: Evaluator) -> Plan:
    """The plan of one compared method (not the tree) for ``layout`` where it builds it.

    Raises:
        InputError: the method cannot run there (too few rows for its chunks, heads that do not
            split), or ring attention above ``COMPARE_RING_MAX_RANKS``.
    """
    if name == "ring-attention" and topo.num_ranks > COMPARE_RING_MAX_RANKS:
        ops = 3 * topo.num_ranks * (topo.num_ranks - 1)
        raise InputError(f"not simulated above {COMPARE_RING_MAX_RANKS:,} ranks: its plan would hold {ops:,} "
                         f"operations (about {format_size(ops * RING_OP_BYTES)} of memory)")
    spec = ALGORITHMS[name]
    result = layout if layout in spec.results else spec.results[0]
    kw: dict[str, Any] = {} if result == "all" else {"result": result}
    if result == "root":
        kw["root"] = root
    if name in ("ring-attention", "ring"):
        kw["order"] = ring
    if name == "ring":
        sched = Schedule("ring", "ring", kw, rows_per_chunk=topo.num_ranks)
        chunks, _ = sweep_chunks(ev, sched, [1, 2, 4, 8, 16, 32])
        return ev.plan(sched, chunks)
    return build(name, w, topo, **kw)


def _tree(topo: Topology, w: Workload, result: str, root: int | None, mem_fraction: float,
          seed: int) -> SearchResult:
    """The planner's pick as ``treeattn plan`` makes it: the fastest schedule that fits. Where
    none fits, the fastest of all, so the tree keeps its row, marked as not fitting like any
    other method's (a refusal that is not about memory is raised again by the second search)."""
    try:
        return search(topo, w, result=result, root=root, mem_fraction=mem_fraction, seed=seed, top_k=1)
    except InputError:
        return search(topo, w, result=result, root=root, mem_fraction=None, seed=seed, top_k=1)


def compare(
    topologies: Sequence[Topology],
    seq_lens: Sequence[int],
    make_workload: Callable[[int, int], Payload],
    *,
    result: str = "all",
    root: int | None = None,
    ring: str = "topology",
    mem_fraction: float = DEFAULT_MEM_FRACTION,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
    skip: Collection[tuple[str, int]] = (),
) -> list[CompareRow]:
    """Time every method on every topology and sequence length.

    Args:
        topologies: the sweep's topologies (rank counts).
        seq_lens: sequence lengths N in tokens.
        make_workload: ``make_workload(ranks, seq_len)`` gives the decode shape.
        result: the layout compared (``all``, ``heads``, ``root``).
        root: the root of ``root``.
        ring: ``topology`` (the ring along rails, ``treeattn.search.rings``) or ``rank``
            (rank order) for ring attention and the ring of partials.
        mem_fraction: the usable share of a device's memory (``fits``; the tree's search
            leaves out schedules that do not fit).
        seed: the planner's seed.
        progress: ``progress(done, total, stage)``.
        skip: (topology name, N) pairs left out (a KV cache that no device could hold).

    Returns:
        Rows ordered by topology, then sequence length, then ``METHODS``.
    """
    if ring not in ("topology", "rank"):
        raise InputError(f"ring order must be topology or rank, got {ring!r}")
    rows: list[CompareRow] = []
    total = sum(1 for t in topologies for n in seq_lens if (t.name, n) not in skip)
    done = 0
    for topo in topologies:
        order = ring_order(topo)[1] if ring == "topology" else list(range(topo.num_ranks))
        for n in seq_lens:
            if (topo.name, n) in skip:
                continue
            w = make_workload(topo.num_ranks, n)
            if not isinstance(w, Workload):
                raise InputError("compare needs a decode shape (--model or --heads/--head-dim), not --bytes")
            ev = Evaluator(topo, w)
            res = _tree(topo, w, result, root, mem_fraction, seed)
            plans: dict[str, Plan | None] = {"tree": res.best}
            details = {"tree": res.candidates[0].algorithm}
            for name in METHODS[1:]:
                try:
                    plans[name] = _method_plan(name, topo, w, result, root, order, ev)
                    details[name] = f"{name} x{plans[name].chunks}" if name == "ring" else name
                except InputError as exc:
                    plans[name], details[name] = None, str(exc)
            times = {m: (None if pl is None else simulate(pl, topo, timeline=False).predicted_us)
                     for m, pl in plans.items()}
            tree = times["tree"]
            for name in METHODS:
                pl, t = plans[name], times[name]
                mem = None if pl is None else memory_check(pl, topo, mem_fraction)
                rows.append(CompareRow(topo.name, topo.num_ranks, n, name, "-" if pl is None else pl.result, t,
                                       t / tree if t and tree else None, None if mem is None else mem.peak_bytes,
                                       None if pl is None else plan_bytes_moved(pl),
                                       None if mem is None else mem.fits, details[name]))
            done += 1
            if progress is not None:
                progress(done, total, f"{topo.name} N={n}")
    return rows


def check_csv_path(path: Path) -> None:
    """Refuse to write the rows over a regular file that is not a ``compare --csv`` file (its
    header this one's): someone's own CSV at that path would be lost for good."""

    def ours(path: Path) -> bool:
        with path.open("rb") as f:
            head = f.readline(64 * 1024).decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
        return (head + ",").startswith(_CSV_HEAD)  # every version's rows begin so

    keep_foreign_file(path, ours, "compare CSV", f"its header does not begin {_CSV_HEAD[:-1]}", "rows")


_CSV_HEAD = "topology,ranks,seq_len,method,"
"""How a ``compare --csv`` file's header begins, in this version and the earlier ones."""


def write_csv(rows: Sequence[CompareRow], path: Any) -> None:
    """Write the rows as CSV (one line per method), deterministic."""
    import csv
    import io

    fields = list(CompareRow.__slots__)
    text = io.StringIO()
    out = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    out.writeheader()
    for row in rows:
        out.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v)
                      for k, v in row.to_dict().items()})
    try:
        write_file(path, text.getvalue())
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def plot_speedup(rows: Sequence[CompareRow], path: Any) -> None:
    """Line plot of the tree's speedup over ring attention against sequence length, one line
    per rank count (and dashed: over the two all-reduces)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by: dict[tuple[int, str], dict[int, dict[str, float]]] = {}
    for r in rows:
        if r.predicted_us is not None:
            by.setdefault((r.ranks, r.topology), {}).setdefault(r.seq_len, {})[r.method] = r.predicted_us
    fig, ax = plt.subplots(figsize=(7, 4.5))
    counts = [ranks for ranks, _ in by]
    for (ranks, name), series in sorted(by.items()):
        # topologies of one rank count are told apart by name
        who = f"{ranks} ranks" + (f" ({name})" if counts.count(ranks) > 1 else "")
        xs = sorted(x for x in series if "ring-attention" in series[x])
        ring = [series[x]["ring-attention"] / series[x]["tree"] for x in xs]
        line = ax.plot(xs, ring, marker="o", label=f"{who}: vs ring attention")[0]
        xs2 = sorted(x for x in series if "allreduce2" in series[x])
        ar2 = [series[x]["allreduce2"] / series[x]["tree"] for x in xs2]
        ax.plot(xs2, ar2, marker=".", linestyle="--", color=line.get_color(), label=f"{who}: vs 2 all-reduces")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("speedup of the planned merge (x)")
    ax.set_title("Predicted per-layer decode attention: planned merge speedup")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
