"""Calibrate inside an emulated cluster: ``treeattn calibrate`` run once per rank namespace.

Every rank runs the CLI (it finds RANK/WORLD_SIZE/MASTER_ADDR in its environment and joins
the others as under torchrun); rank 0 writes the fitted topology and prints the report as
JSON. The fitted topology keeps the emulated one's devices and routes with the measured
latency, bandwidth, per-message overhead and compute constants.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from treeattn.emulate.cluster import Cluster
from treeattn.emulate.spawn import run_in_namespaces
from treeattn.errors import ExecutionError
from treeattn.topology.io import dump_topology, load_topology
from treeattn.topology.model import Topology
from treeattn.units import format_size

__all__ = ["CalibrationSettings", "Calibration", "calibrate_in_cluster"]

_ENTRY = "import sys; from treeattn.cli import main; main(sys.argv[1:])"


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    """What the in-cluster calibration measures (flags of ``treeattn calibrate``)."""

    max_bytes: int = 1 << 20
    """Largest ping-pong message: cover the payloads measured (not the 8 MiB KV blocks: they
    would take seconds per message on a 40 Mbit/s link)."""
    sizes: int = 7
    repeats: int = 5
    warmup: int = 1
    compute: str = "attention"
    """Kernel whose fit sets ``launch_us`` and the memory efficiency (the plans' COMPUTE ops)."""
    attention_heads: tuple[int, int, int] = (32, 8, 128)
    """(q heads, KV heads, head dim) the attention kernel is timed with: the cases'."""
    timeout_s: float = 900.0


@dataclass(frozen=True)
class Calibration:
    """The fitted topology and the calibration's own report (``treeattn calibrate --json``)."""

    topology: Topology
    report: dict

    def summary(self) -> dict:
        """The fitted figures worth keeping beside results: cost constants, per-class fits and
        every calibration case, measured against predicted on the fitted topology."""
        r = self.report
        classes = [{k: c.get(k) for k in ("name", "pair", "alpha_us", "beta_gbps", "skew_us", "r2")}
                   for c in r.get("classes", [])]
        cases = r.get("cases", [])
        errs = sorted(abs(c["rel_error"]) for c in cases if isinstance(c.get("rel_error"), (int, float)))
        keep = ("label", "kind", "measured_us", "predicted_us", "rel_error", "measured_cpu_us", "predicted_cpu_us")
        return {"cost": r.get("cost"), "classes": classes, "host": r.get("host"), "load_avg": r.get("load_avg"),
                "warnings": r.get("warnings", []),
                "median_abs_error_of_its_cases": errs[len(errs) // 2] if errs else None,
                "cases": [{k: c[k] for k in keep if k in c} for c in cases]}


def calibrate_in_cluster(cluster: Cluster, topo: Topology, settings: CalibrationSettings | None = None) -> Calibration:
    """Run ``treeattn calibrate`` on every rank of ``cluster`` and read the fitted topology.

    Args:
        cluster: the running emulated cluster.
        topo: the topology it emulates, at the emulated rates (``scaled_topology``).
        settings: sizes and repeats.

    Returns:
        The fitted topology and rank 0's JSON report.

    Raises:
        ExecutionError: a rank failed (the message quotes rank 0's last error line).
    """
    s = settings or CalibrationSettings()
    with tempfile.TemporaryDirectory(prefix="treeattn-validate-cal-") as tmp:
        topo_file = Path(tmp) / "topology.yaml"
        topo_file.write_text(dump_topology(topo))
        out = Path(tmp) / "calibrated.yaml"
        argv = [sys.executable, "-c", _ENTRY, "calibrate", "-t", str(topo_file), "-o", str(out), "--json",
                "--max-size", format_size(s.max_bytes).replace(" ", ""), "--sizes", str(s.sizes), "--repeats",
                str(s.repeats), "--warmup", str(s.warmup), "--compute", s.compute, "--backend", "gloo",
                "--attention-shape", "/".join(str(x) for x in s.attention_heads),
                "--timeout", str(min(s.timeout_s, 300.0))]
        results = run_in_namespaces(cluster, lambda r: argv, lambda r: {"OMP_NUM_THREADS": "1"},
                                    timeout_s=s.timeout_s)
        bad = [r for r in results if r.returncode != 0]
        if bad or not out.is_file():
            first = bad[0] if bad else results[0]
            lines = [ln for ln in (first.stderr + first.stdout).splitlines() if ln.strip()]
            tail = lines[-1][:300] if lines else "no output"
            raise ExecutionError(f"calibration inside the emulated {topo.name!r} failed on rank {first.rank} "
                                 f"(status {first.returncode}): {tail}")
        try:
            report = json.loads(results[0].stdout)
        except ValueError:
            report = {}
        return Calibration(load_topology(out), report)
