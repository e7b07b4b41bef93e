"""Emulated clusters: a topology laid out on network namespaces, bridges and shaped veths.

    with emulated(topo) as cluster:                      # up ... down, whatever happens
        results = run_in_namespaces(cluster, lambda r: ["python", "worker.py"])

Needs root and iproute2. See ``layout`` for the mapping and ``cluster`` for cleanup.
"""

from treeattn.emulate.check import CheckReport, FlowResult, check
from treeattn.emulate.cluster import Cluster, DownResult, down, emulated, find_cluster, list_clusters, up
from treeattn.emulate.layout import WIRE_FACTOR, Layout, plan_layout
from treeattn.emulate.netns import require_netns
from treeattn.emulate.spawn import RankResult, run_in_namespaces

__all__ = [
    "WIRE_FACTOR",
    "CheckReport",
    "Cluster",
    "DownResult",
    "FlowResult",
    "Layout",
    "RankResult",
    "check",
    "down",
    "emulated",
    "find_cluster",
    "list_clusters",
    "plan_layout",
    "require_netns",
    "run_in_namespaces",
    "up",
]
