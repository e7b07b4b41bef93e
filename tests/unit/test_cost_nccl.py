"""The NCCL-model predictor: its formulas, and a sanity check against published nccl-tests runs.

Fixtures (tests/fixtures/nccl-tests, see the README there): all_reduce_perf on one DGX-class
node of 8 H100 (NVLink + NVLink SHARP) and on 4 such nodes with 8 x 400G IB each. For sizes
>= 64 MiB the predicted bus bandwidth is within 20 % of the measured one on both machines;
for sizes <= 64 KiB the median predicted/measured time on 4 nodes is within 0.8-1.25. The
whole published corpus is scored by ``treeattn check-model`` (results/published/README.md).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.unit.test_cost_helpers import cluster_topo, switch_topo
from treeattn.cost import nccl, nccl_fabric, nccl_rates, nccl_tuning
from treeattn.errors import InputError
from treeattn.topology.library import resolve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"


def parse_nccl_tests(path: Path) -> list[tuple[int, float, float]]:
    """(size bytes, out-of-place time us, out-of-place busbw GB/s) rows of an all_reduce_perf table."""
    rows = []
    for line in path.read_text().splitlines():
        f = line.split()
        if line.startswith("#") or len(f) < 9 or not f[0].isdigit():
            continue
        rows.append((int(f[0]), float(f[5]), float(f[7])))
    return rows


def h100(nodes: int):
    # DGX H100-like: 18 NVLink 4 per GPU (450 GB/s) to the NVSwitch fabric, one 400G NIC per GPU.
    return cluster_topo(nodes, 8, nvl_bw=450.0, net_bw=50.0)


def test_fabric_uses_nccls_link_figures():
    fab = nccl_fabric.fabric(h100(4))
    assert (fab.ranks, fab.nodes, fab.intra_hw, fab.arch, fab.ll128) == (32, 4, "nvlink", "hopper", True)
    assert fab.intra_bw_gbps == pytest.approx(18 * 20.6)
    assert fab.inter_bw_gbps == pytest.approx(8 * 50.0)
    hosts = nccl_fabric.fabric(switch_topo(4, bw=12.5))
    assert (hosts.nodes, hosts.intra_hw, hosts.ll128) == (4, "pci", False)
    assert hosts.inter_bw_gbps == pytest.approx(12.5)


def test_latency_formulas_and_search_order():
    fab = nccl_fabric.fabric(h100(4))
    est = {(e.algorithm.value, e.protocol.value): e for e in nccl.predict(fab, "allreduce", 8)}
    assert list(est) == [("tree", "LL"), ("tree", "LL128"), ("tree", "Simple"),
                         ("ring", "LL"), ("ring", "LL128"), ("ring", "Simple"), ("nvlstree", "Simple")]
    # NVLSTree: 25 us inside the node, 20.9 us per network level up and down (tuning.cc)
    assert est[("nvlstree", "Simple")].latency_us == pytest.approx(25 + 2 * 2 * 20.9)
    # ring: base + (2(R-1) - 2(Nn-1)) intra + 2(Nn-1) inter; tree: base + 2((R/Nn-1) intra + log2(Nn) inter)
    assert est[("ring", "LL")].latency_us == pytest.approx(6.6 + (62 - 6) * 0.6 + 6 * 2.7)
    assert est[("ring", "Simple")].latency_us == pytest.approx(8.4 + (62 - 6) * 3.4 + 6 * 14)
    assert est[("tree", "LL")].latency_us == pytest.approx(6.8 + 2 * (7 * 0.6 + 2 * 5.0))
    assert est[("tree", "LL128")].latency_us == pytest.approx(14 + 2 * (7 * 1.25 + 2 * 8.5))
    ag = nccl.predict(fab, "allgather", 1 << 20)
    assert {e.algorithm.value for e in ag} == {"ring"}
    assert ag[0].latency_us == pytest.approx(6.6 + (31 - 3) * 0.6 + 3 * 2.7)
    bc = nccl.predict(fab, "broadcast", 1 << 20)
    assert bc[-1].latency_us == pytest.approx(8.4 + (32 - 4) * 3.4 + 3 * 14)


def test_bandwidth_derating_and_busbw_conventions(monkeypatch):
    monkeypatch.setattr(nccl, "RING_STEP_TAIL_US", 0.0)  # NCCL's formulas alone
    fab = nccl_fabric.fabric(h100(1))
    big = 1 << 34
    ring = {e.protocol.value: e for e in nccl.predict(fab, "allreduce", big) if e.algorithm.value == "ring"}
    bus = 18 * 20.6
    algbw_simple = bus * 8 / 14
    assert big / (ring["Simple"].time_us - ring["Simple"].latency_us) / 1e3 == pytest.approx(algbw_simple)
    assert ring["Simple"].busbw_gbps == pytest.approx(ring["Simple"].algbw_gbps * 2 * 7 / 8)
    assert big / (ring["LL"].time_us - ring["LL"].latency_us) / 1e3 == pytest.approx(min(141.0, bus * 0.5) * 8 / 14)
    assert big / (ring["LL128"].time_us - ring["LL128"].latency_us) / 1e3 == pytest.approx(bus * 0.92 * 8 / 14)
    tree = {e.protocol.value: e for e in nccl.predict(fab, "allreduce", big) if e.algorithm.value == "tree"}
    assert big / (tree["Simple"].time_us - tree["Simple"].latency_us) / 1e3 == pytest.approx(bus * 0.92 * 0.5)
    # the size-dependent tree correction: 1 MiB is 2^14 x 64 B, factor 0.5 for Simple
    mid = next(e for e in nccl.predict(fab, "allreduce", 1 << 20) if e.algorithm.value == "tree"
               and e.protocol.value == "Simple")
    assert (1 << 20) / (mid.time_us - mid.latency_us) / 1e3 == pytest.approx(bus * 0.92 * 0.5 * 0.5)
    assert nccl_tuning.busbw_factor("allgather", 8) == pytest.approx(7 / 8)
    assert nccl_tuning.busbw_factor("broadcast", 8) == 1.0
    assert nccl.pick(fab, "allreduce", big) == min(nccl.predict(fab, "allreduce", big), key=lambda e: e.rank_us)


def test_single_rank_and_bad_input():
    one = cluster_topo(1, 1)
    assert nccl.pick(one, "allreduce", 1024).time_us == 0.0
    with pytest.raises(InputError, match="unknown collective"):
        nccl.predict(one, "alltoall", 64)
    with pytest.raises(InputError, match="positive"):
        nccl.predict(one, "allreduce", 0)
    assert nccl_tuning.Collective.parse("all_reduce") is nccl_tuning.Collective.ALLREDUCE


@pytest.mark.parametrize("fixture,nodes", [("all_reduce_perf.8xh100-1node.txt", 1),
                                           ("all_reduce_perf.4x8xh100-ib400.txt", 4)])
def test_large_messages_match_published_busbw(fixture, nodes):
    rows = parse_nccl_tests(FIXTURES / fixture)
    topo = h100(nodes)
    big = [(size, bus) for size, _, bus in rows if size >= 64 << 20]
    assert len(big) >= 5
    for size, bus in big:
        pred = nccl.pick(topo, "allreduce", size).busbw_gbps
        assert 0.8 <= pred / bus <= 1.2, (size, pred, bus)


def test_small_messages_match_published_latency():
    rows = parse_nccl_tests(FIXTURES / "all_reduce_perf.4x8xh100-ib400.txt")
    topo = h100(4)
    ratios = [nccl.pick(topo, "allreduce", size).time_us / t for size, t, _ in rows if size <= 64 << 10]
    assert len(ratios) >= 10
    assert 0.8 <= statistics.median(ratios) <= 1.25


def test_shipped_preset_gives_the_same_fabric():
    library = pytest.importorskip("treeattn.topology.library")
    fab = nccl_fabric.fabric(library.resolve("dgx-h100:nodes=4"))
    assert fab.intra_bw_gbps == pytest.approx(18 * 20.6)
    assert fab.inter_bw_gbps == pytest.approx(8 * 50.0)


@pytest.mark.parametrize(("dtype", "op", "runs"), [
    # src/include/device.h ncclNvlsSupported (v2.19.3 to v2.30): 16-bit floats and 32/64-bit
    # integers by sum, min or max; float and double by sum only; nothing else.
    ("float", "sum", True), ("fp32", "sum", True), ("double", "sum", True),
    ("float", "max", False), ("fp32", "max", False), ("double", "min", False),
    ("bfloat16", "max", True), ("bf16", "sum", True), ("half", "min", True), ("int32", "max", True),
    ("uint64", "sum", True), ("float", "prod", False), ("half", "avg", False), ("int8", "sum", False),
    ("f8e4m3", "sum", False), ("fp8", "sum", False),
])
def test_nvls_reduces_only_what_ncclnvlssupported_allows(dtype, op, runs):
    from treeattn.cost.nvls import nvls_reduces

    assert nvls_reduces(dtype, op) is runs
    h = nccl_fabric.fabric(h100(1))
    best = nccl.pick(h, "allreduce", 1 << 32, reduction=(dtype, op))
    assert (best.algorithm.value == "nvls") is runs


def test_a_reduction_nvls_cannot_run_asked_of_nvls_alone_says_why():
    h = nccl_fabric.fabric(h100(1))
    with pytest.raises(InputError, match=r"leaves no algorithm .*\(float max: NVLink SHARP does not reduce it\)"):
        nccl.pick(h, "allreduce", 1 << 20, env={"NCCL_ALGO": "NVLS"}, reduction=("float", "max"))


def test_nvls_where_nccl_offers_it():
    h = nccl_fabric.fabric(h100(1))
    assert h.nvls_gbps == pytest.approx(18 * 20.6)
    big = 1 << 32
    best = nccl.pick(h, "allreduce", big)
    assert best.algorithm.value == "nvls"
    # achieved: NVLink figure x nvlsEfficiency x the measured factor; busbw near the ~480 GB/s NCCL quotes
    assert best.busbw_gbps == pytest.approx(18 * 20.6 * 0.85 * 0.86 * 2 * 7 / 8, rel=0.01)
    assert 450 < best.busbw_gbps < 500
    # NCCL's own estimate is faster than what runs; it is what NCCL picks by
    assert best.rank_us < best.time_us
    assert nccl.pick(h, "allreduce", big, env={"NCCL_NVLS_ENABLE": "0"}).algorithm.value == "ring"
    # NCCL reads it with strtoll(value, NULL, 0): these are 0 too, and NVLS is off
    for off in ("00", " 0", "0x0", "false", "no"):
        assert nccl.pick(h, "allreduce", big, env={"NCCL_NVLS_ENABLE": off}).algorithm.value == "ring", off
    for on in ("1", "2", "0x1", "-1"):
        assert nccl.pick(h, "allreduce", big, env={"NCCL_NVLS_ENABLE": on}).algorithm.value == "nvls", on
    assert nccl.pick(h, "allreduce", big, env={"NCCL_ALGO": "Tree"}).algorithm.value == "tree"
    assert nccl.pick(h, "allreduce", 1024, env={"NCCL_PROTO": "^LL"}).protocol.value != "LL"
    assert all(e.algorithm.value in ("tree", "ring") for e in nccl.predict(h, "allgather", big))
    a100 = nccl_fabric.fabric(cluster_topo(1, 8, nvl_bw=300.0))
    assert a100.nvls_gbps == pytest.approx(18 * 20.6 * 300 / 450)  # H100 models, 300 GB/s links
    with pytest.raises(InputError, match="unknown 'bogus'"):
        nccl.pick(h, "allreduce", 64, env={"NCCL_ALGO": "bogus"})


def test_tuner_and_achieved_times_differ_only_where_nccl_overestimates():
    fab = nccl_fabric.fabric(h100(2))
    ring = {e.protocol.value: e for e in nccl.predict(fab, "allreduce", 8) if e.algorithm.value == "ring"}
    # the tuner floors each intra step of a multi-node ring at the network post overhead
    assert ring["LL"].rank_us > ring["LL"].time_us
    assert ring["LL"].rank_us == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7 + 8 / 1e3 / min(39.0, 400 * 0.5) * 16 / 30,
                                               rel=1e-3)
    assert ring["LL"].latency_us == pytest.approx(6.6 + 28 * 0.6 + 2 * 2.7)
    # one node: the same but where NVLS runs, and a ring with Simple (its step tail, RING_STEP_TAIL_US)
    one = nccl_fabric.fabric(h100(1))
    same = [e.nccl_us is None for e in nccl.predict(one, "allreduce", 1 << 20)
            if e.algorithm.value != "nvls" and (e.algorithm.value, e.protocol.value) != ("ring", "Simple")]
    assert len(same) == 5 and all(same)


def test_multi_nic_broadcast_and_reduce_are_picked_by_nccls_per_step_network_hop():
    # tuning.cc ncclTopoTuneModel: a ring broadcast or reduce whose graph channels differ
    # (one NIC each: sameChannels 0) is estimated at base + nsteps x hwLat[NET][RING][p], Simple
    # taking the tree's network hop; what runs keeps the chain's own latency.
    fab = nccl_fabric.fabric(h100(4))
    assert fab.nics == 8
    for coll in ("broadcast", "reduce"):
        est = {e.protocol.value: e for e in nccl.predict(fab, coll, 1 << 27)}
        for p, (proto, base, hop) in enumerate((("LL", 6.6, 2.7), ("LL128", 14.0, 4.0), ("Simple", 8.4, 14.0))):
            bw = nccl._algbw_gbps(fab, nccl_tuning.Collective(coll), nccl_tuning.Algorithm.RING, p, 1 << 27)
            assert est[proto].rank_us == pytest.approx(base + 32 * hop + (1 << 27) / (bw * 1e3))
        # 128 MiB: LL128 (142 us + 457 us) ahead of Simple (456 us + 349 us), as NCCL's estimate has it
        assert nccl.pick(fab, coll, 1 << 27).protocol.value == "LL128"
        # 1 MiB: LL (93.0 + 51.4 us) ahead of LL128 (142 + 3.6 us)
        assert nccl.pick(fab, coll, 1 << 20).protocol.value == "LL"
    # one node: no NICs, the chain's hops as before
    assert nccl_fabric.fabric(h100(1)).nics == 0


def test_nvl72_is_one_nccl_node():
    from treeattn.topology.library import resolve

    rack = nccl_fabric.fabric(resolve("gb200-nvl72"))
    assert (rack.nodes, rack.ranks, rack.arch) == (1, 72, "blackwell")
    assert nccl.pick(rack, "allreduce", 1 << 33).algorithm.value == "nvls"
    two = nccl_fabric.fabric(resolve("gb200-nvl72:racks=2"))
    assert two.nodes == 2 and nccl.pick(two, "allreduce", 1 << 33).algorithm.value == "nvlstree"


def test_nccl_rates_pcie_by_generation_and_width():
    # topo.cc: width x per-lane speed / 80 -> 48 GB/s for a Gen5 x16 link, whatever its measured rate
    link = next(ln for ln in resolve("dgx-h100").links if ln.kind.value == "pcie")
    assert (link.generation, link.width) == (5, 16)
    assert nccl_rates.nccl_link_bw_gbps(link) == pytest.approx(48.0)


def test_tree_bandwidth_has_nccls_per_channel_caps():
    # 4 H100 nodes: 8 graph channels; tree LL128 capped at 8 x 29.0 GB/s of bus bandwidth
    fab = nccl_fabric.fabric(resolve("dgx-h100:nodes=4"))
    assert fab.graph_channels == 8
    n = 1 << 30
    est = next(e for e in nccl.predict(fab, "allreduce", n)
               if (e.algorithm.value, e.protocol.value) == ("tree", "LL128"))
    assert n / (est.rank_us - est.latency_us) / 1e3 == pytest.approx(8 * 29.0 * 0.5)


def test_a_tree_on_two_nodes_crosses_the_network_once_each_way():
    # Two GPUs of each of two DGX H100s, each with its own 400 Gb/s NIC: 100 GB/s a node.
    two = nccl_fabric.fabric(resolve("dgx-h100:nodes=2[ranks 0,1,8,9]"))
    assert (two.inter_bw_gbps, two.tree_intra_bw_gbps) == (100.0, pytest.approx(370.8))
    assert two.tree_bus_bw_gbps == 200.0  # twice the network, under the NVLink chain
    assert two.bus_bw_gbps == 100.0  # a ring's bytes cross it 2(R - 1) / R times
    four = nccl_fabric.fabric(resolve("dgx-h100:nodes=4[ranks 0,1,8,9,16,17,24,25]"))
    assert four.tree_bus_bw_gbps == four.inter_bw_gbps == 100.0
    # From 128 MiB NCCL's estimate then picks the tree, which what runs times at the NICs'
    # rate: the 147-148 GB/s of bus bandwidth MGHPCC and Lambda published at 8 GiB, where a
    # ring over the same NICs moves 94 (results/published/README.md).
    n = 8 << 30
    est = nccl.pick(two, "allreduce", n)
    assert (est.algorithm.value, est.protocol.value) == ("tree", "Simple")
    ring = next(e for e in nccl.predict(two, "allreduce", n)
                if (e.algorithm.value, e.protocol.value) == ("ring", "Simple"))
    assert est.busbw_gbps > 1.3 * ring.busbw_gbps
    # Held to NCCL's per-channel cap, 4 graph channels x 41.4 GB/s on two Hopper nodes.
    assert n / (est.time_us - est.latency_us) / 1e3 == pytest.approx(4 * 41.4 * 0.5)


def test_a_tree_of_one_gpu_a_node_takes_nccls_plain_tree_pattern():
    # One GPU (and its 400 Gb/s NIC) on each of 4 nodes: NCCL's search takes the plain tree
    # pattern, which its estimate rates x0.85; what runs moves the network at Simple's 0.94.
    fab = nccl_fabric.fabric(resolve("dgx-h100:nodes=4[ranks 0,8,16,24]"))
    n = 16 << 30
    tree = next(e for e in nccl.predict(fab, "allreduce", n)
                if (e.algorithm.value, e.protocol.value) == ("tree", "Simple"))
    assert n / (tree.time_us - tree.latency_us) / 1e3 == pytest.approx(50.0 * 0.94 * 0.92 * 0.85 * 0.5)
    two_a_node = nccl_fabric.fabric(resolve("dgx-h100:nodes=4[ranks 0,1,8,9,16,17,24,25]"))
    tree = next(e for e in nccl.predict(two_a_node, "allreduce", n)
                if (e.algorithm.value, e.protocol.value) == ("tree", "Simple"))
    assert n / (tree.time_us - tree.latency_us) / 1e3 == pytest.approx(100.0 * 0.94 * 0.92 * 0.5)


def test_nvls_chunks_follow_nccls_enqueue():
    from treeattn.cost.nvls import nvls_chunk

    mib = 1 << 20
    ops = 16 * 8  # 16 NVLS channels x 8 heads (one per H100 of a node)
    # NVLSTree on 2 nodes: 128 KiB, shrunk under 4 loops' worth to 64 KiB and under one to 32 KiB
    assert [nvls_chunk(2, ops, 128 << 10, 128 << 10, n * mib) for n in (4, 8, 16, 32, 64)] == \
        [32 << 10, 64 << 10, 64 << 10, 64 << 10, 128 << 10]
    # 4 nodes and more: at most 64 KiB
    assert nvls_chunk(4, ops, 128 << 10, 64 << 10, 1 << 30) == 64 << 10
    # NVLS on one node: 64 KiB under 64 loops, 32 KiB under 8, 16 KiB under 2
    assert [nvls_chunk(1, ops, 128 << 10, 128 << 10, n * mib) for n in (4, 32, 64, 1024)] == \
        [16 << 10, 32 << 10, 64 << 10, 128 << 10]


def _nvls_data_us(fab, nbytes: int) -> float:
    est = next(e for e in nccl.predict(fab, "allreduce", nbytes) if e.algorithm.value.startswith("nvls"))
    return est.time_us - est.latency_us


def test_nvlstree_pays_a_pipeline_fill_of_one_loop_per_tree_level_and_one():
    from treeattn.cost.nvls import fill_loops

    assert [fill_loops(n) for n in (1, 2, 4, 8)] == [1, 2, 3, 4]
    mib = 1 << 20
    two = nccl_fabric.fabric(resolve("dgx-h100:nodes=2"))
    # a loop is 16 x 8 chunks: 8 MiB at 16-32 MiB (64 KiB chunks), 16 MiB at 64 MiB (128 KiB);
    # 2 nodes fill 2 loops: 16 + 16, 32 + 16 and 64 + 32 MiB move at one rate
    t16, t32, t64 = (_nvls_data_us(two, n * mib) for n in (16, 32, 64))
    assert t32 / t16 == pytest.approx(48 / 32)
    assert t64 / t32 == pytest.approx(96 / 48)
    # 8 nodes: 64 KiB chunks at most, 4 loops of fill: 16 MiB moves as 16 + 32
    eight = nccl_fabric.fabric(resolve("dgx-h100:nodes=8"))
    assert _nvls_data_us(eight, 32 * mib) / _nvls_data_us(eight, 16 * mib) == pytest.approx(64 / 48)
    # a buffer smaller than one loop (4 MiB of 32 KiB chunks) fills with itself: 2 + 2 x 2 MiB
    assert _nvls_data_us(two, 2 * mib) / t16 == pytest.approx(6 / 32)
    # one node: one loop of fill; at 16 GiB it is 0.1 % of the time
    one = nccl_fabric.fabric(resolve("dgx-h100"))
    big = _nvls_data_us(one, 1 << 34)
    assert big == pytest.approx(((1 << 34) + 16 * mib) / (18 * 20.6 * 0.85 * 0.86 * 1e3))


def _nvlstree(fab, nbytes: int):
    return next(e for e in nccl.predict(fab, "allreduce", nbytes) if e.algorithm.value == "nvlstree")


def test_nvls_figures_follow_the_nccl_release():
    import dataclasses

    from treeattn.topology.nccl_version import NEWEST, nccl_release

    four = nccl_fabric.fabric(h100(4))
    assert four.nccl_release == NEWEST
    old = dataclasses.replace(four, nccl_release=nccl_release("2.26.2"))
    new = dataclasses.replace(four, nccl_release=nccl_release("2.30.4"))
    # tuning.cc hwLat[NET][NVLSTree][Simple]: 14 us in 2.19.1-2.28.7, 20.9 us from 2.28.9
    assert _nvlstree(old, 8).latency_us == pytest.approx(25 + 2 * 2 * 14.0)
    assert _nvlstree(new, 8).latency_us == pytest.approx(25 + 2 * 2 * 20.9)
    assert _nvlstree(dataclasses.replace(four, nccl_release=nccl_release("2.28.7")), 8).latency_us == \
        pytest.approx(25 + 2 * 2 * 14.0)
    assert _nvlstree(dataclasses.replace(four, nccl_release=nccl_release("2.28.9")), 8).latency_us == \
        pytest.approx(25 + 2 * 2 * 20.9)
    # NVLS's NVLink hop: 23 us in 2.19-2.20, 25 from 2.21.5
    assert _nvlstree(dataclasses.replace(four, nccl_release=nccl_release("2.20.5")), 8).latency_us == \
        pytest.approx(23 + 2 * 2 * 14.0)
    # NCCL's estimate: before 2.28.3 8 channels x min(bwIntra, bwInter / 2 beyond two nodes) x 5/6;
    # the NVLS graph on 4 H100 nodes with a 400G NIC per GPU runs 8 channels at 48 GB/s.
    big = 1 << 32
    est_old = _nvlstree(old, big)
    assert est_old.rank_us == pytest.approx(est_old.latency_us + big / (8 * 24.0 * 5 / 6 * 1e3))
    # from 2.28.3: per channel 48 x 0.85 x 7/8 x 2, at most the network's 48 and perChMaxNVLSTreeBw 45.5
    est_new = _nvlstree(new, big)
    assert est_new.rank_us == pytest.approx(est_new.latency_us + big / (8 * 45.5 * 32 / 62 * 1e3))
    # what runs is the same in every release but for the latency
    assert est_old.time_us - est_old.latency_us == pytest.approx(est_new.time_us - est_new.latency_us)


@pytest.mark.parametrize("before, after, what", [
    ("2.21.4", "2.21.5", "latency"), ("2.28.7", "2.28.9", "latency"), ("2.28.2", "2.28.3", "estimate"),
])
def test_each_release_boundary_moves_its_figure_there_and_only_there(before, after, what):
    import dataclasses

    from treeattn.topology.nccl_version import nccl_release

    four = nccl_fabric.fabric(h100(4))
    a, b = (_nvlstree(dataclasses.replace(four, nccl_release=nccl_release(v)), 1 << 30) for v in (before, after))
    assert (a.latency_us != b.latency_us) == (what == "latency")
    assert ((a.rank_us - a.latency_us) != (b.rank_us - b.latency_us)) == (what == "estimate")
    assert a.time_us - a.latency_us == pytest.approx(b.time_us - b.latency_us)  # what runs


def test_blackwell_nvlstree_caps_follow_the_release():
    from treeattn.cost import nvls

    # Beyond two domains perChMaxNVLSTreeBw binds (a 100 GB/s graph speed is above it):
    # 43.1 GB/s a channel in 2.28.3-2.28.7, 43.8 in 2.28.9-2.29, 80 from 2.30.3.
    est = {r: nvls._estimate_gbps("blackwell", 4, 16, 100.0, 1.0, r) for r in
           ((2, 28, 3), (2, 28, 7), (2, 28, 9), (2, 29, 999), (2, 30, 3), (2, 30, 7))}
    assert est[(2, 28, 3)] == est[(2, 28, 7)] == pytest.approx(16 * 43.1)
    assert est[(2, 28, 9)] == est[(2, 29, 999)] == pytest.approx(16 * 43.8)
    assert est[(2, 30, 3)] == est[(2, 30, 7)] == pytest.approx(16 * 80.0)


def test_the_release_moves_nvls_and_the_ring_low_latency_estimates_only():
    import dataclasses

    # What runs is 2.30's whatever the release but for NVLS; NCCL's estimate of LL (llMaxBw, ring's
    # share), of ring LL128 with one rank per node and, before 2.23.4, its latencies (Tree/Simple's
    # 28 us hops) follow it; host ranks have no NVLS at all.
    for fab in (nccl_fabric.fabric(h100(1)), nccl_fabric.fabric(h100(2)), nccl_fabric.fabric(switch_topo(4, bw=12.5))):
        old = dataclasses.replace(fab, nccl_release=(2, 19, 1))
        for coll in ("allreduce", "allgather"):
            for n in (8, 1 << 20, 1 << 30):
                new_est, old_est = nccl.predict(fab, coll, n), nccl.predict(old, coll, n)
                assert len(new_est) == len(old_est)
                for a, b in zip(new_est, old_est, strict=True):
                    if a.algorithm.value.startswith("nvls"):
                        assert a != b
                    else:  # NCCL's estimate may move, not what runs
                        assert dataclasses.replace(a, nccl_us=None) == dataclasses.replace(b, nccl_us=None)


@pytest.mark.parametrize("release, share, hopper_max", [
    ("2.19.1", 0.25, 87.7), ("2.20.5", 0.25, 87.7), ("2.21.5", 0.5, 141.0), ("2.30.7", 0.5, 141.0),
])
def test_nccl_rates_ring_ll_by_release(release, share, hopper_max):
    import dataclasses

    from treeattn.topology.nccl_version import nccl_release

    # tuning.cc: min(llMaxBw, busBw / 4) for all-reduce until 2.20, min(llMaxBw, busBw * .5) from
    # 2.21.5, which also raised Hopper's one-node llMaxBw from Ampere's 87.7 to 141 GB/s.
    for spec, ll_max in (("dgx-a100", 87.7), ("dgx-h100", hopper_max)):
        fab = dataclasses.replace(nccl_fabric.fabric(resolve(spec)), nccl_release=nccl_release(release))
        n = 1 << 30
        ring_ll = next(e for e in nccl.predict(fab, "allreduce", n)
                       if e.algorithm.value == "ring" and e.protocol.value == "LL")
        bus = min(ll_max, fab.bus_bw_gbps * share)
        algbw = bus * fab.ranks / (2 * (fab.ranks - 1))
        assert ring_ll.rank_us - n / (algbw * 1e3) == pytest.approx(ring_ll.latency_us, abs=0.5)


def test_nccl_rates_ring_ll128_with_one_rank_per_node_by_release():
    import dataclasses

    # tuning.cc: busBw x (ppn < 2 ? 0.7 : 0.92) until 2.22, x 0.92 from 2.23.4; what runs: 0.92.
    fab = nccl_fabric.fabric(h100(4))
    one = dataclasses.replace(fab, ranks=4, nodes=4)
    old, new = (dataclasses.replace(one, nccl_release=r) for r in ((2, 22, 999), (2, 23, 4)))
    n = 1 << 30
    a, b = (next(e for e in nccl.predict(f, "allgather", n) if e.protocol.value == "LL128") for f in (old, new))
    assert a.time_us == b.time_us
    assert a.rank_us > b.rank_us


@pytest.mark.parametrize("text, release", [
    ("2.26.2", (2, 26, 2)), ("2.26", (2, 26, 999)), ("<2.28", (2, 27, 999)), ("<=2.27.3", (2, 27, 3)),
    ("<2.28.9", (2, 28, 8)), (" 2.30.4 ", (2, 30, 4)), ("unknown", None),
])
def test_nccl_versions_parse_to_the_newest_release_they_allow(text, release):
    from treeattn.topology.nccl_version import parse_version, release_text

    assert parse_version(text) == release
    if release is not None:
        series = f"{release[0]}.{release[1]}"
        assert release_text(release) == (f"{series}.x" if release[2] == 999 else f"{series}.{release[2]}")


@pytest.mark.parametrize("text, what", [
    ("2.26.x", "write a release"), ("v2.26.2", "write a release"), ("", "write a release"),
    ("<2.0", "not by a major release"), ("<3.0", "not by a major release"),
])
def test_malformed_nccl_versions_are_one_line_errors(text, what):
    from treeattn.topology.nccl_version import parse_version

    with pytest.raises(InputError, match=what):
        parse_version(text)


def test_releases_older_than_the_model_follows_are_refused():
    from treeattn.topology.nccl_version import nccl_release

    with pytest.raises(InputError, match="follows NCCL 2.19-2.30"):
        nccl_release("2.18.3")
    assert nccl_release("<2.20") == (2, 19, 999)


def test_a_topology_names_its_nccl_release():
    import dataclasses

    from treeattn.errors import TopologyError
    from treeattn.topology.io import load_topology_text

    two = resolve("dgx-h100:nodes=2")
    older = dataclasses.replace(two, cost=two.cost.updated(nccl_version="2.26.2"))
    assert nccl_fabric.fabric(two).nccl_release == (2, 30, 7) and nccl_fabric.fabric(older).nccl_release == (2, 26, 2)
    assert _nvlstree(nccl_fabric.fabric(older), 8).latency_us == pytest.approx(25 + 2 * 14.0)
    assert older.fingerprint != two.fingerprint and "nccl_version" not in two.cost.to_dict()
    assert older.cost.to_dict()["nccl_version"] == "2.26.2"
    with pytest.raises(TopologyError, match=r"cost.nccl_version: version '2.x'"):
        two.cost.updated(nccl_version="2.x")
    yaml_text = (Path(__file__).resolve().parents[2] / "topologies" / "dgx-h100-2node.yaml").read_text()
    line = "cost: {attn_launch_us: 12.4, attn_efficiency: 0.56}"
    assert line in yaml_text
    loaded = load_topology_text(yaml_text.replace(line, line[:-1] + ', nccl_version: "<2.28"}'))
    assert nccl_fabric.fabric(loaded).nccl_release == (2, 27, 999)
    with pytest.raises(TopologyError) as err:
        load_topology_text(yaml_text.replace(line, "cost: {nccl_version: 2.26}"))
    assert "nccl_version" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("spec", ["rtx4090:gpus=2", "rtx4090[ranks 0-3]"])
def test_gpus_without_peer_to_peer_run_at_the_shared_memory_rate_nccl_does_not_pick_by(spec):
    topo = resolve(spec)
    fab = nccl_fabric.fabric(topo)
    assert fab.shm_gbps == nccl_rates.SHM_GBPS and fab.bus_bw_gbps > 2 * nccl_rates.SHM_GBPS  # NCCL rates PCIe
    big = nccl.pick(topo, "allreduce", 1 << 30)
    assert (big.algorithm, big.protocol) == (nccl_tuning.Algorithm.RING, nccl_tuning.Protocol.SIMPLE)
    assert big.busbw_gbps == pytest.approx(nccl_rates.SHM_GBPS, rel=1e-3)
    # NCCL's own estimate, which it picks by, still sees the PCIe figure.
    assert big.rank_us < big.time_us / 2
    factor = nccl_tuning.busbw_factor(nccl_tuning.Collective.ALLGATHER, topo.num_ranks)
    for est in nccl.predict(topo, "allgather", 1 << 28):
        assert est.algbw_gbps <= nccl_rates.SHM_GBPS / factor * (1 + 1e-9)
    assert nccl_fabric.fabric(resolve("dgx-h100")).shm_gbps == 0.0


@pytest.mark.parametrize("coll, nodes, share", [
    ("allgather", 1, 1 / 3), ("reducescatter", 1, 1 / 3), ("broadcast", 1, 1 / 3), ("reduce", 1, 0.25),
    ("allgather", 2, 0.25),
])
def test_nccl_rated_ring_ll_a_third_or_a_quarter_before_2_21_5(coll, nodes, share):
    import dataclasses

    from treeattn.topology.nccl_version import nccl_release

    # tuning.cc until 2.20: busBw x (nNodes > 1 || allreduce || reduce ? 1/4 : 1/3), at most llMaxBw
    fab = nccl_fabric.fabric(resolve("dgx-a100" if nodes == 1 else f"dgx-a100:nodes={nodes}"))
    old = dataclasses.replace(fab, nccl_release=nccl_release("2.20.5"))
    ll_max = {1: 87.7, 2: 22.5 if fab.cpu == "amd" else 39.0}[nodes]
    n = 1 << 30
    a, b = (next(e for e in nccl.predict(old, coll, m) if e.algorithm.value == "ring" and e.protocol.value == "LL")
            for m in (n, 2 * n))
    ranks = fab.ranks
    steps = {"allgather": ranks - 1, "reducescatter": ranks - 1}.get(coll, ranks)
    algbw = min(ll_max, fab.bus_bw_gbps * share) * ranks / steps
    assert b.rank_us - a.rank_us == pytest.approx(n / (algbw * 1e3), rel=1e-6)  # the estimate's bandwidth


def test_blackwell_runs_32_nvls_channels_on_one_domain_before_2_27():
    import dataclasses

    from treeattn.cost.nvls import nvls_fill_bytes
    from treeattn.topology.nccl_version import nccl_release

    rack = nccl_fabric.fabric(resolve("gb200-nvl72"))
    old, new = (dataclasses.replace(rack, nccl_release=nccl_release(v)) for v in ("2.26.2", "2.27.3"))
    # nvls.cc: NVLS_NCHANNELS_SM100 (32) on any Blackwell in 2.25-2.26, NVLS_NCHANNELS_SM100_NVL (24)
    # on one domain from 2.27.3
    nvls, simple = nccl_tuning.Algorithm.NVLS, nccl_tuning.Protocol.SIMPLE
    assert [nccl.run_channel_count(f, nvls, simple, 1 << 30) for f in (old, new)] == [32, 24]
    # 32 heads x 32 channels: a loop of 128 KiB chunks is 128 MiB, and 4 GiB holds 32 (64 KiB chunks)
    assert nvls_fill_bytes("blackwell", 1, 32, 72, 0.0, 1 << 32, nccl_release("2.26.2")) == 32 * 32 * (64 << 10)
    a, b = (next(e for e in nccl.predict(f, "allreduce", 1 << 32) if e.algorithm is nccl_tuning.Algorithm.NVLS)
            for f in (old, new))
    assert a.time_us - a.latency_us < b.time_us - b.latency_us


def test_blackwell_nvlstree_tuning_only_from_2_30_3():
    from treeattn.cost.nvls import nvls_fill_bytes
    from treeattn.topology.nccl_version import nccl_release

    # Two NVL72 racks, 400 Gb/s a GPU: ncclNvlsTreeSm100Tuning (2.30.3 on) caps NVLSTree's chunk
    # at 64 KiB for 16 or more GPUs a domain; before it, the cap is 64 KiB only on 4 or more domains.
    old, new = (nvls_fill_bytes("blackwell", 2, 8, 72, 50.0, 16 << 30, nccl_release(v)) for v in ("2.29.7", "2.30.3"))
    assert old == 2 * new
    # Four racks (3 loops of fill): before, 32 channels and enqueue.cc's 64 KiB NVLSTree cap on 4 or
    # more domains; from 2.30.3, 24 channels and 128 KiB for a 400 Gb/s NIC a GPU.
    old, new = (nvls_fill_bytes("blackwell", 4, 8, 72, 50.0, 16 << 30, nccl_release(v)) for v in ("2.29.7", "2.30.3"))
    assert (old, new) == (3 * 32 * 8 * (64 << 10), 3 * 24 * 8 * (128 << 10))


@pytest.mark.parametrize(("model", "arch"), [
    ("A40", "ampere"), ("A10G", "ampere"), ("A100-SXM4-80GB", "ampere"), ("RTX-4090", "ampere"), ("L40S", "ampere"),
    ("H100-SXM5-80GB", "hopper"), ("V100-SXM2", "volta"), ("B200", "blackwell"),
    # names as nvidia-smi prints them, which had fallen through to Hopper's row
    ("NVIDIA L4", "ampere"), ("NVIDIA RTX 6000 Ada Generation", "ampere"), ("NVIDIA GeForce RTX 5090", "blackwell"),
    ("RTX-5090", "blackwell"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell"), ("Tesla T4", "volta"),
    ("NVIDIA GeForce RTX 2080 Ti", "volta"), ("NVIDIA RTX A6000", "ampere"), ("NVIDIA GH200 480GB", "hopper"),
    ("NVIDIA H20", "hopper"), ("NVIDIA GB200", "blackwell"),
    # Turing's and Ada's RTX 5000 are no GeForce RTX 5090; Pascal, Maxwell and Kepler take Volta's row
    ("Quadro RTX 5000", "volta"), ("NVIDIA RTX 5000 Ada Generation", "ampere"),
    ("NVIDIA GeForce RTX 5060 Ti", "blackwell"),
    ("NVIDIA GeForce GTX 1080 Ti", "volta"), ("NVIDIA TITAN Xp", "volta"), ("NVIDIA GeForce GTX 1660", "volta"),
    ("Quadro P6000", "volta"), ("Quadro M6000", "volta"), ("Tesla K80", "volta"), ("Tesla P100-PCIE-16GB", "volta"),
    ("Quadro RTX 4000", "volta"), ("Tesla M60", "volta"), ("Tesla K20Xm", "volta"), ("GRID K520", "volta"),
    ("Tesla P6", "volta"), ("NVIDIA T1000 8GB", "volta"), ("NVIDIA RTX A4500", "ampere"),
    ("NVIDIA RTX A500 Laptop GPU", "ampere"), ("NVIDIA RTX PRO 500 Blackwell Generation Laptop GPU", "blackwell"),
    ("NVIDIA T550 Laptop GPU", "volta"), ("NVIDIA GeForce MX450", "volta"), ("NVIDIA GeForce GT 1030", "volta"),
    ("NVIDIA GeForce 940MX", "volta"), ("GRID M60-8Q", "volta"), ("GRID RTX6000-24Q", "volta"),
    ("NVIDIA Jetson Xavier NX", "volta"), ("NVIDIA CMP 90HX", "ampere"),
    # a misspelt name takes the architecture its letters suggest; one placed nowhere Hopper's
    ("A10O-SXM4-80GB", "ampere"), ("Quadro GV100", "volta"), ("MI300X", "hopper"),
])
def test_nccl_takes_a_gpus_row_by_its_compute_capability(model, arch):
    # NCCL indexes its tables by compute capability (tuning.cc compCapIndex: >= 10.0, 9.x, 8.x, below)
    from treeattn.cost.nccl_tuning import nccl_arch

    assert nccl_arch(model) == arch


def test_nccls_estimate_of_latency_is_its_printed_table_before_and_after_2_23_4():
    # NVIDIA/nccl issue 1519 (thecodingwizard, 2024-11-19): 2 x 8 H100 (a3-megagpu-8g, 8 NICs a
    # node, NVL[370.8]), NCCL 2.20 (its ring LL share is a quarter; a UDS service thread), printed
    # with NCCL_DEBUG_SUBSYS=TUNING: every latency NCCL's table shows there, to its 0.1 us.
    import dataclasses

    from treeattn.cost.nccl import _latency_us
    from treeattn.cost.nccl_fabric import fabric
    from treeattn.cost.nccl_tuning import Algorithm, Collective
    from treeattn.topology.library import resolve
    from treeattn.topology.nccl_version import nccl_release

    pair = fabric(resolve("dgx-h100:nodes=2"))
    old = dataclasses.replace(pair, nccl_release=nccl_release("2.20.5"))
    ar, ag, tree, ring = Collective.ALLREDUCE, Collective.ALLGATHER, Algorithm.TREE, Algorithm.RING
    printed = {(ar, tree, 0): 25.2, (ar, tree, 1): 48.5, (ar, tree, 2): 448.0, (ar, ring, 0): 43.4, (ar, ring, 1): 79.4,
               (ag, ring, 0): 23.3, (ag, ring, 1): 44.6, (ag, ring, 2): 70.0}
    for (coll, algo, p), us in printed.items():
        assert _latency_us(old, coll, algo, p) == pytest.approx(us, abs=0.05), (coll, algo, p)
    # From 2.23.4 (tuning.cc): Tree/Simple 8.4 + 2 x (7 x 4 + 14), a ring all-reduce's network steps 2 x (2 - 1)
    assert _latency_us(pair, ar, tree, 2) == pytest.approx(92.4)
    assert _latency_us(pair, ar, ring, 0) == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)
    # what runs keeps the newest figures, and a hop no faster than its route (3.2 us across nodes)
    assert _latency_us(old, ar, tree, 2, tuner=False) == pytest.approx(92.4)
    assert _latency_us(pair, ag, ring, 0, tuner=False) == pytest.approx(6.6 + 14 * 0.6 + 3.2)


def test_rccl_runs_ll128_by_default_on_gfx90a_only_up_to_2_21_5():
    # ROCm/rccl tuning.cc, rocm-6.2.0 (2.20.5) to 0cbce2a7 (2.21.5): "Enable LL128 by default only
    # on gfx90a"; NCCL_PROTO naming LL128 enables it anyway. AMD's acceptance guide's 8 x MI300X
    # (RCCL 2.20.5) at 8 MiB: the model's ring LL128 had been 20 % fast, Simple is 10 %.
    from treeattn.cost.nccl_fabric import fabric
    from treeattn.topology.nccl_version import nccl_release

    mi300x = fabric(resolve("mi300x-8"))
    assert mi300x.rccl and not mi300x.gfx90a and mi300x.ll128
    # one process driving the 8 GPUs (-g 8), as the guide ran: RCCL 2.20.5 runs no MSCCL there
    def pick(release, env=None):
        est = nccl.pick(mi300x, "allreduce", 32 << 20, env=env, ranks_per_process=8, rccl_release=release)
        return f"{est.algorithm.value}/{est.protocol.value}"

    old = nccl_release("2.20.5")
    assert pick(old) == pick(nccl_release("2.21.5")) == "ring/Simple"
    assert pick(nccl_release("2.22.3")) == "ring/LL128"  # later releases: not followed, NCCL's rule
    assert pick(old, {"NCCL_PROTO": "LL128"}) == "ring/LL128"
    assert not nccl.topo_rccl_without_ll128(fabric(resolve("dgx-h100")), None)  # NVIDIA: NCCL's rule



def test_rccl_rings_on_one_xgmi_node_move_their_measured_share_of_rccls_rating():
    # RCCL rates a gfx942 xGMI link at 48 GB/s (topo.h GFX94X_XGMI_WIDTH): 7 x 48 = 336 for the
    # ring; the corpus's one-node MI300X/MI325X rings run 313-317 (RCCL_XGMI_ACHIEVED 0.94).
    import dataclasses

    from treeattn.cost.nccl_fabric import fabric

    def ring_simple(fab, proto=nccl.Protocol.SIMPLE):
        ests = nccl.predict(fab, "allreduce", 8 << 30)
        return next(e for e in ests if e.algorithm is nccl.Algorithm.RING and e.protocol is proto)

    one = fabric(resolve("mi300x-8"))
    share = nccl_tuning.RCCL_XGMI_ACHIEVED
    assert one.bus_bw_gbps == pytest.approx(336.0) and share == pytest.approx(0.94)
    # the latency (56 us) is a thousandth of 8 GiB's 45 ms
    assert ring_simple(one).busbw_gbps == pytest.approx(336.0 * share, rel=0.002)
    assert ring_simple(one, nccl.Protocol.LL128).busbw_gbps == pytest.approx(336.0 * share * 0.92, rel=0.002)
    # MI200 parts (gfx90a), 4 GPUs of a node and the tree, outside the data, keep RCCL's rating;
    # so do rings across nodes
    assert ring_simple(dataclasses.replace(one, gfx90a=True)).busbw_gbps == pytest.approx(336.0, rel=0.002)
    four = fabric(resolve("mi300x-4"))
    assert ring_simple(four).busbw_gbps == pytest.approx(four.bus_bw_gbps, rel=0.002)
    tree = next(e for e in nccl.predict(one, "allreduce", 8 << 30)
                if e.algorithm is nccl.Algorithm.TREE and e.protocol is nccl.Protocol.SIMPLE)
    untouched = dataclasses.replace(one, gfx90a=True)
    assert tree.time_us == pytest.approx(next(e for e in nccl.predict(untouched, "allreduce", 8 << 30)
                                              if e.algorithm is tree.algorithm and e.protocol is tree.protocol).time_us)
    two = fabric(resolve("mi300x:nodes=2"))
    assert ring_simple(two).time_us == pytest.approx(ring_simple(dataclasses.replace(two, gfx90a=True)).time_us)
