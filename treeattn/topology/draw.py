"""Draw a topology as a layered graph (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from pathlib import Path

from treeattn.errors import InputError
from treeattn.figures import save_figure
from treeattn.topology.model import DeviceKind, LinkClass, Topology

__all__ = ["draw_topology", "MAX_DRAWN_DEVICES"]

MAX_DRAWN_DEVICES = 600
"""Beyond this a drawing is unreadable (and slow); draw a smaller member of the family."""

# Rows from top to bottom.
_ROW = {
    DeviceKind.SWITCH: 5.0,
    DeviceKind.NIC: 4.0,
    DeviceKind.CPU: 3.0,
    DeviceKind.HOST: 3.0,
    DeviceKind.PCIE_SWITCH: 2.0,
    DeviceKind.GPU: 1.0,
    DeviceKind.NVSWITCH: 0.0,
}
_COLOR = {
    LinkClass.GPU_FABRIC: "tab:green",
    LinkClass.PCIE: "tab:blue",
    LinkClass.NETWORK: "tab:orange",
    LinkClass.LOOPBACK: "tab:gray",
}


def draw_topology(topo: Topology, path: str | Path) -> Path:
    """Write a PNG of ``topo``: devices in rows by kind (spines above leaves), links
    colored by class (green NVLink/xGMI, blue PCIe and sockets, orange network).

    Args:
        topo: the topology.
        path: the PNG file to write.

    Returns:
        The path written.
    """
    if len(topo.devices) > MAX_DRAWN_DEVICES:
        raise InputError(
            f"topology {topo.name!r} has {len(topo.devices)} devices, too many to draw "
            f"(limit {MAX_DRAWN_DEVICES}); draw a smaller one, e.g. fewer nodes"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: dict[float, list] = {}
    for d in topo.devices:
        y = _ROW[d.kind] + (0.5 if d.tier == "spine" else 0.0)
        rows.setdefault(y, []).append(d)
    pos: dict[str, tuple[float, float]] = {}
    width = max(len(v) for v in rows.values())
    for y, devs in rows.items():
        devs.sort(key=lambda d: (d.node, d.name))
        step = width / len(devs)
        for i, d in enumerate(devs):
            pos[d.name] = ((i + 0.5) * step, y)
    fig, ax = plt.subplots(figsize=(min(4 + width * 0.6, 60), 6))
    drawn: set[tuple[str, str]] = set()
    for ln in topo.links:
        key = (min(ln.src, ln.dst), max(ln.src, ln.dst))
        if key in drawn:
            continue
        drawn.add(key)
        (x0, y0), (x1, y1) = pos[ln.src], pos[ln.dst]
        if ln.src == ln.dst:
            ax.add_patch(plt.Circle((x0, y0 + 0.15), 0.15, fill=False, color=_COLOR[ln.cls]))
            continue
        ax.plot([x0, x1], [y0, y1], color=_COLOR[ln.cls], linewidth=0.5 + min(ln.bw_gbps, 900) / 300, alpha=0.6)
    for d in topo.devices:
        x, y = pos[d.name]
        ax.scatter([x], [y], s=60, color="black", zorder=3)
        if len(topo.devices) <= 120:
            ax.annotate(d.name, (x, y), fontsize=6, rotation=45, xytext=(3, 3), textcoords="offset points")
    ax.set_title(f"{topo.name}: {topo.num_ranks} ranks, {len(topo.devices)} devices")
    ax.set_axis_off()
    return save_figure(fig, path, dpi=120, bbox_inches="tight")
