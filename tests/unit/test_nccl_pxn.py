"""NCCL's PXN: in a communicator of every rank, a send to another node leaves through the NIC
on the peer's rail, reached over NVLink (treeattn.cost.nccl_p2p.router)."""

from __future__ import annotations

import dataclasses

import pytest

from treeattn.cost.nccl_p2p import PAIR, WORLD, router
from treeattn.topology.library import resolve
from treeattn.topology.model import DeviceKind, LinkClass


def _hops(topo, route) -> list[tuple[str, str]]:
    return [(topo.links[i].src, topo.links[i].dst) for i in route]


def test_a_send_to_another_rail_goes_over_nvlink_to_that_rails_nic():
    topo = resolve("dgx-h100:nodes=4")
    pxn = router(topo, WORLD)
    assert pxn is not None
    # n0.gpu0 -> n1.gpu1: through n0.gpu1 and its NIC, never up to a spine
    hops = _hops(topo, pxn(0, 9))
    assert hops[:2] == [("n0.gpu0", "n0.nvswitch"), ("n0.nvswitch", "n0.gpu1")]
    assert ("n0.pcie1", "n0.nic1") in hops and ("n1.nic1", "n1.pcie1") in hops
    assert not any("spine" in a or "spine" in b for a, b in hops)
    assert any("spine" in b for _, b in _hops(topo, topo.route(0, 9)))  # its own NIC: across rails
    # the same rail, or the same node: the plain route
    assert pxn(0, 8) == topo.route(0, 8)
    assert pxn(0, 3) == topo.route(0, 3)


def test_every_world_route_of_a_rail_optimized_cluster_stays_on_its_rail():
    topo = resolve("dgx-h100:nodes=4")
    pxn = router(topo, WORLD)
    spines = {d.name for d in topo.devices if d.kind is DeviceKind.SWITCH and d.tier == "spine"}
    assert spines
    for a in range(topo.num_ranks):
        for b in range(topo.num_ranks):
            if a // 8 == b // 8:
                continue
            route = pxn(a, b)
            assert not any(topo.links[i].dst in spines for i in route), (a, b)
            # the NVLink hop, when there is one, comes first
            fabric = [topo.links[i].cls is LinkClass.GPU_FABRIC for i in route]
            assert fabric == sorted(fabric, reverse=True)
            assert any(fabric) == (a % 8 != b % 8)


def test_no_pxn_without_a_gpu_of_the_peers_index_among_the_ranks():
    # treeattn's executor: a communicator per pair of ranks holds no other GPU of the node
    topo = resolve("dgx-h100:nodes=2")
    assert router(topo, PAIR) is None
    # nccl-tests on one GPU of each node: n0.gpu1 is no rank
    two = resolve("dgx-h100:nodes=2[ranks 0,9]")
    assert router(two, WORLD)(0, 1) == two.route(0, 1)
    # one node, host ranks, AMD GPUs: nothing to route other than the topology does
    assert router(resolve("dgx-h100"), WORLD) is None
    assert router(resolve("cpu:ranks=4"), WORLD) is None
    assert router(resolve("mi300x:nodes=2"), WORLD) is None


def test_pxn_reaches_a_nic_behind_grace_from_nccl_2_28_3():
    # GB200: a GPU reaches its NIC through its own Grace CPU over NVLink-C2C (NCCL's PATH_P2C),
    # which PXN may cross from 2.28.3 (NCCL_PXN_C2C 0 -> 1), not before.
    topo = resolve("gb200-nvl72:racks=2")
    old, new = (dataclasses.replace(topo, cost=topo.cost.updated(nccl_version=v)) for v in ("2.27.7", "2.28.3"))
    assert router(old, WORLD)(0, 73) == old.route(0, 73)
    hops = _hops(new, router(new, WORLD)(0, 73))
    assert hops[1] == ("nvl0.nvswitch", "n0.gpu1") and ("n0.cpu0", "n0.nic1") in hops
    assert router(topo, WORLD)(0, 73) == router(new, WORLD)(0, 73)  # the default: the newest release


def test_the_peers_index_is_its_gpus_place_on_its_node_not_its_rank_among_the_ranks():
    # ranks: n0.gpu1, n0.gpu2, n1.gpu1. A send n0.gpu2 -> n1.gpu1 goes through n0.gpu1 (GPU 1
    # of the node: rank 0), not through GPU 0 (the peer is the first rank of its node).
    topo = resolve("dgx-h100:nodes=2[ranks 1,2,9]")
    hops = _hops(topo, router(topo, WORLD)(1, 2))
    assert hops[:2] == [("n0.gpu2", "n0.nvswitch"), ("n0.nvswitch", "n0.gpu1")]


def _one_message_us(topo, src: int, dst: int, communicator: str) -> float:
    from treeattn.cost.library import last_landing_us
    from treeattn.plan.ir import Plan, TopologyRef
    from treeattn.plan.schedule import Programs
    from treeattn.workload import RawPayload

    progs = Programs(topo.num_ranks)
    progs.transfer(src, dst, 0, copy=True)
    plan = Plan("one", {}, RawPayload(nbytes=4, ranks=topo.num_ranks), TopologyRef.of(topo), 1, progs.build(),
                tuple(range(topo.num_ranks)))
    return last_landing_us(plan, topo, communicator)


def test_the_simulator_sends_over_the_pxn_route_in_a_communicator_of_every_rank():
    # A 4-byte message: its time is the route's latency (plus nanoseconds of bandwidth), so the
    # two communicators differ by the two routes' latencies.
    from treeattn.cost.nccl_p2p import PAIR

    topo = resolve("dgx-h100:nodes=2")
    lat = sum(topo.links[i].latency_us for i in router(topo, WORLD)(0, 9))
    plain = sum(topo.links[i].latency_us for i in topo.route(0, 9))
    assert lat != plain
    world, pair = _one_message_us(topo, 0, 9, WORLD), _one_message_us(topo, 0, 9, PAIR)
    assert world - pair == pytest.approx(lat - plain, abs=0.01)
    # the same rail: one route, one time
    assert _one_message_us(topo, 0, 8, WORLD) == pytest.approx(_one_message_us(topo, 0, 8, PAIR), abs=0.01)
