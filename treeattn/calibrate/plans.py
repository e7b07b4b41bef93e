"""The microbenchmarks of ``treeattn calibrate``, written as Plans (pure: no torch).

Calibration measures with the same interpreter, launcher and timing code as ``treeattn run``
(``treeattn.exec``), so what it fits is what plans pay, and the simulator can time the very
same plans on the fitted topology to show how well the fit predicts them.

* *Route classes*: ordered rank pairs grouped by the (link kind, bandwidth) of each hop of
  their route (``Topology.route_links``). A pair's class is keyed by its route from the lower
  rank to the higher; a ping-pong measures that route and its reverse, assumed alike.
* *Ping-pong* between the representative pair ``(a, b)`` of a class: ``round_trips`` times
  a -> b then b -> a, one message per step, ``RECV_COPY`` (rank ``a``'s buffer goes there and
  back). Valid plans (``contributors=(a,)``), so every run also checks what arrived.
* *Concurrent flows*: several pairs ping-pong at once (do flows that share a link split it?),
  and *fan-in*: several ranks send to one rank in one step (how a star's root receives).
* *Compute* and *tree* cases (attention calibration): every rank computing its partial at
  once, and small attention plans of three tree shapes (star, chain, binomial; reduce then
  broadcast) over every rank: what a step, a merge and a message cost a rank in the middle
  of a plan, with the other ranks at work on the same cores, which the cases above (one
  kind of work at a time, in a tight loop) do not show. Beside them, the library's own
  all-reduce over every rank (*collective* cases), whose messages skip the interpreter.

Legend: ``nbytes`` is the message size (the whole raw payload, one chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeattn.errors import InputError
from treeattn.plan.builders import build
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.plan.schedule import Programs
from treeattn.topology.model import Topology
from treeattn.workload import RawPayload, Workload

__all__ = [
    "Hop",
    "RouteClass",
    "route_classes",
    "log_sizes",
    "pingpong_plan",
    "concurrent_plan",
    "fanin_plan",
    "TREE_SHAPES",
    "tree_plans",
    "allreduce_plan",
]

TREE_SHAPES = ("star", "chain", "binomial")
"""Tree shapes of the calibration's small attention plans."""

Hop = tuple[str, float]
"""One hop of a route class: (link kind, bw_gbps)."""


@dataclass(frozen=True, slots=True)
class RouteClass:
    """Rank pairs whose routes cross the same sequence of link kinds and bandwidths."""

    hops: tuple[Hop, ...]
    pairs: tuple[tuple[int, int], ...]
    """Every pair (a < b) of the class, in order; the first one is measured."""

    @property
    def pair(self) -> tuple[int, int]:
        """The representative pair: the lowest ranks of the class."""
        return self.pairs[0]

    @property
    def name(self) -> str:
        """Short label: kinds along the route, e.g. ``pcie>pcie>infiniband>...`` or ``loopback``."""
        return ">".join(kind for kind, _ in self.hops)

    @property
    def bottleneck_gbps(self) -> float:
        return min(bw for _, bw in self.hops)


def route_classes(topo: Topology) -> tuple[RouteClass, ...]:
    """Group the rank pairs of ``topo`` by route class.

    Args:
        topo: the topology.

    Returns:
        Classes ordered by hop count, then by their first pair; each pair (a < b) appears once.

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> [(c.name, c.pair, len(c.pairs)) for c in route_classes(resolve("cpu:ranks=4"))]
        [('loopback', (0, 1), 6)]
    """
    by_key: dict[tuple[Hop, ...], list[tuple[int, int]]] = {}
    for a in range(topo.num_ranks):
        for b in range(a + 1, topo.num_ranks):
            key = tuple((ln.kind.value, float(ln.bw_gbps)) for ln in topo.route_links(a, b))
            by_key.setdefault(key, []).append((a, b))
    classes = [RouteClass(key, tuple(pairs)) for key, pairs in by_key.items()]
    return tuple(sorted(classes, key=lambda c: (len(c.hops), c.pair)))


def log_sizes(lo_bytes: int, hi_bytes: int, count: int, element: int = 4) -> tuple[int, ...]:
    """``count`` message sizes spaced evenly in log scale from ``lo`` to ``hi`` bytes, each a
    multiple of ``element`` (fp32), without duplicates.

    Args:
        lo_bytes: smallest size (>= element).
        hi_bytes: largest size (>= lo).
        count: how many (>= 2 unless lo == hi).
        element: sizes are rounded to multiples of this.

    Returns:
        Sorted distinct sizes.
    """
    if lo_bytes < element or hi_bytes < lo_bytes:
        raise InputError(f"--min-size and --max-size must satisfy {element} <= min <= max, got min {lo_bytes} and max "
                         f"{hi_bytes} bytes")
    if count < 1 or (count < 2 and hi_bytes > lo_bytes):
        raise InputError(f"need at least 2 sizes between {lo_bytes} and {hi_bytes} bytes, got {count}")
    if count == 1:
        return (lo_bytes // element * element,)
    ratio = (hi_bytes / lo_bytes) ** (1.0 / (count - 1))
    out = sorted({max(element, round(lo_bytes * ratio**i / element) * element) for i in range(count)})
    return tuple(out)


def _plan(name: str, params: dict, nbytes: int, ranks: int, topo: TopologyRef, progs: Programs,
          result_ranks: Sequence[int], contributors: Sequence[int] | None) -> Plan:
    return Plan(algorithm=name, params=params, workload=RawPayload(nbytes=nbytes, ranks=ranks), topology=topo,
                chunks=1, programs=progs.build(), result_ranks=tuple(result_ranks),
                contributors=None if contributors is None else tuple(contributors))


def _check_pairs(pairs: Sequence[tuple[int, int]], ranks: int) -> None:
    used: list[int] = [r for pair in pairs for r in pair]
    if not pairs or any(not 0 <= r < ranks for r in used) or len(set(used)) != len(used):
        raise InputError(f"pairs {list(pairs)} must be disjoint pairs of distinct ranks in 0-{ranks - 1}")


def pingpong_plan(topo: TopologyRef | Topology, ranks: int, pair: tuple[int, int], nbytes: int,
                  round_trips: int) -> Plan:
    """Rank ``a`` sends its buffer to ``b``, which sends it back, ``round_trips`` times.

    Args:
        topo: the topology (or its reference) the plan is for.
        ranks: ranks of the run (the others idle).
        pair: (a, b).
        nbytes: message size.
        round_trips: how many a -> b -> a (2 x round_trips messages, one per step).

    Returns:
        A valid plan (``algorithm='pingpong'``): ranks a and b end holding a's buffer.
    """
    return concurrent_plan(topo, ranks, (pair,), nbytes, round_trips, name="pingpong")


def concurrent_plan(topo: TopologyRef | Topology, ranks: int, pairs: Sequence[tuple[int, int]], nbytes: int,
                    round_trips: int, *, name: str = "concurrent") -> Plan:
    """Several disjoint pairs ping-pong at the same time, step for step.

    Args:
        topo: the topology (or its reference).
        ranks: ranks of the run.
        pairs: disjoint (a, b) pairs.
        nbytes: message size.
        round_trips: round trips of every pair.

    Returns:
        A valid plan; its result is the first pair's (both hold that pair's ``a`` buffer).
    """
    _check_pairs(pairs, ranks)
    if round_trips < 1:
        raise InputError(f"round trips must be >= 1, got {round_trips}")
    progs = Programs(ranks)
    for k in range(round_trips):
        for a, b in pairs:
            progs.transfer(a, b, 2 * k, copy=True)
            progs.transfer(b, a, 2 * k + 1, copy=True)
    params = {"pairs": [list(p) for p in pairs], "round_trips": round_trips}
    first = pairs[0]
    return _plan(name, params, nbytes, ranks, TopologyRef.of(topo), progs, first, (first[0],))


def compute_plan(topo: TopologyRef | Topology, ranks: int, heads: tuple[int, int, int], tokens: int) -> Plan:
    """Every rank computes attention over its own ``tokens`` of KV at once (nothing moves):
    what step 0 of every attention plan does, with the ranks sharing the host's cores.

    Args:
        topo: the topology (or its reference).
        ranks: ranks of the run.
        heads: (q heads, KV heads, head dim), B = 1, bf16 KV.
        tokens: KV tokens per rank (>= 1).

    Returns:
        A valid plan whose result is rank 0's own partial.
    """
    if tokens < 1:
        raise InputError(f"compute case needs at least 1 token per rank, got {tokens}")
    hq, hkv, d = heads
    w = Workload(batch=1, q_heads=hq, kv_heads=hkv, head_dim=d, split=(tokens,) * ranks, kv_dtype="bf16")
    programs = tuple((Op(OpKind.COMPUTE, 0),) for _ in range(ranks))
    return Plan(algorithm="compute", params={"tokens": tokens}, workload=w, topology=TopologyRef.of(topo),
                chunks=1, programs=programs, result_ranks=(0,), contributors=(0,))


def fanin_plan(topo: TopologyRef | Topology, ranks: int, root: int, senders: Sequence[int], nbytes: int) -> Plan:
    """Every sender sends its buffer to ``root`` in one step; ``root`` sums them in.

    Args:
        topo: the topology (or its reference).
        ranks: ranks of the run.
        root: the receiving rank.
        senders: the sending ranks (distinct, not ``root``).

    Returns:
        A valid plan whose result (on ``root``) holds root's and the senders' buffers.
    """
    if root in senders or len(set(senders)) != len(senders) or not senders:
        raise InputError(f"fan-in needs distinct senders other than the root {root}, got {list(senders)}")
    if any(not 0 <= r < ranks for r in (root, *senders)):
        raise InputError(f"fan-in root {root} and senders {list(senders)} must be ranks in 0-{ranks - 1}")
    progs = Programs(ranks)
    for s in senders:
        progs.transfer(s, root, 0)
    params = {"root": root, "senders": list(senders)}
    return _plan("fanin", params, nbytes, ranks, TopologyRef.of(topo), progs, (root,), (root, *senders))


def tree_plans(topo: TopologyRef | Topology, ranks: int, heads: tuple[int, int, int], batch: int,
               tokens: int) -> list[tuple[str, Plan]]:
    """Small attention plans over every rank, one per shape of ``TREE_SHAPES``, rooted at the
    last rank: every rank computes its partial, the tree reduces them to the root with
    merges, and the root's result goes back down (every rank ends with the whole).

    Args:
        topo: the topology (or its reference).
        ranks: ranks of the run (>= 2).
        heads: (q heads, KV heads, head dim), bf16 KV, fp32 partials.
        batch: decode batch B (the partials are B x q heads rows).
        tokens: KV tokens per rank (>= 1).

    Returns:
        (shape, plan) per shape.
    """
    if ranks < 2 or batch < 1 or tokens < 1:
        raise InputError(f"tree cases need >= 2 ranks, batch >= 1 and >= 1 token per rank, got {ranks}, "
                         f"{batch} and {tokens}")
    hq, hkv, d = heads
    w = Workload(batch=batch, q_heads=hq, kv_heads=hkv, head_dim=d, split=(tokens,) * ranks, kv_dtype="bf16")
    return [(shape, build(shape, w, TopologyRef.of(topo), root=ranks - 1)) for shape in TREE_SHAPES]


def allreduce_plan(topo: TopologyRef | Topology, ranks: int, nbytes: int) -> Plan:
    """One library all-reduce (sum) of every rank's ``nbytes`` buffer.

    Args:
        topo: the topology (or its reference).
        ranks: ranks of the run (>= 2).
        nbytes: bytes per rank (a multiple of 4).

    Returns:
        The plan ``treeattn plan --algorithm allreduce`` builds.
    """
    if ranks < 2:
        raise InputError(f"a collective case needs >= 2 ranks, got {ranks}")
    return build("allreduce", RawPayload(nbytes=nbytes, ranks=ranks), TopologyRef.of(topo))
