"""Calibration fits, route classes, calibration plans and applying fits to a topology (no torch)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_cost_helpers import bare_cpu
from treeattn.calibrate.apply_fit import ClassParams, FittedParams, apply_fit
from treeattn.calibrate.fit import fit_collective
from treeattn.calibrate.pingpong import PingPongPoint, fit_pingpong, overhead_from_sends
from treeattn.calibrate.plans import (
    concurrent_plan,
    fanin_plan,
    log_sizes,
    pingpong_plan,
    route_classes,
)
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError, ProbeError
from treeattn.plan.validate import check
from treeattn.topology.io import dump_topology, load_topology_text
from treeattn.topology.library import resolve

CPU4 = bare_cpu(4)
DGX2 = resolve("dgx-h100:nodes=2")


def synthetic(skew: float, alpha: float, beta: float, sizes=(4, 4096, 1 << 20, 1 << 24), trips=(1, 4),
              setup: float = math.inf):
    return [PingPongPoint(n, r, skew + n / (setup * 1e3) + 2 * r * (alpha + n / (beta * 1e3)),
                          setup_us=n / (setup * 1e3)) for n in sizes for r in trips]


# -- ping-pong fit -------------------------------------------------------------------------------


def test_fit_recovers_exact_parameters():
    f = fit_pingpong(synthetic(300.0, 45.0, 1.7, setup=6.0))
    assert f.skew_us == pytest.approx(300.0) and f.alpha_us == pytest.approx(45.0)
    assert f.beta_gbps == pytest.approx(1.7) and f.r2 == pytest.approx(1.0)
    assert max(abs(r) for r in f.residuals) < 1e-6
    n = 1 << 20
    assert f.predict_us(n, 4, n / 6e3) == pytest.approx(300 + n / 6e3 + 8 * (45 + n / 1.7e3))
    assert f.message_us(n) == pytest.approx(45 + n / 1.7e3)


@settings(max_examples=40, deadline=None)
@given(skew=st.floats(0, 5e3), alpha=st.floats(0.5, 500), beta=st.floats(0.05, 500),
       setup=st.one_of(st.just(math.inf), st.floats(0.5, 50)))
def test_fit_recovers_any_noiseless_parameters(skew, alpha, beta, setup):
    f = fit_pingpong(synthetic(skew, alpha, beta, setup=setup))
    assert f.alpha_us == pytest.approx(alpha, rel=1e-6, abs=1e-6)
    assert f.beta_gbps == pytest.approx(beta, rel=1e-6)
    assert f.skew_us == pytest.approx(skew, rel=1e-6, abs=1e-5)
    assert max(abs(r) / p.median_us for r, p in zip(f.residuals, synthetic(skew, alpha, beta, setup=setup),
                                                     strict=True)) < 1e-6


def test_one_round_trip_count_means_no_per_iteration_terms():
    f = fit_pingpong(synthetic(0.0, 20.0, 2.0, trips=(3,)))
    assert f.skew_us == 0.0 and f.alpha_us == pytest.approx(20.0)


def test_negative_parameters_are_pinned_at_zero():
    # Small messages measured faster than the line through the large ones: the free fit would
    # give a negative skew and alpha; both are physical and must stay >= 0.
    pts = [PingPongPoint(4, 1, 5.0), PingPongPoint(4, 4, 8.0), PingPongPoint(1 << 20, 1, 2000.0),
           PingPongPoint(1 << 20, 4, 8100.0)]
    f = fit_pingpong(pts)
    assert f.skew_us >= 0 and f.alpha_us >= 0 and f.beta_gbps > 0
    assert len(f.residuals) == 4


@pytest.mark.parametrize(
    ("points", "match"),
    [
        ([PingPongPoint(64, 1, 10.0), PingPongPoint(64, 4, 40.0)], "two distinct sizes"),
        ([PingPongPoint(4, 1, 10.0), PingPongPoint(64, 1, 0.0)], "not usable"),
        ([PingPongPoint(4, 1, 10.0), PingPongPoint(64, 1, math.nan)], "not usable"),
        ([PingPongPoint(4, 1, 50.0), PingPongPoint(1 << 20, 1, 10.0)], "does not grow with size"),
    ],
)
def test_fit_refuses_unusable_points(points, match):
    with pytest.raises(ProbeError, match=match):
        fit_pingpong(points)


def test_overhead_is_the_median_send_capped_at_alpha():
    assert overhead_from_sends([3.0, 5.0, 100.0], 40.0) == (5.0, [])
    o, notes = overhead_from_sends([80.0, 90.0], 40.0)
    assert o == 40.0 and "capped" in notes[0]
    o, notes = overhead_from_sends([], 40.0)
    assert o == 0.0 and "overhead taken as 0" in notes[0]


# -- sizes, classes, plans ------------------------------------------------------------------------


def test_log_sizes_are_powers_of_four_by_default_range():
    assert log_sizes(4, 64 << 20, 13) == tuple(4 * 4**k for k in range(13))
    assert log_sizes(4, 64 << 10, 3) == (4, 512, 65536)
    with pytest.raises(InputError):
        log_sizes(2, 64, 3)
    with pytest.raises(InputError):
        log_sizes(64, 4, 3)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("cpu:ranks=4", ["loopback"]),
        ("mi300x", ["xgmi"]),
        ("dgx-h100:nodes=2", ["nvlink>nvlink", "pcie>pcie>infiniband>infiniband>pcie>pcie",
                              "pcie>pcie>infiniband>infiniband>infiniband>infiniband>pcie>pcie"]),
        ("rtx4090", ["pcie>pcie>pcie>pcie", "pcie>pcie>upi>pcie>pcie"]),
    ],
)
def test_route_classes_partition_the_pairs(spec, names):
    topo = resolve(spec)
    classes = route_classes(topo)
    assert [c.name for c in classes] == names
    pairs = [p for c in classes for p in c.pairs]
    p = topo.num_ranks
    assert sorted(pairs) == [(a, b) for a in range(p) for b in range(a + 1, p)]
    for c in classes:
        for a, b in c.pairs:
            assert tuple((ln.kind.value, ln.bw_gbps) for ln in topo.route_links(a, b)) == c.hops
        assert c.pair == c.pairs[0] and c.bottleneck_gbps == min(bw for _, bw in c.hops)


def test_calibration_plans_are_valid():
    check(pingpong_plan(CPU4, 4, (0, 1), 4096, 3))
    check(concurrent_plan(CPU4, 4, [(0, 1), (2, 3)], 4096, 2))
    check(fanin_plan(CPU4, 4, 0, [1, 2, 3], 4096))
    with pytest.raises(InputError):
        concurrent_plan(CPU4, 4, [(0, 1), (1, 2)], 64, 1)
    with pytest.raises(InputError):
        fanin_plan(CPU4, 4, 0, [0, 1], 64)


def test_simulated_pingpong_is_the_message_model():
    topo = CPU4
    ln = topo.links[0]
    # Each message lands by RECV_COPY: the receiver copies it into its accumulator (read + write).
    copy = topo.cost.launch_us + 2 * 65536 / (topo.devices[0].mem_bw_gbps * topo.cost.mem_efficiency * 1e3)
    one = topo.cost.overhead_us + ln.latency_us + 65536 / (ln.bw_gbps * 1e3) + copy
    assert simulate(pingpong_plan(topo, 4, (0, 1), 65536, 3), topo).predicted_us == pytest.approx(6 * one)
    # Two pairs at once share the one loopback link: each message drains at half the rate.
    two = topo.cost.overhead_us + ln.latency_us + 2 * 65536 / (ln.bw_gbps * 1e3) + copy
    assert simulate(concurrent_plan(topo, 4, [(0, 1), (2, 3)], 65536, 3), topo).predicted_us == pytest.approx(6 * two)


# -- applying fits ----------------------------------------------------------------------------------


def test_apply_on_loopback():
    fit = FittedParams((ClassParams((("loopback", 2.0),), 120.0, 1.25),), overhead_us=45.0, launch_us=8.0,
                       mem_eff_bw_gbps=5.0, source="test")
    new, warnings = apply_fit(CPU4, fit)
    assert warnings == []
    ln = new.links[0]
    # alpha less the copy's launch and the overhead; the wire rate that with the receiver's
    # copy (2 bytes moved a byte at 5 GB/s) gives 1.25 GB/s: 1 / (1/1.25 - 2/5).
    assert (ln.latency_us, ln.bw_gbps) == (67.0, pytest.approx(2.5))
    assert (new.cost.overhead_us, new.cost.launch_us, new.cost.mem_efficiency) == (45.0, 8.0, 0.25)
    assert new.sources[-1] == "test" and new.name == "cpu-ranks4-cores2-calibrated" and new.ranks == CPU4.ranks
    back = load_topology_text(dump_topology(new))
    assert back.fingerprint == new.fingerprint


def test_apply_reproduces_each_class_on_a_cluster():
    classes = route_classes(DGX2)
    fits = {classes[0].hops: (12.0, 300.0), classes[1].hops: (26.0, 40.0)}
    fit = FittedParams(tuple(ClassParams(h, a, b) for h, (a, b) in fits.items()), overhead_us=3.0)
    new, warnings = apply_fit(DGX2, fit)
    assert warnings == []
    copy_gbps = new.rank_device(0).mem_bw_gbps * new.cost.mem_efficiency
    for cls in classes[:2]:
        alpha, beta = fits[cls.hops]
        for a, b in cls.pairs[:3] + cls.pairs[-2:]:
            # What is left of alpha and beta once the receiver's copy is taken out.
            assert new.cost.overhead_us + new.route_latency_us(a, b) == pytest.approx(alpha - new.cost.launch_us)
            assert 1 / new.route_bw_gbps(a, b) == pytest.approx(1 / beta - 2 / copy_gbps)
            plan = pingpong_plan(new, new.num_ranks, (a, b), 1 << 20, 2)
            assert simulate(plan, new).predicted_us == pytest.approx(4 * (alpha + (1 << 20) / (beta * 1e3)))


def test_apply_warns_when_a_longer_class_disagrees_with_shorter_ones():
    c = route_classes(DGX2)
    fit = FittedParams((ClassParams(c[1].hops, 20.0, 40.0), ClassParams(c[2].hops, 90.0, 10.0)), overhead_us=2.0)
    new, warnings = apply_fit(DGX2, fit)
    assert any("latency sum" in w for w in warnings) and any("bottleneck" in w for w in warnings)
    a, b = c[1].pair
    copy_gbps = new.rank_device(0).mem_bw_gbps * new.cost.mem_efficiency
    assert 1 / new.route_bw_gbps(a, b) == pytest.approx(1 / 40.0 - 2 / copy_gbps)  # the shorter class wins


def test_apply_clamps_negative_latency_and_raises_memory_bandwidth():
    fit = FittedParams((ClassParams((("loopback", 2.0),), 10.0, 1.0),), overhead_us=30.0, mem_eff_bw_gbps=80.0)
    new, warnings = apply_fit(CPU4, fit)
    assert new.links[0].latency_us == 0.0 and new.cost.mem_efficiency == 1.0
    assert new.device("host0").mem_bw_gbps == 80.0
    assert len(warnings) == 2


def test_apply_refuses_a_class_the_topology_lacks():
    with pytest.raises(InputError, match="has no nvlink link"):
        apply_fit(CPU4, FittedParams((ClassParams((("nvlink", 450.0),), 5.0, 300.0),)))
    with pytest.raises(InputError):
        ClassParams((("loopback", 2.0),), 5.0, 0.0)


def test_latency_is_measured_only_where_the_sizes_reach_it():
    # An 8-rank all-reduce of 20 us and 100 GB/s of algbw: the half-bandwidth size is 2 MB.
    sizes = [2.0**k for k in range(3, 33)]
    line = [20.0 + s / 100e3 for s in sizes]
    assert fit_collective(sizes, line, "all_reduce", 8).latency_measured
    past = [(s, t) for s, t in zip(sizes, line, strict=True) if s > 4e6]
    late = fit_collective([s for s, _ in past], [t for _, t in past], "all_reduce", 8)
    assert not late.latency_measured and "extrapolated" in late.warnings[0]
    negative = fit_collective(sizes[20:], [s / 100e3 - 40.0 for s in sizes[20:]], "all_reduce", 8)
    assert not negative.latency_measured and "negative latency" in negative.warnings[0]


def test_host_ranks_keep_no_ratings():
    # Ratings are what NCCL's model reads; gloo on CPU ranks reads the measured rates alone.
    t = resolve("cpu:ranks=2")
    new, _ = apply_fit(t, FittedParams((ClassParams((("loopback", 10.4),), 50.0, 1.5),)))
    assert new.links[0].bw_gbps != t.links[0].bw_gbps and new.links[0].rated_gbps is None
