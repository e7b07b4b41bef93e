"""Max-min fair sharing of links among flows (progressive filling), as pure functions.

Words: a *flow* is an index with a route (the links it crosses) and its own limit (its
narrowest link or flow cap, or a CPU core: capacity in bytes or work per microsecond); a
*link* is an index with a capacity. ``link_flows[i]`` is the set of flows on link i now.
The simulator (``treeattn.cost.simulate``) calls ``component`` for the links whose flows
changed, then ``fair_rates`` for the flows it found, whenever flows start or finish.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from treeattn.topology.model import Topology

__all__ = ["component", "fair_rates", "shared_routes"]


def component(changed: Iterable[int], link_flows: Sequence[set | None],
              routes: Sequence[tuple[int, ...]]) -> tuple[list[int], dict[int, int]]:
    """The flows whose rates may change when the flows on links ``changed`` changed.

    They are the flows reachable from those links through links that carry more than one
    flow (a link with one flow couples nothing: it only caps that flow).

    Args:
        changed: links whose set of flows changed.
        link_flows: per link, the flows on it now (None or empty: none).
        routes: per flow, its links.

    Returns:
        (the flows, in the order found; per shared link among their routes, its flow count).
    """
    # ``inc[j]``: link j is in ``cnt`` (a list: cheaper to test than the dict).
    inc = [False] * len(link_flows)
    flows: list[int] = []
    seen: set[int] = set()
    cnt: dict[int, int] = {}
    stack: list[int] = []
    for i in changed:
        on = link_flows[i]
        if not on:
            continue
        if len(on) > 1:
            if not inc[i]:
                inc[i] = True
                cnt[i] = len(on)
                stack.append(i)
            continue
        for x in on:
            if x not in seen:
                seen.add(x)
                flows.append(x)
                for j in routes[x]:
                    if not inc[j]:
                        n = len(link_flows[j])
                        if n > 1:
                            inc[j] = True
                            cnt[j] = n
                            stack.append(j)
    add, append, push, pop = seen.add, flows.append, stack.append, stack.pop
    # Once every link that carries more than one flow is found, the flows' routes can add
    # none: the rest only gathers the flows of the links still stacked, in the same order.
    # (Those links are counted when the search has run long enough to pay for it.)
    shared = -1
    count_after = 2 * len(link_flows)
    while stack:
        if len(flows) > count_after:
            if shared < 0:
                shared = sum(1 for s in link_flows if s and len(s) > 1)
            if len(cnt) == shared:
                break
        for x in link_flows[pop()]:
            if x not in seen:
                add(x)
                append(x)
                for j in routes[x]:
                    if not inc[j]:
                        n = len(link_flows[j])
                        if n > 1:
                            inc[j] = True
                            cnt[j] = n
                            push(j)
    while stack:
        found = [x for x in link_flows[pop()] if x not in seen]
        seen.update(found)
        flows += found
    return flows, cnt


def fair_rates(flows: Sequence[int], cnt: dict[int, int], link_flows: Sequence[set | None],
               routes: Sequence[tuple[int, ...]], cap: Sequence[float], limit: Sequence[float]) -> dict[int, float]:
    """Max-min fair rates of ``flows`` by progressive filling.

    The link with the smallest fair share saturates first and fixes the rate of its unfixed
    flows; the shares of the other links can only grow. A flow's own ``limit`` (no link of
    its route is narrower) enters as a link of its own.

    Args:
        flows: the flows to rate (``component``).
        cnt: per shared link, its flow count (``component``; left as it is).
        link_flows: per link, its flows. routes: per flow, its links.
        cap: per link, its capacity. limit: per flow, its own limit.

    Returns:
        Per flow, its rate.
    """
    new_rate: dict[int, float] = {}
    if not cnt:
        for x in flows:
            new_rate[x] = limit[x]
        return new_rate
    # Per link, indexed by link (lists: cheaper than dicts): its unfixed flows (None: not a
    # shared link of the component) and its capacity left.
    cl: list[int | None] = [None] * len(link_flows)
    left = [0.0] * len(link_flows)
    heap = []
    for i, c in cnt.items():
        cl[i] = c
        v = left[i] = cap[i]
        heap.append((v / c, 0, i))
    heapq.heapify(heap)
    # A flow's own limit never changes, so the flows wait beside the links' heap in order of
    # limit, taken when theirs is the smallest key: the order one heap of (share, 0, link) and
    # (limit, 1, flow) keys pops them in (a link before a flow of equal key), at a fraction
    # of the heap operations (``tests/unit/test_cost_sharing_fast.py`` holds that heap).
    # The flows of one limit are taken together: nothing changes the links' heap between
    # them, and each takes the same share off its links (equal subtractions, in whatever
    # order, leave the same result).
    lims = sorted(set(map(limit.__getitem__, flows)))
    k, nk = 0, len(lims)
    n = len(flows)
    pop, push = heapq.heappop, heapq.heappush
    floor = 0.0
    while len(new_rate) < n:  # once every flow has its rate, the rest changes none
        if k < nk and (not heap or lims[k] < heap[0][0]):
            share = lims[k]
            k += 1
            fixed: Iterable[int] = [x for x in flows if limit[x] == share and x not in new_rate]
            if not fixed:
                continue
            i = -1
        else:
            share, _, i = pop(heap)
            c = cl[i]
            if c == 0:
                continue
            cur = left[i] / c
            if cur != share:
                # Keys are lazy: a link's share only grows as flows leave it, so an old key is
                # too small; put it back with its current share.
                push(heap, (cur, 0, i))
                continue
            fixed = link_flows[i]
            cl[i] = None  # while its flows are fixed: not one of the links they leave
        # Shares never decrease in exact arithmetic; keep rounding from making one smaller.
        share = floor = share if share > floor else floor
        for x in fixed:
            if x in new_rate:
                continue
            new_rate[x] = share
            for j in routes[x]:
                cj = cl[j]
                if cj is None:
                    continue
                cl[j] = cj - 1
                lj = left[j] - share
                left[j] = lj if lj > 0.0 else 0.0
        if i >= 0:
            cl[i] = 0
    return new_rate


def shared_routes(topo: Topology, keys: Sequence[int], cap: Sequence[float], lat: Sequence[float],
                  flow_cap: Sequence[float], pair_cap: Callable[[int, int], float] | None = None,
                  route: Callable[[int, int], tuple[int, ...]] | None = None,
                  ) -> dict[int, tuple[tuple[int, ...], float, float]]:
    """Per rank pair a plan sends over (key ``src * p + dst``, ``p`` the topology's ranks):
    the route cut down for sharing, its latency, and its narrowest flow capacity.

    Links crossed by exactly the same set of the given routes always carry the same flows,
    so for fair sharing one of them stands for all: the narrowest (by ``cap``). Routes keep
    one link per such class (latency still sums every hop), which makes the flow
    bookkeeping about half as long on fabrics where a GPU's PCIe, NIC and leaf links line up.

    Args:
        topo: the topology (its routes).
        keys: the rank pairs, as ``src * p + dst``.
        cap, lat, flow_cap: per link, its shared capacity, latency and per-flow cap.
        pair_cap: per rank pair (src, dst), a per-flow cap of the pair's own, in flow_cap's
            unit (a transport the pair's ranks run on, whatever links it crosses).
        route: per rank pair (src, dst), the links it crosses, where they are not
            ``topo.route``'s (NCCL's PXN, ``nccl_p2p.router``).
    """
    p = topo.num_ranks
    full: list[tuple[int, ...]] = []
    users: dict[int, list[int]] = {}
    for idx, key in enumerate(keys):
        links = (route or topo.route)(key // p, key % p)
        full.append(links)
        for i in links:
            users.setdefault(i, []).append(idx)
    best: dict[tuple[int, ...], int] = {}
    for i, us in users.items():
        sig = tuple(us)
        j = best.get(sig)
        if j is None or cap[i] < cap[j]:
            best[sig] = i
    keep = set(best.values())
    return {key: (tuple(i for i in links if i in keep), sum(lat[i] for i in links),
                  min(min((flow_cap[i] for i in links), default=0.0),
                      math.inf if pair_cap is None else pair_cap(key // p, key % p)))
            for key, links in zip(keys, full, strict=True)}
