"""Hardware discovery: what a machine has and how it is wired, as a Topology.

``probe`` reads saved tool output (``nvidia-smi topo -m``, ``rocm-smi --showtopo``, NCCL
topology XML, ``ibstat``) or the live machine (vendor tools, then sysfs) into a Topology,
with warnings for damaged or partial input and the assumptions made. The figures it gives
links and devices are the hardware's nominal ones (``hardware``); measuring them is
``treeattn.calibrate``'s job. This package imports only ``treeattn.topology`` and the
helpers below it, never torch.
"""

from treeattn.probe.build import Fabric, LinkLayer, ProbeResult
from treeattn.probe.discover import ProbeOptions, cpu_host, probe

__all__ = ["Fabric", "LinkLayer", "ProbeResult", "ProbeOptions", "probe", "cpu_host"]
