"""Options shared by the commands that take a topology and a workload.

Each option is an ``Annotated`` alias: a command lists the ones it needs as parameters and
passes their values to ``load_topology`` and ``make_payload``, so that every command reads
``--topology``, ``--ranks``, ``--model``... alike and validates them by one code path
(``treeattn.search.workload_file.workload_from_dict``).

    @app.command()
    def cmd(topology: TopologyOpt = None, ranks: RanksOpt = None, model: ModelOpt = None, ...):
        topo = load_topology(topology, ranks)
        payload = make_payload(topo.num_ranks, model=model, ...)
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from treeattn.errors import InputError
from treeattn.topology.library import parse_ranks, subset_topology
from treeattn.topology.model import Topology
from treeattn.workload import MODELS, Payload, check_model

__all__ = [
    "nccl_env_flags",
    "topology_flag",
    "TopologyOpt",
    "RanksOpt",
    "WorkloadFileOpt",
    "ModelOpt",
    "HeadsOpt",
    "KvHeadsOpt",
    "HeadDimOpt",
    "KvLatentOpt",
    "VHeadDimOpt",
    "BatchOpt",
    "SeqLenOpt",
    "SplitOpt",
    "KvDtypeOpt",
    "PartialDtypeOpt",
    "LayersOpt",
    "BytesOpt",
    "OpOpt",
    "JsonOpt",
    "SchemaJsonOpt",
    "Backend",
    "BackendOpt",
    "MeasureOrder",
    "OrderOpt",
    "parse_ranks",
    "subset_topology",
    "load_topology",
    "make_payload",
    "print_models",
]

_W = "Workload"
_T = "Topology"

TopologyOpt = Annotated[
    str | None,
    typer.Option("--topology", "-t", help="Preset name (e.g. dgx-h100:nodes=2) or a topology YAML file.",
                 rich_help_panel=_T),
]
RanksOpt = Annotated[
    str | None,
    typer.Option("--ranks", help="Use only these ranks of the topology: 0-7, 0,2,4,6 or 0-3,8-11.",
                 rich_help_panel=_T),
]
WorkloadFileOpt = Annotated[
    Path | None,
    typer.Option("--workload", help="Workload YAML file (docs/workload-format.md); flags given as well override "
                 "its keys.", rich_help_panel=_W),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help=f"Model preset: {', '.join(MODELS)}; 'list' prints their shapes.",
                             rich_help_panel=_W)
]
HeadsOpt = Annotated[int | None, typer.Option("--heads", help="Query heads Hq.", rich_help_panel=_W)]
KvHeadsOpt = Annotated[int | None, typer.Option("--kv-heads", help="KV heads Hkv (default: the preset's, else Hq).",
                                                rich_help_panel=_W)]
HeadDimOpt = Annotated[int | None, typer.Option("--head-dim", help="Head dimension D (of q and K).",
                                                 rich_help_panel=_W)]
VHeadDimOpt = Annotated[int | None, typer.Option("--v-head-dim", help="Value head dimension Dv (of V and the "
                                                 "merged output; default D).", rich_help_panel=_W)]
KvLatentOpt = Annotated[bool | None, typer.Option("--kv-latent/--no-kv-latent", help="MLA: the cache holds one "
                                                  "vector of D a token and KV head, whose first Dv values are V "
                                                  "(default: the preset's, else no).", rich_help_panel=_W)]
BatchOpt = Annotated[int | None, typer.Option("--batch", "-b", help="Batch B (default 1).", rich_help_panel=_W)]
SeqLenOpt = Annotated[
    str | None,
    typer.Option("--seq-len", "-n", help="Sequence length N in tokens: 131072, 128K or 128Ki, 1M (K = 1024).",
                 rich_help_panel=_W),
]
SplitOpt = Annotated[
    str | None,
    typer.Option("--split", help="Tokens per rank, comma separated (zeros allowed); default even.", rich_help_panel=_W),
]
KvDtypeOpt = Annotated[
    str | None, typer.Option("--kv-dtype", help="KV cache dtype (default bf16).", rich_help_panel=_W)
]
PartialDtypeOpt = Annotated[
    str | None, typer.Option("--partial-dtype", help="Dtype of the partials sent (default fp32).", rich_help_panel=_W)
]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Layers per decode step.", rich_help_panel=_W)]
BytesOpt = Annotated[
    str | None,
    typer.Option("--bytes", help="Raw payload per rank (1M or 1MiB = 1,048,576; 1MB = 10^6) instead of a "
                 "decode shape.", rich_help_panel=_W),
]
OpOpt = Annotated[
    str | None, typer.Option("--op", help="Reduction of a raw payload: sum (the only one; partials to merge "
                                     "come from a decode shape).", rich_help_panel=_W)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (sorted keys) instead of tables.")]
SchemaJsonOpt = Annotated[bool, typer.Option("--json", help="Accepted for symmetry with the other commands: the "
                                                            "schema is JSON.")]


class Backend(StrEnum):
    """Process-group backend: gloo (CPU tensors) or nccl (CUDA)."""

    GLOO = "gloo"
    NCCL = "nccl"


BackendOpt = Annotated[Backend | None, typer.Option("--backend", help="Default: nccl on CUDA, else gloo.")]


class MeasureOrder(StrEnum):
    """How the timed runs of several methods are ordered (``treeattn.exec.runner.RunOptions.order``)."""

    INTERLEAVED = "interleaved"
    BLOCKED = "blocked"


OrderOpt = Annotated[MeasureOrder, typer.Option(
    "--order", help="interleaved: time every method once per round, so methods compared share the host's slow "
    "spells; blocked: each method's runs back to back.")]

def print_models(json_out: bool) -> None:
    """``--model list``: the presets and their attention shapes (a table, or JSON)."""
    import json

    from rich.table import Table

    from treeattn.cli.render import console

    if json_out:
        typer.echo(json.dumps({name: {"q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
                                      "v_head_dim": m.v_head_dim or m.head_dim, "kv_latent": m.kv_latent,
                                      "layers": m.layers, "params": m.params, "weight_dtype": m.weight_dtype.value}
                               for name, m in MODELS.items()}, sort_keys=True, indent=2))
        return
    table = Table(title="Model presets (--model NAME)")
    for col in ("name", "query heads", "KV heads", "head dim", "value dim", "layers", "params"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=col == "params")
    for name, m in MODELS.items():
        table.add_row(name, str(m.q_heads), str(m.kv_heads), str(m.head_dim),
                      f"{m.v_head_dim or m.head_dim}{' (latent)' if m.kv_latent else ''}", str(m.layers),
                      f"{m.params / 1e9:.3g} B {m.weight_dtype.value}")
    console().print(table)


def load_topology(spec: str | None, ranks: str | None = None) -> Topology:
    """Resolve ``--topology`` (preset name, family spec or file) and apply ``--ranks``.

    Args:
        spec: what the user typed; None (the option left out) is an error naming the option.
        ranks: the ``--ranks`` subset, if any.

    Returns:
        The topology, restricted to the subset.
    """
    from treeattn.topology.library import resolve

    if spec is None:
        raise InputError("give --topology NAME|FILE (see `treeattn topo list`)")
    topo = resolve(spec)
    if ranks is None:
        return topo
    return subset_topology(topo, parse_ranks(ranks, topo.num_ranks), ranks.replace(" ", ""))


def make_payload(
    num_ranks: int,
    *,
    workload_file: Path | None = None,
    model: str | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    v_head_dim: int | None = None,
    kv_latent: bool | None = None,
    batch: int | None = None,
    seq_len: str | None = None,
    split: str | None = None,
    kv_dtype: str | None = None,
    partial_dtype: str | None = None,
    layers: int | None = None,
    nbytes: str | None = None,
    op: str | None = None,
    length_flag: str = "--seq-len",
    said: set[str] | None = None,
) -> Payload:
    """Build the Workload (decode shape) or RawPayload (``--bytes``) the flags describe.

    Flags override the keys of ``--workload FILE``; both are validated by
    ``workload_from_dict``; its errors name the flag (``--batch``), or the key of a file.
    ``length_flag``: how a warning names the flag ``seq_len`` came from; ``said``: the warnings
    given already, not given again (compare makes a payload a length and topology).
    """
    from treeattn.search.workload_file import file_split, load_workload, without_replaced, workload_from_dict
    from treeattn.workload import even_split

    data: dict = {}
    where = "workload"
    shape_flags = {"model": model, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                   "v_head_dim": v_head_dim, "kv_latent": kv_latent, "batch": batch,
                   "seq_len": seq_len, "split": split, "kv_dtype": kv_dtype, "partial_dtype": partial_dtype,
                   "layers": layers}
    given = {k: v for k, v in shape_flags.items() if v is not None}
    keyed = {_KEY_OF.get(k, k): v for k, v in given.items()}  # by the workload's keys
    # each key under both its names: the reader checks `heads` before it becomes `q_heads`
    named = {name: _flag(k, v) for k, v in given.items() for name in (k, _KEY_OF.get(k, k))}
    if workload_file is not None:
        # The file is checked with the flags' values in place of those they replace (alone, where
        # no flag is given), so that a value no flag leaves in use is not judged.
        needs = keyed if nbytes is None else {"bytes": nbytes}
        loaded = load_workload(workload_file, ranks=num_ranks, missing=needs, flags=named if nbytes is None else None)
        data = loaded.to_dict()
        if data.get("kind") == "raw":
            data["bytes"] = data.pop("nbytes")
        where = str(workload_file)
    if nbytes is not None and workload_file is not None and data.get("kind") != "raw":
        # the file's decode shape would be dropped unsaid, as shape flags beside --bytes are not
        raise InputError(f"{workload_file} is a decode shape; --bytes gives a raw payload: drop one of them")
    if nbytes is not None:
        shape_only = sorted(k for k in given if k not in ("batch",))
        if shape_only:
            flags = ", ".join(_flag(k, given[k]) for k in shape_only)
            raise InputError(f"--bytes gives a raw payload; drop the decode-shape flags ({flags}) or drop --bytes")
        data = {"kind": "raw", "bytes": nbytes, "op": op or data.get("op", "sum"), "dtype": data.get("dtype")}
    else:
        if op is not None and data.get("kind") != "raw":
            raise InputError("--op applies to a raw payload; give --bytes N as well")
        if data.get("kind") == "raw":
            if given:
                flags = ", ".join(_flag(k, given[k]) for k in sorted(given))
                raise InputError(f"{where} is a raw payload; decode-shape flags ({flags}) do not apply")
            if op is not None:
                data["op"] = op
        else:
            if "seq_len" in given and "split" not in given:
                own = file_split(workload_file) if workload_file is not None else None
                if own and tuple(own) != even_split(sum(own), len(own)):
                    # the file's uneven split cannot hold another length: said (once), not dropped quietly
                    note = (f"warning: {length_flag} replaces {workload_file}'s split [{', '.join(map(str, own))}]: "
                            "the tokens are split evenly" + (" (--split gives tokens per rank)"
                                                             if length_flag == "--seq-len" else ""))
                    if said is None or note not in said:
                        typer.echo(note, err=True)
                        if said is not None:
                            said.add(note)
            # the file's keys the flags replace (a preset its shape, a length the other), as the file was read
            data = {**without_replaced(data, keyed), **given}
    if workload_file is None and nbytes is None:
        # What a decode shape needs, named by the flags that give it (the reader's words are a file's keys).
        if model is not None:  # a mistyped name first: it is what the user will fix before the rest
            check_model(model, "--model")
        if seq_len is None and split is None:
            raise InputError("give the sequence length: --seq-len N (-n 128K), or --split with tokens per rank")
        if model is None and (heads is None or head_dim is None):
            raise InputError("give --model NAME (--model list shows them), or --heads and --head-dim")
    data.pop("ranks", None)
    if given and workload_file is not None:
        # what fails now is a flag's value, or how it sits with the file's: the error names the
        # flag, and the file's key as the file's
        where = "workload"
    flags = {"bytes": "--bytes"} if nbytes is not None else {}
    if op is not None:  # over a raw file too: it sets the op, whatever the file says
        flags["op"] = "--op"
    flags.update(named)
    over = str(workload_file) if workload_file is not None and where == "workload" else None
    return workload_from_dict(data, ranks=num_ranks, where=where, flags=flags, file=where != "workload",
                              over_file=over)


# The workload key a flag sets, where the two are named differently (--heads sets q_heads).
_KEY_OF = {"heads": "q_heads"}


def _flag(key: str, value: object) -> str:
    """The flag that gave ``key`` as typed: ``--kv-latent``, or ``--no-kv-latent`` for False."""
    return ("--no-" if value is False else "--") + key.replace("_", "-")


def topology_flag(spec: str, whose: str = "", as_log: str = "") -> Topology:
    """``--topology``'s value resolved, a bad one the flag's error (``--topology 'x'{whose}:
    ...``; ``whose``: for which log, where each has its own), a bad rank selection too.
    ``as_log``: what to say instead where the value names an nccl-tests log."""
    from treeattn.errors import TopologyError
    from treeattn.topology.library import resolve

    try:
        return resolve(spec)
    except (TopologyError, InputError) as exc:  # InputError: a bad '[ranks ...]' selection
        said = str(exc).removeprefix(f"topology {spec!r}: ")
        if as_log:
            from treeattn.calibrate.nccl_tests import looks_like_a_log

            said = as_log if looks_like_a_log(spec) else said
        raise InputError(f"--topology {spec!r}{whose}: {said}") from None


def nccl_env_flags(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` flags (check-model, calibrate --from-nccl-tests) as a mapping: the
    NCCL settings the model reads, each once, checked as a mapping's ``env`` is."""
    from treeattn.cost.nccl_env import ENV_SETTINGS
    from treeattn.validate.corpus import check_env

    out: dict[str, str] = {}
    for item in items:
        name, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not name or not value:
            raise InputError(f"--env {item!r}: write NAME=VALUE, e.g. NCCL_ALGO=Ring")
        if name not in ENV_SETTINGS:  # a setting the model ignores would score as if it were not set
            raise InputError(f"--env {item!r}: the model reads only {', '.join(ENV_SETTINGS)}")
        if name in out:
            raise InputError(f"--env names {name} twice")
        out[name] = value
    check_env("--env", out)
    return out
