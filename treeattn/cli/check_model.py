"""``treeattn check-model``: the GPU cost model scored on published nccl-tests tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from treeattn.cli import app
from treeattn.cli.progress import progress_reporter
from treeattn.cli.render import console


def _stat_row(name: str, st: dict) -> list[str]:
    if not st["rows"]:
        return [name, "0", "-", "-", "-"]
    return [name, str(st["rows"]), f"{100 * st['median_abs']:.1f}", f"{100 * st['p90_abs']:.1f}",
            f"{100 * st['median_signed']:+.1f}"]


def _table(title: str, first: str, rows: list[list[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, col in enumerate((first, "rows", "median |err| %", "p90 |err| %", "signed median %")):
        t.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    return t


@app.command("check-model")
def check_model_cmd(
    paths: Annotated[list[Path] | None, typer.Argument(
        metavar="PATH", help="Corpus folders or mapping files (.yaml); default: the shipped corpus.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (sorted keys): every row and every figure.")]
    = False,
    png: Annotated[Path | None, typer.Option("--png", help="Draw predicted against published time into this PNG.")]
    = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="Progress on stderr (rows "
                                                  "predicted): a bar on a terminal, else a line every 10 s.")] = None,
) -> None:
    """Predict every row of published nccl-tests / rccl-tests tables (collectives by the NCCL
    model, sendrecv and alltoall by the point-to-point model) and published decode-kernel
    figures (the attention model), and report the error: per size regime, per collective,
    then per table (error = predicted / published time - 1)."""
    from treeattn.validate.corpus import load_corpus
    from treeattn.validate.published import REGIMES, plot_corpus, predict_corpus, summarize

    if png is not None and png.suffix.lower() != ".png":
        from treeattn.errors import InputError

        raise InputError(f"--png {png}: give a .png file name")
    from treeattn.validate.attention import attention_summary, load_attention

    tables = load_corpus(list(paths or []))
    with progress_reporter(progress, "check-model") as update:
        rows = predict_corpus(tables, update)
    summary = summarize(rows)
    folders = [p for p in (paths or []) if p.is_dir()] if paths else None
    attention = attention_summary(load_attention(folders))
    if png is not None:
        plot_corpus(rows, png)
    if json_out:
        from treeattn.topology.nccl_version import NEWEST, release_text

        sources = {t.name: {"url": t.url, "collective": t.collective, "topology": t.topology, "ranks": t.ranks,
                            "env": t.env, "scored": t.scored, "why": t.why,
                            "library_version": f"{t.library} {t.version}".strip(),
                            "nccl_release": release_text(t.nccl_release or NEWEST)} for t in tables}
        typer.echo(json.dumps({"summary": summary, "tables": sources, "rows": [r.to_dict() for r in rows],
                               "attention": attention}, sort_keys=True, indent=2))
        return
    # Wide enough for the table names: rich would otherwise fold them in a narrow terminal.
    con = console()
    scored = sum(1 for t in tables if t.scored)
    con.print(f"{len(tables)} tables ({scored} scored), {len(rows)} rows; error = predicted / published time - 1",
              markup=False)
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
    con.print(_table("By table (not scored: marked *)", "table",
                     [_stat_row(n + ("" if st["scored"] else " *"), st) for n, st in summary["tables"].items()]))
    if attention:
        att = Table(title="Decode attention kernels (treeattn.cost.compute against published timings)",
                    title_justify="left")
        for i, col in enumerate(("GPU", "rows", "median |err| %", "p90 |err| %", "signed median %",
                                 "fitted fixed us", "fitted share of memory bandwidth")):
            att.add_column(col, justify="left" if i == 0 else "right")
        for gpu, st in attention.items():
            att.add_row(gpu, str(st["rows"]), f"{100 * st['median_abs']:.1f}", f"{100 * st['p90_abs']:.1f}",
                        f"{100 * st['median_signed']:+.1f}", f"{st['fitted_launch_us']:.1f}",
                        f"{st['fitted_efficiency']:.2f}")
        con.print(att)
    if png is not None:
        con.print(f"wrote {png}", markup=False)
