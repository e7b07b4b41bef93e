"""What every command prints on stdout goes through ``console()``: tables never lose a character.

rich shrinks a table that is wider than the console by cutting cells (``130…``), and a
console that is not a terminal (a pipe, a log, CI) is 80 columns wide. Here a table is
laid out by ``fit_table`` instead: each column gets at least its longest word (headers
wrap between words, cells too; a column added with ``no_wrap=True`` gets its longest
line, for a header such as ``× plan`` that reads wrong broken), and when even that is too
wide for the console the table is split into parts that fit, each repeating the key
columns (the first, unless ``key_columns`` says more) so every row can be read across
parts. A single word longer than the console folds onto the next line rather than being cut.

    con = console()
    table = key_columns(Table(title="..."), 3)   # topology, ranks, N identify a row
    con.print(table)
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from treeattn.units import counted

__all__ = ["console", "key_columns", "fit_table", "plan_title", "print_rates_note", "searched_family",
           "warn_topology"]

_KEY = "_treeattn_key_columns"


def console() -> Console:
    """The console a command prints its tables and lines to (stdout)."""
    # emoji=False: a PCI bus id such as 0000:ab:00.0 must not print as 0000🆎00.0.
    return _FittingConsole(highlight=False, soft_wrap=True, emoji=False)


def print_rates_note(con: Console, topo: Any, prefix: str = "", shm: bool = True) -> None:
    """Print which link rates the figures on ``topo`` (a Topology) read, where a calibration
    measured them (``treeattn.cost.library.link_rates_note``), and, with ``shm``, which rank
    pairs NCCL moves through host memory and why (``topo_text.shm_sentence``: far below
    their links' rates); nothing elsewhere."""
    from treeattn.cli.topo_text import shm_sentence, wrap
    from treeattn.cost.library import link_rates_note

    notes = [n for n in (link_rates_note(topo), "\n".join(wrap(shm_sentence(topo), "")) if shm else "") if n]
    if notes:
        con.print(prefix + "\n".join(notes), markup=False)


def searched_family(plan) -> str | None:  # noqa: ANN001 - a Plan
    """The family the search's candidates table named ``plan`` by, where it is not the plan's
    builder (a double-binary tree across nodes is built as multirail); else None."""
    search = plan.notes.get("search") if isinstance(plan.notes, dict) else None
    family = search.get("family") if isinstance(search, dict) else None
    return family if isinstance(family, str) and family != plan.algorithm else None


def plan_title(plan) -> str:  # noqa: ANN001 - a Plan
    """The plan's builder, ranks and chunks (where the builder counts them per tree, ring
    segment or rank's heads, as the candidates table does, that count too: the plan's are the
    pieces in all); for a searched plan built by another builder, the family the table named."""
    built = plan.params.get("chunks")
    each = ""
    if isinstance(built, int) and built != plan.chunks:
        # The builder's chunks cut each rank's heads (a heads layout), each ring segment, or the
        # rows each tree of a forest carries.
        unit = "rank's heads" if plan.layout == "heads" else "ring segment" if plan.algorithm == "ring" else "tree"
        each = f": {built} a {unit}"
    title = f"[bold]{escape(plan.algorithm)}[/] ({counted(plan.ranks, 'rank')}, {counted(plan.chunks, 'chunk')}{each})"
    family = searched_family(plan)
    if family is not None:
        described = plan.notes["search"].get("describe")
        how = ", ".join(f"{k}={v}" for k, v in described.items()) if isinstance(described, dict) else ""
        title += f", the search's {escape(family)}{f' ({escape(how)})' if how else ''}"
    return title


def warn_topology(topo: Any) -> None:
    """Say on stderr where GPUs of ``topo`` (a Topology) name a model treeattn has no figures
    for (``treeattn.cost.library.unknown_gpu_note``), where links name a generation NCCL's
    rating has none for (``treeattn.cost.nccl_rates.unrated_generation_note``) or a PCIe rate
    beyond their generation and width (``pcie_over_nominal_note``), where NICs sit
    idle while others carry several ranks (``treeattn.topology.network.idle_nic_note``) and
    where its values look written in another unit (``treeattn.topology.plausible``)."""
    from treeattn.cost.library import unknown_gpu_note
    from treeattn.cost.nccl_rates import pcie_over_nominal_note, unrated_generation_note
    from treeattn.topology.network import idle_nic_note
    from treeattn.topology.plausible import implausible

    notes = [n for n in (unknown_gpu_note(topo), unrated_generation_note(topo), pcie_over_nominal_note(topo),
                         idle_nic_note(topo)) if n]
    for text in notes + implausible(topo):
        typer.echo(f"warning: {text}", err=True)


def warn_payload(payload: Any) -> None:
    """Say on stderr where ``payload`` (a Payload) departs from what was likely meant: a model
    preset's value dim that a config.json invites, ranks an even split leaves empty
    (``treeattn.workload.payload_notes``)."""
    from treeattn.workload import payload_notes

    for note in payload_notes(payload):
        typer.echo(f"warning: {note}", err=True)


def note_attention(topo: Any, payload: Any) -> None:
    """Say on stderr where an attention ``payload``'s times on ``topo`` rest on the default
    attention figures, no fitted ones (``treeattn.topology.attention_fits.unfitted_attention_note``)."""
    from treeattn.topology.attention_fits import unfitted_attention_note
    from treeattn.workload import Workload

    if isinstance(payload, Workload) and (note := unfitted_attention_note(topo)):
        typer.echo(f"note: {note}", err=True)


def key_columns(table: Table, n: int) -> Table:
    """Mark the first ``n`` columns of ``table`` as the ones that identify a row (repeated
    in every part when the table is split); returns the table."""
    setattr(table, _KEY, n)
    return table


class _FittingConsole(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: D102 - Console.print
        rest: list[Any] = []
        for obj in objects:
            if isinstance(obj, Table) and obj.columns:
                if rest:
                    super().print(*rest, **kwargs)
                    rest = []
                for part in fit_table(obj, self.width, self):
                    super().print(part, **kwargs)
            else:
                rest.append(obj)
        if rest or not objects:
            super().print(*rest, **kwargs)


def _padding(table: Table, index: int, count: int) -> int:
    _, right, _, left = table.padding
    if not table.pad_edge:
        left = 0 if index == 0 else left
        right = 0 if index == count - 1 else right
    return left + right


def _borders(table: Table, count: int) -> int:
    if table.box is None:
        return 0
    return (2 if table.show_edge else 0) + count - 1


def _measure(con: Console, table: Table, column) -> tuple[int, int]:  # noqa: ANN001 - a rich Column
    """(longest word, longest line) over the column's header and cells, without padding."""
    options = con.options.update(width=10_000)
    lo, hi = 1, 1
    for cell in (column.header if table.show_header else "", *column._cells):
        m = Measurement.get(con, options, cell)
        lo, hi = max(lo, m.minimum), max(hi, m.maximum)
    return lo, hi


def fit_table(table: Table, width: int, con: Console) -> list[Table]:
    """``table`` laid out to ``width`` columns without cutting a cell: one table, or parts
    of it (each with the key columns first) when its columns cannot fit side by side."""
    cols = table.columns
    count = len(cols)
    pads = [_padding(table, i, count) for i in range(count)]
    # A column its table marks no_wrap keeps its lines whole: split into parts, not broken.
    sizes = [(hi, hi) if c.no_wrap else (lo, hi) for c, (lo, hi) in ((c, _measure(con, table, c)) for c in cols)]
    nkey = min(getattr(table, _KEY, 1), count - 1)

    def crowded() -> bool:  # the key columns leave no room for the widest other column beside them
        return sum(need[:nkey]) + max(need[nkey:]) + _borders(table, nkey + 1) > width

    need = [lo + p for (lo, _), p in zip(sizes, pads, strict=True)]
    if nkey > 0 and crowded():
        # A key column's long word (a log's file name) folds inside itself before the key is
        # left out of the parts.
        fold = max(16, width // 4)
        sizes = [(min(lo, fold), hi) if i < nkey and not cols[i].no_wrap else (lo, hi)
                 for i, (lo, hi) in enumerate(sizes)]
        need = [lo + p for (lo, _), p in zip(sizes, pads, strict=True)]
    while nkey > 0 and crowded():  # then fewer key columns
        nkey -= 1
    groups: list[list[int]] = []
    current: list[int] = []
    for i in range(nkey, count):
        trial = current + [i]
        used = sum(need[j] for j in range(nkey)) + sum(need[j] for j in trial) + _borders(table, nkey + len(trial))
        if current and used > width:
            groups.append(current)
            current = [i]
        else:
            current = trial
    groups.append(current)
    parts = []
    for n, group in enumerate(groups, 1):
        idx = [*range(nkey), *group]
        part = copy.copy(table)
        part.columns = [dataclasses.replace(cols[j], _index=k) for k, j in enumerate(idx)]
        if len(groups) > 1 and table.title is not None:
            part.title = f"{table.title} (part {n} of {len(groups)})"
        _set_widths(part, [sizes[j] for j in idx], [pads[j] for j in idx], width - _borders(part, len(idx)))
        parts.append(part)
    return parts


def _set_widths(part: Table, sizes: list[tuple[int, int]], pads: list[int], room: int) -> None:
    """Give each column its natural width, then take the excess from the columns with the
    most slack above their longest word; below that, fold (never cut)."""
    widths = [hi for _, hi in sizes]
    floor = [lo for lo, _ in sizes]
    excess = sum(widths) + sum(pads) - room
    while excess > 0:
        slack = [w - f for w, f in zip(widths, floor, strict=True)]
        i = max(range(len(widths)), key=lambda k: (slack[k], k))
        if slack[i] <= 0:
            # Even the longest words do not fit: the widest column folds inside its words.
            i = max(range(len(widths)), key=lambda k: (widths[k], k))
            if widths[i] <= 1:
                break
        widths[i] -= 1
        excess -= 1
    for col, w in zip(part.columns, widths, strict=True):
        col.width = w
        col.min_width = None
        col.max_width = None
        col.no_wrap = False
        col.overflow = "fold"
