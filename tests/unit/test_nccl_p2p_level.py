"""NCCL's P2P level: which GPU pairs of a PCIe machine NCCL connects peer-to-peer and which
through host memory (``treeattn.cost.nccl_rates.p2p_level``, ``pcie_path_type``, ``shm_pair``)."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from treeattn.cost import nccl_fabric, nccl_rates
from treeattn.errors import InputError, TopologyError
from treeattn.topology.compact import build_compact
from treeattn.topology.model import CostParams
from treeattn.topology.schema import CompactFile


def _box(gpus: int, switches: int = 0, sockets: int = 1, cpu: str = "", p2p: bool = True, **cost) -> object:
    spec = {"name": "pcie-box",
            "node": {"gpus": {"count": gpus, "model": "L40S", "mem_bw_gbps": 864, "mem_gb": 48, "p2p": p2p},
                     "cpus": {"count": sockets, "model": cpu,
                              **({"link": {"kind": "upi", "bw_gbps": 22}} if sockets > 1 else {})},
                     "pcie": {"generation": 4, "bw_gbps": 25, "latency_us": 0.5, "switches": switches}}}
    if cost:
        spec["cost"] = cost
    return build_compact(CompactFile.model_validate(spec))


def _kinds(topo) -> dict[tuple[int, int], str]:
    n = topo.num_ranks
    return {(a, b): nccl_rates.pcie_path_type(topo, a, b) for a in range(n) for b in range(n) if a != b}


def test_path_types_follow_the_pcie_tree():
    # One switch per socket, two sockets: pairs under one switch PIX, across sockets SYS.
    two = _box(4, switches=2, sockets=2)
    kinds = _kinds(two)
    assert kinds[(0, 1)] == kinds[(2, 3)] == "PIX"
    assert kinds[(0, 2)] == kinds[(1, 3)] == kinds[(3, 0)] == "SYS"
    # Root ports of one CPU: PHB (nvidia-smi's PHB and NODE alike).
    assert set(_kinds(_box(4)).values()) == {"PHB"}
    # Two switches under one CPU: their GPUs meet at the CPU.
    assert _kinds(_box(4, switches=2))[(0, 2)] == "PHB"


def test_nccls_default_level_sends_through_host_memory_beyond_a_pcie_switch():
    two = _box(4, switches=2, sockets=2)
    assert nccl_rates.p2p_level(two, 0) == "PXB"
    assert nccl_rates.shm_pair_gbps(two, 0, 1) == math.inf  # one switch: peer-to-peer
    assert nccl_rates.shm_pair_gbps(two, 0, 2) == nccl_rates.SHM_GBPS == nccl_rates.shm_pair_gbps(two, 2, 0)
    assert nccl_rates.shm_pairs(two) == 8
    assert nccl_fabric.fabric(two).shm_gbps == nccl_rates.SHM_GBPS
    # Root ports: every pair through host memory; the pair rate the simulator drains says so.
    flat = _box(4)
    assert nccl_rates.shm_pairs(flat) == 12
    assert nccl_rates.pair_rate_gbps(flat, 0, 1) == nccl_rates.SHM_GBPS


def test_nccl_p2p_level_written_in_cost_overrides_the_default():
    two = _box(4, switches=2, sockets=2, p2p_level="SYS")
    assert nccl_rates.shm_pairs(two) == 0 and nccl_fabric.fabric(two).shm_gbps == 0.0
    pix = _box(4, switches=2, sockets=2, p2p_level="PIX")
    assert nccl_rates.shm_pairs(pix) == 8
    phb = _box(4, switches=2, p2p_level="PHB")
    assert nccl_rates.shm_pairs(phb) == 0
    # GPUs without peer-to-peer stay in host memory whatever the level (NCCL checks CUDA's
    # peer access after the level).
    assert nccl_rates.shm_pairs(_box(4, p2p=False, p2p_level="SYS")) == 12


def test_an_amd_host_of_at_most_two_gpus_connects_them_across_sockets():
    assert nccl_rates.p2p_level(_box(2, sockets=2, cpu="EPYC-9654"), 0) == "SYS"
    assert nccl_rates.shm_pairs(_box(2, sockets=2, cpu="EPYC-9654")) == 0
    assert nccl_rates.shm_pairs(_box(2, sockets=2, cpu="Xeon-Platinum-8480C")) == 2
    # AMD's workstation CPUs name no "AMD" or "EPYC" in their model
    for model in ("Ryzen Threadripper PRO 5975WX", "Ryzen 9 7950X"):
        assert nccl_rates.cpu_vendor(_box(2, cpu=model)) == "amd" and nccl_rates.shm_pairs(_box(2, cpu=model)) == 0
    # Three or more GPUs: NCCL's default again.
    assert nccl_rates.p2p_level(_box(4, cpu="EPYC-9654"), 0) == "PXB"
    assert nccl_rates.shm_pairs(_box(4, cpu="EPYC-9654")) == 12


def test_gpu_fabric_and_network_pairs_are_not_host_memory_pairs():
    from treeattn.topology.library import resolve

    for name in ("dgx-h100:nodes=2", "mi300x", "dgx1-v100", "dgx-a100"):
        assert nccl_rates.shm_pairs(resolve(name)) == 0, name


def test_p2p_level_is_checked_kept_and_fingerprinted():
    with pytest.raises(TopologyError, match="p2p_level"):
        CostParams(p2p_level="NODE")
    cost = CostParams(p2p_level="PHB")
    assert cost.to_dict()["p2p_level"] == "PHB"
    assert cost.key() != CostParams().key()
    assert "p2p_level" not in CostParams().to_dict()
    assert dataclasses.replace(cost, p2p_level=None).key() == CostParams().key()


def test_before_nccl_2_23_4_amd_hosts_used_peer_to_peer_across_sockets_and_others_stopped_at_pxb():
    # NCCL 2.22.3: "use P2P whenever we can" (SYS), PXB on Intel (and ARM, Zhaoxin);
    # 2.23.4 made PXB the default on every CPU, AMD hosts of at most two GPUs excepted.
    amd4 = _box(4, sockets=2, cpu="EPYC-7R32", nccl_version="2.22.3")
    assert nccl_rates.p2p_level(amd4, 0) == "SYS" and nccl_rates.shm_pairs(amd4) == 0
    assert nccl_rates.p2p_level(_box(4, sockets=2, cpu="EPYC-7R32", nccl_version="2.23.4"), 0) == "PXB"
    assert nccl_rates.p2p_level(_box(4, sockets=2, cpu="Xeon-Platinum-8480C", nccl_version="2.22.3"), 0) == "PXB"
    # A release passed in (a published table older than the model's figures) wins over the topology's.
    assert nccl_rates.p2p_level(_box(4, cpu="EPYC-7R32"), 0) == "PXB"
    assert nccl_rates.p2p_level(_box(4, cpu="EPYC-7R32"), 0, (2, 18, 5)) == "SYS"
    # A written level wins over both.
    assert nccl_rates.p2p_level(_box(4, cpu="EPYC-7R32", p2p_level="PIX"), 0, (2, 18, 5)) == "PIX"


def test_a_published_table_older_than_the_models_figures_keeps_its_releases_p2p_level(tmp_path):
    from pathlib import Path

    from treeattn.validate import corpus, published

    box = tmp_path / "amd-box.yaml"
    box.write_text("name: amd-box\nnode:\n  gpus: {count: 4, model: L40S, mem_bw_gbps: 864, mem_gb: 48}\n"
                   "  cpus: {count: 2, model: EPYC-9654, link: {kind: infinity-fabric, bw_gbps: 16}}\n"
                   "  pcie: {generation: 4, bw_gbps: 25, latency_us: 0.5}\n")
    # A real nccl-tests table (results/published, pytorch issue 127077's 4-GPU run) stands
    # for the published one, its printed version left out: what matters is the release its
    # mapping names.
    log = Path(__file__).resolve().parents[2] / "results" / "published" / "pytorch-issue-127077-a10g.txt"
    lines = [ln for ln in log.read_text().splitlines() if not ln.startswith("NCCL version")]
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
    predicted = {}
    for version in ("2.18.5", "2.26.2"):
        (tmp_path / "t.yaml").write_text(
            f"source: test\nlibrary_version: {{library: NCCL, version: '{version}', evidence: test}}\n"
            f"tables:\n  - {{id: t, lines: [1, 15], collective: all_reduce, topology: {box}, ranks: 4, env: {{}}}}\n")
        (table,) = corpus.load_corpus([tmp_path / "t.yaml"])
        (row,) = published.predict_table(table)
        predicted[version] = row.predicted_us
    # 2.18.5 on AMD: peer-to-peer across the sockets (16 GB/s); 2.26.2: PXB, so host memory.
    assert predicted["2.26.2"] > 3 * predicted["2.18.5"]


def test_nccl_environment_sets_the_level_as_ncclgetlevel_reads_it():
    from treeattn.cost.nccl_env import p2p_level_from_env

    assert p2p_level_from_env(None) is None and p2p_level_from_env({"NCCL_ALGO": "Ring"}) is None
    assert p2p_level_from_env({"NCCL_P2P_DISABLE": "1"}) == "LOC"
    # NCCL_P2P_DISABLE wins over a level; 0 leaves the level to NCCL_P2P_LEVEL.
    assert p2p_level_from_env({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}) == "LOC"
    assert p2p_level_from_env({"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "NVL"}) == "NVL"
    # The old numbering: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and up SYS.
    assert [p2p_level_from_env({"NCCL_P2P_LEVEL": str(n)}) for n in range(7)] == [
        "LOC", "PIX", "PXB", "PHB", "SYS", "SYS", "SYS"]
    for bad in ("NODE", "phb", "", "\u0663", "\u00b2"):  # NCCL's old number starts with an ASCII digit
        with pytest.raises(InputError, match="NCCL_P2P_LEVEL"):
            p2p_level_from_env({"NCCL_P2P_LEVEL": bad})


def test_rccls_name_of_the_gpu_fabric_level_reads_as_nvl():
    """RCCL's topoPathTypeStr names path type 1 XGMI (NCCL: NVL); an MI300X user's
    NCCL_P2P_LEVEL=XGMI was refused as a level NCCL would not read."""
    from treeattn.cost.nccl_env import p2p_level_from_env

    assert p2p_level_from_env({"NCCL_P2P_LEVEL": "XGMI"}) == "NVL"
    assert p2p_level_from_env({"NCCL_P2P_LEVEL": "XGMI"}, "RCCL") == "NVL"


@pytest.mark.parametrize(("library", "name"), [("NCCL", "XGMI"), ("RCCL", "NVL"), ("RCCL", "C2C"), ("RCCL", "P2C")])
def test_each_library_reads_its_own_level_names(library, name):
    """NCCL's topoPathTypeStr has no XGMI, RCCL's AMD build no NVL, C2C or P2C: either library
    ignores the other's name, so a table of that library that sets it is refused, not scored
    at a level the library would not take."""
    from treeattn.cost.nccl_env import p2p_level_from_env

    assert p2p_level_from_env({"NCCL_P2P_LEVEL": name}) is not None  # library unknown: either's name
    with pytest.raises(InputError, match=f"NCCL_P2P_LEVEL='{name}': {library} reads .*ignore"):
        p2p_level_from_env({"NCCL_P2P_LEVEL": name}, library)


def test_nccls_later_level_names_are_read_from_their_first_release():
    """C2C first in v2.26.2-1's topoPathTypeStr, P2C in v2.27.3-1: an older NCCL ignores them."""
    from treeattn.cost.nccl_env import p2p_level_from_env

    assert p2p_level_from_env({"NCCL_P2P_LEVEL": "C2C"}, "NCCL", (2, 26, 2)) == "C2C"
    assert p2p_level_from_env({"NCCL_P2P_LEVEL": "P2C"}, "NCCL", (2, 27, 3)) == "P2C"
    assert p2p_level_from_env({"NCCL_P2P_LEVEL": "P2C"}, "NCCL") == "P2C"  # the newest
    with pytest.raises(InputError, match=r"'C2C': NCCL 2\.25\.1 reads LOC, NVL, NVB, PIX"):
        p2p_level_from_env({"NCCL_P2P_LEVEL": "C2C"}, "NCCL", (2, 25, 1))
    with pytest.raises(InputError, match="'P2C': NCCL 2.26.x reads"):
        p2p_level_from_env({"NCCL_P2P_LEVEL": "P2C"}, "NCCL", (2, 26, 999))


def test_a_tables_level_name_is_read_by_its_library():
    from treeattn.validate.corpus import load_corpus
    from treeattn.validate.published import table_p2p_level

    t = next(t for t in load_corpus() if t.library == "RCCL")
    _, why = table_p2p_level(dataclasses.replace(t, env={"NCCL_P2P_LEVEL": "XGMI"}))
    assert why == "NCCL_P2P_LEVEL=XGMI"
    with pytest.raises(InputError, match=f"^{re.escape(t.name)}: NCCL_P2P_LEVEL='NVL': RCCL reads"):
        table_p2p_level(dataclasses.replace(t, env={"NCCL_P2P_LEVEL": "NVL"}))


def test_levels_below_pcie_send_nvlink_pairs_through_host_memory():
    from treeattn.topology.library import resolve

    a100 = resolve("dgx-a100")
    off = dataclasses.replace(a100, cost=a100.cost.updated(p2p_level="LOC"))
    # NCCL_P2P_DISABLE=1: no pair of the NVSwitch box is connected peer-to-peer.
    assert nccl_rates.shm_pairs(off) == 8 * 7
    assert nccl_rates.pair_rate_gbps(off, 0, 5) == nccl_rates.shm_rate_gbps(off)
    assert nccl_fabric.fabric(off).shm_gbps == nccl_rates.shm_rate_gbps(off)
    assert nccl_rates.shm_pairs(dataclasses.replace(a100, cost=a100.cost.updated(p2p_level="NVL"))) == 0
    # DGX-1's hybrid cube-mesh: NVL keeps the NVLink neighbours, sends the pairs NVLink joins
    # only through another GPU (NVB) through host memory; NVB keeps them all.
    dgx1 = resolve("dgx1-v100")
    nvl = dataclasses.replace(dgx1, cost=dgx1.cost.updated(p2p_level="NVL"))
    nvb = dataclasses.replace(dgx1, cost=dgx1.cost.updated(p2p_level="NVB"))
    direct = {(a, b) for a in range(8) for b in range(8)
              if a != b and all(dgx1.links[i].cls.name == "GPU_FABRIC" for i in dgx1.route(a, b))}
    assert 0 < len(direct) < 56
    assert nccl_rates.shm_pairs(nvl) == 56 - len(direct)
    assert nccl_rates.shm_pairs(nvb) == 0
    # Network pairs stay on the network's transports at every level.
    two = resolve("dgx-h100:nodes=2")
    loc = dataclasses.replace(two, cost=two.cost.updated(p2p_level="LOC"))
    assert not nccl_rates.shm_pair(loc, 0, 8) and nccl_rates.shm_pair(loc, 0, 1)


def test_a_chain_of_nvlink_bridges_joins_only_neighbours_of_one_gpu_by_nvb():
    # 0-1, 1-2, 2-3 bridged: 0 and 2 share GPU 1 (NVB: peer-to-peer at NCCL's default), but
    # 0 and 3 are two GPUs apart, which NCCL does not route through (one GPU hop at most):
    # their path is PCIe through the host bridge (PHB), beyond the default PXB, so NCCL
    # carries them through host memory. They were taken for NVB, peer-to-peer.
    from treeattn.topology.io import load_topology_text

    chain = load_topology_text(
        "name: chain4\nnode:\n  gpus: {count: 4, model: A40, mem_bw_gbps: 696, mem_gb: 48}\n"
        "  pcie: {generation: 4, width: 16, bw_gbps: 25}\n"
        "  fabric: {kind: pairs, bw_gbps: 14.0625, link: nvlink, generation: 3, "
        "pairs: [[0, 1, 4], [1, 2, 4], [2, 3, 4]]}\n")
    assert nccl_rates.p2p_level(chain, 0) == "PXB" and nccl_rates.pcie_path_type(chain, 0, 3) == "PHB"
    assert not nccl_rates.shm_pair(chain, 0, 1) and not nccl_rates.shm_pair(chain, 0, 2)
    assert nccl_rates.shm_pair(chain, 0, 3) and nccl_rates.shm_pair(chain, 3, 0)
    nvb = dataclasses.replace(chain, cost=chain.cost.updated(p2p_level="NVB"))
    assert not nccl_rates.shm_pair(nvb, 0, 2) and nccl_rates.shm_pair(nvb, 0, 3)


def test_the_published_p2p_level_sys_run_is_predicted_peer_to_peer_as_its_log_shows():
    # results/published tinygrad-p2p-pr22-rtx4090: 4 x RTX 4090 (patched driver, one AMD socket),
    # NCCL 2.23.4 with NCCL_P2P_LEVEL=SYS, its log "via P2P/direct pointer" on every ring hop.
    # The mapping's variable, not NCCL's default, decides: at the release's default (PXB on an
    # AMD host of more than two GPUs) every pair of that box would go through host memory.
    from treeattn.topology.library import resolve
    from treeattn.validate import corpus, published

    (table,) = corpus.load_corpus([corpus.corpus_dir() / "tinygrad-p2p-pr22-rtx4090.yaml"])
    assert table.nccl_release == (2, 23, 4) and table.log.n_gpus == table.ranks == 4
    topo, why = published.table_p2p_level(table)
    assert why == "NCCL_P2P_LEVEL=SYS" and nccl_rates.p2p_level(topo, 0) == "SYS"
    assert nccl_rates.shm_pairs(topo) == 0
    box = resolve(table.topology)
    assert nccl_rates.p2p_level(box, 0, table.nccl_release) == "PXB"
    assert all(nccl_rates.pcie_path_type(box, a, b) == "PHB" for a in range(4) for b in range(4) if a != b)


def test_the_tinybox_row_is_predicted_at_nccls_old_default_on_an_amd_host():
    # results/published tinygrad-p2p-readme-tinybox: 6 x RTX 4090 (patched driver, one EPYC), no
    # NCCL variables, published before NCCL 2.22: NCCL's default on an AMD host was PATH_SYS, so
    # every pair connects peer-to-peer; 2.23.4's PXB would send them all through host memory.
    from treeattn.topology.library import resolve
    from treeattn.validate import corpus, published

    (table,) = corpus.load_corpus([corpus.corpus_dir() / "tinygrad-p2p-readme-tinybox.yaml"])
    assert table.env == {} and table.nccl_bound < (2, 22, 0) and table.ranks == 6
    topo, _ = published.table_p2p_level(table)
    assert nccl_rates.p2p_level(topo, 0, table.nccl_bound) == "SYS" and nccl_rates.shm_pairs(topo) == 0
    assert nccl_rates.p2p_level(resolve(table.topology), 0, (2, 23, 4)) == "PXB"
    (row,) = published.predict_table(table)
    assert abs(row.error) < 0.1, row  # peer-to-peer at PCIe 4.0 x16; through host memory it is +813 %


def test_cost_p2p_level_takes_every_name_the_environment_takes():
    """``cost.p2p_level: XGMI`` was refused by the YAML schema while ``NCCL_P2P_LEVEL=XGMI``
    read as NVL (RCCL's name): a topology's level and the environment's now read the same
    names (``model.p2p_level_name``) to the same level."""
    from treeattn.cost.nccl_env import p2p_level_from_env
    from treeattn.topology.io import load_topology_text
    from treeattn.topology.model import P2P_LEVEL_ALIASES, P2P_LEVELS

    base = ("name: mi\nnode:\n  gpus: {count: 4, model: MI300X, mem_bw_gbps: 5300, mem_gb: 192}\n"
            "  pcie: {generation: 5, bw_gbps: 55}\n  fabric: {kind: full-mesh, bw_gbps: 64}\n")
    for name in (*P2P_LEVELS, *P2P_LEVEL_ALIASES):
        topo = load_topology_text(base + f"cost: {{p2p_level: {name}}}\n")
        assert topo.cost.p2p_level == p2p_level_from_env({"NCCL_P2P_LEVEL": name}), name
        assert CostParams(p2p_level=name).p2p_level == topo.cost.p2p_level, name
    xgmi = load_topology_text(base + "cost: {p2p_level: XGMI}\n")
    nvl = load_topology_text(base + "cost: {p2p_level: NVL}\n")
    assert xgmi.fingerprint == nvl.fingerprint and xgmi.cost == nvl.cost
    with pytest.raises(TopologyError, match="XGMI"):  # the message names it among the levels
        CostParams(p2p_level="xgmi")


def test_shm_reason_is_the_one_shm_pair_decides_by():
    # GPU 0 lacks peer access over PCIe but is NVLink-bridged to GPU 1, which is bridged to
    # GPU 2; GPU 3 is on PCIe alone. At NCCL_P2P_LEVEL=NVL, 0-2 (NVLink through GPU 1, NVB)
    # go through host memory because of the level, as 1-3 and 2-3 do; 0-3 because GPU 0
    # has no peer-to-peer.
    from treeattn.topology.io import load_topology_text

    topo = load_topology_text(_MIXED)
    got = {(a, b): nccl_rates.shm_reason(topo, a, b) for _, a, b in nccl_rates.node_pairs(topo)}
    level, no_p2p = nccl_rates.SHM_LEVEL, nccl_rates.SHM_NO_P2P
    assert got == {(0, 1): None, (1, 0): None, (1, 2): None, (2, 1): None, (0, 2): level, (2, 0): level,
                   (1, 3): level, (3, 1): level, (2, 3): level, (3, 2): level, (0, 3): no_p2p, (3, 0): no_p2p}
    assert all(nccl_rates.shm_pair(topo, a, b) == (r is not None) for (a, b), r in got.items())
    # Without the level, the NVLink pairs connect peer-to-peer again; GPU 0's PCIe pair does not.
    default = dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, p2p_level=None))
    assert nccl_rates.shm_reason(default, 0, 2) is None and nccl_rates.shm_reason(default, 0, 3) == no_p2p


def test_fabric_island_is_public_and_checks_its_device():
    from treeattn.topology.io import load_topology_text
    from treeattn.topology.library import resolve

    topo = load_topology_text(_MIXED)
    assert topo.fabric_island("gpu0") == topo.fabric_island("gpu2") >= 0
    assert topo.fabric_island("gpu3") == topo.fabric_island("cpu0") == -1
    dgx1 = resolve("dgx1-v100")
    assert len({dgx1.fabric_island(dgx1.ranks[r]) for r in range(8)}) == 1
    with pytest.raises(TopologyError, match="no device"):
        topo.fabric_island("gpu9")


_MIXED = (
    "name: mixed\ndevices:\n  - {name: cpu0, kind: cpu}\n"
    "  - {name: gpu0, kind: gpu, model: L40S, mem_bw_gbps: 864, p2p: false}\n"
    + "".join(f"  - {{name: gpu{g}, kind: gpu, model: L40S, mem_bw_gbps: 864}}\n" for g in (1, 2, 3))
    + "links:\n"
    + "".join(f"  - {{src: gpu{g}, dst: cpu0, kind: pcie, bw_gbps: 25, generation: 4, width: 16, duplex: true}}\n"
              for g in range(4))
    + "  - {src: gpu0, dst: gpu1, kind: nvlink, bw_gbps: 56, generation: 3, duplex: true}\n"
    "  - {src: gpu1, dst: gpu2, kind: nvlink, bw_gbps: 56, generation: 3, duplex: true}\n"
    "cost: {p2p_level: NVL}\n")
"""Four GPUs of which two pairs are NVLink-bridged (0-1, 1-2) and GPU 0 lacks peer access,
at ``NCCL_P2P_LEVEL=NVL``: pairs go through host memory for either reason."""


def test_integer_settings_nccl_reads_quietly_are_said():
    """``NCCL_P2P_DISABLE=x`` is 0 to NCCL (``strtoll``; ``ncclLoadParam`` logs it at INFO
    only), as to the model: said, so that a user who meant 1 sees it. An out-of-range number
    or an empty value leaves NCCL's default (``ncclLoadParam``: ``errno`` set, ``strlen`` 0)."""
    from treeattn.cost.nccl_env import INT_SETTINGS, _int_env, p2p_level_from_env, unread_numbers

    assert p2p_level_from_env({"NCCL_P2P_DISABLE": "x"}) is None  # read as 0: not disabled
    (said,) = unread_numbers({"NCCL_P2P_DISABLE": "x", "NCCL_ALGO": "Ring"})
    assert said.startswith("NCCL_P2P_DISABLE='x' is not a number: NCCL reads it as 0")
    assert "reads it as 1" in unread_numbers({"NCCL_P2P_DISABLE": "1x"})[0]
    assert unread_numbers({"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0x0", "RCCL_MSCCL_ENABLE": "-1"}) == []
    for name, default in INT_SETTINGS.items():
        huge = "9" * 20
        assert _int_env(huge, default) == _int_env("-" + huge, default) == _int_env("", default) == default
        assert unread_numbers({name: huge}) == [f"{name}={huge!r} is out of range: NCCL keeps its default, "
                                                f"{default}, and so does the model"]
