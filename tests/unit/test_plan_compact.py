"""Compact plan files (``programs: built``): the builder and its params stand for the ops."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.unit.test_plan_helpers import every_plan, with_program
from treeattn.errors import PlanFormatError
from treeattn.plan import build
from treeattn.plan.compact import COMPACT_ABOVE_OPS, compact_args
from treeattn.plan.io import dump_plan, load_plan
from treeattn.topology.library import resolve
from treeattn.workload import Workload


@pytest.mark.parametrize("p", [1, 3, 8])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_every_builder_plan_reads_back_equal_from_its_compact_form(p, fmt):
    compacted = 0
    for chunks in (1, 3):
        for plan in every_plan(p, chunks):
            if compact_args(plan) is None:  # a tree's per-head parents: the builder takes one list
                assert plan.algorithm == "tree" and plan.params.get("result") == "heads"
                with pytest.raises(PlanFormatError, match="compact"):
                    dump_plan(plan, fmt, compact=True)
                continue
            text = dump_plan(plan, fmt, compact=True)
            assert "built" in text and "recv_merge" not in text
            assert load_plan(text) == plan
            compacted += 1
    assert compacted > 20


def test_big_plans_are_compact_by_default_and_explicit_on_request():
    topo = resolve("dgx-h100:nodes=128")
    w = Workload.create(ranks=topo.num_ranks, seq_len=1 << 20, batch=1, model="llama-3.1-8b")
    plan = build("butterfly", w, topo, chunks=2)
    assert sum(map(len, plan.programs)) > COMPACT_ABOVE_OPS
    compact, explicit = dump_plan(plan), dump_plan(plan, compact=False)
    assert compact.endswith("programs: built\n") and 20 * len(compact) < len(explicit)
    assert load_plan(compact) == plan == load_plan(explicit)
    small = build("butterfly", Workload.create(ranks=8, seq_len=1 << 16, batch=1, model="llama-3.1-8b"),
                  resolve("dgx-h100"))
    assert "programs:\n" in dump_plan(small)


def test_a_big_plan_its_builder_does_not_make_is_written_explicit():
    topo = resolve("dgx-h100:nodes=128")
    w = Workload.create(ranks=topo.num_ranks, seq_len=1 << 20, batch=1, model="llama-3.1-8b")
    plan = build("butterfly", w, topo, chunks=2)
    edited = with_program(plan, 3, [replace(op, step=op.step + 1) for op in plan.programs[3]])
    assert compact_args(edited) is None
    assert "programs:\n" in dump_plan(edited)
    with pytest.raises(PlanFormatError, match="does not make exactly"):
        dump_plan(edited, compact=True)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["params"].update(order="bogus"), "refuses params"),
    (lambda d: d["params"].update(extra=1), "params"),
    (lambda d: d.update(chunks=d["chunks"] + 1), "chunks"),
    (lambda d: d.update(result_ranks=[0]), "result_ranks"),
    (lambda d: d.update(algorithm="nonesuch"), "no builder is named"),
])
def test_a_compact_file_whose_header_the_builder_does_not_make_is_refused(edit, match):
    plan = next(pl for pl in every_plan(8, 3) if pl.algorithm == "butterfly" and pl.workload.kind == "attention")
    data = json.loads(dump_plan(plan, "json", compact=True))
    edit(data)
    with pytest.raises(PlanFormatError, match=match):
        load_plan(json.dumps(data))


def test_a_compact_header_of_many_ranks_is_refused_in_a_short_line():
    # result_ranks of 1,024 ranks printed whole made a line of thousands of characters.
    topo = resolve("dgx-h100:nodes=128")
    w = Workload.create(ranks=topo.num_ranks, seq_len=1 << 20, batch=1, model="llama-3.1-8b")
    data = json.loads(dump_plan(build("butterfly", w, topo, chunks=2), "json"))
    data["result_ranks"] = [0]
    with pytest.raises(PlanFormatError) as exc:
        load_plan(json.dumps(data))
    assert str(exc.value).endswith("result_ranks: 1 ranks, where the builder makes 1024 from params (butterfly)")
    data["result_ranks"] = list(range(1024))
    data["result_ranks"][10], data["result_ranks"][11] = 11, 10
    with pytest.raises(PlanFormatError) as exc:
        load_plan(json.dumps(data))
    assert str(exc.value).endswith("result_ranks[10]: 11 is not what the builder makes from params (10; 1024 ranks) "
                                   "(butterfly)")


def test_a_plan_without_a_version_says_it_is_missing():
    plan = next(pl for pl in every_plan(8, 1) if pl.algorithm == "butterfly")
    data = json.loads(dump_plan(plan, "json"))
    del data["version"]
    with pytest.raises(PlanFormatError, match=r"version is missing \(this treeattn writes \d+\)"):
        load_plan(json.dumps(data))
    data["version"] = None  # given, but no integer
    with pytest.raises(PlanFormatError, match=r"version must be an integer, got None"):
        load_plan(json.dumps(data))


@pytest.mark.parametrize("value", [-5.0, float("nan")])
def test_a_predicted_time_below_zero_or_not_a_number_is_refused(value):
    plan = next(pl for pl in every_plan(8, 1) if pl.algorithm == "butterfly")
    data = json.loads(dump_plan(plan, "json"))
    data["predicted_us"] = value
    with pytest.raises(PlanFormatError, match=r"predicted_us: Input should be greater than or equal to 0, got"):
        load_plan(json.dumps(data))
