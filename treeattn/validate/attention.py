"""Score the compute model's attention kernel on published decode-attention timings.

``results/published/attention/*.yaml`` lists published kernel runs (FlashAttention,
FlashInfer): batch, heads, head dim and KV tokens per sequence, and the time per call. Each
row is predicted as one COMPUTE of a ``Workload`` on a 1-rank topology of that GPU
(``ComputeModel.partial_us``: launch plus the KV, query and partial bytes over the kernel's
bandwidth). ``fitted_efficiency`` is the share of the GPU's memory bandwidth the published
runs reach (median over rows of bytes / (time - launch) / memory bandwidth): the figure the
families keep as ``cost.attn_efficiency`` (docs/attention-model.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from treeattn.cost.compute import ComputeModel
from treeattn.errors import InputError, TopologyError
from treeattn.topology.library import resolve
from treeattn.validate.corpus import corpus_dir
from treeattn.workload import Workload

__all__ = ["AttentionRow", "load_attention", "attention_summary"]

_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}


@dataclass(frozen=True, slots=True)
class AttentionRow:
    source_id: str
    url: str
    gpu: str
    topology: str
    workload: Workload
    published_us: float
    predicted_us: float
    bytes: int
    launch_us: float
    mem_bw_gbps: float

    @property
    def error(self) -> float:
        return self.predicted_us / self.published_us - 1.0

    @property
    def efficiency(self) -> float:
        """Bytes over (time - launch), as a share of the GPU's memory bandwidth."""
        return self.bytes / max(self.published_us - self.launch_us, 1e-9) / 1e3 / self.mem_bw_gbps


def _time_us(text: object, where: str) -> float:
    s = str(text).strip()
    for unit in ("us", "ms", "s"):
        if s.endswith(unit):
            try:
                value = float(s[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * _UNITS[unit]
    raise InputError(f"{where}: time {text!r} is not a positive number with a unit (us, ms, s)")


def load_attention(folders: list[Path] | None = None) -> list[AttentionRow]:
    """Every published row of ``FOLDER/attention/*.yaml`` (default: the shipped corpus), predicted."""
    if folders is None:
        d = corpus_dir()
        folders = [d] if d is not None else []
    out = []
    for folder in folders:
        for f in sorted((Path(folder) / "attention").glob("*.yaml")) if Path(folder).is_dir() else []:
            data = yaml.safe_load(f.read_text()) or {}
            for i, src in enumerate(data.get("sources", [])):
                where = f"{f}: sources[{i}]"
                try:
                    topo = resolve(str(src["topology"]))
                except KeyError as exc:
                    raise InputError(f"{where}: field {exc.args[0]!r} is missing") from None
                except TopologyError as exc:
                    raise InputError(f"{where}: {exc}") from None
                for j, row in enumerate(src.get("rows", [])):
                    if not isinstance(row, list) or len(row) != 7:
                        raise InputError(f"{where}.rows[{j}]: [batch, q_heads, kv_heads, head_dim, tokens, time, GB/s]")
                    b, hq, hkv, d, n, t, _ = row
                    w = Workload.create(ranks=1, seq_len=int(n), batch=int(b), q_heads=int(hq), kv_heads=int(hkv),
                                        head_dim=int(d), kv_dtype=str(src.get("kv_dtype", "bf16")))
                    cm = ComputeModel.of(w, topo)
                    out.append(AttentionRow(str(src["id"]), str(src["source"]), str(src["gpu"]), topo.name, w,
                                            _time_us(t, f"{where}.rows[{j}]"), cm.partial_us(0),
                                            cm.partial_bytes(0), cm._attn_launch_us, topo.rank_device(0).mem_bw_gbps))
    return out


def attention_summary(rows: list[AttentionRow]) -> dict:
    """Per GPU: rows, median and p90 |error| and signed median of the model as it stands, and the
    fitted efficiency (median of the rows' achieved share of memory bandwidth)."""
    out = {}
    for gpu in sorted({r.gpu for r in rows}):
        rs = [r for r in rows if r.gpu == gpu]
        errs = sorted(abs(r.error) for r in rs)
        out[gpu] = {"rows": len(rs), "median_abs": statistics.median(errs),
                    "p90_abs": errs[min(len(errs) - 1, round(0.9 * (len(errs) - 1)))],
                    "median_signed": statistics.median(r.error for r in rs),
                    "fitted_efficiency": statistics.median(r.efficiency for r in rs),
                    "sources": sorted({r.url for r in rs})}
    return out
