"""Collectives between host ranks (gloo) are simulated schedules; on GPUs NCCL's bus
bandwidth is capped by the routes' shared links.

Closed forms use ``switch_topo`` (every route: sender uplink + receiver downlink, beta
bytes/us each, alpha = overhead + 2 latencies) whose hosts have merges for free.
"""

from __future__ import annotations

import pytest

from tests.unit.test_cost_helpers import cluster_topo, switch_topo
from treeattn.cost import gloo, nccl, nccl_fabric
from treeattn.cost.bounds import CutModel
from treeattn.cost.compute import ComputeModel
from treeattn.cost.library import alltoall_us
from treeattn.cost.simulate import simulate
from treeattn.plan.builders import build
from treeattn.plan.ir import OpKind, collective_kernels
from treeattn.plan.validate import validate
from treeattn.topology.library import resolve
from treeattn.workload import Workload

BETA = 10.0e3  # 10 GB/s in bytes per microsecond


def test_allreduce_is_gloos_segmented_ring():
    p, o, lat = 4, 30.0, 1.0
    topo = switch_topo(p, bw=10.0, lat=lat, overhead=o)
    alpha = o + 2 * lat
    # 8 MB: 8 segments of 1 MB (two a rank); each step sends two to the rank below, and the
    # second, issued one overhead later, shares the route with the first: as one message.
    n = 8_000_000
    assert gloo.allreduce_us(topo, n) == pytest.approx(2 * (p - 1) * (alpha + n / (p * BETA)), rel=1e-9)
    # 64 B: still 8 segments of 8 B; a step is two messages one overhead apart
    n = 64
    assert gloo.allreduce_us(topo, n) == pytest.approx(2 * (p - 1) * (2 * o + 2 * lat + n / (2 * p * BETA)),
                                                       rel=1e-9)
    # one element: only segment 0 is sent, one hop a step: 2(p - 1) hops in a row
    assert gloo.allreduce_us(topo, 4) == pytest.approx(2 * (p - 1) * (alpha + 4 / BETA), rel=1e-9)
    assert gloo.allreduce_us(switch_topo(1), 64) == 0.0


@pytest.mark.parametrize(("nbytes", "segments", "live"), [
    (4, 16, 1), (32, 16, 8), (80, 16, 10), (16384, 16, 16), (20 << 20, 24, 24)])
def test_ring_allreduce_plan_cuts_segments_as_gloo_does(nbytes, segments, live):
    topo = switch_topo(8)
    plan = gloo.ring_allreduce_plan(topo, nbytes)
    validate(plan)  # every rank ends with every rank's buffer summed exactly once
    assert plan.chunks == live
    per = segments // 8
    sends = [sum(op.kind is OpKind.SEND for op in prog) for prog in plan.programs]
    # (segments - per) iterations per phase, a rank sends the live segments among them
    assert sum(sends) == 2 * 8 * (segments - per) if live == segments else sum(sends) == 2 * (8 - 1) * live
    assert {op.peer for op in plan.programs[3] if op.kind is OpKind.SEND} == {2}


def test_allgather_of_two_ranks_is_two_halves_each_way():
    topo = switch_topo(2, bw=10.0, lat=1.0, overhead=30.0)
    n = 8000  # each half's wire time is far below the overhead that separates the two
    assert gloo.allgather_us(topo, n) == pytest.approx(2 * 30.0 + 2.0 + n / 2 / BETA, rel=1e-9)
    plan = gloo.ring_allgather_plan(topo, n)
    validate(plan)
    assert plan.chunks == 4 and gloo.ring_allgather_plan(topo, 1).chunks == 2


def test_a_gathered_buffer_past_the_users_size_cap_is_built():
    # What the simulator builds for itself is no rank's input: gloo's all-gather of a 300 GiB
    # partial from 4 ranks gathers 1.17 TiB on each (a baseline whose memory the plan reports).
    assert gloo.ring_allgather_plan(resolve("cpu-4"), 300 << 30).workload.nbytes == 1200 << 30


def test_host_collectives_in_a_plan_are_simulated_gloo_schedules():
    topo = switch_topo(4, bw=0.05, lat=3.0, overhead=50.0, launch=20.0, mem_bw=20.0)
    assert topo.on_hosts and not cluster_topo(1, 2).on_hosts
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(256,) * 4)
    plan = build("allreduce3", w, topo)
    res = simulate(plan, topo)
    cuts = CutModel(topo)
    cm = ComputeModel.of(w, topo)
    colls = [t for t in res.timeline if t.kind == "collective" and t.rank == 0]
    assert [t.bytes for t in colls] == [w.rows * 4, w.rows * 64 * 4, w.rows * 4]
    for t, row in zip(colls, (4, 256, 4), strict=True):
        want = max(gloo.allreduce_us(topo, t.bytes), cuts.collective_floor_us(t.bytes, row))
        # then the kernels around the call (collective_kernels), each reading and writing the rows
        k = collective_kernels(plan, plan.programs[0][t.op])
        assert t.end_us - t.start_us == pytest.approx(want + cm.step_local_us(0, 2 * k * t.bytes, k), rel=1e-9)
        # every message of gloo's schedule pays the host's overhead: far above NCCL's constants
        assert want > 2 * 50.0


def test_ring_over_bounced_pcie_shares_the_switch_uplink():
    # RTX 4090 x 8: no peer-to-peer, so every ring flow goes up to its CPU and down again;
    # the four GPUs under one switch send four flows up its 25 GB/s uplink.
    fab = nccl_fabric.fabric(resolve("rtx4090-8"))
    assert fab.intra_bw_gbps == pytest.approx(25.0 / 4)
    assert "n0.pcie0->n0.cpu0" in fab.limit and "4 of its flows" in fab.limit
    # the chain of NCCL's tree runs up and down at once: 7 flows up that uplink, and NCCL's
    # tree already halves a rank's bandwidth for the two directions
    assert fab.tree_intra_bw_gbps == pytest.approx(2 * 25.0 / 7)
    # a hop through the host crosses 4 PCIe links, across sockets 5 (0.5 us each)
    assert fab.intra_route_us == pytest.approx(2.5)
    lat = {(e.algorithm.value, e.protocol.value): e.latency_us for e in nccl.predict(fab, "allreduce", 64)}
    assert lat[("ring", "LL")] == pytest.approx(6.6 + 2 * 7 * 2.5)


def test_narrow_uplink_caps_the_ring_even_unshared():
    # emu-pcie-tree: the 0.0125 GB/s switch uplinks are narrower than a rank's own port.
    fab = nccl_fabric.fabric(resolve("emu-pcie-tree"))
    assert fab.intra_bw_gbps == pytest.approx(0.0125)


def test_nvlink_and_rail_fabrics_keep_nccls_own_figures():
    fab = nccl_fabric.fabric(cluster_topo(4, 8, nvl_bw=450.0, net_bw=50.0))
    assert fab.intra_bw_gbps == pytest.approx(450 * 20.6 / 25)
    assert fab.inter_bw_gbps == pytest.approx(8 * 50.0)
    assert fab.limit == ""
    # GB200 NVL72: machines joined by NVLink cross over the fabric, not the NICs
    nvl = nccl_fabric.fabric(resolve("gb200-nvl72"))
    assert nvl.inter_bw_gbps > nvl.intra_bw_gbps


def test_alltoall_is_one_step_of_direct_messages():
    # gloo posts every send and receive of an all-to-all at once: a p-th of the buffer to
    # each peer, p - 1 messages a rank sharing its uplink, all issued one overhead apart.
    p, o, lat = 4, 30.0, 1.0
    topo = switch_topo(p, bw=10.0, lat=lat, overhead=o)
    n = 4 * 6000
    t, cpu = gloo.collective(topo, "alltoall", n)
    assert t == gloo.collective(topo, "alltoall", n)[0] and len(cpu) == p
    plan = gloo.exchange_plan(topo, n)
    assert {op.step for prog in plan.programs for op in prog} == {0}
    assert sum(op.kind is OpKind.SEND for op in plan.programs[0]) == p - 1
    # what lands is copied (gloo sums nothing), each source's piece into its own chunk
    recvs = [op for op in plan.programs[0] if op.kind is not OpKind.SEND]
    assert {op.kind for op in recvs} == {OpKind.RECV_COPY} and sorted(op.chunk for op in recvs) == [1, 2, 3]
    assert plan.workload.nbytes == n and plan.chunks == p
    # three messages of n/p share the sender's uplink: the last ends after all three drained
    assert t >= o + 2 * lat + (p - 1) * (n / p) / BETA - 1e-9
    assert t < 3 * (o + 2 * lat + (p - 1) * (n / p) / BETA)


def test_dcp_a2a_plans_time_one_library_alltoall():
    w = Workload(batch=4, q_heads=8, kv_heads=2, head_dim=64, split=(256,) * 4)
    share = w.rows * (64 + 1) * 4
    # GPUs: NCCL's all-to-all is its grouped sends, timed by the point-to-point model
    gpu = cluster_topo(1, 4)
    res = simulate(build("dcp-a2a", w, gpu, result="heads"), gpu)
    (coll,) = [t for t in res.timeline if t.kind == "collective" and t.rank == 0]
    assert coll.bytes == share
    want = max(gpu.cost.overhead_us + alltoall_us(gpu, share), CutModel(gpu).collective_floor_us(share // 4, 65 * 4))
    # then each rank merges the four pieces of its own rows (not four whole buffers)
    merge = ComputeModel.of(w, gpu).gather_merge_us(0, share // 4, 4)
    assert coll.end_us - coll.start_us == pytest.approx(want + merge, rel=1e-9)
    # host ranks: gloo's all-to-all schedule
    hosts = switch_topo(4, bw=0.05, lat=3.0, overhead=50.0, launch=20.0, mem_bw=20.0)
    res = simulate(build("dcp-a2a", w, hosts, result="heads"), hosts)
    (coll,) = [t for t in res.timeline if t.kind == "collective" and t.rank == 0]
    want = max(gloo.collective(hosts, "alltoall", share)[0], CutModel(hosts).collective_floor_us(share // 4, 65 * 4))
    merge = ComputeModel.of(w, hosts).gather_merge_us(0, share // 4, 4)
    assert coll.end_us - coll.start_us == pytest.approx(want + merge, rel=1e-9)


def test_alltoall_merges_each_ranks_own_rows():
    # 8 heads on 3 ranks (3, 3 and 2 heads): the exchange is timed for the largest owner, and
    # each rank then merges three pieces of its own rows.
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(256,) * 3)
    gpu = cluster_topo(1, 3)
    plan = build("dcp-a2a", w, gpu, result="heads")
    res = simulate(plan, gpu)
    colls = {t.rank: t for t in res.timeline if t.kind == "collective"}
    cm, row = ComputeModel.of(w, gpu), 65 * 4
    exchange = max(gpu.cost.overhead_us + alltoall_us(gpu, 3 * 6 * row),
                   CutModel(gpu).collective_floor_us(6 * row, row))
    for r, rows in enumerate(plan.owned_rows(None)):
        got = colls[r].end_us - colls[r].start_us
        assert got == pytest.approx(exchange + cm.gather_merge_us(r, rows * row, 3), rel=1e-9)


def test_the_lse_max_of_a_plan_is_timed_as_nccl_runs_it_without_nvlink_sharp():
    # allreduce3's max of the fp32 lse cannot run on NVLink SHARP (NCCL's ncclNvlsSupported:
    # fp32 by sum only), its sums can: on a GB200 rack the max runs a ring or tree, at least
    # 3x NVLS's time at these sizes, and the simulator charges what NCCL runs.
    topo = resolve("gb200-nvl72")
    w = Workload(batch=8, q_heads=64, kv_heads=8, head_dim=128, split=(1024,) * topo.num_ranks)
    plan = build("allreduce3", w, topo)
    res = simulate(plan, topo)
    fab = nccl_fabric.fabric(topo)
    colls = [t for t in res.timeline if t.kind == "collective" and t.rank == 0]
    cm = ComputeModel.of(w, topo)
    calls = ((("fp32", "max"), 4), (("fp32", "sum"), 128 * 4), (("fp32", "sum"), 4))
    for t, (reduction, row) in zip(colls, calls, strict=True):
        est = nccl.pick(fab, "allreduce", t.bytes, reduction=reduction)
        assert est.algorithm.value != "nvls" if reduction[1] == "max" else est.algorithm.value == "nvls"
        k = collective_kernels(plan, plan.programs[0][t.op])
        want = max(topo.cost.overhead_us + est.time_us, CutModel(topo.rated).collective_floor_us(t.bytes, row))
        assert t.end_us - t.start_us == pytest.approx(want + cm.step_local_us(0, 2 * k * t.bytes, k), rel=1e-9)
    lse = colls[0]
    assert nccl.pick(fab, "allreduce", lse.bytes, reduction=("fp32", "max")).time_us > 3 * nccl.pick(
        fab, "allreduce", lse.bytes).time_us
