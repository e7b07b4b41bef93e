"""rocm-smi --showtopo, NCCL topology XML and ibstat, on every real capture and damaged copies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from treeattn.errors import ProbeError
from treeattn.probe import ProbeOptions, probe
from treeattn.probe.ibstat import parse_ibstat
from treeattn.probe.nccl_xml import parse_nccl_xml
from treeattn.probe.rocm_smi import parse_rocm_showtopo
from treeattn.topology.model import DeviceKind, LinkKind

FIX = Path(__file__).parents[1] / "fixtures" / "probe"
ROCM = FIX / "rocm-smi-showtopo.8x-mi308x.txt"
IBM = FIX / "nccl-topo.ibm-gx3d-8xh100.xml"
NDV4 = FIX / "nccl-topo.azure-ndv4-a100.xml"
NDV5 = FIX / "nccl-topo.azure-ndv5-h100.xml"
OCI = FIX / "nccl-topo.oci-bm-gpu4.8-a100.xml"
IB200 = FIX / "ibstat.cx6-hdr200-partial.nccl-tests-128.txt"
IB100 = FIX / "ibstat.cx6-hdr100-single.txt"


# -- rocm-smi -----------------------------------------------------------------------------------


def test_rocm_matrices():
    t = parse_rocm_showtopo(ROCM.read_text())
    assert t.gpus == 8
    assert set(t.link_type.values()) == {"XGMI"} and len(t.link_type) == 56
    assert set(t.hops.values()) == {1} and set(t.weight.values()) == {15}
    assert t.numa == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_rocm_topology_full_xgmi_mesh():
    r = probe(ProbeOptions(rocm_smi=ROCM, gpu_model="MI308X"))
    topo = r.topology
    xgmi = [ln for ln in topo.links if ln.kind is LinkKind.XGMI]
    assert len(xgmi) == 2 * 28 and {ln.bw_gbps for ln in xgmi} == {64.0}
    assert all(topo.route_bw_gbps(a, b) == 64.0 for a in range(8) for b in range(8) if a != b)
    assert sorted(d.name for d in topo.devices if d.kind is DeviceKind.CPU) == ["n0.cpu0", "n0.cpu1"]
    cpu_of = {ln.src: ln.dst for ln in topo.links if ln.kind is LinkKind.PCIE}
    assert [cpu_of[f"n0.gpu{g}"] for g in range(8)] == ["n0.cpu0"] * 4 + ["n0.cpu1"] * 4
    assert any("RCCL models 48" in s for s in topo.sources)


def test_rocm_with_ibstat_and_two_nodes():
    r = probe(ProbeOptions(rocm_smi=ROCM, gpu_model="MI308X", ibstat=IB200, nodes=2))
    topo = r.topology
    assert topo.num_ranks == 16
    assert any("not Active" in w and "mlx5_1" in w for w in r.warnings)
    assert any("placement unknown" in a for a in r.assumptions)
    nics = {d.nic for d in topo.devices if d.kind is DeviceKind.GPU}
    assert nics == {"n0.mlx5_0", "n1.mlx5_0"}  # the Down port carries nothing
    route = topo.route_links(0, 8)
    assert {ln.kind for ln in route} >= {LinkKind.INFINIBAND} and min(ln.bw_gbps for ln in route) == 25.0


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda t: t.replace("XGMI", "NVLINK"), r":\d+: GPU0-GPU1: unknown link type 'NVLINK'"),
        (lambda t: t.replace("XGMI", "NVLINK", 1), "GPU0-GPU1 is NVLINK but GPU1-GPU0 is XGMI"),
        (lambda t: t[: t.index("GPU5   XGMI")], "rows for 8 GPUs|truncated"),
        (lambda t: t.replace("Link Type between two GPUs", "Something else"), "no 'Link Type"),
        (lambda t: t.replace("GPU3   15           15           15           0", "GPU3   15 15 0", 1),
         "r.txt:9: .* row GPU3 has 7 cells, expected 8"),
        (lambda t: t.replace("GPU[2]          : (Topology) Numa Node: 0", "GPU[2] : Numa Node zero"),
         "unreadable NUMA"),
        (lambda t: "garbage\n", "no 'Link Type"),
    ],
)
def test_rocm_damage_refused(mutate, match):
    with pytest.raises(ProbeError, match=match):
        parse_rocm_showtopo(mutate(ROCM.read_text()), "r.txt")


def test_rocm_damaged_file_refused():
    path = FIX / "damaged" / "rocm-smi-showtopo.asymmetric.txt"
    with pytest.raises(ProbeError, match=r"asymmetric.txt:\d+: Link Type between two GPUs: GPU0-GPU1"):
        parse_rocm_showtopo(path.read_text(), path.name)


def test_rocm_missing_numa_is_reported():
    text = ROCM.read_text().replace("GPU[7]          : (Topology) Numa Node: 1\n", "")
    t = parse_rocm_showtopo(text, "r.txt")
    assert any("NUMA node missing for GPU(s) [7]" in w for w in t.warnings)


# -- NCCL XML ----------------------------------------------------------------------------------------


def test_ibm_dump():
    r = probe(ProbeOptions(nccl_xml=IBM))
    topo = r.topology
    gpus = [d for d in topo.devices if d.kind is DeviceKind.GPU]
    assert len(gpus) == 8 and {d.model for d in gpus} == {"H100-SXM5-80GB"}  # PCI id 0x10de:0x2330
    to_sw = [ln for ln in topo.links if ln.dst == "n0.nvswitch"]
    assert len(to_sw) == 8 and {(ln.count, ln.bw_gbps) for ln in to_sw} == {(18, 450.0)}  # 5+5+4+4 per GPU
    nics = [d.name for d in topo.devices if d.kind is DeviceKind.NIC]
    assert sorted(nics) == [f"n0.mlx5_{i}" for i in range(8)]
    assert gpus[0].nic == "n0.mlx5_7"  # the NIC under GPU0's bridge
    assert any("virtualised PCI" in w for w in r.warnings)
    assert any("width 0" in a for a in r.assumptions)
    upi = {ln.bw_gbps for ln in topo.links if ln.kind is LinkKind.UPI}
    assert upi == {22.0}  # GenuineIntel model 143: Sapphire Rapids


def test_a_link_width_no_pcie_link_has_is_refused_where_read(tmp_path):
    # probe wrote it, and the file it wrote was then refused on every load
    bad = tmp_path / "bad.xml"
    bad.write_text(IBM.read_text().replace('link_width="1"', 'link_width="17"', 1))
    line = next(i for i, ln in enumerate(bad.read_text().splitlines(), 1) if 'link_width="17"' in ln)
    with pytest.raises(ProbeError, match=f":{line}: <pci> link_width='17' is no PCIe link width "
                                         r"\(1, 2, 4, 8, 12, 16, 32\)"):
        probe(ProbeOptions(nccl_xml=bad))


def test_ibm_dump_two_nodes_is_roce_at_200():
    topo = probe(ProbeOptions(nccl_xml=IBM, nodes=2)).topology
    net = [ln for ln in topo.links if ln.src.startswith("n0.mlx5")]
    assert {ln.kind for ln in net if ln.dst.startswith("rail")} == {LinkKind.ROCE}
    assert {ln.bw_gbps for ln in net if ln.dst.startswith("rail")} == {25.0}
    assert sum(d.kind is DeviceKind.SWITCH for d in topo.devices) == 9  # 8 rails + spine


@pytest.mark.parametrize(("path", "cpus", "socket"), [(NDV4, 4, LinkKind.INFINITY_FABRIC), (NDV5, 2, LinkKind.UPI)])
def test_azure_handwritten_files(path, cpus, socket):
    r = probe(ProbeOptions(nccl_xml=path, gpu_model="A100-SXM4-80GB" if path is NDV4 else "H100-SXM5-80GB"))
    topo = r.topology
    assert topo.num_ranks == 8
    assert sum(d.kind is DeviceKind.CPU for d in topo.devices) == cpus
    assert sum(d.kind is DeviceKind.NIC for d in topo.devices) == 8
    assert not any(ln.kind is LinkKind.NVLINK for ln in topo.links)
    assert any("no <gpu> elements" in w for w in r.warnings)  # NVLink unknown: said, not invented
    assert {ln.kind for ln in topo.links if ln.src.startswith("n0.cpu") and ln.dst.startswith("n0.cpu")} == {socket}
    # Each GPU shares its bridge with one NIC.
    gpus = [d for d in topo.devices if d.kind is DeviceKind.GPU]
    assert len({d.nic for d in gpus}) == 8
    for g in gpus:
        assert len(topo._index.device_route(g.name, g.nic)) == 2


def test_azure_two_nodes_need_a_nic_rate():
    with pytest.raises(ProbeError, match="--nic-gbps"):
        probe(ProbeOptions(nccl_xml=NDV5, nodes=2))
    topo = probe(ProbeOptions(nccl_xml=NDV5, nodes=2, nic_gbps=400)).topology
    assert {ln.kind for ln in topo.links if ln.dst.startswith("rail")} == {LinkKind.INFINIBAND}  # class 0x0207


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda t: t.replace('class="0x030200"', 'class="zz"', 1), r":\d+: <pci> class='zz' is not a hex"),
        (lambda t: t.replace(' count="5"', ' count="five"', 1), r":\d+: <nvlink> needs a target and a count"),
        (lambda t: t.replace("<system", "<sistem").replace("</system", "</sistem"), "root element must be <system>"),
        (lambda t: '<!DOCTYPE x [<!ENTITY a "b">]>' + t, "DOCTYPE"),
        (lambda t: t[: len(t) // 2], "malformed XML"),
        (lambda t: t.replace('speed="200000"', 'speed="fast"', 1), "is not a number"),
        (lambda t: "garbage", "malformed XML"),
        (lambda t: t.replace('busid="0000:a4:00.0" ', "", 1), "<pci> without busid"),
    ],
)
def test_xml_damage_refused(mutate, match, tmp_path):
    p = tmp_path / "d.xml"
    p.write_text(mutate(IBM.read_text()))
    with pytest.raises(ProbeError, match=match):
        probe(ProbeOptions(nccl_xml=p))


def test_xml_damaged_file_reports_line():
    path = FIX / "damaged" / "nccl-topo.ibm-gx3d.unclosed.xml"
    with pytest.raises(ProbeError, match=r"nccl-topo.ibm-gx3d.unclosed.xml:\d+: malformed XML: mismatched tag"):
        parse_nccl_xml(path.read_text(), path.name)


def test_xml_nvlink_to_unknown_target_is_reported(tmp_path):
    p = tmp_path / "x.xml"
    p.write_text(IBM.read_text().replace('tclass="0x068000"', 'tclass="0x060000"', 1))
    r = probe(ProbeOptions(nccl_xml=p))
    assert any("neither a GPU nor an NVSwitch" in w for w in r.warnings)


# -- ibstat --------------------------------------------------------------------------------------------


def test_ibstat_fixtures():
    two = parse_ibstat(IB200.read_text())
    assert [a.name for a in two] == ["mlx5_0", "mlx5_1"]
    assert two[0].ca_type == "MT4123" and two[0].info().rate_gbps == 200 and two[0].info().state == "Active"
    assert two[0].info().link_layer == "InfiniBand"
    assert two[1].info().state == "Down" and two[1].active == ()
    one = parse_ibstat(IB100.read_text())
    assert len(one) == 1 and one[0].ports[0].rate_gbps == 100


def test_ibstat_sets_nic_rates_by_name():
    topo_m = FIX / "nvidia-smi-topo-m.della-2xa100-pcie.txt"
    r = probe(ProbeOptions(nvidia_smi=topo_m, ibstat=IB200, nodes=2))
    gpus = [d for d in r.topology.devices if d.kind is DeviceKind.GPU and d.node == 0]
    # mlx5_1 is Down: GPU1 falls back to mlx5_0, across the socket link; both warned about.
    assert [d.nic for d in gpus] == ["n0.mlx5_0", "n0.mlx5_0"]
    assert any("not Active" in w for w in r.warnings)
    rails = [ln for ln in r.topology.links if ln.dst.startswith("leaf") or ln.dst.startswith("rail")]
    assert {ln.bw_gbps for ln in rails} == {25.0}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("\tCA type: MT4123\n", "before any"),
        ("CA 'mlx5_0'\n\tCA type: MT4123\n", "no 'Port N:' block"),
        ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: fast\n\t\tLink layer: InfiniBand\n", "not a number"),
        ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: 100\n\t\tLink layer: Token Ring\n", "unknown link"),
        ("CA 'mlx5_0'\n\tPort 1:\n\t\t!!!\n", "expected 'Key: value'"),
        ("", "no \"CA 'name'\" block"),
    ],
)
def test_ibstat_damage_refused(text, match):
    with pytest.raises(ProbeError, match=match):
        parse_ibstat(text, "i.txt")


def test_ibstat_damaged_file_refused():
    path = FIX / "damaged" / "ibstat.truncated.txt"
    with pytest.raises(ProbeError, match=r"ibstat.truncated.txt:\d+: CA 'mlx5_1' port 1: no 'Rate' line"):
        parse_ibstat(path.read_text(), path.name)


def test_ibstat_truncated_anywhere_refused_or_shorter():
    text = IB200.read_text()
    full = parse_ibstat(text)
    lines = text.splitlines(keepends=True)
    for i in range(1, len(lines)):
        try:
            got = parse_ibstat("".join(lines[:i]), "cut.txt")
        except ProbeError:
            continue
        # Accepted only when whole CA blocks remain, each complete.
        assert got == full[: len(got)]


def test_the_ports_of_one_nic_are_one_device_at_their_summed_rate():
    # OCI's BM.GPU4.8 file: each GPU's PCIe switch holds one dual-port 100 Gb/s NIC (two <net> of
    # one GUID), which NCCL 2.20.3+ merges into one 200 Gb/s device; read port by port, each GPU
    # got one 100 Gb/s port and the other eight were called storage NICs.
    r = probe(ProbeOptions(nccl_xml=OCI, nodes=2))
    topo = r.topology
    nics = sorted(d.name for d in topo.devices if d.kind is DeviceKind.NIC and d.node == 0)
    assert len(nics) == 8 and "n0.mlx5_18+mlx5_19" in nics
    gpus = [d for d in topo.devices if d.kind is DeviceKind.GPU and d.node == 0]
    assert sorted(g.nic for g in gpus) == nics
    up = {ln.bw_gbps for ln in topo.links if ln.src in nics and ln.dst.startswith("rail")}
    assert up == {25.0}  # 200 Gb/s a NIC
    assert any("NCCL_IB_MERGE_NICS" in a and "mlx5_18+mlx5_19" in a for a in r.assumptions)
    assert not any("nearest to no GPU" in a for a in r.assumptions)
    assert "8 NICs at 200 Gb/s" in topo.description


def test_ports_of_different_guids_stay_apart(tmp_path):
    two = tmp_path / "two.xml"
    lines = OCI.read_text().splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if 'name="mlx5_19"' in ln)
    lines[i] = lines[i].replace('guid="0x4052c70003a1420c"', 'guid="0x4052c70003a1420d"')
    assert 'a1420d"' in lines[i]
    two.write_text("".join(lines))
    r = probe(ProbeOptions(nccl_xml=two))
    names = {d.name for d in r.topology.devices if d.kind is DeviceKind.NIC}
    assert {"n0.mlx5_18", "n0.mlx5_19"} <= names and "n0.mlx5_18+mlx5_19" not in names


def _oci_ibstat(down: str = "") -> str:
    """ibstat of OCI's 16 ports, each block the real CX-6 one with its name (and, for ``down``,
    its state) changed: the shape's own ibstat is not published."""
    block = IB100.read_text()
    names = [f"mlx5_{i}" for i in range(18, 34)]
    out = []
    for n in names:
        text = block.replace("CA 'mlx5_0'", f"CA '{n}'").replace("Link layer: InfiniBand", "Link layer: Ethernet")
        if n == down:
            text = text.replace("State: Active", "State: Down")
        out.append(text)
    return "".join(out)


def test_ibstat_gives_a_merged_nic_its_ports_summed(tmp_path):
    # NCCL_TOPO dumps and OCI's file merge an adapter's ports (mlx5_18+mlx5_19); ibstat lists
    # each port: the device takes their Active ports' sum, and no port is reported unmatched.
    ib = tmp_path / "ibstat.txt"
    ib.write_text(_oci_ibstat())
    r = probe(ProbeOptions(nccl_xml=OCI, ibstat=ib, nodes=2))
    assert not any("not in the topology output" in w or "has no data" in w for w in r.warnings), r.warnings
    rails = [ln for ln in r.topology.links if ln.src.startswith("n0.mlx5") and ln.dst.startswith("rail")]
    assert {ln.kind for ln in rails} == {LinkKind.ROCE} and {ln.bw_gbps for ln in rails} == {25.0}
    ib.write_text(_oci_ibstat(down="mlx5_19"))  # one port of the first adapter down: NCCL merges the other
    rails = {ln.src: ln.bw_gbps for ln in probe(ProbeOptions(nccl_xml=OCI, ibstat=ib, nodes=2)).topology.links
             if ln.src.startswith("n0.mlx5") and ln.dst.startswith("rail")}
    assert rails["n0.mlx5_18+mlx5_19"] == 12.5 and rails["n0.mlx5_26+mlx5_27"] == 25.0


def test_nic_gbps_is_a_ports_rate(tmp_path):
    bare = tmp_path / "bare.xml"
    bare.write_text(re.sub(r' speed="\d+"', "", OCI.read_text()))
    rails = {ln.bw_gbps for ln in probe(ProbeOptions(nccl_xml=bare, nodes=2, nic_gbps=100)).topology.links
             if ln.src.startswith("n0.mlx5") and ln.dst.startswith("rail")}
    assert rails == {25.0}  # two 100 Gb/s ports


@pytest.mark.parametrize("strip", ['guid="0x4052c70003a1420c"', None])
def test_ports_without_a_guid_or_under_a_cpu_stay_apart(tmp_path, strip):
    text = OCI.read_text()
    if strip:  # both ports of the first adapter lose their GUID
        text = text.replace(f" {strip}", "")
    else:  # two Ethernet ports in a <nic> directly under a CPU, as NCCL collects devices of no adapter
        first_cpu_end = text.index(">", text.index("<cpu")) + 1
        text = (text[:first_cpu_end] + '\n<nic><net name="eth0" speed="100000" guid="0x1"/>'
                '<net name="eth1" speed="100000" guid="0x1"/></nic>' + text[first_cpu_end:])
    f = tmp_path / "t.xml"
    f.write_text(text)
    names = {d.name for d in probe(ProbeOptions(nccl_xml=f)).topology.devices if d.kind is DeviceKind.NIC}
    pair = {"n0.mlx5_18", "n0.mlx5_19"} if strip else {"n0.eth0", "n0.eth1"}
    assert pair <= names


def _oci_as_nccl_dumps_it(path: Path, speeds: bool = True) -> Path:
    """OCI's file in the form NCCL 2.20+ writes a merged device: one <net name="a+b"> at the
    summed speed (net_ib.cc's mergedDev name and speed, written by ncclTopoFillNet)."""
    text = OCI.read_text()
    text = re.sub(r'<net name="(mlx5_\d+)" dev="\d+" speed="(\d+)"([^>]*)/>\s*<net name="(mlx5_\d+)"[^>]*/>',
                  lambda m: f'<net name="{m.group(1)}+{m.group(4)}" speed="{2 * int(m.group(2))}"{m.group(3)}/>',
                  text)
    if not speeds:
        text = re.sub(r' speed="\d+"', "", text)
    path.write_text(text)
    return path


def test_a_dumped_merged_device_takes_ibstat_and_nic_gbps_by_its_ports(tmp_path):
    dump = _oci_as_nccl_dumps_it(tmp_path / "dump.xml")
    assert 'name="mlx5_18+mlx5_19" speed="200000"' in dump.read_text()
    ib = tmp_path / "ibstat.txt"
    ib.write_text(_oci_ibstat())
    r = probe(ProbeOptions(nccl_xml=dump, ibstat=ib, nodes=2))
    assert not any("not in the topology output" in w or "has no data" in w for w in r.warnings), r.warnings
    bare = _oci_as_nccl_dumps_it(tmp_path / "bare.xml", speeds=False)
    for opts in (ProbeOptions(nccl_xml=bare, nodes=2, nic_gbps=100), ProbeOptions(nccl_xml=bare, nodes=2, nics="8x100"),
                 ProbeOptions(nccl_xml=bare, nodes=2, ibstat=ib)):
        rails = {ln.bw_gbps for ln in probe(opts).topology.links
                 if ln.src.startswith("n0.mlx5") and ln.dst.startswith("rail")}
        assert rails == {25.0}, opts  # two 100 Gb/s ports a device, however the rate is given


def test_ibstat_listing_some_ports_of_a_merged_device_counts_those(tmp_path):
    ib = tmp_path / "ibstat.txt"
    ib.write_text(_oci_ibstat().replace("CA 'mlx5_19'", "CA 'mlx5_99'"))
    r = probe(ProbeOptions(nccl_xml=OCI, ibstat=ib, nodes=2))
    assert any("lists only some ports of mlx5_18+mlx5_19 (no mlx5_19)" in w for w in r.warnings), r.warnings
    assert any("lists mlx5_99, not in the topology output" in w for w in r.warnings)  # mlx5_18 is not said unused
    rails = {ln.src: ln.bw_gbps for ln in r.topology.links
             if ln.src.startswith("n0.mlx5") and ln.dst.startswith("rail")}
    assert rails["n0.mlx5_18+mlx5_19"] == 12.5
