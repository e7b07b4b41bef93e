"""Topology files: load (explicit, compact or family form), dump, JSON schema.

Every bad input raises ``TopologyError`` with one line naming the file, the YAML line
when known, the field path and what is wrong, e.g.
``bad.yaml:12: links[3].bw_gbps: must be > 0 (got -5)``.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from treeattn.errors import TopologyError
from treeattn.textfile import keep_foreign_file, read_text
from treeattn.topology.compact import build_compact, cost_params
from treeattn.topology.families import build_family_file
from treeattn.topology.model import (
    RATING_UNMEASURED,
    Device,
    DeviceKind,
    Link,
    LinkClass,
    LinkKind,
    Topology,
    check_rank_count,
    link_class,
)
from treeattn.topology.schema import (
    CompactFile,
    ExplicitFile,
    FamilyFile,
    FieldError,
    Loc,
    format_loc,
)
from treeattn.yamlkeys import RepeatedKeyError, refusing_repeats

__all__ = [
    "load_topology",
    "load_topology_text",
    "topology_from_data",
    "dump_topology",
    "topology_json_schema",
    "expand_ranks",
]

# libyaml when present: parsing and writing are then several times faster.
_Loader = refusing_repeats(getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_FORMS: dict[str, type[BaseModel]] = {"devices": ExplicitFile, "node": CompactFile, "family": FamilyFile}


def load_topology(path: str | Path) -> Topology:
    """Read a topology file in any of its three forms and check it is routable.

    Args:
        path: the YAML file.

    Returns:
        The validated Topology.
    """
    p = Path(path)
    return load_topology_text(read_text(p, "topology file", TopologyError), source=str(p))


def load_topology_text(text: str, source: str = "<text>") -> Topology:
    """Parse topology YAML (any form) and check it is routable.

    Args:
        text: the YAML document.
        source: what to call it in error messages (a file name).

    Returns:
        The validated Topology.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except RepeatedKeyError as exc:
        raise TopologyError(f"{source}:{exc.problem_mark.line + 1}: field {exc.key!r} is given twice") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise TopologyError(f"{source}{line}: YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source}: YAML error: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    return topology_from_data(data, source=source, lines=_LineMap(node))


def topology_from_data(data: Any, source: str = "<data>", lines: _LineMap | None = None) -> Topology:
    """Validate plain data (what a topology file holds) into a routable Topology.

    Args:
        data: a mapping in the explicit, compact or family form.
        source: what to call it in error messages.
        lines: where each field sits in the YAML text, for error messages.

    Returns:
        The validated Topology.
    """
    lines = lines or _LineMap(None)

    def fail(loc: Loc, message: str) -> TopologyError:
        line = lines.line(loc)
        where = f"{source}:{line}" if line else source
        return TopologyError(f"{where}: {format_loc(loc)}: {message}" if loc else f"{where}: {message}")

    if data is None:
        raise fail((), "file is empty; see `treeattn topo schema` or the files in topologies/")
    if not isinstance(data, dict):
        raise fail((), f"the top level must be a mapping of fields, got {type(data).__name__}")
    if data.get("format") == "treeattn-plan":
        raise fail((), "this is a treeattn plan, not a topology (treeattn verify checks plans; a plan's topology "
                       "is the one its 'topology' field names)")
    forms = [k for k in _FORMS if k in data]
    if len(forms) != 1:
        got = " and ".join(forms) if forms else "none of them"
        raise fail((), f"give exactly one of devices (explicit form), node (compact form) or family; got {got}")
    model = _FORMS[forms[0]]
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        loc, message = _first_error(exc, model, lines, data.get("family"))
        raise fail(loc, message) from None
    try:
        if isinstance(spec, ExplicitFile):
            topo = _build_explicit(spec)
        elif isinstance(spec, CompactFile):
            topo = build_compact(spec)
        else:
            topo = build_family_file(spec)
        try:
            topo.check_routable()
        except TopologyError as exc:
            raise FieldError(("ranks",) if isinstance(spec, ExplicitFile) else (), str(exc)) from None
    except FieldError as exc:
        raise fail(exc.loc, exc.message) from None
    except TopologyError as exc:
        raise fail((), str(exc)) from None
    return topo


# -- explicit form ---------------------------------------------------------------------------

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_ranks(entry: str) -> list[str]:
    """Expand one ``ranks`` entry: ``n{0..1}.gpu{0..3}`` (ranges, leftmost slowest) and a
    trailing ``*K`` repeat (``host0*4``).

    Args:
        entry: the pattern.

    Returns:
        Device names in rank order.

    Raises:
        ValueError: the pattern is malformed.
        TopologyError: it expands to more than ``MAX_RANKS`` names (counted before expanding).
    """
    pattern, repeat = entry, 1
    m = re.fullmatch(r"(.+)\*(\d+)", entry)
    if m:
        entry, repeat = m.group(1), int(m.group(2))
        if repeat < 1:
            raise ValueError("repeat must be >= 1")
    parts = _RANGE.split(entry)
    fixed, ranges = parts[0::3], list(zip(parts[1::3], parts[2::3], strict=True))
    spans = []
    for lo, hi in ranges:
        if int(lo) > int(hi):
            raise ValueError(f"range {{{lo}..{hi}}} is empty")
        spans.append(range(int(lo), int(hi) + 1))
    # Counted before expanding: a typo such as gpu{0..99999999} would otherwise build a
    # hundred million names (minutes, gigabytes) before the topology's rank limit refused them.
    check_rank_count(repeat * math.prod(len(s) for s in spans), f"pattern {pattern!r}")
    names = []
    for combo in itertools.product(*spans):
        name = fixed[0]
        for c, f in zip(combo, fixed[1:], strict=True):
            name += str(c) + f
        names.append(name)
    return [n for n in names for _ in range(repeat)]


def _build_explicit(spec: ExplicitFile) -> Topology:
    devices: list[Device] = []
    first: dict[str, int] = {}
    for i, d in enumerate(spec.devices):
        if d.name in first:
            raise FieldError(
                ("devices", i, "name"), f"duplicate device name {d.name!r} (first at devices[{first[d.name]}])"
            )
        first[d.name] = i
        if d.kind is DeviceKind.GPU and d.mem_bw_gbps <= 0:
            raise FieldError(("devices", i, "mem_bw_gbps"), f"GPU {d.name!r} needs mem_bw_gbps > 0")
        if d.tier and d.kind is not DeviceKind.SWITCH:  # network.py and the drawing read it of switches only
            raise FieldError(("devices", i, "tier"), f"{d.name!r} is a {d.kind.value}; tier ({d.tier}) is for network "
                             "switches (kind: switch)")
        try:
            devices.append(Device(**d.model_dump()))
        except TopologyError as exc:
            raise FieldError(("devices", i), str(exc)) from None
    for i, d in enumerate(spec.devices):
        if d.nic:
            _check_nic(i, devices[i], devices[first[d.nic]] if d.nic in first else None, list(first))
    links: list[Link] = []
    where: dict[tuple[str, str], int] = {}
    for i, ln in enumerate(spec.links):
        for end in ("src", "dst"):
            name = getattr(ln, end)
            if name not in first:
                hint = difflib.get_close_matches(name, list(first), n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise FieldError(("links", i, end), f"unknown device {name!r}{extra}")
        _check_link_ends(i, ln.kind, devices[first[ln.src]], devices[first[ln.dst]])
        fields = ln.model_dump(exclude={"duplex"})
        pairs = [(ln.src, ln.dst)] + ([(ln.dst, ln.src)] if ln.duplex and ln.src != ln.dst else [])
        for src, dst in pairs:
            if (src, dst) in where:
                raise FieldError(
                    ("links", i),
                    f"repeats {src}->{dst} (also links[{where[(src, dst)]}]); bond parallel links with count",
                )
            where[(src, dst)] = i
            try:
                links.append(Link(**{**fields, "src": src, "dst": dst}))
            except TopologyError as exc:
                raise FieldError(("links", i), str(exc)) from None
            if links[-1].has_rating and spec.cost.link_rates != "measured":
                key = next(k for k in ("rated_gbps", "rated_latency_us", "fitted")
                           if getattr(ln, k) not in (None, False))
                raise FieldError(("links", i, key), RATING_UNMEASURED)
    if spec.ranks is None:
        kinds = [DeviceKind.GPU] if any(d.kind is DeviceKind.GPU for d in devices) else [DeviceKind.HOST]
        ranks = [d.name for d in devices if d.kind in kinds]
        if not ranks:
            raise FieldError(("ranks",), "no gpu or host device to place ranks on; list ranks")
    else:
        ranks = []
        for r, entry in enumerate(spec.ranks):
            try:
                names = expand_ranks(entry)
                check_rank_count(len(ranks) + len(names), f"ranks[0..{r}]")  # many entries, each under it
            except ValueError as exc:
                raise FieldError(("ranks", r), f"bad pattern {entry!r}: {exc}") from None
            except TopologyError as exc:  # the pattern or the total above the rank limit
                raise FieldError(("ranks", r), str(exc)) from None
            for name in names:
                if name not in first:
                    raise FieldError(("ranks", r), f"unknown device {name!r}")
                dev = devices[first[name]]
                if dev.kind not in (DeviceKind.GPU, DeviceKind.HOST):
                    raise FieldError(("ranks", r), f"{name!r} is a {dev.kind.value}; ranks go on gpu or host devices")
            ranks.extend(names)
    gpu_used: set[str] = set()
    for name in ranks:
        if devices[first[name]].kind is DeviceKind.GPU:
            if name in gpu_used:
                raise FieldError(("ranks",), f"GPU {name!r} holds two ranks; one rank per GPU")
            gpu_used.add(name)
    return Topology(
        name=spec.name, devices=devices, links=links, ranks=ranks, description=spec.description,
        sources=spec.sources, cost=cost_params(spec.cost),
    )


_NETWORK_ENDS = frozenset({DeviceKind.NIC, DeviceKind.SWITCH, DeviceKind.HOST})


def _check_link_ends(i: int, kind: LinkKind, src: Device, dst: Device) -> None:
    """Refuse a link no route would take: a network link (InfiniBand, RoCE, Ethernet) from a device
    other than a NIC, a network switch or a host (two GPUs: read and ignored, their rate left at
    PCIe's), but for a GPU's own port to a switch (Gaudi's: routed over it), or a GPU fabric link
    (NVLink, xGMI) to a NIC, a network switch or a host."""
    cls = link_class(kind)
    if cls is LinkClass.NETWORK:
        ends = {src.kind, dst.kind}
        own_port = ends == {DeviceKind.GPU, DeviceKind.SWITCH}  # a GPU with its own port, as Gaudi's
        bad = next((d for d in (src, dst) if d.kind not in _NETWORK_ENDS), None)
        if bad is not None and not own_port:
            raise FieldError(("links", i, "kind"), f"a link of kind {kind.value} from {bad.name!r}, a "
                             f"{bad.kind.value}: network links join NICs, network switches and hosts (a GPU "
                             "reaches the network through a nic over pcie, or its own port to a switch)")
    if cls is LinkClass.GPU_FABRIC:
        bad = next((d for d in (src, dst) if d.kind in _NETWORK_ENDS), None)
        if bad is not None:
            raise FieldError(("links", i, "kind"), f"a link of kind {kind.value} to {bad.name!r}, a "
                             f"{bad.kind.value}: {kind.value} joins GPUs, NVSwitches and CPUs")


def _check_nic(i: int, dev: Device, nic: Device | None, names: list[str]) -> None:
    """``devices[i].nic`` names a NIC that ``dev`` (a gpu or host) can send through: routing
    sends its cross-node traffic over PCIe to that device, so anything else (a GPU, a NIC of
    another node) would carry it through the wrong device, or fail routing later without
    naming this field."""
    loc = ("devices", i, "nic")
    if dev.kind not in (DeviceKind.GPU, DeviceKind.HOST):
        raise FieldError(loc, f"{dev.name!r} is a {dev.kind.value}; only gpu and host devices send through a nic")
    if nic is None:
        hint = difflib.get_close_matches(dev.nic, names, n=1)
        raise FieldError(loc, f"unknown device {dev.nic!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    if nic.kind is not DeviceKind.NIC:
        raise FieldError(loc, f"{nic.name!r} is a {nic.kind.value}, not a nic")
    if nic.node != dev.node:
        raise FieldError(loc, f"nic {nic.name!r} is on node {nic.node} and {dev.name!r} on node {dev.node}; "
                         "a device sends through a nic of its own node")


# -- dump ---------------------------------------------------------------------------------------


def check_topology_path(path: Path) -> None:
    """Refuse to write a topology over a regular file that is not one (``probe -o`` or
    ``calibrate -o`` given a plan's, a script's or notes' path would lose that file for good):
    an empty file, a device, and a YAML (or JSON) mapping with a topology's top-level key
    (``devices``, ``node`` or ``family``) are written over."""
    keep_foreign_file(path, lambda p: bool(_top_level_keys(p) & {"devices", "node", "family"}), "topology",
                      "no top-level devices, node or family", "topology")


def _top_level_keys(path: Path) -> set[str]:
    """The keys of the mapping a YAML (or JSON) file holds, read as a stream of parser events
    (a large topology is not built); empty where the file is not one whole mapping."""
    keys: set[str] = set()
    depth, is_key = 0, True
    try:
        with path.open("rb") as f:
            for event in yaml.parse(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
                if isinstance(event, yaml.NodeEvent) and depth == 1:  # a key or a value of the top mapping
                    if is_key and isinstance(event, yaml.ScalarEvent):
                        keys.add(event.value)
                    is_key = not is_key
                if isinstance(event, yaml.CollectionStartEvent):
                    if depth == 0 and not isinstance(event, yaml.MappingStartEvent):
                        return set()  # a list
                    depth += 1
                elif isinstance(event, yaml.CollectionEndEvent):
                    depth -= 1
                elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)) and depth == 0:
                    return set()  # a lone scalar: prose, say
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return set()
    return keys


def dump_topology(topo: Topology) -> str:
    """The explicit form of ``topo`` as YAML: deterministic, and loads back to the same
    topology (same devices, links in the same order, ranks and fingerprint). A link and
    its reverse with equal attributes are written once with ``duplex: true``.

    Args:
        topo: any topology.

    Returns:
        YAML text.
    """
    data = topo.to_dict()
    links = data["links"]
    index = {(ln["src"], ln["dst"]): i for i, ln in enumerate(links)}
    out_links = []
    used: set[int] = set()
    for i, ln in enumerate(links):
        if i in used:
            continue
        j = index.get((ln["dst"], ln["src"]))
        # Pair only with the link right after it, so that the reload keeps link order.
        if j == i + 1 and ln["src"] != ln["dst"] and {**links[j], "src": ln["src"], "dst": ln["dst"]} == ln:
            used.add(j)
            out_links.append({**ln, "duplex": True})
        else:
            out_links.append(ln)
    data["links"] = out_links
    head = f"# Explicit form of topology {topo.name!r}, written by treeattn ({topo.fingerprint}).\n"
    return head + yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=200, allow_unicode=True
    )


def topology_json_schema() -> dict:
    """JSON schema of a topology file (any of the three forms)."""
    adapter = TypeAdapter(ExplicitFile | CompactFile | FamilyFile)
    schema = adapter.json_schema()
    _standard_bounds(schema)
    schema["title"] = "treeattn topology file"
    schema["description"] = (
        "One of three forms: explicit (devices, links, ranks), compact (node template x nodes + network) "
        "or family (a parametric builder by name). Units: *_gbps GB/s per direction, *_us microseconds."
    )
    return schema


_BOUND_KEYWORDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def _standard_bounds(node: object) -> None:
    """Rename pydantic's raw ``gt``/``ge``/``lt``/``le`` (left on optional fields) to JSON Schema's keywords."""
    if isinstance(node, dict):
        if node.get("type") in ("number", "integer"):
            for raw, keyword in _BOUND_KEYWORDS.items():
                if raw in node:
                    node[keyword] = node.pop(raw)
        for value in node.values():
            _standard_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _standard_bounds(value)


# -- error reporting ------------------------------------------------------------------------------


class _LineMap:
    """Field path -> 1-based YAML line, from the composed node tree."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line(self, loc: Loc) -> int | None:
        node = self.root
        if node is None:
            return None
        line = node.start_mark.line + 1
        for part in loc:
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                        nxt, line = v, k.start_mark.line + 1
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                nxt = node.value[part]
                line = nxt.start_mark.line + 1
            if nxt is None:
                break
            node = nxt
        return line


def _family_param(family: object, key: str) -> bool:
    """Whether ``key`` is a parameter of the family a family file names (``family``)."""
    from treeattn.topology.families import FAMILIES

    fam = FAMILIES.get(family) if isinstance(family, str) else None
    return fam is not None and any(p.name == key for p in fam.params)


def _first_error(exc: ValidationError, model: type[BaseModel], lines: _LineMap,
                 family: object = None) -> tuple[Loc, str]:
    errors = exc.errors(include_url=False)
    # First in the file; on one line a misspelt field beats the "missing" it causes.
    errors.sort(key=lambda e: (lines.line(tuple(e["loc"])) or 0, e["type"] != "extra_forbidden"))
    e = errors[0]
    loc = tuple(e["loc"])
    kind, ctx, value = e["type"], e.get("ctx", {}), e.get("input")
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        hint = [a for a in allowed if a.startswith(str(loc[-1]))] or difflib.get_close_matches(
            str(loc[-1]), allowed, n=1
        )
        msg = f"unknown field {loc[-1]!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
        if allowed:
            msg += f"; allowed here: {', '.join(allowed)}"
        if model is FamilyFile and len(loc) == 1 and _family_param(family, str(loc[0])):
            msg += f" (a family's parameters go under params: params: {{{loc[0]}: ...}})"
    elif kind == "missing":
        msg = "missing required field"
    elif kind == "invalid_key" and isinstance(value, int | float):
        # {mem_bw_gbps: 3,350} is YAML for mem_bw_gbps: 3 and a field named 350 with no value
        msg = (f"a number ({value!r}) where a field name goes: in {{...}} a comma ends a value, so a number "
               "written with one reads as two (3,350 as 3 and a field 350); write thousands without a separator "
               "(3350) and decimals with a point (12.5)")
    elif kind in ("enum", "literal_error"):
        # A Literal of enum members is listed by pydantic as their reprs
        # (<LinkKind.ROCE: 'roce'>): show the values a file spells instead.
        expected = re.sub(r"<\w+\.\w+: ('[^']*')>", r"\1", str(ctx.get("expected", "")))
        msg = f"unknown value {value!r}; choose one of {expected}"
    elif kind == "value_error":
        msg = str(ctx.get("error", e["msg"]))
    elif kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        msg = f"must be {op} {ctx[key]:g} (got {value!r})"
    elif kind in ("float_parsing", "int_parsing") and (said := _with_unit(str(loc[-1]), value)):
        msg = said
    else:
        msg = f"{e['msg'][:1].lower()}{e['msg'][1:]}"
        if not isinstance(value, (dict, list)):
            msg += f" (got {value!r})"
    more = len(errors) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return loc, msg


# A value written with its unit, as a datasheet gives it: the factor to the field's unit, by
# the field name's suffix (the file's units: GB/s, microseconds, GiB).
_UNITS = {
    "_gbps": ("GB/s", {"Gbps": 1 / 8, "gbps": 1 / 8, "Gb/s": 1 / 8, "Gbit/s": 1 / 8, "Gb": 1 / 8, "Gbit": 1 / 8,
                       "Tbps": 125.0, "Tb/s": 125.0,
                       "Mbps": 1 / 8000, "Mb/s": 1 / 8000, "GBps": 1.0, "GB/s": 1.0, "TB/s": 1000.0, "MB/s": 1e-3}),
    "_us": ("microseconds", {"ns": 1e-3, "us": 1.0, "µs": 1.0, "\u03bcs": 1.0, "ms": 1e3, "s": 1e6}),
    # a GPU's "80GB" is binary (an H100 80GB holds 80 GiB, the shipped files' mem_gb: 80)
    "_gb": ("GiB", {"GiB": 1.0, "GB": 1.0, "TiB": 1024.0, "TB": 1024.0, "MiB": 1 / 1024, "MB": 1 / 1024}),
}
_WITH_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z\u00b5\u03bc/]+)\s*$")


def _with_unit(field: str, value: object) -> str:
    """What to write for a number given with a unit (``bw_gbps: 400Gbps``): the number in the
    field's unit; empty where the value is not a number and a unit the field's suffix knows."""
    m = _WITH_UNIT.match(value) if isinstance(value, str) else None
    unit = next((u for suffix, u in _UNITS.items() if field.endswith(suffix)), None)
    if m is not None and unit is not None and unit[0] == "GB/s" and m.group(2) in ("G", "T"):
        # "400G", as a port's speed is often written: bits or bytes, the letter does not say
        n = float(m.group(1)) * (1000.0 if m.group(2) == "T" else 1.0)
        return (f"must be a number of GB/s, without its unit (got {value!r}: {n:.6g} Gb/s is {n / 8:.6g}, "
                f"{n:.6g} GB/s is {n:.6g})")
    if m is None or unit is None or m.group(2) not in unit[1]:
        return ""
    number = float(m.group(1)) * unit[1][m.group(2)]
    return f"must be a number of {unit[0]}, without its unit (got {value!r}: write {number:.6g})"


_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


def _fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the model found at ``loc`` under ``model`` ([] when not a model)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, int):
            args = typing.get_args(current)
            if not args:
                return []
            current = args[0]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        current = current.model_fields[part].annotation
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(tp: Any) -> Any:
    """``X | None`` -> ``X``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp
