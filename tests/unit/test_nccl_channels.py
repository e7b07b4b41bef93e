"""NCCL's channels: how many a communicator builds, how many a size runs on, and point-to-point."""

from __future__ import annotations

import dataclasses
import math

import pytest

from treeattn.cost import nccl, nccl_fabric
from treeattn.cost.nccl_channels import comm_channels, p2p_channels, run_channels
from treeattn.cost.nccl_p2p import WORLD, p2p_message_gbps, peer_channels
from treeattn.cost.nvls import nvls_graph
from treeattn.errors import InputError
from treeattn.topology.library import resolve

MIB = 1 << 20


def test_communicator_channels_follow_nccls_search():
    # one DGX H100: 6 x 60 GB/s searched, duplicated twice -> 24; A100: 6 x 40 -> 24
    assert comm_channels("hopper", 1, 370.8, 370.8)[0] == 24
    assert comm_channels("ampere", 1, 240.0, 240.0)[0] == 24
    # across nodes one search channel per NIC: 8 NDR NICs -> 8 x 48 (no duplication under 50
    # GB/s on Hopper), doubled -> 16; one GPU and NIC per node -> 1 x 48, x2, x2 on Hopper -> 4
    assert comm_channels("hopper", 2, 370.8, 370.8, nics=8, nic_gbps=50.0) == (16, 384.0)
    assert comm_channels("hopper", 10, 370.8, 370.8, nics=1, nic_gbps=50.0)[0] == 4
    assert comm_channels("ampere", 2, 240.0, 240.0, nics=8, nic_gbps=25.0)[0] == 16
    assert nccl_fabric.fabric(resolve("dgx-h100")).channels == 24
    assert nccl_fabric.fabric(resolve("dgx-h100:nodes=2")).channels == 16


def test_small_sizes_run_on_fewer_channels():
    # ring LL on 8 ranks: 512 threads x 8 bytes x 8 ranks = 32 KiB per channel
    assert run_channels(24, "LL", 64 << 10, 8, ring_ll=True) == 2
    assert run_channels(24, "LL", 1 << 20, 8, ring_ll=True) == 24
    assert run_channels(24, "Simple", 256 << 10, 8, ring_ll=True) == 8  # 32 KiB per channel
    assert run_channels(24, "LL128", 8, 8, ring_ll=True) == 1
    fab = nccl_fabric.fabric(resolve("dgx-h100"))
    small = {e.protocol.value: e for e in nccl.predict(fab, "allreduce", 64 << 10) if e.algorithm.value == "ring"}
    # what runs moves 2 of 24 channels' worth; NCCL's estimate assumes all of them
    assert small["LL"].time_us > small["LL"].rank_us


def test_point_to_point_channels_grow_with_the_message():
    # 8 ranks of one H100 node: 32 p2p channels, 4 per peer to start with, more once parts pass 16 MiB
    assert [p2p_channels(24, s * MIB, 8, 1, 36) for s in (32, 64, 128, 256, 512)] == [4, 4, 8, 16, 32]
    assert p2p_channels(24, 32 * MIB, 4, 1, 36) == 8
    # 80 ranks on 10 nodes: one channel per network peer
    assert p2p_channels(16, 4096 * MIB, 80, 10, 4) == 1
    # parts of at least chunk / 8 on one node: a 128 KiB chunk (PCIe) splits sooner than NVLink's 512 KiB
    assert p2p_channels(24, 256 << 10, 2, 1, 36) == 4
    assert p2p_channels(4, 256 << 10, 2, 1, 2, chunk=128 << 10) == 2
    topo = resolve("dgx-h100")
    assert p2p_message_gbps(topo, 0, 1, 32 * MIB, WORLD) == pytest.approx(4 * 20.6)
    assert p2p_message_gbps(topo, 0, 1, 256 * MIB, WORLD) == pytest.approx(16 * 20.6)
    # a communicator of two ranks spreads a send over up to 16 channels at once, 32 past 16 MiB parts
    assert p2p_message_gbps(topo, 0, 1, 32 * MIB) == pytest.approx(16 * 20.6)
    assert p2p_message_gbps(topo, 0, 1, 64 << 10) == pytest.approx(20.6)
    assert p2p_message_gbps(topo, 0, 1, 256 << 10) == pytest.approx(4 * 20.6)
    far = resolve("dgx-h100:nodes=10")
    assert p2p_message_gbps(far, 7, 8, 64 * MIB, WORLD) == pytest.approx(14.0)
    # NCCL takes the fewest channels any peer gets for all of a rank's peers: NVLink ones too
    assert p2p_message_gbps(far, 0, 1, 64 * MIB, WORLD) == pytest.approx(20.6)
    # a pair across nodes: 4 channels of 14 GB/s, above what the NIC carries
    assert p2p_message_gbps(far, 7, 8, 64 * MIB) == pytest.approx(56.0)


def test_point_to_point_cap_applies_to_nvidia_gpus_only():
    assert peer_channels(resolve("cpu:ranks=4"), [(0, 1)]) is None
    assert peer_channels(resolve("mi300x"), [(0, 1)]) is None  # RCCL's channels are not modelled
    topo = resolve("dgx-h100")
    measured = dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, link_rates="measured"))
    assert peer_channels(measured, [(0, 1)]) is None
    assert p2p_message_gbps(measured, 0, 1, 1 << 20) == math.inf
    with pytest.raises(InputError, match="communicator"):
        peer_channels(topo, [(0, 1)], "all")


def test_nvls_graph_and_the_pick_on_four_gpus():
    assert nvls_graph("hopper", 1, 8, 370.8) == (8, 50.0)
    assert nvls_graph("hopper", 1, 4, 370.8) == (4, 60.0)
    assert nvls_graph("hopper", 2, 8, 370.8, 50.0) == (8, 48.0)
    # NCCL rates NVLS on 4 of 8 H100s below its ring, so it runs the ring
    four = nccl_fabric.fabric(resolve("dgx-h100[ranks 0-3]"))
    assert nccl.pick(four, "allreduce", 1 << 30).algorithm.value == "ring"
    assert nccl.pick(nccl_fabric.fabric(resolve("dgx-h100")), "allreduce", 1 << 30).algorithm.value == "nvls"


def test_multi_node_ring_plateau():
    fab = nccl_fabric.fabric(resolve("dgx-h100:nodes=2"))
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    small = nccl.pick(fab, "allreduce", 1024, env=env)
    big = nccl.pick(fab, "allreduce", 1 << 28, env=env)
    assert big.latency_us == pytest.approx(1.4 * small.latency_us)


def test_ada_gpus_take_nccls_ampere_row():
    assert nccl_fabric.fabric(resolve("rtx4090:gpus=2")).arch == "ampere"


def test_rccl_keeps_every_channel():
    # RCCL runs small all-reduces through MSCCL kernels: NCCL's channel loop is left out there
    assert nccl_fabric.fabric(resolve("mi300x")).channels == 0

