"""Memory: the most bytes a rank holds at once under a plan, and whether that fits its device.

Per rank, during one layer's decode step (``peak_bytes``):

* the KV cache it keeps: its shard of every layer (``layers x kv_bytes(r)``), resident the
  whole time;
* the query (B x Hq x D in the KV dtype) and the accumulator its partial is merged in (fp32
  rows whatever the wire's dtype: ``acc_row_bytes``);
* what its busiest step holds besides: the buffers its receives land in (a transfer's
  rows; a KV block; in an exchange its own partial as sent too; on a wire narrower than fp32
  each other chunk it sends, converted once), the KV blocks of other ranks
  it received and has not yet passed on and computed over (ring attention: the block in hand
  and the next one arriving), and what a
  collective needs: an all-gather of partials holds all p, an all-to-all of partials p
  pieces of the rank's own rows (of the rank that owns the most), the query's gather the whole
  query, the lse gather p lse vectors, the sum of (w o, w) a packed copy of the rows
  (a reduce-scatter's output too); the paper's all-reduces reduce one part at a time in
  place of a copy of it; a raw payload's all-reduce, reduce and even reduce-scatter sum in
  place (nothing), a padded reduce-scatter its p segments of the longest and its output, and
  an fp8 payload's sums their fp32 copies;
* on a narrow wire, the buffer the end-of-run rounding of copied rows uses, the longest run
  of them (``Plan.rounded_runs``) in the partial dtype.

``fits`` compares the worst rank against its device's ``mem_gb`` times a usable fraction
(``--mem-fraction``, default 0.9: the rest is the weights, activations and the runtime);
``weights_note`` says where a model preset's weights, evenly sharded, would not fit in the rest.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from treeattn.errors import InputError
from treeattn.plan.ir import (
    COLLECTIVE_FORMS,
    OpKind,
    Plan,
    collective_row_bytes,
    message_bytes,
    row_bytes,
    stacked_exchanges,
    widened,
    wire_converted,
)
from treeattn.topology.model import Topology
from treeattn.units import counted, format_size, format_sizes
from treeattn.workload import MODELS, Payload, Workload

__all__ = ["DEFAULT_MEM_FRACTION", "MemoryCheck", "peak_bytes", "rank_peak_bytes", "run_bytes", "gloo_copy_bytes",
           "kv_cache_bytes",
           "device_bytes", "check_kv_fits", "weights_note", "unknown_memory_note", "check_fraction", "memory_check"]

DEFAULT_MEM_FRACTION = 0.9


def kv_cache_bytes(payload: Payload, rank: int) -> int:
    """The KV cache ``rank`` keeps for every layer (0 for raw payloads)."""
    if not isinstance(payload, Workload):
        return 0
    return payload.cache_bytes(rank)


def _collective_bytes(plan: Plan, op) -> int:  # noqa: ANN001 - an ir.Op
    """Transient bytes a COLLECTIVE holds on a rank beside the accumulator."""
    w, p = plan.workload, plan.ranks
    share = message_bytes(plan, op)
    form = COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)]
    start, stop = plan.chunk_range(op.chunk)
    rows = stop - start
    out = 0
    for coll, what in form.calls:
        if plan.is_raw and coll != "allgather":
            out = max(out, _raw_sum_bytes(plan, op, coll, rows))
            continue
        if what == "q":
            out = max(out, share * p)  # the gathered query
            continue
        # a widened (fp8) reduction holds the fp32 copy beside its own buffer
        buf = rows * (collective_row_bytes(w, coll, what) + (row_bytes(w, what) if widened(w, coll, what) else 0))
        if coll == "allgather":
            out = max(out, buf * p)
        elif coll == "alltoall":  # p pieces of its own rows (the rank that owns the most)
            out = max(out, plan.alltoall_bytes(op.chunk, what))
        elif coll == "reducescatter":
            out = max(out, buf + -(-buf // p))
        else:
            out = max(out, buf)
    return out


def _raw_sum_bytes(plan: Plan, op, coll: str, rows: int) -> int:  # noqa: ANN001 - an ir.Op
    """What a raw payload's library sum of ``rows`` holds beside the accumulator
    (``exec.collectives``): nothing in place (an all-reduce, a reduce, a reduce-scatter of one
    chunk to its owner or of even segments into each rank's own rows); a padded
    reduce-scatter's input of p segments of the longest and its output; on fp8, which the
    library reduces through fp32 (``exec.comm``), the fp32 copies of what it sums and gets."""
    w = plan.workload
    row = w.row_bytes
    widen = 4 * row if widened(w, coll, "partial") else 0
    if coll != "reducescatter" or op.chunk is not None:
        return rows * widen
    n = max(b - a for a, b in plan.segments)
    padded = bool(plan.padded_runs)
    taken = len(plan.segments) * n if padded else rows  # what the library is handed
    return (taken + n) * (row * padded + widen)


def gloo_copy_bytes(plan: Plan, op) -> int:  # noqa: ANN001 - an ir.Op
    """The copy torch's gloo backend makes inside a COLLECTIVE's library calls, beside what the
    op holds (``rank_peak_bytes``): an all-gather gathers into a flat buffer of its own the size
    of its output, a reduce-scatter reduces a copy of its input; all-reduce, reduce, broadcast
    and all-to-all work in place (torch 2.13, two CPU ranks, an input of 64 MiB: the resident
    set rose 129.5, 66.1, and 2.1 MiB or less; ``exec.footprint`` counts it, and
    ``tests/distributed/test_exec_faults.py`` holds that count to what a run's ranks hold).
    NCCL makes none."""
    w, p = plan.workload, plan.ranks
    start, stop = plan.chunk_range(op.chunk)
    rows = stop - start
    out = 0
    for coll, what in COLLECTIVE_FORMS[(op.coll, op.reduce, op.part)].calls:
        if coll == "allgather":
            share = message_bytes(plan, op) if what == "q" else rows * collective_row_bytes(w, coll, what)
            out = max(out, p * share)
        elif coll == "reducescatter":
            handed = rows
            if plan.is_raw and op.chunk is None and plan.padded_runs:  # p segments of the longest
                handed = len(plan.segments) * max(b - a for a, b in plan.segments)
            out = max(out, handed * collective_row_bytes(w, coll, what))
    return out


def rank_peak_bytes(plan: Plan, rank: int) -> int:
    """The most bytes ``rank`` holds at once under ``plan`` (see the module docstring)."""
    w = plan.workload
    prog = plan.programs[rank]
    steps: dict[int, list] = {}
    for op in prog:
        steps.setdefault(op.step, []).append(op)
    order = sorted(steps)
    # Foreign KV blocks are held from the step they arrive until their last use (send or compute).
    arrive: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for s in order:
        for op in steps[s]:
            if op.block is None or op.block == rank:
                continue
            if op.kind is OpKind.RECV_COPY:
                arrive.setdefault(op.block, s)
            last_use[op.block] = max(last_use.get(op.block, s), s)
    delta: dict[int, int] = {}
    for b, a in arrive.items():
        delta[a] = delta.get(a, 0) + w.kv_bytes(b)
        end = max(a, last_use.get(b, a))
        i = bisect.bisect_right(order, end)
        if i < len(order):
            delta[order[i]] = delta.get(order[i], 0) - w.kv_bytes(b)
    peak = held = 0
    for s in order:
        held += delta.get(s, 0)
        # an exchange's stack also holds this rank's own partial as sent, once per chunk, and
        # on a narrower wire the other chunks it sends, once each, in their wire form
        exchanged = stacked_exchanges(plan, steps[s])
        sent = {}
        for op in steps[s]:
            if op.kind is OpKind.SEND and op.block is None:
                sent.setdefault(op.chunk, op)
        held_sent = [*exchanged, *wire_converted(plan, steps[s], exchanged)]
        extra = sum(message_bytes(plan, sent[c]) for c in held_sent)
        for op in steps[s]:
            if op.kind in (OpKind.RECV_MERGE, OpKind.RECV_COPY) and op.block is None:
                extra += message_bytes(plan, op)
            elif op.kind is OpKind.COLLECTIVE:
                extra += _collective_bytes(plan, op)
        peak = max(peak, held + extra)
    if plan.rounded_runs:  # the end-of-run rounding's buffer, held beside: o of its longest run
        peak += max(stop - start for start, stop in plan.rounded_runs) * w.value_dim * w.partial_dtype.nbytes
    q = w.query_bytes if isinstance(w, Workload) else 0
    return kv_cache_bytes(w, rank) + q + w.rows * w.acc_row_bytes + peak


def run_bytes(plan: Plan, rank: int) -> int:
    """What ``rank`` holds at least while ``treeattn run`` times ``plan``: its peak with one
    layer of KV cache, the one a run builds (``exec.footprint`` adds the run's checked results,
    its reference and gloo's copies)."""
    w = plan.workload
    other_layers = (w.layers - 1) * w.kv_bytes(rank) if isinstance(w, Workload) else 0
    return rank_peak_bytes(plan, rank) - other_layers


def peak_bytes(plan: Plan) -> int:
    """The most bytes any rank holds at once under ``plan``."""
    return max(rank_peak_bytes(plan, r) for r in range(plan.ranks))


def device_bytes(topo: Topology, rank: int) -> int:
    """Memory of ``rank``'s device (0: unknown, as hosts may leave ``mem_gb`` unset)."""
    return int(topo.rank_device(rank).mem_gb * 2**30)


@dataclass(frozen=True, slots=True)
class MemoryCheck:
    """A plan's peak against the memory its ranks may use."""

    peak_bytes: int
    """The worst rank's peak (``peak_bytes``)."""
    limit_bytes: int | None
    """That rank's device memory times the usable fraction; None when the device does not say."""
    rank: int
    """The rank closest to (or furthest past) its limit."""

    @property
    def fits(self) -> bool:
        return self.limit_bytes is None or self.peak_bytes <= self.limit_bytes

    def why(self) -> str:
        """One line: what does not fit, or empty."""
        if self.fits:
            return ""
        need, limit = format_sizes(self.peak_bytes, self.limit_bytes)
        return (f"needs {need} on rank {self.rank}, over the {limit} "
                "it may use")

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "limit_bytes": self.limit_bytes, "fits": self.fits}


def check_fraction(fraction: float) -> float:
    """``fraction`` (``--mem-fraction``), or ``InputError`` unless it is in (0, 1]."""
    if not 0 < fraction <= 1:
        raise InputError(f"--mem-fraction must be in (0, 1], got {fraction}")
    return fraction


def memory_check(plan: Plan, topo: Topology, fraction: float = DEFAULT_MEM_FRACTION) -> MemoryCheck:
    """``plan``'s peak per rank against its device's memory times ``fraction``."""
    fraction = check_fraction(fraction)
    worst: tuple[float, int, int, int | None] | None = None
    for r in range(plan.ranks):
        peak = rank_peak_bytes(plan, r)
        cap = device_bytes(topo, r)
        limit = int(cap * fraction) if cap > 0 else None
        key = peak / limit if limit else -1.0
        if worst is None or key > worst[0] or (key == worst[0] and peak > worst[1]):
            worst = (key, peak, r, limit)
    assert worst is not None
    return MemoryCheck(peak_bytes=worst[1], limit_bytes=worst[3], rank=worst[2])


def unknown_memory_note(payload: Payload, topo: Topology) -> str | None:
    """What to say where ``topo``'s GPU ranks give no memory size (``mem_gb`` 0, unknown): no
    schedule is checked against their memory, so a plan may need more than a GPU holds (a
    file's MI300X without ``mem_gb`` planned 512 GiB a rank unsaid); None where every GPU rank
    gives one, or ``payload`` is a raw payload."""
    if not isinstance(payload, Workload):
        return None
    gpus = [topo.rank_device(r) for r in range(topo.num_ranks)]
    unknown = sorted({d.model or d.name for d in gpus if d.kind.value == "gpu" and d.mem_gb <= 0})
    if not unknown:
        return None
    need = format_size(max(kv_cache_bytes(payload, r) for r in range(topo.num_ranks)))
    return (f"{topo.name} gives its {', '.join(unknown)} GPUs no mem_gb: no schedule was checked against their memory "
            f"(the KV cache alone is {need} on the busiest rank); give their mem_gb (GiB)")


def weights_note(payload: Payload, topo: Topology, fraction: float = DEFAULT_MEM_FRACTION, *,
                 option: str = "--mem-fraction", peak_bytes: int | None = None) -> str | None:
    """What to say where the model preset ``payload`` came from has weights that, sharded
    evenly over every rank (tensor parallelism's least), need more of a device than the
    ``1 - fraction`` the memory check leaves them and, where the plan is known, more than
    its ``peak_bytes`` (``memory_check``'s) leaves of ``fraction`` (the rest stays for
    activations, the CUDA context and the library's buffers: DeepSeek-V3's 78 GiB a GPU beside
    a 1 GiB plan fill an 80 GiB H100 to its last GiB); None where they fit, or the payload's
    shape (heads, head size, layers) is not a preset's or its devices do not say their memory.
    Where no fraction leaves room for both the weights and the KV cache, it says so rather
    than name a fraction the KV cache does not fit in. The check itself counts no weights:
    what they take depends on how the model is deployed."""
    preset = MODELS.get(payload.model) if isinstance(payload, Workload) and payload.model else None
    if (preset is None or not preset.params
            or (payload.q_heads, payload.kv_heads, payload.head_dim, payload.layers)
            != (preset.q_heads, preset.kv_heads, preset.head_dim, preset.layers)):
        return None  # another shape (--layers too: its weights are not the preset's count)
    caps = [device_bytes(topo, r) for r in range(topo.num_ranks)]
    cap = min((c for c in caps if c > 0), default=0)
    whole = preset.params * preset.weight_dtype.nbytes
    share = whole / topo.num_ranks
    if cap == 0 or share <= cap * (1 - fraction) or (peak_bytes is not None and share + peak_bytes <= cap * fraction):
        return None
    kind = "GPU" if all(topo.rank_device(r).kind.value == "gpu" for r in range(topo.num_ranks)) else "rank"
    weights = (f"{preset.name}'s weights ({preset.params / 1e9:.3g} B parameters in {preset.weight_dtype.value}, "
               f"{format_size(int(whole))}: {format_size(int(share))} a {kind} sharded over "
               f"{counted(topo.num_ranks, 'rank')})")
    most = math.floor((cap - share) / cap * 100) / 100
    if most < 0.05:
        return (f"{weights} leave no room for the KV cache on a {kind} ({format_size(cap)}): more ranks, or "
                "weights in fewer bytes")
    # the fraction named must still hold each rank's KV cache (check_kv_fits), on every device
    full = max((r for r, c in enumerate(caps) if c > 0), key=lambda r: kv_cache_bytes(payload, r) / caps[r])
    if kv_cache_bytes(payload, full) > caps[full] * most:
        kv, dev = format_sizes(kv_cache_bytes(payload, full), caps[full])
        return (f"{weights} and rank {full}'s KV cache ({kv}) need more than its {kind}'s {dev}: more ranks, a "
                "shorter sequence or a smaller batch, or weights in fewer bytes")
    room = f"{option} {most:g} at most leaves them room (activations besides)"
    if peak_bytes is not None and share + peak_bytes > cap:
        need, dev = format_sizes(peak_bytes, cap)
        return (f"{weights} and the plan's peak ({need} a {kind}) need more than a {kind}'s {dev}: more ranks, a "
                "shorter sequence or a smaller batch, or weights in fewer bytes")
    if peak_bytes is not None:
        need, usable = format_sizes(peak_bytes, int(cap * fraction))
        if peak_bytes > cap * most:  # the fraction that leaves the weights room, to 0.01, holds not the peak
            left, dev = format_sizes(int(cap - share - peak_bytes), cap)
            return (f"{weights} and the plan's peak ({need} a {kind}) leave {left} of a {kind}'s {dev}, for "
                    "activations, the CUDA context and the library's buffers: more ranks, a shorter sequence or a "
                    "smaller batch, or weights in fewer bytes")
        return (f"{weights} and the plan's peak ({need} a {kind}) need more than the {usable} {option} {fraction:g} "
                f"lets a {kind} use: {room}")
    if fraction >= 1:
        return f"{weights} get no room: {option} 1 gives the whole {kind} to the KV cache and the merge; {room}"
    return (f"{weights} need more than the {format_size(int(cap * (1 - fraction)))} a {kind} {option} {fraction:g} "
            f"leaves beside the KV cache and the merge: {room}")


def _largest_kv(payload: Workload, topo: Topology) -> tuple[int, int, str]:
    """The largest KV cache a rank holds, its device's memory (0: unknown) and what the
    device is (``GPU`` or ``rank``)."""
    worst = max(range(topo.num_ranks), key=lambda r: (kv_cache_bytes(payload, r), -r))
    kind = "GPU" if topo.rank_device(worst).kind.value == "gpu" else "rank"
    return kv_cache_bytes(payload, worst), device_bytes(topo, worst), kind


def kv_overflow(payload: Payload, topo: Topology) -> str | None:
    """What a rank's KV cache needs where it is more than its whole device holds (``simulate``
    of a plan on another topology, which no memory check chose), else None."""
    if not isinstance(payload, Workload):
        return None
    need, cap, kind = _largest_kv(payload, topo)
    if not 0 < cap < need:
        return None
    needed, has = format_sizes(need, cap)
    return f"needs {needed} of KV per {kind} ({counted(payload.layers, 'layer')}); {topo.name} has {has} per {kind}"


def check_kv_fits(payload: Payload, topo: Topology, fraction: float = DEFAULT_MEM_FRACTION, *,
                  option: str = "--mem-fraction") -> None:
    """Raise ``InputError`` when even a rank's KV cache exceeds what its device may hold: no
    merge schedule can help then.

    The message names what is needed and what the device has, e.g. ``needs 2.7 TiB of KV per
    GPU; dgx-h100 has 80 GiB per GPU (72 GiB usable at --mem-fraction 0.9)``; ``option`` is
    the fraction's name where the caller took it (the API's ``mem_fraction``).
    """
    fraction = check_fraction(fraction)
    if not isinstance(payload, Workload):
        return
    need, cap, kind = _largest_kv(payload, topo)
    if cap > 0 and need > cap * fraction:
        needed, usable = format_sizes(need, int(cap * fraction))
        raise InputError(f"needs {needed} of KV per {kind} ({counted(payload.layers, 'layer')}); "
                         f"{topo.name} has {format_size(cap)} per {kind} ({usable} usable at "
                         f"{option} {fraction:g}): use more ranks, a shorter sequence or a smaller batch")
