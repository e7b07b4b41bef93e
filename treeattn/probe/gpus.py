"""GPU product names: read them from tool output and turn them into specs.

Accepted name lists (one GPU a line): ``nvidia-smi -L`` (``GPU 0: NVIDIA A100-SXM4-80GB
(UUID: ...)``; the ``MIG ... Device N:`` lines under a MIG-enabled GPU are skipped),
``nvidia-smi --query-gpu=name --format=csv[,noheader]`` (a ``name`` header, then one name a
line), ``--query-gpu=index,name`` (``0, NVIDIA H100 80GB HBM3``) and ``rocm-smi
--showproductname`` lines ``GPU[0] : Card series: ...``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from treeattn.errors import ProbeError
from treeattn.probe.build import NodeDraft
from treeattn.probe.hardware import GPU_SPECS, UNKNOWN_GPU_MEM_BW_GBPS, GpuSpec, gpu_spec
from treeattn.probe.text import fail

__all__ = ["parse_gpu_names", "GpuCatalog"]

_SMI_L = re.compile(r"^GPU\s+(\d+):\s+(.+?)(?:\s+\(UUID:.*\))?\s*$")
_ROCM = re.compile(r"^GPU\[(\d+)\]\s*:\s*Card (?:series|Series|model|Model)\s*:\s*(.+?)\s*$")
_INDEXED = re.compile(r"^(\d+)\s*,\s*(.+?)\s*$")
_MIG = re.compile(r"^MIG\s+\S+\s+Device\s+\d+:")


def parse_gpu_names(text: str, source: str = "GPU names") -> tuple[str, ...]:
    """GPU product names by index from one of the listings in the module docstring.

    Args:
        text: the listing.
        source: file name for messages.

    Returns:
        Names in GPU index order.

    Raises:
        ProbeError: an unreadable line, a repeated or missing index, or no names at all.
    """
    by_index: dict[int, tuple[str, int]] = {}
    plain: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("=", "#")) or line.lower() in ("name", "index, name"):
            continue
        m = _SMI_L.match(line) or _ROCM.match(line) or _INDEXED.match(line)
        if m is not None:
            idx = int(m.group(1))
            if idx in by_index and by_index[idx][0] != m.group(2):
                raise fail(source, lineno, f"GPU {idx} named twice ({by_index[idx][0]!r} on line {by_index[idx][1]})")
            by_index[idx] = (m.group(2), lineno)
        elif line.startswith("GPU["):
            continue  # other rocm-smi --showproductname fields (vendor, SKU, ...)
        elif _MIG.match(line):
            continue  # nvidia-smi -L lists a MIG-enabled GPU's instances under it; the GPU line names it
        elif re.fullmatch(r"[\w .()/+-]+", line):
            plain.append(line)
        else:
            raise fail(source, lineno, f"cannot read a GPU name from {line!r}")
    if by_index and plain:
        raise fail(source, None, "mixes indexed lines ('GPU 0: ...') and bare names")
    if plain:
        return tuple(plain)
    if not by_index:
        raise fail(source, None, "no GPU names found")
    if sorted(by_index) != list(range(len(by_index))):
        raise fail(source, None, f"GPU indices {sorted(by_index)} are not 0..{len(by_index) - 1}")
    return tuple(by_index[i][0] for i in range(len(by_index)))


@dataclass(frozen=True)
class GpuCatalog:
    """Which GPU model each index is: names read from tool output and/or ``--gpu-model``."""

    names: tuple[str, ...] = ()
    """Product names by GPU index, as printed."""
    model: str | None = None
    """``--gpu-model``: applies to every GPU and wins over ``names``."""
    vendor: str = ""
    """Whose GPUs the input lists (``nvidia`` for nvidia-smi, ``amd`` for rocm-smi); ``--gpu-model``
    must be one of theirs. Empty: any."""

    def apply(self, draft: NodeDraft, count: int, source: str) -> list[GpuSpec]:
        """Specs for GPUs 0..count-1; notes what was assumed into ``draft``.

        Raises:
            ProbeError: ``--gpu-model`` names no known model.
        """
        if self.model is not None:
            # A known model's own name (any case), or a product name as nvidia-smi or rocm-smi print
            # it (words: "NVIDIA H100 80GB HBM3"), which gpu_spec's patterns read. Those patterns
            # would also read a made-up H100-FOO as H100-SXM5-80GB (their last resort for "H100
            # 80GB HBM3"): a one-word name that is no known model is refused, their reading offered.
            typed = self.model.strip().upper()
            spec = next((v for k, v in GPU_SPECS.items() if k.upper() == typed), None)
            printed = spec is None and len(typed.split()) > 1
            if printed:
                spec = gpu_spec(self.model)
                if spec is not None:
                    draft.warnings.append(f"--gpu-model {self.model!r} read as {spec.model}")
            if spec is None:
                parts = [k for k in GPU_SPECS if typed and typed in k.upper()]
                if len(parts) > 1:  # "A100": SXM4 or PCIe, 40 or 80 GB, which differ in links and memory
                    raise ProbeError(f"--gpu-model {self.model!r} names {len(parts)} known GPUs; give one of "
                                     f"{', '.join(parts)}")
                guess = gpu_spec(self.model)
                upper = {k.upper(): k for k in GPU_SPECS}
                close = guess.model if guess is not None else next(
                    (upper[k] for k in difflib.get_close_matches(typed, list(upper), n=1)), None)
                hint = f" (did you mean {close}?)" if close else ""
                known = ", ".join(GPU_SPECS)
                raise ProbeError(f"--gpu-model {self.model!r} is not a known GPU{hint}; choose one of {known}")
            if self.vendor and spec.vendor and spec.vendor != self.vendor:
                # An MI300X on NVSwitch (or an H100 on xGMI) would be modelled without a word.
                raise ProbeError(f"{source}: --gpu-model {spec.model} is an {_VENDORS[spec.vendor]} GPU, but the "
                                 f"input lists {_VENDORS[self.vendor]} GPUs; give one of theirs")
            other = {n for n in self.names if gpu_spec(n) != spec}
            if other:
                draft.warnings.append(f"--gpu-model {spec.model} overrides names read from the input: {sorted(other)}")
            draft.cite(spec.source)
            draft.summary.insert(0, f"{count}x {spec.model}")
            return [spec] * count
        names = list(self.names)
        if names and len(names) != count:
            if len(set(names)) == 1:
                draft.warnings.append(
                    f"{source}: GPU names given for {len(names)} of {count} GPUs; {names[0]!r} assumed for all"
                )
                names = [names[0]] * count
            else:
                raise ProbeError(f"{source}: GPU names given for {len(names)} GPUs but the topology has {count}")
        specs: list[GpuSpec] = []
        unknown: list[str] = []
        for i in range(count):
            spec = gpu_spec(names[i]) if names else None
            if spec is None:
                label = names[i] if names else "unknown"
                unknown.append(f"GPU{i} ({label})" if names else f"GPU{i}")
                spec = GpuSpec(
                    model=_slug(label) if names else "unknown-gpu",
                    vendor="", mem_bw_gbps=UNKNOWN_GPU_MEM_BW_GBPS, mem_gb=0.0, fabric_gen=None,
                    max_links=18, per_link_gbps=25.0, pcie_gen=4, p2p=True, source="",
                )
            draft.cite(spec.source)
            specs.append(spec)
        if unknown:
            draft.warnings.append(
                f"GPU model unknown for {', '.join(unknown)}: memory bandwidth "
                f"{UNKNOWN_GPU_MEM_BW_GBPS:g} GB/s placeholder; pass --gpu-model or --gpu-names"
            )
        models = sorted({s.model for s in specs}, key=[s.model for s in specs].index)
        draft.summary.insert(0, " + ".join(f"{sum(s.model == m for s in specs)}x {m}" for m in models))
        return specs


_VENDORS = {"nvidia": "NVIDIA", "amd": "AMD"}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "unknown-gpu"
