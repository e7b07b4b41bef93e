"""``ibstat``: RDMA adapters (CAs) and their ports.

Format: ``CA 'mlx5_0'`` opens an adapter; indented ``Key: value`` lines follow (``CA type``,
``Number of ports``, ...), then per port a ``Port N:`` line and its own ``Key: value`` lines
(``State``, ``Physical state``, ``Rate`` in Gb/s, ``Link layer`` InfiniBand or Ethernet).
An Ethernet link layer on an RDMA adapter means RoCE.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from treeattn.probe.build import NicInfo, NodeDraft, attach_near_gpu
from treeattn.probe.text import fail
from treeattn.topology.model import Device, DeviceKind

__all__ = ["IbPort", "IbAdapter", "parse_ibstat", "apply_ibstat"]

_CA = re.compile(r"^CA '([^']+)'\s*$")
_PORT = re.compile(r"^Port (\d+):\s*$")
_KV = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*(.*?)\s*$")


@dataclass(frozen=True, slots=True)
class IbPort:
    number: int
    state: str
    physical_state: str
    rate_gbps: float
    link_layer: str


@dataclass(frozen=True, slots=True)
class IbAdapter:
    name: str
    ca_type: str
    ports: tuple[IbPort, ...]

    @property
    def active(self) -> tuple[IbPort, ...]:
        return tuple(p for p in self.ports if p.state == "Active")

    def info(self) -> NicInfo:
        """What the topology keeps: the fastest Active port (or the first port when none is)."""
        best = max(self.active, key=lambda p: p.rate_gbps, default=self.ports[0])
        return NicInfo(best.rate_gbps, best.link_layer, best.state, self.ca_type)


def parse_ibstat(text: str, source: str = "ibstat") -> tuple[IbAdapter, ...]:
    """Read ``ibstat`` output (all adapters).

    Args:
        text: the command's output.
        source: file name for messages.

    Returns:
        Adapters in the order printed.

    Raises:
        ProbeError: text outside a CA block, a port missing State/Rate/Link layer, a rate
            that is not a number, a port count that differs from ``Number of ports``,
            a repeated adapter, or no adapter at all.
    """
    adapters: list[IbAdapter] = []
    name: str | None = None
    name_line = 0
    fields: dict[str, str] = {}
    ports: list[tuple[int, int, dict[str, str]]] = []

    def close() -> None:
        if name is None:
            return
        if not ports:
            raise fail(source, name_line, f"CA {name!r} has no 'Port N:' block: truncated?")
        built = []
        for number, at, kv in ports:
            for key in ("State", "Rate", "Link layer"):
                if key not in kv:
                    raise fail(source, at, f"CA {name!r} port {number}: no {key!r} line: truncated?")
            try:
                rate = float(kv["Rate"])
            except ValueError:
                raise fail(source, at, f"CA {name!r} port {number}: Rate {kv['Rate']!r} is not a number") from None
            # nan and inf too: a link of either would be refused (or written as .inf) later. A port
            # that is down may print 0; its rate is not used.
            if not (0 < rate < math.inf or (rate == 0 and kv["State"] != "Active")):
                raise fail(source, at, f"CA {name!r} port {number}: Rate {kv['Rate']!r} is not a line rate "
                                       "(Gb/s, a finite number > 0)")
            if kv["Link layer"] not in ("InfiniBand", "Ethernet"):
                raise fail(source, at, f"CA {name!r} port {number}: unknown link layer {kv['Link layer']!r}")
            built.append(IbPort(number, kv["State"], kv.get("Physical state", ""), rate, kv["Link layer"]))
        declared = fields.get("Number of ports")
        if declared is not None and declared.isdigit() and int(declared) != len(built):
            raise fail(source, name_line, f"CA {name!r} declares {declared} ports but lists {len(built)}: truncated?")
        if any(a.name == name for a in adapters):
            raise fail(source, name_line, f"CA {name!r} appears twice")
        adapters.append(IbAdapter(name, fields.get("CA type", ""), tuple(built)))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if m := _CA.match(line):
            close()
            name, name_line, fields, ports = m.group(1), lineno, {}, []
            continue
        if name is None:
            raise fail(source, lineno, f"{line!r} before any \"CA 'name'\" line: not ibstat output?")
        if m := _PORT.match(line):
            ports.append((int(m.group(1)), lineno, {}))
            continue
        kv = _KV.match(line)
        if kv is None:
            raise fail(source, lineno, f"expected 'Key: value', got {line!r}")
        target = ports[-1][2] if ports else fields
        target[kv.group(1)] = kv.group(2)
    close()
    if not adapters:
        raise fail(source, None, "no \"CA 'name'\" block found: not ibstat output")
    return tuple(adapters)


def apply_ibstat(draft: NodeDraft, adapters: tuple[IbAdapter, ...], source: str = "ibstat") -> None:
    """Give the draft's NICs their rate, state and link layer from ibstat.

    NICs are matched by name (``mlx5_0``). When the draft has no NIC at all (rocm-smi,
    a PCIe box), the adapters are added, NIC k beside GPU k (an assumption, noted).
    Adapters ibstat lists but the topology does not, and the reverse, are warned about.
    """
    draft.rates_from = source
    if not draft.nics:
        _place(draft, adapters, source)
        return
    seen = {a.name: a for a in adapters}
    used: set[str] = set()
    missing, partial = [], []
    for name, old in draft.nics.items():
        members = list(dict.fromkeys(old.ports or (name,)))  # a device of merged ports: ibstat lists each
        listed = [m for m in members if m in seen]
        if not listed:
            missing.append(name)
            continue
        if len(listed) < len(members):
            partial.append(f"{name} (no {', '.join(m for m in members if m not in seen)})")
        used.update(listed)
        draft.nics[name] = _merged([seen[m] for m in listed], old.ports)
    extra = [a.name for a in adapters if a.name not in used]
    if partial:
        draft.warnings.append(f"{source}: lists only some ports of {'; '.join(partial)}: their rate counts the "
                              "listed ports")
    if extra:
        draft.warnings.append(f"{source}: lists {', '.join(extra)}, not in the topology output: ignored")
    if missing:
        draft.warnings.append(f"{source}: has no data for {', '.join(missing)}")
    draft.cite(f"NIC rates and link layers from {source}")


def _merged(adapters: list[IbAdapter], ports: tuple[str, ...]) -> NicInfo:
    """One device's ibstat data: an adapter's own (its fastest Active port), or for a device
    of merged ports the sum of its adapters' Active ports (NCCL merges only Active ports, of
    one link layer: the first Active port's), Active where any is."""
    if not ports:
        return adapters[0].info()
    active = [p for a in adapters for p in a.active]
    layer = active[0].link_layer if active else ""
    active = [p for p in active if p.link_layer == layer]
    first = adapters[0].info()
    if not active:
        return NicInfo(first.rate_gbps, first.link_layer, first.state, first.model, ports=ports)
    return NicInfo(sum(p.rate_gbps for p in active), layer, "Active", first.model, ports=ports)


def _place(draft: NodeDraft, adapters: tuple[IbAdapter, ...], source: str) -> None:
    gpus = draft.gpus
    for k, a in enumerate(adapters):
        draft.add(Device(a.name, DeviceKind.NIC, 0, a.ca_type))
        draft.nics[a.name] = a.info()
        attach_near_gpu(draft, a.name, k, len(adapters))
    draft.note(f"NIC placement unknown ({source} does not say): NIC k attached beside GPU k*GPUs/NICs")
    draft.summary.append(f"{len(adapters)} NICs from {source}")
    if gpus:
        draft.cite(f"NIC rates and link layers from {source}")
