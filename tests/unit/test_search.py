"""The planner: candidate generation, pruning floor, exhaustive agreement, determinism."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from treeattn.cli.options import load_topology
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError
from treeattn.plan.builders import build
from treeattn.plan.io import dump_plan
from treeattn.plan.validate import check
from treeattn.search import (
    TREE_FAMILIES,
    Evaluator,
    baselines,
    chunk_choices,
    exhaustive_trees,
    search,
)
from treeattn.search.candidates import (
    DIRECT_MAX_MESSAGES,
    direct_schedules,
    double_binary_parents,
    double_binary_schedules,
    hierarchical_schedule,
    interleaved_order,
    layout_of,
    multirail_schedules,
    standard_schedules,
)
from treeattn.search.evaluate import sweep_chunks
from treeattn.search.trees import children_of, count_rooted_trees, is_tree
from treeattn.topology.library import resolve
from treeattn.units import DType
from treeattn.workload import RawPayload, Workload


def _w(p: int, batch: int = 1, seq: int = 131072) -> Workload:
    return Workload.create(ranks=p, seq_len=seq, batch=batch, model="llama-3.1-8b")


def test_layout_of_two_dgx_nodes():
    lay = layout_of(resolve("dgx-h100-2node"))
    assert [kind for kind, _ in lay.levels] == ["fabric"]  # the one-group leaf level is the implied top
    assert lay.levels[0][1] == (tuple(range(8)), tuple(range(8, 16)))
    assert len(lay.rails) == 8 and lay.rails[3] == (3, 11)
    assert lay.nodes == (tuple(range(8)), tuple(range(8, 16)))
    order = interleaved_order(lay)
    assert order[:4] == [0, 8, 1, 9] and sorted(order) == list(range(16))


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16])
def test_double_binary_trees_are_complementary(n):
    a, b = double_binary_parents(n)
    assert is_tree(a) and is_tree(b)
    ka, kb = children_of(a), children_of(b)
    assert all(len(k) <= 2 for k in ka + kb)
    if n % 2 == 0 and n > 2:
        # a rank with children in one tree has none in the other
        assert not [r for r in range(n) if ka[r] and kb[r]]


@pytest.mark.parametrize("spec", ["cpu-4", "dgx-h100-2node", "rtx4090-8", "emu-2x4", "gb200-nvl72"])
def test_every_candidate_builds_a_valid_plan(spec):
    topo = resolve(spec)
    lay = layout_of(topo)
    w = _w(topo.num_ranks, batch=16)
    scheds = (standard_schedules(lay, w, small=False) + multirail_schedules(lay, small=False)
              + double_binary_schedules(lay) + direct_schedules(lay))
    scheds += [hierarchical_schedule(lay, [i], [("star", 2), ("kary", 4)]) for i in range(len(lay.levels))]
    if len(lay.levels) >= 2:
        scheds.append(hierarchical_schedule(lay, [0, 1], [("chain", 2), ("binomial", 2), ("kary", 3)]))
    families = {s.family for s in scheds}
    assert {"star", "chain", "kary", "binomial", "butterfly"} <= families
    if len(lay.nodes) > 1:
        assert {"multirail", "double-binary"} <= families
    assert "direct" in families
    ev = Evaluator(topo, w)
    for s in scheds:
        if topo.num_ranks > 16 and s.family in ("chain", "ring"):
            continue  # valid too, but slow to validate here
        plan = ev.plan(s, 2)
        check(plan)


def test_multirail_trees_cross_the_network_on_their_own_rail():
    topo = resolve("dgx-h100-2node")
    lay = layout_of(topo)
    forests = [s for s in multirail_schedules(lay, small=False) if s.describe["trees"] == 8]
    assert forests
    for par in forests[0].kwargs["parents"]:
        cross = [(r, q) for r, q in enumerate(par) if q >= 0 and lay.node_of[r] != lay.node_of[q]]
        assert len(cross) == 1
        (r, q), = cross
        assert r % 8 == q % 8  # same GPU index: the same rail


def test_direct_exchanges_flat_by_domain_and_along_rails():
    lay = layout_of(resolve("dgx-h100-2node"))
    by = {json.dumps(s.describe, sort_keys=True): s for s in direct_schedules(lay)}
    # nodes listed by rail are the NVLink islands here: that exchange is listed once, as "fabric"
    rails = [f'{{"groups": "rails", "rails_per_group": {k}, "then": "node"}}' for k in (2, 4)]
    assert set(by) == {'{"groups": "none"}', '{"groups": "fabric"}', '{"groups": "rail", "then": "node"}', *rails}
    assert by['{"groups": "none"}'].kwargs == {}
    assert by['{"groups": "fabric"}'].kwargs["groups"] == [list(range(8)), list(range(8, 16))]
    assert by['{"groups": "rail", "then": "node"}'].kwargs["groups"][3] == [3, 11]
    # k adjacent rails a group, members node by node: across groups, each position stays in its node
    assert by[rails[0]].kwargs["groups"] == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    assert by[rails[1]].kwargs["groups"][1] == [4, 5, 6, 7, 12, 13, 14, 15]
    # 128 ranks: the flat exchange (128 x 127 messages) is too big; grouped ones stay
    big = direct_schedules(layout_of(resolve("dgx-h100-16node")))
    assert big and all(s.kwargs.get("groups") for s in big)
    assert 128 * 127 > DIRECT_MAX_MESSAGES
    res = search(resolve("dgx-h100-2node"), _w(16), families={"direct"})
    assert res.best.algorithm == "direct" and res.candidates[0].algorithm == "direct"
    # two rails a group beats whole nodes and whole rails here (as in plans/dgx-h100-2node.*.yaml)
    assert res.best.params["groups"] == by[rails[0]].kwargs["groups"]
    check(res.best)


def test_a_heads_search_takes_an_all_plan_where_its_fewer_messages_win():
    # 32 ranks on 4 nodes, B = 1: a heads plan sends every rank's 516-byte segment on its own
    # (31 messages a rank); the all plan grouped by rails sends 10 of 16 KiB, and each rank
    # keeps its own heads of it.
    topo, w = resolve("dgx-h100:nodes=4"), _w(32, batch=1, seq=32 * 1024)
    heads, full = search(topo, w, result="heads"), search(topo, w)
    assert heads.best.layout == "heads" and heads.best.params.get("whole_rows") is True
    assert heads.candidates[0].params["rows"] == "whole"
    assert heads.best.predicted_us <= full.best.predicted_us
    check(heads.best)
    # 8 V100s, Llama-3.1-70B at B = 4: the library's all-gather + merge, each rank keeping its heads
    v100 = resolve("dgx1-v100")
    w70 = Workload.create(ranks=8, seq_len=64 * 1024, batch=4, model="llama-3.1-70b")
    gather = search(v100, w70, result="heads")
    assert gather.best.algorithm == "allgather-merge" and gather.best.params["whole_rows"] is True
    assert gather.best.predicted_us == search(v100, w70).best.predicted_us
    # B = 64 on one node: the whole-rows gather does not win everywhere; a heads plan's own
    # segments do here
    one = search(resolve("dgx-h100"), _w(8, batch=64, seq=8 * 1024), result="heads")
    assert "whole_rows" not in one.best.params


def test_chunk_choices_are_powers_of_two_capped_by_whole_quanta_of_rows():
    # 32 rows of 516 bytes make 8 quanta of 4 rows: more chunks would start some mid-vector
    assert _w(8).rows == 32 and chunk_choices(_w(8), 8) == (1, 2, 4, 8)
    assert chunk_choices(_w(8, batch=128), 8) == (1, 2, 4, 8, 16, 32, 64)
    assert chunk_choices(_w(512, batch=128), 512) == (1, 2, 4, 8, 16)
    assert chunk_choices(RawPayload(nbytes=32, ranks=2), 2) == (1, 2)  # 8 fp32: 2 quanta
    assert chunk_choices(RawPayload(nbytes=8, ranks=2), 2) == (1,)


@pytest.mark.parametrize("spec, ranks", [("dgx-h100-2node", "0,1,2,8,9"), ("emu-2x4", "0,1,4,5"),
                                         ("rtx4090-8", None), ("cpu-4", None)])
def test_floor_never_exceeds_the_simulation(spec, ranks):
    topo = load_topology(spec, ranks)
    lay = layout_of(topo)
    p = topo.num_ranks
    narrow = dataclasses.replace(_w(p, batch=64), partial_dtype=DType.BF16)  # conversions, rounding
    for w in (_w(p), _w(p, batch=64), narrow, RawPayload(nbytes=1 << 20, ranks=p)):
        ev = Evaluator(topo, w)
        for s in standard_schedules(lay, w, small=True) + multirail_schedules(lay, small=True) + direct_schedules(lay):
            for c in (1, 4):
                if c * s.rows_per_chunk > w.rows:
                    continue
                plan = ev.plan(s, c)
                assert ev.floor_us(plan) <= simulate(plan, topo, timeline=False).predicted_us * (1 + 1e-12)


def test_exhaustive_enumerates_every_rooted_tree():
    topo = load_topology("dgx-h100-2node", "0,1,8")
    res = exhaustive_trees(topo, _w(3), chunk_choices=(1, 2))
    assert res.trees == count_rooted_trees(3) == 9
    assert res.simulations + res.pruned >= 9
    with pytest.raises(Exception, match="at most 6 ranks"):
        exhaustive_trees(resolve("dgx-h100"), _w(8))


@pytest.mark.parametrize(
    "spec, ranks, batch",
    [("dgx-h100-2node", "0,1,8,9", 16), ("dgx-h100-2node", "0,1,2,8,9", 1), ("emu-2x4", "0,1,4,5,6", 1),
     ("rtx4090-8", "0,1,2,4,5", 16)],
)
def test_search_matches_exhaustive_trees(spec, ranks, batch):
    topo = load_topology(spec, ranks)
    w = _w(topo.num_ranks, batch=batch)
    ex = exhaustive_trees(topo, w, chunk_choices=(1, 2, 4))
    # (a 32-layer cache at B=16 would not fit a 24 GB RTX 4090: the comparison is about time)
    trees_only = search(topo, w, chunk_choices=(1, 2, 4), families=TREE_FAMILIES, mem_fraction=None)
    assert trees_only.best.predicted_us <= ex.predicted_us * 1.01
    full = search(topo, w, chunk_choices=(1, 2, 4), mem_fraction=None)
    assert full.best.predicted_us <= trees_only.best.predicted_us * (1 + 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("spec, ranks", [("dgx-h100-2node", "0,1,2,8,9,10"), ("dgx1-v100", "0,1,2,4,5,6")])
@pytest.mark.parametrize("batch", [1, 16])
def test_search_matches_exhaustive_trees_six_ranks(spec, ranks, batch):
    topo = load_topology(spec, ranks)
    w = _w(topo.num_ranks, batch=batch)
    ex = exhaustive_trees(topo, w, chunk_choices=(1, 2, 4))
    res = search(topo, w, chunk_choices=(1, 2, 4), families=TREE_FAMILIES)
    assert res.best.predicted_us <= ex.predicted_us * 1.01


def test_pick_is_the_fastest_candidate_and_its_plan_says_so():
    topo = resolve("dgx-h100-2node")
    res = search(topo, _w(16, batch=16), top_k=50)
    times = [c.predicted_us for c in res.candidates]
    assert times == sorted(times) and res.best.predicted_us == times[0]
    assert simulate(res.best, topo, timeline=False).predicted_us == pytest.approx(times[0], rel=1e-12)
    check(res.best)
    assert all(c.ratio_to_bound >= 1.0 for c in res.candidates)
    assert res.best.notes["search"]["lower_bound_us"] == res.lower_bound_us
    assert set(res.baselines) == {"allreduce3_nccl_us", "allreduce2_us", "allgather_merge_us", "ring_attention_us"}
    # the pick is never slower than what the paper's method and the library do here
    assert res.best.predicted_us <= res.baselines["allreduce3_nccl_us"]
    assert res.best.predicted_us <= res.baselines["allgather_merge_us"]
    assert len({(c.algorithm, json.dumps(c.params, sort_keys=True), c.chunks) for c in res.candidates}) == len(
        res.candidates)


@pytest.mark.parametrize("result, root", [("all", None), ("heads", None), ("root", 3)])
def test_every_candidate_is_rebuilt_from_its_build_params(result, root):
    # The table and the JSON's params name a candidate by its family (an improved tree by the
    # tree it started from); its build_params, read back from JSON as a user would, rebuild the
    # very plan the search timed.
    topo = resolve("dgx-h100-2node")
    w = _w(16, batch=16)
    res = search(topo, w, top_k=50, result=result, root=root)
    families = {c.algorithm for c in res.candidates}
    assert len(families) >= 4 and (result == "heads" or "improved" in families), families
    for c in json.loads(json.dumps(res.to_dict()))["candidates"]:
        plan = build(c["builder"], w, res.best.topology, chunks=c["chunks"], **c["build_params"])
        assert simulate(plan, topo, timeline=False).predicted_us == pytest.approx(c["predicted_us"], rel=1e-9), c


def test_search_is_deterministic():
    topo = resolve("dgx-h100-2node")
    w = _w(16)
    a, b = search(topo, w, seed=3), search(topo, w, seed=3)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    assert dump_plan(a.best) == dump_plan(b.best)


def test_raw_payload_search_and_baselines():
    topo = resolve("dgx-h100")
    w = RawPayload(nbytes=1 << 20, ranks=8)
    res = search(topo, w, top_k=3)
    assert res.best.is_raw and len(res.candidates) <= 3
    assert set(res.baselines) == {"allreduce_nccl_us", "allgather_merge_us"}
    # NCCL's fused kernel (one call, in-kernel pipelining) models faster than any plan at 1 MiB
    # here once a rank's sends are issued one overhead apart; the pick is still the best plan.
    assert res.lower_bound_us <= res.best.predicted_us <= res.baselines["allgather_merge_us"]
    ev = Evaluator(topo, w)
    for sched in standard_schedules(layout_of(topo), w, small=False):
        assert res.best.predicted_us <= sweep_chunks(ev, sched, chunk_choices(w, 8))[1] * (1 + 1e-9)


def test_ring_attention_baseline_only_where_cheap():
    topo = resolve("dgx-h100")
    base = baselines(topo, _w(8), ring_max_ranks=4)
    assert base["ring_attention_us"] is None and base["allreduce3_nccl_us"] > 0
    base = baselines(topo, _w(8))
    assert base["ring_attention_us"] > base["allreduce3_nccl_us"]


def test_bad_search_inputs():
    topo = resolve("dgx-h100")
    with pytest.raises(Exception, match="8"):
        search(topo, _w(4))
    with pytest.raises(Exception, match="unknown candidate families"):
        search(topo, _w(8), families={"spiral"})
    with pytest.raises(Exception, match="positive integers"):
        search(topo, _w(8), chunk_choices=(0, 2))
    with pytest.raises(InputError, match="at least one chunk count"):  # not the default, unsaid
        search(topo, _w(8), chunk_choices=())
    rows = _w(8).rows
    with pytest.raises(InputError, match=f"chunk choice {rows + 1} exceeds the payload's {rows} rows"):
        search(topo, _w(8), chunk_choices=(1, rows + 1))
    assert not math.isinf(search(topo, _w(8), chunk_choices=(3,)).best.predicted_us)


def test_chunk_choices_a_search_would_not_try_are_refused_and_an_iterator_is_read_once():
    topo = resolve("cpu:ranks=4")
    w = _w(4, seq=256)  # 32 rows: 8 a rank under result heads
    # under result heads a choice counts the pieces of one rank's rows: 8 rows cannot make 16
    with pytest.raises(InputError, match=r"chunk choice 16 exceeds the 8 rows a rank keeps of result heads "
                                         r"\(32 rows over 4 ranks\)"):
        search(topo, w, result="heads", chunk_choices=(2, 16), mem_fraction=None)
    tried = search(topo, w, result="heads", chunk_choices=(8,), mem_fraction=None).best.notes["search"]
    assert tried["chunk_choices"] == [8]
    # an iterator is read once: a second reading would find it empty
    tried = search(topo, w, chunk_choices=iter((1, 2)), mem_fraction=None).best.notes["search"]
    assert tried["chunk_choices"] == [1, 2]


def test_under_all_the_search_leaves_out_plans_whose_ranks_end_with_other_bits():
    # 12 ranks on nodes of 8 and 4: a direct exchange grouped by node is faster here, but its
    # ranks merge the groups' results in other orders (plan.bits): every rank must get the
    # same bits, so it is left out, and said.
    import treeattn
    from treeattn.plan.bits import bit_groups

    plan = treeattn.search_plan("dgx-h100:nodes=2[ranks 0-11]", "llama-3.1-8b", batch=16, seq_len="64K")
    assert bit_groups(plan) == {}
    left = plan.notes["search"]["left_out_for_bits"]
    assert {x["algorithm"] for x in left} == {"direct"} and all(x["params"]["groups"] != "none" for x in left)
    assert all(x["predicted_us"] > 0 and "bits differ" in x["why"] and x["chunks"] >= 1 for x in left)
    assert "left_out_for_memory" not in plan.notes["search"]
    grouped = treeattn.build_plan("dgx-h100:nodes=2[ranks 0-11]", "llama-3.1-8b", "direct", batch=16, seq_len="64K",
                                  groups=[list(range(8)), list(range(8, 12))])
    assert bit_groups(grouped) and grouped.predicted_us < plan.predicted_us


def test_a_raw_sum_is_held_to_the_same_bits_too():
    # A raw all-reduce feeds the next layer on every rank: a direct exchange grouped by rails
    # sums the groups' results in other orders and is left out; the plain exchange of every
    # rank (each sums all parts in rank order) and the butterfly (a + b either way) are kept.
    from treeattn.plan.bits import bit_groups

    topo = load_topology("dgx-h100:nodes=2[ranks 0-11]")
    res = search(topo, RawPayload(nbytes=64 * 1024, ranks=12), top_k=20)
    assert bit_groups(res.best) == {}
    left = [x for x in res.left_out if x["reason"] == "bits"]
    assert left and {x["algorithm"] for x in left} == {"direct"}
    assert all(x["params"]["groups"] != "none" for x in left)
    for x in json.loads(json.dumps(left)):  # each rebuilt from what plan --json gives: the plan left out
        again = build(x["builder"], res.best.workload, res.best.topology, chunks=x["chunks"], **x["build_params"])
        assert bit_groups(again) and simulate(again, topo, timeline=False).predicted_us == pytest.approx(
            x["predicted_us"], rel=1e-9)
    assert any(c.algorithm == "direct" and c.params["groups"] == "none" for c in res.candidates)
    eight = search(resolve("dgx-h100"), RawPayload(nbytes=64 * 1024, ranks=8), top_k=20)
    assert "butterfly" in {c.algorithm for c in eight.candidates}


def test_a_baseline_left_out_for_memory_is_named_in_the_plans_notes():
    # Llama-3.1-8B at B = 16, 256K: 64 GiB of KV a GPU fits 0.85 of 80 GiB, but ring attention
    # holds a second block; a baseline has no parameters or chunks of its own to record
    from treeattn.search.workload_file import workload_from_dict

    w = workload_from_dict({"model": "llama-3.1-8b", "batch": 16, "seq_len": "256K"}, ranks=8, where="test")
    res = search(resolve("dgx-h100"), w, mem_fraction=0.85)
    (left,) = res.best.notes["search"]["left_out_for_memory"]
    assert left["algorithm"] == "ring-attention" and left["predicted_us"] > 0 and "may use" in left["why"]
    assert set(left) == {"algorithm", "predicted_us", "why"}
