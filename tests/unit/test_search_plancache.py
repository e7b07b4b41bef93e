"""Plans the screen built for a floor, kept for their simulation (``treeattn.search.plancache``)."""

from __future__ import annotations

import treeattn.search.evaluate as evaluate
from treeattn.search import Evaluator, search
from treeattn.search.candidates import layout_of, standard_schedules
from treeattn.search.plancache import KeptPlans
from treeattn.topology.library import resolve
from treeattn.workload import Workload


def test_the_highest_floors_leave_first_and_a_taken_plan_is_gone():
    kept = KeptPlans(budget=10)
    kept.keep(("a", 1), 5.0, 4, "A")
    kept.keep(("b", 1), 9.0, 4, "B")
    kept.keep(("c", 1), 1.0, 4, "C")  # over budget: b (the highest floor) leaves
    assert kept.ops == 8
    assert kept.take(("b", 1)) is None
    kept.keep(("d", 1), 5.0, 4, "D")  # a and d tie: d, kept last, leaves
    assert kept.take(("d", 1)) is None
    assert kept.take(("a", 1)) == "A" and kept.take(("a", 1)) is None
    kept.keep(("e", 1), 0.0, 11, "E")  # alone over the budget: not kept
    assert kept.take(("e", 1)) is None
    kept.drop(("c", 1))
    assert kept.ops == 0


def _setup():
    topo = resolve("dgx-h100:nodes=2")
    w = Workload.create(ranks=topo.num_ranks, seq_len=65536, model="llama-3.1-8b")
    return topo, w, standard_schedules(layout_of(topo), w, small=False)


def test_a_screened_plan_is_built_once_and_timed_as_a_fresh_one(monkeypatch):
    topo, w, scheds = _setup()
    built = []
    real = evaluate.build
    monkeypatch.setattr(evaluate, "build", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    ev, fresh = Evaluator(topo, w), Evaluator(topo, w)
    fresh._kept = KeptPlans(budget=0)
    for s in scheds:
        ev.screen_floor_us(s, 1)
    n = len(built)
    times = [ev.time_us(s, 1) for s in scheds]
    # every simulation took its screened plan; long chains are screened unbuilt
    assert len(built) == n + sum(1 for s in scheds if s.chain_steps)
    assert ev._kept.ops == 0
    assert times == [fresh.time_us(s, 1) for s in scheds]


def test_a_pruned_candidate_lets_its_plan_go():
    topo, w, scheds = _setup()
    ev = Evaluator(topo, w)
    s = next(x for x in scheds if not x.chain_steps)
    f = ev.screen_floor_us(s, 1)
    assert ev._kept.ops > 0
    assert ev.time_us(s, 1, cutoff=f) == float("inf")
    assert ev._kept.ops == 0


def test_search_is_the_same_with_no_plans_kept(monkeypatch):
    topo, w, _ = _setup()
    kept = search(topo, w)
    monkeypatch.setattr(evaluate, "KeptPlans", lambda: KeptPlans(budget=0))
    none = search(topo, w)
    assert [(c.algorithm, c.params, c.chunks, c.predicted_us) for c in kept.candidates] == [
        (c.algorithm, c.params, c.chunks, c.predicted_us) for c in none.candidates]
    assert kept.best == none.best and kept.stats == none.stats
