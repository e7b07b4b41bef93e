"""NCCL enables LL128 across nodes only where a GPU reaches a NIC closely enough (tuning.cc
ncclTopoTuneModel's typeInter): NICs that hang off the CPU leave LL and Simple."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from treeattn.cost import nccl, nccl_fabric
from treeattn.probe import ProbeOptions, probe
from treeattn.topology.library import resolve

FIX = Path(__file__).parents[1] / "fixtures" / "probe"


def _cluster(tmp_path: Path, name: str, model: str, nic_path: str | None, nodes: int = 2):
    """A cluster of ``nodes`` machines from a fixture's matrix, each GPU's own NIC moved to
    ``nic_path`` (None: as published)."""
    text = (FIX / name).read_text()
    if nic_path is not None:
        text = "\n".join(re.sub(r"\b(PIX|PXB)\b", nic_path, line) if re.match(r"\s*(GPU|NIC|mlx)", line) else line
                         for line in text.splitlines())
    matrix = tmp_path / name
    matrix.write_text(text)
    return probe(ProbeOptions(nvidia_smi=matrix, gpu_model=model, nodes=nodes, nic_gbps=400.0)).topology


def _protocols(topo) -> set[str]:
    return {e.protocol.value for e in nccl.predict(topo, "allreduce", 4 << 20)}


@pytest.mark.parametrize(("name", "model"), [("nvidia-smi-topo-m.4xh100-nv6.nccl-1617.txt", "H100-SXM5-80GB"),
                                             ("nvidia-smi-topo-m.dgx-a100.txt", "A100-SXM4-80GB")])
def test_nics_behind_the_cpu_leave_no_ll128_across_nodes(tmp_path, name, model):
    near = _cluster(tmp_path, name, model, None)
    assert {nccl_fabric.net_path_type(near, r, near.num_ranks - 1) for r in range(4)} <= {"PIX", "PXB"}
    assert "LL128" in _protocols(near)
    for far, kind in (("NODE", "PHB"), ("SYS", "SYS")):
        topo = _cluster(tmp_path, name, model, far)
        assert nccl_fabric.net_path_type(topo, 0, topo.num_ranks - 1) == kind
        assert _protocols(topo) == {"LL", "Simple"}, far
    # One machine: no NIC in the ring, LL128 on NVLink as before.
    assert "LL128" in _protocols(_cluster(tmp_path, name, model, "SYS", nodes=1))


def test_the_shipped_clusters_keep_ll128():
    # DGX and HGX put each GPU's NIC under its PCIe switch (PIX); GB200's NICs hang off Grace,
    # reached by C2C (P2C, nearer than PXN).
    for spec, kind in (("dgx-h100:nodes=2", "PIX"), ("dgx-a100:nodes=2", "PIX"), ("gb200-nvl72:racks=2", "P2C")):
        topo = resolve(spec)
        assert nccl_fabric.net_path_type(topo, 0, topo.num_ranks - 1) == kind, spec
        assert nccl_fabric.fabric(topo).ll128, spec


def test_a_ring_that_crosses_pcie_between_nvlink_islands_runs_no_ll128():
    # NVLink bridge pairs (A40, Azure's NC A100 v4): the ring crosses PCIe between the pairs,
    # beyond PATH_NVB; DGX-1's hybrid cube-mesh is one NVLink island, its rings NVLink only.
    assert _protocols(resolve("a40-8")) == {"LL", "Simple"}
    assert _protocols(resolve("azure-nc-a100-v4")) == {"LL", "Simple"}
    assert _protocols(resolve("a40-8[ranks 0-1]")) == {"LL", "LL128", "Simple"}
    assert "LL128" in _protocols(resolve("dgx1-v100"))
    # Its hops take NCCL's PCIe latencies (intraHw by typeIntra == NVL), its ring no NVLink tail.
    assert nccl_fabric.fabric(resolve("a40-8")).intra_hw == "pci"
    assert nccl_fabric.fabric(resolve("a40-8[ranks 0-1]")).intra_hw == "nvlink"
    assert nccl_fabric.fabric(resolve("dgx1-v100")).intra_hw == "nvlink"
