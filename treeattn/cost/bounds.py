"""Lower bounds on the time of any plan for a payload on a topology (docs/design.md section 5).

Every figure here is a true lower bound under the simulator's own model
(``treeattn.cost.simulate``): a message costs at least one ``overhead_us`` (its sender's; on
GPUs, the later of its two sides' peer groups), taken as 0 where host ranks pay CPU work
instead (``Topology.floor_overhead_us``), then its bytes drain at
its max-min fair share of every link it crosses, then its route latency; flows
never exceed a link's capacity; a COMPUTE is a step of its own; a contribution exists
only after the COMPUTE over its KV block (attention) or from the start (raw payloads).

The argument, per *cut* (a set of links every needed byte must cross):

* Ingress of a result rank R: R must end holding every other contributor's data, in every
  row. Each row of contribution j reaches R either in a message carrying that row of a
  partial (all rows of j: ``payload_bytes`` P over all messages) or as j's KV block (then
  R computes it). So the bytes entering R's device are at least ``min(P, sum of the other
  contributors' KV bytes)`` (P for raw payloads), and they cross the links into R's
  device, whose capacities add up to ``B_in(R)``.
* Egress of a contributor j (when some result rank is not j): ``min(P, kv_j)`` bytes
  leave j's device through its outgoing links.
* Into a node n holding a result rank, from the contributors outside n; out of a node n
  holding contributors, when a result rank lies outside n: the same byte counts over the
  capacity of the links crossing the node's boundary.
* The same into and out of the nodes behind one switch that every link leaving them reaches
  (a fat tree's leaf holding whole nodes), over the switch's other links: its uplinks,
  fewer than its nodes' NICs where the tree is oversubscribed.

Those bytes start draining no earlier than ``overhead_us`` after the first of them is sent,
drain at no more than the cut's capacity, and the last of them then pays at least the
smallest latency of a link in the cut. A partial is sent only after a COMPUTE (at least
``first_compute_us``, the fastest any block computes); a KV block that crosses instead
must be computed after it arrives. Hence for every cut

    T >= first_compute_us + overhead_us + min_cut_latency_us + bytes / capacity  (bandwidth_us)

Depth (``latency_us``). docs/design.md asks for the depth of a reduction over p ranks, but
``ceil(log2 p)`` message latencies is *not* a lower bound here: a rank may receive from
many peers in one step and pays only its ingress bandwidth for it, so a star reduce of a
tiny payload takes one message latency. What does hold, for any one row: let
alpha = overhead + the smallest route latency between ranks (a direct link, or the
smallest latency out of a rank's device plus the smallest into one), g = row_bytes over the
largest ingress capacity of any rank (a message carrying the row moves at least that),
c = ``first_compute_us``, mu = the cheapest merge phase of one row (a launch plus its
memory time on the fastest device), and F(n) the earliest a rank can hold n contributions
of that row. A rank holding n got k of them by local COMPUTEs (one step each: k c) and
the rest from f messages merged at the end of a step; the largest message brings
ceil((n-k)/f), sent by a rank that held them, and all f messages squeeze through its
ingress after the first partial existed:

    F(1) = c,  F(n) = min( n c,  min over k < n of max(k c, H(n-k)) )
    H(m) = min over f of max( F(ceil(m/f)) + alpha + g + mu,  c + alpha + f g + mu )

(raw payloads: c = 0 and only the rank's own buffer is local). ``latency_us`` is
F(contributors) - c. It is computed by dynamic programming over n, O(p log p).

Spreading (``spread_us``). Where every rank must end holding every contribution (an
all-reduce, or each rank its own heads: each rank's rows of contribution j must reach it),
each contribution's data must reach every rank, and each message informs one rank. A rank
issues one message per overhead o (LogP's gap) and a message arrives o + lambda after its
issue began (lambda the smallest route latency), so a contribution held by one rank at time
0 reaches n ranks no earlier than S(n), the greedy LogP broadcast: a rank informed at t
informs others at t + k o + lambda, k = 1, 2, ... (the optimal broadcast under these rules
is the greedy one). With o = 0 a rank informs any number at once: S(n) = lambda. A
contribution exists after its COMPUTE (or, moved as a KV block, is computed after it
arrives), so T >= first_compute_us + S(n). A binomial tree of p ranks meets it within a
factor of about two; without it a star's depth term alone let the bound sit far below every
plan at thousands of ranks.

``bound_us = max(compute_us, first_compute_us + max(latency_us, bandwidth_us, spread_us))``
where ``compute_us`` is the slowest contribution's COMPUTE on the fastest device.

COLLECTIVE steps are timed by a model of the library (NCCL's constants on GPUs, which do not
know this topology's links exactly; gloo's schedules simulated on hosts); the simulator
floors each library call at ``collective_floor_us`` (the cut
and depth bounds of a raw payload of its bytes and row size). F is homogeneous of degree
one in (alpha, g, mu) and grows with each, and mu's memory part is linear in the row
size, so collectives whose row sizes add up to at least a partial's row (the three
all-reduces of the paper's method) are floored, together, at no less than the depth bound
of the whole partial: the bounds hold for collective plans too. Where a calibration kept a link's hardware
rating beside its measured rate, NCCL's collectives move at the rating (``Topology.rated``)
and point-to-point transfers at the measured rate: the bounds read each link at the faster
of the two and the smaller latency (``bound_topology``), so they hold for either.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from treeattn.cost.compute import ComputeModel
from treeattn.errors import InputError
from treeattn.topology.model import Topology
from treeattn.workload import Payload, Workload

__all__ = ["Bounds", "CutModel", "bound_topology", "lower_bounds", "plan_bounds", "heads_shares", "depth_bound_us",
           "spread_bound_us"]


@dataclass(frozen=True, slots=True)
class Bounds:
    """Lower bounds, microseconds; ``bound_us`` is the one to compare a plan with."""

    latency_us: float
    """Depth: the earliest any reduction can gather every contribution of a row at one rank,
    less ``first_compute_us`` (message latency, per-message ingress time, fan-in)."""
    bandwidth_us: float
    """The worst cut: overhead + its smallest hop latency + needed bytes / capacity."""
    compute_us: float
    """The slowest contribution's COMPUTE on the fastest device (0 for raw payloads)."""
    first_compute_us: float
    """The fastest COMPUTE of any contribution: it precedes (or, for a moved KV block,
    follows) the data that crosses a cut."""
    bound_us: float
    """max(compute_us, first_compute_us + max(latency_us, bandwidth_us, spread_us))."""
    cut: str
    """Which term gives the bound: ``compute``, ``depth``, ``spread`` or the name of a cut."""
    spread_us: float = 0.0
    """Spreading one contribution to every rank that must hold it, one message per overhead."""

    def to_dict(self) -> dict:
        return {
            "spread_us": self.spread_us,
            "latency_us": self.latency_us,
            "bandwidth_us": self.bandwidth_us,
            "compute_us": self.compute_us,
            "first_compute_us": self.first_compute_us,
            "bound_us": self.bound_us,
            "cut": self.cut,
        }


@lru_cache(maxsize=64)
def depth_bound_us(n: int, alpha_us: float, g_us: float, mu_us: float, c_us: float, raw: bool) -> float:
    """F(n) of the module docstring: the earliest a rank can hold n contributions of one row.

    Args:
        n: contributions to gather.
        alpha_us: overhead plus the smallest route latency between two ranks.
        g_us: one row's bytes over the largest ingress capacity of a rank.
        mu_us: the cheapest merge phase of one row.
        c_us: the fastest COMPUTE (ignored for raw payloads, whose contributions exist at 0).
        raw: raw payload (only the own buffer is local) or attention (KV may be computed anywhere).

    Returns:
        Microseconds, including the first compute for attention payloads.
    """
    c = 0.0 if raw else c_us
    a = alpha_us + g_us + mu_us
    base = c + alpha_us + mu_us
    f_of = [0.0] * (n + 1)
    h1 = [0.0] * (n + 1)

    def h(m: int, fmin: int) -> float:
        # min over f in [fmin, m] of max(F(ceil(m/f)) + a, base + f g): the first term falls
        # and the second rises with f, so the best f is at their crossing.
        lo, hi = fmin, m
        if lo > hi:
            return math.inf
        while lo < hi:
            mid = (lo + hi) // 2
            if base + mid * g_us >= f_of[-(-m // mid)] + a:
                hi = mid
            else:
                lo = mid + 1
        best = max(f_of[-(-m // lo)] + a, base + lo * g_us)
        if lo > fmin:
            f = lo - 1
            best = min(best, max(f_of[-(-m // f)] + a, base + f * g_us))
        return best

    if n < 1:
        return 0.0
    f_of[1] = c
    h1[1] = h(1, 1)
    for k in range(2, n + 1):
        if raw:
            f_of[k] = h1[k - 1]
        else:
            # k local computes cost k c (rising in k); the rest come by messages, H(k - j)
            # (falling in j): best j at the crossing. j = 0 needs two messages at least.
            best = min(k * c, h(k, 2))
            lo, hi = 1, k - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if mid * c >= h1[k - mid]:
                    hi = mid
                else:
                    lo = mid + 1
            best = min(best, max(lo * c, h1[k - lo]))
            if lo > 1:
                best = min(best, max((lo - 1) * c, h1[k - lo + 1]))
            f_of[k] = best
        h1[k] = h(k, 1)
    return f_of[n]


@lru_cache(maxsize=64)
def spread_bound_us(n: int, gap_us: float, latency_us: float) -> float:
    """S(n) of the module docstring: the earliest data held by one rank at 0 can be held by
    ``n`` ranks when a rank issues one message per ``gap_us`` and each arrives ``gap_us +
    latency_us`` after its issue began (the greedy LogP broadcast)."""
    if n < 2:
        return 0.0
    if gap_us <= 0.0:
        return latency_us
    # Arrivals in time order: (time, the issuing rank's k-th message); the informed rank
    # starts issuing at once.
    heap = [gap_us + latency_us]
    informed = 1
    t = 0.0
    while informed < n:
        t = heapq.heappop(heap)
        informed += 1
        heapq.heappush(heap, t + gap_us)  # the sender's next message
        heapq.heappush(heap, t + gap_us + latency_us)  # the new rank's first
    return t


class CutModel:
    """Capacities and smallest latencies of the cuts of one topology (built once, O(links))."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.overhead_us = topo.floor_overhead_us
        node_of = {d.name: d.node for d in topo.devices}
        dev_in: dict[str, list[float]] = {}
        dev_out: dict[str, list[float]] = {}
        node_in: dict[int, list[float]] = {}
        node_out: dict[int, list[float]] = {}
        rank_devs = set(topo.ranks)
        for ln in topo.links:
            src, dst, bw, lat = ln.src, ln.dst, ln.bw_gbps, ln.latency_us
            if dst in rank_devs:
                _add(dev_in, dst, bw, lat)
            if src in rank_devs:
                _add(dev_out, src, bw, lat)
            a, b = node_of[src], node_of[dst]
            if a != b:
                _add(node_in, b, bw, lat)
                _add(node_out, a, bw, lat)
        self.rank_dev = topo.ranks
        self.rank_node = tuple(node_of[d] for d in topo.ranks)
        self.dev_in, self.dev_out, self.node_in, self.node_out = dev_in, dev_out, node_in, node_out
        self.groups, self.group_in, self.group_out = _switch_groups(topo, node_of)
        ins = [_cap(dev_in, d) for d in rank_devs]
        self.max_ingress_gbps = max((bw for bw, _ in ins), default=0.0)
        """The largest total capacity into a rank's device."""
        # A route between two rank devices is one link joining them directly, or leaves the
        # first and enters the second: at least the smallest out- plus in-latency.
        two_hops = min((lat for bw, lat in ins if bw > 0), default=0.0) + min(
            (_cap(dev_out, d)[1] for d in rank_devs if _cap(dev_out, d)[0] > 0), default=0.0)
        direct = [ln.latency_us for ln in topo.links if ln.src in rank_devs and ln.dst in rank_devs]
        self.alpha_us = self.overhead_us + min([two_hops, *direct])
        """Overhead plus the smallest route latency between two ranks' devices."""
        self.launch_us = topo.cost.launch_us
        bws = [topo.device(d).mem_bw_gbps * topo.cost.mem_efficiency for d in rank_devs]
        self._merge_bw_gbps = max(bws) if bws and min(bws) > 0 else 0.0
        self._floor_cuts: list[tuple[float, float]] | None = None

    def merge_us(self, row_bytes: float) -> float:
        """The cheapest merge phase of one row on any rank (launch plus memory time)."""
        mem = 3 * row_bytes / (self._merge_bw_gbps * 1e3) if self._merge_bw_gbps > 0 else 0.0
        return self.launch_us + mem

    def depth_us(self, n: int, row_bytes: float, first_compute_us: float, raw: bool) -> float:
        """F(n) for rows of ``row_bytes`` on this topology (see the module docstring)."""
        if n < 2 or self.max_ingress_gbps <= 0:
            return 0.0 if raw else first_compute_us
        g = row_bytes / (self.max_ingress_gbps * 1e3)
        return depth_bound_us(n, self.alpha_us, g, self.merge_us(row_bytes), first_compute_us, raw)

    def pieces(
        self, results: Iterable[int], contributors: Iterable[int], payload_bytes: float, kv: dict[int, float] | None,
        shares: dict[int, float] | None = None,
    ) -> list[tuple[str, float, float, float]]:
        """Every applicable cut as (name, smallest latency, bytes needed, capacity GB/s).

        Args:
            results: ranks that must end with the result.
            contributors: ranks whose contributions it must hold.
            payload_bytes: P, one rank's partial (or raw buffer).
            kv: KV bytes per contributor when KV blocks may move instead of partials
                (attention); None for raw payloads. Bytes needed for a set S of
                contributors: min(P, sum of kv over S), or P.
            shares: per result rank, the share of the rows it must hold (a heads layout);
                None: every row. A set of result ranks needs the rows any of them holds.
        """
        results = sorted(set(results))
        contributors = sorted(set(contributors))
        out: list[tuple[str, float, float, float]] = []
        if not results or not contributors:
            return out
        cset = set(contributors)
        kv_of = (lambda j: kv[j]) if kv is not None else (lambda j: 0.0)
        total_kv = sum(kv_of(j) for j in contributors)

        def rows(ranks: Iterable[int]) -> float:
            """Share of the rows some rank of ``ranks`` must end with."""
            if shares is None:
                return 1.0 if any(True for _ in ranks) else 0.0
            return min(1.0, sum(shares[r] for r in ranks))

        def need(kv_sum: float, share: float = 1.0) -> float:
            return payload_bytes * share if kv is None else min(payload_bytes * share, kv_sum)

        for r in results:
            n_others = len(contributors) - (1 if r in cset else 0)
            if n_others:
                cap, lat = _cap(self.dev_in, self.rank_dev[r])
                if cap > 0:
                    out.append((f"ingress of rank {r}", lat,
                                need(total_kv - (kv_of(r) if r in cset else 0.0), rows([r])), cap))
        # Without shares every nonempty set of result ranks needs every row: the sets below
        # are only listed (in ``results`` order, so that sums come out alike) when shares count.
        for j in contributors:
            if len(results) > 1 or results[0] != j:
                cap, lat = _cap(self.dev_out, self.rank_dev[j])
                if cap > 0:
                    share = 1.0 if shares is None else rows([r for r in results if r != j])
                    out.append((f"egress of rank {j}", lat, need(kv_of(j), share), cap))
        node_count: dict[int, int] = {}
        node_kv: dict[int, float] = {}
        for j in contributors:
            n = self.rank_node[j]
            node_count[n] = node_count.get(n, 0) + 1
            node_kv[n] = node_kv.get(n, 0.0) + kv_of(j)
        by_node: dict[int, list[int]] = {}
        for r in results:
            by_node.setdefault(self.rank_node[r], []).append(r)
        result_nodes = sorted(by_node)
        for n in result_nodes:
            cap, lat = _cap(self.node_in, n)
            if len(contributors) > node_count.get(n, 0) and cap > 0:
                out.append((f"into node {n}", lat, need(total_kv - node_kv.get(n, 0.0), rows(by_node[n])), cap))
        for n in sorted(node_count):
            if (len(result_nodes) > 1 or result_nodes[0] != n) and _cap(self.node_out, n)[0] > 0:
                cap, lat = _cap(self.node_out, n)
                share = 1.0 if shares is None else rows([r for r in results if self.rank_node[r] != n])
                out.append((f"out of node {n}", lat, need(node_kv[n], share), cap))
        for switch, members in self.groups.items():
            inside = [r for r in results if self.rank_node[r] in members]
            held = sum(node_count.get(n, 0) for n in members)
            kv_in = sum(node_kv.get(n, 0.0) for n in members)
            cap, lat = _cap(self.group_in, switch)
            if inside and len(contributors) > held and cap > 0:
                out.append((f"into the nodes under {switch}", lat, need(total_kv - kv_in, rows(inside)), cap))
            cap, lat = _cap(self.group_out, switch)
            if held and len(inside) < len(results) and cap > 0:
                share = 1.0 if shares is None else rows([r for r in results if self.rank_node[r] not in members])
                out.append((f"out of the nodes under {switch}", lat, need(kv_in, share), cap))
        return out

    def collective_floor_us(self, nbytes: int, row_bytes: int, everyone: bool = True) -> float:
        """The least time a collective over all ranks can take in this model when it delivers
        ``nbytes`` of every other rank's data, in rows of ``row_bytes``, to every rank: the
        cut, depth and (``everyone``: every rank receives from every other) spreading bounds
        of a raw payload of that size."""
        p = self.topo.num_ranks
        if p < 2:
            return 0.0
        if self._floor_cuts is None:
            ranks = range(p)
            self._floor_cuts = [(lat, cap) for _, lat, _, cap in self.pieces(ranks, ranks, 0.0, None)]
        cut = max((self.overhead_us + lat + nbytes / (cap * 1e3) for lat, cap in self._floor_cuts), default=0.0)
        spread = self.spread_us(p) if everyone else 0.0
        return max(cut, self.depth_us(p, row_bytes, 0.0, True), spread)

    def spread_us(self, n: int) -> float:
        """S(n) on this topology: one message per overhead, the smallest route latency."""
        return spread_bound_us(n, self.overhead_us, self.alpha_us - self.overhead_us)


def _switch_groups(topo: Topology, node_of: dict[str, int]) -> tuple[dict[str, frozenset[int]], dict, dict]:
    """The nodes behind each switch that is the only device outside them their links reach (a
    leaf of a fat tree that holds whole nodes): every byte into or out of those nodes crosses
    the switch's other links, its uplinks, which an oversubscribed leaf has fewer of than its
    nodes have NICs. Returns (per such switch, its nodes), and the capacity and smallest
    latency into and out of each group (tables as ``_add`` fills them). Several nodes
    behind one switch whose other links are all theirs (one switch for the whole cluster)
    have no such boundary: no group."""
    ends: dict[int, set[str]] = {}
    for ln in topo.links:
        a, b = node_of[ln.src], node_of[ln.dst]
        if a != b:
            if a >= 0:
                ends.setdefault(a, set()).add(ln.dst)
            if b >= 0:
                ends.setdefault(b, set()).add(ln.src)
    behind: dict[str, set[int]] = {}
    ranks = set(topo.ranks)
    for n in sorted(ends):
        if len(ends[n]) == 1:
            (switch,) = ends[n]
            # A rank's own device cannot bound a group: its data starts inside the boundary.
            if node_of[switch] < 0 and switch not in ranks:
                behind.setdefault(switch, set()).add(n)
    groups = {s: frozenset(m) for s, m in behind.items()}
    into: dict = {}
    out: dict = {}
    for ln in topo.links:
        if ln.dst in groups and node_of[ln.src] not in groups[ln.dst]:
            _add(into, ln.dst, ln.bw_gbps, ln.latency_us)
        if ln.src in groups and node_of[ln.dst] not in groups[ln.src]:
            _add(out, ln.src, ln.bw_gbps, ln.latency_us)
    return groups, into, out


def _add(table: dict, key, bw: float, lat: float) -> None:
    hit = table.get(key)
    if hit is None:
        table[key] = [bw, lat]
    else:
        hit[0] += bw
        hit[1] = min(hit[1], lat)


def _cap(table: dict, key) -> tuple[float, float]:
    hit = table.get(key)
    return (hit[0], hit[1]) if hit else (0.0, 0.0)


def bound_topology(topo: Topology) -> Topology:
    """The links the bounds read: ``topo`` itself, except that a link whose measured rate
    calibration kept beside its hardware rating (``Link.rated_gbps``, ``rated_latency_us``)
    counts at the faster rate and the smaller latency of the two where NCCL runs the
    collectives (GPU ranks), as those move at the ratings and treeattn's own transfers at the
    measured rates. On host ranks both use the measured rates (gloo)."""
    rated = topo.rated
    if topo.on_hosts or rated is topo:
        return topo
    links = tuple(dataclasses.replace(r, bw_gbps=max(r.bw_gbps, m.bw_gbps), latency_us=min(r.latency_us, m.latency_us))
                  for r, m in zip(rated.links, topo.links, strict=True))
    return dataclasses.replace(rated, links=links)


def lower_bounds(
    payload: Payload,
    topo: Topology,
    *,
    result_ranks: Iterable[int] | None = None,
    contributors: Iterable[int] | None = None,
    shares: Sequence[float] | None = None,
    cuts: CutModel | None = None,
) -> Bounds:
    """Lower bounds on any plan's time for ``payload`` on ``topo`` (see the module docstring).

    Args:
        payload: the workload or raw payload.
        topo: the topology, with as many ranks as the payload.
        result_ranks: ranks that must end with the result; None = every rank (an all-reduce
            pattern; pass a plan's ``result_ranks`` for a reduce to one root).
        contributors: ranks whose contributions the result holds; None = every rank.
        shares: per rank, the share of the rows it must hold (a heads layout:
            ``heads_shares``); None = every row.
        cuts: a prebuilt ``CutModel`` of ``bound_topology(topo)`` (saves rebuilding it in a
            search loop).

    Returns:
        The Bounds; ``bound_us`` never exceeds what ``simulate`` predicts for a valid plan.

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> from treeattn.workload import Workload
        >>> w = Workload.create(ranks=16, seq_len=1 << 20, model="llama-3.1-8b")
        >>> b = lower_bounds(w, resolve("dgx-h100:nodes=2"))
        >>> b.bound_us >= b.compute_us
        True
    """
    p = topo.num_ranks
    ranks = len(payload.split) if isinstance(payload, Workload) else payload.ranks
    if ranks != p:
        raise InputError(f"the payload has {ranks} ranks but topology {topo.name!r} places {p}")
    results = list(range(p)) if result_ranks is None else sorted(set(result_ranks))
    contrib = list(range(p)) if contributors is None else sorted(set(contributors))
    for r in (*results, *contrib):
        if not 0 <= r < p:
            raise InputError(f"rank {r} out of range: topology {topo.name!r} has {p} ranks")
    raw = not isinstance(payload, Workload)
    kv: dict[int, float] | None = None
    compute = first = 0.0
    if not raw and contrib:
        cm = ComputeModel.of(payload, topo)
        costs = [cm.min_partial_us(j) for j in contrib]
        compute, first = max(costs), min(costs)
        kv = {j: float(payload.kv_bytes(j)) for j in contrib}
    cuts = cuts if cuts is not None else CutModel(bound_topology(topo))
    o = topo.floor_overhead_us
    bw_us, bw_name = 0.0, ""
    share_of = None if shares is None else dict(enumerate(shares))
    for name, lat, nbytes, cap in cuts.pieces(results, contrib, payload.payload_bytes, kv, share_of):
        t = o + lat + nbytes / (cap * 1e3)
        if t > bw_us:
            bw_us, bw_name = t, name
    needs_comm = any(r not in contrib or len(contrib) > 1 for r in results[:2]) if results else False
    depth = spread = 0.0
    if needs_comm:
        depth = cuts.depth_us(len(contrib), payload.row_bytes, first, raw) - first
        # A contribution must reach every result rank other than its own.
        reach = len(results) + (0 if set(results) & set(contrib) else 1)
        spread = cuts.spread_us(reach)
    bound, cut = compute, "compute"
    if first + depth > bound:
        bound, cut = first + depth, "depth"
    if first + spread > bound:
        bound, cut = first + spread, "spread"
    if first + bw_us > bound:
        bound, cut = first + bw_us, bw_name
    return Bounds(
        latency_us=max(depth, 0.0),
        bandwidth_us=bw_us,
        compute_us=compute,
        first_compute_us=first,
        bound_us=bound,
        cut=cut,
        spread_us=spread,
    )


def heads_shares(payload: Payload, ranks: int) -> list[float]:
    """Per rank, the share of the rows a heads layout gives it (``treeattn.plan.ir.head_split``)."""
    from treeattn.plan.ir import head_split

    units = payload.q_heads if isinstance(payload, Workload) else payload.rows
    return [n / units for n in head_split(units, ranks)]


def plan_bounds(plan, topo: Topology) -> Bounds:  # noqa: ANN001 - a Plan (plan imports cost, not the reverse)
    """``lower_bounds`` for what ``plan`` delivers: its result ranks, contributors and layout."""
    shares = heads_shares(plan.workload, plan.ranks) if plan.layout == "heads" else None
    return lower_bounds(plan.workload, topo, result_ranks=plan.result_ranks, contributors=plan.contributors,
                        shares=shares)
