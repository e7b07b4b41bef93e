"""``treeattn topo``: list, show, validate, schema, and every bad input as one line, exit 2."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.topology.families import FAMILIES
from treeattn.topology.library import resolve, shipped_files
from treeattn.topology.plausible import implausible
from treeattn.topology.schema import ONE_LINE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
TREEATTN = Path(sys.executable).with_name("treeattn")

# Fixture -> what its one-line error must say (file:line, field path, what is wrong).
BAD = {
    "syntax-error.yaml": ["syntax-error.yaml:4:", "YAML syntax error"],
    "unknown-field.yaml": ["unknown-field.yaml:6:", "links[0].bw_gpbs", "unknown field", "did you mean 'bw_gbps'"],
    "unknown-link-kind.yaml": ["unknown-link-kind.yaml:6:", "links[0].kind", "'nvlnk'", "nvlink"],
    "unknown-device-kind.yaml": ["unknown-device-kind.yaml:4:", "devices[1].kind", "'tpu'"],
    "bw-not-positive.yaml": ["bw-not-positive.yaml:10:", "links[3].bw_gbps", "must be > 0", "-5"],
    "link-unknown-device.yaml": ["link-unknown-device.yaml:7:", "links[1].src", "unknown device 'gpu1'"],
    "duplicate-device.yaml": ["duplicate-device.yaml:5:", "devices[2].name", "duplicate device name 'gpu0'"],
    "rank-on-switch.yaml": ["rank-on-switch.yaml:7:", "ranks[1]", "'sw0' is a nvswitch"],
    "unroutable.yaml": ["unroutable.yaml:11:", "ranks:", "rank 0 (n0.gpu0) cannot reach rank 1 (n1.gpu0)"],
    # Every rank reaches rank 0, yet ranks 1 and 2 have no route: rank 0 alone is not enough.
    "leaves-unjoined.yaml": ["leaves-unjoined.yaml:21:", "ranks:", "rank 1 (g1) cannot reach rank 2 (g2)",
                             "no network path from 'nic1' to 'nic2'"],
    "duplicate-key.yaml": ["duplicate-key.yaml:2:", "'name' is given twice"],
    "empty.yaml": ["empty.yaml:", "file is empty"],
    "no-form.yaml": ["no-form.yaml:1:", "devices (explicit form), node (compact form) or family"],
    "compact-unknown-field.yaml": ["compact-unknown-field.yaml:3:", "node.gpus.mem_bw", "did you mean 'mem_bw_gbps'"],
    "compact-bad-pair.yaml": ["compact-bad-pair.yaml:11:", "node.fabric.pairs[2]", "[1, 9]"],
    "compact-no-network.yaml": ["compact-no-network.yaml:2:", "nodes:", "need node.nics and a network"],
    "family-bad-param.yaml": ["family-bad-param.yaml:3:", "params.nodes", "integer >= 1"],
    "family-unknown.yaml": ["family-unknown.yaml:1:", "family:", "unknown family 'dgx-h900'"],
    "oversubscription-below-one.yaml": ["oversubscription-below-one.yaml:7:", "network.oversubscription", ">= 1"],
    "compact-sockets-unjoined.yaml": ["compact-sockets-unjoined.yaml:", "rank 0 (n0.gpu0) cannot reach rank 2",
                                      "on one machine (node 0)", "node.cpus.link"],
    # said as a machine without socket links before: the link written one way is the cause
    "one-way-link.yaml": ["one-way-link.yaml:10:", "'g0' reaches 'g1' inside node 0 but not back",
                          "one way (duplex: false) with no link the other way"],
    # A GPU sends through one NIC: NICs that would carry nothing are refused, not built.
    "compact-more-nics-than-gpus.yaml": ["compact-more-nics-than-gpus.yaml:8:", "node.nics.count",
                                         "16 NICs for 8 GPUs", "8 would carry nothing", "give count: 8"],
    "compact-nic-serves-none.yaml": ["compact-nic-serves-none.yaml:5:", "node.nics.gpus[1]", "NIC 1 serves no GPU"],
    "compact-gpu-on-two-nics.yaml": ["compact-gpu-on-two-nics.yaml:8:", "node.nics.gpus[1][0]",
                                     "GPU 1 is already served by NIC 0"],
}


def test_every_fixture_has_an_expectation():
    assert sorted(p.name for p in FIXTURES.glob("*.yaml")) == sorted(BAD)


def assert_one_line_error(res, *needles):
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("fixture", sorted(BAD))
@pytest.mark.parametrize("command", ["validate", "show"])
def test_bad_inputs_give_one_line_and_exit_2(fixture, command):
    res = run_cli("topo", command, str(FIXTURES / fixture), "--json")
    assert_one_line_error(res, *BAD[fixture])
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("missing-file.yaml", ["cannot read topology file 'missing-file.yaml': no such file"]),
        ("no-such-preset", ["unknown topology 'no-such-preset'", "dgx-h100-16node"]),
        ("dgx-h10:nodes=2", ["unknown topology", "did you mean 'dgx-h100:nodes=2'"]),
        ("dgx-h100-2nodes", ["unknown topology", "did you mean 'dgx-h100-2node'"]),
        ("DGX-H100", ["unknown topology 'DGX-H100'", "did you mean 'dgx-h100'"]),
        ("dgx-h100:nodes=0", ["nodes must be an integer >= 1"]),
        ("cpu:ranks=2_0", ["ranks must be an integer >= 1 (got '2_0')"]),  # int() read it as 20
        ("", ["topology '' is empty; give a topology YAML file"]),  # said "is a folder" (the current one)
        ("dgx-h100:racks=2", ["no parameter 'racks'"]),
        ("mi300x:gpus=3", ["gpus must be one of 8, 4"]),
        ("dgx-h100:nodes=4,spines=0", ["need at least one spine"]),
        # an infinite factor is no oversubscription: it is named, not left to fail in the arithmetic
        ("dgx-h100:nodes=2,oversubscription=inf", ["oversubscription must be a finite number >= 1"]),
        ("cpu:ranks", ["'ranks' is not key=value"]),
        ("dgx-h100:nodes=2,nodes=3", ["parameter 'nodes' is given twice"]),
    ],
)
def test_bad_specs_give_one_line_and_exit_2(spec, needles):
    assert_one_line_error(run_cli("topo", "validate", spec), *needles)


def test_list_json_lists_every_preset_and_each_validates():
    res = run_cli("topo", "list", "--json")
    assert res.exit_code == 0, res.stderr
    presets = json.loads(res.stdout)
    files = {p["name"] for p in presets if p["source"] == "file"}
    families = {p["name"] for p in presets if p["source"] == "family"}
    assert files == set(shipped_files()) and families == set(FAMILIES)
    for p in presets:
        assert p["ranks"] >= 1 and p["description"]
        spec = p["name"] if p["source"] == "file" else p["name"] + ":"
        out = run_cli("topo", "validate", spec, "--json")
        assert out.exit_code == 0, out.stderr
        assert json.loads(out.stdout)["ranks"] == p["ranks"]


@pytest.mark.parametrize("name", sorted(shipped_files()))
def test_show_json_on_every_shipped_file(name):
    res = run_cli("topo", "show", name, "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert res.stdout == json.dumps(data, sort_keys=True, indent=2) + "\n"
    assert len(data["from_rank0"]) == data["ranks"] >= 1
    assert data["from_rank0"][0]["bw_gbps"] is None and data["from_rank0"][0]["hops"] == 0
    assert all(e["bw_gbps"] > 0 for e in data["from_rank0"][1:])
    assert sum(data["devices"].values()) >= 1 and data["links"]
    if data["ranks"] <= 16:
        assert len(data["bw_matrix_gbps"]) == data["ranks"]


def test_show_reports_dgx_figures():
    data = json.loads(run_cli("topo", "show", "dgx-h100-2node", "--json").stdout)
    assert data["devices"]["gpu"] == 16 and data["devices"]["nvswitch"] == 2
    assert data["links"]["nvlink"]["bw_gbps"] == [450.0]
    assert [e["bw_gbps"] for e in data["from_rank0"]][1:9] == [450.0] * 7 + [50.0]
    assert data["bw_matrix_gbps"][3][12] == 50.0
    assert [d["kind"] for d in data["domains"]] == ["fabric", "leaf"]


HOST_RATED = """\
name: host-rated
cost: {link_rates: measured}
devices:
  - {name: host0, kind: host, node: 0, model: cpu, mem_bw_gbps: 20}
  - {name: host1, kind: host, node: 1, model: cpu, mem_bw_gbps: 20}
  - {name: sw, kind: switch, node: -1}
links:
  - {src: host0, dst: host0, kind: loopback, bw_gbps: 10, rated_gbps: 20}
  - {src: host1, dst: host1, kind: loopback, bw_gbps: 10, rated_gbps: 20}
  - {src: host0, dst: sw, kind: ethernet, bw_gbps: 1.1, latency_us: 30, rated_gbps: 12.5, rated_latency_us: 5,
     duplex: true}
  - {src: host1, dst: sw, kind: ethernet, bw_gbps: 1.1, latency_us: 30, rated_gbps: 12.5, rated_latency_us: 5,
     duplex: true}
ranks: ["host0*2", "host1*2"]
"""


def test_show_leaves_out_ratings_nothing_reads_on_host_ranks(tmp_path):
    # On host ranks gloo's collectives read the measured rates: a hand-written file's ratings
    # change no prediction, so show does not list them as if a model read them.
    import dataclasses

    from treeattn.cost.simulate import simulate
    from treeattn.plan.builders import build
    from treeattn.topology import resolve
    from treeattn.workload import Workload

    path = tmp_path / "host-rated.yaml"
    path.write_text(HOST_RATED)
    topo = resolve(str(path))
    bare = dataclasses.replace(topo, links=tuple(dataclasses.replace(ln, rated_gbps=None, rated_latency_us=None)
                                                 for ln in topo.links))
    w = Workload(1, 32, 8, 128, (4096,) * 4)
    for name in ("allreduce3", "allreduce2", "allgather-merge"):
        assert simulate(build(name, w, topo), topo).predicted_us == simulate(build(name, w, bare), bare).predicted_us
    data = json.loads(run_cli("topo", "show", str(path), "--json").stdout)
    assert data["links"]["ethernet"] == {"count": 4, "bw_gbps": [1.1], "latency_us": [30.0]}
    res = run_cli("topo", "show", str(path))
    assert res.exit_code == 0, res.stderr
    assert "rated" not in next(ln for ln in res.stdout.splitlines() if "latency µs" in ln)
    lines = res.stdout.splitlines()
    at = lines.index("the links' ratings (rated_gbps, rated_latency_us) are read by nothing here:")
    assert lines[at + 1] == "on host ranks gloo's collectives and treeattn's transfers use the measured rates"


def test_show_says_what_local_compute_costs():
    # The families' decode-attention line (docs/attention-model.md), in the text and the JSON.
    text = " ".join(run_cli("topo", "show", "dgx-h100").stdout.split())
    assert "attention 12.4 µs a call + KV at 0.56 of 3350 GB/s" in text
    assert "merges 5 µs a kernel + bytes at 0.8 of memory bandwidth" in text
    for name in ("dgx-h100", "cpu-4", "mi300x-8"):  # piped, rich wraps nothing: the lines fit 80 columns
        lines = run_cli("topo", "show", name).stdout.splitlines()
        at = lines.index("Local compute, rank 0 (docs/attention-model.md):")
        assert [ln.split()[0] for ln in lines[at + 1:at + 3]] == ["attention", "merges"], name
        assert all(len(ln) <= 80 for ln in lines[at:at + 3]), lines[at:at + 3]
        assert "cost sets no attention figures" not in " ".join(lines)  # set, or no fit for the GPU
    for name, fixed, share in (("dgx-h100", 12.4, 0.56), ("dgx-a100", 13.9, 0.72), ("gb200-nvl72", 6.9, 0.8)):
        cost = json.loads(run_cli("topo", "show", name, "--json").stdout)["cost"]
        assert (cost["attn_launch_us"], cost["attn_efficiency"], cost["launch_us"]) == (fixed, share, 5.0), name
    mi = json.loads(run_cli("topo", "show", "mi300x-8", "--json").stdout)["cost"]
    assert "attn_launch_us" not in mi and "attn_efficiency" not in mi  # no published figure: the defaults
    mi_text = " ".join(run_cli("topo", "show", "mi300x-8").stdout.split())
    assert "attention 5 µs a call + KV at 0.8 of 5300 GB/s" in mi_text
    # ... and says so, where a fitted GPU's 12.4 us and 0.56 would flatter it beside them
    assert "the attention figures are launch_us and mem_efficiency: no published decode kernel " \
           "on MI300X was fitted" in mi_text
    mi_lines = run_cli("topo", "show", "mi300x-8").stdout.splitlines()
    assert all(len(ln) <= 80 for ln in mi_lines)
    for fitted in ("dgx-h100", "cpu-4"):
        assert "no published decode kernel" not in run_cli("topo", "show", fitted).stdout


def test_a_file_that_sets_no_attention_figures_takes_its_gpus_published_fit(tmp_path):
    from treeattn.cost.compute import ComputeModel
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    path = tmp_path / "a100.yaml"
    path.write_text("name: my-a100\nnode:\n  gpus: {count: 2, model: A100-SXM4-80GB, mem_bw_gbps: 2039, mem_gb: 80}\n"
                    "  pcie: {bw_gbps: 25}\n")
    lines = run_cli("topo", "show", str(path)).stdout.splitlines()
    assert "  attention 13.9 µs a call + KV at 0.72 of 2039 GB/s;" in lines
    at = lines.index("  attn_launch_us and attn_efficiency: the fit to published decode kernels")
    assert lines[at + 1] == "  on A100 (Ampere) (docs/attention-model.md)"
    # the same GPUs time attention the same in a hand-written file as in their family
    w = Workload(batch=1, q_heads=64, kv_heads=8, head_dim=128, split=(1 << 20,) * 8)
    path.write_text(path.read_text().replace("A100-SXM4-80GB", "H100").replace("2039", "3350")
                    .replace("count: 2", "count: 8"))
    mine, family = (ComputeModel.of(w, resolve(t)).attention_terms(0) for t in (str(path), "dgx-h100"))
    assert mine == family == (12.4, 0.56 * 3350)
    # no note on stderr for it: the figures are the fit's, not the defaults
    res = run_cli("plan", "-t", str(path), "-m", "llama-3.1-8b", "-n", "32K", "--no-progress",
                  "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    assert "times decode attention by the merge kernels' figures" not in res.stderr
    # the longest product name too: every line within 80 columns
    path.write_text(path.read_text().replace("H100", "B200").replace("name: my-a100", "name: my-b200"))
    lines = run_cli("topo", "show", str(path)).stdout.splitlines()
    at = lines.index("  on B200 (Blackwell) (docs/attention-model.md)")
    assert all(len(ln) <= 80 for ln in lines[at - 4:at + 1]), lines[at - 4:at + 1]
    # a model as a file may write it, and the parts of the same memory system, take the fit too
    for model, which in (("H100", "H100 (Hopper)"), ("GH200", "H100 (Hopper)"), ("A800-SXM4-80GB", "A100 (Ampere)")):
        path.write_text(path.read_text().replace("B200", model, 1))
        assert f"on {which} (docs/attention-model.md)" in run_cli("topo", "show", str(path)).stdout, model
        path.write_text(path.read_text().replace(model, "B200", 1))
    # a figure the file sets is its own; the fit gives the other (writing the fit's own share
    # had dropped its 12.4 us for launch_us's 5)
    path.write_text(path.read_text() + "cost: {attn_efficiency: 0.5}\n")
    assert ComputeModel.of(w, resolve(str(path))).attention_terms(0) == (6.9, 0.5 * 3350)
    out = run_cli("topo", "show", str(path)).stdout
    assert "  attn_launch_us: the fit to published decode kernels on B200 (Blackwell)" in out.splitlines()
    assert json.loads(run_cli("topo", "show", str(path), "--json").stdout)["attention_fit"] == {
        "fit": "B200 (Blackwell)", "attn_launch_us": 6.9}  # the figure it takes, not the one it sets


def test_gpus_of_two_fits_keep_the_defaults_and_say_why():
    from treeattn.topology.attention_fits import applied_attention_fit, unfitted_attention_note
    from treeattn.topology.library import resolve

    topo = resolve("dgx-h100")
    assert applied_attention_fit(topo)[0] == "H100 (Hopper)" and unfitted_attention_note(topo) is None
    bare = dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, attn_launch_us=None, attn_efficiency=None))
    assert applied_attention_fit(bare)[0] == "H100 (Hopper)" and unfitted_attention_note(bare) is None
    devices = tuple(dataclasses.replace(d, model="A100-SXM4-80GB") if d.name == bare.ranks[0] else d
                    for d in bare.devices)
    mixed = dataclasses.replace(bare, devices=devices)
    assert applied_attention_fit(mixed) is None
    assert "take different published fits; set cost.attn_launch_us" in unfitted_attention_note(mixed)


def test_show_tables_and_png(tmp_path):
    png = tmp_path / "rtx.png"
    res = run_cli("topo", "show", "rtx4090-8", "--png", str(png))
    assert res.exit_code == 0, res.stderr
    assert "Transfer rate, GB/s" in res.stdout and "pcie-switch" in res.stdout
    # RTX 4090s have no peer-to-peer: every pair goes through host memory at NCCL's shared-memory rate.
    assert "56 of 56 rank pairs have no GPU peer-to-peer" in " ".join(res.stdout.split())
    assert res.stdout.count("rank pairs have no GPU peer-to-peer") == 1  # under the rates, not also under the links
    rtx = json.loads(run_cli("topo", "show", "rtx4090-8", "--json").stdout)
    dgx = json.loads(run_cli("topo", "show", "dgx-h100", "--json").stdout)
    assert (rtx["shm_pairs"], rtx["shm_gbps"]) == (56, 2.7) and (dgx["shm_pairs"], dgx["shm_gbps"]) == (0, None)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    big = run_cli("topo", "show", "dgx-h100:nodes=32")
    assert big.exit_code == 0 and "Routes from rank 0" in big.stdout


def test_show_counts_each_reason_pairs_go_through_host_memory(tmp_path):
    # GPU 0 has no peer-to-peer; GPUs 1 and 2 have it but meet at the CPU, beyond NCCL's
    # default P2P level (PXB): the line must not say all six pairs lack peer-to-peer.
    path = tmp_path / "mixed.yaml"
    gpu = "kind: gpu, model: L40S, mem_bw_gbps: 864"
    path.write_text(
        "name: mixed\ndevices:\n  - {name: cpu0, kind: cpu}\n"
        f"  - {{name: gpu0, {gpu}, p2p: false}}\n  - {{name: gpu1, {gpu}}}\n  - {{name: gpu2, {gpu}}}\n"
        "links:\n" + "".join(f"  - {{src: gpu{g}, dst: cpu0, kind: pcie, bw_gbps: 25, generation: 4, width: 16, "
                              "duplex: true}\n" for g in range(3)))
    res = run_cli("topo", "show", str(path))
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "6 of 6 rank pairs (4 with a GPU without peer-to-peer, 2 further apart than NCCL's P2P level (PXB) " \
           "connects peer-to-peer): NCCL moves their data through host memory" in text, text
    # one reason alone keeps its short form
    res = run_cli("topo", "show", str(path), "--json")
    assert json.loads(res.stdout)["shm_pairs"] == 6
    path.write_text(path.read_text().replace(", p2p: false", ""))
    assert "6 of 6 rank pairs are further apart than NCCL's P2P level (PXB)" in \
        " ".join(run_cli("topo", "show", str(path)).stdout.split())


def test_show_counts_a_pair_the_level_sends_under_the_level_though_a_gpu_lacks_peer_access(tmp_path):
    # GPU 0 lacks peer access over PCIe but is NVLink-bridged to GPU 1, and 1 to 2; GPU 3 is
    # on PCIe alone; NCCL_P2P_LEVEL=NVL. 0-2 (NVLink through GPU 1) go through host memory
    # because of the level, as 1-3 and 2-3; only 0-3 because GPU 0 has no peer-to-peer. 0-2
    # was counted under "no peer-to-peer" (4 and 4) for GPU 0's flag.
    from tests.unit.test_nccl_p2p_level import _MIXED

    path = tmp_path / "mixed.yaml"
    path.write_text(_MIXED)
    res = run_cli("topo", "show", str(path))
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "8 of 12 rank pairs (2 with a GPU without peer-to-peer, 6 further apart than NCCL's P2P level (NVL) " \
           "connects peer-to-peer): NCCL moves their data through host memory" in text, text


def test_show_names_the_p2p_level_of_the_node_whose_pairs_it_puts_through_host_memory(tmp_path):
    # Two AMD nodes of 4 GPUs on the sockets' root ports, ranks 0 | 4, 5, 6: node 0 holds one
    # rank (NCCL's default there: SYS), node 1 three (PXB), whose pairs go through host memory.
    # "further apart than ... (SYS)" would name a level nothing is further apart than.
    path = tmp_path / "two.yaml"
    path.write_text("name: two\nnodes: 2\nnode:\n  gpus: {count: 4, model: L40S, mem_bw_gbps: 864}\n"
                    "  cpus: {count: 2, model: EPYC 9354, link: {kind: infinity-fabric, bw_gbps: 64}}\n"
                    "  pcie: {generation: 4, bw_gbps: 25}\n  nics: {count: 2, bw_gbps: 25}\nnetwork: {kind: roce}\n")
    res = run_cli("topo", "show", f"{path}[ranks 0,4,5,6]")
    assert res.exit_code == 0, res.stderr
    assert "6 of 12 rank pairs are further apart than NCCL's P2P level (PXB) connects peer-to-peer" in \
        " ".join(res.stdout.split()), res.stdout


def test_png_refuses_huge_topologies(tmp_path):
    assert_one_line_error(run_cli("topo", "show", "dgx-h100:nodes=64", "--png", str(tmp_path / "x.png")),
                          "too many to draw")


def test_validate_text_and_schema():
    res = run_cli("topo", "validate", str(shipped_files()["dgx1-v100"]))
    assert res.exit_code == 0 and res.stdout.startswith("ok: dgx1-v100: 8 ranks")
    assert ": 3 ranks, 1 device, 1 link, every rank routable" in run_cli("topo", "validate", "cpu:ranks=3").stdout
    schema = json.loads(run_cli("topo", "schema").stdout)
    assert {"ExplicitFile", "CompactFile", "FamilyFile", "LinkSpec"} <= set(schema["$defs"])
    assert schema["$defs"]["LinkSpec"]["additionalProperties"] is False


def test_console_script_renders_errors_without_traceback():
    env = {**os.environ, "COLUMNS": "200"}
    bad = subprocess.run([str(TREEATTN), "topo", "validate", str(FIXTURES / "bw-not-positive.yaml")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "links[3].bw_gbps" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    good = subprocess.run([str(TREEATTN), "topo", "show", "mi300x-8", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0 and json.loads(good.stdout)["links"]["xgmi"]["bw_gbps"] == [64.0]


def test_list_table_shows_family_keys():
    res = run_cli("topo", "list")
    assert res.exit_code == 0, res.stderr
    assert "nics_per_leaf=32" in res.stdout and "gpus=8" in res.stdout


def test_schema_uses_json_schema_bound_keywords():
    res = run_cli("topo", "schema")
    assert res.exit_code == 0, res.stderr
    schema = json.loads(res.stdout)

    def walk(node):
        if isinstance(node, dict):
            assert not {"gt", "ge", "lt", "le"} & set(node), node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    fabric_bw = schema["$defs"]["FabricSpec"]["properties"]["bw_gbps"]["anyOf"][0]
    assert fabric_bw["exclusiveMinimum"] == 0


def test_show_prints_names_and_descriptions_with_brackets_verbatim(tmp_path):
    path = tmp_path / "box.yaml"
    path.write_text(
        'name: "box[/x]"\ndescription: "lab box [bold] [/]"\n'
        "node:\n  gpus: {count: 2, mem_bw_gbps: 864}\n  pcie: {bw_gbps: 25}\n"
    )
    res = run_cli("topo", "show", str(path))
    assert res.exit_code == 0, res.stderr
    assert "box[/x]" in res.stdout and "lab box [bold] [/]" in res.stdout


def test_a_gpu_model_treeattn_does_not_know_is_warned_about(tmp_path):
    # A typo in a GPU's model would otherwise pass unnoticed, its NCCL figures read by the
    # nearest architecture the name suggests.
    text = shipped_files()["dgx-a100"].read_text().replace("model: A100-SXM4-80GB", "model: A10O-SXM4-80GB")
    (tmp_path / "typo.yaml").write_text(text)
    for args in (("topo", "validate"), ("topo", "show"), ("nccl-model", "-c", "allreduce", "--bytes", "1MiB", "-t")):
        res = run_cli(*args, str(tmp_path / "typo.yaml"))
        assert res.exit_code == 0, res.stderr
        assert "warning: GPU model 'A10O-SXM4-80GB' of dgx-a100 is not one treeattn knows" in res.stderr, args
        assert "NCCL's figures are read as for ampere GPUs" in res.stderr
    for name in shipped_files():
        assert "warning" not in run_cli("topo", "validate", name).stderr, name


def test_gpus_that_name_no_model_beside_an_unknown_one_are_said_so_not_quoted_empty():
    import dataclasses

    from treeattn.cost.library import unknown_gpu_note
    from treeattn.topology.model import DeviceKind

    topo = resolve("dgx-a100")
    devices = list(topo.devices)
    gpus = [i for i, d in enumerate(devices) if d.kind is DeviceKind.GPU]
    devices[gpus[0]] = dataclasses.replace(devices[gpus[0]], model="")
    devices[gpus[1]] = dataclasses.replace(devices[gpus[1]], model="A10O-SXM4-80GB")
    note = unknown_gpu_note(dataclasses.replace(topo, devices=tuple(devices)))
    assert note.startswith("GPU model 'A10O-SXM4-80GB' of dgx-a100 is not one treeattn knows (")
    assert "''" not in note and "; some of its GPUs name no model: NCCL's figures" in note


def test_the_attention_fit_of_a_gpu_named_as_nvidia_smi_prints_it():
    from treeattn.topology.attention_fits import published_attention_fit

    assert published_attention_fit("NVIDIA H100 80GB HBM3") == published_attention_fit("H100-SXM5-80GB")
    assert published_attention_fit("NVIDIA A100-SXM4-80GB")[0] == "A100 (Ampere)"
    assert published_attention_fit("NVIDIA GeForce RTX 4090") is None
    assert published_attention_fit("B200-GB200")[0] == "B200 (Blackwell)"
    # The product number ends where the name's word does: a typo is not a part it contains.
    assert published_attention_fit("H1000") is None and published_attention_fit("A1000-SXM") is None


def test_a_plan_given_for_a_topology_is_named_as_one():
    plan = Path(__file__).resolve().parents[2] / "plans" / "examples" / "dgx-h100-binomial.yaml"
    res = run_cli("topo", "validate", str(plan))
    assert res.exit_code == 2
    assert "this is a treeattn plan, not a topology (treeattn verify checks plans" in res.stderr


def test_values_in_another_unit_are_warned_about_where_a_topology_is_loaded(tmp_path):
    # Gb/s written as GB/s, MiB as GB, ns as us: valid numbers no hardware has, planned on
    # without a word before
    gpus = "".join(f"  - {{name: g{i}, kind: gpu, node: {i}, model: H100-SXM5-80GB, mem_bw_gbps: 3350, "
                   f"mem_gb: {81920 if i else 80}}}\n  - {{name: nic{i}, kind: nic, node: {i}}}\n" for i in range(2))
    links = "".join(f"  - {{src: g{i}, dst: nic{i}, kind: pcie, bw_gbps: 50, latency_us: {600 if i else 1}, "
                    f"duplex: true}}\n" for i in range(2))
    text = (f"name: units\ndevices:\n{gpus}links:\n{links}"
            "  - {src: nic0, dst: nic1, kind: infiniband, bw_gbps: 400, duplex: true}\nranks: [g0, g1]\n")
    (tmp_path / "units.yaml").write_text(text)
    res = run_cli("topo", "validate", str(tmp_path / "units.yaml"))
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines() == [
        "warning: GPU g1 has mem_gb 81920, more than any GPU's memory; mem_gb is GiB (MiB / 1024)",
        "warning: link g1->nic1 (pcie) has latency_us 600, over 100 us for a pcie hop; latency_us is microseconds "
        "(ns / 1000)",
        "warning: link nic0->nic1 (infiniband) has bw_gbps 400, faster than any network port (1.6 Tb/s is 200 GB/s); "
        "bw_gbps is GB/s: 400 Gb/s is 50"]
    res = run_cli("plan", "-t", str(tmp_path / "units.yaml"), "-m", "llama-3.1-8b", "-n", "8K",
                  "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0 and "mem_gb 81920" in res.stderr and "bw_gbps 400" in res.stderr
    # A 200 Gb/s NIC written as 200 on PCIe 4.0 (25 GB/s): under any port's speed, over what reaches it.
    (tmp_path / "nic.yaml").write_text(text.replace("bw_gbps: 50", "bw_gbps: 25").replace("bw_gbps: 400",
                                                                                           "bw_gbps: 200")
                                       .replace("81920", "80").replace("600", "1"))
    res = run_cli("topo", "validate", str(tmp_path / "nic.yaml"))
    assert res.exit_code == 0 and res.stderr.splitlines() == [
        "warning: NIC nic0 has bw_gbps 200 on the network but 25 over its PCIe link; bw_gbps is GB/s: 200 Gb/s is 25 "
        "(and 1 more)"], res.stderr


def warned(topo: Path, text: str) -> list[str]:
    """The lines `topo validate` prints on stderr for a file holding ``text`` (it must pass)."""
    topo.write_text(text)
    res = run_cli("topo", "validate", str(topo))
    assert res.exit_code == 0, res.stderr
    return res.stderr.splitlines()


_TWO_H100 = "name: h\nnode:\n  gpus: {count: 2, model: H100, mem_bw_gbps: 3350, mem_gb: 80}\n  pcie: {bw_gbps: 25}\n"


@pytest.mark.parametrize(("text", "right", "warning"), [
    # H100's 3.35 TB/s written as mem_bw_gbps: 3.35 was planned on without a word (attention
    # a thousand times slow, and the pick another method's)
    ("name: tbs\nnode:\n  gpus: {count: 8, model: H100-SXM5-80GB, mem_bw_gbps: 3.35, mem_gb: 80}\n"
     "  pcie: {generation: 5, bw_gbps: 55}\n  fabric: {kind: nvswitch, bw_gbps: 450}\n", ("3.35", "16.8"),
     "warning: GPU n0.gpu0 has mem_bw_gbps 3.35, slower than any GPU's memory (16.8 GB/s the slowest); "
     "mem_bw_gbps is GB/s: 3.35 TB/s is 3350 (and 7 more)"),
    # PCIe 5.0 x16 is 32 GT/s x 16 lanes, "512": as bw_gbps, four times PCIe 6.0 x16's 128 GB/s.
    ("name: pcie\nnode:\n  gpus: {count: 4, model: L40S, mem_bw_gbps: 864, mem_gb: 48}\n"
     "  pcie: {generation: 5, bw_gbps: 512}\n", ("512", "55"),
     "warning: link n0.gpu0->n0.cpu0 (pcie) has bw_gbps 512, faster than any PCIe link (6.0 x16 moves 128 GB/s "
     "one way); bw_gbps is GB/s: 512 Gb/s is 64 (and 3 more)"),
    # an attention kernel measured in TB/s, or past the memory it reads, timed every plan unsaid
    (_TWO_H100 + "cost: {attn_gbps: 3.0}\n", ("3.0", "3000"),
     "warning: cost.attn_gbps 3 is slower than any GPU's memory (16.8 GB/s the slowest); attn_gbps is GB/s: 3 TB/s "
     "is 3000"),
    (_TWO_H100 + "cost: {attn_gbps: 50000}\n", ("50000", "2000"),
     "warning: cost.attn_gbps 50000 is over 1.5 x the GPUs' memory bandwidth (mem_bw_gbps 3350), which the attention "
     "kernel reads the KV from; attn_gbps is GB/s"),
    (_TWO_H100 + "cost: {overhead_us: 2000000}\n", ("2000000", "2"),
     "warning: cost.overhead_us 2e+06 is over 10 ms a call (a GPU kernel launches in about 5 us); overhead_us is "
     "microseconds (ns / 1000)"),
    # PCIe 3.0 x16 moves 15.75 GB/s; NCCL, and the model, rate it 12 whatever bw_gbps says
    ("name: g3\nnode:\n  gpus: {count: 4, model: L40S, mem_bw_gbps: 864, mem_gb: 48}\n"
     "  pcie: {generation: 3, bw_gbps: 25}\n", ("generation: 3", "generation: 4"),
     "warning: link n0.gpu0->n0.cpu0 and 3 more: bw_gbps 25 is more than PCIe 3.0 x16 moves one way (15.75 GB/s); "
     "NCCL rates the link by its generation and width (12 GB/s), and so does the model: correct them, or bw_gbps"),
], ids=["gpu memory in TB/s", "pcie in Gb/s", "attention in TB/s", "attention past memory", "overhead in ns",
        "pcie past its generation"])
def test_a_figure_in_another_unit_is_warned_about_and_the_right_one_is_not(tmp_path, text, right, warning):
    assert warned(tmp_path / "t.yaml", text) == [warning]
    assert warned(tmp_path / "t.yaml", text.replace(*right)) == []


def test_nvlink_written_as_both_directions_is_warned_about(tmp_path):
    # NVIDIA's 900 GB/s for H100 counts both directions, a file's bw_gbps one: written as 900
    # beside its 18 NVLink 4 links (450 one way), NVLink transfers were planned twice as fast.
    topo = tmp_path / "nv.yaml"
    text = ("name: nv\nnode:\n  gpus: {count: 8, model: H100-SXM5-80GB, mem_bw_gbps: 3350, mem_gb: 80}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n"
            "  fabric: {kind: nvswitch, bw_gbps: 900, count: 18, generation: 4}\n")
    assert warned(topo, text) == [
        "warning: link n0.gpu0->n0.nvswitch (nvlink) has bw_gbps 900, more than its 18 NVLink 4 links move one way "
        "(450, 25 each); bw_gbps is one direction: 900 GB/s counts both (and 7 more)"]
    # Without the links' count and generation: over what any GPU's NVLinks move one way.
    assert warned(topo, text.replace("bw_gbps: 900, count: 18, generation: 4", "bw_gbps: 1800")) == [
        "warning: link n0.gpu0->n0.nvswitch (nvlink) has bw_gbps 1800, more than any GPU's NVLinks move one way "
        "(900, NVLink 5); bw_gbps is one direction: NVIDIA's figures count both (and 7 more)"]
    # Over the links' figure but not twice it (a calibration fitted NVLS as a ring): no unit to blame.
    assert warned(topo, text.replace("bw_gbps: 900", "bw_gbps: 474.4")) == [
        "warning: link n0.gpu0->n0.nvswitch (nvlink) has bw_gbps 474.4, more than its 18 NVLink 4 links move one way "
        "(450, 25 each) (and 7 more)"]
    for fabric in ("bw_gbps: 450, count: 18, generation: 4", "bw_gbps: 900, count: 18, generation: 5", "bw_gbps: 900"):
        assert warned(topo, text.replace("bw_gbps: 900, count: 18, generation: 4", fabric)) == [], fabric


def test_nvlink_under_its_lanes_figure_is_warned_about(tmp_path):
    # NVSwitch's bw_gbps is a GPU's links together: 25 (one link's) with count 18 planned H100's
    # NVLink at 1.4 GB/s, and count 36 (18 links, both directions) halved what one link carries.
    text = ("name: nv\nnode:\n  gpus: {count: 8, model: H100-SXM5-80GB, mem_bw_gbps: 3350, mem_gb: 80}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n"
            "  fabric: {kind: nvswitch, bw_gbps: 450, count: 18, generation: 4}\n")
    assert warned(tmp_path / "nv.yaml", text) == []
    assert warned(tmp_path / "nv.yaml", text.replace("bw_gbps: 450", "bw_gbps: 25")) == [
        "warning: link n0.gpu0->n0.nvswitch (nvlink) has bw_gbps 25 over 18 link(s), 1.39 a link, less than any "
        "NVLink 4 lane moves (25); bw_gbps is all its links together, one direction (18 NVLink 4 links: 450), and "
        "count the links, not both directions (and 7 more)"]
    assert "12.5 a link" in warned(tmp_path / "nv.yaml", text.replace("count: 18", "count: 36"))[0]
    # A40's NVLink 3 bridge: 4 links of 14.0625, the slowest lanes sold
    bridge = text.replace("nvswitch, bw_gbps: 450, count: 18, generation: 4",
                          "pairs, bw_gbps: 14.0625, generation: 3, pairs: [[0, 1, 4]]")
    assert warned(tmp_path / "nv.yaml", bridge) == []
    assert "less than any NVLink lane moves (14.0625)" in warned(
        tmp_path / "nv.yaml", bridge.replace("generation: 3, ", "").replace("14.0625", "1.4"))[0]


@pytest.mark.parametrize(("bw", "why"), [
    ("128", "more than one xGMI link moves one way (64 on MI300X); bw_gbps is one direction: AMD's figures count "
            "both"),
    ("448", "more than one xGMI link moves one way (64 on MI300X); bw_gbps is one GPU pair's, not a GPU's links "
            "together (or give count, the links joining the pair: MI250X's two dies, 4)"),
])
def test_xgmi_written_as_both_directions_or_a_gpus_links_is_warned_about(tmp_path, bw, why):
    # MI300X's full mesh: one 64 GB/s link a GPU pair; 128 (both directions) and 448 (a GPU's 7
    # links, as nvswitch's bw_gbps is a GPU's) planned xGMI two and seven times fast.
    text = ("name: mi\nnode:\n  gpus: {count: 8, model: MI300X, mem_bw_gbps: 5300, mem_gb: 192}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n  fabric: {kind: full-mesh, bw_gbps: 64}\n")
    assert warned(tmp_path / "mi.yaml", text) == []
    assert warned(tmp_path / "mi.yaml", text.replace("bw_gbps: 64", f"bw_gbps: {bw}")) == [
        f"warning: link n0.gpu0->n0.gpu1 (xgmi) has bw_gbps {bw}, {why} (and 27 more)"]


def test_nvlink_over_900_is_not_warned_about_where_its_links_or_generation_carry_it(tmp_path):
    # 36 NVLink 5 links (a switch trunk) move 1800 one way, and so does a GPU of a generation
    # after NVLink 5 (NVLink 6, 3.6 TB/s both ways): neither is a figure counting both directions.
    text = ("name: nv\nnode:\n  gpus: {count: 8, model: B200, mem_bw_gbps: 8000, mem_gb: 180}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n"
            "  fabric: {kind: nvswitch, bw_gbps: 1800, count: 36, generation: 5}\n")
    assert warned(tmp_path / "nv.yaml", text) == []
    # NVLink 6: no unit to blame, but no NCCL figure for its links either (the note says how they are rated)
    assert warned(tmp_path / "nv.yaml", text.replace("count: 36, generation: 5", "count: 18, generation: 6")) == [
        "warning: nv: NVLink generation 6 (link n0.gpu0->n0.nvswitch and 7 more) has no figure in treeattn's model of "
        "NCCL (NVLink 1-5 have): rated as NVLink 4"]


def test_a_link_generation_without_nccl_figures_is_warned_about(tmp_path):
    # generation 9 (a typo) was rated silently as NVLink 4, or by bw_gbps as PCIe 4
    text = ("name: gen\nnode:\n  gpus: {count: 2, model: H100-SXM5-80GB, mem_bw_gbps: 3350, mem_gb: 80}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n  fabric: {kind: nvswitch, bw_gbps: 450, generation: 4}\n")
    assert warned(tmp_path / "g.yaml", text) == []
    assert warned(tmp_path / "g.yaml", text.replace("generation: 5", "generation: 9").replace(
        "generation: 4", "generation: 7")) == [
        "warning: gen: NVLink generation 7 (link n0.gpu0->n0.nvswitch and 1 more) has no figure in treeattn's model "
        "of NCCL (NVLink 1-5 have): rated as NVLink 4; PCIe generation 9 (link n0.gpu0->n0.cpu0 and 1 more) has no "
        "figure in treeattn's model of NCCL (PCIe 1-6 have): rated by bw_gbps as PCIe 4"]
    # NCCL rates PCIe 1 and 2 (a VM's bridges read 2.5 GT/s) and NVLink 1 (P100): no note
    assert warned(tmp_path / "g.yaml", text.replace("generation: 5", "generation: 1").replace(
        "generation: 4", "generation: 1")) == []


@pytest.mark.parametrize(("was", "now", "warning"), [
    # ns written as us: 600 ns a switch hop is 0.6
    ("switch_latency_us: 0.6", "switch_latency_us: 600",
     "warning: link n0.nic0->leaf0 (infiniband) has latency_us 600, over 100 us for a port's hop to its switch "
     "(under 1 us in hardware); latency_us is microseconds (ns / 1000) (and 3 more)"),
    # TB written as GB: 80 GB is 0.08 TB
    ("mem_gb: 80", "mem_gb: 0.08",
     "warning: GPU n0.gpu0 has mem_gb 0.08, less than any GPU's memory; mem_gb is GiB: 0.08 TiB is 81.92 (and 3 "
     "more)"),
], ids=["switch hop in ns", "gpu memory in TB"])
def test_a_compact_files_figure_in_another_unit_is_warned_about(tmp_path, was, now, warning):
    text = ("name: c\nnodes: 2\nnode:\n  gpus: {count: 2, model: H100-SXM5-80GB, mem_bw_gbps: 3350, mem_gb: 80}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n  nics: {count: 2, bw_gbps: 50}\n"
            "network: {kind: infiniband, switch_latency_us: 0.6}\n")
    assert warned(tmp_path / "c.yaml", text) == []
    assert warned(tmp_path / "c.yaml", text.replace(was, now)) == [warning]


def test_a_calibrated_link_is_judged_by_its_rating(tmp_path):
    # calibrate writes what it fitted (here NVLS taken for a ring: 474 GB/s on 450 links) and
    # warns of it once; every later load would repeat it about a figure the hardware's rating holds.
    fitted = tmp_path / "fitted.yaml"
    log = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests" / "all_reduce_perf.8xh100-1node.txt"
    res = run_cli("calibrate", "--from-nccl-tests", str(log), "-t", "dgx-h100", "--out", str(fitted))
    assert res.exit_code == 0 and "above the 450 GB/s of n0.gpu0's nvlink link" in res.stderr, res.stderr
    text = fitted.read_text()
    assert re.search(r"kind: nvlink, bw_gbps: 474\.\d+, .*rated_gbps: 450\.0", text)
    assert warned(fitted, text) == []
    assert warned(fitted, text.replace("rated_gbps: 450.0", "rated_gbps: 900")) == [
        "warning: link n0.gpu0->n0.nvswitch (nvlink) has rated_gbps 900, more than its 18 NVLink 4 links move one "
        "way (450, 25 each); rated_gbps is one direction: 900 GB/s counts both (and 7 more)"]


def test_no_shipped_topology_or_family_holds_an_implausible_value():
    from treeattn.cost.nccl_rates import unrated_generation_note

    for spec in [*shipped_files(), *(f"{name}:" for name in FAMILIES)]:
        assert implausible(resolve(spec)) == [], spec
        assert unrated_generation_note(resolve(spec)) is None, spec


def test_a_link_slower_than_any_is_warned_about_and_times_stay_short(tmp_path):
    # bw_gbps: 1e-300 passed silently, and plan, simulate and compare printed times of some 300 digits.
    text = Path("topologies/emu-mesh.yaml").read_text().replace("bw_gbps: 0.025", "bw_gbps: 1e-300")
    topo = tmp_path / "slow.yaml"
    topo.write_text(text)
    res = run_cli("topo", "validate", str(topo))
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines() == ["warning: link h0->h1 (ethernet) has bw_gbps 1e-300, slower than any link "
                                       "(1e-06 is 1 kB/s); bw_gbps is GB/s (and 5 more)"], res.stderr
    plan = tmp_path / "p.yaml"
    for args in (("plan", "-t", str(topo), "-m", "llama-3.2-1b", "-n", "1K", "-o", str(plan), "--explain"),
                 ("simulate", str(plan)), ("compare", "-t", str(topo), "-m", "llama-3.2-1b", "-n", "1K")):
        res = run_cli(*args)
        assert res.exit_code == 0, res.stderr
        assert "e+300" in res.stdout and not re.search(r"\d{20}", res.stdout), (args, res.stdout)


def test_nics_left_idle_while_others_carry_every_rank_are_warned_about(tmp_path):
    # An explicit file with both NICs on the CPU, as near to each GPU as each other: every rank of
    # the node left through the first (the nearest, first of those as near), the second idle.
    def node(n: int, nic_fields: bool) -> str:
        out = [f"  - {{name: n{n}.cpu, kind: cpu, node: {n}}}"]
        for g in range(2):
            nic = f", nic: n{n}.nic{g}" if nic_fields else ""
            out.append(f"  - {{name: n{n}.gpu{g}, kind: gpu, node: {n}, model: H100-SXM5-80GB, "
                       f"mem_bw_gbps: 3350{nic}}}")
            out.append(f"  - {{name: n{n}.nic{g}, kind: nic, node: {n}}}")
        return "\n".join(out) + "\n"

    def links(n: int) -> str:
        out = [f"  - {{src: n{n}.gpu0, dst: n{n}.gpu1, kind: nvlink, bw_gbps: 450, count: 18, generation: 4, "
               "duplex: true}"]
        for g in range(2):
            out.append(f"  - {{src: n{n}.gpu{g}, dst: n{n}.cpu, kind: pcie, bw_gbps: 55, duplex: true}}")
            out.append(f"  - {{src: n{n}.nic{g}, dst: n{n}.cpu, kind: pcie, bw_gbps: 55, duplex: true}}")
            out.append(f"  - {{src: n{n}.nic{g}, dst: leaf, kind: infiniband, bw_gbps: 50, duplex: true}}")
        return "\n".join(out) + "\n"

    def text(nic_fields: bool) -> str:
        return ("name: flat\ndevices:\n" + node(0, nic_fields) + node(1, nic_fields)
                + "  - {name: leaf, kind: switch, node: -1, tier: leaf}\nlinks:\n" + links(0) + links(1))

    assert warned(tmp_path / "flat.yaml", text(False)) == [
        "warning: flat: 4 ranks send over the network through 2 NIC(s) while 2 carry none (n0.nic1, n1.nic1): a "
        "rank's traffic leaves through its device's nic, else the nearest NIC over PCIe, the first of those as near; "
        "give each GPU its nic (explicit form: a device's nic field) to spread them"]
    assert warned(tmp_path / "flat.yaml", text(True)) == []


@pytest.mark.parametrize(("fabric", "model", "said"), [
    ("{kind: full-mesh, bw_gbps: 64, link: nvlink}", "MI300X",
     "nvlink is NVIDIA's link, and MI300X is AMD's: its GPUs talk over xgmi"),
    ("{kind: full-mesh, bw_gbps: 64, link: xgmi}", "L40S", "xgmi is AMD's link, and L40S is NVIDIA's: its GPUs talk "
                                                            "over nvlink"),
])
def test_another_vendors_gpu_link_is_warned_about(tmp_path, fabric, model, said):
    # MI300X joined by nvlink was timed as NCCL on NVLink, not RCCL on xGMI, without a word
    text = (f"name: v\nnode:\n  gpus: {{count: 4, model: {model}, mem_bw_gbps: 5300, mem_gb: 192}}\n"
            f"  pcie: {{generation: 5, bw_gbps: 55}}\n  fabric: {fabric}\n")
    (line,) = warned(tmp_path / "v.yaml", text)
    assert line.endswith(f"): {said} (and 5 more)"), line


def test_a_nic_no_rank_was_given_is_not_warned_about(tmp_path):
    # 4 compute NICs, each named by its GPUs' nic, and a storage NIC on its own switch: nothing to spread
    devices = ["  - {name: cpu, kind: cpu}", "  - {name: snic, kind: nic}", "  - {name: store, kind: switch}",
               "  - {name: leaf, kind: switch, tier: leaf}"]
    links = ["  - {src: snic, dst: cpu, kind: pcie, bw_gbps: 25, duplex: true}",
             "  - {src: snic, dst: store, kind: infiniband, bw_gbps: 25, duplex: true}"]
    for k in range(4):
        devices.append(f"  - {{name: nic{k}, kind: nic}}")
        links += [f"  - {{src: nic{k}, dst: cpu, kind: pcie, bw_gbps: 25, duplex: true}}",
                  f"  - {{src: nic{k}, dst: leaf, kind: infiniband, bw_gbps: 25, duplex: true}}"]
        for g in (2 * k, 2 * k + 1):
            devices.append(f"  - {{name: g{g}, kind: gpu, mem_bw_gbps: 2000, model: A100-SXM4-80GB, nic: nic{k}}}")
            links.append(f"  - {{src: g{g}, dst: cpu, kind: pcie, bw_gbps: 25, duplex: true}}")
    text = "name: s\ndevices:\n" + "\n".join(devices) + "\nlinks:\n" + "\n".join(links) + "\n"
    assert warned(tmp_path / "s.yaml", text) == []


def test_a_nic_the_nearest_rule_crowds_beside_a_named_rank_is_warned_about(tmp_path):
    # g0 names nic0; g1 names none and the nearest rule put it on nic0 too, nic1 idle
    text = ("name: p\ndevices:\n  - {name: cpu, kind: cpu}\n  - {name: leaf, kind: switch, tier: leaf}\n"
            "  - {name: nic0, kind: nic}\n  - {name: nic1, kind: nic}\n"
            "  - {name: g0, kind: gpu, mem_bw_gbps: 3350, model: H100-SXM5-80GB, nic: nic0}\n"
            "  - {name: g1, kind: gpu, mem_bw_gbps: 3350, model: H100-SXM5-80GB}\nlinks:\n"
            + "".join(f"  - {{src: {d}, dst: cpu, kind: pcie, bw_gbps: 55, duplex: true}}\n"
                      for d in ("nic0", "nic1", "g0", "g1"))
            + "".join(f"  - {{src: nic{k}, dst: leaf, kind: infiniband, bw_gbps: 50, duplex: true}}\n" for k in (0, 1)))
    (line,) = warned(tmp_path / "p.yaml", text)
    assert line.startswith("warning: p: 2 ranks send over the network through 1 NIC(s) while 1 carry none (nic1)"), line
    spread = text.replace("model: H100-SXM5-80GB}", "model: H100-SXM5-80GB, nic: nic1}")
    assert warned(tmp_path / "p.yaml", spread) == []


def test_a_name_with_a_newline_or_a_tab_is_refused(tmp_path):
    # "l40s\nevil" was taken, and validate's one line became two
    path = tmp_path / "nl.yaml"
    for text, said in (('name: "l40s\\nevil"\nnode:\n  gpus: {count: 2, model: L40S, mem_bw_gbps: 864, mem_gb: 48}\n'
                        '  pcie: {bw_gbps: 25}\n',
                        f":1: name: {ONE_LINE}, got 'l40s\\nevil'"),
                       ('family: dgx-h100\nname: "a\\tb"\n',
                        f":2: name: {ONE_LINE}, got 'a\\tb'")):
        path.write_text(text)
        res = run_cli("topo", "validate", str(path))
        assert res.exit_code == 2 and res.stderr.splitlines() == [f"error: {path}{said}"], res.stderr
