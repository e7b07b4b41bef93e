"""``treeattn verify``: prove a plan file correct with the symbolic validator; ``treeattn plan-schema``:
the JSON Schema of plan files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from treeattn.cli import app
from treeattn.cli.options import SchemaJsonOpt
from treeattn.errors import PlanInvalidError

__all__ = ["verify_cmd", "plan_schema_cmd"]


@app.command("verify")
def verify_cmd(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file (YAML or JSON).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (sorted keys) instead of a summary.")] = False,
) -> None:
    """Check that every result rank ends with each contribution exactly once, that sends and
    receives match, and that the plan cannot deadlock; say whether the result ranks end with
    the same bits. Exit 0 when valid, 2 when not."""
    from treeattn.plan.bits import bit_groups, different_bits_note
    from treeattn.plan.io import load_plan
    from treeattn.plan.validate import validate

    plan = load_plan(plan_file)
    report = validate(plan)
    split = bit_groups(plan) if report.valid else {}
    if json_out:
        data = report.to_dict()
        data["file"] = str(plan_file)
        # null for an invalid plan: an empty mapping would say its ranks all end with the same bits
        data["bit_groups"] = {str(c): groups for c, groups in split.items()} if report.valid else None
        typer.echo(json.dumps(data, sort_keys=True, indent=2))
    if not report.valid:
        # Also with --json: the JSON is on stdout, the one-line error on stderr, exit status 2.
        raise PlanInvalidError(f"{plan_file}: plan {plan.algorithm!r} is invalid: {report.first}")  # as run, simulate
    if json_out:
        return
    if len(plan.result_ranks) == plan.ranks:
        where = "every rank, its own heads" if plan.layout == "heads" else "every rank"
    else:
        where = "rank " + ", ".join(map(str, plan.result_ranks[:8])) + (" ..." if len(plan.result_ranks) > 8 else "")
    if plan.contributors is not None and set(plan.contributors) != set(range(plan.ranks)):
        cs = sorted(set(plan.contributors))
        ranks = "rank" + ("s " if len(cs) > 1 else " ") + ", ".join(map(str, cs[:8])) + (" ..." if len(cs) > 8 else "")
        where += (f", of {ranks}'s contribution only (its contributors)" if plan.is_raw else
                  f", over the KV of {ranks} only (its contributors: a Merger, which merges every rank's partial, "
                  "refuses it)")

    def n(count: int, word: str) -> str:
        return f"{count} {word}" + ("" if count == 1 else "s")

    moves = n(report.transfers, "transfer") + (f", {n(report.collectives, 'collective')}" if report.collectives else "")
    typer.echo(f"{plan_file}: valid {plan.algorithm} plan: {n(report.ranks, 'rank')}, {n(report.chunks, 'chunk')}, "
               f"{n(report.ops, 'op')} in {n(report.steps, 'step')}, {moves}; result on {where}")
    if split:
        typer.echo(different_bits_note(split))
    elif any(len([r for r in plan.result_ranks if c in plan.owned_chunks(r)]) > 1 for c in range(plan.chunks)):
        typer.echo("every result rank ends with the same bits (as the executor merges)")


@app.command("plan-schema")
def plan_schema_cmd(json_out: SchemaJsonOpt = False) -> None:
    """Print the JSON Schema of plan files (the format is described in docs/plan-format.md)."""
    from treeattn.plan.io import plan_json_schema

    typer.echo(json.dumps(plan_json_schema(), sort_keys=True, indent=2))
