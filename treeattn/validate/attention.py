"""Score the compute model's attention kernel on published decode-attention timings.

``results/published/attention/*.yaml`` lists published kernel runs (FlashAttention,
FlashInfer): batch, heads, head dim and KV tokens per sequence, and the time per call. Each
row is predicted as one COMPUTE of a ``Workload`` on a 1-rank topology of that GPU
(``ComputeModel.partial_us``: launch plus the KV, query and partial bytes over the kernel's
bandwidth). ``fit_kernel_line`` fits each GPU's rows with that line's two terms, a fixed
cost per call and a share of the memory bandwidth: the figures the families keep as
``cost.attn_launch_us`` and ``cost.attn_efficiency`` (docs/attention-model.md).

A source marked ``fitted: false`` (with ``why``) is predicted and scored but held out of its
GPU's fit: ``attention_summary`` reports its rows apart, as ``"<gpu> held out"``, scored by the
family's line and with the line fitted to them alone beside it.
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

__all__ = ["AttentionRow", "attention_summary", "fit_kernel_line", "load_attention"]

_UNITS = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
"""Time units a table may give, longest suffix first where one ends another (``ms``, ``s``)."""


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
    fitted: bool = True
    """False for a source held out of its GPU's fit (``fitted: false`` in the corpus file)."""

    @property
    def error(self) -> float:
        return self.predicted_us / self.published_us - 1.0


def _time_us(text: object, where: str) -> float:
    s = str(text).strip()
    for unit in _UNITS:
        if s.endswith(unit):
            try:
                value = float(s[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * _UNITS[unit]
    raise InputError(f"{where}: time {text!r} is not a positive number with a unit ({', '.join(_UNITS)})")


def _published_us(t: object, gbps: object, w: Workload, gbps_of: object, where: str) -> float:
    """A row's published time; where a source publishes a bandwidth only (``time`` null), the
    time that bandwidth gives over the bytes the source says it divides (``gbps_of: kv``: the
    K and V read, the only such count a source has given)."""
    if t is not None:
        return _time_us(t, where)
    if gbps_of != "kv":
        raise InputError(f"{where}: no time; a row may give its GB/s alone where its source says what bytes that "
                         "divides (gbps_of: kv)")
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not gbps > 0:
        raise InputError(f"{where}: no time, and GB/s {gbps!r} is not a positive number")
    return w.kv_bytes(0) / (float(gbps) * 1e3)


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
                fitted = src.get("fitted", True)
                if not isinstance(fitted, bool):
                    raise InputError(f"{where}: fitted is {fitted!r}; give true or false")
                if not fitted and not str(src.get("why") or "").strip():
                    raise InputError(f"{where}: a source held out of the fit (fitted: false) says why")
                for j, row in enumerate(src.get("rows", [])):
                    if not isinstance(row, list) or len(row) != 7:
                        raise InputError(f"{where}.rows[{j}]: [batch, q_heads, kv_heads, head_dim, tokens, time, GB/s]")
                    b, hq, hkv, d, n, t, gbps = row
                    w = Workload.create(ranks=1, seq_len=int(n), batch=int(b), q_heads=int(hq), kv_heads=int(hkv),
                                        head_dim=int(d), kv_dtype=str(src.get("kv_dtype", "bf16")))
                    cm = ComputeModel.of(w, topo)
                    out.append(AttentionRow(str(src["id"]), str(src["source"]), str(src["gpu"]), topo.name, w,
                                            _published_us(t, gbps, w, src.get("gbps_of"), f"{where}.rows[{j}]"),
                                            cm.partial_us(0),
                                            cm.partial_bytes(0), cm.attention_terms(0)[0],
                                            topo.rank_device(0).mem_bw_gbps, fitted))
    return out


def fit_kernel_line(rows: list[AttentionRow], step_us: float = 0.1) -> tuple[float, float]:
    """The fixed cost (us) and share of memory bandwidth of ``time = fixed + bytes / (share x
    bandwidth)`` that minimise the summed |relative error| over ``rows`` (one GPU's).

    Least absolute error, so that one row far off the line (a run the source cannot explain)
    does not drag the fit. For a fixed cost the best inverse bandwidth is a weighted median
    (of (time - fixed) / memory time at full bandwidth, weights memory time / time); the
    fixed cost is scanned in ``step_us`` steps below the fastest row's time.
    """
    if not rows:
        raise InputError("no published rows to fit")
    if step_us <= 0:
        raise InputError(f"fixed-cost step {step_us} µs: give a positive step")
    for r in rows:
        if r.mem_bw_gbps <= 0:
            raise InputError(f"{r.source_id}: {r.topology} has no memory bandwidth to fit a share of")
    full = [r.bytes / 1e3 / r.mem_bw_gbps for r in rows]  # each row's memory time at full bandwidth
    best: tuple[float, float, float] | None = None
    for k in range(int(min(r.published_us for r in rows) / step_us) + 1):
        fixed = round(k * step_us, 9)
        pts = sorted(((r.published_us - fixed) / f, f / r.published_us)
                     for r, f in zip(rows, full, strict=True) if f > 0)
        if not pts:
            continue
        half, acc, slope = sum(w for _, w in pts) / 2, 0.0, pts[-1][0]
        for v, w in pts:
            acc += w
            if acc >= half:
                slope = v
                break
        if slope <= 0:
            continue
        loss = sum(abs((fixed + f * slope) / r.published_us - 1) for r, f in zip(rows, full, strict=True))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, fixed, slope)
    if best is None:
        raise InputError("the published rows leave no positive bandwidth to fit")
    return best[1], min(1.0, 1.0 / best[2])


def attention_summary(rows: list[AttentionRow]) -> dict:
    """Per GPU: rows, median and p90 |error| and signed median of the model as it stands, and the
    line fitted to them (``fit_kernel_line``: fixed cost, share of memory bandwidth; None for
    both where the rows are of one size, which any line through them fits as well). Rows of sources held
    out of the fit (``fitted: false``) come apart, under ``"<gpu> held out"``: the model's error
    on them, and the line their rows alone give where they are one source's (the rows of
    several held-out kernels, each held out for its own reason, give a line that is none's:
    MI300X's three kernels run at 0.12-0.59 of the bandwidth at one shape)."""
    def group(r: AttentionRow) -> str:
        return r.gpu if r.fitted else f"{r.gpu} held out"

    out = {}
    for name in sorted({group(r) for r in rows}):
        rs = [r for r in rows if group(r) == name]
        one = name == rs[0].gpu or len({r.source_id for r in rs}) == 1
        # a line needs two sizes of KV cache: rows of one fix a share at any fixed cost
        fit = fit_kernel_line(rs) if len({r.workload.kv_bytes(0) for r in rs}) > 1 and one else (None, None)
        errs = sorted(abs(r.error) for r in rs)
        out[name] = {"rows": len(rs), "median_abs": statistics.median(errs),
                     "p90_abs": errs[min(len(errs) - 1, round(0.9 * (len(errs) - 1)))],
                     "median_signed": statistics.median(r.error for r in rs),
                     "fitted_launch_us": fit[0], "fitted_efficiency": fit[1],
                     "sources": sorted({r.url for r in rs})}
    return out
