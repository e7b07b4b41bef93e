"""``treeattn probe`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.probe.hardware import GPU_SPECS
from treeattn.probe.sysfs import scan_pci
from treeattn.topology.io import load_topology
from treeattn.topology.schema import ONE_LINE

FIX = Path(__file__).parents[1] / "fixtures" / "probe"
DGX = str(FIX / "nvidia-smi-topo-m.dgx-a100.txt")
TREEATTN = str(Path(sys.executable).with_name("treeattn"))


def test_json_structure_and_determinism():
    args = ("probe", "--from-nvidia-smi", DGX, "--gpu-model", "A100-SXM4-80GB", "--json")
    a, b = run_cli(*args), run_cli(*args)
    assert a.exit_code == 0, a.stderr
    assert a.stdout == b.stdout
    data = json.loads(a.stdout)
    assert sorted(data) == ["assumptions", "source", "topology", "warnings"]
    assert data["source"] == "nvidia-smi topo -m (nvidia-smi-topo-m.dgx-a100.txt)"
    topo = data["topology"]
    assert len(topo["ranks"]) == 8 and {"devices", "links", "name", "description"} <= set(topo)
    assert any("mlx5_4" in w for w in data["warnings"])


def test_out_writes_yaml_that_loads_back(tmp_path):
    out = tmp_path / "probed.yaml"
    res = run_cli("probe", "--from-nccl-xml", str(FIX / "nccl-topo.ibm-gx3d-8xh100.xml"), "--nodes", "2",
                  "--out", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    shown = json.loads(res.stdout)["topology"]
    loaded = load_topology(out)
    assert loaded.to_dict() == shown
    assert loaded.num_ranks == 16 and loaded.name == "probed-nccl-topo.ibm-gx3d-8xh100-x2"


def test_summary_prints_warnings_and_assumptions():
    res = run_cli("probe", "--from-nccl-xml", str(FIX / "nccl-topo.azure-ndv4-a100.xml"), "--name", "ndv4")
    assert res.exit_code == 0, res.stderr
    assert "ndv4" in res.stdout and "no <gpu> elements" in res.stdout and "assumed:" in res.stdout


def test_a_nic_rate_the_input_overrides_is_said():
    xml = str(FIX / "nccl-topo.ibm-gx3d-8xh100.xml")  # 8 NICs at 200 Gb/s
    said = json.loads(run_cli("probe", "--from-nccl-xml", xml, "--nics", "8x400", "--json").stdout)["warnings"]
    assert any("--nics rate 400 Gb/s ignored" in w and "200 Gb/s" in w for w in said)
    same = json.loads(run_cli("probe", "--from-nccl-xml", xml, "--nics", "8x200", "--json").stdout)["warnings"]
    assert not any("--nics" in w for w in same)


def test_bus_ids_print_as_read():
    # rich reads ':ab:' as an emoji code; the IBM dump's warning names bus 0000:ab:00.0.
    res = run_cli("probe", "--from-nccl-xml", str(FIX / "nccl-topo.ibm-gx3d-8xh100.xml"))
    assert res.exit_code == 0, res.stderr
    assert "0000:ab:00.0" in res.stdout + res.stderr


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--from-nvidia-smi", str(FIX / "damaged" / "topo-m.dgx-a100.unknown-code.txt")), "unknown code 'NVX'"),
        (("--from-rocm-smi", str(FIX / "damaged" / "rocm-smi-showtopo.asymmetric.txt")), "GPU0-GPU1"),
        (("--from-nccl-xml", str(FIX / "damaged" / "nccl-topo.ibm-gx3d.unclosed.xml")), "malformed XML"),
        (("--from-nvidia-smi", DGX, "--ibstat", str(FIX / "damaged" / "ibstat.truncated.txt")), "no 'Rate' line"),
        (("--from-nvidia-smi", DGX, "--nodes", "2"), "--nic-gbps"),
        (("--from-nvidia-smi", DGX, "--gpu-model", "Voodoo2"), "not a known GPU"),
        # a family name, not a part: its parts differ in links and memory
        (("--from-nvidia-smi", DGX, "--gpu-model", "a100"), "--gpu-model 'a100' names 4 known GPUs; give one of "
                                                          "A100-SXM4-40GB, A100-SXM4-80GB, A100-PCIE-40GB, "
                                                          "A100-PCIE-80GB"),
        # inf would be written as bw_gbps: .inf, a file that topo validate refuses
        (("--from-nvidia-smi", str(FIX / "nvidia-smi-topo-m.della-2xa100-pcie.txt"), "--nodes", "2",
          "--nic-gbps", "inf"), "--nic-gbps must be a finite number > 0, got inf"),
        # read before probing: on a host without GPUs (this one, probed live) probing never reaches it
        (("--nics", "3xfoo"), "--nics '3xfoo': write COUNT or COUNTxGBIT"),
        (("--ibstat", "/nonexistent/ibstat.txt"), "cannot read ibstat file"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, match):
    res = run_cli("probe", *args)
    assert res.exit_code == 2
    assert match in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_missing_file_is_one_line_exit_2():
    res = run_cli("probe", "--from-nvidia-smi", str(FIX / "nope.txt"))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "cannot read nvidia-smi topo -m file" in res.stderr and "nope.txt" in res.stderr


def test_subprocess_real_entry_point(tmp_path):
    ok = subprocess.run([TREEATTN, "probe", "--from-rocm-smi", str(FIX / "rocm-smi-showtopo.8x-mi308x.txt"),
                         "--gpu-model", "MI300X", "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["topology"]["ranks"]) == 8
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV3\t X \n")
    res = subprocess.run([TREEATTN, "probe", "--from-nvidia-smi", str(bad)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "bad.txt:2: GPU0-GPU1 is NV4 but GPU1-GPU0 is NV3" in res.stderr
    assert "Traceback" not in res.stderr


def _has_gpu() -> bool:
    return any((d.vendor in (0x10DE, 0x1002) and d.cls >> 16 == 0x03) for d in scan_pci(Path("/")).values())


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU: the live probe finds it")
def test_a_cpu_host_of_too_many_ranks_is_refused_as_the_flags_value():
    res = run_cli("probe", "--ranks", "100000")
    assert res.exit_code == 2 and res.stderr.strip() == ("error: --ranks 100000: 100,000 ranks, above treeattn's "
                                                         "limit of 16,384 ranks (README, 'Scale')"), res.stderr


def test_live_probe_without_gpu_is_cpu_loopback():
    res = run_cli("probe", "--ranks", "3", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["topology"]["ranks"] == ["host0"] * 3
    assert "CPU-only loopback host" in data["topology"]["description"]
    # what only GPUs' NICs use is said to be ignored, as --ranks is where GPUs are found
    said = json.loads(run_cli("probe", "--ranks", "3", "--nics", "2x100", "--json").stdout)["warnings"]
    assert any(w.startswith("--nics ignored: no GPU was found") for w in said), said
    said = json.loads(run_cli("probe", "--ranks", "3", "--gpu-model", "H100", "--json").stdout)["warnings"]
    assert "--gpu-model ignored: no GPU was found" in said, said  # a typo there went unsaid


@pytest.mark.parametrize(("model", "hint"), [
    ("H100-FOO", " (did you mean H100-SXM5-80GB?)"),  # read as H100-SXM5-80GB, with a warning, before
    ("H200-BOGUS", " (did you mean H200-SXM-141GB?)"),
    ("H10-SXM5-80GB", " (did you mean H100-SXM5-80GB?)"),  # a typo: the closest name
    ("Voodoo2", ""),
])
def test_a_gpu_model_that_is_no_known_name_is_refused(model, hint):
    # --gpu-model is a choice, not a tool's product name: the patterns that read nvidia-smi's
    # names (H100 anything is the SXM5 part) would model another GPU than the one typed.
    xml = str(FIX / "nccl-topo.ibm-gx3d-8xh100.xml")
    res = run_cli("probe", "--from-nccl-xml", xml, "--gpu-model", model)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == (f"error: --gpu-model {model!r} is not a known GPU{hint}; choose one of "
                          f"{', '.join(GPU_SPECS)}\n"), res.stderr
    exact = json.loads(run_cli("probe", "--from-nccl-xml", xml, "--gpu-model", "h200-sxm-141gb", "--json").stdout)
    assert {d["model"] for d in exact["topology"]["devices"] if d["kind"] == "gpu"} == {"H200-SXM-141GB"}
    # A product name as nvidia-smi prints it (pasted) is read as the tools' names are, and said.
    pasted = json.loads(run_cli("probe", "--from-nccl-xml", xml, "--gpu-model", "NVIDIA H100 80GB HBM3",
                                "--json").stdout)
    assert {d["model"] for d in pasted["topology"]["devices"] if d["kind"] == "gpu"} == {"H100-SXM5-80GB"}
    assert "--gpu-model 'NVIDIA H100 80GB HBM3' read as H100-SXM5-80GB" in pasted["warnings"]


def test_nodes_with_every_nic_down_says_so_not_to_pass_what_is_ignored(tmp_path):
    # ibstat of a node whose ports are all down: --nics would be ignored (the input shows NICs),
    # and --ibstat was given, so neither is offered as the way out.
    ib = tmp_path / "ibstat.txt"
    ib.write_text((FIX / "ibstat.cx6-hdr200-partial.nccl-tests-128.txt").read_text().replace("State: Active",
                                                                                             "State: Down"))
    res = run_cli("probe", "--from-nvidia-smi", str(FIX / "nvidia-smi-topo-m.della-2xa100-pcie.txt"), "--ibstat",
                  str(ib), "--nodes", "2", "--nics", "2x200")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "none of its NICs is Active (mlx5_0 Down, mlx5_1 Down)" in res.stderr
    assert "pass --nics" not in res.stderr
    # an input that shows no NIC still gets the advice that works there
    res = run_cli("probe", "--from-rocm-smi", str(FIX / "rocm-smi-showtopo.8x-mi308x.txt"), "--nodes", "2")
    assert res.exit_code == 2 and "pass --nics COUNTxGBIT or --ibstat FILE" in res.stderr


def test_the_format_page_names_every_way_probe_joins_nodes():
    from treeattn.probe import Fabric

    page = (Path(__file__).parents[2] / "docs" / "topology-format.md").read_text()
    for fabric in Fabric:
        assert f"--fabric {fabric.value}" in page


def test_an_assumed_link_layer_says_how_to_get_roce(tmp_path):
    # an MI300X cluster on RoCE, NICs from --nics: InfiniBand is assumed, and the note says how
    # the RoCE the admin has is given
    args = ("probe", "--from-rocm-smi", str(FIX / "rocm-smi-showtopo.8x-mi308x.txt"), "--gpu-model", "MI300X",
            "--nics", "8x400", "--nodes", "2", "--json")
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr
    (said,) = [a for a in json.loads(res.stdout)["assumptions"] if "link layer unknown" in a]
    assert "--ibstat FILE" in said and "roce" in said
    # the flags' Gb/s are said beside the file's GB/s (bw_gbps: 50 for 400)
    assert any(a.startswith("8 NICs at 400 Gb/s (50 GB/s, the file's bw_gbps) from --nics")
               for a in json.loads(res.stdout)["assumptions"]), res.stdout
    # and ibstat of a RoCE port gives it
    ib = tmp_path / "ibstat.txt"
    ib.write_text((FIX / "ibstat.cx6-hdr100-single.txt").read_text().replace("Link layer: InfiniBand",
                                                                             "Link layer: Ethernet"))
    res = run_cli(*args[:5], "--ibstat", str(ib), "--nodes", "2", "--json")
    assert res.exit_code == 0, res.stderr
    kinds = {ln["kind"] for ln in json.loads(res.stdout)["topology"]["links"]}
    assert "roce" in kinds and "infiniband" not in kinds
    # and so does --link-layer, for NICs from --nics (the file's kind was to be edited by hand)
    assert "--link-layer roce" in said
    res = run_cli(*args, "--link-layer", "roce")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {ln["kind"] for ln in out["topology"]["links"]} & {"roce", "infiniband"} == {"roce"}
    assert any(a.startswith("link layer RoCE from --link-layer for nic0") for a in out["assumptions"])
    assert not any("link layer unknown" in a for a in out["assumptions"])
    # an ibstat's own layer is kept: --link-layer fills only what the inputs leave unsaid
    res = run_cli(*args[:5], "--ibstat", str(FIX / "ibstat.cx6-hdr100-single.txt"), "--nodes", "2",
                  "--link-layer", "roce", "--json")
    assert res.exit_code == 0, res.stderr
    assert "roce" not in {ln["kind"] for ln in json.loads(res.stdout)["topology"]["links"]}


@pytest.mark.parametrize("rate", ["1e999", "nan", "0", "-200"])
def test_an_ibstat_rate_no_port_has_is_refused_where_it_stands(tmp_path, rate):
    # 1e999 was written as bw_gbps: .inf (exit 0), which topo validate then refuses; nan and -200
    # were refused naming a link of the built topology, 0 as a rate "unknown" of --ibstat given
    ib = tmp_path / "ibstat.txt"
    ib.write_text((FIX / "ibstat.cx6-hdr200-partial.nccl-tests-128.txt").read_text().replace("Rate: 200",
                                                                                             f"Rate: {rate}"))
    out = tmp_path / "t.yaml"
    res = run_cli("probe", "--from-nvidia-smi", str(FIX / "nvidia-smi-topo-m.della-2xa100-pcie.txt"), "--ibstat",
                  str(ib), "--nodes", "2", "-o", str(out))
    assert res.exit_code == 2 and not out.exists() and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "ibstat.txt:" in res.stderr and f"Rate '{rate}' is not a line rate" in res.stderr


@pytest.mark.parametrize("name", ["my\tnode", "a\nb", ""])
def test_a_name_the_written_file_could_not_be_read_back_with_is_refused(tmp_path, name):
    # probe --name $'my\tnode' wrote a topology topo validate then refused
    res = run_cli("probe", "--from-nccl-xml", str(FIX / "nccl-topo.azure-ndv4-a100.xml"), "--name", name,
                  "-o", str(tmp_path / "t.yaml"))
    assert res.exit_code == 2 and res.stderr.splitlines() == [
        f"error: --name: {ONE_LINE}, got {name!r}"], res.stderr
    assert not (tmp_path / "t.yaml").exists()
