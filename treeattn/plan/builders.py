"""Builders: an algorithm name and its parameters in, a Plan out.

Every builder is deterministic (same arguments, byte-identical plan file), pipelines its
row chunks, and produces a plan that ``treeattn.plan.validate.check`` accepts. Attention
plans start with a COMPUTE of each rank's own block at step 0 and communicate from step 1;
raw payloads (a plain sum) start communicating at step 0. The plan's ``params`` record
everything the builder used (parent lists, root, order, groups, ...), so that a plan file
describes itself.

Examples:
    >>> from treeattn.plan import TopologyRef, build
    >>> from treeattn.workload import Workload
    >>> w = Workload.create(ranks=8, seq_len=8192, model="llama-3.1-8b")
    >>> plan = build("binomial", w, TopologyRef("flat", "sha256:0"), chunks=2)
    >>> plan.ranks, plan.chunks, plan.params["parents"]
    (8, 2, [-1, 0, 0, 2, 0, 4, 4, 6])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from treeattn.errors import InfeasiblePlanError, InputError
from treeattn.plan.ir import Plan, TopologyRef, gc_paused
from treeattn.plan.schedule import Programs, emit_butterfly, emit_direct, emit_direct_scatter, emit_ring, emit_tree
from treeattn.plan.trees import (
    SHAPES,
    double_binary_parents,
    parents_of_shape,
    positions,
    reroot,
    rotated,
    tree_info,
)
from treeattn.units import counted
from treeattn.workload import Payload, RawPayload

__all__ = ["ParamSpec", "AlgorithmSpec", "ALGORITHMS", "build", "tree_plan"]

RESULTS = ("all", "heads", "root")
"""Result layouts: ``all`` (every rank ends with every row), ``heads`` (each rank with its own
query heads: reduce-scatter semantics), ``root`` (only the root rank: a reduce)."""


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter an algorithm takes (what ``--algorithm list`` shows)."""

    name: str
    description: str


@dataclass(frozen=True, slots=True)
class AlgorithmSpec:
    """A registered algorithm: its stable name, what it does and what it takes."""

    name: str
    description: str
    """One line."""
    params: tuple[ParamSpec, ...]
    is_baseline: bool = False
    """True for what the paper and libraries do (collectives, ring attention)."""
    payloads: tuple[str, ...] = ("attention", "raw")
    """Payload kinds it can reduce (``Workload.kind``/``RawPayload.kind``)."""
    results: tuple[str, ...] = RESULTS
    """Result layouts it builds (``RESULTS``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "params": {p.name: p.description for p in self.params},
            "is_baseline": self.is_baseline,
            "payloads": list(self.payloads),
            "results": list(self.results),
        }


@dataclass(frozen=True)
class _Args:
    workload: Payload
    topology: TopologyRef
    chunks: int
    root: int | None
    fanout: int
    parents: Any
    groups: Any
    order: Any
    roots: Any
    result: str
    extra: dict[str, Any]

    @property
    def p(self) -> int:
        return self.workload.ranks

    @property
    def raw(self) -> bool:
        return isinstance(self.workload, RawPayload)

    @property
    def base(self) -> int:
        return 0 if self.raw else 1


def build(
    algorithm: str,
    workload: Payload,
    topology: Any,
    *,
    chunks: int = 1,
    root: int | None = None,
    fanout: int | None = None,
    parents: Sequence[Any] | None = None,
    groups: Sequence[Sequence[int]] | None = None,
    order: Sequence[int] | None = None,
    roots: Sequence[int] | None = None,
    result: str | None = None,
    whole_rows: bool = False,
    **extra: Any,
) -> Plan:
    """Build the plan of ``algorithm`` for ``workload``.

    Args:
        algorithm: a key of ``ALGORITHMS`` (``treeattn plan --algorithm list``).
        workload: a ``Workload`` (attention) or ``RawPayload`` (plain sum); its rank count is p.
        topology: a ``TopologyRef`` or a ``Topology`` (only its name and fingerprint are kept).
        chunks: row chunks to pipeline (per segment for ``ring``, per tree for ``multirail``).
        root: the root rank of tree algorithms (default 0, or ``order[0]``).
        fanout: children per node for ``kary`` (and the ``kary`` shape elsewhere; default 2).
        parents: a parent list (``tree``, ``broadcast``) or a list of them (``multirail``).
        groups: ``hierarchical``: a partition of the ranks (the first rank of each group, or
            ``root``, leads it).
        order: rank at each tree/ring/butterfly position (position 0 is the root).
        roots: ``multirail``: the root of each tree.
        result: ``all`` (reduce then broadcast: an all-reduce), ``heads`` (each rank ends with
            its own query heads' rows: tree algorithms reduce each rank's rows along the tree
            re-rooted at that rank) or ``root`` (reduce only); default the algorithm's first
            (``all`` where it builds it).
        whole_rows: with ``result='heads'``: the algorithm's ``all`` plan in one chunk, each
            rank keeping its own heads' rows (what an all-reduce then a slice does). Every rank
            merges every row, but in fewer messages than a heads plan's one per segment: on
            many ranks the per-message overheads cost more than the bytes saved.
        **extra: algorithm-specific parameters (``intra``, ``inter``, ``group_size``,
            ``trees``, ``shape``); see ``ALGORITHMS[name].params``.

    Returns:
        The plan; it passes ``check``.

    Raises:
        InputError: unknown algorithm or a parameter the algorithm does not take.
        InfeasiblePlanError: the parameters cannot make a plan (bad parent list, too few rows, ...).
    """
    spec = ALGORITHMS.get(algorithm)
    if spec is None:
        # The search's candidates name these families, which no builder has: say how to build one.
        how = {"improved": "reached by local moves", "exhaustive": "found among every tree"}.get(algorithm)
        searched = (f" (a tree the search {how}: build it as 'tree' with the parents its candidate's "
                    "build_params give)") if how else ""
        raise InputError(f"unknown algorithm {algorithm!r}{searched}; choose one of {', '.join(ALGORITHMS)}")
    if workload.kind not in spec.payloads:
        raise InfeasiblePlanError(f"algorithm {algorithm!r} reduces {' or '.join(spec.payloads)} payloads, "
                                  f"not {workload.kind}")
    # The layout before the parameters: a root that came with result root:R is the layout's.
    if result is None:
        result = spec.results[0]
    if result not in RESULTS:
        raise InputError(f"result must be one of {', '.join(RESULTS)}, got {result!r}")
    if whole_rows is not False:
        result = _whole_rows_result(spec, result, whole_rows, chunks)
    if result not in spec.results:
        raise InfeasiblePlanError(f"algorithm {algorithm!r} builds result {' or '.join(spec.results)}, not {result}; "
                                  f"algorithms for {result}: "
                                  + ", ".join(n for n, sp in ALGORITHMS.items() if result in sp.results
                                              and workload.kind in sp.payloads))
    names = {p.name for p in spec.params}
    if algorithm == "tree" and root is not None and result == "root":
        _check_parents_root(parents, root)
        root = None  # the tree takes no other root
    given = {"root": root, "fanout": fanout, "parents": parents, "groups": groups, "order": order, "roots": roots}
    for name, value in given.items():
        if value is not None and name not in names:
            raise InputError(f"algorithm {algorithm!r} takes no {name}; it takes: {', '.join(sorted(names))}")
    for name in extra:
        if name not in names:
            raise InputError(f"algorithm {algorithm!r} takes no parameter {name!r}; "
                             f"it takes: {', '.join(sorted(names))}")
    fanout = 2 if fanout is None else fanout
    if type(chunks) is not int or chunks < 1:
        raise InputError(f"chunks must be an integer >= 1, got {chunks!r}")
    if topology is None:
        topology = TopologyRef("none", "")
    args = _Args(workload, TopologyRef.of(topology), chunks, root, fanout, parents, groups, order, roots,
                 result, dict(extra))
    with gc_paused():
        plan = _BUILDERS[algorithm](args)
    return _kept_heads(args, plan) if whole_rows else plan


def _check_parents_root(parents: Any, root: int) -> None:
    """A tree's root is where its parent list holds -1: ``root``, the one a result names, must be
    it. A list without one root is left for the builder to refuse."""
    if isinstance(parents, (list, tuple)):
        tops = [i for i, x in enumerate(parents) if type(x) is int and x == -1]
        if len(tops) == 1 and tops[0] != root:
            raise InputError(f"algorithm 'tree' ends at the rank its parents give -1 (rank {tops[0]}), not at root "
                             f"{root} (given): name that rank (--root, root=, or result root:R), or none")


def build_root(algorithm: str, result: str, result_root: int | None, given: int | None, conflict: str) -> int | None:
    """The root to build ``algorithm`` at, from ``result`` (``parse_result`` gave ``result_root``)
    and a root ``given`` apart (``--root``, ``root=``): ``given``, which must be ``root:R``'s
    R (else ``InputError(conflict)``); else R; ``root`` alone means rank 0, or for a tree the
    root its parents name (None)."""
    if given is not None:
        if ":" in str(result) and given != result_root:
            raise InputError(conflict)
        return given
    if result_root is None or (algorithm == "tree" and str(result) == "root"):
        return None
    return result_root


def _whole_rows_result(spec: AlgorithmSpec, result: str | None, whole_rows: object, chunks: object) -> str:
    """The layout to build for ``whole_rows``: ``all``, checked."""
    if whole_rows is not True:
        raise InputError(f"whole_rows must be true or false, got {whole_rows!r}")
    if result != "heads":
        raise InputError(f"whole_rows keeps each rank's own heads of an all plan: give result heads, not {result}")
    if "all" not in spec.results:
        raise InfeasiblePlanError(f"algorithm {spec.name!r} builds no all plan to keep heads of (whole_rows)")
    if chunks != 1:
        raise InfeasiblePlanError(f"whole_rows sends every row in one message: it takes 1 chunk, not {chunks}")
    return "all"


def _kept_heads(a: _Args, plan: Plan) -> Plan:
    """``plan`` (result ``all``, one chunk) as a heads plan: the same messages, each carrying
    every row (``chunk=None``), and each rank's own segment its result."""
    _need_heads(a, 1, "whole_rows")
    if plan.chunks != 1:
        raise InfeasiblePlanError(f"whole_rows needs an all plan of one chunk; {plan.algorithm} cuts the rows "
                                  f"into {plan.chunks} even at chunks=1")
    programs = tuple(tuple(replace(op, chunk=None) if op.chunk == 0 else op for op in prog)
                     for prog in plan.programs)
    return replace(plan, programs=programs, chunks=a.p, layout="heads",
                   params={**plan.params, "result": "heads", "whole_rows": True})


def tree_plan(parents: Sequence[int | None], workload: Payload, topology_ref: Any, chunks: int = 1,
              result: str = "all") -> Plan:
    """The plan of any rooted tree: pipelined reduce to the root, then (``result='all'``) broadcast.

    Args:
        parents: ``parents[r]`` is rank r's parent, ``-1`` (or None) at the root.
        workload: the payload; ``len(parents)`` must equal its rank count.
        topology_ref: a ``TopologyRef`` (or ``Topology``).
        chunks: row chunks to pipeline.
        result: ``all`` or ``root``.

    Returns:
        A plan named ``tree`` whose params hold the parent list.

    Examples:
        >>> from treeattn.plan import TopologyRef, tree_plan, check
        >>> from treeattn.workload import RawPayload
        >>> plan = tree_plan([-1, 0, 1, 1], RawPayload(nbytes=4096, ranks=4), TopologyRef("t", "f"), chunks=2)
        >>> check(plan)
    """
    return build("tree", workload, topology_ref, parents=parents, chunks=chunks, result=result)


# -- helpers ------------------------------------------------------------------------------


def _need_chunks(a: _Args, n: int, why: str) -> None:
    rows = a.workload.rows
    if n > rows:
        raise InfeasiblePlanError(f"{why} needs {n} row chunks but the payload has only {rows} rows "
                                  "(batch x query heads); use fewer chunks or ranks, or a larger batch")


def _start(a: _Args) -> Programs:
    progs = Programs(a.p)
    if not a.raw:
        for r in range(a.p):
            progs.compute(r, 0)
    return progs


def _plan(a: _Args, algorithm: str, params: dict[str, Any], progs: Programs, chunks: int,
          result_ranks: Sequence[int] | None = None, contributors: Sequence[int] | None = None,
          layout: str = "full") -> Plan:
    return Plan(
        algorithm=algorithm,
        params=params,
        workload=a.workload,
        topology=a.topology,
        chunks=chunks,
        programs=progs.build(),
        result_ranks=tuple(range(a.p)) if result_ranks is None else tuple(result_ranks),
        contributors=None if contributors is None else tuple(contributors),
        layout=layout,
    )


def _need_heads(a: _Args, pieces: int, why: str) -> int:
    """Chunks of a heads layout plan (``pieces`` per rank); checks every rank has that many rows."""
    units = a.workload.q_heads if not a.raw else a.workload.rows  # type: ignore[union-attr]
    if a.p > units:
        what = counted(units, "query head") if not a.raw else counted(units, "element")
        raise InfeasiblePlanError(f"result heads gives every rank a share: {what} cannot go to {a.p} ranks")
    per = units // a.p * (1 if a.raw else a.workload.batch)  # type: ignore[union-attr]
    if pieces > per:
        holds = "some ranks hold" if units % a.p else "each rank holds"
        raise InfeasiblePlanError(f"{why} cuts each rank's rows into {pieces} chunks, but {holds} "
                                  f"{counted(per, 'row')}; use fewer chunks")
    return a.p * pieces


def _tree(a: _Args, algorithm: str, make: Callable[[int | None], Sequence[Any]], params: dict[str, Any]) -> Plan:
    """A tree algorithm: ``make(root)`` gives its parent list rooted at ``root`` (None: its own
    root). ``heads`` reduces each rank's rows along the tree rooted at that rank."""
    if a.result == "heads":
        total = _need_heads(a, a.chunks, f"{algorithm} with {counted(a.chunks, 'chunk')}")
        progs = _start(a)
        forest = []
        for s in range(a.p):
            info = tree_info(make(s), a.p)
            emit_tree(progs, info, range(s * a.chunks, (s + 1) * a.chunks), a.base, reduce=True, broadcast=False)
            forest.append(list(info.parents))
        params = {**params, "parents": forest, "chunks": a.chunks, "result": a.result}
        return _plan(a, algorithm, params, progs, total, layout="heads")
    _need_chunks(a, a.chunks, f"{algorithm} with {counted(a.chunks, 'chunk')}")
    info = tree_info(make(None), a.p)
    progs = _start(a)
    emit_tree(progs, info, range(a.chunks), a.base, reduce=True, broadcast=a.result == "all")
    params = {**params, "root": info.root, "parents": list(info.parents), "chunks": a.chunks, "result": a.result}
    return _plan(a, algorithm, params, progs, a.chunks, None if a.result == "all" else (info.root,))


def _shaped(a: _Args, shape: str, order: list[int]) -> Callable[[int | None], list[int]]:
    """Parent lists of ``shape`` over ``order``, re-rooted by rotating the positions."""
    return lambda root: parents_of_shape(shape, a.p, order=order if root is None else rotated(order, root),
                                         fanout=a.fanout)


def _shape_arg(a: _Args, key: str, default: str) -> str:
    shape = a.extra.get(key, default)
    if shape not in SHAPES:
        raise InputError(f"{key} must be one of {', '.join(SHAPES)}, got {shape!r}")
    return shape


# -- tree algorithms ----------------------------------------------------------------------


def _build_tree(a: _Args) -> Plan:
    if a.parents is None:
        raise InputError("algorithm 'tree' needs parents: a parent list with -1 at the root")
    parents = a.parents
    return _tree(a, "tree", lambda root: parents if root is None else reroot(parents, root), {})


def _build_star(a: _Args) -> Plan:
    order = positions(a.p, a.root, a.order)
    return _tree(a, "star", _shaped(a, "star", order), {"order": order})


def _build_chain(a: _Args) -> Plan:
    order = positions(a.p, a.root, a.order)
    return _tree(a, "chain", _shaped(a, "chain", order), {"order": order})


def _build_kary(a: _Args) -> Plan:
    order = positions(a.p, a.root, a.order)
    return _tree(a, "kary", _shaped(a, "kary", order), {"order": order, "fanout": a.fanout})


def _build_binomial(a: _Args) -> Plan:
    order = positions(a.p, a.root, a.order)
    return _tree(a, "binomial", _shaped(a, "binomial", order), {"order": order})


def _groups(a: _Args, name: str = "hierarchical", required: bool = True) -> list[list[int]] | None:
    size = a.extra.get("group_size")
    if a.groups is not None and size is not None:
        raise InputError("give groups or group_size, not both")
    if a.groups is None:
        if size is None:
            if not required:
                return None
            raise InputError(f"algorithm {name!r} needs groups (a partition of the ranks) or group_size")
        if type(size) is not int or size < 1:
            raise InputError(f"group_size must be an integer >= 1, got {size!r}")
        return [list(range(s, min(s + size, a.p))) for s in range(0, a.p, size)]
    groups = [list(g) for g in a.groups]
    flat = [r for g in groups for r in g]
    if any(not g for g in groups) or sorted(flat) != list(range(a.p)):
        raise InfeasiblePlanError(f"groups must partition the {a.p} ranks into non-empty groups, "
                                  f"each rank exactly once; got {groups[:8]}")
    return groups


def _build_hierarchical(a: _Args) -> Plan:
    groups = _groups(a)
    assert groups is not None
    intra, inter = _shape_arg(a, "intra", "star"), _shape_arg(a, "inter", "binomial")
    root = 0 if a.root is None else a.root
    if type(root) is not int or not 0 <= root < a.p:
        raise InfeasiblePlanError(f"root {root!r} is out of range: there are {a.p} ranks")
    up = parents_of_shape(inter, len(groups), fanout=a.fanout)

    def make(owner: int | None) -> list[int]:
        r0 = root if owner is None else owner
        home = next(i for i, g in enumerate(groups) if r0 in g)
        if owner is None:
            leaders = [r0 if i == home else g[0] for i, g in enumerate(groups)]
        else:
            # Each group's leader sits where the owner sits in its own group (its rail).
            at = groups[home].index(r0)
            leaders = [r0 if i == home else g[at % len(g)] for i, g in enumerate(groups)]
        ranked = [home] + [i for i in range(len(groups)) if i != home]  # the root's group leads the leaders
        parents = [-1] * a.p
        for pos, gi in enumerate(ranked):
            if up[pos] >= 0:
                parents[leaders[gi]] = leaders[ranked[up[pos]]]
        for gi, g in enumerate(groups):
            members = [leaders[gi]] + [r for r in g if r != leaders[gi]]
            inside = parents_of_shape(intra, len(members), fanout=a.fanout)
            for j in range(1, len(members)):
                parents[members[j]] = members[inside[j]]
        if owner is None:
            params["leaders"] = leaders
        return parents

    params: dict[str, Any] = {"groups": groups, "intra": intra, "inter": inter}
    if "kary" in (intra, inter):
        params["fanout"] = a.fanout
    if a.result != "heads":
        make(None)  # fills params["leaders"] before the tree's own keys
    return _tree(a, "hierarchical", make, params)


def _build_multirail(a: _Args) -> Plan:
    trees_arg = a.extra.get("trees")
    shape = _shape_arg(a, "shape", "binomial")
    if a.parents is not None:
        if a.roots is not None:
            raise InputError("give roots or parents (one parent list per tree), not both")
        infos = [tree_info(par, a.p) for par in a.parents]
        if not infos:
            raise InputError("multirail needs at least one parent list")
        roots = [t.root for t in infos]
    else:
        base_order = positions(a.p, None, a.order)
        if a.roots is not None:
            roots = list(a.roots)
        else:
            count = min(2, a.p) if trees_arg is None else trees_arg
            if type(count) is not int or not 1 <= count <= a.p:
                raise InputError(f"trees must be an integer in [1, {a.p}], got {count!r}")
            # Consecutive roots: tree t is tree 0 shifted by t positions, so with the binomial
            # shape the ranks interior in one tree are leaves in the next (as in a double binary tree).
            roots = [base_order[t] for t in range(count)]
        if not roots:
            raise InputError("multirail needs at least one root")
        infos = []
        for r in roots:
            if type(r) is not int or not 0 <= r < a.p:
                raise InfeasiblePlanError(f"root {r!r} is out of range: there are {a.p} ranks")
            i = base_order.index(r)
            infos.append(tree_info(parents_of_shape(shape, a.p, order=base_order[i:] + base_order[:i],
                                                    fanout=a.fanout), a.p))
    n = len(infos)
    if trees_arg is not None and trees_arg != n:
        raise InputError(f"trees = {trees_arg} but {n} roots/parent lists were given")
    total = n * a.chunks
    _need_chunks(a, total, f"multirail over {n} trees with {counted(a.chunks, 'chunk')} each")
    progs = _start(a)
    for t, info in enumerate(infos):
        emit_tree(progs, info, range(t, total, n), a.base)
    params: dict[str, Any] = {"roots": roots, "trees": n, "parents": [list(t.parents) for t in infos],
                              "chunks": a.chunks, "result": a.result}
    if a.parents is None:
        params["shape"] = shape
        if shape == "kary":
            params["fanout"] = a.fanout
        if a.order is not None:
            params["order"] = list(a.order)
    return _plan(a, "multirail", params, progs, total)


def _build_double_binary(a: _Args) -> Plan:
    # multirail over NCCL's two trees, placed on the ranks by order; the params are multirail's
    # plus the order, from which the builder makes the same trees again.
    plan = _build_multirail(replace(a, parents=list(double_binary_parents(a.p, a.order)), order=None))
    params = dict(plan.params)
    if a.order is not None:
        params["order"] = list(a.order)
    return replace(plan, algorithm="double-binary", params=params)


def _build_broadcast(a: _Args) -> Plan:
    _need_chunks(a, a.chunks, f"broadcast with {counted(a.chunks, 'chunk')}")
    if a.parents is not None:
        params: dict[str, Any] = {}
        parents = a.parents
    else:
        shape = _shape_arg(a, "shape", "binomial")
        order = positions(a.p, a.root, a.order)
        parents = parents_of_shape(shape, a.p, order=order, fanout=a.fanout)
        params = {"shape": shape, "order": order}
        if shape == "kary":
            params["fanout"] = a.fanout
    info = tree_info(parents, a.p)
    if a.root is not None and info.root != a.root:
        raise InfeasiblePlanError(f"root {a.root} is not the root of the parent list (rank {info.root} is)")
    progs = _start(a)
    emit_tree(progs, info, range(a.chunks), a.base, reduce=False)
    params.update({"root": info.root, "parents": list(info.parents), "chunks": a.chunks})
    return _plan(a, "broadcast", params, progs, a.chunks, contributors=(info.root,))


# -- all-reduce patterns and baselines ----------------------------------------------------


def _build_butterfly(a: _Args) -> Plan:
    _need_chunks(a, a.chunks, f"butterfly with {counted(a.chunks, 'chunk')}")
    order = positions(a.p, None, a.order)
    progs = _start(a)
    emit_butterfly(progs, order, a.chunks, a.base)
    return _plan(a, "butterfly", {"order": order, "chunks": a.chunks}, progs, a.chunks)


def _build_ring(a: _Args) -> Plan:
    order = positions(a.p, None, a.order)
    progs = _start(a)
    if a.result == "heads":
        total = _need_heads(a, a.chunks, f"ring with {counted(a.chunks, 'chunk')} per rank")
        emit_ring(progs, order, a.chunks, a.base, owned=True)
        return _plan(a, "ring", {"order": order, "chunks": a.chunks, "result": "heads"}, progs, total,
                     layout="heads")
    total = a.chunks * (a.p if a.p > 1 else 1)
    _need_chunks(a, total, f"ring over {a.p} ranks with {counted(a.chunks, 'chunk')} per segment")
    emit_ring(progs, order, a.chunks, a.base)
    return _plan(a, "ring", {"order": order, "chunks": a.chunks}, progs, total)


def _build_direct(a: _Args) -> Plan:
    groups = _groups(a, "direct", required=False)
    progs = _start(a)
    if a.result == "heads":
        if groups is not None:
            raise InputError("direct with result heads exchanges over all ranks at once; for groups use "
                             "hierarchical with result heads")
        total = _need_heads(a, a.chunks, f"direct with {counted(a.chunks, 'chunk')} per rank")
        emit_direct_scatter(progs, a.p, a.chunks, a.base)
        return _plan(a, "direct", {"chunks": a.chunks, "result": "heads"}, progs, total, layout="heads")
    _need_chunks(a, a.chunks, f"direct with {counted(a.chunks, 'chunk')}")
    emit_direct(progs, groups if groups is not None else [list(range(a.p))], range(a.chunks), a.base)
    params: dict[str, Any] = {"chunks": a.chunks}
    if groups is not None:
        params["groups"] = groups
    return _plan(a, "direct", params, progs, a.chunks)


def _build_allreduce3(a: _Args) -> Plan:
    _need_chunks(a, a.chunks, f"allreduce3 with {counted(a.chunks, 'chunk')}")
    progs = _start(a)
    for r in range(a.p):
        for s, (reduce, part) in enumerate((("max", "lse"), ("sum", "num"), ("sum", "den")), start=1):
            progs.collective(r, s, "allreduce", reduce, part)
    return _plan(a, "allreduce3", {"chunks": a.chunks}, progs, a.chunks)


def _library(a: _Args, algorithm: str) -> Plan:
    """One library collective of the partials for the result layout: all-reduce, reduce-scatter
    (heads) or reduce to the root (``root``); for attention each is an all-reduce max of lse
    first, then the sum of (w o, w)."""
    reduce = a.workload.reduce_op.value
    params: dict[str, Any] = {"chunks": a.chunks}
    if a.result == "heads":
        chunks, coll, peer, layout = _need_heads(a, a.chunks, f"{algorithm} with {counted(a.chunks, 'chunk')}"), \
            "reducescatter", None, "heads"
        params["result"] = "heads"
    else:
        _need_chunks(a, a.chunks, f"{algorithm} with {counted(a.chunks, 'chunk')}")
        chunks, coll, layout = a.chunks, "allreduce", "full"
        peer = None
        if a.result == "root":
            coll, peer = "reduce", 0 if a.root is None else a.root
            if type(peer) is not int or not 0 <= peer < a.p:
                raise InfeasiblePlanError(f"root {peer!r} is out of range: there are {a.p} ranks")
            params.update(result="root", root=peer)
    progs = _start(a)
    for r in range(a.p):
        progs.collective(r, a.base, coll, reduce, "partial", peer=peer)
    return _plan(a, algorithm, params, progs, chunks, None if peer is None else (peer,), layout=layout)


def _build_allreduce2(a: _Args) -> Plan:
    return _library(a, "allreduce2")


def _build_allreduce(a: _Args) -> Plan:
    return _library(a, "allreduce")


def _build_allgather_merge(a: _Args) -> Plan:
    _need_chunks(a, a.chunks, f"allgather-merge with {counted(a.chunks, 'chunk')}")
    progs = _start(a)
    for r in range(a.p):
        progs.collective(r, a.base, "allgather", a.workload.reduce_op.value, "partial")
    return _plan(a, "allgather-merge", {"chunks": a.chunks}, progs, a.chunks)


def _build_dcp_ag_rs(a: _Args) -> Plan:
    # vLLM's decode context parallel: attend every head over the local shard, gather every
    # rank's lse, reduce-scatter the outputs corrected by it. vLLM first all-gathers the
    # query, whose heads tensor parallelism shards; every method compared starts from the
    # whole query on every rank (where tensor parallelism shards it, each gathers it alike),
    # so none is charged that gather.
    total = _need_heads(a, a.chunks, f"dcp-ag-rs with {counted(a.chunks, 'chunk')}")
    progs = _start(a)
    for r in range(a.p):
        progs.collective(r, a.base, "allgather", "copy", "lse")
        progs.collective(r, a.base + 1, "reducescatter", "sum", "num")
    return _plan(a, "dcp-ag-rs", {"chunks": a.chunks, "result": "heads"}, progs, total, layout="heads")


def _build_dcp_a2a(a: _Args) -> Plan:
    # vLLM's all-to-all variant: each rank sends every other rank that rank's heads of its
    # partial (output and lse) in one library all-to-all and merges what it gets for its own.
    total = _need_heads(a, a.chunks, f"dcp-a2a with {counted(a.chunks, 'chunk')}")
    progs = _start(a)
    for r in range(a.p):
        progs.collective(r, a.base, "alltoall", "merge", "partial")
    return _plan(a, "dcp-a2a", {"chunks": a.chunks, "result": "heads"}, progs, total, layout="heads")


def _build_ring_attention(a: _Args) -> Plan:
    _need_chunks(a, a.chunks, f"ring-attention with {counted(a.chunks, 'chunk')}")
    order = positions(a.p, None, a.order)
    overlap = a.extra.get("overlap", True)
    if type(overlap) is not bool:
        raise InputError(f"overlap must be true or false, got {overlap!r}")
    p = a.p
    progs = Programs(p)
    for i in range(p):
        # Round t: rank order[i] computes over block order[i - t] (its own first) and, with
        # overlap, passes it on in the same step while the next one arrives (ring-flash-attn's
        # order); without, the transfer is a step of its own between two computes.
        for t in range(p):
            progs.compute(order[i], t if overlap else 2 * t, block=None if t == 0 else order[(i - t) % p])
        for t in range(1, p):
            progs.transfer(order[i], order[(i + 1) % p], t - 1 if overlap else 2 * t - 1,
                           block=order[(i - t + 1) % p])
    params: dict[str, Any] = {"order": order, "chunks": a.chunks}
    if not overlap:
        params["overlap"] = False
    return _plan(a, "ring-attention", params, progs, a.chunks)


# -- registry -----------------------------------------------------------------------------

_P = ParamSpec
_CHUNKS = _P("chunks", "row chunks pipelined through the schedule")
_RESULT = _P("result", "'all' (reduce, then broadcast back: every rank gets the result), 'heads' (each rank its own "
                       "query heads: the tree re-rooted at each rank reduces that rank's rows) or 'root' (reduce only)")
_RESULT_LIB = _P("result", "'all' (all-reduce), 'heads' (reduce-scatter: each rank its own query heads) or 'root' "
                           "(reduce to the root)")
_HEADS = _P("result", "always 'heads': each rank ends with its own query heads")
_LIB_CHUNKS = _P("chunks", "row chunks of each rank's heads (the library calls cover them all at once: not pipelined)")
_ROOT = _P("root", "rank the reduction ends at (default 0, or order[0])")
_ORDER = _P("order", "rank at each tree position, position 0 first (default: ranks rotated to start at root)")
_FANOUT = _P("fanout", "children per node (kary shape)")
_SHAPE_HELP = "tree shape: star, chain, kary or binomial"

_SPECS: list[tuple[AlgorithmSpec, Callable[[_Args], Plan]]] = [
    (AlgorithmSpec("tree", "any rooted tree given as a parent list: pipelined reduce up, broadcast down",
                   (_P("parents", "parent of each rank, -1 at the root"), _CHUNKS, _RESULT)), _build_tree),
    (AlgorithmSpec("star", "every rank sends to the root (depth 1)", (_ROOT, _ORDER, _CHUNKS, _RESULT)),
     _build_star),
    (AlgorithmSpec("chain", "each rank sends to the previous position (depth p - 1, pipelines best)",
                   (_ROOT, _ORDER, _CHUNKS, _RESULT)), _build_chain),
    (AlgorithmSpec("kary", "complete k-ary tree (fanout k, heap layout)",
                   (_ROOT, _ORDER, _FANOUT, _CHUNKS, _RESULT)), _build_kary),
    (AlgorithmSpec("binomial", "binomial tree (depth ceil(log2 p))", (_ROOT, _ORDER, _CHUNKS, _RESULT)),
     _build_binomial),
    (AlgorithmSpec("butterfly", "recursive-doubling all-reduce (non-powers of two fold the extra ranks in)",
                   (_ORDER, _CHUNKS), results=("all",)), _build_butterfly),
    (AlgorithmSpec("ring", "ring reduce-scatter then all-gather (p segments of `chunks` chunks each); "
                           "result heads: the reduce-scatter only",
                   (_ORDER, _CHUNKS, _P("result", "'all' or 'heads' (reduce-scatter only)")), results=("all", "heads")),
     _build_ring),
    (AlgorithmSpec("direct", "direct exchange: every rank sends its partial to every other and merges all it "
                             "receives (with groups: inside each group, then with its peers in the other groups)",
                   (_P("groups", "partition of the ranks: exchange inside each group first, then each rank with the "
                                 "rank at its position in every other group (nodes listed by rail: along rails)"),
                    _P("group_size", "instead of groups: consecutive ranks in groups of this size"), _CHUNKS,
                    _P("result", "'all' or 'heads' (every rank sends each other rank that rank's rows: no groups)")),
                   results=("all", "heads")), _build_direct),
    (AlgorithmSpec("hierarchical", "reduce inside each group to its leader, then across the leaders, then back",
                   (_P("groups", "partition of the ranks; the first rank of a group (or root) leads it"),
                    _P("group_size", "instead of groups: consecutive ranks in groups of this size"),
                    _P("intra", _SHAPE_HELP + " inside a group (default star)"),
                    _P("inter", _SHAPE_HELP + " across leaders (default binomial)"),
                    _ROOT, _FANOUT, _CHUNKS, _RESULT)), _build_hierarchical),
    (AlgorithmSpec("multirail", "rows split over several trees with different roots: chunk c uses tree c % T",
                   (_P("roots", "root of each tree (default: the first T positions; interior ranks of one tree "
                                "are then leaves of the next)"),
                    _P("trees", "T, the number of trees when roots are not given (default 2)"),
                    _P("parents", "instead of roots: one parent list per tree"),
                    _P("shape", _SHAPE_HELP + " of every tree (default binomial)"),
                    _ORDER, _FANOUT, _P("chunks", "row chunks per tree (the plan has T x chunks)")),
                   results=("all",)), _build_multirail),
    (AlgorithmSpec("double-binary", "NCCL's double binary tree (ncclGetDtree): two complementary binary trees over "
                                    "the positions; chunk c uses tree c % 2",
                   (_ORDER, _P("chunks", "row chunks per tree (the plan has 2 x chunks)")), results=("all",)),
     _build_double_binary),
    (AlgorithmSpec("broadcast", "pipelined broadcast of the root's buffer down a tree (raw payloads)",
                   (_ROOT, _ORDER, _P("shape", _SHAPE_HELP + " (default binomial)"), _FANOUT,
                    _P("parents", "instead of shape: a parent list"), _CHUNKS),
                   payloads=("raw",), results=("all",)), _build_broadcast),
    (AlgorithmSpec("allreduce3", "the paper's reference: allreduce max lse, sum num, sum den (library collectives)",
                   (_CHUNKS,), is_baseline=True, payloads=("attention",), results=("all",)), _build_allreduce3),
    (AlgorithmSpec("allreduce2", "allreduce max lse, then one library collective summing (w o, w): all-reduce, "
                                 "reduce-scatter (heads) or reduce (root)",
                   (_CHUNKS, _RESULT_LIB, _ROOT), is_baseline=True, payloads=("attention",)), _build_allreduce2),
    (AlgorithmSpec("allreduce", "one library collective (sum) of raw buffers, as nccl-tests runs it: all-reduce, "
                                "reduce-scatter (heads) or reduce (root)",
                   (_CHUNKS, _RESULT_LIB, _ROOT), is_baseline=True, payloads=("raw",)), _build_allreduce),
    (AlgorithmSpec("allgather-merge", "library all-gather of every partial, then a local merge (Star Attention)",
                   (_CHUNKS,), is_baseline=True, results=("all",)), _build_allgather_merge),
    (AlgorithmSpec("dcp-ag-rs", "vLLM decode context parallel: attend every head over the shard, all-gather lse, "
                                "reduce-scatter the corrected outputs",
                   (_LIB_CHUNKS, _HEADS), is_baseline=True, payloads=("attention",), results=("heads",)),
     _build_dcp_ag_rs),
    (AlgorithmSpec("dcp-a2a", "vLLM decode context parallel, all-to-all: partial outputs and lse exchanged by head, "
                              "merged locally",
                   (_LIB_CHUNKS, _HEADS), is_baseline=True, payloads=("attention",), results=("heads",)),
     _build_dcp_a2a),
    (AlgorithmSpec("ring-attention", "KV blocks rotate around the ring; each rank computes over every block, the "
                                     "attention over one block overlapping the next block's transfer",
                   (_ORDER, _CHUNKS, _P("overlap", "false: each transfer is a step of its own between computes")),
                   is_baseline=True, payloads=("attention",), results=("all",)), _build_ring_attention),
]

ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for spec, _ in _SPECS}
"""Every algorithm ``build`` knows, by stable name."""
_BUILDERS: dict[str, Callable[[_Args], Plan]] = {spec.name: fn for spec, fn in _SPECS}
