"""``treeattn plan`` (search for the fastest schedule, or build a named one) and ``treeattn
compare`` (the planned merge against ring attention, three all-reduces and all-gather)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from treeattn.cli import app
from treeattn.cli.lists import int_items
from treeattn.cli.options import (
    BatchOpt,
    BytesOpt,
    HeadDimOpt,
    HeadsOpt,
    JsonOpt,
    KvDtypeOpt,
    KvHeadsOpt,
    KvLatentOpt,
    LayersOpt,
    ModelOpt,
    OpOpt,
    PartialDtypeOpt,
    RanksOpt,
    SeqLenOpt,
    SplitOpt,
    TopologyOpt,
    VHeadDimOpt,
    WorkloadFileOpt,
    load_topology,
    make_payload,
    parse_ranks,
    print_models,
)
from treeattn.cli.paths import OUT_PATH, output_file, safe_name
from treeattn.cli.progress import progress_reporter
from treeattn.cli.render import (
    console,
    key_columns,
    note_attention,
    plan_title,
    print_rates_note,
    searched_family,
    warn_payload,
    warn_topology,
)
from treeattn.cost.memory import DEFAULT_MEM_FRACTION
from treeattn.errors import InfeasiblePlanError, InputError, KVCacheTooLargeError
from treeattn.units import counted, fixed, format_size
from treeattn.workload import Payload, Workload, empty_ranks_note, latent_value_note

_ALG = "Named algorithm (instead of the search)"
_SEARCH = "Search"
_OUT = "Output"

AlgorithmOpt = Annotated[
    str | None,
    typer.Option("--algorithm", "-a", help="Build this algorithm instead of searching; 'list' shows them all.",
                 rich_help_panel=_ALG),
]


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, sort_keys=True, indent=2))


def _tokens(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def default_plan_path(topo_name: str, payload: Payload, algorithm: str | None = None) -> Path:
    """``plans/local/TOPOLOGY.MODEL.bB.nN[.ALGORITHM].yaml`` (raw payloads: ``TOPOLOGY.raw-SIZE.OP``):
    beside the shipped plans, in the folder the repository's ``.gitignore`` leaves to the user."""
    if isinstance(payload, Workload):
        what = payload.model or (f"h{payload.q_heads}-kv{payload.kv_heads}-d{payload.head_dim}"
                                 + ("" if payload.v_head_dim is None else f"-dv{payload.value_dim}")
                                 + ("-latent" if payload.kv_latent else ""))
        stem = f"{safe_name(topo_name)}.{what}.b{payload.batch}.n{_tokens(payload.seq_len)}"
    else:
        stem = f"{safe_name(topo_name)}.raw-{payload.nbytes}.{payload.op.value}"
    if algorithm:
        stem += f".{safe_name(algorithm)}"
    return Path("plans") / "local" / f"{stem}.yaml"


def _build_kwargs(p: int, *, root, fanout, groups, order, parents, roots, trees, shape, intra, inter,
                  result, group_size, whole_rows=False, algorithm: str = "") -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if whole_rows:
        kw["whole_rows"] = True
    if root is not None:
        kw["root"] = root
    if fanout is not None:
        kw["fanout"] = fanout
    if groups is not None:
        kw["groups"] = [list(parse_ranks(g, p, what="--groups")) for g in groups.split("/")]
    if order is not None:
        kw["order"] = list(parse_ranks(order, p, what="--order"))
    if parents is not None:
        from treeattn.plan.trees import check_parents

        lists = [int_items(x, "--parents") for x in parents.split("/")]
        for one in lists:  # said with the flag, as its items are (the builder's words name no flag)
            try:
                check_parents(one, p)
            except InfeasiblePlanError as exc:
                raise InputError(f"--parents {parents!r}: {exc}") from None
        if algorithm == "multirail":  # a list of trees, one a rail, however many
            kw["parents"] = lists
        elif len(lists) > 1:
            raise InputError(f"--parents {parents!r}: {algorithm or 'this algorithm'} takes one parent list; '/' "
                             "separates the trees of multirail")
        else:
            kw["parents"] = lists[0]
    if roots is not None:
        kw["roots"] = list(parse_ranks(roots, p, what="--roots"))
    for key, value in (("trees", trees), ("shape", shape), ("intra", intra), ("inter", inter),
                       ("group_size", group_size)):
        if value is not None:
            kw[key] = value
    if result is not None:
        kw["result"] = result
    return kw


def _algorithm_list(json_out: bool) -> None:
    from treeattn.plan.builders import ALGORITHMS

    if json_out:
        _echo_json({name: spec.to_dict() for name, spec in ALGORITHMS.items()})
        return
    con = console()
    con.print("[bold]Algorithms[/] (treeattn plan --algorithm NAME; parameters are flags: --root, --fanout, ...)")
    for name, spec in ALGORITHMS.items():
        kind = "baseline" if spec.is_baseline else "schedule"
        con.print(f"\n[bold]{name}[/] ({kind}; {', '.join(spec.payloads)} payloads): {spec.description}")
        for prm in spec.params:
            con.print(f"    {prm.name:<11} {prm.description}")
    con.print("\nWith --result heads, --whole-rows builds an algorithm's all plan in one chunk instead, each "
              "rank keeping its own heads.")


_MEM_COUNTS = ("A rank's peak counts its KV cache (every layer), the query, partials and receive buffers; the "
               "rest of the memory is left for what it does not count, the model's weights and activations: lower "
               "this to leave them more room (a model preset's weights, sharded over the ranks, are warned about "
               "where they fit neither there nor beside the plan's peak within this share).")


@app.command("plan")
def plan_cmd(
    topology: TopologyOpt = None,
    ranks: RanksOpt = None,
    workload_file: WorkloadFileOpt = None,
    model: ModelOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    v_head_dim: VHeadDimOpt = None,
    kv_latent: KvLatentOpt = None,
    batch: BatchOpt = None,
    seq_len: SeqLenOpt = None,
    split: SplitOpt = None,
    kv_dtype: KvDtypeOpt = None,
    partial_dtype: PartialDtypeOpt = None,
    layers: LayersOpt = None,
    nbytes: BytesOpt = None,
    op: OpOpt = None,
    algorithm: AlgorithmOpt = None,
    root: Annotated[int | None, typer.Option("--root", help="Root rank of a tree.", rich_help_panel=_ALG)] = None,
    fanout: Annotated[int | None, typer.Option("--fanout", help="k of a k-ary tree.", rich_help_panel=_ALG)] = None,
    chunks: Annotated[int | None, typer.Option("--chunks", help="Row chunks to pipeline (default 1).",
                                               rich_help_panel=_ALG)] = None,
    groups: Annotated[str | None, typer.Option("--groups", help="hierarchical: groups split by '/', e.g. 0-7/8-15.",
                                               rich_help_panel=_ALG)] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", help="hierarchical: consecutive ranks per group.",
                                                   rich_help_panel=_ALG)] = None,
    order: Annotated[str | None, typer.Option("--order", help="Rank at each position: 0,8,1,9,...",
                                              rich_help_panel=_ALG)] = None,
    parents: Annotated[str | None, typer.Option("--parents", help="tree: parent per rank, -1 at the root "
                                                "(multirail: one list per tree, split by '/').",
                                                rich_help_panel=_ALG)] = None,
    roots: Annotated[str | None, typer.Option("--roots", help="multirail: root of each tree.",
                                              rich_help_panel=_ALG)] = None,
    trees: Annotated[int | None, typer.Option("--trees", help="multirail: number of trees.",
                                              rich_help_panel=_ALG)] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="multirail/broadcast: star, chain, kary, binomial.",
                                              rich_help_panel=_ALG)] = None,
    intra: Annotated[str | None, typer.Option("--intra", help="hierarchical: shape inside a group.",
                                              rich_help_panel=_ALG)] = None,
    inter: Annotated[str | None, typer.Option("--inter", help="hierarchical: shape across leaders.",
                                              rich_help_panel=_ALG)] = None,
    whole_rows: Annotated[bool, typer.Option("--whole-rows", help="With --result heads: the algorithm's all "
                                             "plan in one chunk, each rank keeping its own heads.",
                                             rich_help_panel=_ALG)] = False,
    result: Annotated[str, typer.Option("--result", help="all (every rank gets every row), heads (each rank its "
                                        "own query heads: a tensor-parallel o_proj's input) or root[:R] (rank R "
                                        "only, default 0).")] = "all",
    mem_fraction: Annotated[float, typer.Option("--mem-fraction", help="Share of each device's memory (mem_gb) a "
                                                "rank may use; schedules that need more are left out. " + _MEM_COUNTS
                                                )] = DEFAULT_MEM_FRACTION,
    top: Annotated[int, typer.Option("--top", help="Candidates shown.", rich_help_panel=_SEARCH)] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the local-improvement moves.",
                                      rich_help_panel=_SEARCH)] = 0,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                  help="Progress on stderr: a bar on a terminal, else a line "
                                                  "every 10 s (default: on).",
                                                  rich_help_panel=_SEARCH)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", **OUT_PATH,
                                             help="Plan file to write (default under plans/); a file there "
                                                  "that is not a plan is left alone and the command refused.",
                                             rich_help_panel=_OUT)] = None,
    explicit: Annotated[bool, typer.Option("--explicit", help="List every op even in a big plan (which is "
                                           "written compact otherwise: its builder and params, expanded when "
                                           "read).", rich_help_panel=_OUT)] = False,
    json_out: JsonOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Draw the chosen tree and its per-level cost.",
                                          rich_help_panel=_OUT)] = False,
) -> None:
    """Find the fastest merge schedule for a decode shape on a topology and write it as a plan.

    With --algorithm NAME the named algorithm's plan is built instead (no search); a raw
    payload (--bytes N --op sum) plans a plain sum all-reduce the same way.
    """
    if algorithm == "list":
        _algorithm_list(json_out)
        return
    if model == "list":
        print_models(json_out)
        return
    if top < 1:
        raise InputError(f"--top must be at least 1, got {top}")
    if chunks is not None and chunks < 1:
        raise InputError(f"--chunks must be at least 1, got {chunks}")
    topo = load_topology(topology, ranks)
    payload = make_payload(topo.num_ranks, workload_file=workload_file, model=model, heads=heads,
                           kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim, kv_latent=kv_latent,
                           batch=batch, seq_len=seq_len, split=split,
                           kv_dtype=kv_dtype, partial_dtype=partial_dtype, layers=layers, nbytes=nbytes, op=op)
    alg_flags = {"--root": root, "--fanout": fanout, "--chunks": chunks, "--groups": groups,
                 "--group-size": group_size, "--order": order,
                 "--parents": parents, "--roots": roots, "--trees": trees, "--shape": shape, "--intra": intra,
                 "--inter": inter, "--whole-rows": True if whole_rows else None}
    from treeattn.cost.library import host_search_note, link_rates_note
    from treeattn.cost.memory import check_kv_fits, unknown_memory_note, weights_note
    from treeattn.plan.baselines import parse_result

    layout, result_root = parse_result(result, topo.num_ranks, what="--result")
    check_kv_fits(payload, topo, mem_fraction)
    if algorithm is None:
        given = sorted(k for k, v in alg_flags.items() if v is not None)
        if given:
            raise InputError(f"{', '.join(given)} set(s) a named algorithm's parameters; add --algorithm NAME "
                             "(see --algorithm list) or drop them to search")
    default = default_plan_path(topo.name, payload, algorithm)
    path = output_file(out if out is not None else default, "--out", default.name, kind="plan")
    from treeattn.plan.io import check_plan_path

    check_plan_path(path)  # before the search: a long one would end in this refusal

    def say_notes() -> None:
        # Once the arguments passed (a refused one is the one line on stderr): before a search,
        # after a named algorithm's build, which checks its own parameters.
        warn_topology(topo)
        warn_payload(payload)
        note_attention(topo, payload)
        if note := unknown_memory_note(payload, topo):
            typer.echo(f"note: {note}", err=True)
        if note := host_search_note(topo, topology, raw=not isinstance(payload, Workload)):
            typer.echo(f"note: {note}", err=True)

    started = time.perf_counter()
    if algorithm is None:
        from treeattn.search import search

        say_notes()
        with progress_reporter(progress, "planning") as update:
            res = search(topo, payload, result=layout, root=result_root, mem_fraction=mem_fraction, seed=seed,
                         top_k=top, progress=update)
        plan, report = res.best, res.to_dict()
    else:
        from treeattn.api import named_plan, node_groups
        from treeattn.plan.builders import ALGORITHMS, build_root

        conflict = f"--root {root} and --result {result} name different roots"
        root = build_root(algorithm, result, result_root, root, conflict)
        if whole_rows and algorithm in ALGORITHMS and "all" not in ALGORITHMS[algorithm].results:
            raise InputError(f"--whole-rows keeps each rank's own heads of an all plan; {algorithm} builds "
                             f"no all plan")
        if whole_rows and layout != "heads":
            raise InputError(f"--whole-rows keeps each rank's own heads of an all plan: add --result heads "
                             f"(not {result})")
        if whole_rows and chunks not in (None, 1):
            raise InputError(f"--whole-rows sends every row in one message: --chunks must be 1, not {chunks}")
        kw = _build_kwargs(topo.num_ranks, root=root, fanout=fanout,
                           groups=groups, order=order, parents=parents, roots=roots, trees=trees, shape=shape,
                           intra=intra, inter=inter, result=layout,
                           group_size=group_size, whole_rows=whole_rows, algorithm=algorithm)
        if algorithm == "hierarchical" and groups is None and group_size is None:
            kw["groups"] = node_groups(topo)
        try:
            plan, report = named_plan(topo, payload, algorithm, chunks, kw, mem_fraction)
        except InputError as exc:  # a builder names its parameter as the API does: here it is a flag
            name, _, rest = str(exc).partition(" ")
            if name in (*kw, "chunks") and rest.startswith("must "):
                raise type(exc)(f"--{name.replace('_', '-')} {rest}") from None
            raise
        say_notes()
        from treeattn.plan.bits import bit_groups, different_bits_note

        # The search leaves such schedules out; a named one is written, and said so.
        if split := bit_groups(plan):
            typer.echo(f"warning: {plan.algorithm} plan: {different_bits_note(split)} (treeattn verify says "
                       "the same)", err=True)
    elapsed = time.perf_counter() - started
    if note := weights_note(payload, topo, mem_fraction, peak_bytes=report["best"]["peak_bytes"]):
        typer.echo(f"warning: {note}", err=True)
    from dataclasses import replace

    from treeattn.plan.io import save_plan
    from treeattn.topology.library import recorded_source

    spec = topology if ranks is None else f"{topology}[ranks {ranks.replace(' ', '')}]"
    plan = replace(plan, topology=replace(plan.topology, source=recorded_source(spec, topo, path)))
    try:
        save_plan(plan, path, compact=False if explicit else None)
    except OSError as exc:
        raise InputError(f"cannot write plan {str(path)!r}: {exc.strerror or exc}") from None
    report["plan_path"] = str(path)
    report["topology"] = {"name": topo.name, "fingerprint": topo.fingerprint, "ranks": topo.num_ranks,
                          "link_rates_note": link_rates_note(topo)}  # what the text prints above the table
    report["workload"] = payload.to_dict()
    explanation = None
    if explain:
        from treeattn.search.explain import explain as explain_plan

        explanation = explain_plan(plan, topo)
        report["explain"] = explanation.to_dict()
    if json_out:
        _echo_json(report)
        return
    _print_report(report, topo, payload, elapsed, algorithm is None, plan.result)
    if searched_family(plan) is not None:
        # The table names the candidate by its family; simulate and run by the plan's builder.
        console().print(f"  the plan file: {plan_title(plan)}")
    if explanation is not None:
        _print_explanation(explanation, topo)


def _short(params: dict[str, Any], limit: int = 72) -> str:
    """The parameters as ``key=value`` within ``limit`` characters: whole entries only, the
    rest counted (the plan file and --json hold them all)."""
    parts = []
    for k, v in params.items():
        text = json.dumps(v, separators=(",", ":")) if not isinstance(v, str) else v
        if len(text) > 24:
            text = text[:21] + "..."
        parts.append(f"{k}={text}")
    shown: list[str] = []
    for i, part in enumerate(parts):
        more = f" (+{len(parts) - i} more)"
        if len(" ".join([*shown, part])) + (len(more) if i < len(parts) - 1 else 0) > limit:
            return " ".join([*shown, more.strip()])
        shown.append(part)
    return " ".join(shown)


_BASELINE_NAMES = {"allreduce3_nccl_us": "3 all-reduces", "allreduce2_us": "2 all-reduces (max, then sum)",
                   "allreduce_nccl_us": "library collective", "allgather_merge_us": "all-gather + merge",
                   "dcp_ag_rs_us": "vLLM DCP all-gather + reduce-scatter", "dcp_a2a_us": "vLLM DCP all-to-all",
                   "ring_attention_us": "ring attention (the topology's ring)"}


def _print_report(report: dict[str, Any], topo, payload: Payload, elapsed: float, searched: bool,
                  result: str = "all") -> None:
    con = console()
    base = report["baselines"]
    ref_key = next((k for k in ("allreduce3_nccl_us", "allreduce2_us", "allreduce_nccl_us") if base.get(k)), None)
    ref = base.get(ref_key) if ref_key else None
    ref_name = _BASELINE_NAMES.get(ref_key, "baseline").split(" (")[0]
    what = (f"{_dims(payload)} N={payload.seq_len}" if isinstance(payload, Workload)
            else f"{format_size(payload.nbytes)} {payload.op.value}")
    con.print(f"[bold]{escape(topo.name)}[/] ({counted(topo.num_ranks, 'rank')}), {what}, result {result}: partial "
              f"{format_size(payload.payload_bytes)} per rank")
    print_rates_note(con, topo)
    # Say what a figure covers: one layer, not the decode step (the plan file's predicted_us).
    covers = ("one layer, local attention included" if isinstance(payload, Workload)
              else "one reduction of the payload")
    title = "Candidates (fastest first)" if searched else "Plan"
    table = key_columns(Table(title=f"{title}; predicted µs: {covers}"), 2)
    for col in ("#", "algorithm", "parameters", "chunks", "predicted µs", "x bound", f"x {ref_name}"):
        # a ratio's "x" stays on its line with what it divides by (run's "× plan" likewise)
        table.add_column(col, justify="right" if col not in ("algorithm", "parameters") else "left",
                         no_wrap=col.startswith("x "))
    for i, c in enumerate(report["candidates"], 1):
        table.add_row(str(i), c["algorithm"], _short(c["params"]), str(c["chunks"]), fixed(c['predicted_us']),
                      fixed(c['ratio_to_bound'], 3) if c["ratio_to_bound"] else "-",
                      fixed(c['predicted_us'] / ref, 3) if ref else "-")
    con.print(table)
    if result == "heads":
        con.print("chunks: pieces of each rank's rows (the plan file's chunks counts every rank's)")
    best = report["best"]["predicted_us"]
    con.print(f"lower bound {fixed(report['lower_bound_us'])} µs; the baselines, predicted:")
    peaks = report.get("baseline_peak_bytes", {})
    for key, v in base.items():
        label = _BASELINE_NAMES.get(key, key)
        mem = f", {format_size(peaks[key])} a rank" if peaks.get(key) else ""
        con.print(f"  {label} {fixed(v)} µs ({fixed(v / best)}x the plan's time{mem})" if v
                  else f"  {label}: not simulated")
    peak, limit = report["best"].get("peak_bytes"), report.get("memory_limit_bytes")
    if peak:
        usable = f" of the {format_size(limit)} it may use" if limit else ""
        con.print(f"memory: the plan's fullest rank (nearest its limit) holds {format_size(peak)}{usable}")
    for x in report.get("left_out", []):
        kind = "baseline" if x.get("baseline") else "schedule"
        why = "bits differ" if x.get("reason") == "bits" else "does not fit"
        con.print(f"[yellow]left out ({kind}, {why}):[/] {x['algorithm']} {fixed(x['predicted_us'])} µs "
                  f"- {escape(x['why'])}" if "predicted_us" in x else
                  f"[yellow]does not fit:[/] {x['algorithm']} - {escape(x['why'])}")
    if searched:
        st = report["stats"]
        skipped = f", {st['pruned']} skipped by their floor" if st.get("pruned") else ""
        con.print(f"searched {st['schedules']} schedules ({st['simulations']} simulations{skipped}) in {elapsed:.2f} s")
    con.print(f"wrote {escape(str(report['plan_path']))}")


def _print_explanation(ex, topo) -> None:
    con = console()
    limit = 64
    for t, par in enumerate(ex.trees[:4]):
        kids: dict[int, list[int]] = {}
        root = 0
        for r, q in enumerate(par):
            if q < 0:
                root = r
            else:
                kids.setdefault(q, []).append(r)
        title = f"tree {t} of {len(ex.trees)}" if len(ex.trees) > 1 else "tree"
        tree = Tree(f"[bold]{title}[/]: root rank {root} ({topo.ranks[root]})")
        shown = 0
        stack = [(tree, root)]
        while stack and shown < limit:
            node, r = stack.pop(0)
            for c in kids.get(r, []):
                if shown >= limit:
                    break
                kinds = sorted({topo.links[i].kind.value for i in topo.route(c, r)})
                stack.append((node.add(f"rank {c} ({topo.ranks[c]}) via {'+'.join(kinds)}"), c))
                shown += 1
        if shown < len(par) - 1:
            tree.add(f"... {len(par) - 1 - shown} more ranks")
        con.print(tree)
    if len(ex.trees) > 4:
        con.print(f"... and {len(ex.trees) - 4} more trees")
    table = Table(title=f"Per-level cost ({ex.algorithm}, {fixed(ex.predicted_us)} µs)")
    for col in ("phase", "level", "transfers", "bytes", "start µs", "end µs", "span µs", "links"):
        table.add_column(col, justify="left" if col in ("phase", "links") else "right")
    for lv in ex.levels:
        table.add_row(lv.phase, str(lv.level), str(lv.transfers), format_size(lv.bytes), fixed(lv.start_us),
                      fixed(lv.end_us), fixed(lv.span_us), ", ".join(lv.links))
    con.print(table)


_SEQ_LENS = "-n/--seq-len/--seq-lens"
"""compare's lengths option by all its names, for its errors (click does not say which was typed)."""


@app.command("compare")
def compare_cmd(
    topology: TopologyOpt = None,
    nodes: Annotated[str | None, typer.Option("--nodes", help="Node counts of a family: 1,2,4,16.",
                                              rich_help_panel="Topology")] = None,
    seq_lens: Annotated[str | None, typer.Option("--seq-lens", "--seq-len", "-n", show_default=False,
                                                 help="Sequence lengths in tokens, comma-separated: 128K,1M "
                                                 "(K = 1024; -n and --seq-len as plan's, one length or several); a "
                                                 "length whose KV cache fits no device is left out, and said. "
                                                 "Default: the --workload file's own length (and split), else "
                                                 "128K,1M.")] = None,
    workload_file: WorkloadFileOpt = None,
    model: ModelOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    v_head_dim: VHeadDimOpt = None,
    kv_latent: KvLatentOpt = None,
    batch: BatchOpt = None,
    kv_dtype: KvDtypeOpt = None,
    partial_dtype: PartialDtypeOpt = None,
    layers: LayersOpt = None,
    result: Annotated[str, typer.Option("--result", help="Layout compared: all, heads or root[:R] (each method "
                                        "delivers it where it can, else its own).")] = "all",
    ring: Annotated[str, typer.Option("--ring", help="Ring of ring attention and of the ring of partials: "
                                      "topology (along rails) or rank (rank order).")] = "topology",
    mem_fraction: Annotated[float, typer.Option("--mem-fraction", help="Share of each device's memory (mem_gb) "
                                                "a rank may use: methods whose peak is over it are marked, lengths "
                                                "whose KV cache alone is over it left out. " + _MEM_COUNTS
                                                )] = DEFAULT_MEM_FRACTION,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the planner.")] = 0,
    csv: Annotated[Path | None, typer.Option("--csv", **OUT_PATH,
                                             help="Write the rows as CSV.", rich_help_panel=_OUT)] = None,
    png: Annotated[Path | None, typer.Option("--png", **OUT_PATH, help="Plot speedup against sequence length.",
                                             rich_help_panel=_OUT)] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="Progress on stderr: a bar on "
                                                  "a terminal, else a line every 10 s (default: on).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Per-layer decode attention time, peak memory and bytes moved of the planned merge (tree)
    against ring attention, the ring of partials, two and three all-reduces, all-gather +
    merge and vLLM's decode context parallel, over sequence lengths and rank counts."""
    from treeattn.cost.library import link_rates_note
    from treeattn.cost.memory import check_fraction, check_kv_fits, unknown_memory_note, weights_note
    from treeattn.plan.baselines import parse_result
    from treeattn.search.compare import check_csv_path, compare, expand_topologies, plot_speedup, write_csv
    from treeattn.search.workload_file import file_length, parse_tokens

    if model == "list":
        print_models(json_out)
        return
    if topology is None:
        raise InputError("give --topology: a family (dgx-h100 --nodes 1,2,16 or dgx-h100:nodes={1,2,16}), "
                         "a shipped name or a YAML file")
    if ring not in ("topology", "rank"):
        raise InputError(f"--ring must be topology or rank, got {ring!r}")
    node_counts = int_items(nodes, "--nodes", least=1) if nodes else None
    # A workload file's own length (and its split, uneven or not) is compared where no flag
    # gives lengths: it was replaced by the default lengths, its split evenly redistributed.
    own = file_length(workload_file) if seq_lens is None and workload_file is not None else None
    if seq_lens is None:
        seq_lens = str(own) if own is not None else "128K,1M"
    # Named by all three of its names (-n 128K is as likely typed as --seq-lens 128K,1M); one
    # length is worded as plan words its -n, several say which item is wrong.
    items = seq_lens.split(",")
    lens = [parse_tokens(x, where=_SEQ_LENS if len(items) == 1 else f"{_SEQ_LENS} {seq_lens!r}: item {i}")
            for i, x in enumerate(items, 1)]
    if not lens or any(n < 1 for n in lens):
        raise InputError(f"{_SEQ_LENS} must name positive token counts, got {seq_lens!r}")
    topos = [load_topology(s) for s in expand_topologies(topology, node_counts)]
    # A repeat would be compared twice: the table shows it once, --json and --csv twice.
    for what, given, values in (("--nodes", nodes, node_counts or []), (_SEQ_LENS, seq_lens, lens),
                                ("--topology", topology, [t.name for t in topos])):
        dup = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if dup is not None:
            raise InputError(f"{what} {given!r} names {dup} twice")
    # Two names of one machine (a shipped file and the family member it is, or a copy of a
    # file) would be compared twice too, with the same figures under each name: the
    # fingerprint covers all that determines costs and no names.
    first: dict[str, str] = {}
    for t in topos:
        other = first.setdefault(t.fingerprint, t.name)
        if other != t.name:
            raise InputError(f"--topology {topology!r} names one machine twice: {other} and {t.name} are the "
                             f"same topology ({t.fingerprint}); give one of them")
    csv = output_file(csv, "--csv", "compare.csv", kind="CSV") if csv is not None else None
    if csv is not None:
        check_csv_path(csv)
    png = output_file(png, "--png", "compare.png", suffix=".png") if png is not None else None

    said: set[str] = set()

    def make(p: int, n: int) -> Payload:
        return make_payload(p, workload_file=workload_file, model=model, heads=heads, kv_heads=kv_heads,
                            head_dim=head_dim, v_head_dim=v_head_dim, kv_latent=kv_latent, batch=batch,
                            seq_len=None if own is not None else str(n), kv_dtype=kv_dtype,
                            partial_dtype=partial_dtype, layers=layers, length_flag=_SEQ_LENS, said=said)

    layout, root = "all", None
    check_fraction(mem_fraction)  # a bad fraction is not a KV cache that fits nowhere (below)
    unfit: dict[tuple[str, int], str] = {}  # (topology, N) whose KV cache alone no device holds
    built: dict[tuple[str, int], Payload] = {}
    for t in topos:  # fail on a bad shape, layout or memory before the long part
        for n in lens:
            try:  # a KV cache past any device's memory is refused as the workload is made
                at = built[(t.name, n)] = make(t.num_ranks, n)
            except KVCacheTooLargeError as exc:
                unfit[(t.name, n)] = f"N={_tokens(n)}: {exc}"
                continue
            try:
                check_kv_fits(at, t, mem_fraction)
            except InputError as exc:
                unfit[(t.name, n)] = f"N={_tokens(n)}: {exc}"
    if len(unfit) == len(topos) * len(lens):
        raise InputError(next(iter(unfit.values())) if len(unfit) == 1 else
                         f"no sequence length fits any topology; {next(iter(unfit.values()))}")
    shape = next(iter(built.values()))
    shapes = {t.name: next((at for (name, _), at in built.items() if name == t.name), shape) for t in topos}
    for t in topos:
        w = shapes[t.name]
        layout, root = parse_result(result, t.num_ranks, on=t.name, what="--result")
        if layout == "heads" and isinstance(w, Workload) and t.num_ranks > w.q_heads:
            raise InputError(f"--result heads gives every rank its own query heads: {counted(w.q_heads, 'head')} "
                             f"cannot go to {t.num_ranks} ranks of {t.name}")
    if note := latent_value_note(shape):  # once the arguments passed: a refused one is the one line on stderr
        typer.echo(f"warning: {note}", err=True)
    for t in topos:
        warn_topology(t)
        note_attention(t, shapes[t.name])
        if note := unknown_memory_note(shapes[t.name], t):
            typer.echo(f"note: {note}", err=True)
        for n in lens:
            at = built.get((t.name, n))
            if at is not None and (note := empty_ranks_note(at)):  # each rank count and length its own
                typer.echo(f"warning: {t.name}: {note}", err=True)
    with progress_reporter(progress, "comparing") as update:
        rows = compare(topos, lens, make, result=layout, root=root, ring=ring, mem_fraction=mem_fraction,
                       seed=seed, progress=update, skip=unfit)
    for t in topos:  # at the longest length it compares, beside the planned merge's peak there
        tree = [r for r in rows if r.topology == t.name and r.method == "tree"]
        longest = max(tree, key=lambda r: r.seq_len, default=None)
        if longest is not None and (note := weights_note(make(t.num_ranks, longest.seq_len), t, mem_fraction,
                                                         peak_bytes=longest.peak_bytes)):
            typer.echo(f"warning: {t.name}: {note}", err=True)
    if csv is not None:
        write_csv(rows, csv)
    if png is not None:
        plot_speedup(rows, png)
    if json_out:
        # The shape the rows share: what the text's "workload:" line says (length and ranks are the rows').
        common = {k: v for k, v in shape.to_dict().items() if k not in ("seq_len", "split", "ranks")}
        _echo_json({"workload": common, "rows": [r.to_dict() for r in rows], "csv": None if csv is None else str(csv),
                    "png": None if png is None else str(png),
                    "left_out": [{"topology": t, "seq_len": n, "why": why} for (t, n), why in unfit.items()],
                    "link_rates_notes": {t.name: note for t in topos if (note := link_rates_note(t))}})
        return
    _compare_tables(rows, result, ring, _shape(shape))
    con = console()
    for why in unfit.values():
        con.print(f"left out, the KV cache does not fit: {why}", markup=False)
    for t in topos:
        print_rates_note(con, t, f"{t.name}:\n" if len(topos) > 1 else "")
    for path in (csv, png):
        if path is not None:
            con.print(f"wrote {escape(str(path))}")


def _shape(payload: Payload) -> str:
    """What ``compare`` compared, but the length its rows give: ``B=4 Hq=128 Hkv=1 D=576 Dv=512
    (latent), bf16 cache, fp32 partials, 61 layers``, or a raw payload's size and op."""
    if not isinstance(payload, Workload):
        return f"{format_size(payload.nbytes)} {payload.dtype.value} {payload.op.value} a rank"
    w = payload
    return f"{_dims(w)}, {w.kv_dtype.value} cache, {w.partial_dtype.value} partials, {counted(w.layers, 'layer')}"


def _compare_tables(rows, result: str, ring: str, shape: str = "") -> None:  # noqa: ANN001 - CompareRows
    """One narrow table per metric (time, the tree's speedup, peak memory, bytes moved); ``shape``
    (``_shape``) heads them."""
    from rich import box

    from treeattn.search.compare import METHODS, NOTES, SHORT

    con = console()
    by: dict[tuple[str, int], dict[str, Any]] = {}
    names: dict[int, list[str]] = {}
    for r in rows:
        by.setdefault((r.topology, r.seq_len), {"ranks": r.ranks})[r.method] = r
        if r.topology not in names.setdefault(r.ranks, []):
            names[r.ranks].append(r.topology)
    # Topologies of one rank count are told apart by a letter (8a, 8b), which their rows carry.
    label: dict[str, str] = {}
    for p, ts in names.items():
        for i, t in enumerate(ts):
            label[t] = str(p) if len(ts) == 1 else f"{p}{chr(ord('a') + i)}" if i < 26 else f"{p}#{i + 1}"
    for p, t in sorted(names.items()):
        con.print(f"{p} ranks: " + ", ".join(escape(x) + (f" ({label[x]})" if len(t) > 1 else "") for x in t))
    if shape:
        con.print(f"workload: {shape}", markup=False)
    con.print(f"result {result}; rings: {ring} order")
    # A method that cannot build the compared layout delivers its own: say which, from the rows.
    delivered = {m: sorted({r.result for r in rows if r.method == m and r.predicted_us is not None}) for m in METHODS}
    marks = {m: f"[{', '.join(d)}]" for m, d in delivered.items() if d and d != delivered["tree"]}
    for m in METHODS:
        con.print(f"  {SHORT[m]:<6} {NOTES[m]}" + (f" {marks[m]}" if m in marks else ""), markup=False)
    if marks:
        con.print(f"  {', '.join(sorted(set(marks.values())))}: what a method delivers where it cannot deliver "
                  f"{result}", markup=False)
    # Its ratio runs to hundreds at long N: say which ring attention it is (results/compare/README.md).
    con.print("  pass-KV: ringA moves KV, as the tree attention paper's baseline does; pass-Q\n"
              "  (the query moving instead) ends in a merge of partials, as the other columns", markup=False)
    metrics = (("per-layer time, µs (compute included)", lambda r: fixed(r.predicted_us, 1)),
               # a speedup over a method that cannot run there is marked as its peak is
               ("tree faster by (x)" + ("; * does not fit" if any(r.fits is False for r in rows) else ""),
                lambda r: _ratio(r.speedup_of_tree) + ("" if r.fits else "*")),
               ("peak bytes a rank (K, M, G, T: powers of 1024; * does not fit)",
                lambda r: _bytes(r.peak_bytes) + ("" if r.fits else "*")),
               ("bytes moved, all ranks (K, M, G, T: powers of 1024)", lambda r: _bytes(r.bytes_moved)))
    for title, cell in metrics:
        table = key_columns(Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False), 1)
        table.add_column("ranks N", justify="left", no_wrap=True)
        for m in METHODS:
            table.add_column(SHORT[m], justify="right", no_wrap=True)
        for (name, n), entry in by.items():
            table.add_row(f"{label[name]} {_tokens(n)}",
                          *("-" if entry[m].predicted_us is None else cell(entry[m]) for m in METHODS))
        con.print(table)
    # Say why a method has no figure where it cannot run (too few rows for its chunks, heads
    # that do not split over the ranks), once per method, rank count and reason.
    missing = dict.fromkeys((SHORT[r.method], r.ranks, r.detail) for r in rows if r.predicted_us is None)
    for short, ranks, why in missing:
        con.print(f"- {short} at {ranks} ranks: {why}", markup=False, soft_wrap=False)


def _dims(w: Workload) -> str:
    """``B=1 Hq=128 Hkv=1 D=576``, and ``Dv=512 (latent)`` where the value dim or the cache
    differs from K and V of D each."""
    dims = f"B={w.batch} Hq={w.q_heads} Hkv={w.kv_heads} D={w.head_dim}"
    if w.v_head_dim is None and not w.kv_latent:
        return dims
    return f"{dims} Dv={w.value_dim}{' (latent)' if w.kv_latent else ''}"


def _ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.3g}" if x < 1000 else fixed(x, 0)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:  # 1000-1023 of a unit in full: .3g would print 1.01e+03
            return f"{n / scale:.3g}{unit}" if n / scale < 999.5 else f"{n / scale:.0f}{unit}"
    return f"{n}B"
