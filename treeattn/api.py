"""The public Python API: what a model's code calls (``treeattn.load_plan``, ``treeattn.search_plan``,
``treeattn.build_plan``, ``treeattn.simulate_plan``, ``treeattn.save_plan``, ``treeattn.Merger``,
``treeattn.attention_partial``).
This module imports no torch; the two torch-backed names are loaded by ``treeattn.__getattr__``
when first used."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treeattn.errors import InputError, PlanFormatError
from treeattn.plan import io as plan_io
from treeattn.plan.baselines import parse_result
from treeattn.plan.ir import Plan
from treeattn.textfile import special_file, wrong_kind
from treeattn.topology.library import (
    recorded_source,
    relative_file_source,
    relocated_source,
    resolve,
    resolve_recorded,
)
from treeattn.topology.model import Topology
from treeattn.workload import MODELS, ModelPreset, Payload, RawPayload, Workload, check_model, payload_notes

if TYPE_CHECKING:
    from treeattn.cost.simresult import SimResult

__all__ = ["load_plan", "save_plan", "search_plan", "build_plan", "simulate_plan", "named_plan"]

_SEARCH_OPTIONS = ("seed", "chunk_choices", "families", "effort", "progress", "mem_fraction")
_WORKLOAD_OPTIONS = ("split", "kv_dtype", "partial_dtype", "layers", "q_heads", "kv_heads", "head_dim", "v_head_dim",
                     "kv_latent")
_ALGORITHM_OPTIONS = ("root", "fanout", "parents", "groups", "order", "roots", "trees", "shape", "intra", "inter",
                      "group_size", "whole_rows")


def search_plan(topology: str | os.PathLike | Topology, workload_or_model: Payload | ModelPreset | str, *,
                batch: int | None = None, seq_len: int | str | None = None, result: str = "all",
                **options: Any) -> Plan:
    """The fastest merge schedule for one decode step, as ``treeattn plan`` searches it.

    Args:
        topology: a ``Topology``, a shipped name (``dgx-h100``), a family spec
            (``dgx-h100:nodes=16``, ``cpu:ranks=4``) or a topology YAML file. The plan records
            the name or the file, where ``run`` and ``simulate`` find it again; a ``Topology``
            object records only its name: unless that is a shipped name or a family spec, give
            them its file with ``--topology``.
        workload_or_model: a ``Workload``, a ``RawPayload`` (a plain sum, as ``plan --bytes``),
            or a model preset (its name, ``llama-3.1-8b``, or a ``ModelPreset``) made into a
            ``Workload`` with ``batch`` and ``seq_len``.
        batch: B, sequences decoded together (with a model).
        seq_len: N, tokens of KV cache in all (an int, or text such as ``"128K"`` as ``plan -n``
            takes), split evenly over the ranks (with a model).
        result: ``all``, ``heads`` or ``root[:R]`` (``treeattn.plan.baselines.RESULT_HELP``).
        **options: the search's ``seed``, ``chunk_choices``, ``families``, ``effort``,
            ``progress``, ``mem_fraction`` (``plan --mem-fraction``: the share of each device's
            memory a rank may use, 0.9 by default); the workload's ``split``, ``kv_dtype``,
            ``partial_dtype``, ``layers`` (and ``q_heads``, ``kv_heads``, ``head_dim``,
            ``v_head_dim``, ``kv_latent`` to override a preset).

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
    from treeattn.cost.memory import DEFAULT_MEM_FRACTION, check_kv_fits
    from treeattn.search.search import Effort, search

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
    if "mem_fraction" in options:
        _mem_fraction(options, "search_plan")
    if options.get("progress") is not None and not callable(options["progress"]):
        raise InputError(f"search_plan progress must be a callable progress(done, total, stage) or None, "
                         f"got {options['progress']!r}")
    with _named("search_plan"):
        topo = _topology(topology, "search_plan")
        workload = _workload(topo, workload_or_model, batch, seq_len, options, "search_plan")
        layout, root = parse_result(result, topo.num_ranks)
        fraction = options.get("mem_fraction", DEFAULT_MEM_FRACTION)
        check_kv_fits(workload, topo, fraction, option="mem_fraction")
        _warn_uncalibrated(topo, topology, raw=not isinstance(workload, Workload))
        found = search(topo, workload, result=layout, root=root, **{k: options[k] for k in _SEARCH_OPTIONS
                                                                     if k in options})
        _warn_weights(workload, topo, fraction, found.candidates[0].peak_bytes)
    return _sourced(found.best, topology, topo)


def simulate_plan(plan: Plan | str | os.PathLike, topology: str | os.PathLike | Topology | None = None, *,
                  given_partials: bool = False) -> SimResult:
    """What ``plan`` is predicted to take, as ``treeattn simulate`` predicts it.

    Args:
        plan: the plan (``search_plan``'s, ``build_plan``'s or ``load_plan``'s), or what
            ``load_plan`` reads: a plan file's path or a plan's text, as ``Merger`` takes it.
        topology: where to predict it: as ``search_plan`` takes it; default the topology the
            plan records (its name, or the file it was made from, with its fingerprint checked).
        given_partials: time one ``Merger`` call: each rank's partial over its own KV shard is
            given, computed by the model's attention kernel, so the time is the merge's alone
            (communication, merges and copies). False: one layer of a decode step, each rank's
            attention included, as ``plan.predicted_us``.

    Returns:
        The ``treeattn.cost.simresult.SimResult``: ``predicted_us`` (until the last result
        rank holds its rows), ``per_rank_finish_us``, ``critical_path``, ``timeline``.

    Raises:
        treeattn.errors.InputError: not a Plan, a path or a plan's text; a plan file that cannot
            be read (``PlanFormatError``, as ``load_plan``'s); a topology that is unknown, changed since the
            plan was made, or of another rank count; ``given_partials`` with a plan that moves
            KV or reduces a raw payload (a Merger runs neither).

    Examples:
        >>> plan = search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len=131072)
        >>> simulate_plan(plan, given_partials=True).predicted_us < plan.predicted_us
        True
    """
    from treeattn.cost.simulate import simulate
    from treeattn.plan.validate import check

    if not isinstance(plan, (Plan, str, os.PathLike)):
        raise InputError(f"simulate_plan plan must be a Plan (search_plan's, build_plan's or load_plan's), a plan "
                         f"file's path or a plan's text, got {type(plan).__name__}")
    if not isinstance(given_partials, bool):
        raise InputError(f"simulate_plan given_partials must be True or False, got {given_partials!r}")
    with _named("simulate_plan"):
        if not isinstance(plan, Plan):
            plan = plan_io.load_plan(plan)
        check(plan)
        if topology is None:
            ref = plan.topology
            topo = resolve_recorded(ref.name, ref.fingerprint, ref.source,
                                    None if ref.base is None else Path(ref.base, "plan"), ranks=plan.ranks,
                                    option="topology=")
        else:
            topo = _topology(topology, "simulate_plan")
        return simulate(plan, topo, timeline=True, given_partials=given_partials)


def _topology(topology: str | os.PathLike | Topology, fn: str) -> Topology:
    """The topology ``fn`` was given, resolved; anything else is named here, where ``str()``
    would make it an unknown topology called 'None' or '8'."""
    if isinstance(topology, Topology):
        return topology
    if not isinstance(topology, (str, os.PathLike)):
        raise InputError(f"{fn} topology must be a name, a file's path or a Topology, got {topology!r}")
    return resolve(os.fspath(topology))


@contextlib.contextmanager
def _named(fn: str) -> Iterator[None]:
    """Errors from below name the call they came through, as its own checks' do."""
    try:
        yield
    except InputError as e:
        if str(e).startswith(fn) or f"{fn}." in str(e):  # named already: search_plan.seq_len
            raise
        raise type(e)(f"{fn}: {e}") from None


def build_plan(topology: str | os.PathLike | Topology, workload_or_model: Payload | ModelPreset | str,
               algorithm: str, *, batch: int | None = None, seq_len: int | str | None = None, result: str = "all",
               chunks: int = 1, **options: Any) -> Plan:
    """The plan of one named algorithm, as ``treeattn plan --algorithm NAME`` builds it (no search):
    a family (``tree``, ``butterfly``, ``hierarchical``, ...) with the parameters given, or a
    method treeattn is compared with (``allreduce2``, ``allgather-merge``, ``dcp-a2a``, ...).

    Args:
        topology: as ``search_plan``'s.
        workload_or_model: as ``search_plan``'s, with ``batch`` and ``seq_len``.
        algorithm: a name ``treeattn plan --algorithm list`` lists.
        result: ``all``, ``heads`` or ``root[:R]``, one the algorithm builds (``--algorithm list``):
            ``dcp-a2a`` and ``dcp-ag-rs`` build ``heads`` only, and the default ``all`` is refused.
        chunks: row chunks to pipeline, as ``plan --chunks`` counts them: a ring's per segment
            and a ``heads`` plan's per rank, so that ``plan.chunks`` is then ``chunks`` x the ranks.
        **options: the algorithm's parameters (``root``, ``fanout``, ``parents``, ``groups``,
            ``order``, ``roots``, ``trees``, ``shape``, ``intra``, ``inter``, ``group_size``:
            ``--algorithm list`` says which it takes; ``whole_rows=True`` with ``result="heads"``:
            the algorithm's all plan in one chunk, each rank keeping its own heads (``plan
            --whole-rows``); ``hierarchical`` without ``groups`` or
            ``group_size`` groups the ranks by node), ``mem_fraction`` and the workload options
            of ``search_plan``.

    Returns:
        The plan, ``predicted_us`` and ``notes['plan']`` (lower bound, baselines) filled: the
        plan ``treeattn plan --algorithm`` writes for the same inputs.

    Raises:
        treeattn.errors.InputError: an unknown topology, model, algorithm or option, a parameter
            the algorithm does not take, or a layout it does not build.

    Examples:
        >>> plan = build_plan("dgx-h100", "llama-3.1-8b", "dcp-a2a", batch=1, seq_len=131072, result="heads")
        >>> plan.algorithm, plan.result
        ('dcp-a2a', 'heads')
    """
    from treeattn.cost.memory import check_kv_fits
    from treeattn.plan.builders import build_root

    unknown = sorted(set(options) - set(_ALGORITHM_OPTIONS) - set(_WORKLOAD_OPTIONS) - {"mem_fraction"})
    if unknown:
        raise InputError(f"build_plan takes no option {unknown[0]!r}; it takes "
                         f"{', '.join((*_ALGORITHM_OPTIONS, *_WORKLOAD_OPTIONS, 'mem_fraction'))}")
    fraction = _mem_fraction(options, "build_plan")
    if not isinstance(algorithm, str):
        raise InputError(f"build_plan algorithm must be a name (treeattn plan --algorithm list), got {algorithm!r}")
    kw = {k: options[k] for k in _ALGORITHM_OPTIONS if k in options}
    for key, value in kw.items():  # the builders read them as they go: a wrong type would mislead there
        if not _OPTION_TYPES[key][0](value):
            raise InputError(f"build_plan {key} must be {_OPTION_TYPES[key][1]}, got {value!r}")
    with _named("build_plan"):
        topo = _topology(topology, "build_plan")
        workload = _workload(topo, workload_or_model, batch, seq_len, options, "build_plan")
        layout, root = parse_result(result, topo.num_ranks)
        root = build_root(algorithm, result, root, kw.get("root"),
                          f"build_plan root={kw.get('root')} and result={result!r} name different roots")
        if root is not None:
            kw["root"] = root
        kw["result"] = layout  # "all" too: an algorithm that does not build it is refused, not switched
        if algorithm == "hierarchical" and "groups" not in kw and "group_size" not in kw:
            kw["groups"] = node_groups(topo)
        check_kv_fits(workload, topo, fraction, option="mem_fraction")
        plan, report = named_plan(topo, workload, algorithm, chunks, kw, fraction)
        _warn_weights(workload, topo, fraction, report["best"]["peak_bytes"])
    return _sourced(plan, topology, topo)


def _warn_uncalibrated(topo: Topology, topology: str | os.PathLike | Topology, raw: bool) -> None:
    """Warn where a search ranks schedules for host ranks on figures not fitted to this machine,
    as ``treeattn plan`` notes: which measures fastest there can differ. (``build_plan`` is
    given its algorithm: an example that builds one to check results need not hear it.)"""
    from treeattn.cost.library import host_search_note

    spec = topo.name if isinstance(topology, Topology) else os.fspath(topology)
    if note := host_search_note(topo, spec, raw):
        warnings.warn(note, stacklevel=3)


def _mem_fraction(options: dict[str, Any], fn: str) -> float:
    """``options``' ``mem_fraction`` (``--mem-fraction``: the share of each device's memory a rank
    may use), checked, or the CLI's default."""
    from treeattn.cost.memory import DEFAULT_MEM_FRACTION

    value = options.get("mem_fraction", DEFAULT_MEM_FRACTION)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InputError(f"{fn} mem_fraction must be a number in (0, 1], got {value!r}")
    return float(value)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v: object) -> bool:
    return isinstance(v, (list, tuple)) and all(map(_int, v))


_OPTION_TYPES: dict[str, tuple[Any, str]] = {
    "root": (_int, "a rank (an integer)"), "fanout": (_int, "an integer"), "trees": (_int, "an integer"),
    "group_size": (_int, "an integer"),
    "groups": (lambda v: isinstance(v, (list, tuple)) and all(map(_ints, v)),
               "a list of rank lists, e.g. [[0, 1], [2, 3]]"),
    "parents": (lambda v: _ints(v) or (isinstance(v, (list, tuple)) and bool(v) and all(map(_ints, v))),
                "a parent per rank, -1 at the root (multirail: a list of them)"),
    "order": (_ints, "a list of ranks"), "roots": (_ints, "a list of ranks"),
    "shape": (lambda v: isinstance(v, str), "a shape name (star, chain, kary, binomial)"),
    "intra": (lambda v: isinstance(v, str), "a shape name"), "inter": (lambda v: isinstance(v, str), "a shape name"),
    "whole_rows": (lambda v: isinstance(v, bool), "true or false"),
}
"""What each algorithm parameter of ``build_plan`` must be, and how its error says it."""


def node_groups(topo: Topology) -> list[list[int]]:
    """``hierarchical`` without groups: the ranks of each node form a group."""
    if len(topo.node_ranks) < 2:
        raise InputError(f"algorithm hierarchical: {topo.name!r} is one node, so there is no group to form by "
                         "node; give groups (plan --groups 0-3/4-7, build_plan groups=[[0, 1], [2, 3]]) "
                         "or a group size (--group-size N, group_size=N)")
    return [list(g) for g in topo.node_ranks]


def named_plan(topo: Topology, payload: Payload, algorithm: str, chunks: int | None, kw: dict[str, Any],
               mem_fraction: float) -> tuple[Plan, dict]:
    """Build, time and describe one named algorithm's plan: the plan (``predicted_us``, and
    ``notes['plan']``: lower bound, ratio to it, baselines) and the report ``treeattn plan``
    prints (``--json``)."""
    from treeattn.cost.bounds import plan_bounds
    from treeattn.cost.memory import memory_check
    from treeattn.cost.simulate import simulate
    from treeattn.exec.predict import plan_baselines
    from treeattn.plan.builders import build
    from treeattn.search import baselines
    from treeattn.search.result import Candidate

    plan = build(algorithm, payload, topo, chunks=chunks if chunks is not None else 1, **kw)
    t = simulate(plan, topo, timeline=False).predicted_us
    bound = plan_bounds(plan, topo)
    layout, root = ("heads", None) if plan.layout == "heads" else (
        ("all", None) if plan.result == "all" else ("root", plan.result_ranks[0]))
    base = baselines(topo, payload, result=layout, root=root)
    methods, _ = plan_baselines(plan, topo)
    base_peaks = {b.key: None if base.get(b.key) is None else memory_check(
                      build(b.name, payload, topo, **b.kwargs), topo, mem_fraction).peak_bytes for b in methods}
    mem = memory_check(plan, topo, mem_fraction)
    ratio = t / bound.bound_us if bound.bound_us > 0 else None
    notes = {**plan.notes, "plan": {"lower_bound_us": bound.bound_us, "bound_cut": bound.cut,
                                    "ratio_to_bound": ratio, "baselines": base}}
    plan = dataclasses.replace(plan, predicted_us=t, notes=notes)
    params = {k: v for k, v in plan.params.items() if k not in ("chunks",)}
    # the chunks asked for, as a search's candidates count them (a ring's per segment, a heads
    # plan's per rank); the plan's own chunks count them all
    entry = Candidate(algorithm, params, chunks or 1, t, ratio, builder=algorithm, peak_bytes=mem.peak_bytes,
                      build_params=dict(kw)).to_dict()
    left = [] if mem.fits else [{"algorithm": algorithm, "reason": "memory", "why": mem.why(),
                                 "peak_bytes": mem.peak_bytes}]
    return plan, {"best": entry, "candidates": [entry], "lower_bound_us": bound.bound_us, "baselines": base,
                  "baseline_peak_bytes": base_peaks, "memory_limit_bytes": mem.limit_bytes, "left_out": left}


def _workload(topo: Topology, workload_or_model: Payload | ModelPreset | str, batch: int | None,
              seq_len: int | str | None, options: dict[str, Any], fn: str) -> Payload:
    """The workload ``fn`` (``search_plan``, ``build_plan``) was given (an attention ``Workload``
    or a ``RawPayload``, the CLI's ``--bytes``), or made from a model."""
    from treeattn.search.search import check_ranks
    from treeattn.search.workload_file import workload_from_dict

    shape = {k: options[k] for k in _WORKLOAD_OPTIONS if k in options}
    if isinstance(workload_or_model, (Workload, RawPayload)):
        if shape or batch is not None or seq_len is not None:
            raise InputError(f"give batch, seq_len and workload options with a model, not with a "
                             f"{type(workload_or_model).__name__}")
        check_ranks(workload_or_model, topo)  # before the memory check reads its split
        for note in payload_notes(workload_or_model):
            warnings.warn(note, stacklevel=3)
        return workload_or_model
    if not isinstance(workload_or_model, (ModelPreset, str)):
        raise InputError(f"{fn}: give a model preset's name ('llama-3.1-8b'; presets' shapes may be overridden: "
                         "q_heads=, kv_heads=, head_dim=...), your own model's shape as a treeattn.workload."
                         "Workload (Workload.create(...)), or a treeattn.workload.RawPayload (a plain sum); got "
                         f"{type(workload_or_model).__name__}")
    name = workload_or_model.name if isinstance(workload_or_model, ModelPreset) else workload_or_model
    if name not in MODELS and (name.endswith((".yaml", ".yml", ".json")) or Path(name).is_file()):
        # a workload file where plan --workload takes one: the file's reader is one call away
        raise InputError(f"{fn}: {name!r} is a file, not a model preset: read a workload file with "
                         f"treeattn.search.workload_file.load_workload({name!r}, ranks=...) and give its Workload")
    check_model(name)
    if batch is None or seq_len is None:
        raise InputError(f"{fn} with a model needs batch= and seq_len=")
    # The CLI's and workload files' own reader: "128K" reads as there, and a bad value is refused alike.
    workload = workload_from_dict({"model": name, "batch": batch, "seq_len": seq_len, **shape},
                                  ranks=topo.num_ranks, where=fn)
    for note in payload_notes(workload):
        warnings.warn(note, stacklevel=3)
    return workload


def _warn_weights(workload: Payload, topo: Topology, fraction: float, peak_bytes: int | None) -> None:
    """Warn (``UserWarning``) where a model preset's weights would not fit beside the plan's
    peak (``treeattn.cost.memory.weights_note``)."""
    from treeattn.cost.memory import weights_note

    note = weights_note(workload, topo, fraction, option="mem_fraction", peak_bytes=peak_bytes)
    if note:
        warnings.warn(note, stacklevel=4)


def _sourced(plan: Plan, topology: str | Topology, topo: Topology) -> Plan:
    """``plan`` recording where its topology came from, so that a saved plan finds it again
    (``save_plan``); a ``Topology`` object given has no source to record."""
    if isinstance(topology, Topology):
        return plan
    source = recorded_source(str(topology), topo)
    return dataclasses.replace(plan, topology=dataclasses.replace(plan.topology, source=source))


def load_plan(source: str | Path) -> Plan:
    """A plan from its file, or from its text (a ``str`` holding a newline or JSON): what
    ``treeattn plan`` and ``save_plan`` write.

    Args:
        source: a path (``str`` or ``Path``), or a plan's text (a ``str`` holding a newline, or
            JSON on one line).

    Returns:
        The plan (upgraded to the current version if it was older).

    Raises:
        treeattn.errors.PlanFormatError: not a path or text, an unreadable file, a syntax
            error, or a wrong tag, version, field or type.
    """
    if not isinstance(source, (str, os.PathLike)):
        # Path() would raise a TypeError naming no argument
        raise PlanFormatError(f"load_plan takes a plan file's path or a plan's text, got {source!r}")
    return plan_io.load_plan(source)


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write ``plan`` where ``treeattn run``, ``simulate`` and ``load_plan`` read it (JSON when
    the name ends in ``.json``, else YAML), as ``treeattn plan`` writes its plans: a topology
    file the plan was searched on is recorded relative to the plan's folder, so ``run`` finds
    it from any directory.

    Args:
        plan: the plan (``search_plan``'s or ``load_plan``'s).
        path: the file to write, in a folder that exists (not a folder: unlike ``plan --out``,
            it picks no name).

    Returns:
        The path written.

    Raises:
        treeattn.errors.InputError: ``plan`` is not a Plan or ``path`` not a path; the file cannot
            be written, or holds something that is not a plan (left as it is); or the plan names
            its topology file relative to a folder it does not know (loaded from text, not from
            its file) and that path does not find the topology from ``path``'s folder either.
    """
    if not isinstance(plan, Plan):
        raise InputError(f"save_plan plan must be a Plan (search_plan's, build_plan's or load_plan's), "
                         f"got {type(plan).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"save_plan path must be a file's path, got {path!r}")
    folder = os.fspath(path).endswith(("/", os.sep))  # Path drops the slash that says a folder is meant
    path = Path(path)
    # 'Is a directory' would not say that plan --out's rule (a default name inside) does not apply.
    if folder or path.is_dir():
        raise InputError(f"save_plan path {str(path)!r} is a folder: give the plan file's path "
                         f"({str(path / 'NAME.yaml')!r}, or .json)")
    if (why := wrong_kind(path, "plan")) and not special_file(path):
        raise InputError(f"save_plan path {str(path)!r}: {why}")
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
        return plan_io.save_plan(plan, path)
    except OSError as exc:
        raise InputError(f"cannot write plan {str(path)!r}: {exc.strerror or exc}") from None
