"""The CPU work the host model charges each rank (``SimResult.cpu_us``), the two terms only
measured CPU time pins (``start_cpu_us``, ``cpu_us_per_kb``), and the host fit that uses the
ranks' measured CPU time beside their times."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_cost_helpers import host_fit_cases, loopback_hosts, switch_topo
from treeattn.calibrate.apply_fit import ClassParams, FittedParams
from treeattn.calibrate.fit_host import fit_host_terms
from treeattn.calibrate.plans import compute_plan, fanin_plan, pingpong_plan, tree_plans
from treeattn.cost import gloo
from treeattn.cost.simulate import simulate
from treeattn.errors import TopologyError
from treeattn.topology.io import dump_topology, load_topology_text
from treeattn.topology.library import resolve
from treeattn.topology.model import CostParams

BETA = 10.0e3  # bytes per microsecond on switch_topo's links
HEADS = (8, 1, 32)


def hosts(p: int, *, cores: int, cpu: float = 0.0, step: float = 0.0, start: float = 0.0, kb: float = 0.0,
          queue: str = "fifo", wakeup: float = 0.0):
    topo = switch_topo(p, bw=10.0, lat=1.0, overhead=2.0)
    cost = CostParams.from_flat(overhead_us=2.0, launch_us=0.0, mem_efficiency=1.0, host_cores=cores, cpu_us=cpu,
                      cpu_scope="machine", step_us=step, cpu_queue=queue, wakeup_us=wakeup, start_cpu_us=start,
                      cpu_us_per_kb=kb)
    return dataclasses.replace(topo, cost=cost)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_every_rank_queues_its_start_up_work_even_an_idle_one():
    # One core, first come first served: ranks 0..3 start up in turn (S each); the message
    # from 0 to 1 goes once both have, and the idle ranks 2 and 3 finish when theirs is done.
    s = 100.0
    topo = hosts(4, cores=1, start=s, wakeup=30.0)
    res = simulate(pingpong_plan(topo, 4, (0, 1), 4, 1), topo)
    one_way = 2 * 1.0 + 4 / BETA
    assert close(res.per_rank_finish_us[2], 30.0 + 3 * s) and close(res.per_rank_finish_us[3], 30.0 + 4 * s)
    assert close(res.per_rank_finish_us[0], 30.0 + 2 * s + 2 * one_way)
    assert close(res.predicted_us, 30.0 + 4 * s)
    assert res.cpu_us == (s, s, s, s)


def test_bytes_cost_both_ends_cpu_that_nothing_waits_for():
    kb = 3.0
    nbytes = 8192
    plain = hosts(2, cores=8, cpu=10.0, queue="fair")
    loaded = hosts(2, cores=8, cpu=10.0, kb=kb, queue="fair")
    plan = pingpong_plan(plain, 2, (0, 1), nbytes, 1)
    a, b = simulate(plan, plain), simulate(plan, loaded)
    # cores to spare: the byte work runs on other cores beside the message and delays nothing
    assert close(a.predicted_us, b.predicted_us)
    extra = 2 * nbytes / 1024 * kb  # two legs, each end pays
    assert close(sum(b.cpu_us) - sum(a.cpu_us), 2 * extra)
    assert close(sum(a.cpu_us), 4 * 10.0)


def test_byte_work_takes_its_share_of_a_shared_core():
    # One core, fair: a compute on rank 2 shares it with the byte work of a big message.
    topo = hosts(3, cores=1, kb=1.0, queue="fair")
    plan = fanin_plan(topo, 3, 0, [1], 1 << 20)
    alone = simulate(plan, dataclasses.replace(topo, cost=topo.cost.with_host(cpu_us_per_kb=0.0)))
    assert simulate(plan, topo).cpu_us[0] == pytest.approx(1024.0)
    assert simulate(plan, topo).predicted_us >= alone.predicted_us


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.floats(0.0, 80.0), st.floats(0.0, 40.0), st.floats(0.0, 5.0),
       st.sampled_from(["fair", "fifo"]))
def test_charged_cpu_is_the_sum_of_the_terms(cores, cpu, start, kb, queue):
    # The CPU charged does not depend on how the cores are shared: every message end, start-up
    # and KiB is paid exactly once.
    topo = hosts(4, cores=cores, cpu=cpu, start=start, kb=kb, queue=queue)
    nbytes = 4096
    res = simulate(pingpong_plan(topo, 4, (1, 2), nbytes, 2), topo)
    ends = 2 * 2 * 2  # two round trips, two legs each, two ends a leg
    want = 4 * start + ends * (cpu + nbytes / 1024 * kb)
    # one wake-up serves every message that arrives meanwhile: at most the ends' cpu_us
    assert sum(res.cpu_us) <= want + 1e-6
    assert sum(res.cpu_us) >= 4 * start + ends * nbytes / 1024 * kb + ends / 2 * cpu - 1e-6


def test_host_collectives_report_each_ranks_cpu():
    topo = hosts(4, cores=2, cpu=20.0, kb=1.0)
    t, cpu = gloo.collective(topo, "allreduce", 16384)
    assert t == gloo.allreduce_us(topo, 16384) and len(cpu) == 4 and min(cpu) > 0
    res = simulate(gloo.ring_allreduce_plan(topo, 16384), gloo._no_launch(topo), timeline=False)
    assert cpu == res.cpu_us
    assert gloo.collective(hosts(1, cores=1), "allgather", 64) == (0.0, (0.0,))


def test_cpu_terms_round_trip_yaml_and_reject_negatives():
    base = resolve("cpu:ranks=4,cores=2")
    topo = dataclasses.replace(base, cost=CostParams.from_flat(host_cores=2, cpu_us=40.0, cpu_scope="machine",
                                                     start_cpu_us=70.0, cpu_us_per_kb=2.5))
    text = dump_topology(topo)
    assert "start_cpu_us" in text and load_topology_text(text, "t.yaml").cost == topo.cost
    plain = dataclasses.replace(topo, cost=topo.cost.with_host(start_cpu_us=0.0, cpu_us_per_kb=0.0))
    assert topo.fingerprint != plain.fingerprint and "cpu_us_per_kb" not in dump_topology(plain)
    for bad in (dict(start_cpu_us=-1.0), dict(cpu_us_per_kb=-0.5)):
        with pytest.raises(TopologyError):
            CostParams.from_flat(**bad)


def test_host_fit_pins_cpu_terms_with_measured_cpu_time():
    topo, truth = loopback_hosts(cpu_us=40.0, wakeup_us=90.0, step_us=25.0, cpu_queue="fifo", attn_launch_us=300.0,
                                 attn_gbps=3.0, start_cpu_us=60.0, cpu_us_per_kb=2.0)
    lb = topo.links[0]
    cases = host_fit_cases(topo, truth, HEADS)
    params = FittedParams(classes=(ClassParams((("loopback", lb.bw_gbps),), 50.0, 2.5),), overhead_us=5.0,
                          attn_launch_us=50.0, attn_gbps=6.0)
    fitted, fit, _ = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0, cpu_queue="fifo")
    assert fit.rms_log_error < 0.05
    assert fitted.cost.host.cpu_us_per_kb == pytest.approx(2.0, rel=0.15)
    assert fitted.cost.host.start_cpu_us == pytest.approx(60.0, rel=0.3)
    assert fit.start_cpu_us == fitted.cost.host.start_cpu_us and fit.cpu_us_per_kb == fitted.cost.host.cpu_us_per_kb
    # without measured CPU times the two terms are not fitted
    _, blind, _ = fit_host_terms(topo, params, [c[:2] for c in cases], cores=2, start_wakeup_us=50.0,
                                 cpu_queue="fifo")
    assert blind.start_cpu_us == 0.0 and blind.cpu_us_per_kb == 0.0



@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_fit_tells_a_steps_cpu_from_a_messages_by_the_cpu_the_ranks_used(seed):
    # As the emulation measures it: a step of transfers costs its rank three times what a
    # message end does. With measurements 10 % off either way (as real ones are), times alone
    # fit about as well with a free step and dearer messages (a search from a free step
    # stayed there), which mispredicts plans that send several messages a step: multirail.
    topo, truth = loopback_hosts(cpu_us=40.0, wakeup_us=90.0, step_us=120.0, cpu_queue="fifo",
                                 attn_launch_us=300.0, attn_gbps=3.0, start_cpu_us=60.0, cpu_us_per_kb=2.0)
    lb = topo.links[0]
    plans = [compute_plan(topo, 4, HEADS, t) for t in (1024, 65536)]
    for batch in (2, 32):
        plans += [plan for _, plan in tree_plans(topo, 4, HEADS, batch, 48)]
    for n in (4, 2048, 1 << 17, 1 << 20):
        plans += [pingpong_plan(topo, 4, (0, 1), n, r) for r in (1, 4)]
        plans += [fanin_plan(topo, 4, 0, [1, 2, 3], n)]
    rng = random.Random(seed)
    cases = []
    for p in plans:
        res = simulate(p, truth, timeline=False)
        cases.append((p, res.predicted_us * rng.uniform(0.9, 1.1), sum(res.cpu_us) * rng.uniform(0.9, 1.1)))
    params = FittedParams(classes=(ClassParams((("loopback", lb.bw_gbps),), 50.0, 2.5),), overhead_us=5.0,
                          attn_launch_us=50.0, attn_gbps=6.0)
    fitted, fit, _ = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0, cpu_queue="fifo")
    assert fit.rms_log_error < 0.08
    assert fitted.cost.host.step_us == pytest.approx(120.0, rel=0.25)
