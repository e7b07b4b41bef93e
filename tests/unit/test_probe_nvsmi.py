"""nvidia-smi topo -m, nvlink --status and GPU-name parsing, on every real capture and damaged copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from treeattn.errors import ProbeError
from treeattn.probe import ProbeOptions, probe
from treeattn.probe.build import NodeDraft
from treeattn.probe.gpus import GpuCatalog, parse_gpu_names
from treeattn.probe.hardware import gpu_spec
from treeattn.probe.nvlink_status import parse_nvlink_status
from treeattn.probe.nvsmi_topo import parse_topo_matrix
from treeattn.topology.library import resolve
from treeattn.topology.model import CostParams, DeviceKind, LinkKind

FIX = Path(__file__).parents[1] / "fixtures" / "probe"
TOPO = {
    "dgx-a100": FIX / "nvidia-smi-topo-m.dgx-a100.txt",
    "dgx1": FIX / "nvidia-smi-topo-m.dgx1-v100.txt",
    "hgx-h100": FIX / "nvidia-smi-topo-m.hgx-h100-della.txt",
    "della-2xa100": FIX / "nvidia-smi-topo-m.della-2xa100-pcie.txt",
    "pcie-5gpu": FIX / "nvidia-smi-topo-m.pcie-5gpu-2numa.club3090-46.txt",
    "4xh100-nv6": FIX / "nvidia-smi-topo-m.4xh100-nv6.nccl-1617.txt",
}
TABBED = ("dgx-a100", "dgx1", "hgx-h100", "della-2xa100")


def _probe(key: str, **kw):
    return probe(ProbeOptions(nvidia_smi=TOPO[key], **kw))


def _kinds_on_route(topo, a: int, b: int) -> set[str]:
    return {ln.kind.value for ln in topo.route_links(a, b)}


# -- matrices as printed ----------------------------------------------------------------------


def test_dgx_a100_matrix():
    m = parse_topo_matrix(TOPO["dgx-a100"].read_text())
    assert m.gpus == tuple(f"GPU{i}" for i in range(8))
    assert m.nics == tuple(f"mlx5_{i}" for i in range(12))
    assert all(m.rel[(a, b)] == "NV12" for a in m.gpus for b in m.gpus if a != b)
    assert m.rel[("GPU0", "mlx5_0")] == "PXB" and m.rel[("mlx5_4", "mlx5_5")] == "PIX"
    assert m.numa == {"GPU0": 3, "GPU1": 3, "GPU2": 1, "GPU3": 1, "GPU4": 7, "GPU5": 7, "GPU6": 5, "GPU7": 5}
    assert m.cpu_affinity["GPU4"] == "112-127,240-255"
    assert m.warnings == ()


def test_hgx_h100_matrix_reads_nic_legend_and_padded_numa_column():
    m = parse_topo_matrix(TOPO["hgx-h100"].read_text())
    assert m.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(6)}
    # CPU Affinity is empty for GPU0-3 as published; NUMA Affinity sits before a padded GPU NUMA ID cell.
    assert "GPU0" not in m.cpu_affinity and m.cpu_affinity["GPU4"] == "1"
    assert [m.numa[g] for g in m.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_space_separated_capture():
    m = parse_topo_matrix(TOPO["pcie-5gpu"].read_text())
    assert m.nics == ()
    assert m.rel[("GPU1", "GPU2")] == "PHB" and m.rel[("GPU1", "GPU3")] == "NODE" and m.rel[("GPU0", "GPU4")] == "SYS"
    assert m.numa == {"GPU0": 1, "GPU1": 0, "GPU2": 0, "GPU3": 0, "GPU4": 0}


def _read(m):
    return m.columns, m.rel, m.cpu_affinity, m.numa, m.nic_names


@pytest.mark.parametrize("key", TABBED)
def test_a_capture_copied_with_its_tabs_expanded_reads_as_the_original(key):
    # A terminal copy turns nvidia-smi's tabs into spaces up to 8-column stops: `mlx5_10 CPU
    # Affinity` then sits one space apart, and the H100 rows' empty CPU Affinity leaves only
    # its tab stop; read without the stops, NUMA Affinity's value falls under CPU Affinity.
    text = TOPO[key].read_text()
    expanded = parse_topo_matrix(text.expandtabs(8))
    assert _read(expanded) == _read(parse_topo_matrix(text)) and expanded.warnings == parse_topo_matrix(text).warnings


def _collapsed(text: str) -> str:
    """Every matrix line with its cells one space apart (spacing lost, as in some pastes)."""
    head = next(i for i, ln in enumerate(text.splitlines()) if "GPU0" in ln.split())
    lines = text.splitlines()
    end = lines.index("", head)
    return "\n".join([*lines[:head], *(" ".join(ln.split()) for ln in lines[head:end]), *lines[end:]]) + "\n"


def test_a_capture_with_its_spacing_lost_reads_what_is_unambiguous_and_says_what_is_not():
    text = TOPO["hgx-h100"].read_text()
    m = parse_topo_matrix(_collapsed(text), "c.txt")
    ref = parse_topo_matrix(text)
    assert m.columns == ref.columns and m.rel == ref.rel and m.nic_names == ref.nic_names
    # GPU4-7 print three values for three columns; GPU0-3 print two ("0 N/A", CPU Affinity
    # empty): which two is not known without the spacing, so none is read, and that is said.
    assert m.numa == {f"GPU{i}": 1 for i in range(4, 8)} and m.cpu_affinity == {f"GPU{i}": "1" for i in range(4, 8)}
    unread = [w for w in m.warnings if "spacing does not say which" in w]
    assert [w.split(": row ")[1].split()[0] for w in unread] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert unread[0].startswith("c.txt:2: row GPU0 has 2 value(s) '0 N/A' for CPU Affinity, NUMA Affinity, GPU NUMA ID")
    for key in ("dgx-a100", "dgx1", "della-2xa100", "pcie-5gpu", "4xh100-nv6"):
        t = TOPO[key].read_text()
        assert _read(parse_topo_matrix(_collapsed(t))) == _read(parse_topo_matrix(t)), key


def test_four_h100_with_direct_nvlink_pairs_space_separated():
    m = parse_topo_matrix(TOPO["4xh100-nv6"].read_text())
    assert m.gpus == ("GPU0", "GPU1", "GPU2", "GPU3") and m.nics == ("NIC0", "NIC1", "NIC2", "NIC3")
    assert m.numa == {"GPU0": 3, "GPU1": 1, "GPU2": 7, "GPU3": 5} and m.cpu_affinity["GPU2"] == "7,15,23,31"
    assert all("has no line in the NIC Legend" in w for w in m.warnings) and len(m.warnings) == 4
    topo = _probe("4xh100-nv6", gpu_model="H100-SXM5-80GB").topology
    # NV6 to each of 3 peers is 18 links, what one H100 has: direct links, no NVSwitch.
    assert not any(d.kind is DeviceKind.NVSWITCH for d in topo.devices)
    assert {(ln.count, ln.bw_gbps) for ln in topo.links if ln.kind is LinkKind.NVLINK} == {(6, 150.0)}
    assert [d.nic for d in topo.devices if d.kind is DeviceKind.GPU] == [f"n0.nic{i}" for i in range(4)]


# -- topologies -------------------------------------------------------------------------------


def test_dgx_a100_topology():
    r = _probe("dgx-a100", gpu_model="A100-SXM4-80GB")
    topo = r.topology
    gpus = [d for d in topo.devices if d.kind is DeviceKind.GPU]
    assert len(gpus) == 8 and topo.num_ranks == 8
    assert {d.model for d in gpus} == {"A100-SXM4-80GB"} and {d.mem_bw_gbps for d in gpus} == {2039}
    # NV12 to all 7 peers exceeds the 12 links an A100 has: an NVSwitch, 12 links per GPU.
    sw = [d.name for d in topo.devices if d.kind is DeviceKind.NVSWITCH]
    assert sw == ["n0.nvswitch"]
    to_sw = [ln for ln in topo.links if ln.dst == "n0.nvswitch"]
    assert len(to_sw) == 8 and {(ln.count, ln.bw_gbps) for ln in to_sw} == {(12, 300.0)}
    assert all(topo.route_bw_gbps(0, j) == 300.0 for j in range(1, 8))
    assert sum(d.kind is DeviceKind.NIC for d in topo.devices) == 12
    # Rails: each GPU its own nearest (PXB) NIC; storage NICs mlx5_4/5/10/11 serve no GPU.
    assert [d.nic for d in gpus] == [f"n0.mlx5_{i}" for i in (0, 1, 2, 3, 6, 7, 8, 9)]
    assert sorted(d.name for d in topo.devices if d.kind is DeviceKind.CPU) == [f"n0.cpu{i}" for i in (1, 3, 5, 7)]
    assert any("mlx5_4" in w and "NUMA" in w for w in r.warnings)
    # The decode kernel as published on A100 (the dgx-a100 family's figures), said as assumed.
    assert (topo.cost.attn_launch_us, topo.cost.attn_efficiency) == (13.9, 0.72)
    assert resolve("dgx-a100").cost == topo.cost
    assert any(a.startswith("attention kernel: the fit to published decode kernels on A100") for a in r.assumptions)


def _pcie_path_avoids_cpu(topo, a: str, b: str) -> bool:
    """Is there a PCIe path a..b whose inner devices are PCIe switches only?"""
    seen, todo = {a}, [a]
    while todo:
        u = todo.pop()
        for ln in topo.links:
            if ln.src != u or ln.kind is not LinkKind.PCIE or ln.dst in seen:
                continue
            if ln.dst == b:
                return True
            if topo.device(ln.dst).kind is DeviceKind.PCIE_SWITCH:
                seen.add(ln.dst)
                todo.append(ln.dst)
    return False


def test_cpu_vendor_sets_the_socket_link():
    topo = _probe("dgx-a100", gpu_model="A100-SXM4-80GB", cpu_vendor="amd").topology
    socket = {(ln.kind, ln.bw_gbps) for ln in topo.links if ln.src.startswith("n0.cpu") and ln.dst.startswith("n0.cpu")}
    assert socket == {(LinkKind.INFINITY_FABRIC, 16.0)}


def test_cpu_vendor_names_the_sockets_and_decides_nccls_p2p_level():
    from treeattn.cost import nccl_rates

    # Two A100 PCIe on two sockets (SYS): NCCL connects them peer-to-peer on an AMD host of at
    # most two GPUs, through host memory on others (paths.cc ncclTopoCheckP2p).
    amd = _probe("della-2xa100", gpu_model="A100-PCIE-40GB", cpu_vendor="amd").topology
    intel = _probe("della-2xa100", gpu_model="A100-PCIE-40GB", cpu_vendor="intel").topology
    assert {d.model for d in amd.devices if d.kind is DeviceKind.CPU} == {"AMD"}
    assert {d.model for d in intel.devices if d.kind is DeviceKind.CPU} == {"Intel"}
    assert nccl_rates.shm_pairs(amd) == 0
    assert nccl_rates.shm_pairs(intel) == 2


def test_unknown_cpu_vendor_says_it_decides_nccls_p2p_level():
    import json

    from tests.cli_helpers import run_cli
    from treeattn.cli.probe import cpu_vendor_note

    # Saved output without --cpu-vendor: the sockets stay unnamed (Intel's choices), which puts
    # both pairs through host memory; probe's assumptions must say the vendor decides that.
    note = ("CPU vendor unknown: NCCL's P2P level as on an Intel host (PXB), so 2 of 2 GPU pairs of a node go "
            "through host memory; on AMD (SYS) 0 would; pass --cpu-vendor amd or intel")
    assert cpu_vendor_note(_probe("della-2xa100", gpu_model="A100-PCIE-40GB").topology) == note
    # with --nodes, one node's pairs (the nodes are copies of it), the same note
    assert cpu_vendor_note(_probe("della-2xa100", gpu_model="A100-PCIE-40GB", nics="2x200", nodes=3).topology) == note
    # a vendor given, or one that would change nothing (five GPUs without peer-to-peer): no note
    for result in (_probe("della-2xa100", gpu_model="A100-PCIE-40GB", cpu_vendor="intel"),
                   _probe("pcie-5gpu", gpu_model="RTX-4090")):
        assert cpu_vendor_note(result.topology) == ""
    res = run_cli("probe", "--from-nvidia-smi", str(TOPO["della-2xa100"]), "--gpu-model", "A100-PCIE-40GB", "--json")
    assert res.exit_code == 0, res.stderr
    assert [a for a in json.loads(res.stdout)["assumptions"] if "P2P level" in a] == [note]


def test_dgx_a100_gpu_reaches_its_nic_without_the_cpu():
    topo = _probe("dgx-a100", gpu_model="A100-SXM4-80GB").topology
    assert _pcie_path_avoids_cpu(topo, "n0.gpu0", "n0.mlx5_0")  # PXB: under one switch tree
    assert _pcie_path_avoids_cpu(topo, "n0.mlx5_4", "n0.mlx5_5")  # PIX
    assert not _pcie_path_avoids_cpu(topo, "n0.gpu0", "n0.mlx5_2")  # SYS


def test_dgx1_hybrid_cube_mesh():
    r = _probe("dgx1", gpu_model="V100-SXM2-32GB")
    topo = r.topology
    nv = {(ln.src, ln.dst): ln.count for ln in topo.links if ln.kind is LinkKind.NVLINK}
    assert not any(d.kind is DeviceKind.NVSWITCH for d in topo.devices)
    assert len(nv) == 2 * 16  # 16 GPU pairs with NVLink, both directions
    assert nv[("n0.gpu0", "n0.gpu1")] == 1 and nv[("n0.gpu0", "n0.gpu3")] == 2
    for g in range(8):  # a V100 has 6 NVLinks, all used
        assert sum(c for (s, _), c in nv.items() if s == f"n0.gpu{g}") == 6
    assert ("n0.gpu0", "n0.gpu5") not in nv
    # Without NVLink, GPU0 -> GPU5 crosses the socket link (SYS).
    assert "upi" in _kinds_on_route(topo, 0, 5)
    assert topo.route_bw_gbps(0, 3) == 50.0
    assert sum(d.kind is DeviceKind.CPU for d in topo.devices) == 2
    assert any("CPU Affinity" in a for a in r.assumptions)
    assert topo.cost == CostParams()  # no decode kernel published on V100: the defaults


def test_hgx_h100_reports_numa_contradiction():
    r = _probe("hgx-h100", gpu_model="H100-SXM5-80GB")
    topo = r.topology
    assert {(ln.count, ln.bw_gbps) for ln in topo.links if ln.dst == "n0.nvswitch"} == {(18, 450.0)}
    assert sorted(d.name for d in topo.devices if d.kind is DeviceKind.NIC) == [f"n0.mlx5_{i}" for i in range(6)]
    # Published table says NODE between GPU0 (NUMA 0) and NICs next to GPU4 (NUMA 1): reported, not hidden.
    assert any("contradict the NUMA placement" in w for w in r.warnings)
    gpus = [d for d in topo.devices if d.kind is DeviceKind.GPU]
    assert gpus[0].nic == "n0.mlx5_0" and gpus[3].nic == "n0.mlx5_2" and gpus[4].nic == "n0.mlx5_3"


def test_della_two_pcie_gpus_on_two_sockets():
    topo = _probe("della-2xa100").topology
    assert not any(ln.kind is LinkKind.NVLINK for ln in topo.links)
    assert "upi" in _kinds_on_route(topo, 0, 1)
    assert [d.nic for d in topo.devices if d.kind is DeviceKind.GPU] == ["n0.mlx5_0", "n0.mlx5_1"]


def test_pcie_box_numa_layout_and_unknown_model_is_reported():
    r = _probe("pcie-5gpu")
    topo = r.topology
    assert topo.num_ranks == 5 and not any(d.kind is DeviceKind.NIC for d in topo.devices)
    assert _kinds_on_route(topo, 1, 2) == {"pcie"} and len(topo.route(1, 2)) == 2  # PHB: via cpu0
    assert "upi" in _kinds_on_route(topo, 0, 1)  # SYS
    assert any("GPU model unknown" in w for w in r.warnings)


def test_nvlink_status_sets_per_link_speed_and_names():
    r = probe(ProbeOptions(nvidia_smi=TOPO["hgx-h100"], nvlink_status=FIX / "nvidia-smi-nvlink-status.h100-gpu0.txt"))
    to_sw = {ln.bw_gbps for ln in r.topology.links if ln.dst == "n0.nvswitch"}
    # nvidia-smi prints 26.562 GB/s per NVLink 4 link, the signalling rate; 18 links carry
    # 18 x 25 = 450 GB/s per direction; 18 x 26.562 = 478 would overstate the fabric by 6 %.
    assert len(to_sw) == 1 and to_sw.pop() == pytest.approx(450.0)
    assert any("25 GB/s" in s and "26.562" in s for s in r.topology.sources), r.topology.sources
    assert {d.model for d in r.topology.devices if d.kind is DeviceKind.GPU} == {"H100-SXM5-80GB"}
    assert any("given for 1 of 8 GPUs" in w for w in r.warnings)


# -- nvlink --status and names --------------------------------------------------------------------


def test_parse_nvlink_status_fixtures():
    h = parse_nvlink_status((FIX / "nvidia-smi-nvlink-status.h100-gpu0.txt").read_text())
    assert h.names == {0: "NVIDIA H100 80GB HBM3"} and h.active == {0: 18} and h.per_link_gbps == 25.0
    assert set(h.links[0].values()) == {26.562}  # as printed
    a = parse_nvlink_status((FIX / "nvidia-smi-nvlink-status.a100-sxm4-partial.txt").read_text())
    assert a.names == {0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA A100-SXM4-80GB"}
    assert a.active == {0: 12, 1: 12} and a.per_link_gbps == 25.0 and a.warnings == ()


@pytest.mark.parametrize(("text", "data_rate"), [
    # `nvidia-smi nvlink -s` of a GB200 (NVIDIA/k8s-test-infra#371): 53.125 GB/s per link carries 50
    # (18 links: 900 GB/s per direction, docs/hardware.md 'NVLink 5' row).
    ("GPU 0: NVIDIA GB200 (UUID: GPU-d1b93026-6d5b-03bd-3a71-f85b47a61bde)\n"
     + "".join(f"         Link {k}: 53.125 GB/s\n" for k in range(18)), 50.0),
    # A V100-SXM2-32GB with two links down (Azure/azhpc-diagnostics#73): 25.781 carries 25.
    ("GPU 3: Tesla V100-SXM2-32GB (UUID: ...)\n         Link 0: 25.781 GB/s\n         Link 1: 25.781 GB/s\n"
     "         Link 2: 25.781 GB/s\n         Link 3: <inactive>\n         Link 4: 25.781 GB/s\n"
     "         Link 5: <inactive>\n", 25.0),
])
def test_a_printed_signalling_rate_is_read_as_its_data_rate(text, data_rate):
    assert parse_nvlink_status(text).per_link_gbps == data_rate


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("         Link 0: 25 GB/s\n", "before any GPU"),
        ("GPU 0: NVIDIA A100 (UUID: x)\n\tLink 0: fast\n", "expected 'GPU N"),
        ("GPU 0: NVIDIA A100 (UUID: x)\nGPU 1: NVIDIA A100 (UUID: y)\n\tLink 0: 25 GB/s\n", "no Link lines"),
        ("GPU 0: A (UUID: x)\n Link 0: 25 GB/s\n Link 0: 25 GB/s\n", "twice"),
        ("hello\n", "expected"),
        ("", "no 'GPU N: name'"),
    ],
)
def test_nvlink_status_damage_refused(text, match):
    with pytest.raises(ProbeError, match=match):
        parse_nvlink_status(text, "s.txt")


def test_nvlink_status_truncated_real_file_refused():
    text = (FIX / "nvidia-smi-nvlink-status.a100-sxm4-partial.txt").read_text()
    cut = text[: text.index("GPU 1:") + 20]  # cut inside the GPU 1 line, before its links
    with pytest.raises(ProbeError, match="no Link lines|expected"):
        parse_nvlink_status(cut)


def test_gpu_names_listings():
    status = (FIX / "nvidia-smi-nvlink-status.a100-sxm4-partial.txt").read_text()
    smi_l = "\n".join(ln for ln in status.splitlines() if ln.startswith("GPU"))  # same format as nvidia-smi -L
    assert parse_gpu_names(smi_l) == ("NVIDIA A100-SXM4-80GB",) * 2
    assert parse_gpu_names("name\nNVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n") == ("NVIDIA H100 80GB HBM3",) * 2
    assert parse_gpu_names("0, NVIDIA H100 80GB HBM3\n1, NVIDIA H100 80GB HBM3\n")[1] == "NVIDIA H100 80GB HBM3"
    assert parse_gpu_names("GPU[0]\t\t: Card Series: \t\tAMD Instinct MI300X OAM\n") == ("AMD Instinct MI300X OAM",)
    with pytest.raises(ProbeError, match="not 0..1"):
        parse_gpu_names("GPU 0: A (UUID: x)\nGPU 2: B (UUID: y)\n")
    with pytest.raises(ProbeError, match="cannot read"):
        parse_gpu_names("GPU 0: A (UUID: x)\n%%%: ???\n")


def test_gpu_names_from_nvidia_smi_l_in_mig_mode():
    # nvidia-smi -L lists each MIG instance under its GPU; the GPU lines name the GPUs, and the
    # instance lines are no GPU of their own.
    text = (FIX / "nvidia-smi-L.mig-2xa100.txt").read_text()
    assert parse_gpu_names(text, "mig.txt") == ("NVIDIA A100-SXM4-80GB",) * 2


def test_grace_hopper_is_not_read_as_an_h200():
    # "NVIDIA GH200 480GB" is how nvidia-smi names a GH200 (marin-community/marin, lib/iris
    # CoreWeave notes, "GPU Configs"); "H200" is in its name, but an H200's 141 GB would
    # overstate its memory.
    assert gpu_spec("NVIDIA GH200 480GB") is None
    assert gpu_spec("NVIDIA H200").model == gpu_spec("H200-SXM-141GB").model == "H200-SXM-141GB"


@pytest.mark.parametrize(("printed", "model"), [
    # Names as nvidia-smi and nccl-tests print them: "NVIDIA A10G" is AWS G5's (the device lines of
    # results/published/pytorch-issue-127077-a10g.txt); "GPU 0: NVIDIA L4 (UUID: ...)" and
    # "GPU 0: NVIDIA A40 (UUID: ...)" are how public nvidia-smi -L logs show the others. Each is a
    # row of the GPU table.
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA L4", "L4-24GB"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA GB200", "B200"),
    # A product number counts as a whole word: typos and other parts are not read as the part they contain.
    ("NVIDIA H1000", None),
    ("H100X", None),
    ("NVIDIA B2000", None),
    ("NVIDIA RTX 40900", None),
    ("NVIDIA L40", None),
])
def test_gpu_names_are_read_by_whole_product_numbers(printed, model):
    spec = gpu_spec(printed)
    assert (spec.model if spec else None) == model


def test_unknown_gpu_model_flag_refused():
    with pytest.raises(ProbeError, match="not a known GPU"):
        _probe("dgx1", gpu_model="Voodoo2")
    with pytest.raises(ProbeError, match="names given for 3 GPUs"):
        GpuCatalog(("A100", "H100", "A100"), None).apply(NodeDraft(), 8, "x")


# -- damage -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("topo-m.dgx-a100.truncated-row.txt", r":5: row GPU3 has 5 of 20 matrix cells"),
        ("topo-m.dgx-a100.unknown-code.txt", r":7: row GPU5, column GPU2: unknown code 'NVX'"),
    ],
)
def test_damaged_files_refused_with_line(name, match):
    path = FIX / "damaged" / name
    with pytest.raises(ProbeError, match=match):
        parse_topo_matrix(path.read_text(), path.name)


@pytest.mark.parametrize("key", sorted(TOPO))
def test_every_single_cell_change_is_detected(key):
    """The matrix is symmetric, so any one off-diagonal cell changed to another code is caught."""
    text = TOPO[key].read_text()
    m = parse_topo_matrix(text)
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if "GPU0" in ln.split() and "X" not in ln.split())
    tabbed = "\t" in lines[head]
    n = len(m.columns)
    for r in range(n):
        row = lines[head + 1 + r]
        cells = row.split("\t") if tabbed else row.split()
        for c in range(1, n + 1):
            if cells[c].strip() == "X":
                continue
            old = cells[c].strip()
            new = "SYS" if old != "SYS" else "PIX"
            if cells[0].startswith("GPU") and m.columns[c - 1].startswith("GPU") and old == "SYS":
                new = "NV2"
            damaged_cells = list(cells)
            damaged_cells[c] = new
            damaged = lines[:]
            damaged[head + 1 + r] = ("\t" if tabbed else "  ").join(damaged_cells)
            with pytest.raises(ProbeError, match="not symmetric"):
                parse_topo_matrix("\n".join(damaged), "x.txt")


@pytest.mark.parametrize("key", sorted(TOPO))
def test_truncation_anywhere_is_refused_or_reported(key):
    """Cut the capture at the start and in the middle of every matrix line: either a
    ProbeError naming the file, or a matrix with the right relations and a warning."""
    text = TOPO[key].read_text()
    full = parse_topo_matrix(text)
    lines = text.splitlines(keepends=True)
    head = next(i for i, ln in enumerate(lines) if "GPU0" in ln.split() and "X" not in ln.split())
    for i in range(head, head + 1 + len(full.columns)):
        offset = sum(len(x) for x in lines[:i])
        for cut in (offset, offset + len(lines[i]) // 2):
            try:
                m = parse_topo_matrix(text[:cut], "cut.txt")
            except ProbeError as exc:
                assert str(exc).startswith("cut.txt")
                continue
            assert m.warnings, f"cut at {cut} silently accepted"
            assert all(m.rel[k] == v for k, v in full.rel.items() if k in m.rel)


def test_header_columns_swapped_is_refused():
    text = TOPO["dgx1"].read_text()
    swapped = text.replace("\tGPU1\tGPU2\t", "\tGPU2\tGPU1\t", 1)
    with pytest.raises(ProbeError, match="not GPU0..GPU7 in order"):
        parse_topo_matrix(swapped, "s.txt")
    nic_swap = text.replace("mlx5_0\tmlx5_2", "mlx5_2\tmlx5_0", 1)
    with pytest.raises(ProbeError, match="diagonal|reordered"):
        parse_topo_matrix(nic_swap, "s.txt")


@pytest.mark.parametrize(
    "text",
    ["", "garbage\n\x01\x02 lorem ipsum\n", "GPU0 GPU1\nGPU0 X\n", "GPU0 GPU1\nGPU0 X NV1 fast\n"],
)
def test_garbage_refused(text):
    with pytest.raises(ProbeError):
        parse_topo_matrix(text, "g.txt")


def test_a_matrix_one_space_apart_reads_with_its_missing_row_reported():
    m = parse_topo_matrix("GPU0 GPU1\nGPU0 X NV1\n", "g.txt")
    assert m.rel == {("GPU0", "GPU1"): "NV1", ("GPU1", "GPU0"): "NV1"}
    assert m.warnings == ("g.txt: rows GPU1 missing; relations taken from the other rows; their NUMA affinity is "
                          "unknown",)


def test_missing_nic_row_is_reported():
    text = TOPO["dgx-a100"].read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("mlx5_11\t")]
    m = parse_topo_matrix("\n".join(lines), "m.txt")
    assert any("rows mlx5_11 missing" in w for w in m.warnings)
    assert m.rel[("mlx5_11", "mlx5_10")] == "PIX"
    lines = [ln for ln in lines if not ln.startswith("mlx5_10\t")]
    with pytest.raises(ProbeError, match="no row gives the relation mlx5_10-mlx5_11"):
        parse_topo_matrix("\n".join(lines), "m.txt")


def test_rocm_smi_output_given_as_nvidia_smi_is_named():
    from treeattn.errors import ProbeError

    text = (FIX / "rocm-smi-showtopo.8x-mi308x.txt").read_text()
    with pytest.raises(ProbeError, match="rocm-smi output, not `nvidia-smi topo -m`: give it with --from-rocm-smi"):
        parse_topo_matrix(text, "x.txt")
