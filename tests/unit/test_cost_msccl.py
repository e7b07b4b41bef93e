"""RCCL's MSCCL all-pairs all-reduce (treeattn.cost.msccl) and where the NCCL model runs it."""

from __future__ import annotations

import pytest

from treeattn.cost import msccl, nccl
from treeattn.topology.library import resolve

XGMI = 64.0 * 0.75  # NCCL's rating of one MI300X xGMI link


@pytest.mark.parametrize(("nbytes", "runs"), [
    (512, False),             # 128 floats: fewer than the file's 256 chunks a loop
    (1024, True), (1536, False), (65536, True),
    (65536 + 1024, False),    # 16,640 floats: the second file wants multiples of 512
    (131072, True), (524287, False),
    (524288, False),          # the Simple file's: left to the ring model
])
def test_the_algorithm_files_cover_what_rccl_runs_them_for(nbytes, runs):
    assert (msccl.allpairs_allreduce(8, XGMI, nbytes) is not None) is runs


def test_two_steps_at_rccls_latency_and_half_a_link_each():
    t, lat = msccl.allpairs_allreduce(8, XGMI, 1 << 18)
    assert lat == pytest.approx(12.0 + 2 * 0.8)
    assert t == pytest.approx(lat + 2 * (1 << 18) / 8 / (XGMI * 0.5 * 1e3))
    assert msccl.allpairs_allreduce(4, XGMI, 1 << 18) is None
    assert msccl.allpairs_allreduce(8, 0.0, 1 << 18) is None


def test_rccl_on_eight_mi300x_runs_all_pairs_where_a_file_covers_the_size():
    topo = resolve("mi300x")
    fab = nccl.fabric(topo)
    assert fab.allpairs_gbps == pytest.approx(XGMI)
    assert nccl.pick(fab, "allreduce", 16384).algorithm is nccl.Algorithm.ALLPAIRS
    assert nccl.pick(fab, "allreduce", 512).algorithm is nccl.Algorithm.RING
    assert nccl.pick(fab, "allreduce", 1 << 20).algorithm is not nccl.Algorithm.ALLPAIRS
    assert nccl.pick(fab, "allgather", 16384).algorithm is not nccl.Algorithm.ALLPAIRS
    # NCCL_ALGO does not reach MSCCL; RCCL's own switch does.
    assert nccl.pick(fab, "allreduce", 16384, env={"NCCL_ALGO": "Ring"}).algorithm is nccl.Algorithm.ALLPAIRS
    off = nccl.pick(fab, "allreduce", 16384, env={"RCCL_MSCCL_ENABLE": "0"})
    assert off.algorithm is not nccl.Algorithm.ALLPAIRS


@pytest.mark.parametrize("spec", ["mi300x:nodes=2", "mi300x-4", "dgx-h100"])
def test_no_all_pairs_off_one_node_of_eight_xgmi_peers(spec):
    fab = nccl.fabric(resolve(spec))
    assert fab.allpairs_gbps == 0.0
    assert all(e.algorithm is not nccl.Algorithm.ALLPAIRS for e in nccl.predict(fab, "allreduce", 16384))
