"""Max-min fair sharing (``treeattn.cost.sharing``) against closed forms and its defining property."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from treeattn.cost.sharing import component, fair_rates


def rates(routes: list[tuple[int, ...]], cap: list[float], limit: list[float] | None = None) -> dict[int, float]:
    link_flows: list[set | None] = [set() for _ in cap]
    for x, route in enumerate(routes):
        for i in route:
            link_flows[i].add(x)
    limit = limit or [min(cap[i] for i in r) for r in routes]
    flows, cnt = component(range(len(cap)), link_flows, routes)
    return fair_rates(flows, cnt, link_flows, routes, cap, limit)


def test_closed_forms():
    assert rates([(0,), (0,)], [10.0]) == {0: 5.0, 1: 5.0}
    # link 1 (cap 4) saturates first: flows 0 and 2 get 2; flow 1 gets what link 0 has left
    assert rates([(0, 1), (0,), (1,)], [10.0, 4.0]) == {0: 2.0, 1: 8.0, 2: 2.0}
    # a flow's own limit (a CPU core, a flow cap) enters as a link of its own
    assert rates([(0,), (0,)], [10.0], limit=[1.0, 10.0]) == {0: 1.0, 1: 9.0}
    # alone on its links, a flow runs at its own limit
    assert rates([(0,), (1,)], [3.0, 7.0]) == {0: 3.0, 1: 7.0}


def test_component_follows_shared_links_only():
    routes = [(0, 1), (1,), (2,), (2, 3)]
    link_flows = [{0}, {0, 1}, {2, 3}, {3}]
    flows, cnt = component([0], link_flows, routes)
    assert sorted(flows) == [0, 1] and cnt == {1: 2}
    flows, _ = component([3], link_flows, routes)
    assert sorted(flows) == [2, 3]
    assert component([], link_flows, routes) == ([], {})


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True), min_size=1, max_size=8),
       st.lists(st.floats(0.5, 100.0), min_size=5, max_size=5))
def test_rates_are_feasible_and_max_min_fair(routes, cap):
    routes = [tuple(r) for r in routes]
    got = rates(routes, cap)
    assert set(got) == set(range(len(routes)))
    used = [0.0] * len(cap)
    for x, route in enumerate(routes):
        for i in route:
            used[i] += got[x]
    assert all(u <= c * (1 + 1e-9) for u, c in zip(used, cap, strict=True))
    # every flow has a bottleneck: a saturated link on its route where no flow gets more than it
    for x, route in enumerate(routes):
        assert any(math.isclose(used[i], cap[i], rel_tol=1e-9)
                   and all(got[y] <= got[x] * (1 + 1e-9) for y, r in enumerate(routes) if i in r)
                   for i in route), (x, got)


def test_shared_routes_keep_the_narrowest_link_of_each_class() -> None:
    from treeattn.cost.sharing import shared_routes
    from treeattn.topology.library import resolve

    topo = resolve("dgx-h100-2node")
    p = topo.num_ranks
    keys = [0 * p + 8, 1 * p + 9]  # two node-crossing pairs with routes of their own
    cap = [float(10 + i) for i in range(len(topo.links))]
    lat = [1.0] * len(topo.links)
    flow_cap = [float(100 + i) for i in range(len(topo.links))]
    got = shared_routes(topo, keys, cap, lat, flow_cap)
    for key in keys:
        full = topo.route(key // p, key % p)
        kept, latency, narrowest = got[key]
        assert latency == len(full)  # every hop's latency, kept link or not
        assert narrowest == min(flow_cap[i] for i in full)
        assert set(kept) <= set(full) and kept
        # a link is dropped only for a narrower one crossed by exactly the same routes
        users = {i: tuple(k for k in keys if i in topo.route(k // p, k % p)) for i in full}
        for i in full:
            if i not in kept:
                assert any(users[j] == users[i] and cap[j] <= cap[i] for j in kept)
