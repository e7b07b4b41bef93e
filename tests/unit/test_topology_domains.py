"""Rank domains (fastest first), NICs and rails, for hierarchical planners."""

from __future__ import annotations

import pytest

from treeattn.errors import TopologyError
from treeattn.topology import DomainKind, domains, rails, rank_nic, resolve
from treeattn.topology.library import shipped_files


def shape(topo):
    return [(lv.kind.value, [len(g) for g in lv.groups]) for lv in domains(topo)]


def test_dgx_nodes_are_nvlink_islands_then_one_leaf_group():
    t = resolve("dgx-h100-2node")
    levels = domains(t)
    assert [lv.kind for lv in levels] == [DomainKind.FABRIC, DomainKind.LEAF]
    assert levels[0].groups == (tuple(range(8)), tuple(range(8, 16)))
    assert levels[1].groups == (tuple(range(16)),)
    assert levels[0].group_of(11) == 1


def test_rail_optimized_leaf_groups_are_scalable_units():
    # 64 nodes, 32 NICs per leaf: nodes 0-31 share rail leaves, 32-63 the others.
    assert shape(resolve("dgx-h100:nodes=64")) == [("fabric", [8] * 64), ("leaf", [256, 256])]


def test_fat_tree_leaf_groups_follow_leaves():
    assert shape(resolve("dgx-a100:nodes=4,fabric=fat-tree,nics_per_leaf=16")) == [
        ("fabric", [8] * 4), ("leaf", [16, 16])]


def test_pcie_box_levels():
    assert shape(resolve("rtx4090-8")) == [("pcie-switch", [4, 4]), ("node", [8])]
    assert shape(resolve("rtx4090-2")) == [("socket", [2])]


def test_nvl72_fabric_spans_trays():
    assert shape(resolve("gb200-nvl72:racks=2")) == [("fabric", [72, 72]), ("leaf", [144])]


def test_host_ranks_share_a_device():
    assert shape(resolve("cpu-4")) == [("device", [4])]


@pytest.mark.parametrize("name", sorted(shipped_files()))
def test_levels_nest_and_cover_every_rank(name):
    t = resolve(name)
    levels = domains(t)
    for lv in levels:
        assert sorted(r for g in lv.groups for r in g) == list(range(t.num_ranks))
        assert list(lv.groups) == sorted(lv.groups) and all(list(g) == sorted(g) for g in lv.groups)
    for inner, outer in zip(levels, levels[1:], strict=False):
        assert len(outer.groups) < len(inner.groups)
        for g in inner.groups:
            assert len({outer.group_of(r) for r in g}) == 1
    assert domains(t) == levels  # deterministic


def test_rank_nic_and_rails():
    t = resolve("dgx-h100-2node")
    assert rank_nic(t, 11) == "n1.nic3"
    assert rails(t) == tuple((k, k + 8) for k in range(8))
    dgx1 = resolve("dgx1-v100")  # 4 NICs, two GPUs each
    assert [rank_nic(dgx1, r) for r in range(8)] == [f"n0.nic{r // 2}" for r in range(8)]
    assert rails(dgx1) == ((0, 1), (2, 3), (4, 5), (6, 7))
    cpu = resolve("cpu-4")
    assert rank_nic(cpu, 0) is None and rails(cpu) == ()
    with pytest.raises(TopologyError):
        rank_nic(cpu, 4)
