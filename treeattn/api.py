"""The public Python API: what a model's code calls (``treeattn.load_plan``, ``treeattn.search_plan``,
``treeattn.save_plan``, ``treeattn.Merger``, ``treeattn.attention_partial``). This module imports no
torch; the two torch-backed names are loaded by ``treeattn.__getattr__`` when first used."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from treeattn.errors import InputError
from treeattn.plan.baselines import parse_result
from treeattn.plan.io import load_plan
from treeattn.plan.ir import Plan
from treeattn.topology.library import (
    recorded_source,
    relative_file_source,
    relocated_source,
    resolve,
    resolve_recorded,
)
from treeattn.topology.model import Topology
from treeattn.workload import MODELS, ModelPreset, Workload

__all__ = ["load_plan", "save_plan", "search_plan"]

_SEARCH_OPTIONS = ("seed", "chunk_choices", "families", "effort", "progress")
_WORKLOAD_OPTIONS = ("split", "kv_dtype", "partial_dtype", "layers", "q_heads", "kv_heads", "head_dim")


def search_plan(topology: str | Topology, workload_or_model: Workload | ModelPreset | str, *,
                batch: int | None = None, seq_len: int | str | None = None, result: str = "all",
                **options: Any) -> Plan:
    """The fastest merge schedule for one decode step, as ``treeattn plan`` searches it.

    Args:
        topology: a ``Topology``, a shipped name (``dgx-h100``), a family spec
            (``dgx-h100:nodes=16``, ``cpu:ranks=4``) or a topology YAML file.
        workload_or_model: a ``Workload``, or a model preset (its name, ``llama-3.1-8b``, or a
            ``ModelPreset``) made into one with ``batch`` and ``seq_len``.
        batch: B, sequences decoded together (with a model).
        seq_len: N, tokens of KV cache in all (an int, or text such as ``"128K"`` as ``plan -n``
            takes), split evenly over the ranks (with a model).
        result: ``all``, ``heads`` or ``root[:R]`` (``treeattn.plan.baselines.RESULT_HELP``).
        **options: the search's ``seed``, ``chunk_choices``, ``families``, ``effort``,
            ``progress``; the workload's ``split``, ``kv_dtype``, ``partial_dtype``, ``layers``
            (and ``q_heads``, ``kv_heads``, ``head_dim`` to override a preset).

    Returns:
        The plan (``predicted_us`` and ``notes['search']`` filled); same inputs, same plan.

    Raises:
        treeattn.errors.InputError: an unknown topology, model, option or layout, or a
            workload that does not fit the topology.

    Examples:
        >>> plan = search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len=131072, result="heads")
        >>> plan.ranks, plan.result
        (8, 'heads')
    """
    from treeattn.search.search import Effort, search
    from treeattn.search.workload_file import workload_from_dict

    unknown = sorted(set(options) - set(_SEARCH_OPTIONS) - set(_WORKLOAD_OPTIONS))
    if unknown:
        raise InputError(f"search_plan takes no option {unknown[0]!r}; it takes "
                         f"{', '.join(_SEARCH_OPTIONS + _WORKLOAD_OPTIONS)}")
    # The search reads these as it goes: a wrong type would fail deep inside it, not here.
    if "seed" in options and (not isinstance(options["seed"], int) or isinstance(options["seed"], bool)):
        raise InputError(f"search_plan seed must be an integer, got {options['seed']!r}")
    if options.get("effort") is not None and not isinstance(options["effort"], Effort):
        raise InputError(f"search_plan effort must be a treeattn.search.search.Effort (or None: chosen from "
                         f"the rank count), got {options['effort']!r}")
    families = options.get("families")
    if families is not None and (not isinstance(families, (list, tuple, set, frozenset))
                                 or not all(isinstance(f, str) for f in families)):
        # A bare string would be read letter by letter ('star' as s, t, a, r).
        raise InputError(f"search_plan families must be a list of family names, e.g. ['star'], got {families!r}")
    if options.get("chunk_choices") is not None and not isinstance(options["chunk_choices"],
                                                                   (list, tuple, set, frozenset, range)):
        raise InputError(f"search_plan chunk_choices must be a list of chunk counts, e.g. [1, 2, 4], "
                         f"got {options['chunk_choices']!r}")
    if options.get("progress") is not None and not callable(options["progress"]):
        raise InputError(f"search_plan progress must be a callable progress(done, total, stage) or None, "
                         f"got {options['progress']!r}")
    topo = topology if isinstance(topology, Topology) else resolve(str(topology))
    shape = {k: options[k] for k in _WORKLOAD_OPTIONS if k in options}
    if isinstance(workload_or_model, Workload):
        if shape or batch is not None or seq_len is not None:
            raise InputError("give batch, seq_len and workload options with a model, not with a Workload")
        workload = workload_or_model
    else:
        name = workload_or_model.name if isinstance(workload_or_model, ModelPreset) else workload_or_model
        if name not in MODELS:
            raise InputError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
        if batch is None or seq_len is None:
            raise InputError("search_plan with a model needs batch= and seq_len=")
        # The CLI's and workload files' own reader: "128K" reads as there, and a bad value is refused alike.
        workload = workload_from_dict({"model": name, "batch": batch, "seq_len": seq_len, **shape},
                                      ranks=topo.num_ranks, where="search_plan")
    layout, root = parse_result(result, topo.num_ranks)
    found = search(topo, workload, result=layout, root=root, **{k: options[k] for k in _SEARCH_OPTIONS
                                                                 if k in options})
    if isinstance(topology, Topology):
        return found.best
    # Where the topology came from, so that a saved plan finds it again (save_plan).
    source = recorded_source(str(topology), topo)
    return dataclasses.replace(found.best, topology=dataclasses.replace(found.best.topology, source=source))


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write ``plan`` where ``treeattn run``, ``simulate`` and ``load_plan`` read it (JSON when
    the name ends in ``.json``, else YAML), as ``treeattn plan`` writes its plans: a topology
    file the plan was searched on is recorded relative to the plan's folder, so ``run`` finds
    it from any directory.

    Args:
        plan: the plan (``search_plan``'s or ``load_plan``'s).
        path: the file to write.

    Returns:
        The path written.

    Raises:
        treeattn.errors.InputError: the file cannot be written; or the plan names its topology
            file relative to a folder it does not know (loaded from text, not from its file)
            and that path does not find the topology from ``path``'s folder either.
    """
    from treeattn.plan import io

    path = Path(path)
    ref = plan.topology
    if ref.base is None and relative_file_source(ref.source):
        # Loaded from text: the plan file's folder, which the source is relative to, is not
        # known, so the source cannot be moved; written as it is, it must find the topology there.
        try:
            resolve_recorded(ref.name, ref.fingerprint, ref.source, path)
        except InputError:
            raise InputError(f"cannot save the plan to {str(path)!r}: it names its topology file {ref.source!r} "
                             "relative to the folder of the plan file it came from, which a plan loaded from "
                             "text does not know; load it from that file (load_plan(PATH)) to save it "
                             "anywhere") from None
    source = relocated_source(plan.topology.source, path, plan.topology.base)
    if source != plan.topology.source:
        plan = dataclasses.replace(plan, topology=dataclasses.replace(plan.topology, source=source))
    try:
        return io.save_plan(plan, path)
    except OSError as exc:
        raise InputError(f"cannot write plan {str(path)!r}: {exc.strerror or exc}") from None
