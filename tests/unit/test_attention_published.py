"""The attention kernel's efficiency: the cost parameter, and the published figures it is fitted to."""

from __future__ import annotations

import dataclasses

import pytest

from treeattn.cost.compute import ComputeModel
from treeattn.errors import TopologyError
from treeattn.topology.library import resolve
from treeattn.topology.model import CostParams
from treeattn.validate.attention import attention_summary, load_attention
from treeattn.workload import Workload


def test_attn_efficiency_scales_only_the_attention_kernel():
    topo = resolve("dgx-a100[ranks 0]")
    w = Workload.create(ranks=1, seq_len=4096, batch=8, q_heads=32, kv_heads=8, head_dim=128)
    plain = ComputeModel.of(w, topo)
    half = ComputeModel.of(w, dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, attn_efficiency=0.4)))
    nbytes = plain.partial_bytes(0)
    assert half.partial_us(0) == pytest.approx(topo.cost.launch_us + nbytes / (2000 * 0.4 * 1e3))
    assert plain.partial_us(0) == pytest.approx(topo.cost.launch_us + nbytes / (2000 * 0.8 * 1e3))
    assert half.step_merge_us(0, 1 << 20) == plain.step_merge_us(0, 1 << 20)  # merges keep mem_efficiency
    assert half.min_partial_us(0) == pytest.approx(half.partial_us(0))
    # a measured kernel bandwidth wins; a share outside (0, 1] is refused; unset leaves the fingerprint alone
    with pytest.raises(TopologyError, match="attn_efficiency"):
        CostParams(attn_efficiency=1.5)
    assert CostParams().key() == CostParams(attn_efficiency=None).key() != CostParams(attn_efficiency=0.5).key()


def test_families_keep_the_published_efficiency():
    assert resolve("dgx-h100").cost.attn_efficiency == 0.55
    assert resolve("hgx-h200:nodes=2").cost.attn_efficiency == 0.55
    assert resolve("gb200-nvl72").cost.attn_efficiency == 0.66
    assert resolve("dgx-a100").cost.attn_efficiency is None  # no published figure: mem_efficiency


def test_published_rows_are_predicted_and_fitted():
    rows = load_attention()
    summary = attention_summary(rows)
    assert set(summary) == {"H100", "B200"} and sum(s["rows"] for s in summary.values()) == len(rows) == 10
    for gpu, fam in (("H100", "dgx-h100"), ("B200", "gb200-nvl72")):
        assert summary[gpu]["fitted_efficiency"] == pytest.approx(resolve(fam).cost.attn_efficiency, abs=0.01)
    h = [r for r in rows if r.gpu == "H100"]
    assert [r.workload.split[0] for r in h] == [128, 2000, 4000] and h[-1].published_us == 567.2
    assert rows[-1].published_us == pytest.approx(1680.16, rel=1e-4)  # "1.68...ms" read with its unit
