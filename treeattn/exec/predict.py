"""Predicted times for what a run measures: the simulator on the plan and on the baselines'
plans (``treeattn.plan.baselines.baselines_for`` the plan's result layout, ring attention on
the topology's ring), on the plan's topology, so every measured row has its prediction beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from treeattn.errors import InputError, TreeattnError
from treeattn.plan.baselines import Baseline, baselines_for, parse_result
from treeattn.plan.ir import Plan, TopologyRef
from treeattn.topology.model import Topology
from treeattn.workload import Workload

__all__ = ["Predictions", "resolve_topology", "predict", "plan_baselines", "comparability", "latent_on_cpu_note",
           "default_timeout_s", "TIMEOUT_FACTOR"]

TIMEOUT_FACTOR = 10.0
"""Without ``--timeout``, an operation may wait this many times the slowest predicted method's
whole iteration (any one wait is part of it), so that long contexts (ring attention rotating
its KV blocks) do not hit a fixed limit."""


@dataclass(slots=True)
class Predictions:
    """Predicted µs per method (None where the simulator or a builder is unavailable)."""

    topology: str
    """Name of the topology predicted on."""
    us: dict[str, float | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    calibrated: bool = False
    """Whether the topology's figures were fitted by ``treeattn calibrate``."""


def resolve_topology(plan: Plan, given: str | None,
                     plan_path: Path | None = None) -> tuple[Topology | None, list[str]]:
    """The topology to predict on: ``given`` (name or file), else the one the plan records
    (``TopologyRef.source`` or its name), fingerprint checked; never another one silently.

    Args:
        plan: the plan run.
        given: ``--topology`` (preset name or YAML file), or None.
        plan_path: the plan's file (a recorded topology file is relative to its folder).

    Returns:
        The topology (None when the plan's is not found: no predictions) and warnings, which
        say what to pass when it is not found and when ``given`` is another topology.

    Raises:
        InputError: ``given`` places another number of ranks than the plan runs on.
    """
    warnings: list[str] = []
    from treeattn.topology.library import resolve, resolve_recorded

    want = plan.topology
    if given is not None:
        topo = resolve(given)  # a wrong name or file is the user's error: let it raise
    else:
        try:
            topo = resolve_recorded(want.name, want.fingerprint, want.source, plan_path,
                                    what=str(plan_path) if plan_path is not None else "the plan", ranks=plan.ranks)
        except InputError as exc:
            return None, [f"{exc}; no predictions"]
    if topo.fingerprint != want.fingerprint:
        warnings.append(
            f"plan was made for topology {want.name!r} ({want.fingerprint}) but is predicted on "
            f"{topo.name!r} ({topo.fingerprint}); predictions may not match"
        )
    if topo.num_ranks != plan.ranks:
        if given is not None:  # asked for by the user: a mistake to say before anything runs
            raise InputError(f"--topology {given!r} has {topo.num_ranks} ranks but the plan runs on {plan.ranks}; "
                             "pass a topology of the plan's ranks, or none (the plan's own)")
        warnings.append(f"topology {topo.name!r} has {topo.num_ranks} ranks, the plan {plan.ranks}: "
                        "predictions skipped")
        return None, warnings
    return topo, warnings


def comparability(topo: Topology | None, spec: str, backend: str | None,
                  raw: bool = False) -> tuple[list[str], list[str]]:
    """What to know before reading predicted against measured, said before the run: a warning
    when the predictions are for another kind of machine, else a note when they are on
    figures not fitted to this one.

    Args:
        topo: the topology predicted on (None: nothing is predicted, nothing to say).
        spec: how the user can name it (for the ``treeattn calibrate`` hint).
        backend: ``--backend`` (None: nccl where CUDA is, else gloo), which says where ranks run.
        raw: the plan reduces a raw payload (its kernel, to calibrate, is the sum).

    Returns:
        (warnings, notes).
    """
    if topo is None:
        return [], []
    if topo.on_gpus != ranks_on_gpus(backend):
        made, runs = ("a GPU machine", "CPU processes (gloo)") if topo.on_gpus else ("CPU ranks", "GPUs (nccl)")
        return [f"predictions are for {topo.name!r}, {made}, but these ranks run on {runs}: predicted and "
                "measured times are not comparable here; predict on this machine with --topology (a "
                "`treeattn calibrate --out` file, or cpu:ranks=N)"], []
    if not topo.calibrated:
        from treeattn.cost.library import uncalibrated_note

        return [], [uncalibrated_note(topo, spec, raw)]
    return [], []


def latent_on_cpu_note(plan: Plan, topo: Topology | None) -> str | None:
    """A warning where ``plan`` is an MLA workload (``kv_latent``) predicted on CPU ranks: its
    attention does 2 Hq (D + Dv) FLOPs a token of cache, about 240 a byte for DeepSeek's 128
    heads, where the grouped-query shapes the attention line is fitted on do at most 16; the
    model times attention by its bytes (no FLOP term, docs/attention-model.md), and on a CPU
    such a kernel is arithmetic-bound. None elsewhere."""
    w = plan.workload
    if topo is None or topo.on_gpus or not isinstance(w, Workload) or not w.kv_latent:
        return None
    per_byte = 2 * w.q_heads * (w.head_dim + w.value_dim) / (w.kv_heads * w.head_dim * w.kv_dtype.nbytes)
    return (f"an MLA workload's attention does {per_byte:.0f} FLOPs a byte of its cache ({w.q_heads} query heads "
            f"over a latent of {w.head_dim}); predictions time attention by its bytes alone, and on CPU ranks "
            "such a kernel is arithmetic-bound: expect the measured times far above the predicted ones (calibrate "
            "does not fix it)")


def ranks_on_gpus(backend: str | None) -> bool:
    """Whether this machine's ranks run on GPUs: ``--backend`` nccl, or none given where CUDA is."""
    import torch

    return (backend or ("nccl" if torch.cuda.is_available() else "gloo")) == "nccl"


def default_timeout_s(predictions: Predictions | None, floor_s: float) -> float:
    """Seconds an operation may wait when the user gave no ``--timeout``: ``TIMEOUT_FACTOR``
    times the slowest predicted method, at least ``floor_s`` (also when nothing is predicted)."""
    known = [us for us in (predictions.us.values() if predictions is not None else ()) if us]
    return max(floor_s, TIMEOUT_FACTOR * max(known, default=0.0) / 1e6)


def _simulate(plan: Plan, topo: Topology) -> float:
    from treeattn.cost.simulate import simulate

    return float(simulate(plan, topo, timeline=False).predicted_us)


def plan_baselines(plan: Plan, topo: Topology | None) -> tuple[list[Baseline], tuple[int, ...] | None]:
    """The baselines of ``plan``'s payload and result layout, and the ring ring attention runs
    on (``treeattn.search.rings.ring_order`` of ``topo``; None without a topology: rank order)."""
    ring = None
    if topo is not None and topo.num_ranks == plan.ranks and not plan.is_raw:
        from treeattn.search.rings import ring_order

        ring = tuple(ring_order(topo)[1])
    result = plan.result
    layout, root = ("all", None) if result.startswith("ranks:") else parse_result(result, plan.ranks)
    return baselines_for(plan.workload, layout, root, ring), ring


def predict(plan: Plan, topo: Topology | None, baselines: list[Baseline] | tuple[Baseline, ...] = ()) -> Predictions:
    """Simulate ``plan`` and each baseline's builder plan on ``topo``.

    Args:
        plan: the plan run.
        topo: from ``resolve_topology`` (None: every prediction is None).
        baselines: the baselines run beside it (``plan_baselines``).

    Returns:
        ``Predictions`` keyed by method (``plan`` and the baselines' names).
    """
    out = Predictions(topology=topo.name if topo is not None else plan.topology.name,
                      calibrated=topo is not None and topo.calibrated)
    out.us = {m: None for m in ("plan", *(b.name for b in baselines))}
    if topo is None:
        return out
    try:
        out.us["plan"] = _simulate(plan, topo)
    except ImportError:
        out.warnings.append("no simulator (treeattn.cost.simulate): predictions skipped")
        return out
    except TreeattnError as exc:
        out.warnings.append(f"cannot simulate the plan: {exc}")
    from treeattn.plan.builders import build

    for b in baselines:
        try:
            out.us[b.name] = _simulate(build(b.name, plan.workload, TopologyRef.of(topo), **b.kwargs), topo)
        except TreeattnError as exc:
            out.warnings.append(f"cannot predict baseline {b.name}: {exc}")
    return out
