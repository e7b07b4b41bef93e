"""The simulator against closed forms, contention cases and bad plans.

Closed forms use raw payload plans on hosts whose merges are free (``launch_us = 0`` and
``mem_bw_gbps = 0``: memory time not modelled), so only messages cost time:
alpha = overhead + route latency, beta = link bandwidth.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.unit.test_cost_helpers import (
    COPY,
    MERGE,
    SEND,
    binomial_programs,
    butterfly_programs,
    gpu_mesh,
    make_plan,
    mesh_topo,
    raw,
    ring_allreduce_programs,
    switch_topo,
    tree_programs,
)
from treeattn.cost.compute import ComputeModel
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError, PlanInvalidError
from treeattn.plan.ir import Op, OpKind, collective_kernels, message_bytes
from treeattn.topology.model import CostParams, Device, DeviceKind, Link, LinkKind, Topology
from treeattn.workload import Workload

REL = 1e-9


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


TOPOS = {
    # name: (builder, alpha as a function of overhead)
    "switch": (lambda p: switch_topo(p, bw=10.0, lat=1.0, overhead=2.0), 2.0 + 2 * 1.0),
    "mesh": (lambda p: mesh_topo(p, bw=10.0, lat=0.7, overhead=1.5), 1.5 + 0.7),
}
BETA = 10.0e3  # bytes per microsecond (10 GB/s)


@pytest.mark.parametrize("kind", sorted(TOPOS))
@pytest.mark.parametrize("p,k", [(2, 1), (5, 1), (5, 4), (8, 3), (7, 8)])
def test_chunked_chain_pipeline(kind, p, k):
    make, alpha = TOPOS[kind]
    topo = make(p)
    m = 16 * 24 * 7  # bytes that every k used cuts into equal chunks of whole 16-byte pieces
    plan = make_plan(tree_programs([-1, *range(p - 1)], k, broadcast=False), raw(p, m), topo, chunks=k,
                     result_ranks=[0])
    res = simulate(plan, topo)
    assert close(res.predicted_us, (p - 1 + k - 1) * (alpha + m / (k * BETA)))
    assert close(res.per_rank_finish_us[0], res.predicted_us)


@pytest.mark.parametrize("kind", sorted(TOPOS))
@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_binomial_reduce_and_broadcast(kind, p):
    make, alpha = TOPOS[kind]
    topo = make(p)
    m = 40_000
    reduce = make_plan(binomial_programs(p), raw(p, m), topo, result_ranks=[0])
    assert close(simulate(reduce, topo).predicted_us, math.log2(p) * (alpha + m / BETA))
    both = make_plan(binomial_programs(p, broadcast=True), raw(p, m), topo)
    assert close(simulate(both, topo).predicted_us, 2 * math.log2(p) * (alpha + m / BETA))


@pytest.mark.parametrize("kind", sorted(TOPOS))
@pytest.mark.parametrize("p", [2, 3, 9])
def test_star_reduce_shares_the_root_link(kind, p):
    make, alpha = TOPOS[kind]
    topo = make(p)
    m = 8_000
    reduce = make_plan(tree_programs([-1] + [0] * (p - 1), 1, broadcast=False), raw(p, m), topo, result_ranks=[0])
    res = simulate(reduce, topo)
    # switch: all p-1 flows share the root's downlink; mesh: each has its own link. Every
    # sender issues one message, so no sender waits on its own issuing.
    share = p - 1 if kind == "switch" else 1
    assert close(res.predicted_us, alpha + share * m / BETA)


@pytest.mark.parametrize("kind", sorted(TOPOS))
@pytest.mark.parametrize("p", [2, 3, 9])
@pytest.mark.parametrize("m", [8_000, 80_000])
def test_star_broadcast_issues_one_message_per_overhead(kind, p, m):
    make, alpha = TOPOS[kind]
    topo = make(p)
    o = topo.cost.overhead_us
    lat = alpha - o
    # The root issues its p-1 sends one overhead apart: the k-th drains from k o on.
    bcast = [[Op(SEND, 0, peer=v) for v in range(1, p)]] + [[Op(COPY, 0, peer=0)] for _ in range(1, p)]
    res = simulate(make_plan(bcast, raw(p, m), topo), topo)
    if kind == "mesh" or m / BETA <= o:
        # Own links (mesh), or each message drained before the next is issued (switch, m/beta
        # = 0.8 us <= o = 2 us): the last one issued arrives last, (p-1) o + lat + m/beta.
        want = (p - 1) * o + lat + m / BETA
    else:
        # Switch, m/beta = 8 us > o: the root's uplink is busy from o on without a pause (by
        # each arrival k o it has got k m bytes and drained less than (k-1) o beta), the equal
        # messages share it fairly and finish in the order issued: o + (p-1) m/beta + lat.
        want = o + (p - 1) * m / BETA + lat
    assert close(res.predicted_us, want)
    by = {t.peer: t for t in res.timeline if t.rank == 0}
    assert [by[v].end_us for v in range(1, p)] == sorted(by[v].end_us for v in range(1, p))


@pytest.mark.parametrize("kind", sorted(TOPOS))
def test_chain_broadcast_unchunked(kind):
    make, alpha = TOPOS[kind]
    p, m = 6, 12_000
    topo = make(p)
    progs = [[Op(SEND, 0, peer=1)]] + [
        [Op(COPY, 0, peer=v - 1)] + ([Op(SEND, 1, peer=v + 1)] if v + 1 < p else []) for v in range(1, p)
    ]
    assert close(simulate(make_plan(progs, raw(p, m), topo), topo).predicted_us, (p - 1) * (alpha + m / BETA))


@pytest.mark.parametrize("kind", sorted(TOPOS))
@pytest.mark.parametrize("p", [2, 3, 4, 7])
def test_ring_allreduce(kind, p):
    make, alpha = TOPOS[kind]
    topo = make(p)
    m = 4 * p * 500
    plan = make_plan(ring_allreduce_programs(p), raw(p, m), topo, chunks=p)
    res = simulate(plan, topo)
    assert close(res.predicted_us, 2 * (p - 1) * (alpha + m / (p * BETA)))
    assert all(close(f, res.predicted_us) for f in res.per_rank_finish_us)


@pytest.mark.parametrize("kind", sorted(TOPOS))
@pytest.mark.parametrize("p", [2, 4, 8])
def test_recursive_doubling(kind, p):
    make, alpha = TOPOS[kind]
    topo = make(p)
    m = 20_000
    res = simulate(make_plan(butterfly_programs(p), raw(p, m), topo), topo)
    assert close(res.predicted_us, math.log2(p) * (alpha + m / BETA))


# -- contention -------------------------------------------------------------------------------


def _senders_to(topo, senders, dst, m):
    p = topo.num_ranks
    progs = [[] for _ in range(p)]
    for s in senders:
        progs[s].append(Op(SEND, 0, peer=dst))
        progs[dst].append(Op(MERGE, 0, peer=s))
    return make_plan(progs, raw(p, m), topo, result_ranks=[dst])


def test_two_flows_on_one_link_each_get_half():
    topo = switch_topo(3, bw=10.0, lat=1.0, overhead=2.0)
    m = 50_000
    alone = simulate(_senders_to(topo, [1], 0, m), topo)
    assert close(alone.predicted_us, 2.0 + 2.0 + m / BETA)
    both = simulate(_senders_to(topo, [1, 2], 0, m), topo)
    assert close(both.predicted_us, 2.0 + 2.0 + m / (BETA / 2))


def test_max_min_fair_shares_and_release():
    # f1: 0->3 and f2: 0->2 share 0's uplink (10 GB/s); f1 and f3: 1->3 share 3's downlink
    # (30 GB/s). Other links are wide (100 GB/s). Rank 0 issues f1 (its first send) at o = 1
    # and f2 one overhead later, at 2.
    p = 4
    topo = switch_topo(p, lat=0.5, overhead=1.0, up_bw=[10, 100, 100, 100], down_bw=[100, 100, 100, 30])
    m = 100_000
    progs = [[Op(SEND, 0, peer=3), Op(SEND, 0, peer=2)], [Op(SEND, 0, peer=3)],
             [Op(MERGE, 0, peer=0)], [Op(MERGE, 0, peer=0), Op(MERGE, 0, peer=1)]]
    res = simulate(make_plan(progs, raw(p, m), topo, result_ranks=[2, 3]), topo)
    by = {(t.rank, t.op): t for t in res.timeline}
    # From 1 to 2: f1 is held to 10 by 0's uplink, f3 gets the 20 left of 3's downlink.
    # From 2: f1 and f2 halve 0's uplink (5 each) and f3 takes 25 of the downlink.
    f3_end = 2.0 + (m - 20e3) / 25e3 + 1.0
    assert close(by[(1, 0)].end_us, f3_end)
    # f3 leaving changes nothing for f1 and f2 (0's uplink is their bottleneck); f1 drains at
    # 2 + (m - 10e3)/5e3, then f2 alone gets all 10 GB/s for the 10e3 bytes it still has.
    f1_end = 2.0 + (m - 10e3) / 5e3 + 1.0
    assert close(by[(0, 0)].end_us, f1_end)
    assert close(by[(0, 1)].end_us, f1_end + 10e3 / 10e3)
    assert close(res.predicted_us, f1_end + 10e3 / 10e3)


def test_a_send_starting_while_its_sender_still_issues_waits():
    # Rank 0 issues three sends at once (drain from o, 2o, 3o). Rank 3 first receives a small
    # message from rank 4 and only then posts its receive from rank 0, at t3 = o + m/beta + lat
    # < 2o: rank 0 is still issuing (until 2o), so that message drains from 3o, not t3 + o.
    p, m = 5, 400
    topo = mesh_topo(p, bw=10.0, lat=0.7, overhead=1.5)
    o, lat = 1.5, 0.7
    progs = [[Op(SEND, 0, peer=1), Op(SEND, 0, peer=2), Op(SEND, 0, peer=3)], [Op(COPY, 0, peer=0)],
             [Op(COPY, 0, peer=0)], [Op(MERGE, 0, peer=4), Op(COPY, 1, peer=0)], [Op(SEND, 0, peer=3)]]
    res = simulate(make_plan(progs, raw(p, m), topo, result_ranks=[1, 2, 3]), topo)
    by = {(t.rank, t.op): t for t in res.timeline}
    t3 = o + m / BETA + lat
    assert t3 < 2 * o and close(by[(3, 1)].start_us, t3)
    assert close(by[(0, 0)].end_us, o + m / BETA + lat)
    assert close(by[(0, 1)].end_us, 2 * o + m / BETA + lat)
    assert close(by[(0, 2)].end_us, 3 * o + m / BETA + lat)
    assert close(res.predicted_us, 3 * o + m / BETA + lat)


def test_a_late_flow_slows_an_early_one_and_order_does_not_matter():
    # Rank 1 sends at once; rank 2 first sends a small chunk to rank 3, then joins rank 1 on
    # rank 0's downlink: from then on both get half of it, then the survivor all of it.
    p, m, k = 4, 400_000, 8
    topo = switch_topo(p, bw=10.0, lat=1.0, overhead=2.0)
    progs = [[Op(MERGE, 0, peer=1), Op(MERGE, 0, peer=2)], [Op(SEND, 0, peer=0)],
             [Op(SEND, 0, peer=3, chunk=0), Op(SEND, 1, peer=0)], [Op(MERGE, 0, peer=2, chunk=0)]]
    res = simulate(make_plan(progs, raw(p, m), topo, chunks=k, result_ranks=[0]), topo)
    join = 2.0 + (m / k) / BETA + 2.0 + 2.0  # the second flow starts draining
    left = m - (join - 2.0) * BETA  # what rank 1 still has then
    first_end = join + left / (BETA / 2) + 2.0
    second_end = join + 2 * left / BETA + (m - left) / BETA + 2.0
    by = {(t.rank, t.op): t for t in res.timeline}
    assert close(by[(1, 0)].end_us, first_end)
    assert close(by[(2, 1)].end_us, second_end)
    assert close(res.predicted_us, second_end)
    # Relabel the ranks (reverse them) in topology and plan: same times, permuted.
    perm = list(reversed(range(p)))
    topo2 = dataclasses.replace(topo, ranks=tuple(topo.ranks[perm[r]] for r in range(p)))
    inv = {perm[r]: r for r in range(p)}
    progs2 = [[dataclasses.replace(op, peer=inv[op.peer]) for op in progs[perm[r]]] for r in range(p)]
    res2 = simulate(make_plan(progs2, raw(p, m), topo2, chunks=k, result_ranks=[inv[0]]), topo2)
    assert close(res2.predicted_us, res.predicted_us)
    for r in range(p):
        assert close(res2.per_rank_finish_us[inv[r]], res.per_rank_finish_us[r])


def test_flow_to_itself_costs_only_overhead():
    topo = switch_topo(2, overhead=3.0)
    progs = [[Op(SEND, 0, peer=0), Op(MERGE, 0, peer=0)], []]
    res = simulate(make_plan(progs, raw(2, 4000), topo, result_ranks=[0]), topo)
    assert close(res.predicted_us, 3.0)


# -- compute and merges ---------------------------------------------------------------------------


def gpu_pair(mem_bw=2000.0, launch=5.0, eff=0.5, link_rates="measured"):
    """Two GPUs on an NVSwitch, links at 100 GB/s. The closed forms below count those 100 GB/s
    (rates as measured); ``link_rates="datasheet"`` lets NCCL's rating of NVLink apply."""
    devs = [Device("g0", DeviceKind.GPU, node=0, mem_bw_gbps=mem_bw),
            Device("g1", DeviceKind.GPU, node=0, mem_bw_gbps=mem_bw / 2), Device("sw", DeviceKind.NVSWITCH)]
    links = [Link("g0", "sw", LinkKind.NVLINK, 100.0, 0.5), Link("sw", "g0", LinkKind.NVLINK, 100.0, 0.5),
             Link("g1", "sw", LinkKind.NVLINK, 100.0, 0.5), Link("sw", "g1", LinkKind.NVLINK, 100.0, 0.5)]
    return Topology("pair", devs, links, ["g0", "g1"], cost=CostParams(overhead_us=1.0, launch_us=launch,
                                                                          mem_efficiency=eff, link_rates=link_rates))


def one_send_us(topo: Topology, w: Workload) -> float:
    """How long rank 0's one send of its partial to rank 1 takes in the simulator."""
    progs = [[Op(OpKind.COMPUTE, 0), Op(SEND, 1, peer=1)], [Op(OpKind.COMPUTE, 0), Op(MERGE, 1, peer=0)]]
    t = {(x.rank, x.op): x for x in simulate(make_plan(progs, w, topo), topo).timeline}[(0, 1)]
    return t.end_us - t.start_us


def test_gpu_transfers_reach_nccls_rating_of_datasheet_links():
    from treeattn.cost.nccl_rates import nccl_link_bw_gbps

    w = Workload(batch=4, q_heads=32, kv_heads=8, head_dim=128, split=(1, 1))

    def transfer_us(topo):
        return one_send_us(topo, w)

    measured, datasheet = gpu_pair(), gpu_pair(link_rates="datasheet")
    rated = nccl_link_bw_gbps(datasheet.links[0])
    assert rated == pytest.approx(100.0 * 20.6 / 25.0)  # an H100-class NVLink (the devices name no model)
    assert close(transfer_us(measured), 1.0 + 1.0 + w.payload_bytes / 100e3)
    assert close(transfer_us(datasheet), 1.0 + 1.0 + w.payload_bytes / (rated * 1e3))
    assert datasheet.fingerprint != measured.fingerprint


def test_compute_and_merge_costs_follow_the_model():
    topo = gpu_pair()
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(1000, 0))
    progs = [[Op(OpKind.COMPUTE, 0), Op(MERGE, 1, peer=1)], [Op(OpKind.COMPUTE, 0), Op(SEND, 1, peer=0)]]
    plan = make_plan(progs, w, topo, result_ranks=[0])
    res = simulate(plan, topo)
    kv = 2 * 2 * 2 * 1000 * 64 * 2
    q = 2 * 8 * 64 * 2
    part = w.payload_bytes
    c0 = 5.0 + (kv + q + part) / (2000.0 * 0.5 * 1e3)
    c1 = 5.0  # zero tokens: the launch only
    msg = 1.0 + 1.0 + part / 100e3
    merge = 5.0 + 3 * part / (2000.0 * 0.5 * 1e3)
    by = {(t.rank, t.op): t for t in res.timeline}
    assert close(by[(0, 0)].end_us, c0) and close(by[(1, 0)].end_us, c1)
    assert close(by[(0, 1)].start_us, max(c0, c1))
    assert close(res.predicted_us, max(c0, c1) + msg + merge)
    assert close(res.per_rank_finish_us[1], max(c0, c1) + msg)


@pytest.mark.parametrize(("chunks_of", "copies", "kernels"), [
    ((0, 0, 0), 0, 1),     # three partials for one chunk: merged at once
    ((0, 1, 0), 0, 2),     # two chunks merged into
    ((None, None, None), 0, 1),
    ((0, 1, None), 0, 3),  # chunk None (every row) is a target of its own
    ((0,), 2, 3),          # each copy one: the executor stores each copied chunk on its own
])
def test_a_step_pays_one_launch_per_chunk_merged_and_one_per_copy(chunks_of, copies, kernels):
    launch = 7.0
    p = 1 + len(chunks_of) + copies
    topo = switch_topo(p, launch=launch)
    recvs = [Op(MERGE, 0, peer=i + 1, chunk=c) for i, c in enumerate(chunks_of)]
    recvs += [Op(COPY, 0, peer=len(chunks_of) + 1 + i, chunk=2 + i) for i in range(copies)]
    progs = [recvs] + [[Op(SEND, 0, peer=0, chunk=op.chunk)] for op in recvs]
    plan = make_plan(progs, raw(p, 4096), topo, chunks=4, result_ranks=[0])
    free = simulate(plan, dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, launch_us=0.0)))
    res = simulate(plan, topo)
    assert close(res.per_rank_finish_us[0] - free.per_rank_finish_us[0], kernels * launch)


def test_collective_steps_run_together_and_take_ncclish_time():
    from treeattn.cost import nccl
    from treeattn.cost.bounds import CutModel

    topo = gpu_pair()
    w = Workload(batch=1, q_heads=8, kv_heads=8, head_dim=64, split=(500, 1500))
    coll_op = Op(OpKind.COLLECTIVE, 1, coll="allreduce", reduce="merge", part="partial")
    progs = [[Op(OpKind.COMPUTE, 0), coll_op] for _ in range(2)]
    res = simulate(make_plan(progs, w, topo), topo)
    c_slow = max(simulate(make_plan([[Op(OpKind.COMPUTE, 0)], [Op(OpKind.COMPUTE, 0)]], w, topo), topo)
                 .per_rank_finish_us)
    # An allreduce with the merge is two library calls (max of lse, then sum of (w o, w)), each
    # paying the overhead of issuing it on top of NCCL's time.
    cuts = CutModel(topo)
    lse = w.rows * 4
    coll = sum(max(topo.cost.overhead_us + nccl.pick(topo, "allreduce", n).time_us, cuts.collective_floor_us(n, row))
               for n, row in ((lse, 4), (w.payload_bytes, w.row_bytes)))
    # It ends on both ranks at once; then each runs its three other kernels (the lse copied
    # out, the weights, the finish), each reading and writing the rows once.
    cm = ComputeModel.of(w, topo)
    local = [cm.step_local_us(r, 2 * 3 * w.payload_bytes, 3) for r in range(2)]
    assert local[0] > 3 * topo.cost.launch_us
    for r in range(2):
        assert close(res.per_rank_finish_us[r], c_slow + coll + local[r])
    # The rank that arrived first waited for the other: its collective's predecessor is the other's.
    assert res.critical_path[-1][1] == 1


def test_the_weighted_sum_carries_its_weight_in_the_partial_dtype():
    import torch

    from treeattn.exec import kernels
    from treeattn.plan.builders import build
    from treeattn.plan.ir import TopologyRef, collective_row_bytes, row_bytes

    w = Workload(batch=1, q_heads=8, kv_heads=8, head_dim=64, split=(500, 1500), partial_dtype="bf16")
    # An all-reduce of (w o, w) sums D + 1 values of the partial dtype (what kernels.weighted
    # gives the collective); a point-to-point partial's row keeps its lse as 4 fp32 bytes.
    packed = kernels.weighted(torch.zeros(w.rows, 65), torch.zeros(w.rows), torch.bfloat16)
    assert row_bytes(w, "wnum") == packed[0].nbytes == 65 * 2 and w.row_bytes == 64 * 2 + 4
    assert collective_row_bytes(w, "allreduce", "wnum") == 65 * 2
    # No library reduces fp8: the executor's Comm reduces it through an fp32 copy (tensor.float()),
    # 4 bytes an element on the wire and beside the buffer in memory; an all-gather moves its bytes.
    w8 = Workload(batch=1, q_heads=8, kv_heads=8, head_dim=64, split=(500, 1500), partial_dtype="fp8")
    packed8 = kernels.weighted(torch.zeros(w8.rows, 65), torch.zeros(w8.rows), torch.float8_e4m3fn)
    for coll in ("allreduce", "reducescatter", "reduce"):
        assert collective_row_bytes(w8, coll, "wnum") == packed8[0].float().nbytes == 65 * 4
    assert collective_row_bytes(w8, "allgather", "partial") == w8.row_bytes == 64 + 4
    topo = gpu_pair()
    t8, t16 = (simulate(build("allreduce2", x, TopologyRef(topo.name, topo.fingerprint)), topo).predicted_us
               for x in (w8, w))
    assert t8 > t16  # fp8's rows move as fp32: twice bf16's bytes


# -- results ------------------------------------------------------------------------------------


def test_critical_path_is_a_chain_ending_at_the_last_finisher():
    p = 8
    topo = switch_topo(p)
    plan = make_plan(tree_programs([-1, 0, 0, 1, 1, 2, 2, 3], 2), raw(p, 8000), topo, chunks=2)
    res = simulate(plan, topo)
    last = max(range(p), key=lambda r: (res.per_rank_finish_us[r], -r))
    assert res.critical_path[-1][0] == last
    times = {(t.rank, t.op): t for t in res.timeline}
    for a, b in zip(res.critical_path, res.critical_path[1:], strict=False):
        assert times[a].start_us <= times[b].start_us
    assert len(res.timeline) == sum(len(prog) for prog in plan.programs)
    assert max(res.per_rank_finish_us) == res.predicted_us
    assert simulate(plan, topo, timeline=False).timeline is None
    assert simulate(plan, topo, timeline=False).to_dict() == res.to_dict()


# -- bad plans --------------------------------------------------------------------------------


def test_rank_count_mismatch_names_both_numbers():
    topo = switch_topo(4)
    plan = make_plan(binomial_programs(2), raw(2, 400), switch_topo(2))
    with pytest.raises(InputError, match=r"2 ranks.*4"):
        simulate(plan, topo)


def test_deadlock_is_reported_not_hung():
    topo = switch_topo(2)
    progs = [[Op(MERGE, 0, peer=1), Op(SEND, 1, peer=1)], [Op(MERGE, 0, peer=0), Op(SEND, 1, peer=0)]]
    with pytest.raises(PlanInvalidError, match="deadlock.*rank 0.*recv chunk None from rank 1"):
        simulate(make_plan(progs, raw(2, 400), topo), topo)


def test_unmatched_send_is_reported():
    topo = switch_topo(2)
    progs = [[Op(SEND, 0, peer=1), Op(SEND, 1, peer=1)], [Op(MERGE, 0, peer=0)]]
    with pytest.raises(PlanInvalidError, match="no matching op"):
        simulate(make_plan(progs, raw(2, 400), topo), topo)


def test_disagreeing_chunks_and_lonely_collectives_are_rejected():
    topo = switch_topo(2)
    progs = [[Op(SEND, 0, peer=1, chunk=0)], [Op(MERGE, 0, peer=0, chunk=1)]]
    with pytest.raises(PlanInvalidError, match="chunk 0.*chunk 1"):
        simulate(make_plan(progs, raw(2, 400), topo, chunks=2), topo)
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=8, split=(4, 4))
    coll = Op(OpKind.COLLECTIVE, 0, coll="allreduce", reduce="merge", part="partial")
    progs = [[coll, Op(SEND, 0, peer=1)], [coll, Op(MERGE, 0, peer=0)]]
    with pytest.raises(PlanInvalidError, match="step of its own"):
        simulate(make_plan(progs, w, topo), topo)
    progs = [[Op(OpKind.COMPUTE, 0), Op(OpKind.COMPUTE, 0, block=1)], [Op(OpKind.COMPUTE, 0)]]
    with pytest.raises(PlanInvalidError, match="at most one compute"):
        simulate(make_plan(progs, w, topo), topo)


@pytest.mark.parametrize("tokens", [100, 4000, 40000])
def test_compute_runs_beside_the_transfers_of_its_step(tokens):
    # Ring attention over two GPUs: step 0 computes the own block while the blocks cross,
    # step 1 computes the received one. Step 0 ends at max(compute, transfer).
    topo = gpu_pair(mem_bw=2000.0, launch=5.0, eff=0.5)
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(tokens, tokens))
    B = OpKind.COMPUTE
    progs = [[Op(B, 0), Op(SEND, 0, peer=1, block=0), Op(COPY, 0, peer=1, block=1), Op(B, 1, block=1)],
             [Op(B, 0), Op(SEND, 0, peer=0, block=1), Op(COPY, 0, peer=0, block=0), Op(B, 1, block=0)]]
    res = simulate(make_plan(progs, w, topo), topo)
    kv = w.kv_bytes(0)
    q = 2 * 8 * 64 * 2
    c0 = 5.0 + (kv + q + w.payload_bytes) / (2000.0 * 0.5 * 1e3)  # rank 0's device
    c1 = 5.0 + (kv + q + w.payload_bytes) / (1000.0 * 0.5 * 1e3)  # rank 1's is half as fast
    xfer = 1.0 + 1.0 + kv / 100e3  # overhead, two hops of 0.5 us, the block at 100 GB/s
    by = {(t.rank, t.op): t for t in res.timeline}
    assert close(by[(0, 0)].end_us, c0) and close(by[(0, 1)].end_us, xfer)
    assert close(by[(0, 3)].start_us, max(c0, xfer))
    assert close(res.per_rank_finish_us[0], max(c0, xfer) + c0)
    assert close(res.predicted_us, max(c1, xfer) + c1)


def test_reduce_scatter_reduce_and_gathers_are_timed_by_their_calls():
    from treeattn.cost import nccl
    from treeattn.cost.bounds import CutModel

    topo = gpu_pair()
    cuts = CutModel(topo)
    w = Workload(batch=2, q_heads=8, kv_heads=8, head_dim=64, split=(500, 1500))
    lse = w.rows * 4

    def coll_time(*calls):
        return sum(max(topo.cost.overhead_us + nccl.pick(topo, c, size).time_us, cuts.collective_floor_us(fl, row))
                   for c, size, fl, row in calls)

    cm = ComputeModel.of(w, topo)

    def local(plan, op, rank=None):
        """The kernels around the calls (``collective_kernels``): on ``rank``, else the slower rank."""
        k = collective_kernels(plan, op)
        us = [cm.step_local_us(r, 2 * k * message_bytes(plan, op), k) for r in range(2)]
        return max(us) if rank is None else us[rank]

    def run(op, layout="full", chunks=1, result_ranks=None):
        progs = [[Op(OpKind.COMPUTE, 0), op] for _ in range(2)]
        plan = make_plan(progs, w, topo, chunks=chunks, layout=layout, result_ranks=result_ranks)
        computed = max(simulate(make_plan([[Op(OpKind.COMPUTE, 0)]] * 2, w, topo), topo).per_rank_finish_us)
        return simulate(plan, topo).predicted_us - computed - local(plan, op)

    rs = Op(OpKind.COLLECTIVE, 1, coll="reducescatter", reduce="merge", part="partial")
    assert close(run(rs, "heads", 2), coll_time(("allreduce", lse, lse, 4),
                                                ("reducescatter", w.payload_bytes, w.payload_bytes // 2, w.row_bytes)))
    red = Op(OpKind.COLLECTIVE, 1, peer=1, coll="reduce", reduce="merge", part="partial")
    assert close(run(red, result_ranks=[1]), coll_time(("allreduce", lse, lse, 4),
                                                       ("reduce", w.payload_bytes, w.payload_bytes, w.row_bytes)))
    q_share = 2 * 8 * 64 * 2 // 2
    progs = [[Op(OpKind.COLLECTIVE, 0, coll="allgather", reduce="copy", part="q"), Op(OpKind.COMPUTE, 1),
              Op(OpKind.COLLECTIVE, 2, coll="allgather", reduce="copy", part="lse"),
              Op(OpKind.COLLECTIVE, 3, coll="reducescatter", reduce="sum", part="num")] for _ in range(2)]
    plan = make_plan(progs, w, topo, chunks=2, layout="heads")
    res = simulate(plan, topo)
    by = {(t.rank, t.op): t for t in res.timeline}
    ops = plan.programs[0]
    assert close(by[(0, 0)].end_us, coll_time(("allgather", 2 * q_share, q_share, q_share)) + local(plan, ops[0], 0))
    num = w.rows * 64 * 4
    gathered = by[(0, 2)].end_us - by[(0, 2)].start_us
    assert gathered > coll_time(("allgather", 2 * lse, lse, 4)) + local(plan, ops[2], 0)  # and the correction
    assert close(by[(0, 3)].end_us - by[(0, 3)].start_us,
                 coll_time(("reducescatter", num, num // 2, 64 * 4)) + local(plan, ops[3], 0))


def test_a_ranks_later_computes_pay_the_next_launch():
    topo = gpu_pair()
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(1000, 1000))
    # Each rank computes its own block, then the other's (as ring attention does), then merges.
    progs = [[Op(OpKind.COMPUTE, 0, block=0), Op(OpKind.COMPUTE, 1, block=1)],
             [Op(OpKind.COMPUTE, 0, block=1), Op(OpKind.COMPUTE, 1, block=0)]]
    plan = make_plan(progs, w, topo, result_ranks=[0, 1])
    base = simulate(plan, topo).predicted_us
    cheap = dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, attn_next_launch_us=1.0))
    got = simulate(plan, cheap)
    by = {(t.rank, t.op): t for t in got.timeline}
    first = by[(0, 0)].end_us
    assert close(first, by[(0, 1)].end_us - (first - 5.0 + 1.0))  # same bytes, launch 1 instead of 5
    assert close(got.predicted_us, base - 4.0)
    # One COMPUTE per rank: nothing changes.
    one = make_plan([[Op(OpKind.COMPUTE, 0)], [Op(OpKind.COMPUTE, 0)]], w, topo, result_ranks=[0, 1])
    assert simulate(one, cheap).predicted_us == simulate(one, topo).predicted_us


@pytest.mark.parametrize("nbytes,communicator,channels", [
    (256 << 10, "pair", 4),       # parts of at least 64 KiB: 4 channels
    (32 << 20, "pair", 16),       # a two-rank communicator starts on 16 of its 32 channels
    (32 << 20, "world", 4),       # 8 ranks share 32 channels: 4 each (nccl-tests' sendrecv)
])
def test_a_gpu_send_runs_on_nccls_channels_for_its_size(nbytes, communicator, channels):
    from treeattn.topology.library import resolve

    topo = resolve("dgx-h100")
    progs = [[Op(SEND, 0, peer=1)], [Op(COPY, 0, peer=0)]] + [[] for _ in range(6)]
    plan = make_plan(progs, raw(8, nbytes), topo)
    t = {(x.rank, x.op): x for x in simulate(plan, topo, communicator=communicator).timeline}[(0, 0)]
    lat = topo.route_latency_us(0, 1)
    # one channel moves one NVLink's worth as NCCL rates it (20.6 GB/s on Hopper)
    assert close(t.end_us - t.start_us, topo.cost.overhead_us + nbytes / (channels * 20.6e3) + lat)


def test_host_ranks_keep_their_model_under_the_point_to_point_cap():
    topo = switch_topo(2, bw=10.0, lat=1.0, overhead=2.0)
    plan = make_plan([[Op(SEND, 0, peer=1)], [Op(COPY, 0, peer=0)]], raw(2, 1 << 20), topo)
    for communicator in ("pair", "world"):
        assert close(simulate(plan, topo, communicator=communicator).predicted_us, 2.0 + 2 * 1.0 + (1 << 20) / 10e3)


def test_a_transfer_between_gpus_without_peer_to_peer_moves_at_nccls_shared_memory_rate():
    from treeattn.cost.nccl_rates import SHM_GBPS, shm_pair_gbps
    from treeattn.topology.library import resolve

    w = Workload(batch=64, q_heads=32, kv_heads=8, head_dim=128, split=(1, 1))
    bounced = resolve("rtx4090:gpus=2")
    assert shm_pair_gbps(bounced, 0, 1) == shm_pair_gbps(bounced, 1, 0) == SHM_GBPS
    lat = sum(bounced.links[i].latency_us for i in bounced.route(0, 1)) + bounced.cost.overhead_us
    assert one_send_us(bounced, w) == pytest.approx(lat + w.payload_bytes / (SHM_GBPS * 1e3), rel=1e-9)
    # The search's floor drains the same send at the same rate.
    from treeattn.plan.builders import build
    from treeattn.search.evaluate import Evaluator

    plan = build("star", w, bounced)
    assert Evaluator(bounced, w).floor_us(plan) <= simulate(plan, bounced).predicted_us
    assert Evaluator(bounced, w)._pair_cost(0, 1)[1] == pytest.approx(SHM_GBPS * 1e3)
    # Measured link rates (a calibrated machine) stand as they are.
    measured = dataclasses.replace(bounced, cost=dataclasses.replace(bounced.cost, link_rates="measured"))
    assert shm_pair_gbps(measured, 0, 1) == math.inf
    assert one_send_us(measured, w) < one_send_us(bounced, w) / 5


def _pcie_pair(p2p: tuple[bool, bool], nodes: tuple[int, int]) -> Topology:
    """Two GPUs on PCIe: on one node, through its CPU, or on two, each through its own NIC."""
    devs = [Device("g0", DeviceKind.GPU, node=nodes[0], p2p=p2p[0], model="RTX-4090", mem_bw_gbps=1000.0),
            Device("g1", DeviceKind.GPU, node=nodes[1], p2p=p2p[1], model="RTX-4090", mem_bw_gbps=1000.0)]
    links = []

    def duplex(a, b, kind, bw, lat):
        links.extend([Link(a, b, kind, bw, lat), Link(b, a, kind, bw, lat)])

    if nodes[0] == nodes[1]:
        devs.append(Device("c0", DeviceKind.CPU, node=nodes[0]))
        duplex("g0", "c0", LinkKind.PCIE, 25.0, 0.5)
        duplex("g1", "c0", LinkKind.PCIE, 25.0, 0.5)
    else:
        devs += [Device("n0", DeviceKind.NIC, node=nodes[0]), Device("n1", DeviceKind.NIC, node=nodes[1]),
                 Device("sw", DeviceKind.SWITCH, node=-1)]
        for g in (0, 1):
            duplex(f"g{g}", f"n{g}", LinkKind.PCIE, 25.0, 0.5)
            duplex(f"n{g}", "sw", LinkKind.ROCE, 12.5, 2.0)
    return Topology("pcie-pair", devs, links, ["g0", "g1"], cost=CostParams(overhead_us=1.0))


def test_the_shared_memory_rate_binds_both_ways_inside_a_node_and_not_across_nodes():
    from treeattn.cost import nccl, nccl_fabric, nccl_rates

    mixed = _pcie_pair((True, False), (0, 0))
    assert nccl_rates.shm_pair_gbps(mixed, 0, 1) == nccl_rates.shm_pair_gbps(mixed, 1, 0) == nccl_rates.SHM_GBPS
    assert nccl_fabric.fabric(mixed).shm_gbps == nccl_rates.SHM_GBPS
    # Both with peer-to-peer, joined through their CPU: NCCL's default P2P level (PXB) stops
    # short of a host bridge, so host memory again; at NCCL_P2P_LEVEL=PHB peer-to-peer.
    both = _pcie_pair((True, True), (0, 0))
    assert nccl_rates.shm_pair_gbps(both, 0, 1) == nccl_rates.SHM_GBPS
    phb = dataclasses.replace(both, cost=dataclasses.replace(both.cost, p2p_level="PHB"))
    assert nccl_rates.shm_pair_gbps(phb, 0, 1) == math.inf and nccl_fabric.fabric(phb).shm_gbps == 0.0
    apart = _pcie_pair((False, False), (0, 1))
    assert nccl_rates.shm_pair_gbps(apart, 0, 1) == math.inf and nccl_fabric.fabric(apart).shm_gbps == 0.0
    big = nccl.pick(apart, "allreduce", 1 << 28)
    assert big.busbw_gbps > 2 * nccl_rates.SHM_GBPS


# -- issuing on GPUs: one NCCL group a peer and step, both sides ------------------------------


@pytest.mark.parametrize("p", [2, 3, 9])
def test_a_gpu_root_issues_a_group_for_each_peer_it_receives_from(p):
    topo, m = gpu_mesh(p), 8_000
    o, lat = topo.cost.overhead_us, 0.7
    star = make_plan(tree_programs([-1] + [0] * (p - 1), 1, broadcast=False), raw(p, m), topo, result_ranks=[0])
    # The root's groups go out one overhead apart, in ascending peer rank: the last message
    # moves once the root's (p-1)-th group is issued. nccl-tests' one group a call (world) and
    # host ranks charge the sender alone, who issues one.
    res = simulate(star, topo)
    assert close(res.predicted_us, (p - 1) * o + lat + m / BETA)
    landed = {t.peer: t.end_us for t in res.timeline if t.rank == 0 and t.peer is not None}
    assert [landed[v] for v in range(1, p)] == sorted(landed.values())
    assert close(simulate(star, topo, communicator="world").predicted_us, o + lat + m / BETA)
    host = mesh_topo(p, bw=10.0, lat=0.7, overhead=1.5)
    assert close(simulate(make_plan(star.programs, raw(p, m), host, result_ranks=[0]), host).predicted_us,
                 o + lat + m / BETA)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_a_gpu_exchange_with_one_peer_both_ways_is_one_group(p):
    topo, m = gpu_mesh(p), 20_000
    res = simulate(make_plan(butterfly_programs(p), raw(p, m), topo), topo)
    assert close(res.predicted_us, math.log2(p) * (1.5 + 0.7 + m / BETA))


def test_a_gpu_ring_step_is_two_groups_and_a_message_waits_for_the_later_side():
    p, m = 4, 4_000
    topo = gpu_mesh(p)
    o, lat = topo.cost.overhead_us, 0.7
    # One step: every rank sends to the next and receives from the one before (two peers).
    progs = [[Op(SEND, 0, peer=(r + 1) % p), Op(COPY, 0, peer=(r - 1) % p)] for r in range(p)]
    res = simulate(make_plan(progs, raw(p, m), topo), topo)
    arrive = {t.rank: t.end_us for t in res.timeline if t.peer == (t.rank - 1) % p}
    # r -> r+1 waits for the later of r's group for r+1 and r+1's group for r, each the first
    # or second of its rank's two (ascending peer): 0 -> 1 is first on both sides; 3 -> 0 is
    # first at 3 and second at 0; the middle ones second at the sender.
    assert close(arrive[1], o + lat + m / BETA)
    assert all(close(arrive[r], 2 * o + lat + m / BETA) for r in (0, 2, 3))


@pytest.mark.parametrize("gpu", [True, False])
def test_an_empty_message_is_not_sent_and_waits_for_no_peer(gpu):
    # Ring attention over shards of 0, 0, 1K and 1K tokens: the empty KV blocks are messages
    # of 0 bytes, which Comm.post leaves out: each side's op is done when its step is posted,
    # whenever the peer posts its own.
    from treeattn.plan.builders import build
    from treeattn.plan.ir import TopologyRef
    from treeattn.search import Evaluator
    from treeattn.search.explain import explain

    topo = gpu_mesh(4) if gpu else mesh_topo(4, bw=10.0, lat=0.7, overhead=1.5)
    w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=64, split=(0, 0, 1024, 1024))
    plan = build("ring-attention", w, TopologyRef.of(topo))
    res = simulate(plan, topo)
    empty = [t for t in res.timeline if t.peer is not None and t.bytes == 0]
    assert len(empty) == 12
    assert all(t.end_us == t.start_us for t in empty)
    sent = [t for t in res.timeline if t.peer is not None and t.bytes > 0]
    assert all(t.end_us >= t.start_us + 1.5 + 0.7 for t in sent)
    # the search's floor (which leaves empty messages out alike) stays under the simulation
    assert Evaluator(topo, w).floor_us(plan) <= res.predicted_us
    # and what is counted as sent, here and in `plan --explain`, is what moves
    assert res.transfers == len(sent) // 2
    assert sum(lv.transfers for lv in explain(plan, topo).levels) == res.transfers
