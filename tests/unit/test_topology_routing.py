"""Routing on the shipped presets and families (docs/design.md section 4)."""

from __future__ import annotations

import itertools

import pytest

from treeattn.errors import TopologyError
from treeattn.topology import DeviceKind, LinkClass, LinkKind, resolve


def kinds(topo, a, b):
    return [ln.kind for ln in topo.route_links(a, b)]


def devices_on(topo, a, b):
    """Devices a route passes through, excluding both ends."""
    return [topo.device(ln.dst) for ln in topo.route_links(a, b)[:-1]]


def test_dgx_h100_pair_is_one_nvswitch_hop_at_450():
    t = resolve("dgx-h100")
    links = t.route_links(0, 7)
    assert [(ln.src, ln.dst) for ln in links] == [("n0.gpu0", "n0.nvswitch"), ("n0.nvswitch", "n0.gpu7")]
    assert all(ln.kind is LinkKind.NVLINK for ln in links)
    assert t.route_bw_gbps(0, 7) == 450
    assert t.route_latency_us(0, 7) == pytest.approx(0.6)


def test_dgx_h100_cross_node_is_nic_bound_and_same_rail_crosses_one_leaf():
    t = resolve("dgx-h100-2node")
    assert t.route_bw_gbps(0, 8) == 50  # 400 Gb/s NIC, below the PCIe Gen5 hop (55)
    net = [ln for ln in t.route_links(0, 8) if ln.cls is LinkClass.NETWORK]
    assert [(ln.src, ln.dst) for ln in net] == [("n0.nic0", "rail0.leaf0"), ("rail0.leaf0", "n1.nic0")]
    # The GPU reaches its own NIC over its PCIe switch (rail-optimized: GPU k <-> NIC k).
    assert [ln.dst for ln in t.route_links(0, 8)[:2]] == ["n0.pcie0", "n0.nic0"]


def test_cross_rail_goes_through_a_spine():
    t = resolve("dgx-h100-2node")
    net = [ln for ln in t.route_links(0, 9) if ln.cls is LinkClass.NETWORK]
    hops = [ln.dst for ln in net]
    assert hops[0] == "rail0.leaf0" and hops[-1] == "n1.nic1"
    assert t.device(hops[1]).tier == "spine" and hops[2] == "rail1.leaf0"


def test_ecmp_spreads_cross_leaf_flows_over_spines():
    t = resolve("dgx-h100:nodes=64")  # 2 leaves per rail, 32 spines
    spines = set()
    for dst in range(8 * 32, 8 * 64, 8):  # rank 0 to GPU 0 of every node under the second leaf
        net = [ln.dst for ln in t.route_links(0, dst) if ln.cls is LinkClass.NETWORK]
        assert len(net) == 4
        spines.add(net[1])
    assert len(spines) > 8


def test_fat_tree_fills_leaves_in_node_order():
    t = resolve("dgx-h100:nodes=4,fabric=fat-tree,nics_per_leaf=16")
    same_leaf = [ln.dst for ln in t.route_links(0, 8) if ln.cls is LinkClass.NETWORK]
    assert same_leaf == ["leaf0", "n1.nic0"]
    other_leaf = [ln.dst for ln in t.route_links(0, 16) if ln.cls is LinkClass.NETWORK]
    assert other_leaf[0] == "leaf0" and other_leaf[1].startswith("spine") and other_leaf[2] == "leaf1"


def _leaf_uplinks(t):
    return [ln for ln in t.links if ln.src == "rail0.leaf0" and ln.dst.startswith("spine")]


def test_oversubscription_lowers_leaf_uplinks():
    full = _leaf_uplinks(resolve("dgx-h100:nodes=64,spines=8"))
    half = _leaf_uplinks(resolve("dgx-h100:nodes=64,spines=8,oversubscription=2"))
    assert len(full) == len(half) == 8
    assert {ln.bw_gbps for ln in full} == {32 * 50 / 8}
    assert {ln.bw_gbps for ln in half} == {32 * 50 / 8 / 2}
    # With spines chosen automatically the leaf's uplink total is its downlink total / ratio.
    auto = _leaf_uplinks(resolve("dgx-h100:nodes=64,oversubscription=4"))
    assert sum(ln.bw_gbps for ln in auto) == pytest.approx(32 * 50 / 4)


def test_rtx4090_pairs_bounce_through_a_cpu_and_cross_socket_uses_the_socket_link():
    t = resolve("rtx4090-8")
    for a, b in itertools.permutations(range(8), 2):
        assert any(d.kind is DeviceKind.CPU for d in devices_on(t, a, b)), (a, b)
    assert LinkKind.UPI in kinds(t, 0, 4)
    assert LinkKind.UPI not in kinds(t, 0, 1)
    assert t.route_bw_gbps(0, 4) == 10  # the socket link is the bottleneck
    two = resolve("rtx4090-2")
    assert [ln.dst for ln in two.route_links(0, 1)] == ["n0.cpu0", "n0.gpu1"]


def test_dgx1_pairs_without_nvlink_go_over_pcie():
    t = resolve("dgx1-v100")
    direct = {(ln.src, ln.dst) for ln in t.links if ln.kind is LinkKind.NVLINK}
    missing = [(a, b) for a, b in itertools.permutations(range(8), 2) if (t.ranks[a], t.ranks[b]) not in direct]
    assert len(missing) == 2 * 12
    for a, b in missing:
        assert all(ln.cls is LinkClass.PCIE for ln in t.route_links(a, b)), (a, b)
    assert kinds(t, 0, 3) == [LinkKind.NVLINK] and t.route_bw_gbps(0, 3) == 50  # NV2
    assert t.route_bw_gbps(0, 1) == 25  # NV1


def test_mi300x_pair_is_one_xgmi_link():
    for name in ("mi300x-8", "mi300x-4"):
        t = resolve(name)
        for a, b in itertools.permutations(range(t.num_ranks), 2):
            links = t.route_links(a, b)
            assert len(links) == 1 and links[0].kind is LinkKind.XGMI and links[0].bw_gbps == 64


def test_nvl72_any_pair_over_nvlink():
    t = resolve("gb200-nvl72")
    assert t.num_ranks == 72 and len({t.rank_device(r).node for r in range(72)}) == 18
    for a, b in itertools.permutations(range(72), 2):
        links = t.route_links(a, b)
        assert len(links) == 2 and all(ln.kind is LinkKind.NVLINK for ln in links)
    assert t.route_bw_gbps(0, 71) == 900


def test_nvl72_racks_meet_over_the_network():
    t = resolve("gb200-nvl72:racks=2")
    assert any(ln.cls is LinkClass.NETWORK for ln in t.route_links(0, 72))
    assert all(ln.kind is LinkKind.NVLINK for ln in t.route_links(72, 143))


def test_cpu_ranks_share_the_loopback():
    t = resolve("cpu-4")
    assert t.route(0, 0) == ()
    assert t.route(1, 3) == t.route(0, 2) and t.links[t.route(0, 2)[0]].kind is LinkKind.LOOPBACK
    assert t.route_bw_gbps(0, 0) == float("inf")


def test_routes_are_cached_and_reversible():
    t = resolve("dgx-h100-2node")
    assert t.route(3, 12) is t.route(3, 12)
    fwd = [(ln.src, ln.dst) for ln in t.route_links(3, 12)]
    back = [(ln.src, ln.dst) for ln in t.route_links(12, 3)]
    assert fwd[0][0] == back[-1][1] and fwd[-1][1] == back[0][0]


def test_shared_links_between_routes():
    t = resolve("dgx-h100-2node")
    # Rank 1 crosses rails to reach n1.gpu0: both flows share the last leaf and n1.gpu0's path.
    shared = t.shared_links(t.route(0, 8), t.route(1, 8))
    assert [t.links[i].dst for i in shared] == ["n1.nic0", "n1.pcie0", "n1.gpu0"]
    assert t.shared_links(t.route(0, 1), t.route(2, 3)) == ()


def test_route_rejects_bad_ranks():
    t = resolve("dgx-h100")
    with pytest.raises(TopologyError, match="rank 8 out of range"):
        t.route(0, 8)


def test_2048_node_dgx_builds_and_routes():
    # 16,384 GPUs: build and check_routable must stay quick (timed in benchmarks/, not here).
    t = resolve("dgx-h100:nodes=2048")
    assert t.num_ranks == 16384
    t.check_routable()
    assert t.route_bw_gbps(0, 16383) == 50


def test_check_routable_finds_two_ranks_apart_that_both_reach_rank_0(tmp_path):
    # NICs cabled in a chain nic1 - nic0 - nic2, rank 0 in the middle: ranks 1 and 2 reach
    # rank 0 but not each other (a NIC forwards nothing); a cable nic1 - nic2 joins them.
    from treeattn.topology.io import load_topology

    gpus = "".join(f"  - {{name: g{i}, kind: gpu, node: {i}, mem_bw_gbps: 1000}}\n"
                   f"  - {{name: nic{i}, kind: nic, node: {i}}}\n" for i in range(3))
    pcie = "".join(f"  - {{src: g{i}, dst: nic{i}, kind: pcie, bw_gbps: 25, duplex: true}}\n" for i in range(3))
    cables = ["  - {src: nic0, dst: nic1, kind: infiniband, bw_gbps: 50, duplex: true}\n",
              "  - {src: nic0, dst: nic2, kind: infiniband, bw_gbps: 50, duplex: true}\n"]
    text = f"name: chain\ndevices:\n{gpus}links:\n{pcie}{''.join(cables)}ranks: [g0, g1, g2]\n"
    path = tmp_path / "chain.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=r"rank 1 \(g1\) cannot reach rank 2 \(g2\)"):
        load_topology(path)
    path.write_text(text.replace("ranks:", "  - {src: nic1, dst: nic2, kind: infiniband, bw_gbps: 50, duplex: true}\n"
                                           "ranks:"))
    assert load_topology(path).route_bw_gbps(1, 2) == 25


def test_a_gap_from_a_switched_nic_to_one_cabled_only_to_rank_0_is_found(tmp_path):
    # nic0 and nic1 on a switch, nic2 cabled to nic0 alone: every rank reaches rank 0, and the
    # switched group's check against the one group with no switch finds 1 -> 2 cut off.
    from treeattn.topology.io import load_topology

    gpus = "".join(f"  - {{name: g{i}, kind: gpu, node: {i}, mem_bw_gbps: 1000}}\n"
                   f"  - {{name: nic{i}, kind: nic, node: {i}}}\n" for i in range(3))
    pcie = "".join(f"  - {{src: g{i}, dst: nic{i}, kind: pcie, bw_gbps: 25, duplex: true}}\n" for i in range(3))
    net = ("  - {src: nic0, dst: sw, kind: infiniband, bw_gbps: 50, duplex: true}\n"
           "  - {src: nic1, dst: sw, kind: infiniband, bw_gbps: 50, duplex: true}\n"
           "  - {src: nic0, dst: nic2, kind: infiniband, bw_gbps: 50, duplex: true}\n")
    path = tmp_path / "star.yaml"
    path.write_text(f"name: star\ndevices:\n{gpus}  - {{name: sw, kind: switch}}\nlinks:\n{pcie}{net}"
                    "ranks: [g0, g1, g2]\n")
    with pytest.raises(TopologyError, match=r"rank 1 \(g1\) cannot reach rank 2 \(g2\)"):
        load_topology(path)
