"""Host ranks inside plans: the interpreter's per-step CPU (``step_us``), first-come cores
under a real-time policy (``cpu_queue: fifo``), the library collectives' own per-message CPU
(``coll_cpu_us``), and calibration's plan-like cases that fit them."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_cost_helpers import loopback_hosts, switch_topo
from treeattn.calibrate.apply_fit import ClassParams, FittedParams
from treeattn.calibrate.fit_host import fit_host_terms
from treeattn.calibrate.plans import (
    TREE_SHAPES,
    allreduce_plan,
    compute_plan,
    concurrent_plan,
    fanin_plan,
    pingpong_plan,
    tree_plans,
)
from treeattn.cost import gloo
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError, TopologyError
from treeattn.plan.ir import OpKind
from treeattn.plan.validate import validate
from treeattn.topology.io import dump_topology, load_topology_text
from treeattn.topology.library import resolve
from treeattn.topology.model import CostParams

BETA = 10.0e3  # bytes per microsecond on switch_topo's links
HEADS = (8, 1, 32)


def hosts(p: int, *, cores: int, cpu: float = 0.0, step: float = 0.0, queue: str = "fair",
          coll: float | None = None, attn_launch: float | None = None, attn_gbps: float | None = None):
    topo = switch_topo(p, bw=10.0, lat=1.0, overhead=2.0)
    cost = CostParams.from_flat(overhead_us=2.0, launch_us=0.0, mem_efficiency=1.0, host_cores=cores, cpu_us=cpu,
                      cpu_scope="machine", step_us=step, cpu_queue=queue, coll_cpu_us=coll,
                      attn_launch_us=attn_launch, attn_gbps=attn_gbps)
    return dataclasses.replace(topo, cost=cost)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("trips", [1, 3])
def test_every_step_of_transfers_costs_its_rank_step_us_before_its_messages_go(trips):
    # Each one-way leg is a step on the sender and one on the receiver; both pay step_us
    # before posting, so a leg costs it once on the path.
    topo = hosts(2, cores=2, cpu=7.0, step=11.0)
    res = simulate(pingpong_plan(topo, 2, (0, 1), 4, trips), topo)
    one_way = 11.0 + 2 * 1.0 + 4 / BETA + 7.0
    assert close(res.predicted_us, 2 * trips * one_way)


def test_step_us_is_not_paid_by_compute_or_without_host_cores():
    topo = hosts(4, cores=4, step=50.0, attn_launch=20.0, attn_gbps=1.0)
    plan = compute_plan(topo, 4, HEADS, 64)
    assert close(simulate(plan, topo).predicted_us,
                 simulate(plan, dataclasses.replace(topo, cost=topo.cost.with_host(step_us=0.0)))
                 .predicted_us)
    free = hosts(2, cores=0, step=50.0)
    assert simulate(pingpong_plan(free, 2, (0, 1), 4, 1), free).predicted_us < 50.0


def test_fifo_cores_run_work_to_its_end_in_arrival_order():
    # Four ranks compute 100 us each on two cores: shared fairly, all end at 200 us; first
    # come first served, two end at 100 and two at 200. The last ends at 200 either way.
    def ends(queue: str) -> list[float]:
        topo = hosts(4, cores=2, queue=queue, attn_launch=100.0, attn_gbps=1e9)
        res = simulate(compute_plan(topo, 4, HEADS, 1), topo)
        return sorted(t.end_us for t in res.timeline)

    fair, fifo = ends("fair"), ends("fifo")
    assert fair == pytest.approx([200.0] * 4, rel=1e-6)
    assert fifo == pytest.approx([100.0, 100.0, 200.0, 200.0], rel=1e-6)


def test_fifo_makes_a_message_wait_for_a_busy_core():
    # Ranks 2 and 3 compute 1 ms on two cores while 0 sends to 1: under fifo the message's
    # CPU work waits for a core; shared fairly it only slows down.
    def ping(queue: str) -> float:
        topo = hosts(4, cores=2, cpu=10.0, queue=queue, attn_launch=1000.0, attn_gbps=1e9)
        progs = list(pingpong_plan(topo, 4, (0, 1), 4, 1).programs)
        busy = compute_plan(topo, 4, HEADS, 1).programs
        from treeattn.plan.ir import Plan

        base = compute_plan(topo, 4, HEADS, 1)
        # Ranks 0 and 1 start their ping-pong one step after the others begin to compute.
        shifted = [tuple(dataclasses.replace(op, step=op.step + 1) for op in prog) for prog in progs[:2]]
        plan = Plan(algorithm="mix", params={}, workload=base.workload, topology=base.topology, chunks=1,
                    programs=(*shifted, busy[2], busy[3]), result_ranks=(2,), contributors=(2,))
        res = simulate(plan, topo)
        return max(t.end_us for t in res.timeline if t.rank in (0, 1))

    assert ping("fifo") > 1000.0 > ping("fair")


@settings(max_examples=25, deadline=None)
@given(cpu=st.floats(0.0, 40.0), step=st.floats(0.0, 40.0), nbytes=st.sampled_from([4, 4000, 400_000]))
def test_fifo_with_a_core_per_rank_is_fair_sharing(cpu, step, nbytes):
    fair = hosts(4, cores=4, cpu=cpu, step=step)
    fifo = hosts(4, cores=4, cpu=cpu, step=step, queue="fifo")
    for plan in (concurrent_plan(fair, 4, [(0, 1), (2, 3)], nbytes, 2), fanin_plan(fair, 4, 0, [1, 2, 3], nbytes)):
        assert simulate(plan, fifo).predicted_us == pytest.approx(simulate(plan, fair).predicted_us, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(cores=st.integers(1, 3), cpu=st.floats(0.0, 40.0), step=st.floats(0.0, 40.0))
def test_host_step_terms_only_ever_add_time_with_fair_cores(cores, cpu, step):
    # Only with fair sharing: first-come cores are a list schedule, where more work can finish
    # sooner by changing the order work queues in (hypothesis found cpu 1, step 0.5 on 2 cores:
    # a 3-sender fan-in 3.9 us with the step cost, 4.2 without).
    bare = hosts(4, cores=cores, cpu=cpu)
    more = hosts(4, cores=cores, cpu=cpu, step=step)
    for plan in (fanin_plan(bare, 4, 0, [1, 2, 3], 4000), concurrent_plan(bare, 4, [(0, 1), (2, 3)], 40, 2)):
        assert simulate(plan, more).predicted_us >= simulate(plan, bare).predicted_us - 1e-9


def test_library_collectives_pay_coll_cpu_us_per_message_end():
    plain = hosts(4, cores=2, cpu=50.0)
    cheap = hosts(4, cores=2, cpu=50.0, coll=5.0)
    same = hosts(4, cores=2, cpu=50.0, coll=50.0)
    assert gloo.allreduce_us(cheap, 64) < gloo.allreduce_us(plain, 64)
    assert gloo.allreduce_us(same, 64) == pytest.approx(gloo.allreduce_us(plain, 64))
    plan = allreduce_plan(plain, 4, 64)
    assert simulate(plan, cheap).predicted_us < simulate(plan, plain).predicted_us


def test_new_cost_terms_round_trip_yaml_and_change_the_fingerprint():
    base = resolve("cpu:ranks=4,cores=2")
    topo = dataclasses.replace(base, cost=CostParams.from_flat(host_cores=2, cpu_us=40.0, cpu_scope="machine",
                                                     step_us=12.0, cpu_queue="fifo", coll_cpu_us=9.0))
    back = load_topology_text(dump_topology(topo), "t.yaml")
    assert back.cost == topo.cost
    plain = dataclasses.replace(topo, cost=topo.cost.with_host(step_us=0.0, cpu_queue="fair", coll_cpu_us=None))
    assert len({topo.fingerprint, plain.fingerprint}) == 2
    assert "step_us" not in dump_topology(plain) and "cpu_queue" not in dump_topology(plain)


@pytest.mark.parametrize("bad", [dict(step_us=-1.0), dict(cpu_queue="lifo"), dict(coll_cpu_us=-3.0)])
def test_bad_step_terms_are_rejected(bad):
    with pytest.raises(TopologyError):
        CostParams.from_flat(**bad)


def test_tree_cases_are_valid_attention_plans_rooted_at_the_last_rank():
    topo = resolve("cpu:ranks=4,cores=2")
    plans = tree_plans(topo, 4, HEADS, 2, 48)
    assert [shape for shape, _ in plans] == list(TREE_SHAPES)
    for _, plan in plans:
        assert not validate(plan).violations
        assert plan.params["order"][0] == 3 and plan.result_ranks == (0, 1, 2, 3)
        assert any(op.kind is OpKind.RECV_MERGE for prog in plan.programs for op in prog)
    assert not validate(allreduce_plan(topo, 4, 64)).violations
    with pytest.raises(InputError):
        tree_plans(topo, 1, HEADS, 2, 48)
    with pytest.raises(InputError):
        allreduce_plan(topo, 1, 64)


def test_host_fit_recovers_step_and_collective_terms_from_plan_like_cases():
    topo, truth = loopback_hosts(cpu_us=40.0, wakeup_us=90.0, step_us=25.0, cpu_queue="fifo", attn_launch_us=300.0,
                                 attn_gbps=3.0, coll_cpu_us=15.0)
    lb = topo.links[0]
    plans = [compute_plan(topo, 4, HEADS, t) for t in (1024, 65536)]
    for batch in (2, 32):
        plans += [plan for _, plan in tree_plans(topo, 4, HEADS, batch, 48)]
    plans += [allreduce_plan(topo, 4, n) for n in (64, 16384)]
    for n in (4, 1 << 20):
        plans += [pingpong_plan(topo, 4, (0, 1), n, r) for r in (1, 4)]
        plans += [fanin_plan(topo, 4, 0, [1, 2, 3], n)]
    cases = [(p, simulate(p, truth, timeline=False).predicted_us) for p in plans]
    # Timed alone the attention kernel looked faster (a sixth of its fixed cost, twice its speed).
    params = FittedParams(classes=(ClassParams((("loopback", lb.bw_gbps),), 50.0, 2.5),), overhead_us=5.0,
                          attn_launch_us=50.0, attn_gbps=6.0)
    fitted, fit, _ = fit_host_terms(topo, params, cases, cores=2, start_wakeup_us=50.0, cpu_queue="fifo")
    assert fit.rms_log_error < 0.03
    assert fit.cpu_queue == "fifo" and fitted.cost.host.cpu_queue == "fifo"
    assert fitted.cost.host.step_us == pytest.approx(25.0, abs=8.0)
    assert fitted.cost.host.coll_cpu_us == pytest.approx(15.0, abs=6.0)
    assert fitted.cost.attn_launch_us == pytest.approx(300.0, rel=0.1)
    # A rank's later kernels of a run keep the cost timed alone (ring attention's).
    assert fitted.cost.attn_next_launch_us == 50.0
