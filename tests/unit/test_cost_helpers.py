"""Small uniform topologies and hand-built plans shared by the cost-model tests.

Topologies: ``switch_topo`` puts p hosts on one ideal switch (every route is two links:
the sender's uplink and the receiver's downlink, each ``bw`` GB/s and ``lat`` us), so
alpha = overhead + 2 lat; ``mesh_topo`` joins every pair directly (alpha = overhead + lat).
Hosts have ``mem_bw_gbps = 0`` and the topologies ``launch_us = 0`` by default, so merges
cost nothing (memory time is not modelled on such devices) and closed forms hold exactly.

Plans use raw payloads (no COMPUTE); ``rows`` of 4 bytes each.
"""

from __future__ import annotations

import dataclasses

from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.topology.model import CostParams, Device, DeviceKind, Link, LinkKind, Topology
from treeattn.workload import RawPayload

SEND, MERGE, COPY = OpKind.SEND, OpKind.RECV_MERGE, OpKind.RECV_COPY


def switch_topo(p: int, *, bw: float = 10.0, lat: float = 1.0, overhead: float = 2.0, launch: float = 0.0,
                mem_bw: float = 0.0, up_bw: list[float] | None = None, down_bw: list[float] | None = None) -> Topology:
    devices = [Device(f"h{i}", DeviceKind.HOST, node=i, mem_bw_gbps=mem_bw) for i in range(p)]
    devices.append(Device("sw", DeviceKind.SWITCH, node=-1))
    links = []
    for i in range(p):
        links.append(Link(f"h{i}", "sw", LinkKind.INFINIBAND, up_bw[i] if up_bw else bw, lat))
        links.append(Link("sw", f"h{i}", LinkKind.INFINIBAND, down_bw[i] if down_bw else bw, lat))
    return Topology(name=f"switch{p}", devices=devices, links=links, ranks=[f"h{i}" for i in range(p)],
                    cost=CostParams(overhead_us=overhead, launch_us=launch, mem_efficiency=1.0))


def mesh_topo(p: int, *, bw: float = 10.0, lat: float = 1.0, overhead: float = 2.0) -> Topology:
    devices = [Device(f"h{i}", DeviceKind.HOST, node=i) for i in range(p)]
    links = [Link(f"h{i}", f"h{j}", LinkKind.ETHERNET, bw, lat) for i in range(p) for j in range(p) if i != j]
    return Topology(name=f"mesh{p}", devices=devices, links=links, ranks=[f"h{i}" for i in range(p)],
                    cost=CostParams(overhead_us=overhead, launch_us=0.0, mem_efficiency=1.0))


def gpu_mesh(p: int, *, bw: float = 10.0, lat: float = 0.7, overhead: float = 1.5) -> Topology:
    """``mesh_topo`` on GPUs: own links at the rates given (measured), memory too fast to count."""
    devices = [Device(f"g{i}", DeviceKind.GPU, node=i, mem_bw_gbps=1e15) for i in range(p)]
    links = [Link(f"g{i}", f"g{j}", LinkKind.ETHERNET, bw, lat) for i in range(p) for j in range(p) if i != j]
    return Topology(name=f"gmesh{p}", devices=devices, links=links, ranks=[f"g{i}" for i in range(p)],
                    cost=CostParams(overhead_us=overhead, launch_us=0.0, mem_efficiency=1.0, link_rates="measured"))


def raw(p: int, nbytes: int) -> RawPayload:
    return RawPayload(nbytes=nbytes, ranks=p)


def make_plan(programs, payload, topo: Topology, *, chunks: int = 1, result_ranks=None, name: str = "hand",
              layout: str = "full") -> Plan:
    p = len(programs)
    return Plan(algorithm=name, params={}, workload=payload, topology=TopologyRef(topo.name, topo.fingerprint),
                chunks=chunks, programs=[tuple(prog) for prog in programs],
                result_ranks=tuple(range(p)) if result_ranks is None else tuple(result_ranks), layout=layout)


def tree_programs(parents: list[int], chunks: int, *, broadcast: bool = True, compute: bool = False):
    """Pipelined reduce up a tree (children received together, one chunk a step) then,
    if ``broadcast``, pipelined broadcast down it. ``parents[root] = -1``."""
    p = len(parents)
    kids = [[v for v in range(p) if parents[v] == u] for u in range(p)]
    progs: list[list[Op]] = []
    for v in range(p):
        ops: list[Op] = []
        step = 0
        if compute:
            ops.append(Op(OpKind.COMPUTE, 0))
            step = 1
        k = chunks
        # reduce: step j receives chunk j from the children and sends chunk j-1 up
        for j in range(k + 1):
            this = []
            if j >= 1 and parents[v] >= 0:
                this.append(Op(SEND, step, peer=parents[v], chunk=j - 1))
            if j < k:
                this.extend(Op(MERGE, step, peer=c, chunk=j) for c in kids[v])
            if this:
                ops.extend(this)
                step += 1
        if broadcast:
            for j in range(k + 1):
                this = []
                if j < k and parents[v] >= 0:
                    this.append(Op(COPY, step, peer=parents[v], chunk=j))
                src = j - 1 if parents[v] >= 0 else j
                if 0 <= src < k and (parents[v] >= 0 or j < k):
                    this.extend(Op(SEND, step, peer=c, chunk=src) for c in kids[v])
                if this:
                    ops.extend(this)
                    step += 1
        progs.append(ops)
    return progs


def test_tree_programs_shape():
    progs = tree_programs([-1, 0, 1], chunks=2, broadcast=True)
    # the leaf sends two chunks up, then receives two chunks down
    assert [o.kind for o in progs[2]] == [SEND, SEND, COPY, COPY]
    assert sum(o.kind is SEND for prog in progs for o in prog) == sum(
        o.kind in (MERGE, COPY) for prog in progs for o in prog)


def binomial_programs(p: int, *, reduce: bool = True, broadcast: bool = False):
    """Round-by-round binomial reduce to rank 0 (round j: ranks with lowest set bit 2^j send
    to rank - 2^j) and/or the mirrored broadcast; one whole-payload message per round."""
    rounds = (p - 1).bit_length()
    progs: list[list[Op]] = [[] for _ in range(p)]
    step = 0
    if reduce:
        for j in range(rounds):
            for v in range(p):
                low = v & -v if v else 1 << rounds
                if low == 1 << j:
                    progs[v].append(Op(SEND, step, peer=v - (1 << j)))
                elif low > 1 << j and v + (1 << j) < p:
                    progs[v].append(Op(MERGE, step, peer=v + (1 << j)))
            step += 1
    if broadcast:
        for j in reversed(range(rounds)):
            for v in range(p):
                low = v & -v if v else 1 << rounds
                if low == 1 << j:
                    progs[v].append(Op(COPY, step, peer=v - (1 << j)))
                elif low > 1 << j and v + (1 << j) < p:
                    progs[v].append(Op(SEND, step, peer=v + (1 << j)))
            step += 1
    return progs


def ring_allreduce_programs(p: int):
    """Reduce-scatter then all-gather around the ring r -> r+1, ``p`` chunks."""
    progs: list[list[Op]] = [[] for _ in range(p)]
    for s in range(p - 1):
        for r in range(p):
            progs[r].append(Op(SEND, s, peer=(r + 1) % p, chunk=(r - s) % p))
            progs[r].append(Op(MERGE, s, peer=(r - 1) % p, chunk=(r - s - 1) % p))
    for s in range(p - 1):
        for r in range(p):
            progs[r].append(Op(SEND, p - 1 + s, peer=(r + 1) % p, chunk=(r + 1 - s) % p))
            progs[r].append(Op(COPY, p - 1 + s, peer=(r - 1) % p, chunk=(r - s) % p))
    return progs


def butterfly_programs(p: int):
    """Recursive doubling: in round j every rank swaps its whole buffer with rank ^ 2^j."""
    progs: list[list[Op]] = [[] for _ in range(p)]
    for j in range(p.bit_length() - 1):
        for r in range(p):
            progs[r].append(Op(SEND, j, peer=r ^ (1 << j)))
            progs[r].append(Op(MERGE, j, peer=r ^ (1 << j)))
    return progs


def cluster_topo(nodes: int, gpus: int, *, nvl_bw: float = 300.0, nvl_lat: float = 0.3, net_bw: float = 25.0,
                 net_lat: float = 1.0, mem_bw: float = 2000.0, overhead: float = 2.0, launch: float = 4.0,
                 spines: int = 1) -> Topology:
    """``nodes`` x ``gpus`` GPUs: an NVSwitch per node; every GPU also has its own network port
    on one leaf per GPU index (rail), leaves joined by ``spines`` spine switches."""
    devices, links = [], []

    def duplex(a, b, kind, bw, lat):
        links.append(Link(a, b, kind, bw, lat))
        links.append(Link(b, a, kind, bw, lat))

    for g in range(gpus):
        devices.append(Device(f"leaf{g}", DeviceKind.SWITCH, node=-1))
    for s in range(spines):
        devices.append(Device(f"spine{s}", DeviceKind.SWITCH, node=-1))
        for g in range(gpus):
            duplex(f"leaf{g}", f"spine{s}", LinkKind.INFINIBAND, net_bw * 2, net_lat)
    ranks = []
    for n in range(nodes):
        if gpus > 1:
            devices.append(Device(f"n{n}.nvs", DeviceKind.NVSWITCH, node=n))
        for g in range(gpus):
            name = f"n{n}.g{g}"
            devices.append(Device(name, DeviceKind.GPU, node=n, mem_bw_gbps=mem_bw, model="H100"))
            if gpus > 1:
                duplex(name, f"n{n}.nvs", LinkKind.NVLINK, nvl_bw, nvl_lat)
            if nodes > 1:
                duplex(name, f"leaf{g}", LinkKind.INFINIBAND, net_bw, net_lat)
            ranks.append(name)
    if nodes == 1:
        devices = [d for d in devices if d.kind is not DeviceKind.SWITCH]
        links = [ln for ln in links if ln.kind is not LinkKind.INFINIBAND]
    return Topology(name=f"cluster{nodes}x{gpus}", devices=devices, links=links, ranks=ranks,
                    cost=CostParams(overhead_us=overhead, launch_us=launch, mem_efficiency=0.8))


def bare_cpu(ranks: int = 4) -> Topology:
    """``cpu:ranks=N`` without host terms: one loopback link (2 GB/s, 20 us), 30 us overhead,
    50 us launch, memory efficiency 0.5 (the figures the family had before its host profile)."""
    from treeattn.topology.library import resolve

    topo = resolve(f"cpu:ranks={ranks},cores=2")
    lb = dataclasses.replace(topo.links[0], latency_us=20.0, bw_gbps=2.0, flow_gbps=None)
    return dataclasses.replace(topo, links=(lb,), cost=CostParams(overhead_us=30.0, launch_us=50.0,
                                                                  mem_efficiency=0.5))


def loopback_hosts(ranks: int = 4, **cost) -> tuple[Topology, Topology]:
    """``cpu:ranks=N`` with one loopback link (10 us, 2.5 GB/s) and no memory model: the bare
    topology the host fit starts from, and the same with the host CPU terms ``cost`` (the
    truth a fit should recover), 2 cores for the whole machine."""
    from treeattn.topology.library import resolve

    topo = resolve(f"cpu:ranks={ranks},cores=2")
    dev = dataclasses.replace(topo.devices[0], mem_bw_gbps=0.0)
    lb = dataclasses.replace(topo.links[0], latency_us=10.0, bw_gbps=2.5, flow_gbps=None)
    topo = dataclasses.replace(topo, devices=(dev,), links=(lb,), cost=CostParams(overhead_us=0.0, launch_us=0.0))
    truth = dataclasses.replace(topo, cost=topo.cost.updated(host_cores=2, cpu_scope="machine", **cost))
    return topo, truth


def host_fit_cases(topo: Topology, truth: Topology, heads: tuple[int, int, int],
                   tree_batches: tuple[int, ...] = (2,)) -> list[tuple[Plan, float, float]]:
    """A host calibration's cases on 4 ranks of ``topo`` (every rank computing at two sizes,
    small attention plans at ``tree_batches``, ping-pong and fan-in at four sizes), each with
    the time and the CPU time summed over ranks that ``truth`` predicts for it."""
    from treeattn.calibrate.plans import compute_plan, fanin_plan, pingpong_plan, tree_plans
    from treeattn.cost.simulate import simulate

    plans = [compute_plan(topo, 4, heads, t) for t in (1024, 65536)]
    for batch in tree_batches:
        plans += [plan for _, plan in tree_plans(topo, 4, heads, batch, 48)]
    for n in (4, 2048, 1 << 17, 1 << 20):
        plans += [pingpong_plan(topo, 4, (0, 1), n, r) for r in (1, 4)]
        plans += [fanin_plan(topo, 4, 0, [1, 2, 3], n)]
    out = []
    for p in plans:
        res = simulate(p, truth, timeline=False)
        out.append((p, res.predicted_us, sum(res.cpu_us)))
    return out
