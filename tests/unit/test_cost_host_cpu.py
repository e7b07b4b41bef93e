"""The simulator's host CPU terms (``cost.host_cores``, ``cpu_us``, ``wakeup_us``, a link's
``flow_gbps``) against closed forms, and the host fit recovering known terms."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_cost_helpers import bare_cpu, make_plan, raw, switch_topo
from treeattn.calibrate.apply_fit import ClassParams, FittedParams
from treeattn.calibrate.fit_host import fit_host_terms, nelder_mead
from treeattn.calibrate.plans import concurrent_plan, fanin_plan, pingpong_plan
from treeattn.cost.simulate import simulate
from treeattn.errors import TopologyError
from treeattn.plan.ir import Op, OpKind
from treeattn.topology.io import dump_topology, load_topology_text
from treeattn.topology.library import resolve
from treeattn.topology.model import CostParams, Link, LinkKind

BETA = 10.0e3  # bytes per microsecond on switch_topo's links


def hosts(p: int, *, cores: int, cpu: float, wakeup: float = 0.0, lat: float = 1.0):
    topo = switch_topo(p, bw=10.0, lat=lat, overhead=2.0)
    cost = CostParams.from_flat(overhead_us=2.0, launch_us=0.0, mem_efficiency=1.0, host_cores=cores, cpu_us=cpu,
                      cpu_scope="machine", wakeup_us=wakeup)
    return dataclasses.replace(topo, cost=cost)


def bare_cpu4():
    """cpu:ranks=4 with local work free (no launch, memory time not modelled): only messages cost."""
    t = resolve("cpu:ranks=4,cores=2")
    dev = dataclasses.replace(t.devices[0], mem_bw_gbps=0.0)
    return dataclasses.replace(t, devices=(dev,), cost=CostParams(overhead_us=0.0, launch_us=0.0))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("trips", [1, 3])
@pytest.mark.parametrize("nbytes", [4, 40_000])
def test_pingpong_costs_latency_bytes_and_the_receivers_cpu(trips, nbytes):
    # The sender's CPU work runs beside the transfer; the receiver's follows it. No overhead.
    topo = hosts(2, cores=2, cpu=7.0, wakeup=30.0)
    res = simulate(pingpong_plan(topo, 2, (0, 1), nbytes, trips), topo)
    one_way = 2 * 1.0 + nbytes / BETA + 7.0
    assert close(res.predicted_us, 30.0 + 2 * trips * one_way)


def test_ranks_beyond_the_cores_slow_each_other_down():
    n = 4
    single = simulate(pingpong_plan(hosts(4, cores=4, cpu=10.0), 4, (0, 1), n, 2), hosts(4, cores=4, cpu=10.0))
    wide = hosts(4, cores=4, cpu=10.0)
    both_wide = simulate(concurrent_plan(wide, 4, [(0, 1), (2, 3)], n, 2), wide)
    assert close(both_wide.predicted_us, single.predicted_us)  # a core each: no contention
    narrow = hosts(4, cores=1, cpu=10.0)
    both_narrow = simulate(concurrent_plan(narrow, 4, [(0, 1), (2, 3)], n, 2), narrow)
    assert both_narrow.predicted_us > 1.5 * single.predicted_us


def test_one_wakeup_serves_messages_that_arrive_together():
    topo = hosts(4, cores=4, cpu=25.0)
    one = simulate(fanin_plan(topo, 4, 0, [1], 4), topo).predicted_us
    three = simulate(fanin_plan(topo, 4, 0, [1, 2, 3], 4), topo).predicted_us
    assert close(one, 2.0 + 4 / BETA + 25.0)  # two hops of latency, the bytes, the root's CPU work
    assert close(three, 2.0 + 3 * 4 / BETA + 25.0)  # the root link shared three ways; one wake-up


def test_merges_and_compute_share_the_cores():
    # Two ranks each merge 1 MB received from a third: on one core the merges take turns.
    def run(cores: int) -> float:
        base = switch_topo(3, bw=10.0, lat=0.0, overhead=0.0, mem_bw=10.0)
        topo = dataclasses.replace(base, cost=CostParams.from_flat(overhead_us=0.0, launch_us=0.0, mem_efficiency=1.0,
                                                          host_cores=cores, cpu_scope="machine"))
        progs = [[Op(OpKind.SEND, 0, peer=1), Op(OpKind.SEND, 0, peer=2)],
                 [Op(OpKind.RECV_MERGE, 0, peer=0)], [Op(OpKind.RECV_MERGE, 0, peer=0)]]
        return simulate(make_plan(progs, raw(3, 1_000_000), topo, result_ranks=[1]), topo).predicted_us

    assert run(1) > run(2)


def test_flow_cap_limits_one_flow_while_the_link_serves_more():
    def loop(flow: float | None):
        t = bare_cpu4()
        ln = dataclasses.replace(t.links[0], bw_gbps=3.0, flow_gbps=flow, latency_us=0.0)
        return dataclasses.replace(t, links=(ln,))

    n = 2_000_000
    for flow, one, two in ((2.0, n / 2e3, n / 2e3 * 2 / 1.5 * 1.0), (None, n / 3e3, 2 * n / 3e3)):
        t = loop(flow)
        alone = simulate(concurrent_plan(t, 4, [(0, 1)], n, 1), t).predicted_us
        pair = simulate(concurrent_plan(t, 4, [(0, 1), (2, 3)], n, 1), t).predicted_us
        # Each direction: alone min(flow, bw); two at once share bw (1.5 GB/s each, below the cap).
        assert close(alone, 2 * one)
        assert close(pair, 2 * (n / 1.5e3 if flow else two))


@settings(max_examples=30, deadline=None)
@given(cores=st.integers(1, 4), cpu=st.floats(0.0, 50.0), wakeup=st.floats(0.0, 100.0),
       nbytes=st.sampled_from([4, 4000, 400_000]))
def test_host_terms_only_ever_add_time(cores, cpu, wakeup, nbytes):
    free = hosts(4, cores=0, cpu=0.0)
    free = dataclasses.replace(free, cost=dataclasses.replace(free.cost, overhead_us=0.0))
    busy = hosts(4, cores=cores, cpu=cpu, wakeup=wakeup)
    plan = concurrent_plan(free, 4, [(0, 1), (2, 3)], nbytes, 2)
    assert simulate(plan, busy).predicted_us >= simulate(plan, free).predicted_us - 1e-9


def test_cost_terms_round_trip_yaml_and_change_the_fingerprint():
    base = resolve("cpu:ranks=4,cores=2")
    ln = dataclasses.replace(base.links[0], flow_gbps=1.5)
    topo = dataclasses.replace(base, links=(ln,), cost=CostParams.from_flat(
        host_cores=2, cpu_us=40.0, cpu_scope="machine", wakeup_us=80.0, attn_launch_us=90.0, attn_gbps=3.5,
        attn_next_launch_us=30.0))
    back = load_topology_text(dump_topology(topo), "t.yaml")
    assert back.cost == topo.cost and back.links[0].flow_gbps == 1.5
    assert back.fingerprint == topo.fingerprint != base.fingerprint


@pytest.mark.parametrize("bad", [dict(host_cores=-1), dict(cpu_us=-1.0), dict(cpu_scope="rack"),
                                 dict(wakeup_us=-2.0), dict(attn_launch_us=-1.0), dict(attn_gbps=0.0),
                                 dict(attn_next_launch_us=-1.0)])
def test_bad_cost_terms_are_rejected(bad):
    with pytest.raises(TopologyError):
        CostParams.from_flat(**bad)
    with pytest.raises(TopologyError):
        Link("a", "a", LinkKind.LOOPBACK, 1.0, flow_gbps=0.0)


def test_nelder_mead_finds_a_bounded_minimum():
    x, value, evals = nelder_mead(lambda v: (v[0] - 3.0) ** 2 + (v[1] - 0.5) ** 2, [1.0, 1.0], lower=[0.0, 0.0],
                                  iterations=400, tol=1e-12)
    assert abs(x[0] - 3.0) < 1e-3 and abs(x[1] - 0.5) < 1e-3 and evals > 0


def test_host_fit_recovers_known_terms_from_simulated_cases():
    topo = bare_cpu4()
    lb = topo.links[0]
    truth_link = dataclasses.replace(lb, latency_us=10.0, bw_gbps=4.0, flow_gbps=2.5)
    truth = dataclasses.replace(topo, links=(truth_link,), cost=topo.cost.with_host(
        host_cores=2, cpu_us=40.0, cpu_scope="machine", wakeup_us=90.0))
    plans = []
    for n in (4, 16384, 1 << 20, 16 << 20):
        plans += [pingpong_plan(topo, 4, (0, 1), n, r) for r in (1, 4)]
        plans += [concurrent_plan(topo, 4, [(0, 1), (2, 3)], n, 4), fanin_plan(topo, 4, 0, [1, 2, 3], n)]
    cases = [(p, simulate(p, truth, timeline=False).predicted_us) for p in plans]
    # The ping-pong fit's alpha is latency + receiver CPU; beta is one flow's rate.
    params = FittedParams(classes=(ClassParams((("loopback", lb.bw_gbps),), 50.0, 2.5),), overhead_us=5.0)
    fitted, fit, _ = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0)
    assert fit.rms_log_error < 0.01
    assert abs(fit.cpu_us - 40.0) < 2.0 and abs(fit.wakeup_us - 90.0) < 5.0
    assert abs(fit.loopback_gbps - 4.0) < 0.2
    assert fitted.cost.host.host_cores == 2 and fitted.links[0].flow_gbps == 2.5


def test_calibrated_attention_kernel_times_compute_and_merges_keep_theirs():
    from treeattn.cost.compute import ComputeModel
    from treeattn.workload import Workload

    topo = bare_cpu(2)
    w = Workload.create(ranks=2, seq_len=8192, batch=1, model="llama-3.1-8b")
    plain = ComputeModel.of(w, topo)
    timed = ComputeModel.of(w, dataclasses.replace(topo, cost=dataclasses.replace(
        topo.cost, attn_launch_us=200.0, attn_gbps=4.0)))
    assert timed.partial_us(0) == pytest.approx(200.0 + timed.partial_bytes(0) / 4e3)
    assert timed.min_partial_us(0) == pytest.approx(timed.partial_us(0))
    assert timed.step_local_us(0, 1 << 20) == plain.step_local_us(0, 1 << 20)


def test_host_fit_scales_the_attention_kernel_to_ranks_computing_at_once():
    from treeattn.calibrate.plans import compute_plan

    topo = bare_cpu4()
    lb = topo.links[0]
    truth = dataclasses.replace(topo, links=(dataclasses.replace(lb, latency_us=10.0, bw_gbps=4.0, flow_gbps=2.5),),
                                cost=dataclasses.replace(topo.cost, attn_launch_us=50.0, attn_gbps=3.0).with_host(
                                    host_cores=2, cpu_us=40.0, cpu_scope="machine", wakeup_us=90.0))
    plans = [compute_plan(topo, 4, (8, 1, 32), t) for t in (1024, 65536)]
    for n in (4, 1 << 20):
        plans += [pingpong_plan(topo, 4, (0, 1), n, r) for r in (1, 4)]
        plans += [concurrent_plan(topo, 4, [(0, 1), (2, 3)], n, 4), fanin_plan(topo, 4, 0, [1, 2, 3], n)]
    cases = [(p, simulate(p, truth, timeline=False).predicted_us) for p in plans]
    # Timed alone, the kernel looked twice as fast as it runs with every rank computing.
    params = FittedParams(classes=(ClassParams((("loopback", lb.bw_gbps),), 50.0, 2.5),), overhead_us=5.0,
                          attn_launch_us=50.0, attn_gbps=6.0)
    fitted, fit, _ = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0)
    assert fit.attn_factor == pytest.approx(0.5, rel=0.05)
    assert fitted.cost.attn_gbps == pytest.approx(3.0, rel=0.05)


def test_compute_plan_is_valid_and_every_rank_computes():
    from treeattn.calibrate.plans import compute_plan
    from treeattn.plan.validate import validate

    plan = compute_plan(resolve("cpu:ranks=4,cores=2"), 4, (8, 1, 32), 2048)
    assert not validate(plan).violations
    assert all(prog[0].kind is OpKind.COMPUTE for prog in plan.programs) and plan.contributors == (0,)
