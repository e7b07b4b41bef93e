"""The emulated-cluster layout (pure): namespaces, bridges, veths, shapers, and the proof that
the kernel's path between any two ranks is the topology's route. No root needed."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli_helpers import run_cli
from treeattn.emulate import cluster as cluster_mod
from treeattn.emulate import layout as layout_mod
from treeattn.emulate import netns as netns_mod
from treeattn.emulate.commands import setup_steps
from treeattn.emulate.layout import WIRE_FACTOR, plan_layout, scaled_topology
from treeattn.errors import EmulationError
from treeattn.topology.library import resolve
from treeattn.topology.model import Device, Link, Topology

EMU = ("emu-2x4", "emu-pcie-tree", "emu-mesh")


def duplex(a: str, b: str, kind: str, bw: float) -> list[Link]:
    return [Link(a, b, kind, bw), Link(b, a, kind, bw)]


def tree_topology(parents: list[int], hosts: list[int], bws: list[float]) -> Topology:
    """Switch k > 0 hangs under switch parents[k-1]; host j under switch hosts[j]."""
    devs = [Device(f"s{k}", "switch", node=-1) for k in range(len(parents) + 1)]
    links: list[Link] = []
    for k, p in enumerate(parents, start=1):
        links += duplex(f"s{k}", f"s{p}", "ethernet", bws[k % len(bws)])
    for j, s in enumerate(hosts):
        devs.append(Device(f"h{j}", "host", node=j))
        links += duplex(f"h{j}", f"s{s}", "ethernet", bws[j % len(bws)])
    return Topology("tree", devs, links, [f"h{j}" for j in range(len(hosts))])


@pytest.mark.parametrize("name", EMU)
def test_shipped_emulated_topologies_lay_out_with_kernel_paths_equal_to_routes(name):
    topo = resolve(name)
    lay = plan_layout(topo, run_id="0a1b2c")
    p = topo.num_ranks
    assert set(lay.paths) == {(a, b) for a in range(p) for b in range(p) if a != b}
    for (a, b), path in lay.paths.items():
        assert path == topo.route(a, b)
    assert all(ns.startswith("ta-0a1b2c-") for ns in lay.namespaces)
    assert len(lay.ranks) == p
    ips = [ipaddress.IPv4Address(r.ip) for r in lay.ranks]
    assert len(set(ips)) == p and all(ip in ipaddress.IPv4Network("198.18.0.0/15") for ip in ips)
    for c in lay.cables:
        assert len(c.a.ifname) <= 15 and len(c.b.ifname) <= 15
    # Every link some path crosses is shaped exactly once, at the rate of its bandwidth.
    crossed = {i for path in lay.paths.values() for i in path}
    assert sorted(s.link for s in lay.shapers) == sorted(crossed)
    for s in lay.shapers:
        assert s.rate_bit == round(topo.links[s.link].bw_gbps * 8e9 * WIRE_FACTOR)
        assert sorted(s.pairs) == sorted(pr for pr, path in lay.paths.items() if s.link in path)


def test_the_2x4_cluster_has_two_interfaces_per_rank_and_routes_by_node():
    topo = resolve("emu-2x4")
    lay = plan_layout(topo)
    assert lay.fabric_ns == "ta-000000-fab"
    assert len(lay.bridges) == 2 + 8 + 1  # node bridges, NICs, leaf
    r0 = lay.ranks[0]
    assert r0.ifaces == ("eth0", "eth1")
    via = dict(r0.routes)
    sw_if = {c.end_at("n0.h0").ifname for c in lay.cables if {c.a.device, c.b.device} == {"n0.h0", "n0.sw"}}
    nic_if = {c.end_at("n0.h0").ifname for c in lay.cables if {c.a.device, c.b.device} == {"n0.h0", "n0.nic0"}}
    assert {via[lay.ranks[k].ip] for k in (1, 2, 3)} == sw_if
    assert {via[lay.ranks[k].ip] for k in (4, 5, 6, 7)} == nic_if


def test_mesh_needs_no_bridge_and_uses_a_direct_veth_per_peer():
    lay = plan_layout(resolve("emu-mesh"))
    assert lay.fabric_ns is None and not lay.bridges
    assert len(lay.cables) == 6
    assert all(c.a.bridge is None and c.b.bridge is None for c in lay.cables)
    assert all(len(path) == 1 for path in lay.paths.values())


def test_shared_uplink_carries_both_cross_pairs_of_the_pcie_tree():
    topo = resolve("emu-pcie-tree")
    lay = plan_layout(topo)
    up = topo.link_index("sw0", "cpu")
    (shaper,) = [s for s in lay.shapers if s.link == up]
    assert shaper.pairs == ((0, 2), (0, 3), (1, 2), (1, 3))


def test_rank_subset_lays_out_only_the_cables_its_routes_use():
    topo = resolve("emu-2x4")
    sub = dataclasses.replace(topo, ranks=(topo.ranks[0], topo.ranks[4]))
    lay = plan_layout(sub)
    assert [d for _, d in lay.bridges] == ["leaf", "n0.nic0", "n1.nic0"]
    assert len(lay.cables) == 4 and len(lay.namespaces) == 3


def test_scale_multiplies_rates_and_is_checked():
    topo = resolve("emu-pcie-tree")
    half = plan_layout(topo, scale=0.5)
    full = plan_layout(topo)
    for a, b in zip(half.shapers, full.shapers, strict=True):
        assert abs(a.rate_bit * 2 - b.rate_bit) <= 1
    with pytest.raises(EmulationError, match="--scale"):
        plan_layout(topo, scale=1e6)
    with pytest.raises(EmulationError, match="--scale"):
        plan_layout(topo, scale=0)
    big = scaled_topology(topo, 2.0)
    assert big.links[0].bw_gbps == 2 * topo.links[0].bw_gbps and big.name != topo.name
    assert scaled_topology(topo, 1.0) is topo


def test_a_loop_through_the_switches_is_refused():
    # Two leaves, two spines: every cross-leaf route has two equal paths, bridged they loop.
    devs = [Device(n, "switch", node=-1) for n in ("l0", "l1", "s0", "s1")]
    links = []
    for leaf in ("l0", "l1"):
        for spine in ("s0", "s1"):
            links += duplex(leaf, spine, "ethernet", 0.01)
    hosts = []
    for j in range(4):
        devs.append(Device(f"h{j}", "host", node=j))
        links += duplex(f"h{j}", f"l{j % 2}", "ethernet", 0.01)
        hosts.append(f"h{j}")
    topo = Topology("leaf-spine", devs, links, hosts)
    with pytest.raises(EmulationError, match="loop"):
        plan_layout(topo)


def test_a_rank_attached_twice_to_one_segment_is_refused():
    devs = [Device("cpu", "cpu"), Device("sw0", "pcie-switch"), Device("sw1", "pcie-switch")]
    devs += [Device(f"h{j}", "host") for j in range(3)]
    cables = [("sw0", "cpu"), ("sw1", "cpu"), ("h0", "sw0"), ("h0", "sw1"), ("h1", "sw1"), ("h2", "sw0")]
    links = [ln for a, b in cables for ln in duplex(a, b, "pcie", 0.01)]
    topo = Topology("twice", devs, links, ["h0", "h1", "h2"])
    with pytest.raises(EmulationError, match="both"):
        plan_layout(topo)


def test_ranks_sharing_a_device_are_refused():
    with pytest.raises(EmulationError, match="share device"):
        plan_layout(resolve("cpu:ranks=2,cores=2"))


def test_run_ids_are_checked():
    with pytest.raises(EmulationError, match="six lowercase hex"):
        plan_layout(resolve("emu-mesh"), run_id="../etc")
    # `emulate up --id ''` drew a random id and brought a cluster up (down --id '' refused it)
    with pytest.raises(EmulationError, match="run id '' must be six lowercase hex"):
        cluster_mod.up(resolve("emu-mesh"), run_id="")


def test_setup_steps_are_deterministic_and_shape_every_pair():
    topo = resolve("emu-pcie-tree")
    lay = plan_layout(topo, run_id="abcdef")
    steps = setup_steps(lay)
    assert steps == setup_steps(plan_layout(topo, run_id="abcdef"))
    assert steps[0].argv == ("ip", "-b", "-")
    assert steps[0].stdin.split("\n")[:-1] == [f"netns add {ns}" for ns in lay.namespaces]
    text = "".join(s.stdin or "" for s in steps)
    assert text.count("root handle 1: htb") == len(lay.shapers)
    assert text.count("u32 match ip src") == sum(len(s.pairs) for s in lay.shapers)
    # Small packets (ACKs) get a class of their own on every shaped link, matched first, so a
    # link carries both directions at once.
    assert text.count("classid 1:3 htb") == text.count("match u16 0x0000 0xff80 at 2 flowid 1:3") == len(lay.shapers)
    for line in text.splitlines():
        if "u32 match ip src" in line:
            assert "prio 2" in line
    # Nothing is created in the root namespace except the namespaces themselves.
    for s in steps[1:]:
        assert "-n" in s.argv or s.argv[:3] == ("ip", "netns", "exec")


@settings(max_examples=40, deadline=None)
@given(
    parents=st.lists(st.integers(min_value=0, max_value=50), min_size=0, max_size=6),
    hosts=st.lists(st.integers(min_value=0, max_value=50), min_size=2, max_size=7),
    bws=st.lists(st.sampled_from([0.001, 0.005, 0.0125, 0.05]), min_size=1, max_size=4),
)
def test_any_switch_tree_lays_out_with_kernel_paths_equal_to_routes(parents, hosts, bws):
    parents = [p % (k + 1) for k, p in enumerate(parents)]  # switch k+1 hangs under one before it
    hosts = [h % (len(parents) + 1) for h in hosts]
    topo = tree_topology(parents, hosts, bws)
    lay = plan_layout(topo)
    for (a, b), path in lay.paths.items():
        assert path == topo.route(a, b)
    used = {topo.links[i].src for path in lay.paths.values() for i in path[1:]}
    assert {d for _, d in lay.bridges} == used


@settings(max_examples=10, deadline=None)
@given(n=st.integers(min_value=2, max_value=6))
def test_any_full_mesh_lays_out_point_to_point(n):
    devs = [Device(f"h{k}", "host", node=k) for k in range(n)]
    links = [ln for a in range(n) for b in range(a + 1, n) for ln in duplex(f"h{a}", f"h{b}", "ethernet", 0.01)]
    topo = Topology("mesh", devs, links, [f"h{k}" for k in range(n)])
    lay = plan_layout(topo)
    assert len(lay.cables) == n * (n - 1) // 2
    for r in lay.ranks:
        assert len(r.ifaces) == n - 1 and len({ifname for _, ifname in r.routes}) == n - 1


def test_cli_without_root_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(netns_mod.os, "geteuid", lambda: 1000)
    res = run_cli("emulate", "up", "emu-mesh")
    assert res.exit_code == 2
    assert "needs root" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr


def test_cli_without_iproute2_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(netns_mod.shutil, "which", lambda name: None)
    for args in (("emulate", "down"), ("emulate", "check", "emu-mesh")):
        res = run_cli(*args)
        assert res.exit_code == 2, res
        assert "iproute2" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_rejects_an_unemulable_topology_before_touching_anything(monkeypatch):
    monkeypatch.setattr(layout_mod, "MAX_RATE_BIT", 1_000_000)
    monkeypatch.setattr(cluster_mod, "require_netns", lambda: None)
    res = run_cli("emulate", "up", "emu-mesh")
    assert res.exit_code == 2
    assert "emu-mesh" in res.stderr and "--scale" in res.stderr


def test_one_rank_is_refused_before_anything_is_made():
    # a rank alone has no cable, so no interface to carry its address: an IndexError, a traceback
    from treeattn.errors import InputError
    from treeattn.topology.library import resolve

    with pytest.raises(InputError, match=r"^topology 'emu-2x4\[ranks 0\]' places 1 rank: an emulated cluster is "
                                         r"ranks joined by links; give a topology, or a selection \(--ranks\), "
                                         r"of 2 or more$"):
        plan_layout(resolve("emu-2x4[ranks 0]"))
    res = run_cli("emulate", "up", "emu-2x4", "--ranks", "0")
    assert res.exit_code == 2 and res.stderr.startswith("error: topology 'emu-2x4[ranks 0]' places 1 rank"), res.stderr


@pytest.mark.parametrize("scale", [float("inf"), 1e300])
def test_a_scale_no_link_can_take_is_refused_not_a_traceback(scale):
    # int(round(inf)) raised OverflowError inside the layout (validate, emulate up/check/exec/run).
    with pytest.raises(EmulationError, match=r"x scale .* shapes to inf Mbit/s, outside 0\.1-10000 Mbit/s; pick "):
        plan_layout(resolve("emu-2x4"), scale=scale)
