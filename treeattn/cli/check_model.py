"""``treeattn check-model``: the GPU cost model scored on published nccl-tests tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app, err_console
from treeattn.cli.options import nccl_env_flags, topology_flag
from treeattn.cli.paths import OUT_PATH, output_file
from treeattn.cli.progress import progress_reporter
from treeattn.cli.render import console, print_rates_note


def _stat_row(name: str, st: dict) -> list[str]:
    if not st["rows"]:
        return [name, "0", "-", "-", "-"]
    return [name, str(st["rows"]), f"{100 * st['median_abs']:.1f}", f"{100 * st['p90_abs']:.1f}",
            f"{100 * st['median_signed']:+.1f}"]


def _p2p_note(t) -> str:  # noqa: ANN001 - a PublishedTable
    """Which P2P level an own log's rows were predicted at, what set it and how many rank
    pairs it puts through host memory (``treeattn.validate.published.table_p2p_level``); empty
    where no setting names it and no pair goes through host memory."""
    from treeattn.cost import nccl_rates
    from treeattn.cost.nccl_env import P2P_SETTINGS
    from treeattn.topology.model import DeviceKind
    from treeattn.validate.published import table_p2p_level

    topo, why = table_p2p_level(t)
    if any(topo.rank_device(r).kind is not DeviceKind.GPU for r in range(topo.num_ranks)):
        return ""
    n = topo.num_ranks
    # the pairs NCCL's shared-memory transport carries; a calibrated topology without
    # cost.shm_gbps times them at its measured rates (nccl_rates._shm_rated), which is said
    reasons = [nccl_rates.shm_reason(topo, a, b) for _, a, b in nccl_rates.node_pairs(topo)]
    shm = sum(r is not None for r in reasons)
    if not shm and not any(k in t.env for k in P2P_SETTINGS):
        return ""
    # a pair with a GPU without peer-to-peer goes through host memory at any level: said, so
    # that the level is not taken for the cause (nor NCCL_P2P_LEVEL for the cure)
    no_p2p = reasons.count(nccl_rates.SHM_NO_P2P)
    because = ("" if not no_p2p else " (GPUs without peer-to-peer, at any level)" if no_p2p == shm
               else f" ({no_p2p} of them between GPUs without peer-to-peer, at any level)")
    timed = ("" if nccl_rates.shm_pairs(topo) == shm else
             " (timed at the calibrated links' rates: the topology names no cost.shm_gbps)")
    # by node: on an AMD host NCCL's default depends on how many of the ranks it holds
    nodes = dict.fromkeys(topo.rank_device(r).node for r in range(topo.num_ranks))
    levels = list(dict.fromkeys(nccl_rates.p2p_level(topo, node) for node in nodes))
    said = ", ".join(levels) + (" by node" if len(levels) > 1 else "")
    return (f"; P2P level {said} ({why}): {shm} of {n * (n - 1)} rank pairs through host memory{because}"
            f"{timed}")


def _machines(topologies: list[str]) -> dict[str, str]:
    """Per machine among ``--topology``'s values (by fingerprint: a file named two ways is one
    machine), the first name it was given by."""
    from treeattn.topology.library import resolve

    named: dict[str, str] = {}
    for name in topologies:
        named.setdefault(resolve(name).fingerprint, name)
    return named


def _table(title: str, first: str, rows: list[list[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, col in enumerate((first, "rows", "median |err| %", "p90 |err| %", "signed median %")):
        t.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(escape(r[0]), *r[1:])  # the first: a table's name, which a log's path gives
    return t


@app.command("check-model")
def check_model_cmd(
    paths: Annotated[list[Path] | None, typer.Argument(
        metavar="PATH", help="Corpus folders, mapping files (.yaml) or your own nccl-tests / rccl-tests logs (one "
        "run a file, as printed or as -J's JSON, with --topology); default: the shipped corpus.")] = None,
    topology: Annotated[list[str] | None, typer.Option(
        "--topology", "-t", metavar="TOPOLOGY", help="The machine the logs ran on: preset name (e.g. "
        "dgx-h100:nodes=2) or a topology YAML file; once for every log, or once a log in the logs' order "
        "(a 1-node and a 4-node run: -t dgx-h100 -t dgx-h100:nodes=4).")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", metavar="NAME=VALUE", help="A setting the logs ran with that the model reads (named above; e.g. "
        "NCCL_ALGO=Ring); repeat for several.")] = None,
    nccl_version: Annotated[str | None, typer.Option(
        "--nccl-version", metavar="VERSION", help="The NCCL release the logs ran with, where they print none "
        "(RCCL's for rccl-tests logs): 2.21.5, a series (2.21) or a bound (<2.23); default: the topology's. "
        "NCCL_DEBUG=VERSION makes a run print it.")] = None,
    partial: Annotated[bool, typer.Option(
        "--partial", help="Score a log that ends inside its table (a run that stopped early or failed; -J's "
        "file too) on its whole rows, saying so, instead of refusing it.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (sorted keys): every row and every figure.")]
    = False,
    png: Annotated[Path | None, typer.Option("--png", **OUT_PATH,
                                             help="Draw predicted against published (your logs: measured) time "
                                             "into this PNG.")]
    = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="Progress on stderr (rows "
                                                  "predicted): a bar on a terminal, else a line every 10 s.")] = None,
) -> None:
    """Predict every row of published nccl-tests / rccl-tests tables (collectives by the NCCL
    model, sendrecv and alltoall by the point-to-point model) and published decode-kernel
    figures (the attention model), and report the error: per size regime, per collective,
    then per table (error = predicted / published time - 1). Your own cluster's logs are
    scored the same way: `treeattn check-model all_reduce_perf.txt -t dgx-h100:nodes=2`
    (the collective from the test name nccl-tests prints or the file name, the ranks from its
    device lines). --env gives the settings they ran with that the model reads: NCCL_ALGO,
    NCCL_PROTO, NCCL_NVLS_ENABLE, RCCL_MSCCL_ENABLE, RCCL_MSCCL_ENABLE_SINGLE_PROCESS,
    NCCL_P2P_DISABLE or NCCL_P2P_LEVEL. --nccl-version gives the release where a log prints
    none (defaults changed between releases: NCCL 2.23.4 stopped peer-to-peer between PCIe GPUs
    of an AMD host that no switch joins)."""
    from treeattn.cost.nccl_env import P2P_SETTINGS
    from treeattn.errors import InputError
    from treeattn.topology.nccl_version import release_text
    from treeattn.validate.corpus import is_mapping, load_corpus, load_logs, reads_env
    from treeattn.validate.published import (
        REGIMES,
        plot_corpus,
        predict_corpus,
        summarize,
        table_releases,
    )

    if png is not None:
        png = output_file(png, "--png", "check-model.png", suffix=".png")
    from treeattn.validate.attention import attention_summary, load_attention

    missing = next((p for p in paths or [] if not p.exists()), None)
    if missing is not None:
        raise InputError(f"{missing}: no such file or folder")
    logs = [p for p in paths or [] if not p.is_dir() and not is_mapping(p)]
    corpus = [p for p in paths or [] if p not in logs]
    settings = nccl_env_flags(env or [])
    from treeattn.cost.nccl_env import unread_numbers

    for said in unread_numbers(settings):  # NCCL reads them quietly; the user may not mean it
        err_console.print(f"[yellow]warning:[/] --env {escape(said)}")
    topologies = topology or []
    if logs and not topologies:
        raise InputError(f"{logs[0]}: a log needs --topology, the machine it ran on (e.g. -t dgx-h100:nodes=2)")
    if logs and len(topologies) not in (1, len(logs)):
        raise InputError(f"--topology given {len(topologies)} times for {len(logs)} log{'s' if len(logs) > 1 else ''}: "
                         "give it once for every log, or once a log in the logs' order")
    if not logs and (topologies or settings or nccl_version is not None or partial):
        load_corpus([p for p in corpus if p.is_file()])  # a topology file given as a mapping is named so first
        flag = ("--topology" if topologies else "--env" if settings else "--nccl-version"
                if nccl_version is not None else "--partial")
        folder = next((p for p in corpus if p.is_dir() and not any(p.glob("*.yaml"))), None)
        if folder is not None:  # a folder of one's own logs, not a corpus
            raise InputError(f"{folder}: a folder is read as a corpus, whose .yaml mappings name each table's "
                             f"machine, and it has none; give its logs as files with {flag} "
                             f"(e.g. {folder / '*.txt'})")
        raise InputError(f"{flag} applies to nccl-tests logs; give LOG files (the corpus's tables name their own)")
    for k, name in enumerate(topologies):  # before any log is read: a wrong name is the flag's error
        whose = f" (for {logs[k]})" if len(topologies) > 1 else ""  # each log its own
        if not name.strip():
            raise InputError(f"--topology {name!r}{whose}: empty; give a preset name or a topology YAML file")
        topology_flag(name, whose, as_log="an nccl-tests log, not a topology: give logs as PATHs, and the machine "
                                          "they ran on here")
    machines = topologies * len(logs) if len(topologies) == 1 else topologies
    tables = (load_corpus(corpus) if corpus or not logs else []) + (
        load_logs(logs, machines, settings, nccl_version, partial) if logs else [])
    if len(logs) > 1 and len(topologies) == 1:
        from treeattn.calibrate.log_machine import example_selection
        from treeattn.topology.library import resolve

        topo = resolve(topologies[0])
        if other := next((t for t in tables if t.url in map(str, logs) and t.ranks != topo.num_ranks), None):
            example = (example_selection(other.log, topo, topologies[0], other.ranks)
                       if other.ranks < topo.num_ranks and "[" not in topologies[0] else None)
            select = f"select its ranks ('{example}') or " if example else ""
            raise InputError(f"{other.url}: ran on {other.ranks} ranks, and --topology {topologies[0]!r} places "
                             f"{topo.num_ranks}; {select}give --topology once a log, in the logs' order")
    with progress_reporter(progress, "check-model") as update:
        rows = predict_corpus(tables, update)
    summary = summarize(rows)
    releases = table_releases(tables)
    folders = [p for p in (paths or []) if p.is_dir()] if paths else None
    attention = attention_summary(load_attention(folders))
    # the user's own logs are measured, not published: the figure and the table say whose
    measured = "published" if not logs else "your" if not corpus else "published and your"
    own = [t for t in tables if t.url in map(str, logs)]
    named = _machines(topologies)
    if png is not None:
        # logs of several machines, or with the corpus: one marker a machine, named as the rates
        # notes name it (the corpus's circles)
        from treeattn.topology.library import resolve

        marked = len(named) > 1 or len(own) < len(tables) and own
        machines = {t.name: named[resolve(t.topology).fingerprint] for t in own} if marked else None
        plot_corpus(rows, png, measured, machines)
    for t in tables:  # an own log's line says it; a corpus table's mapping has no such line
        if t not in own and (checked := t.validation_note()):
            err_console.print(f"[yellow]warning:[/] {escape(t.name)}: {escape(checked)}")

    def said(t) -> list[str]:  # noqa: ANN001 - a PublishedTable
        """What the table's line says was inferred about an own log, beyond its figures."""
        notes = [t.meta["inferred"]] if t.meta.get("inferred") else []
        if checked := t.validation_note():
            notes.append(checked)
        unread = [k for k in settings if k not in reads_env(t.collective)]
        if applied := [f"{k}={v}" for k, v in settings.items() if k not in unread]:
            notes.append(f"run with {' '.join(applied)} (--env)")
        if any(k.startswith("RCCL_") for k in applied) and not t.log.rccl:
            notes.append("RCCL_* settings apply to rccl-tests logs (RCCL) only; this one ran NCCL")
        if unread:
            notes.append(f"--env {', '.join(unread)} not applied (the point-to-point model reads only "
                         f"{' and '.join(P2P_SETTINGS)})")
        return notes + ([p2p.removeprefix("; ")] if (p2p := _p2p_note(t)) else [])

    if json_out:

        sources = {t.name: {"url": t.url, "collective": t.collective, "topology": t.topology, "ranks": t.ranks,
                            "env": t.env, "scored": t.scored, "why": t.why,
                            "library_version": f"{t.library} {t.version}".strip(),
                            "nccl_release": release_text(releases[t.name])} for t in tables}
        for t in own:  # what the text's line for each log says (the GPU it ran on, the P2P level, ...)
            sources[t.name].update(gpus_per_process=t.log.n_gpus, notes=said(t))
        typer.echo(json.dumps({"summary": summary, "tables": sources, "rows": [r.to_dict() for r in rows],
                               "attention": attention, "png": None if png is None else str(png)},
                              sort_keys=True, indent=2))
        return
    # Wide enough for the table names: rich would otherwise fold them in a narrow terminal.
    con = console()
    scored = sum(1 for t in tables if t.scored)
    tabled = f"{len(tables)} table{'s' if len(tables) != 1 else ''}"
    con.print(f"{tabled} ({scored} scored), {len(rows)} rows; error = predicted / "
              f"{'measured' if logs else 'published'} time - 1", markup=False)
    for t in own:  # what was read from each log, and what was inferred
        gpus = f", {t.log.n_gpus} GPUs a process (-g)" if t.log.n_gpus > 1 else ""
        how = "printed" if t.evidence.startswith("printed") else "--nccl-version"
        nccl = (f"{t.library} {t.version} ({how})" if t.version
                else f"RCCL, its release not printed (NCCL {release_text(releases[t.name])}'s figures"
                + (", RCCL 2.21's MSCCL, which runs where a process drives several GPUs: "
                   "--nccl-version gives the run's RCCL release)" if t.log.n_gpus > 1 else
                   "; --nccl-version gives the run's RCCL release)")
                if t.log.rccl else f"NCCL's release not printed: the topology's ({release_text(releases[t.name])}); "
                "--nccl-version gives the run's")
        con.print(f"{t.url}: {t.collective} over {t.ranks} ranks on {t.topology}{gpus}, {nccl}"
                  + "".join(f"; {n}" for n in said(t)), markup=False)
    if logs:
        from treeattn.topology.library import resolve

        # one note a machine, each log's line naming its P2P level
        for name in named.values():
            print_rates_note(con, resolve(name), f"{name}:\n" if len(named) > 1 else "", shm=False)
    con.print(_table("By size regime (scored rows)", "regime",
                     [_stat_row(g, summary["regimes"][g]) for g in REGIMES] + [_stat_row("all", summary["all"])]))
    con.print(_table("By collective (scored rows)", "collective",
                     [_stat_row(c, st) for c, st in summary["collectives"].items()]))
    cells = Table(title="Median |err| % by collective and regime (rows)", title_justify="left")
    cells.add_column("collective")
    for g in REGIMES:
        cells.add_column(g, justify="right")
    for c, by in summary["cells"].items():
        cells.add_row(c, *[f"{100 * st['median_abs']:.1f} ({st['rows']})" if st["rows"] else "-" for st in by.values()])
    con.print(cells)
    marked = " (not scored: marked *)" if any(not st["scored"] for st in summary["tables"].values()) else ""
    con.print(_table(f"By table{marked}", "table",
                     [_stat_row(n + ("" if st["scored"] else " *"), st) for n, st in summary["tables"].items()]))
    if attention:
        att = Table(title="Decode attention kernels (treeattn.cost.compute against published timings)",
                    title_justify="left")
        for i, col in enumerate(("GPU", "rows", "median |err| %", "p90 |err| %", "signed median %",
                                 "fitted fixed µs", "fitted share of memory bandwidth")):
            att.add_column(col, justify="left" if i == 0 else "right")
        for gpu, st in attention.items():
            att.add_row(gpu, str(st["rows"]), f"{100 * st['median_abs']:.1f}", f"{100 * st['p90_abs']:.1f}",
                        f"{100 * st['median_signed']:+.1f}",
                        "-" if st["fitted_launch_us"] is None else f"{st['fitted_launch_us']:.1f}",
                        "-" if st["fitted_efficiency"] is None else f"{st['fitted_efficiency']:.2f}")
        con.print(att)
    if png is not None:
        con.print(f"wrote {png}", markup=False)
