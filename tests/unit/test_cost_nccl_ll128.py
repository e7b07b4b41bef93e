"""NCCL's path types decide LL128 and the intra-node hop latencies (treeattn.cost.nccl_paths,
after tuning.cc ncclTopoTuneModel's typeIntra and typeInter)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from treeattn.cost import nccl, nccl_fabric, nccl_paths
from treeattn.probe import ProbeOptions, probe
from treeattn.topology.library import resolve

FIX = Path(__file__).parents[1] / "fixtures" / "probe"
NV6 = "nvidia-smi-topo-m.4xh100-nv6.nccl-1617.txt"


def _cluster(tmp_path: Path, name: str, model: str, nic_path: str | None, nodes: int = 2, lines: str = r"\S+"):
    """A cluster of ``nodes`` machines from a fixture's matrix, the GPU-NIC cells of the rows
    ``lines`` matches moved from PIX/PXB to ``nic_path`` (None: as published)."""
    text = (FIX / name).read_text()
    if nic_path is not None:
        text = "\n".join(re.sub(r"\b(PIX|PXB)\b", nic_path, line) if re.match(rf"\s*(?:{lines})\s", line) else line
                         for line in text.splitlines())
    matrix = tmp_path / f"{nic_path}-{name}"
    matrix.write_text(text)
    return probe(ProbeOptions(nvidia_smi=matrix, gpu_model=model, nodes=nodes, nic_gbps=400.0)).topology


def _protocols(topo, algorithm: str | None = None) -> set[str]:
    return {e.protocol.value for e in nccl.predict(topo, "allreduce", 4 << 20)
            if algorithm is None or e.algorithm.value == algorithm}


def _at_release(topo, version: str):
    return replace(topo, cost=topo.cost.updated(nccl_version=version))


@pytest.mark.parametrize(("name", "model"), [(NV6, "H100-SXM5-80GB"),
                                             ("nvidia-smi-topo-m.dgx-a100.txt", "A100-SXM4-80GB")])
def test_nics_behind_the_cpu_leave_no_ll128_across_nodes(tmp_path, name, model):
    near = _cluster(tmp_path, name, model, None)
    assert {nccl_paths.net_path_type(near, r, near.num_ranks - 1) for r in range(4)} <= {"PIX", "PXB"}
    assert "LL128" in _protocols(near)
    for far, kind in (("NODE", "PHB"), ("SYS", "SYS")):
        topo = _cluster(tmp_path, name, model, far)
        assert nccl_paths.net_path_type(topo, 0, topo.num_ranks - 1) == kind
        assert _protocols(topo) == {"LL", "Simple"}, far
    # One machine: no NIC in the ring, LL128 on NVLink as before.
    assert "LL128" in _protocols(_cluster(tmp_path, name, model, "SYS", nodes=1))


def test_gpus_far_from_the_nic_reach_it_through_an_nvlink_peer_on_hopper_only(tmp_path):
    # GPU0 keeps its PIX NIC; GPUs 1-3 reach theirs through the CPU (NODE), or by PXN through
    # GPU0 over NVLink. A ring enters a node by one GPU and leaves it by another: the second
    # nearest is PXN, within Hopper's limit (from 2.17.1), beyond Ampere's (PXB).
    hopper = _cluster(tmp_path, NV6, "H100-SXM5-80GB", "NODE", lines="GPU[123]|NIC[123]")
    ranks = list(range(4))
    assert [nccl_paths.net_path_type(hopper, r, 4) for r in ranks] == ["PIX", "PHB", "PHB", "PHB"]
    assert nccl_paths.NcclPaths(hopper).inter_types(ranks, 4, (2, 30, 7), hopper=True) == ("PXN", "PIX")
    assert nccl_paths.NcclPaths(hopper).inter_types(ranks, 4, (2, 30, 7), hopper=False) == ("PXN", "PXN")
    assert "LL128" in _protocols(hopper)
    # Before 2.17.1 Hopper's limit was PXB too (topologies name 2.19 on: the rule itself).
    assert not nccl_paths.ll128_enabled("NVL", "PXN", hopper=True, rccl=False, release=(2, 16, 5))
    assert nccl_paths.ll128_enabled("NVL", "PXN", hopper=True, rccl=False, release=(2, 17, 1))
    ampere = _cluster(tmp_path, NV6, "A100-SXM4-80GB", "NODE", lines="GPU[123]|NIC[123]")
    assert _protocols(ampere) == {"LL", "Simple"}


def test_the_shipped_clusters_keep_ll128():
    # DGX and HGX put each GPU's NIC under its PCIe switch (PIX); GB200's NICs hang off Grace,
    # reached by C2C (P2C, nearer than PXN), which NCCL before 2.27 types PHB.
    for spec, kind in (("dgx-h100:nodes=2", "PIX"), ("dgx-a100:nodes=2", "PIX"), ("gb200-nvl72:racks=2", "P2C")):
        topo = resolve(spec)
        assert nccl_paths.net_path_type(topo, 0, topo.num_ranks - 1) == kind, spec
        assert nccl_fabric.fabric(topo).ll128 and nccl_fabric.fabric(topo).tree_ll128, spec
    gb200 = _at_release(resolve("gb200-nvl72:racks=2"), "2.26.2")
    assert _protocols(gb200, "tree") == {"LL", "Simple"}
    assert "LL128" in _protocols(_at_release(resolve("gb200-nvl72:racks=2"), "2.27.3"), "tree")


def test_a_ring_that_crosses_pcie_between_nvlink_islands_runs_no_ll128():
    # NVLink bridge pairs (A40, Azure's NC A100 v4): the ring crosses PCIe between the pairs,
    # beyond PATH_NVB; DGX-1's hybrid cube-mesh rings over NVLink pairs.
    assert _protocols(resolve("a40-8")) == {"LL", "Simple"}
    assert _protocols(resolve("azure-nc-a100-v4")) == {"LL", "Simple"}
    assert _protocols(resolve("a40-8[ranks 0-1]")) == {"LL", "LL128", "Simple"}
    assert "LL128" in _protocols(resolve("dgx1-v100"))
    # Its hops take NCCL's PCIe latencies (intraHw by typeIntra == NVL), its ring no NVLink tail.
    assert nccl_fabric.fabric(resolve("a40-8")).intra_hw == "pci"
    assert nccl_fabric.fabric(resolve("a40-8[ranks 0-1]")).intra_hw == "nvlink"
    assert nccl_fabric.fabric(resolve("dgx1-v100")).intra_hw == "nvlink"


def test_only_the_communicators_gpus_join_a_path():
    # DGX-1: GPUs 0 and 5 have no NVLink of their own (their route crosses both CPUs), and no
    # rank joins them; 0-1-5 ring through GPU 1 (NVB): LL128 on, PCIe's hop latencies.
    assert nccl_paths.NcclPaths(resolve("dgx1-v100[ranks 0,5]")).intra_type([0, 1]) == nccl_paths.BEYOND_NVB
    assert _protocols(resolve("dgx1-v100[ranks 0,5]")) == {"LL", "Simple"}
    three = resolve("dgx1-v100[ranks 0,1,5]")
    assert nccl_paths.NcclPaths(three).intra_type([0, 1, 2]) == "NVB"
    assert "LL128" in _protocols(three) and nccl_fabric.fabric(three).intra_hw == "pci"
    # NVL only before 2.18.3, and on RCCL.
    assert not nccl_paths.ll128_enabled("NVB", "LOC", hopper=False, rccl=False, release=(2, 18, 1))
    assert not nccl_paths.ll128_enabled("NVB", "LOC", hopper=False, rccl=True, release=(2, 30, 7))


def test_gpus_without_peer_to_peer_run_no_ll128():
    # NCCL_P2P_DISABLE=1 (p2p_level LOC): every pair through host memory, beyond PATH_NVB.
    topo = resolve("dgx-h100")
    off = replace(topo, cost=topo.cost.updated(p2p_level="LOC"))
    assert "LL128" in _protocols(topo)
    assert _protocols(off) == {"LL", "Simple"} and nccl_fabric.fabric(off).intra_hw == "pci"


def test_a_ring_comes_back_by_the_nic_it_left_by(tmp_path):
    # Four GPUs, each alone with its NIC (PIX), the others' NICs across the sockets (SYS): the
    # ring leaves and re-enters a node by one NIC, which the second GPU reaches by PXN through
    # the first. Hopper's limit takes PXN, Ampere's (PXB) does not.
    hopper = _cluster(tmp_path, NV6, "H100-SXM5-80GB", None)
    ampere = _cluster(tmp_path, NV6, "A100-SXM4-80GB", None)
    assert nccl_paths.NcclPaths(ampere).inter_types([0, 1, 2, 3], 4, (2, 30, 7), hopper=False) == ("PXN", "PXN")
    assert "LL128" in _protocols(hopper)
    assert _protocols(ampere) == {"LL", "Simple"}
    # DGX A100: two GPUs and two NICs under each switch (PXB): its ring keeps LL128.
    assert "LL128" in _protocols(resolve("dgx-a100:nodes=2"))


def test_a_p2p_level_below_the_path_is_host_memory():
    three = resolve("dgx1-v100[ranks 0,1,5]")
    level_nvl = replace(three, cost=three.cost.updated(p2p_level="NVL"))  # the NVB pair 0-5 past it
    assert nccl_paths.NcclPaths(level_nvl).intra_type([0, 1, 2]) == nccl_paths.BEYOND_NVB
    racks = resolve("gb200-nvl72:racks=2")  # NVLink across trays, P2P off: no LL128 there either
    off = replace(racks, cost=racks.cost.updated(p2p_level="LOC"))
    assert not nccl_fabric.fabric(off).ll128 and nccl_fabric.fabric(off).intra_hw == "pci"
