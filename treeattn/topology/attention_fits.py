"""Decode attention as published kernels run it, by GPU product: a fixed cost per call and a
share of memory bandwidth, fitted to their timings (results/published/attention,
docs/attention-model.md): Flash-Decoding on A100 (PyTorch blog "Flash-Decoding for
long-context inference"; onnxruntime pull 20646's GroupQueryAttention node, held out of the
fit, checks it), FlashAttention-2/3 paged decode on H100 (onnxruntime pull 21414,
Dao-AILab/flash-attention issue 1572), FlashInfer trtllm-gen on B200 (flashinfer-ai/flashinfer
pull 1415). The families carry them, `treeattn probe` writes them for the GPUs they were
fitted on (the same generation's HBM parts), and a topology whose ``cost`` leaves one of them
unset takes its GPUs' figure for it (``applied_attention_fit``): the same GPUs time the same in a
family and in a hand-written file. Other GPUs (MI300X, RTX 4090, V100, L40S) keep ``launch_us`` and
``mem_efficiency``: no published timing with every shape term stated, but for four MI300X rows
of three kernels (composable_kernel pull 1789; FlashInfer+ROCm's fa2 and AITER), each
kernel's too few to fix a line, at 1.4-6.9 times the defaults' time (held out, scored)."""

from __future__ import annotations

import re

from treeattn.topology.model import CostParams, DeviceKind, Topology
from treeattn.topology.schema import CostSpec

__all__ = ["ATTN_AMPERE", "ATTN_HOPPER", "ATTN_BLACKWELL", "applied_attention_fit", "attention_by_defaults",
           "fitted_figures", "published_attention_fit", "unfitted_attention_note", "why_unfitted"]

ATTN_AMPERE = CostSpec(attn_launch_us=13.9, attn_efficiency=0.72)
ATTN_HOPPER = CostSpec(attn_launch_us=12.4, attn_efficiency=0.56)
ATTN_BLACKWELL = CostSpec(attn_launch_us=6.9, attn_efficiency=0.80)

# GPU model names by prefix (treeattn.probe.hardware's canonical names, or as a file writes
# them: "H100", "A100-SXM4-80GB"): the parts the fits describe, and their variants with the same
# memory system (A800, H800, GH200's H100 with HBM3e).
_BY_PREFIX: tuple[tuple[tuple[str, ...], str, CostSpec], ...] = (
    (("A100", "A800"), "A100 (Ampere)", ATTN_AMPERE),
    (("H100", "H200", "H800", "GH200"), "H100 (Hopper)", ATTN_HOPPER),
    (("B200", "GB200", "B100"), "B200 (Blackwell)", ATTN_BLACKWELL),
)


# Published decode timings on GPUs no fit covers, too few to fit, held out and scored
# (results/published/attention): what they say of the defaults, by GPU model prefix.
UNFITTED_EVIDENCE: dict[str, str] = {
    "MI300X": "the published MI300X decode kernels (composable_kernel pull 1789's example, FlashInfer+ROCm's fa2 and "
              "AITER's paged attention through it) took 1.4-6.9 times what these figures give, at 0.12-0.59 of the "
              "memory bandwidth",
}


def _is_product(model: str, prefix: str) -> bool:
    """Whether a GPU model name is product ``prefix``'s: the vendor's words put first (nvidia-smi's
    ``NVIDIA H100 80GB HBM3``, rocm-smi's ``AMD Instinct MI300X``, however joined: ``AMD-Instinct-
    MI300X``) do not count, and the product number must end there (``H1000`` is no H100)."""
    words = re.sub(r"[^0-9A-Z]+", " ", model.upper()).split()
    while words[:1] and words[0] in ("NVIDIA", "AMD", "INSTINCT"):
        words.pop(0)
    bare = " ".join(words)
    return bare.startswith(prefix) and not bare[len(prefix):len(prefix) + 1].isalnum()


def published_attention_fit(model: str) -> tuple[str, CostSpec] | None:
    """(which fit, its cost fields) for a GPU model name (``_is_product``), or None when none
    was fitted on it."""
    for prefixes, name, spec in _BY_PREFIX:
        if any(_is_product(model, prefix) for prefix in prefixes):
            return name, spec
    return None


def _sets_attention(topo: Topology) -> bool:
    c = topo.cost
    return any(v is not None for v in (c.attn_launch_us, c.attn_efficiency, c.attn_gbps))


def applied_attention_fit(topo: Topology) -> tuple[str, CostSpec] | None:
    """(which fit, its cost fields) that gives ``topo``'s attention figures its ``cost`` leaves
    unset (``attn_launch_us``; ``attn_efficiency`` unless a measured ``attn_gbps`` is set):
    where every rank is on a GPU that one fit covers; None otherwise (a GPU no fit covers,
    ranks on hosts, GPUs of two fits)."""
    kinds = {(d.kind, d.model or "") for d in (topo.rank_device(r) for r in range(topo.num_ranks))}
    fits = set()
    for kind, model in kinds:
        fit = published_attention_fit(model) if kind is DeviceKind.GPU else None
        if fit is None:
            return None
        fits.add(fit)
    return fits.pop() if len(fits) == 1 else None


def fitted_figures(topo: Topology) -> dict[str, float]:
    """The attention figures ``topo`` takes from its GPUs' published fit (``applied_attention_fit``),
    by cost field: those its ``cost`` leaves unset (``attn_efficiency`` only without a measured
    ``attn_gbps``, which wins); empty where no fit applies."""
    fit = applied_attention_fit(topo)
    if fit is None:
        return {}
    c = topo.cost
    out = {}
    if c.attn_launch_us is None:
        out["attn_launch_us"] = fit[1].attn_launch_us
    if c.attn_efficiency is None and c.attn_gbps is None:
        out["attn_efficiency"] = fit[1].attn_efficiency
    return out


def attention_by_defaults(topo: Topology) -> bool:
    """Whether ``topo``'s GPUs time decode attention by the merge kernels' ``launch_us`` and
    ``mem_efficiency``: ranks on GPUs (some ranks on hosts too), no attention figure in its
    ``cost`` and no published fit that applies (``applied_attention_fit``)."""
    gpus = any(topo.rank_device(r).kind is DeviceKind.GPU for r in range(topo.num_ranks))
    return gpus and not _sets_attention(topo) and applied_attention_fit(topo) is None


def why_unfitted(topo: Topology) -> str:
    """Why no published fit times ``topo``'s attention (``applied_attention_fit`` is None), in words."""
    devices = [topo.rank_device(r) for r in range(topo.num_ranks)]
    models = sorted({d.model or "its GPU" for d in devices if d.kind is DeviceKind.GPU})
    unfitted = [m for m in models if published_attention_fit(m) is None]
    if unfitted:
        return f"no published decode kernel on {', '.join(unfitted)} was fitted"
    if any(d.kind is not DeviceKind.GPU for d in devices):
        return "its ranks are not all on GPUs, and a published fit is a GPU's"
    # GPUs of two fitted generations: one topology times one attention kernel
    return f"its GPUs ({', '.join(models)}) take different published fits"


def unfitted_attention_note(topo: Topology) -> str | None:
    """What to say where ``topo``'s GPUs time decode attention by the defaults (``launch_us``,
    ``mem_efficiency``: 5 us a call, 0.8 of memory bandwidth), no fitted figure in its ``cost``:
    beside a fitted GPU's (Hopper's 12.4 us, 0.56) such times flatter it (8 x MI300X ran 70B at
    128K in 40 us a layer to 8 x H100's 71); None where the figures are set, a fit applies
    (``applied_attention_fit``), or the ranks are not GPUs."""
    if not attention_by_defaults(topo):
        return None
    c = topo.cost
    times = (f"{topo.name} times decode attention by the merge kernels' figures, launch_us {c.launch_us:g} us a call "
             f"and mem_efficiency {c.mem_efficiency:g} of memory bandwidth")
    why = why_unfitted(topo)
    if why.startswith("no published"):
        models = {topo.rank_device(r).model or "" for r in range(topo.num_ranks)}
        # the evidence's ratio is of the defaults' time: a topology that sets other figures is not it
        plain = CostParams()
        defaults = (c.launch_us, c.mem_efficiency) == (plain.launch_us, plain.mem_efficiency)
        seen = sorted({said for prefix, said in UNFITTED_EVIDENCE.items() for m in models
                       if defaults and _is_product(m, prefix)})
        return (f"{times}: {why}, so its attention may look faster than a fitted GPU's ({'; '.join(seen + [''])}"
                "docs/attention-model.md; treeattn calibrate --compute attention measures one)")
    return f"{times}: {why}; set cost.attn_launch_us and cost.attn_efficiency (docs/attention-model.md)"
