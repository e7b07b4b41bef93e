"""``nvidia-smi nvlink --status``: per GPU, each NVLink's speed.

Format: a ``GPU N: NAME (UUID: ...)`` line, then one ``Link K: S GB/s`` line per link
(``Link K: <inactive>`` when down). The speed is per link, per direction, as nvidia-smi
states it (26.562 GB/s on H100, 53.125 on GB200, 25 GB/s on A100): on H100, GB200 and V100
that is the signalling rate, above the data rate a link carries (``DATA_RATE_GBPS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from treeattn.probe.text import fail

__all__ = ["DATA_RATE_GBPS", "NvlinkStatus", "data_rate_gbps", "parse_nvlink_status"]

DATA_RATE_GBPS = {25.781: 25.0, 26.562: 25.0, 53.125: 50.0}
"""Per-link speed nvidia-smi prints -> the data rate the link carries, GB/s per direction.
nvidia-smi prints the rate of the coded bits on the wire, above the data a link carries:

* NVLink 4 (H100) prints 26.562 GB/s (fixture nvidia-smi-nvlink-status.h100-gpu0.txt) and
  carries 25: 18 links make NVIDIA's 450 GB/s per direction (docs/hardware.md 'NVLink 4').
* NVLink 5 (GB200) prints 53.125 (`nvidia-smi nvlink -s` of a GB200,
  https://github.com/NVIDIA/k8s-test-infra/issues/371) and carries 50: 18 links make
  900 GB/s (docs/hardware.md 'NVLink 5').
* NVLink 2 (V100) prints 25.781 (https://github.com/Azure/azhpc-diagnostics/issues/73, a
  V100-SXM2-32GB) and carries 25: 6 links make the datasheet's 300 GB/s both ways.

The ratios are those of the lanes' signalling rate to their data rate: 1.0625 (106.25 Gb/s
lanes for 100 Gb/s of data) and 1.03125 (66/64). A100 (NVLink 3) prints 25 GB/s, its data
rate, and is taken as printed."""


def data_rate_gbps(printed: float) -> float:
    """The data rate of a link nvidia-smi prints at ``printed`` GB/s (``DATA_RATE_GBPS``;
    other speeds are taken as printed)."""
    return next((data for shown, data in DATA_RATE_GBPS.items() if abs(printed - shown) < 0.01), printed)


_GPU = re.compile(r"^GPU\s+(\d+):\s+(.+?)(?:\s+\(UUID:\s*[^)]*\))?\s*$")
_LINK = re.compile(r"^Link\s+(\d+):\s+(?:(\d+(?:\.\d+)?)\s*GB/s|<inactive>|Inactive|N/A)\s*$")


@dataclass(frozen=True)
class NvlinkStatus:
    """Parsed ``nvidia-smi nvlink --status``."""

    names: dict[int, str]
    """GPU index -> product name."""
    links: dict[int, dict[int, float | None]]
    """GPU index -> link index -> GB/s as printed (None: inactive)."""
    warnings: tuple[str, ...] = ()

    @property
    def active(self) -> dict[int, int]:
        """GPU index -> number of active links."""
        return {g: sum(1 for v in ls.values() if v) for g, ls in self.links.items()}

    @property
    def per_link_gbps(self) -> float | None:
        """The data rate of one active link, GB/s per direction (the lowest, if GPUs differ;
        ``DATA_RATE_GBPS`` for a printed signalling rate); None when none is active."""
        speeds = [data_rate_gbps(v) for ls in self.links.values() for v in ls.values() if v]
        return min(speeds) if speeds else None


def parse_nvlink_status(text: str, source: str = "nvidia-smi nvlink --status") -> NvlinkStatus:
    """Read ``nvidia-smi nvlink --status`` output (for all GPUs or one, ``-i N``).

    Args:
        text: the command's output.
        source: file name for messages.

    Returns:
        Names and link speeds per GPU; warnings when link speeds differ.

    Raises:
        ProbeError: a line that is neither a GPU nor a link line, a link before any GPU,
            a repeated GPU or link, a GPU with no links, or no GPU at all.
    """
    names: dict[int, str] = {}
    links: dict[int, dict[int, float | None]] = {}
    current: int | None = None
    first_line: dict[int, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        g = _GPU.match(line)
        if g:
            current = int(g.group(1))
            if current in names:
                raise fail(source, lineno, f"GPU {current} appears twice (first on line {first_line[current]})")
            names[current] = g.group(2)
            links[current] = {}
            first_line[current] = lineno
            continue
        k = _LINK.match(line)
        if k is None:
            raise fail(source, lineno, f"expected 'GPU N: name' or 'Link K: S GB/s', got {line!r}")
        if current is None:
            raise fail(source, lineno, "a Link line before any GPU line")
        idx = int(k.group(1))
        if idx in links[current]:
            raise fail(source, lineno, f"GPU {current} lists link {idx} twice")
        links[current][idx] = float(k.group(2)) if k.group(2) else None
    if not names:
        raise fail(source, None, "no 'GPU N: name' line: not `nvidia-smi nvlink --status` output")
    warnings: list[str] = []
    for gpu, ls in links.items():
        if not ls:
            raise fail(source, first_line[gpu], f"GPU {gpu} has no Link lines: truncated?")
        if sorted(ls) != list(range(len(ls))):
            warnings.append(f"{source}: GPU {gpu} lists links {sorted(ls)}, not 0..{len(ls) - 1}")
    speeds = sorted({v for ls in links.values() for v in ls.values() if v})
    if len(speeds) > 1:
        warnings.append(f"{source}: NVLinks run at different speeds {speeds} GB/s; the lowest is used")
    return NvlinkStatus(names, links, tuple(warnings))
