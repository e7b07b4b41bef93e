"""``fair_rates`` takes the flows' own limits in sorted order beside a heap of the links; the
one heap of links and flows it replaced is kept here, and the two must give the same rates,
bit for bit (ties included: a link before a flow of equal key)."""

from __future__ import annotations

import heapq
import random

import pytest

from treeattn.cost.sharing import component, fair_rates


def _one_heap(flows, cnt, link_flows, routes, cap, limit) -> dict[int, float]:
    new_rate: dict[int, float] = {}
    if not cnt:
        return {x: limit[x] for x in flows}
    left = {i: cap[i] for i in cnt}
    heap = [(left[i] / c, 0, i) for i, c in cnt.items()]
    heap.extend((limit[x], 1, x) for x in flows)
    heapq.heapify(heap)
    floor = 0.0
    while heap:
        share, is_flow, i = heapq.heappop(heap)
        if is_flow:
            if i in new_rate:
                continue
            fixed, skip = (i,), -1
        else:
            c = cnt[i]
            if c == 0:
                continue
            cur = left[i] / c
            if cur != share:
                heapq.heappush(heap, (cur, 0, i))
                continue
            fixed, skip = link_flows[i], i
            cnt[i] = 0
        share = floor = share if share > floor else floor
        for x in fixed:
            if x in new_rate:
                continue
            new_rate[x] = share
            for j in routes[x]:
                cj = cnt.get(j)
                if cj is None or j == skip:
                    continue
                cnt[j] = cj - 1
                lj = left[j] - share
                left[j] = lj if lj > 0.0 else 0.0
    return new_rate


@pytest.mark.parametrize("seed", range(300))
def test_sorted_flows_beside_a_link_heap_rate_as_one_heap(seed):
    rng = random.Random(seed)
    links = rng.randint(1, 12)
    # few distinct capacities and limits, so that keys tie often
    caps = [rng.choice([1.0, 2.0, 3.0, 10.0, 0.1 * rng.randint(1, 50)]) for _ in range(links)]
    nflows = rng.randint(1, 40)
    routes = [tuple(rng.sample(range(links), rng.randint(0, min(4, links)))) for _ in range(nflows)]
    limit = [rng.choice([0.5, 1.0, 2.0, 1 / 3, float("inf"), rng.random() * 5]) for _ in range(nflows)]
    link_flows: list[set | None] = [None] * links
    for x, route in enumerate(routes):
        for i in route:
            if link_flows[i] is None:
                link_flows[i] = set()
            link_flows[i].add(x)
    changed = rng.sample(range(links), rng.randint(1, links))
    flows, cnt = component(changed, link_flows, routes)
    want = _one_heap(flows, dict(cnt), link_flows, routes, caps, limit)
    got = fair_rates(flows, dict(cnt), link_flows, routes, caps, limit)
    assert got == want
    assert [got[x] for x in flows] == [want[x] for x in flows]
