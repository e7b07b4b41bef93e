"""What ``treeattn topo show`` says about the network: how the NICs are shared, what a leaf
group of a rail-optimized fabric is, and the rate a message moves at between two ranks as
the cost model moves it (not the narrowest link's datasheet figure)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.cli_helpers import run_cli
from tests.unit.test_cost_helpers import MERGE, SEND, make_plan
from treeattn.cost.simulate import simulate
from treeattn.plan.ir import Op, OpKind
from treeattn.topology import DeviceKind, DomainKind, LinkClass, domains, rank_nic, resolve
from treeattn.workload import Workload

SHARED = """\
name: shared-nics
nodes: 2
node:
  gpus: {count: 8, mem_bw_gbps: 3350}
  pcie: {bw_gbps: 55, switches: 4}
  fabric: {kind: nvswitch, bw_gbps: 450}
  nics: {count: 4, bw_gbps: 50}
network: {topology: rail-optimized}
"""

IDLE = """\
name: idle-nics
devices:
  - {name: n0.gpu0, kind: gpu, node: 0, mem_bw_gbps: 3350}
  - {name: n0.nic0, kind: nic, node: 0}
  - {name: n0.nic1, kind: nic, node: 0}
  - {name: n1.gpu0, kind: gpu, node: 1, mem_bw_gbps: 3350, nic: n1.nic1}
  - {name: n1.nic0, kind: nic, node: 1}
  - {name: n1.nic1, kind: nic, node: 1}
  - {name: leaf0, kind: switch, node: -1, tier: leaf}
links:
  - {src: n0.gpu0, dst: n0.nic0, kind: pcie, bw_gbps: 55, duplex: true}
  - {src: n0.gpu0, dst: n0.nic1, kind: pcie, bw_gbps: 55, duplex: true}
  - {src: n1.gpu0, dst: n1.nic0, kind: pcie, bw_gbps: 55, duplex: true}
  - {src: n1.gpu0, dst: n1.nic1, kind: pcie, bw_gbps: 55, duplex: true}
  - {src: n0.nic0, dst: leaf0, kind: infiniband, bw_gbps: 50, duplex: true}
  - {src: n0.nic1, dst: leaf0, kind: infiniband, bw_gbps: 50, duplex: true}
  - {src: n1.nic0, dst: leaf0, kind: infiniband, bw_gbps: 50, duplex: true}
  - {src: n1.nic1, dst: leaf0, kind: infiniband, bw_gbps: 50, duplex: true}
"""


def show(spec: str) -> tuple[dict, str]:
    res = run_cli("topo", "show", spec, "--json")
    assert res.exit_code == 0, res.stderr
    text = run_cli("topo", "show", spec)
    assert text.exit_code == 0, text.stderr
    assert all(len(line) <= 80 for line in text.stdout.splitlines()[2:]), text.stdout
    return json.loads(res.stdout), " ".join(text.stdout.split())


def domains_column(spec: str) -> str:
    """The Domains table's last column (what a group's ranks share), its wrapped cells joined."""
    lines = run_cli("topo", "show", spec).stdout.splitlines()
    at = lines.index("Domains (fastest first)")
    end = next(i for i in range(at, len(lines)) if lines[i].startswith("└"))
    cells = [line.split("│")[-2].strip() for line in lines[at:end] if line.startswith("│")]
    return " ".join(cells)


def test_gpus_sharing_a_nic_are_shown_sharing_it(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text(SHARED)
    topo = resolve(str(path))
    load = Counter(rank_nic(topo, r) for r in range(topo.num_ranks))
    assert set(load.values()) == {2}  # 8 GPUs on 4 NICs: two a NIC
    data, text = show(str(path))
    assert data["nics"] == {"nics": len(load), "ranks_per_nic": {"2": len(load)}, "idle": []}
    assert f"{len(load)} carry 2 ranks each, sharing its links" in text
    # They share it in the model too: ranks 0 and 1 go to the other node over one NIC link.
    a, b = set(topo.route(0, 8)), set(topo.route(1, 9))
    assert any(topo.links[i].src == rank_nic(topo, 0) and topo.links[i].cls is LinkClass.NETWORK for i in a & b)


def test_nics_no_rank_sends_through_are_named(tmp_path):
    path = tmp_path / "idle.yaml"
    path.write_text(IDLE)
    topo = resolve(str(path))
    used = {rank_nic(topo, r) for r in range(topo.num_ranks)}
    idle = [d.name for d in topo.devices if d.kind is DeviceKind.NIC and d.name not in used]
    assert idle == ["n0.nic1", "n1.nic0"]
    data, text = show(str(path))
    assert data["nics"]["idle"] == idle and data["nics"]["ranks_per_nic"] == {"0": 2, "1": 2}
    assert "2 carry 1 rank each; 2 carry none (n0.nic1, n1.nic0)" in text


def _leaves(topo, ranks) -> set[str]:
    idx = topo._index
    out = set()
    for r in ranks:
        out |= {n for n in idx.network_neighbors(rank_nic(topo, r)) if topo.device(n).tier == "leaf"}
    return out


@pytest.mark.parametrize("spec", ["dgx-a100:nodes=2", "dgx-h100-2node", "dgx-h100:nodes=64", "gb200-nvl72:racks=2"])
def test_a_rail_optimized_leaf_group_says_how_many_leaves_it_spans(spec):
    topo = resolve(spec)
    level = next(lv for lv in domains(topo) if lv.kind is DomainKind.LEAF)
    spans = sorted({len(_leaves(topo, g)) for g in level.groups})
    assert spans[0] > 1  # one group, several leaves: not "one leaf of all its ranks"
    data, text = show(spec)
    leaf = next(d for d in data["domains"] if d["kind"] == "leaf")
    assert leaf["leaves"] == spans
    assert data["network"]["rail_optimized"] is True
    assert data["network"]["switches"]["leaf"] == sum(1 for d in topo.devices if d.tier == "leaf")
    assert f"{spans[0]} leaf switches, one rail each; between leaves through the spines" in domains_column(spec)
    assert f"rail-optimized, {data['rails']} rails" in text
    # What the row says is what routing does: network traffic across leaves goes through a spine.
    group = level.groups[0]
    far = [r for r in group if _leaves(topo, [r]) != _leaves(topo, [group[0]])
           and any(topo.links[i].cls is LinkClass.NETWORK for i in topo.route(group[0], r))]
    assert far and all(any(topo.device(topo.links[i].dst).tier == "spine" for i in topo.route(group[0], r))
                       for r in far)


def test_a_fat_tree_leaf_group_under_one_leaf_says_so():
    data, text = show("dgx-h100:nodes=2,fabric=fat-tree")
    leaf = next(d for d in data["domains"] if d["kind"] == "leaf")
    assert leaf["leaves"] == [1] and data["network"]["rail_optimized"] is False
    assert "one leaf switch" in domains_column("dgx-h100:nodes=2,fabric=fat-tree") and "rail-optimized" not in text


def _moved_gbps(topo) -> float:
    """GB/s the simulator moves rank 0's partial to rank 1 at, less the overhead and latency."""
    w = Workload(batch=64, q_heads=32, kv_heads=8, head_dim=128, split=(1, 1))
    progs = [[Op(OpKind.COMPUTE, 0), Op(SEND, 1, peer=1)], [Op(OpKind.COMPUTE, 0), Op(MERGE, 1, peer=0)]]
    t = {(x.rank, x.op): x for x in simulate(make_plan(progs, w, topo), topo).timeline}[(0, 1)]
    fixed = topo.cost.overhead_us + topo.route_latency_us(0, 1)
    return w.payload_bytes / (t.end_us - t.start_us - fixed) / 1e3


@pytest.mark.parametrize("spec", ["rtx4090:gpus=2", "rtx4090-8[ranks 0,4]", "mi300x:gpus=4[ranks 0,1]"])
def test_the_matrix_prints_the_rate_the_cost_model_moves_a_message_at(spec):
    # p2p: false (RTX 4090) moves through host memory at NCCL's shared-memory rate, and an
    # xGMI link at RCCL's rating of it: not the PCIe or xGMI datasheet figure of the route.
    topo = resolve(spec)
    moved = _moved_gbps(topo)
    data, _ = show(spec)
    assert data["rate_matrix_gbps"][0][1] == pytest.approx(moved, rel=1e-9)
    assert data["from_rank0"][1]["rate_gbps"] == pytest.approx(moved, rel=1e-9)
    assert data["bw_matrix_gbps"][0][1] > moved * 1.2  # the datasheet figure is not what moves
    lines = run_cli("topo", "show", spec).stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Transfer rate, GB/s"))
    row = next(line for line in lines[at:] if line.startswith("│ 0 "))
    assert [c.strip() for c in row.split("│")[2:-1]] == ["-", f"{float(f'{moved:.4g}'):g}"]


@pytest.mark.parametrize(("spec", "ratio", "said"), [
    ("dgx-h100:nodes=4", [1.0, 1.0], "non-blocking (a leaf's uplinks carry what its NICs do)"),
    ("dgx-h100:nodes=4,oversubscription=2", [2.0, 2.0], "leaves oversubscribed 2:1"),
    ("dgx-h100:nodes=64,oversubscription=1.5", None, "leaves oversubscribed"),
])
def test_the_network_says_how_oversubscribed_its_leaves_are(spec, ratio, said):
    topo = resolve(spec)
    data, text = show(spec)
    got = data["network"]["oversubscription"]
    if ratio is not None:
        assert got == ratio
    leaf = next(d.name for d in topo.devices if d.tier == "leaf")  # checked against the links themselves
    down = sum(ln.bw_gbps * ln.count for ln in topo.links if ln.src == leaf and topo.device(ln.dst).kind
               is not DeviceKind.SWITCH)
    up = sum(ln.bw_gbps * ln.count for ln in topo.links if ln.src == leaf and topo.device(ln.dst).kind
             is DeviceKind.SWITCH)
    assert got[0] <= round(down / up, 2) <= got[1]
    assert said in " ".join(text.split())
    assert show("cpu:ranks=2")[0].get("network") is None
