"""The host fit's bounds: truths inside them are recovered, a kernel timing that no message
could contain does not collapse the CPU terms, and terms the cases push past a bound stop
there and are flagged (on the fit, in its warnings and in the fitted topology's sources)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.test_cost_helpers import host_fit_cases, loopback_hosts
from treeattn.calibrate.apply_fit import ClassParams, FittedParams
from treeattn.calibrate.fit_host import fit_host_terms, nelder_mead
from treeattn.calibrate.host_terms import HostTerms
from treeattn.topology.io import dump_topology, load_topology_text

HEADS = (8, 1, 32)
CPU, WAKE, STEP, LAUNCH, LATENCY = 40.0, 90.0, 25.0, 50.0, 10.0
ALPHA = CPU + LATENCY + LAUNCH
"""A message's fixed time as ``apply_fit`` reads it: the receiver's CPU, the route, the copy's launch."""


def _truth(**cost):
    topo, truth = loopback_hosts(cpu_us=CPU, wakeup_us=WAKE, step_us=STEP, cpu_queue="fifo", attn_launch_us=300.0,
                                 attn_gbps=3.0, launch_us=LAUNCH, start_cpu_us=60.0, cpu_us_per_kb=2.0, **cost)
    # Four flows together get twice one flow's rate.
    link = dataclasses.replace(truth.links[0], bw_gbps=5.0, flow_gbps=2.5)
    return topo, dataclasses.replace(truth, links=(link,))


def _cases(topo, truth, trees: bool = True):
    return host_fit_cases(topo, truth, HEADS, (2, 32) if trees else ())


def _params(topo, merge_launch_us: float) -> FittedParams:
    return FittedParams(classes=(ClassParams((("loopback", 2.5),), ALPHA, 2.5),), overhead_us=5.0,
                        launch_us=merge_launch_us, attn_launch_us=50.0, attn_gbps=6.0)


def _inside(topo, params, cases, fit, fitted) -> None:
    """Every term the fit set lies within its bounds."""
    bounds = HostTerms(topo, params, cases, 2).bounds()
    values = {"cpu": fit.cpu_us, "wake": fit.wakeup_us, "start": fit.start_cpu_us, "kb": fit.cpu_us_per_kb,
              "loop": fit.loopback_gbps, "merge": fitted.cost.launch_us / params.launch_us}
    if fit.step_us:  # fitted only with attention plans
        values["step"] = fit.step_us
    for key, x in values.items():
        assert bounds[key].lo <= x <= bounds[key].hi, (key, x, bounds[key])


def test_nelder_mead_stops_at_a_bound_and_runs_as_before_inside_them():
    f = lambda v: (v[0] - 3.0) ** 2 + (v[1] - 0.5) ** 2  # noqa: E731
    free = nelder_mead(f, [1.0, 1.0], lower=[0.0, 0.0], iterations=400, tol=1e-12)
    assert nelder_mead(f, [1.0, 1.0], lower=[0.0, 0.0], iterations=400, tol=1e-12,
                       bounds=[(0.0, 100.0), (0.0, 100.0)]) == free
    (x, y), _, _ = nelder_mead(f, [1.0, 1.0], lower=[0.0, 0.0], iterations=400, tol=1e-12,
                               bounds=[(0.5, 2.0), (0.1, 10.0)])
    assert x == 2.0 and abs(y - 0.5) < 1e-3


@pytest.mark.parametrize("timed_alone_us", [LAUNCH, 15 * LAUNCH])
def test_host_fit_recovers_the_truth_whatever_the_merge_kernel_timed_alone(timed_alone_us):
    # Timed alone at 15 times its cost in the plans, the merge kernel takes longer than a whole
    # message: started there, with no bound, the fit leaves the message ends' CPU and the
    # wake-up next to nothing (cpu_us ~1e-7, wakeup_us ~1e-3), as the emu-pcie-tree calibration
    # did with a 748 us merge kernel against 164 us messages.
    topo, truth = _truth()
    cases = _cases(topo, truth)
    params = _params(topo, timed_alone_us)
    fitted, fit, notes = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0, cpu_queue="fifo")
    assert fit.rms_log_error < 0.03
    assert fit.cpu_us == pytest.approx(CPU, rel=0.2) and fit.wakeup_us == pytest.approx(WAKE, rel=0.2)
    assert fit.step_us == pytest.approx(STEP, rel=0.25)
    assert fitted.cost.launch_us == pytest.approx(LAUNCH, rel=0.25)
    assert fit.at_bounds == () and not any(s.startswith("fit:") for s in fitted.sources)
    assert not any(n.startswith("fit:") for n in notes)
    _inside(topo, params, cases, fit, fitted)


def test_terms_the_cases_cannot_place_stop_at_their_bounds_and_are_flagged():
    # No attention plans: nothing refits the merge kernel's fixed cost, and timed alone it
    # exceeds a whole message (15 x). It is held at the bound (alpha), and said so.
    topo, truth = _truth()
    cases = _cases(topo, truth, trees=False)
    params = _params(topo, 15 * LAUNCH)
    fitted, fit, notes = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0, cpu_queue="fifo")
    assert fitted.cost.launch_us == pytest.approx(ALPHA)
    assert fit.merge_factor == pytest.approx(ALPHA / (15 * LAUNCH))
    assert any(a.startswith("launch_us 100 at its upper bound 100") for a in fit.at_bounds)
    (note,) = [n for n in notes if n.startswith("fit:")]
    assert "launch_us" in note and fitted.sources[-1] == note
    assert note in load_topology_text(dump_topology(fitted), "t.yaml").sources
    _inside(topo, params, cases, fit, fitted)


def test_a_term_the_cases_drive_to_nothing_stays_at_its_floor_and_is_flagged():
    # Ranks that start a run with no CPU work of their own: the fit wants start_cpu_us at 0;
    # its floor is a hundredth of the fastest message case (below that it changes no case by
    # 1 %). The other terms are still recovered.
    topo, truth = _truth()
    truth = dataclasses.replace(truth, cost=truth.cost.updated(start_cpu_us=0.0))
    cases = _cases(topo, truth)
    params = _params(topo, LAUNCH)
    fitted, fit, _ = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0, cpu_queue="fifo")
    fastest = min(t for plan, t, _ in cases if plan.is_raw)
    assert fit.start_cpu_us == pytest.approx(fastest / 100, rel=0.011)
    assert [a.split(" at ")[0].split()[0] for a in fit.at_bounds] == ["start_cpu_us"]
    assert "lower bound" in fit.at_bounds[0] and fitted.sources[-1].startswith("fit: start_cpu_us")
    assert fit.at_bounds[0].endswith(f"(the fastest message case, {fastest:.4g} µs, / 100 .. x 1)")
    assert fit.cpu_us == pytest.approx(CPU, rel=0.2) and fit.wakeup_us == pytest.approx(WAKE, rel=0.2)
    _inside(topo, params, cases, fit, fitted)


def test_each_term_at_a_bound_gets_its_own_line():
    # No CPU per step and none as a run begins: both terms stop at their floors, one warning
    # and one source entry each, in the bounds' order.
    topo, truth = _truth()
    truth = dataclasses.replace(truth, cost=truth.cost.updated(start_cpu_us=0.0, step_us=0.0))
    cases = _cases(topo, truth)
    fitted, fit, notes = fit_host_terms(topo, _params(topo, LAUNCH), cases, cores=2, start_wakeup_us=50.0,
                                        cpu_queue="fifo")
    flags = [n for n in notes if n.startswith("fit:")]
    assert [f.split()[1] for f in flags] == ["step_us", "start_cpu_us"]
    assert all("lower bound" in f for f in flags)
    assert [f"fit: {a}" for a in fit.at_bounds] == [f.split(": the cases")[0] for f in flags]
    assert tuple(flags) == fitted.sources[-2:]
    assert load_topology_text(dump_topology(fitted), "t.yaml").sources[-2:] == fitted.sources[-2:]
    assert fit.cpu_us == pytest.approx(CPU, rel=0.2) and fit.wakeup_us == pytest.approx(WAKE, rel=0.2)
