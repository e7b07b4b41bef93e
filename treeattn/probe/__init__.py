"""Hardware discovery and calibration.

``probe`` reads saved tool output (``nvidia-smi topo -m``, ``rocm-smi --showtopo``, NCCL
topology XML, ``ibstat``) or the live machine (vendor tools, then sysfs) into a Topology,
with warnings for damaged or partial input and the assumptions made. ``nccl_tests`` reads
nccl-tests logs; ``fit`` fits latency and bandwidth to timings; ``calibrate`` measures the
machine with real ranks. Only this package and ``treeattn.exec`` may import torch: the
live calibration modules (``calibrate``, ``calibrate_compute``) do, through ``exec``;
importing ``treeattn.probe`` itself does not.
"""

from treeattn.probe.build import Fabric, ProbeResult
from treeattn.probe.discover import ProbeOptions, cpu_host, probe
from treeattn.probe.fit import CollectiveFit, Fit, fit_alpha_beta, fit_collective
from treeattn.probe.nccl_tests import NcclTestsLog, calibrate_from_log, parse_nccl_tests, read_nccl_tests

__all__ = [
    "Fabric",
    "ProbeResult",
    "ProbeOptions",
    "probe",
    "cpu_host",
    "Fit",
    "CollectiveFit",
    "fit_alpha_beta",
    "fit_collective",
    "NcclTestsLog",
    "parse_nccl_tests",
    "read_nccl_tests",
    "calibrate_from_log",
]
