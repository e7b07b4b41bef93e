"""Topology files: the three forms, dump/load, patterns, and error messages."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeattn.errors import TopologyError
from treeattn.topology import build_family, compact, dump_topology, families, load_topology, load_topology_text, resolve
from treeattn.topology.compact import build_compact
from treeattn.topology.families import parse_family_spec
from treeattn.topology.io import expand_ranks, topology_from_data
from treeattn.topology.library import shipped_files
from treeattn.topology.model import MAX_DEVICES, MAX_LINKS, CostParams, Device, DeviceKind, HostParams, Topology
from treeattn.topology.schema import CompactFile, FieldError

# Shipped file -> family spec describing the same machine.
SAME_MACHINE = {
    "dgx-h100": "dgx-h100",
    "dgx-h100-2node": "dgx-h100:nodes=2",
    "dgx-h100-16node": "dgx-h100:nodes=16",
    "hgx-h200": "hgx-h200",
    "dgx-a100": "dgx-a100",
    "mi300x-8": "mi300x",
    "mi300x-4": "mi300x:gpus=4",
    "rtx4090-2": "rtx4090:gpus=2",
    "rtx4090-8": "rtx4090:gpus=8",
    "gb200-nvl72": "gb200-nvl72",
    "cpu-4": "cpu:ranks=4,cores=2",
}

# The DGX-1 of topologies/dgx1-v100.yaml (explicit form), written in the compact form.
DGX1_COMPACT = {
    "name": "dgx1-compact",
    "node": {
        "gpus": {"count": 8, "model": "V100-SXM2-32GB", "mem_bw_gbps": 900, "mem_gb": 32},
        "cpus": {"count": 2, "model": "Xeon-E5-2698-v4", "link": {"kind": "upi", "bw_gbps": 6, "latency_us": 0.5}},
        "pcie": {"generation": 3, "width": 16, "bw_gbps": 12, "latency_us": 0.5, "switches": 4},
        "fabric": {
            "kind": "pairs", "bw_gbps": 25, "generation": 2, "latency_us": 0.6,
            "pairs": [[0, 1, 1], [0, 2, 1], [0, 3, 2], [0, 4, 2], [1, 2, 2], [1, 3, 1], [1, 5, 2], [2, 3, 2],
                      [2, 6, 1], [3, 7, 1], [4, 5, 1], [4, 6, 1], [4, 7, 2], [5, 6, 2], [5, 7, 1], [6, 7, 2]],
        },
        "nics": {"count": 4, "model": "ConnectX-4-EDR", "bw_gbps": 12.5},
    },
}


@pytest.mark.parametrize("name", sorted(SAME_MACHINE))
def test_shipped_file_matches_its_family(name):
    assert resolve(name).fingerprint == resolve(SAME_MACHINE[name]).fingerprint


def test_explicit_and_compact_dgx1_are_the_same_machine():
    explicit = resolve("dgx1-v100")
    compact = topology_from_data(DGX1_COMPACT)
    assert explicit.fingerprint == compact.fingerprint
    assert explicit.name != compact.name  # names and descriptions do not enter the fingerprint


def test_fingerprint_ignores_listing_order_but_not_figures():
    t = resolve("dgx-h100-2node")
    rng = random.Random(1)
    devices, links = list(t.devices), list(t.links)
    rng.shuffle(devices)
    rng.shuffle(links)
    shuffled = dataclasses.replace(t, devices=devices, links=links)
    assert shuffled.fingerprint == t.fingerprint
    slower = dataclasses.replace(t, links=[dataclasses.replace(links[0], bw_gbps=1.0), *links[1:]])
    assert slower.fingerprint != t.fingerprint
    assert dataclasses.replace(t, ranks=t.ranks[::-1]).fingerprint != t.fingerprint
    measured = dataclasses.replace(t, cost=dataclasses.replace(t.cost, link_rates="measured"))
    rated = dataclasses.replace(measured, links=[dataclasses.replace(links[0], rated_gbps=links[0].bw_gbps),
                                                 *links[1:]])
    assert rated.fingerprint != measured.fingerprint


MEASURED_PAIR = """
name: two
cost: {link_rates: measured}
devices:
  - {name: c, kind: cpu}
  - {name: g0, kind: gpu, mem_bw_gbps: 10}
  - {name: g1, kind: gpu, mem_bw_gbps: 10}
links:
  - {src: g0, dst: c, kind: pcie, bw_gbps: 4, latency_us: 3, rated_gbps: 5, rated_latency_us: 1, duplex: true}
  - {src: g1, dst: c, kind: pcie, bw_gbps: 5, duplex: true}
"""
"""Two GPUs under one CPU, rates measured, g0's links keeping their ratings."""


def test_a_measured_link_keeps_its_rating_through_yaml():
    text = MEASURED_PAIR
    t = load_topology_text(text)
    assert (t.links[0].rated_gbps, t.links[0].rated_latency_us) == (5, 1)
    back = load_topology_text(dump_topology(t))
    assert back.to_dict() == t.to_dict() and back.fingerprint == t.fingerprint
    assert (t.route_bw_gbps(0, 1), t.rated.route_bw_gbps(0, 1)) == (4, 5)
    assert (t.route_latency_us(0, 1), t.rated.route_latency_us(0, 1)) == (3, 1)
    with pytest.raises(TopologyError, match=r"links\[0\]\.rated_gbps"):
        load_topology_text(text.replace("rated_gbps: 5", "rated_gbps: 0"))
    with pytest.raises(TopologyError, match="rated_latency_us must be >= 0"):
        dataclasses.replace(t.links[0], rated_latency_us=-1.0)
    with pytest.raises(TopologyError, match=r"links\[0\] \(g0->c\): a rating .* not measured"):
        dataclasses.replace(t, cost=dataclasses.replace(t.cost, link_rates="datasheet"))


def test_a_fitted_mark_goes_through_yaml_and_only_on_measured_rates():
    text = MEASURED_PAIR.replace("latency_us: 3, rated_gbps: 5, rated_latency_us: 1,", "rated_gbps: 5, fitted: true,")
    t = load_topology_text(text)
    assert t.fitted_links == {0, 1} and t.links[0].to_dict()["fitted"] is True and "fitted" not in t.links[2].to_dict()
    back = load_topology_text(dump_topology(t))
    assert back.to_dict() == t.to_dict() and back.fingerprint == t.fingerprint
    assert t.rated.fitted_links == frozenset() and not any(ln.fitted for ln in t.rated.links)
    # written before the mark: a measured topology that marks no link had every rate fitted
    legacy = load_topology_text(text.replace(", fitted: true", ""))
    assert legacy.fitted_links == {0, 1, 2, 3} and legacy.fingerprint != t.fingerprint
    with pytest.raises(TopologyError, match=r"links\[0\]\.fitted: .* fitted marks a measured rate"):
        load_topology_text(text.replace("cost: {link_rates: measured}", "cost: {}").replace(" rated_gbps: 5,", ""))
    with pytest.raises(TopologyError, match=r"links\[0\]\.fitted"):
        load_topology_text(text.replace("fitted: true", "fitted: maybe"))


@pytest.mark.parametrize("name", sorted(shipped_files()))
def test_dump_load_round_trip_of_every_shipped_file(name):
    t = resolve(name)
    text = dump_topology(t)
    back = load_topology_text(text)
    assert back.to_dict() == t.to_dict()
    assert back.fingerprint == t.fingerprint
    assert dump_topology(back) == text  # deterministic


def test_dump_writes_duplex_pairs_once():
    t = resolve("mi300x-8")
    data = yaml.safe_load(dump_topology(t))
    assert all(ln.get("duplex") for ln in data["links"])
    assert 2 * len(data["links"]) == len(t.links)


def test_family_file_form_with_overrides(tmp_path):
    p = tmp_path / "fam.yaml"
    p.write_text("family: mi300x\nparams: {gpus: 4, nodes: 2}\nname: my-mi300x\nsources: [mine]\n"
                 "cost: {overhead_us: 9}\n")
    t = load_topology(p)
    assert t.name == "my-mi300x" and t.num_ranks == 8 and t.sources[-1] == "mine" and t.cost.overhead_us == 9
    family = resolve("mi300x:gpus=4,nodes=2")
    assert dataclasses.replace(t, cost=family.cost).fingerprint == family.fingerprint
    assert t.cost == family.cost.updated(overhead_us=9)  # the terms left out keep the family's values


def test_a_family_files_cost_terms_override_the_familys_one_by_one(tmp_path):
    p = tmp_path / "fam.yaml"
    p.write_text("family: dgx-h100\ncost: {launch_us: 3, attn_efficiency: 0.6}\n")
    t, family = load_topology(p), resolve("dgx-h100:")
    assert (t.cost.launch_us, t.cost.attn_efficiency) == (3, 0.6)
    assert t.cost.attn_launch_us == family.cost.attn_launch_us == 12.4
    assert t.cost == family.cost.updated(launch_us=3.0, attn_efficiency=0.6)


def test_rank_patterns():
    assert expand_ranks("n{0..1}.gpu{0..2}") == ["n0.gpu0", "n0.gpu1", "n0.gpu2", "n1.gpu0", "n1.gpu1", "n1.gpu2"]
    assert expand_ranks("host0*3") == ["host0"] * 3
    assert expand_ranks("gpu7") == ["gpu7"]
    with pytest.raises(ValueError):
        expand_ranks("gpu{3..1}")


@pytest.mark.parametrize("entry", ["g{0..99999999}", "h*9999999999", "n{0..9999}.g{0..9999}"])
def test_a_rank_pattern_past_the_limit_is_refused_before_it_expands(entry):
    # Expanded first, these would take minutes and gigabytes (or a MemoryError) before the
    # topology's rank limit refused them: they are counted first.
    with pytest.raises(TopologyError, match="above treeattn's limit of 16,384 ranks"):
        expand_ranks(entry)
    text = f"name: x\ndevices:\n  - {{name: h, kind: host, mem_bw_gbps: 1}}\nranks: ['{entry}']\n"
    with pytest.raises(TopologyError, match=r"^<t>:4: ranks\[0\]: pattern '.*': [\d,]+ ranks, above treeattn's limit"):
        load_topology_text(text, source="<t>")
    many = "name: x\ndevices:\n  - {name: h, kind: host, mem_bw_gbps: 1}\nranks: ['h*9000', 'h*9000']\n"
    with pytest.raises(TopologyError, match=r"^<t>:4: ranks\[1\]: ranks\[0\.\.1\]: 18,000 ranks, above"):
        load_topology_text(many, source="<t>")


def test_every_rank_limit_reads_the_same():
    # One check (model.check_rank_count) behind the topology, a rank pattern and the total of
    # a file's patterns: the same sentence, the same README pointer.
    host = "name: x\ndevices:\n  - {name: h, kind: host, mem_bw_gbps: 1}\n"
    errors = []
    for text in (host + "ranks: ['h*20000']\n", host + "ranks: ['h*9000', 'h*9000']\n",
                 "name: x\nnodes: 3000\nnode:\n  gpus: {count: 8, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
                 "  nics: {count: 8, bw_gbps: 1}\nnetwork: {}\n"):
        with pytest.raises(TopologyError) as info:
            load_topology_text(text, source="<t>")
        errors.append(str(info.value))
    with pytest.raises(TopologyError) as info:
        Topology(name="t", devices=[Device("h", DeviceKind.HOST)], links=[], ranks=["h"] * 20_000)
    errors.append(str(info.value))
    assert all(" ranks, above treeattn's limit of 16,384 ranks (README, 'Scale')" in e for e in errors), errors


_NODE = "  gpus: {count: 8, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1, switches: 8}\n  nics: {count: 8, bw_gbps: 1}\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("name: x\nnodes: 2\nnode:\n" + _NODE.replace("switches: 8", "switches: 1000000000") + "network: {}\n",
     "<t>:5: node.pcie.switches: 1,000,000,000 PCIe switches per node in 2 nodes: 2,000,000,035 devices, above "
     "treeattn's limit of 1,000,000 devices (README, 'Scale')"),
    ("name: x\nnode:\n" + _NODE + "  cpus: {count: 1000000000}\n",
     "<t>:6: node.cpus.count: 1,000,000,000 CPU sockets per node in 1 node: 1,000,000,024 devices, above"),
    ("name: x\nnode:\n" + _NODE + "  cpus: {count: 2000, link: {bw_gbps: 1}}\n",
     "<t>:6: node.cpus.count: 2,000 CPU sockets per node in 1 node: 3,998,048 links, above treeattn's limit of "
     "1,000,000 links"),
    ("name: x\nnodes: 2\nnode:\n" + _NODE + "network: {spines: 1000000000}\n",
     "<t>:7: network.spines: 1,000,000,000 spine switches over 1 leaf switch: 1,000,000,051 devices, above"),
    ("name: x\nnode:\n  gpus: {count: 2000, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
     "  fabric: {kind: full-mesh, bw_gbps: 1}\n",
     "<t>:3: node.gpus.count: 2,000 GPUs per node in a full mesh in 1 node: 4,002,000 links, above"),
    ("family: dgx-h100\nparams:\n  nodes: 2\n  spines: 1000000000\n",
     "<t>:4: params.spines: family dgx-h100: 1,000,000,000 spine switches over 8 leaf switches: 1,000,000,062 "
     "devices, above treeattn's limit of 1,000,000 devices (README, 'Scale')"),
    ("family: gb200-nvl72\nparams: {racks: 1000}\n",
     "<t>:2: params.racks: family gb200-nvl72: 18,000 nodes of 4 GPUs: 72,000 ranks, above"),
    ("family: cpu\nparams: {ranks: 100000}\n", "<t>:2: params.ranks: family cpu: ranks=100000: 100,000 ranks"),
])
def test_sizes_above_the_limits_are_refused_before_anything_is_built(text, expected):
    # Counted, not built: building a billion PCIe switches takes minutes and gigabytes.
    started = time.perf_counter()
    with pytest.raises(TopologyError) as info:
        load_topology_text(text, source="<t>")
    assert time.perf_counter() - started < 5
    assert str(info.value).startswith(expected), str(info.value)


def test_gpus_are_shared_out_over_nics_in_one_pass():
    spec = CompactFile.model_validate({"name": "x", "node": {"gpus": {"count": 16_384, "mem_bw_gbps": 1},
                                       "pcie": {"bw_gbps": 1}, "nics": {"count": 16_384, "bw_gbps": 1}}})
    started = time.perf_counter()
    owner, served = compact._nic_of_gpu(spec)  # a scan of every GPU per NIC: 268 million steps, half a minute
    assert time.perf_counter() - started < 3
    assert owner == list(range(16_384)) and served[5] == [5]
    small = CompactFile.model_validate({"name": "x", "node": {"gpus": {"count": 8, "mem_bw_gbps": 1},
                                        "pcie": {"bw_gbps": 1}, "nics": {"count": 3, "bw_gbps": 1}}})
    assert compact._nic_of_gpu(small)[1] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_a_family_spec_above_the_limits_names_its_parameter():
    with pytest.raises(FieldError) as info:
        build_family("dgx-h100", {"nodes": "2", "spines": "1000000000"})
    assert info.value.loc == ("params", "spines") and "1,000,000,062 devices" in info.value.message
    with pytest.raises(FieldError) as info:
        build_family("dgx-h100", {"nodes": "3", "spines": "0"})
    assert info.value.loc == ("params", "spines") and "need at least one spine" in info.value.message


@pytest.mark.parametrize("family, params", [
    ("dgx-h100", {"nodes": 3, "fabric": "fat-tree", "nics_per_leaf": 5}), ("dgx-a100", {"nodes": 4, "spines": 3}),
    ("mi300x", {"nodes": 3, "gpus": 4, "oversubscription": 2.5}), ("rtx4090", {"gpus": 2}), ("rtx4090", {}),
    ("gb200-nvl72", {"racks": 2}), ("hgx-h200", {"nodes": 40, "nics_per_leaf": 3}),
])
def test_the_size_counted_before_building_is_the_size_built(family, params, monkeypatch):
    counted = []
    real = compact._size_parts
    monkeypatch.setattr(compact, "_size_parts", lambda spec: counted.append(real(spec)) or counted[-1])
    t = build_family(family, params)
    assert sum(p[2] for p in counted[0]) == len(t.devices) and sum(p[3] for p in counted[0]) == len(t.links)


@pytest.mark.parametrize("spec", ["dgx-h100:nodes=2048", "mi300x:nodes=2048", "gb200-nvl72:racks=227",
                                  "dgx-a100:nodes=2048,nics_per_leaf=1,fabric=fat-tree"])
def test_the_largest_families_within_the_rank_limit_fit_the_device_and_link_limits(spec, monkeypatch):
    counted = []
    monkeypatch.setattr(families, "build_compact", lambda s: counted.append(compact._size_parts(s)))
    build_family(*parse_family_spec(spec))
    assert sum(p[2] for p in counted[0]) <= MAX_DEVICES and sum(p[3] for p in counted[0]) <= MAX_LINKS


def test_numbers_in_exponent_form_load():
    # PyYAML reads YAML 1.1, where 1e3 (no dot, no sign) is text: it still reads as a number.
    t = load_topology_text("name: x\ndevices:\n  - {name: g, kind: gpu, mem_bw_gbps: 1e3}\n"
                           "  - {name: h, kind: gpu, mem_bw_gbps: 1.0e+3}\n"
                           "links:\n  - {src: g, dst: h, kind: pcie, bw_gbps: 25e0, duplex: true}\n")
    assert [d.mem_bw_gbps for d in t.devices] == [1000.0, 1000.0] and t.links[0].bw_gbps == 25.0


def test_explicit_defaults_put_one_rank_on_every_gpu():
    text = """
name: two
devices:
  - {name: c, kind: cpu}
  - {name: g1, kind: gpu, mem_bw_gbps: 10}
  - {name: g0, kind: gpu, mem_bw_gbps: 10}
links:
  - {src: g0, dst: c, kind: pcie, bw_gbps: 5, duplex: true}
  - {src: g1, dst: c, kind: pcie, bw_gbps: 5, duplex: true}
"""
    t = load_topology_text(text)
    assert t.ranks == ("g1", "g0") and len(t.links) == 4
    assert t.link_index("c", "g0") == 1


_NICS = """name: x
devices:
  - {{name: c, kind: cpu, node: 0}}
  - {{name: g0, kind: gpu, node: 0, mem_bw_gbps: 1, nic: n0}}
  - {{name: g1, kind: gpu, node: 0, mem_bw_gbps: 1, {gpu1}}}
  - {{name: n0, kind: nic, node: 0}}
  - {{name: n1, kind: nic, node: 1}}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\ndevices:\n  - {name: g, kind: gpu, mem_bw_gbps: 1}\nranks: [g, g]\n",
         "ranks: GPU 'g' holds two ranks"),
        ("name: x\ndevices:\n  - {name: g, kind: gpu}\n", "<t>:3: devices[0].mem_bw_gbps: GPU 'g' needs"),
        ("name: x\ndevices:\n  - {name: g, kind: gpu, mem_bw_gbps: 1}\nlinks:\n"
         "  - {src: g, dst: g, kind: pcie, bw_gbps: 1}\n", "<t>:5: links[0]: link g->g: only a loopback"),
        ("name: x\ndevices:\n  - {name: g, kind: gpu, mem_bw_gbps: 1}\n  - {name: c, kind: cpu}\nlinks:\n"
         "  - {src: g, dst: c, kind: pcie, bw_gbps: 1, duplex: true}\n  - {src: c, dst: g, kind: pcie, bw_gbps: 2}\n",
         "<t>:7: links[1]: repeats c->g (also links[0])"),
        ("- a\n- b\n", "<t>:1: the top level must be a mapping"),
        ("name: x\ndevices:\n  - {name: g, kind: gpu, mem_bw_gbps: true}\n",
         "<t>:3: devices[0].mem_bw_gbps: input should be a number, not true"),
        ("name: x\ndevices:\n  - {name: g, kind: gpu, mem_bw_gbps: 1}\n  - {name: c, kind: cpu}\nlinks:\n"
         "  - {src: g, dst: c, kind: pcie, bw_gbps: 1, count: false}\n", "<t>:6: links[0].count: input should be a "
         "number, not false"),
        ("name: x\nnode: {gpus: {count: 2, mem_bw_gbps: 1}, pcie: {bw_gbps: 1}, fabric: {kind: nvswitch}}\n",
         "<t>:2: node.fabric.bw_gbps: a nvswitch fabric needs bw_gbps"),
        ("name: x\nnodes: 3\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
         "  fabric: {kind: nvswitch, bw_gbps: 9, nodes_per_domain: 2}\n  nics: {count: 1, bw_gbps: 1}\n"
         "network: {}\n", "<t>:2: nodes: 3 nodes do not fill NVLink domains of 2 nodes"),
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
         "  nics: {count: 2, bw_gbps: 1, gpus: [[0], [5]]}\n", "<t>:5: node.nics.gpus[1][0]: GPU 5 does not exist"),
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\nnetwork: {kind: roce}\n",
         "<t>:5: network: a network needs node.nics"),
        ("family: dgx-h100\nname: ''\n", "<t>:2: name: string should have at least 1 character"),
        # A fabric without its kind is kind none: its NVLink figures would be dropped unsaid.
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
         "  fabric: {bw_gbps: 450, count: 18}\n", "<t>:5: node.fabric.bw_gbps: given, but fabric.kind is none"),
        # Each link of the compact form has the kinds its role routes as; another would build a
        # topology routed as something else, or one refused as unroutable without naming the field.
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
         "  fabric: {kind: nvswitch, bw_gbps: 9, link: pcie}\n",
         "<t>:5: node.fabric.link: unknown value 'pcie'; choose one of 'nvlink' or 'xgmi'"),
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n"
         "  cpus: {count: 2, link: {kind: nvlink, bw_gbps: 9}}\n",
         "<t>:5: node.cpus.link.kind: unknown value 'nvlink'; choose one of 'upi' or 'infinity-fabric'"),
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1, host_link: {kind: nvlink, bw_gbps: 9}}\n"
         "  pcie: {bw_gbps: 1}\n",
         "<t>:3: node.gpus.host_link.kind: unknown value 'nvlink'; choose one of 'pcie' or 'c2c'"),
        # A device's nic is where routing sends its cross-node traffic: only a nic of its own
        # node will do, and only gpu and host devices send through one.
        (_NICS.format(gpu1="nic: g1"), "<t>:5: devices[2].nic: 'g1' is a gpu, not a nic"),
        (_NICS.format(gpu1="nic: n1"), "<t>:5: devices[2].nic: nic 'n1' is on node 1 and 'g1' on node 0; a device "
         "sends through a nic of its own node"),
        (_NICS.format(gpu1="nic: nic0"), "<t>:5: devices[2].nic: unknown device 'nic0' (did you mean 'n0'?)"),
        (_NICS.format(gpu1="").replace("kind: cpu, node: 0}", "kind: cpu, node: 0, nic: n0}"),
         "<t>:3: devices[0].nic: 'c' is a cpu; only gpu and host devices send through a nic"),
        # tier places a network switch (leaf, spine, core); on another device it was kept unsaid.
        (_NICS.format(gpu1="").replace("kind: nic, node: 0}", "kind: nic, node: 0, tier: leaf}"),
         "<t>:6: devices[3].tier: 'n0' is a nic; tier (leaf) is for network switches (kind: switch)"),
        (_NICS.format(gpu1="tier: spine"),
         "<t>:5: devices[2].tier: 'g1' is a gpu; tier (spine) is for network switches (kind: switch)"),
        # A family's parameters are typed: the family's name leads the error.
        ("family: dgx-h100\nparams:\n  nodes: x\n", "<t>:3: params.nodes: family dgx-h100: nodes must be an "
         "integer >= 1 (got 'x')"),
        ("family: mi300x\nparams: {oversubscription: fast}\n", "<t>:2: params.oversubscription: family mi300x: "
         "oversubscription must be a finite number >= 1 (got 'fast')"),
        # An unknown parameter names the family once, not twice.
        ("family: mi300x\nparams: {nodes: 4, nic_gbps: 50}\n", "<t>:2: params.nic_gbps: family mi300x has no "
         "parameter 'nic_gbps'; parameters: gpus, nodes, fabric, nics_per_leaf, spines, oversubscription"),
        # The choices of a field typed as some enum members read as a file spells them.
        ("name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 1}\n  pcie: {bw_gbps: 1}\n  nics: {count: 1, bw_gbps: 1}\n"
         "network: {kind: infinband}\n",
         "<t>:6: network.kind: unknown value 'infinband'; choose one of 'infiniband', 'roce' or 'ethernet'"),
    ],
)
def test_semantic_errors_name_line_and_field(text, expected):
    with pytest.raises(TopologyError) as info:
        load_topology_text(text, source="<t>")
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


# -- property: any compact spec builds, dumps and loads back to the same topology -------------------


@st.composite
def compact_specs(draw):
    gpus = draw(st.integers(1, 6))
    sockets = draw(st.integers(1, 2))
    fabric_kind = draw(st.sampled_from(["none", "nvswitch", "full-mesh", "pairs"]))
    fabric: dict = {"kind": fabric_kind}
    if fabric_kind != "none":
        fabric["bw_gbps"] = draw(st.sampled_from([25.0, 64.0, 450.0]))
    if fabric_kind == "pairs":
        all_pairs = [(a, b) for a in range(gpus) for b in range(a + 1, gpus)]
        chosen = draw(st.lists(st.sampled_from(all_pairs), unique=True, max_size=6)) if all_pairs else []
        fabric["pairs"] = [[a, b, draw(st.integers(1, 3))] for a, b in chosen]
    nodes = draw(st.integers(1, 3))
    node: dict = {
        "gpus": {"count": gpus, "mem_bw_gbps": 1000.0, "p2p": draw(st.booleans())},
        "cpus": {"count": sockets, **({"link": {"bw_gbps": 10.0}} if sockets > 1 else {})},
        "pcie": {"bw_gbps": draw(st.sampled_from([12.0, 25.0, 55.0])), "switches": draw(st.integers(0, min(3, gpus)))},
        "fabric": fabric,
    }
    spec: dict = {"name": "random", "nodes": nodes, "node": node}
    if nodes > 1 or draw(st.booleans()):
        node["nics"] = {"count": draw(st.integers(1, gpus)), "bw_gbps": 50.0}
        spec["network"] = {
            "topology": draw(st.sampled_from(["rail-optimized", "fat-tree"])),
            "nics_per_leaf": draw(st.integers(1, 8)),
            "oversubscription": draw(st.sampled_from([1, 2, 3.5])),
        }
    return spec


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compact_specs())
def test_compact_specs_round_trip_through_the_explicit_form(spec):
    t = topology_from_data(spec)
    assert t.num_ranks == spec["nodes"] * spec["node"]["gpus"]["count"]
    assert build_compact(CompactFile.model_validate(spec)).fingerprint == t.fingerprint
    back = load_topology_text(dump_topology(t))
    assert back.to_dict() == t.to_dict() and back.fingerprint == t.fingerprint
    for r in range(1, t.num_ranks):
        assert back.route(0, r) == t.route(0, r)


def test_family_names_carry_non_default_parameters():
    assert build_family("dgx-h100").name == "dgx-h100"
    assert build_family("dgx-h100", {"nodes": "2", "fabric": "rail-optimized"}).name == "dgx-h100:nodes=2"
    assert resolve("dgx-h100:nodes=3") is resolve("dgx-h100:nodes=3")  # family members are cached


_VARIANTS = {"overhead_us": 3.0, "launch_us": 6.0, "mem_efficiency": 0.5, "host_cores": 2, "cpu_us": 10.0,
             "cpu_scope": "machine", "cpu_queue": "fifo", "coll_cpu_us": 5.0, "step_us": 7.0, "wakeup_us": 9.0,
             "start_cpu_us": 11.0, "cpu_us_per_kb": 0.5, "attn_launch_us": 13.0, "attn_gbps": 2.0,
             "attn_next_launch_us": 3.0, "attn_efficiency": 0.5, "link_rates": "measured",
             "nccl_version": "2.26.2", "shm_gbps": 12.0, "p2p_level": "SYS"}


@pytest.mark.parametrize("base", [CostParams(), CostParams.from_flat(host_cores=2, cpu_us=5.0)], ids=["bare", "host"])
@pytest.mark.parametrize("field", sorted(_VARIANTS))
def test_a_cost_term_that_changes_a_prediction_changes_the_fingerprint(base, field):
    from treeattn.cost.simulate import simulate
    from treeattn.plan.builders import build
    from treeattn.workload import Workload

    host_fields = {f.name for f in dataclasses.fields(HostParams)}
    assert set(_VARIANTS) == {f.name for f in dataclasses.fields(CostParams)} - {"host"} | host_fields
    cpu = resolve("cpu:ranks=4,cores=2")
    changed = base.updated(**{field: _VARIANTS[field]})
    one, other = (dataclasses.replace(cpu, cost=c) for c in (base, changed))
    w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=16, split=(256,) * 4)
    # Ring attention computes several times a rank (later launches); the three all-reduces are collectives.
    plans = [build(name, w, one) for name in ("ring-attention", "allreduce3", "binomial")]
    times = [[simulate(p, t).predicted_us for p in plans] for t in (one, other)]
    if times[0] != times[1]:
        assert one.fingerprint != other.fingerprint, f"{field} changes predictions but not the fingerprint"


@pytest.mark.parametrize("field, value, want", [
    ("nics: {count: 8, bw_gbps: X}", "400Gbps", "node.nics.bw_gbps: must be a number of GB/s, without its unit "
                                                "(got '400Gbps': write 50)"),
    ("nics: {count: 8, bw_gbps: X}", "50 GB/s", "(got '50 GB/s': write 50)"),
    ("nics: {count: 8, bw_gbps: X}", "1.6Tb/s", "(got '1.6Tb/s': write 200)"),
    ("gpus: {count: 8, mem_bw_gbps: 3350, mem_gb: X}", "80GiB", "node.gpus.mem_gb: must be a number of GiB, "
                                                               "without its unit (got '80GiB': write 80)"),
    ("network: {switch_latency_us: X}", "600ns", "network.switch_latency_us: must be a number of microseconds, "
                                                 "without its unit (got '600ns': write 0.6)"),
    ("network: {switch_latency_us: X}", "1.5\u03bcs", "(got '1.5\u03bcs': write 1.5)"),  # Greek mu, as typed
    ("nics: {count: 8, bw_gbps: X}", "400gbps", "(got '400gbps': write 50)"),
    # a GPU's "80GB" is binary: an H100 80GB holds the 80 GiB mem_gb: 80 says
    ("gpus: {count: 8, mem_bw_gbps: 3350, mem_gb: X}", "80GB", "(got '80GB': write 80)"),
    # a port's "400G" or "400Gb": 'unable to parse string'; the letter alone does not say bits or bytes
    ("nics: {count: 8, bw_gbps: X}", "400Gb", "(got '400Gb': write 50)"),
    ("nics: {count: 8, bw_gbps: X}", "400G", "(got '400G': 400 Gb/s is 50, 400 GB/s is 400)"),
])
def test_a_number_written_with_its_unit_is_told_in_the_fields_unit(field, value, want):
    # A datasheet's '400Gbps' read as 'unable to parse string as a number', with no word of
    # the unit the field takes.
    parts = {"gpus": "gpus: {count: 8, mem_bw_gbps: 3350}", "pcie": "pcie: {bw_gbps: 55}",
             "nics": "nics: {count: 8, bw_gbps: 50}"}
    network = ""
    if field.startswith("network"):
        network = field.replace("X", f"'{value}'") + "\n"
    else:
        parts[field.split(":")[0]] = field.replace("X", f"'{value}'")
    text = "name: x\nnodes: 2\nnode:\n" + "".join(f"  {p}\n" for p in parts.values()) + network
    with pytest.raises(TopologyError) as info:
        load_topology_text(text, "<t>")
    assert want in str(info.value), str(info.value)
    # a value that is no number with a unit keeps pydantic's words
    with pytest.raises(TopologyError, match="unable to parse string as a number"):
        load_topology_text(text.replace(f"'{value}'", "'fast'"), "<t>")


@pytest.mark.parametrize("where", ["pcie", "link"])
def test_a_pcie_width_no_link_has_is_refused(where):
    # width 17 (a typo of 16) was rated 17/16 of an x16 link without a word
    if where == "pcie":
        text = "name: x\nnode:\n  gpus: {count: 2, mem_bw_gbps: 3350}\n  pcie: {generation: 5, width: W, bw_gbps: 55}\n"
        field = "node.pcie.width"
    else:
        text = ("name: x\ndevices:\n  - {name: g0, kind: gpu, mem_bw_gbps: 1}\n  - {name: c, kind: cpu}\nlinks:\n"
                "  - {src: g0, dst: c, kind: pcie, bw_gbps: 25, generation: 4, width: W, duplex: true}\n")
        field = "links[0].width"
    for width in (1, 2, 4, 8, 12, 16, 32):
        load_topology_text(text.replace("W", str(width)), "<t>")
    for width in (0, 3, 17, 64):
        with pytest.raises(TopologyError) as info:
            load_topology_text(text.replace("W", str(width)), "<t>")
        assert f"{field}: must be a PCIe link width, 1, 2, 4, 8, 12, 16 or 32 lanes (got {width})" in str(info.value)


def test_more_pcie_switches_than_gpus_are_refused():
    # 100000 switches for 8 GPUs built 200,048 devices, all but 16 of them empty, without a word
    text = "name: x\nnode:\n  gpus: {count: 8, mem_bw_gbps: 3350}\n  pcie: {bw_gbps: 55, switches: S}\n"
    assert load_topology_text(text.replace("S", "8"), "<t>").num_ranks == 8
    with pytest.raises(TopologyError, match=r"<t>:4: node.pcie.switches: 16 PCIe switches for 8 GPUs: 8 would hold "
                                             r"no GPU \(GPUs are spread evenly over the switches\); give at most 8"):
        load_topology_text(text.replace("S", "16"), "<t>")


@pytest.mark.parametrize(("link", "said"), [
    ("{src: g0, dst: g1, kind: infiniband, bw_gbps: 50, duplex: true}",
     "links[2].kind: a link of kind infiniband from 'g0', a gpu: network links join NICs, network switches and hosts "
     "(a GPU reaches the network through a nic over pcie, or its own port to a switch)"),
    ("{src: c, dst: n, kind: ethernet, bw_gbps: 50, duplex: true}",
     "links[2].kind: a link of kind ethernet from 'c', a cpu"),
    ("{src: g0, dst: n, kind: infiniband, bw_gbps: 50, duplex: true}",
     "links[2].kind: a link of kind infiniband from 'g0', a gpu"),
    ("{src: g0, dst: n, kind: nvlink, bw_gbps: 50, duplex: true}",
     "links[2].kind: a link of kind nvlink to 'n', a nic: nvlink joins GPUs, NVSwitches and CPUs"),
])
def test_a_link_no_route_would_take_is_refused(link, said):
    # an InfiniBand link between two GPUs was read and ignored: their rate stayed PCIe's
    text = ("name: x\ndevices:\n  - {name: g0, kind: gpu, mem_bw_gbps: 1}\n  - {name: g1, kind: gpu, mem_bw_gbps: 1}\n"
            "  - {name: c, kind: cpu}\n  - {name: n, kind: nic}\nlinks:\n"
            "  - {src: g0, dst: c, kind: pcie, bw_gbps: 25, duplex: true}\n"
            "  - {src: g1, dst: c, kind: pcie, bw_gbps: 25, duplex: true}\n  - LINK\n")
    with pytest.raises(TopologyError) as info:
        load_topology_text(text.replace("LINK", link), "<t>")
    assert said in str(info.value), str(info.value)


def test_a_number_written_with_a_thousands_comma_is_told_as_such():
    # {mem_bw_gbps: 3,350} read as mem_bw_gbps: 3 and a key 350: 'keys should be strings (got 350)'
    text = "name: x\nnode:\n  gpus: {count: 8, mem_bw_gbps: 3,350}\n  pcie: {bw_gbps: 55}\n"
    with pytest.raises(TopologyError, match=r"<t>:3: node.gpus\[350\]: a number \(350\) where a field name goes: in "
                                            r"\{...\} a comma ends a value, so a number written with one reads as "
                                            r"two \(3,350 as 3 and a field 350\); write thousands without a "
                                            r"separator \(3350\) and decimals with a point \(12.5\)"):
        load_topology_text(text, "<t>")


def test_family_file_mistakes_are_told_where_the_parameter_goes(tmp_path, monkeypatch):
    with pytest.raises(TopologyError, match=r"<t>:2: nodes: unknown field 'nodes'; allowed here: .* \(a family's "
                                            r"parameters go under params: params: \{nodes: \.\.\.\}\)"):
        load_topology_text("family: dgx-h100\nnodes: 4\n", "<t>")
    with pytest.raises(TopologyError, match=r"params.node: family dgx-h100 has no parameter 'node' \(did you mean "
                                            r"'nodes'\?\)"):
        load_topology_text("family: dgx-h100\nparams: {node: 4}\n", "<t>")
    # a parameter of another family is no hint for this one (dgx-h100 has no gpus)
    with pytest.raises(TopologyError) as info:
        load_topology_text("family: dgx-h100\ngpus: 4\n", "<t>")
    assert "unknown field 'gpus'" in str(info.value) and "go under params" not in str(info.value), info.value
    # a folder named bare (no slash) is named as one, not as an unknown topology
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    with pytest.raises(TopologyError, match=r"topology 'mine' is a folder; give a topology YAML file"):
        resolve("mine")


def test_a_gpu_with_its_own_network_port_is_routed_over_it():
    # Gaudi's on-chip RoCE ports: a GPU joined to a switch sends through its own port
    devices = "".join(f"  - {{name: n{n}.g0, kind: gpu, node: {n}, mem_bw_gbps: 1}}\n" for n in range(2))
    links = "".join(f"  - {{src: n{n}.g0, dst: sw, kind: roce, bw_gbps: 50, duplex: true}}\n" for n in range(2))
    topo = load_topology_text(f"name: g\ndevices:\n{devices}  - {{name: sw, kind: switch, node: -1}}\nlinks:\n{links}",
                              "<t>")
    assert [(ln.src, ln.dst) for ln in topo.route_links(0, 1)] == [("n0.g0", "sw"), ("sw", "n1.g0")]
