"""Plan files: YAML or JSON, versioned, type-tagged, byte-for-byte deterministic.

A plan file is a mapping tagged ``format: treeattn-plan`` with a ``version`` (see
``PLAN_VERSION``). Older versions are upgraded on load by the functions in ``UPGRADES``
(``UPGRADES[v]`` turns a version-v mapping into a version-v+1 one), as pipx upgrades its
metadata files. The file is parsed by pydantic models (``extra='forbid'``) at this boundary
only; inside, a plan is the frozen ``Plan`` dataclass. Errors name the file, the field
path (``programs[3][7].peer``) and what is wrong.

Layout (the same keys in JSON)::

    format: treeattn-plan
    version: 2
    algorithm: binomial
    chunks: 2
    result_ranks: [0, 1, 2, 3]
    layout: heads            # only when not ``full`` (see ``treeattn.plan.ir``)
    predicted_us: null
    topology: {fingerprint: "sha256:...", name: dgx-h100}   # and source: FILE, for a topology file
    workload: {batch: 1, head_dim: 128, kind: attention, ...}
    params:
      parents: [-1, 0, 0, 2]
    notes: {}
    programs:
      # rank 0
      - - {kind: compute, step: 0}
        - {kind: recv_merge, step: 1, peer: 1, chunk: 0}

Mappings whose order means nothing (workload, params, notes, topology) are written with
sorted keys; each op is one line with its fields in a fixed order.

A big plan that a builder makes is written compact: ``programs: built`` instead of the ops,
which its builder makes again from ``algorithm`` and ``params`` when the file is read
(``treeattn.plan.compact``), so every reader gets the same ``Plan``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal, Required

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from treeattn.errors import PlanFormatError, TreeattnError
from treeattn.plan.compact import BUILT, COMPACT_ABOVE_OPS, compact_args, expand
from treeattn.plan.ir import (
    COLLECTIVES,
    LAYOUTS,
    PARTS,
    PLAN_VERSION,
    REDUCES,
    Op,
    OpKind,
    Plan,
    TopologyRef,
    _unchecked_op,
    gc_paused,
)
from treeattn.textfile import keep_foreign_file, read_text, write_file
from treeattn.units import DType, check_bytes
from treeattn.workload import Payload, RawPayload, Workload
from treeattn.yamlkeys import refusing_repeats

__all__ = [
    "FORMAT_TAG",
    "YAML_HEADER",
    "UPGRADES",
    "dump_plan",
    "load_plan",
    "save_plan",
    "check_plan_path",
    "plan_to_dict",
    "plan_from_dict",
    "payload_from_dict",
    "plan_json_schema",
]

FORMAT_TAG = "treeattn-plan"
"""Value of the ``format`` key of every plan file."""

YAML_HEADER = (
    "# treeattn plan (docs/plan-format.md). predicted_us: simulated microseconds until every result",
    "# rank holds the result; for attention, one layer of one decode step, local attention included.",
)
"""The comment a YAML plan file starts with (JSON has no comments; the format is the same)."""


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    # Version 2 added the heads layout (``layout``), compute sharing a step with transfers, more
    # collectives and the topology's ``source``; a version-1 plan means the same under version 2.
    return {**data, "version": 2}


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}
"""``UPGRADES[v](data)`` returns the version v + 1 form of a version-v plan mapping (and sets
``version``). Add one whenever ``PLAN_VERSION`` is bumped."""

# Plans are written by treeattn, but edited by hand too: a key given twice is refused, not
# taken last-wins (YAML's and JSON's default).
_SafeLoader = refusing_repeats(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _pairs_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out

# -- the file boundary: pydantic models ----------------------------------------------------

_Forbid = ConfigDict(extra="forbid")
_NonNeg = Annotated[StrictInt, Field(ge=0)]
_Pos = Annotated[StrictInt, Field(ge=1)]


class _OpFile(TypedDict, total=False):
    __pydantic_config__ = _Forbid  # type: ignore[misc]
    kind: Required[Literal[tuple(k.value for k in OpKind)]]  # type: ignore[valid-type]
    step: Required[_NonNeg]
    peer: _NonNeg | None
    chunk: _NonNeg | None
    block: _NonNeg | None
    coll: Literal[COLLECTIVES] | None  # type: ignore[valid-type]
    reduce: Literal[REDUCES] | None  # type: ignore[valid-type]
    part: Literal[PARTS] | None  # type: ignore[valid-type]


_DTypes = Literal[tuple(d.value for d in DType)]  # type: ignore[valid-type]


class _AttentionFile(BaseModel):
    model_config = _Forbid
    kind: Literal["attention"]
    batch: _Pos
    q_heads: _Pos
    kv_heads: _Pos
    head_dim: _Pos
    seq_len: _NonNeg
    split: list[_NonNeg]
    kv_dtype: _DTypes = "bf16"
    partial_dtype: _DTypes = "fp32"
    layers: _Pos = 1
    model: StrictStr | None = None
    v_head_dim: _Pos | None = None
    kv_latent: StrictBool = False


class _RawFile(BaseModel):
    model_config = _Forbid
    kind: Literal["raw"]
    nbytes: _Pos
    ranks: _Pos
    dtype: _DTypes = "fp32"
    op: Literal["sum"] = "sum"  # a raw buffer is summed (``RawPayload``)


class _TopologyFile(BaseModel):
    model_config = _Forbid
    name: StrictStr
    fingerprint: StrictStr
    source: StrictStr | None = None


class _PlanFile(BaseModel):
    """A treeattn plan file (see ``treeattn.plan.ir`` for what the ops mean)."""

    model_config = ConfigDict(extra="forbid", title="treeattn plan")
    format: Literal["treeattn-plan"]
    version: Literal[PLAN_VERSION]  # type: ignore[valid-type]
    algorithm: StrictStr
    chunks: _Pos
    result_ranks: list[_NonNeg]
    layout: Literal[LAYOUTS] = "full"  # type: ignore[valid-type]
    contributors: list[_NonNeg] | None = None
    predicted_us: Annotated[StrictFloat, Field(ge=0)] | None = None
    topology: _TopologyFile
    workload: Annotated[_AttentionFile | _RawFile, Field(discriminator="kind")]
    params: dict[str, Any] = Field(default_factory=dict)
    notes: dict[str, Any] = Field(default_factory=dict)
    programs: list[list[_OpFile]]
    """Or, in the file, the string ``built`` (a compact plan; read before validation)."""


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of a plan file (current version).

    Returns:
        A JSON-serialisable dict (draft 2020-12, as pydantic writes it).
    """
    schema = _PlanFile.model_json_schema()
    schema["$id"] = f"https://treeattn/schemas/plan-v{PLAN_VERSION}.json"
    return schema


# -- loading -------------------------------------------------------------------------------


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i == 1 and loc[0] == "workload" and part in ("attention", "raw"):
            continue  # the union's tag, not a field
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def payload_from_dict(data: dict[str, Any], *, source: str = "workload") -> Payload:
    """Parse what ``Workload.to_dict`` or ``RawPayload.to_dict`` wrote.

    Args:
        data: the mapping (``kind`` is ``attention`` or ``raw``).
        source: how to name it in errors.

    Returns:
        The ``Workload`` or ``RawPayload``.

    Raises:
        PlanFormatError: naming the field that is wrong.
    """
    kind = data.get("kind") if isinstance(data, dict) else None
    model = {"attention": _AttentionFile, "raw": _RawFile}.get(kind)  # type: ignore[arg-type]
    if model is None:
        raise PlanFormatError(f"{source}.kind must be 'attention' or 'raw', got {_short(kind)}")
    try:
        m = model.model_validate(data)
    except ValidationError as exc:
        raise _format_error(source, exc, prefix=("workload",)) from None
    return _payload(m, source)


def _payload(m: _AttentionFile | _RawFile, source: str) -> Payload:
    try:
        if isinstance(m, _RawFile):
            return RawPayload(nbytes=check_bytes(m.nbytes, "workload.nbytes"), ranks=m.ranks, dtype=m.dtype, op=m.op)
        if sum(m.split) != m.seq_len:
            raise PlanFormatError(f"{source}: workload.seq_len is {m.seq_len} but split sums to {sum(m.split)}")
        return Workload(batch=m.batch, q_heads=m.q_heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                        split=tuple(m.split), kv_dtype=m.kv_dtype, partial_dtype=m.partial_dtype,
                        layers=m.layers, model=m.model, v_head_dim=m.v_head_dim, kv_latent=m.kv_latent)
    except PlanFormatError:
        raise
    except TreeattnError as exc:
        raise PlanFormatError(f"{source}: {exc}") from None


def _format_error(source: str, exc: ValidationError, prefix: tuple[Any, ...] = ()) -> PlanFormatError:
    errors = exc.errors()
    first = errors[0]
    loc = prefix + tuple(first["loc"])
    msg = first["msg"]
    if first["type"] == "missing":
        text = f"{_path(loc)} is missing"
    elif first["type"] == "extra_forbidden":
        text = f"{_path(loc)} is not a known field"
    else:
        text = f"{_path(loc)}: {msg}, got {_short(first.get('input'))}"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return PlanFormatError(f"{source}: {text}{more}")


def _upgrade(data: dict[str, Any], source: str) -> dict[str, Any]:
    if "format" not in data:
        raise PlanFormatError(f"{source}: not a plan file: no 'format: {FORMAT_TAG}' key")
    if data["format"] != FORMAT_TAG:
        raise PlanFormatError(f"{source}: format is {_short(data['format'])}, expected {FORMAT_TAG!r}; "
                              "is this a plan file?")
    version = data.get("version")
    if "version" not in data:
        raise PlanFormatError(f"{source}: version is missing (this treeattn writes {PLAN_VERSION})")
    if type(version) is not int:
        raise PlanFormatError(f"{source}: version must be an integer, got {_short(version)}")
    if version > PLAN_VERSION:
        raise PlanFormatError(f"{source}: plan version {version} was written by a newer treeattn; this one reads "
                              f"versions up to {PLAN_VERSION}: upgrade treeattn")
    while version < PLAN_VERSION:
        step = UPGRADES.get(version)
        if step is None:
            raise PlanFormatError(f"{source}: plan version {version} is not supported and cannot be upgraded "
                                  f"(this treeattn reads version {PLAN_VERSION})")
        data = step(dict(data))
        version = data.get("version")
    return data


def plan_from_dict(data: Any, *, source: str = "<data>") -> Plan:
    """Validate a parsed plan mapping (any supported version) and build the ``Plan``.

    Args:
        data: what a YAML/JSON parser returned.
        source: the file name for error messages.

    Returns:
        The plan.

    Raises:
        PlanFormatError: wrong type tag or version, unknown or missing field, wrong type.
    """
    if data is None:
        raise PlanFormatError(f"{source}: not a plan file: it is empty")
    if not isinstance(data, dict):
        raise PlanFormatError(f"{source}: not a plan file: expected a mapping with 'format: {FORMAT_TAG}', "
                              f"got {type(data).__name__}")
    data = _upgrade(data, source)
    built = data.get("programs") == BUILT
    try:
        m = _PlanFile.model_validate({**data, "programs": []} if built else data)
    except ValidationError as exc:
        raise _format_error(source, exc) from None
    workload = _payload(m.workload, source)
    if built:
        return _expanded(m, workload, source)
    programs = []
    kinds = {k.value: k for k in OpKind}
    coll_k, compute_k = OpKind.COLLECTIVE, OpKind.COMPUTE
    for r, prog in enumerate(m.programs):
        ops = []
        for i, d in enumerate(prog):
            kind = kinds[d["kind"]]
            get = d.get
            peer, coll, reduce, part = get("peer"), get("coll"), get("reduce"), get("part")
            # The checks of Op.__post_init__, in bulk (with the field path).
            if kind is coll_k:
                if coll is None or reduce is None or part is None:
                    missing = next(x for x in ("coll", "reduce", "part") if get(x) is None)
                    raise PlanFormatError(f"{source}: programs[{r}][{i}].{missing}: a collective op needs coll, "
                                          "reduce and part")
            elif peer is None and kind is not compute_k:
                raise PlanFormatError(f"{source}: programs[{r}][{i}].peer: a {kind.value} op needs a peer")
            ops.append(_unchecked_op(kind, d["step"], peer, get("chunk"), get("block"), coll, reduce, part))
        programs.append(tuple(ops))
    try:
        return Plan(
            algorithm=m.algorithm,
            params=m.params,
            workload=workload,
            topology=TopologyRef(m.topology.name, m.topology.fingerprint, m.topology.source),
            chunks=m.chunks,
            programs=tuple(programs),
            result_ranks=tuple(m.result_ranks),
            predicted_us=m.predicted_us,
            version=m.version,
            notes=m.notes,
            contributors=None if m.contributors is None else tuple(m.contributors),
            layout=m.layout,
        )
    except PlanFormatError as exc:
        raise PlanFormatError(f"{source}: {exc}") from None


def _expanded(m: _PlanFile, workload: Payload, source: str) -> Plan:
    """The plan of a compact file (``programs: built``): its builder run on its params, then
    checked against the header, which must describe what the builder makes."""
    topology = TopologyRef(m.topology.name, m.topology.fingerprint, m.topology.source)
    try:
        plan = expand(m.algorithm, m.params, workload, topology)
    except PlanFormatError as exc:
        raise PlanFormatError(f"{source}: {exc}") from None
    header = {"chunks": m.chunks, "result_ranks": tuple(m.result_ranks), "layout": m.layout,
              "contributors": None if m.contributors is None else tuple(m.contributors)}
    for key, value in header.items():
        if getattr(plan, key) != value:
            raise PlanFormatError(f"{source}: {_header_mismatch(key, value, getattr(plan, key))} "
                                  f"({m.algorithm})")
    return replace(plan, predicted_us=m.predicted_us, notes=m.notes, version=m.version)


def _header_mismatch(key: str, value: object, made: object) -> str:
    """How a compact file's header ``value`` differs from what the builder ``made``, in one short
    line: lists of thousands of ranks by their length or their first differing place."""
    if not (isinstance(value, tuple) and isinstance(made, tuple)) or len(value) + len(made) <= 16:
        return f"{key}: {value!r} is not what the builder makes from params ({made!r})"
    if len(value) != len(made):
        return f"{key}: {len(value)} ranks, where the builder makes {len(made)} from params"
    i = next(i for i, (a, b) in enumerate(zip(value, made, strict=True)) if a != b)
    return f"{key}[{i}]: {value[i]!r} is not what the builder makes from params ({made[i]!r}; {len(made)} ranks)"


_PROGRAMS = re.compile(r"^programs:\n", re.M)
_NUM = r"-?(?:0|[1-9][0-9]*)"
_OP_RE = (r"\{kind: (?:compute|send|recv_merge|recv_copy|collective), step: " + _NUM
          + r"(?:, peer: " + _NUM + r")?(?:, chunk: " + _NUM + r")?(?:, block: " + _NUM + r")?"
          + r"(?:, coll: (?:" + "|".join(COLLECTIVES) + r"), reduce: (?:" + "|".join(REDUCES) + r"), part: (?:"
          + "|".join(PARTS) + r"))?\}")
_BODY = re.compile(r"(?:(?:  #[^\n]*|  - \[\]|  - - " + _OP_RE + r"|    - " + _OP_RE + r")?\n)*")
_TO_JSON = [("{kind: ", '{"kind": "'), (", step: ", '", "step": '), (", peer: ", ', "peer": '),
            (", chunk: ", ', "chunk": '), (", block: ", ', "block": '), (", coll: ", ', "coll": "'),
            (", reduce: ", '", "reduce": "'), (", part: ", '", "part": "')] + [
    (f'"part": "{part}}}', f'"part": "{part}"}}') for part in PARTS]
_INT_LIST = re.compile(r"^( {0,2})([A-Za-z_][A-Za-z0-9_]*): (\[[-0-9, ]*\])$")


def _fast_yaml(text: str) -> dict[str, Any] | None:
    """Parse a plan file in the exact layout ``dump_plan`` writes, or return None.

    PyYAML builds every node in Python (about 80 s for a 16,384-rank plan). The programs
    section of our own layout (one flow mapping per op, fixed key order, closed vocabulary)
    is checked against one regular expression and rewritten into JSON, and so are the
    header's lists of integers (parent lists, orders): both give the values YAML would.
    Any other layout of the programs (hand edits, comments after an op, other scalars or
    key orders) returns None and the caller parses the whole file with YAML.
    """
    found = list(_PROGRAMS.finditer(text))
    if len(found) != 1:
        return None
    body = text[found[0].end():]
    if not body.endswith("\n") or not _BODY.fullmatch(body):
        return None
    for old, new in _TO_JSON:
        body = body.replace(old, new)
    ranks: list[list[str]] = []
    for line in body.split("\n"):
        if line.startswith("    - "):
            if not ranks:
                return None
            ranks[-1].append(line[6:])
        elif line.startswith("  - - "):
            ranks.append([line[6:]])
        elif line == "  - []":
            ranks.append([])
    lines = text[:found[0].start()].split("\n")
    lists: list[tuple[str | None, str, list[int]]] = []
    parent = None
    try:
        programs = json.loads("[" + ",".join("[" + ",".join(ops) + "]" for ops in ranks) + "]")
        for i, line in enumerate(lines):
            if not line.startswith(" "):
                parent = line[:-1] if line.endswith(":") and _PLAIN.fullmatch(line[:-1]) else None
            m = _INT_LIST.match(line)
            if m and m.group(2).lower() not in _RESERVED and (not m.group(1) or parent):
                lists.append((parent if m.group(1) else None, m.group(2), json.loads(m.group(3))))
                lines[i] = f"{m.group(1)}{m.group(2)}: []"
    except ValueError:
        return None
    data = yaml.load("\n".join(lines), Loader=_SafeLoader)  # noqa: S506 - a safe loader
    if not isinstance(data, dict) or "programs" in data:
        return None
    for parent, key, values in lists:
        where = data.get(parent) if parent else data
        if not isinstance(where, dict) or where.get(key) != []:
            return None
        where[key] = values
    data["programs"] = programs
    return data


def load_plan(source: str | Path) -> Plan:
    """Read a plan from a YAML or JSON file, or from its text.

    Args:
        source: a path (``str`` or ``Path``), or the text of a plan (a ``str`` holding a newline).

    Returns:
        The plan (upgraded to the current version if it was older).

    Raises:
        PlanFormatError: unreadable file, syntax error, wrong tag/version/field/type.
    """
    if isinstance(source, str) and ("\n" in source or source.lstrip().startswith("{")):
        text, name = source, "<text>"
    elif isinstance(source, str) and not source.strip():
        raise PlanFormatError(f"no plan: the path or text given is empty ({source!r})")
    else:
        path = Path(source)
        name = str(path)
        text = read_text(path, "plan file", PlanFormatError)
    with gc_paused():
        plan = _parse(text, name)
    if name == "<text>" or plan.topology.source is None:
        return plan
    return replace(plan, topology=replace(plan.topology, base=str(Path(name).resolve().parent)))


def _parse(text: str, name: str) -> Plan:
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text, object_pairs_hook=_pairs_once)
        except json.JSONDecodeError as exc:
            raise PlanFormatError(f"{name}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") \
                from None
        except ValueError as exc:  # _pairs_once's
            raise PlanFormatError(f"{name}: {exc}") from None
        except RecursionError:  # brackets opened thousands deep: no plan nests so
            raise PlanFormatError(f"{name}: not valid JSON: nested too deeply") from None
    else:
        try:
            data = _fast_yaml(text)
            if data is None:
                data = yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a safe loader
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise PlanFormatError(f"{name}: not valid YAML{where}: {problem}") from None
    return plan_from_dict(data, source=name)


# -- dumping -------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_RESERVED = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "nan", "inf"}
# Escaped inside quotes: what YAML cannot print, and the line breaks it would fold (NEL, LS, PS).
_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def _float(x: float) -> str:
    if not math.isfinite(x):
        raise PlanFormatError(f"cannot write {x!r}: plan files hold finite numbers only")
    text = repr(x)
    if "e" in text and "." not in text.split("e")[0]:
        mant, exp = text.split("e")
        text = f"{mant}.0e{exp}"  # YAML 1.1 floats need a dot
    return text


def _yaml_str(s: str) -> str:
    if _PLAIN.fullmatch(s) and s.lower() not in _RESERVED:
        return s
    text = json.dumps(s, ensure_ascii=False)
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _yaml_flow(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):
        return _yaml_str(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_yaml_str(k)}: {_yaml_flow(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_flow(x) for x in v) + "]"
    raise PlanFormatError(f"cannot write {v!r} ({type(v).__name__}) into a plan file")


def _json_flow(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)


_OP_FIELDS = ("peer", "chunk", "block", "coll", "reduce", "part")


def _op_yaml(op: Op) -> str:
    parts = [f"{{kind: {op.kind.value}, step: {op.step}"]
    for key in _OP_FIELDS:
        value = getattr(op, key)
        if value is not None:
            parts.append(f", {key}: {value}" if type(value) is int else f", {key}: {_yaml_flow(value)}")
    parts.append("}")
    return "".join(parts)


def _op_json(op: Op) -> str:
    parts = [f'{{"kind": "{op.kind.value}", "step": {op.step}']
    for key in _OP_FIELDS:
        value = getattr(op, key)
        if value is not None:
            parts.append(f', "{key}": {value}' if type(value) is int else f', "{key}": {json.dumps(value)}')
    parts.append("}")
    return "".join(parts)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as the plain mapping a plan file holds (keys in file order).

    Args:
        plan: the plan.

    Returns:
        A JSON-serialisable dict.
    """
    out = _header(plan)
    out["programs"] = [[op.to_dict() for op in prog] for prog in plan.programs]
    return out


def _header(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": FORMAT_TAG,
        "version": plan.version,
        "algorithm": plan.algorithm,
        "chunks": plan.chunks,
        "result_ranks": list(plan.result_ranks),
    }
    if plan.layout != "full":
        out["layout"] = plan.layout
    if plan.contributors is not None:
        out["contributors"] = list(plan.contributors)
    out["predicted_us"] = plan.predicted_us
    out["topology"] = {"fingerprint": plan.topology.fingerprint, "name": plan.topology.name}
    if plan.topology.source is not None:
        out["topology"]["source"] = plan.topology.source
    out["workload"] = plan.workload.to_dict()
    out["params"] = plan.params
    out["notes"] = plan.notes
    return out


def _check_op_values(plan: Plan) -> None:
    for r, prog in enumerate(plan.programs):
        for i, op in enumerate(prog):
            for key in ("step", "peer", "chunk", "block"):
                v = getattr(op, key)
                if v is not None and type(v) is not int:
                    raise PlanFormatError(f"cannot write programs[{r}][{i}].{key} = {v!r}: it must be an integer")


def dump_plan(plan: Plan, fmt: str = "yaml", compact: bool | None = None) -> str:
    """Write a plan as YAML or JSON text, byte-for-byte deterministic.

    Args:
        plan: the plan.
        fmt: ``yaml`` or ``json``.
        compact: write ``programs: built`` (the builder and its params stand for the ops;
            ``treeattn.plan.compact``) instead of the ops: True requires it, False never, None
            (the default) when the plan has more than ``COMPACT_ABOVE_OPS`` ops and its builder
            makes exactly its programs again.

    Returns:
        The text; ``load_plan(dump_plan(plan, fmt)) == plan``.

    Raises:
        PlanFormatError: unwritable values, or ``compact=True`` for a plan its builder does not make.
    """
    if fmt not in ("yaml", "json"):
        raise PlanFormatError(f"plan format must be 'yaml' or 'json', got {fmt!r}")
    if compact is None:
        compact = sum(map(len, plan.programs)) > COMPACT_ABOVE_OPS and compact_args(plan) is not None
    elif compact and compact_args(plan) is None:
        raise PlanFormatError(f"cannot write a {plan.algorithm} plan compact: its builder does not make exactly "
                              "these programs from its params")
    _check_op_values(plan)
    data = _header(plan)
    try:  # a lone surrogate has no UTF-8 form: refuse it rather than write a file that cannot be read
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PlanFormatError(f"cannot write {exc.object[exc.start:exc.end]!r}: plan files hold text that UTF-8 "
                              "can encode (no lone surrogates)") from None
    lines: list[str] = []
    if fmt == "yaml":
        lines.extend(YAML_HEADER)
        for key, value in data.items():
            if key in ("params", "notes") and value:
                lines.append(f"{key}:")
                lines.extend(f"  {_yaml_str(k)}: {_yaml_flow(value[k])}" for k in sorted(value))
            else:
                lines.append(f"{key}: {_yaml_flow(value)}")
        if compact:
            return "\n".join([*lines, f"programs: {BUILT}"]) + "\n"
        lines.append("programs:" if plan.programs else "programs: []")
        for r, prog in enumerate(plan.programs):
            lines.append(f"  # rank {r}")
            if not prog:
                lines.append("  - []")
                continue
            lines.append(f"  - - {_op_yaml(prog[0])}")
            lines.extend(f"    - {_op_yaml(op)}" for op in prog[1:])
        return "\n".join(lines) + "\n"
    lines.append("{")
    for key, value in data.items():
        lines.append(f'  "{key}": {_json_flow(value)},')
    if compact:
        lines.append(f'  "programs": "{BUILT}"')
    elif not plan.programs:
        lines.append('  "programs": []')
    else:
        lines.append('  "programs": [')
        for r, prog in enumerate(plan.programs):
            end = "," if r + 1 < len(plan.programs) else ""
            if not prog:
                lines.append(f"    []{end}")
                continue
            lines.append("    [")
            lines.extend(f"      {_op_json(op)}{',' if i + 1 < len(prog) else ''}" for i, op in enumerate(prog))
            lines.append(f"    ]{end}")
        lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save_plan(plan: Plan, path: str | Path, fmt: str | None = None, compact: bool | None = None) -> Path:
    """Write ``plan`` to ``path`` (JSON when the name ends in ``.json``, else YAML).

    Args:
        plan: the plan. path: where to write. fmt: ``yaml`` or ``json`` to override the suffix.
        compact: as ``dump_plan``'s.

    Returns:
        The path written.

    Raises:
        InputError: ``path`` holds a file that is not a plan (a topology, a source file): it is
            left as it is. An empty file, a plan of any version or a device (``/dev/stdout``)
            is written.
    """
    path = Path(path)
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "yaml")
    check_plan_path(path)
    write_file(path, dump_plan(plan, fmt, compact))
    return path


# The tag anywhere near the top: a YAML line, or a JSON key wherever a reformatting put it.
_TAGGED = re.compile(rf"""(?:^|[\s{{,])["']?format["']?\s*:\s*["']?{FORMAT_TAG}\b""", re.MULTILINE)


def check_plan_path(path: Path) -> None:
    """Refuse to write a plan over a regular file that is not one: ``plan -o`` given the wrong
    path (a topology beside it, a script) would lose that file for good."""

    def tagged(path: Path) -> bool:
        with path.open("rb") as f:
            return bool(_TAGGED.search(f.read(64 * 1024).decode("utf-8", errors="replace")))

    keep_foreign_file(path, tagged, "plan", f"no 'format: {FORMAT_TAG}'", "plan")
