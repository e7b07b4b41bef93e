"""Live discovery: sysfs on a fake tree, vendor tools through a fake runner, the CPU fallback,
and replication into several nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from treeattn.errors import ProbeError
from treeattn.probe import Fabric, ProbeOptions, cpu_host, probe
from treeattn.probe.discover import parse_nics
from treeattn.probe.sysfs import sysfs_to_draft
from treeattn.topology.model import DeviceKind, LinkKind

FIX = Path(__file__).parents[1] / "fixtures" / "probe"


def _dev(root: Path, path: str, cls: str, vendor: str = "0x8086", device: str = "0x0000", numa: int = 0,
         speed: str = "16.0 GT/s PCIe", width: int = 16) -> Path:
    """A PCI device at sys/devices/<path> with its sys/bus/pci/devices link."""
    d = root / "sys" / "devices" / path
    d.mkdir(parents=True, exist_ok=True)
    for name, value in (("class", cls), ("vendor", vendor), ("device", device), ("numa_node", str(numa)),
                        ("current_link_speed", speed), ("current_link_width", str(width))):
        (d / name).write_text(value + "\n")
    bus = root / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    link = bus / d.name
    if not link.exists():
        link.symlink_to(os.path.relpath(d, bus))
    return d


def _fake_host(root: Path, *, amd_cpu: bool = False) -> None:
    """Two sockets. Socket 0: a Gen4 switch (root port -> upstream -> 2 downstream ports) with
    two H100s and an HDR NIC; socket 1: one H100 behind an x8 root port, and a plain 1 GbE NIC."""
    r0 = "pci0000:00/0000:00:01.0"
    _dev(root, r0, "0x060400")
    _dev(root, f"{r0}/0000:01:00.0", "0x060400")  # switch upstream port
    for port, end in (("0000:02:00.0", "0000:03:00.0"), ("0000:02:01.0", "0000:04:00.0")):
        _dev(root, f"{r0}/0000:01:00.0/{port}", "0x060400")
        _dev(root, f"{r0}/0000:01:00.0/{port}/{end}", "0x030200", "0x10de", "0x2330")
    _dev(root, f"{r0}/0000:01:00.0/0000:02:02.0", "0x060400")
    nic = _dev(root, f"{r0}/0000:01:00.0/0000:02:02.0/0000:05:00.0", "0x020700", "0x15b3", "0x101b")
    r1 = "pci0000:80/0000:80:01.0"
    _dev(root, r1, "0x060400", numa=1, width=8)
    _dev(root, f"{r1}/0000:81:00.0", "0x030200", "0x10de", "0x2330", numa=1)
    eth = _dev(root, "pci0000:80/0000:80:02.0", "0x020000", numa=1, speed="8.0 GT/s PCIe", width=4)
    ib = root / "sys" / "class" / "infiniband" / "mlx5_0"
    (ib / "ports" / "1").mkdir(parents=True)
    (ib / "device").symlink_to(os.path.relpath(nic, ib))
    (ib / "ports" / "1" / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (ib / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    (ib / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
    net = root / "sys" / "class" / "net" / "eno1"
    net.mkdir(parents=True)
    (net / "device").symlink_to(os.path.relpath(eth, net))
    (net / "speed").write_text("1000\n")
    for n, cpus in ((0, "0-15"), (1, "16-31")):
        node = root / "sys" / "devices" / "system" / "node" / f"node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus + "\n")
    (root / "proc").mkdir()
    vendor = "AuthenticAMD" if amd_cpu else "GenuineIntel"
    (root / "proc" / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nmodel\t\t: 143\n")


def test_sysfs_fake_tree(tmp_path):
    _fake_host(tmp_path)
    d = sysfs_to_draft(tmp_path)
    assert d.gpus == ["gpu0", "gpu1", "gpu2"]
    assert {d.devices[g].model for g in d.gpus} == {"H100-SXM5-80GB"}
    assert list(d.nics) == ["mlx5_0"]  # eno1 dropped: an RDMA NIC exists
    assert d.nics["mlx5_0"].rate_gbps == 200 and d.nics["mlx5_0"].state == "Active"
    assert d.nics["mlx5_0"].link_layer == "InfiniBand"
    sw = [n for n, dv in d.devices.items() if dv.kind is DeviceKind.PCIE_SWITCH]
    assert sw == ["pcie0"]  # the switch upstream port, where three paths part
    assert d.links[("gpu0", "pcie0")].bw_gbps == 25.0  # Gen4 x16
    assert d.links[("pcie0", "cpu0")].kind is LinkKind.PCIE
    assert d.links[("gpu2", "cpu1")].bw_gbps == 12.5  # behind the x8 root port: slowest link on the chain
    assert d.links[("cpu0", "cpu1")].kind is LinkKind.UPI and d.links[("cpu0", "cpu1")].bw_gbps == 22.0
    assert any("NVLink/xGMI wiring is not visible" in w for w in d.warnings)
    assert any("eno1" in a for a in d.assumptions)


def test_sysfs_probe_end_to_end_and_amd_socket(tmp_path):
    _fake_host(tmp_path, amd_cpu=True)
    r = probe(ProbeOptions(root=tmp_path, nodes=2), runner=lambda cmd: None)
    assert r.source == "live: sysfs"
    topo = r.topology
    assert topo.num_ranks == 6
    assert {ln.kind for ln in topo.links if ln.src == "n0.cpu0" and ln.dst == "n0.cpu1"} == {LinkKind.INFINITY_FABRIC}
    assert {d.nic for d in topo.devices if d.kind is DeviceKind.GPU} == {"n0.mlx5_0", "n1.mlx5_0"}


def test_sysfs_without_gpu_falls_back_to_cpu_host(tmp_path):
    _dev(tmp_path, "pci0000:00/0000:00:02.0", "0x030000", "0x1a03")  # a BMC's VGA, not a GPU
    r = probe(ProbeOptions(root=tmp_path, ranks=3), runner=lambda cmd: None)
    topo = r.topology
    assert topo.num_ranks == 3 and [d.kind for d in topo.devices] == [DeviceKind.HOST]
    assert topo.links[0].kind is LinkKind.LOOPBACK
    assert "CPU-only loopback host" in topo.description and "built-in profile" in topo.description
    assert r.warnings and "no GPU" in r.warnings[0]


def test_cpu_host_defaults_and_limits():
    r = cpu_host(None)
    assert r.topology.num_ranks == (os.cpu_count() or 1)
    assert r.assumptions == (f"{os.cpu_count() or 1} ranks (the CPU count; --ranks sets it)",)
    assert cpu_host(3).assumptions == ("3 ranks (--ranks)",)  # given: not said to be the default
    with pytest.raises(ProbeError, match="CPU-only host is probed as one node"):
        cpu_host(2, nodes=2)


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_live_tools_through_runner_match_saved_files(tmp_path, vendor):
    # The live probe reads the CPU vendor from <root>/proc/cpuinfo: a fake root, never the host's.
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n")
    outputs = {
        ("nvidia-smi", "topo", "-m"): (FIX / "nvidia-smi-topo-m.hgx-h100-della.txt").read_text(),
        ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader"): "NVIDIA H100 80GB HBM3\n" * 8,
        ("ibstat",): (FIX / "ibstat.cx6-hdr100-single.txt").read_text(),
    }
    calls: list[tuple[str, ...]] = []

    def runner(cmd: list[str]) -> str | None:
        calls.append(tuple(cmd))
        return outputs.get(tuple(cmd))

    live = probe(ProbeOptions(name="x", root=tmp_path), runner=runner)
    saved = probe(ProbeOptions(nvidia_smi=FIX / "nvidia-smi-topo-m.hgx-h100-della.txt", gpu_model="H100-SXM5-80GB",
                               ibstat=FIX / "ibstat.cx6-hdr100-single.txt", name="x", cpu_vendor=vendor))
    assert live.source == "live: nvidia-smi topo -m"
    assert live.topology.fingerprint == saved.topology.fingerprint
    assert ("nvidia-smi", "nvlink", "--status") in calls and ("ibstat",) in calls


def test_live_rocm_when_no_nvidia():
    rocm = (FIX / "rocm-smi-showtopo.8x-mi308x.txt").read_text()
    r = probe(ProbeOptions(gpu_model="MI300X"), runner=lambda cmd: rocm if cmd[0] == "rocm-smi" else None)
    assert r.source == "live: rocm-smi --showtopo" and r.topology.num_ranks == 8
    with pytest.raises(ProbeError, match="--gpu-model H100-SXM5-80GB is an NVIDIA GPU, but the input lists AMD"):
        probe(ProbeOptions(gpu_model="H100-SXM5-80GB"), runner=lambda cmd: rocm if cmd[0] == "rocm-smi" else None)


def test_live_damaged_tool_output_is_an_error_not_a_guess():
    r = (FIX / "damaged" / "topo-m.dgx-a100.unknown-code.txt").read_text()
    with pytest.raises(ProbeError, match="live nvidia-smi topo -m:7: row GPU5"):
        probe(ProbeOptions(), runner=lambda cmd: r if cmd[1:] == ["topo", "-m"] else None)


# -- nodes, NICs, fabric ----------------------------------------------------------------------------


def test_nodes_rail_fabric_routes_through_own_nic():
    r = probe(ProbeOptions(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx-a100.txt", gpu_model="A100-SXM4-80GB",
                           nodes=4, nic_gbps=200))
    topo = r.topology
    assert topo.num_ranks == 32
    switches = [d for d in topo.devices if d.kind is DeviceKind.SWITCH]
    assert sorted(d.name for d in switches) == [f"rail{i}" for i in range(8)] + ["spine0"]
    assert all(d.node == -1 for d in switches)
    route = [topo.links[i] for i in topo.route(3, 8 + 3)]  # GPU3 of node 0 -> GPU3 of node 1: one rail
    names = [ln.dst for ln in route]
    assert "n0.mlx5_3" in names and "rail3" in names and "spine0" not in names and names[-1] == "n1.gpu3"
    cross = [topo.links[i].dst for i in topo.route(0, 8 + 1)]  # different rails: through the spine
    assert "spine0" in cross
    assert {d.node for d in topo.devices if d.kind is DeviceKind.GPU} == {0, 1, 2, 3}


def test_single_fabric_and_nics_flag():
    r = probe(ProbeOptions(nvidia_smi=FIX / "nvidia-smi-topo-m.pcie-5gpu-2numa.club3090-46.txt",
                           nics="2x100", nodes=2, fabric=Fabric.SINGLE))
    topo = r.topology
    assert sum(d.kind is DeviceKind.NIC for d in topo.devices) == 4
    assert [d.name for d in topo.devices if d.kind is DeviceKind.SWITCH] == ["leaf0"]
    assert any("from --nics" in a for a in r.assumptions)
    assert topo.route_bw_gbps(0, 5) == 12.5  # 100 Gb/s


def test_nics_flag_parsing_and_conflicts():
    assert parse_nics("8x400") == (8, 400.0) and parse_nics("4") == (4, None) and parse_nics("2X200Gbps") == (2, 200)
    for bad in ("", "x400", "0x400", "eight", "2x" + "9" * 400):  # the last is inf as a float
        with pytest.raises(ProbeError, match="--nics"):
            parse_nics(bad)
    r = probe(ProbeOptions(nvidia_smi=FIX / "nvidia-smi-topo-m.della-2xa100-pcie.txt", nics="8x200", nodes=2))
    assert any("--nics 8 ignored: the input shows 2 NICs" in w for w in r.warnings)


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", rocm_smi=FIX / "rocm-smi-showtopo.8x-mi308x.txt"),
         "only one of"),
        (dict(nvlink_status=FIX / "nvidia-smi-nvlink-status.h100-gpu0.txt"), "needs --from-nvidia-smi"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", nodes=2), "line rate of NIC mlx5_0 is unknown; pass "
         "--nic-gbps"),
        # ibstat given, without the NIC: not told to pass --ibstat again
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.hgx-h100-della.txt", nodes=2,
              ibstat=FIX / "ibstat.cx6-hdr200-partial.nccl-tests-128.txt"),
         r"line rate of NIC mlx5_2 is unknown: ibstat.cx6-hdr200-partial.nccl-tests-128.txt has no port for it"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.pcie-5gpu-2numa.club3090-46.txt", nodes=2), "needs NICs"),
        (dict(nvidia_smi=FIX / "missing.txt"), "cannot read nvidia-smi topo -m file"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", nic_gbps=-1),
         "--nic-gbps must be a finite number > 0"),
        # nan passes every comparison and inf would be written as .inf, which no reader takes
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", nodes=2, nic_gbps=float("nan")),
         r"--nic-gbps must be a finite number > 0, got nan"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", nodes=2, nic_gbps=float("inf")),
         r"--nic-gbps must be a finite number > 0, got inf"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", cpu_vendor="arm"), "--cpu-vendor 'arm'"),
        # a GPU of the other vendor than the tool that listed them: NVSwitch MI300Xs, xGMI H100s
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.hgx-h100-della.txt", gpu_model="MI300X"),
         "--gpu-model MI300X is an AMD GPU, but the input lists NVIDIA GPUs"),
        (dict(rocm_smi=FIX / "rocm-smi-showtopo.8x-mi308x.txt", gpu_model="H100-SXM5-80GB"),
         "--gpu-model H100-SXM5-80GB is an NVIDIA GPU, but the input lists AMD GPUs"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", name=""), "--name '': give the topology a name"),
        (dict(nvidia_smi=FIX / "nvidia-smi-topo-m.dgx1-v100.txt", name=" "), "--name ' ': give the topology a name"),
    ],
)
def test_bad_option_combinations(opts, match):
    with pytest.raises(ProbeError, match=match):
        probe(ProbeOptions(**opts), runner=lambda cmd: None)


def test_binary_input_refused(tmp_path):
    p = tmp_path / "b.txt"
    p.write_bytes(b"\x00\x01\x02garbage")
    with pytest.raises(ProbeError, match="binary data"):
        probe(ProbeOptions(nvidia_smi=p))
