"""Deterministic inputs, local attention partials and the exact single-process reference.

Legend: B batch, Hq query heads, Hkv KV heads, G = Hq / Hkv query heads per KV head, D head
dim, Dv value head dim, N_i tokens of rank i. q is ``(B, Hq, D)``; a KV shard is one tensor so
it travels as one message (``kv_shape``): ``(2, B, Hkv, N_i, D)``, K then V, where Dv = D;
``(1, B, Hkv, N_i, D + Dv)``, K beside V, where they differ; ``(1, B, Hkv, N_i, D)``, the
latents, for MLA (``kv_latent``: V is their first Dv values). Query head h reads KV head h // G.

Inputs are drawn on the device that uses them, from a generator on that device seeded by
(seed, what, rank): q from one seed (the same on every rank), rank i's KV shard and raw buffer
from seeds of their own. The same seed gives the same numbers on the same kind of device
(a CPU and a GPU draw differently, as do GPU models with other core counts), so the check
never rebuilds another rank's inputs: ``treeattn.exec.reference`` computes it from the
inputs themselves.
"""

from __future__ import annotations

import hashlib
import math

import torch

from treeattn.errors import InputError
from treeattn.exec.merge import empty_partial, merge_into, pack, pack_heads, unpack
from treeattn.units import DType
from treeattn.workload import RawPayload, Workload

__all__ = [
    "KERNELS",
    "torch_dtype",
    "sub_seed",
    "shard_offsets",
    "make_query",
    "kv_shape",
    "make_kv_shard",
    "split_kv",
    "partial_attention",
    "attention_partial",
    "make_raw",
    "resolve_kernel",
    "choose_kernel",
]

KERNELS = ("auto", "explicit", "sdpa", "sdpa-flash", "sdpa-efficient", "flash-attn")
"""``explicit``: matmuls in fp32 (reference quality; the math kernel); ``sdpa``: torch's fused
attention op that returns the log-sum-exp: on the CPU its flash op, on CUDA ``sdpa-flash``
(sm80 and later, 16-bit KV) or else ``sdpa-efficient`` (the memory-efficient op); both
accumulate in fp32 and round the output to the KV dtype; ``flash-attn``: the flash-attn
package on CUDA (sm80 and later); ``auto``: see ``choose_kernel``."""

_TORCH_DTYPES = {
    DType.FP32: torch.float32,
    DType.BF16: torch.bfloat16,
    DType.FP16: torch.float16,
    DType.FP8: torch.float8_e4m3fn,
}


def torch_dtype(dtype: DType | str) -> torch.dtype:
    """The torch element type of a treeattn ``DType`` (fp8 is e4m3)."""
    return _TORCH_DTYPES[DType.parse(dtype)]


def sub_seed(seed: int, *path: object) -> int:
    """A 63-bit seed derived from ``seed`` and a path of labels (stable across runs)."""
    text = ":".join(str(p) for p in (seed, *path)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def _randn(shape: tuple[int, ...], seed: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """Normal values of ``dtype`` drawn on ``device`` (fp8 drawn in fp16 and rounded)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    draw = torch.float16 if dtype.itemsize == 1 else dtype
    out = torch.randn(shape, generator=gen, dtype=draw, device=device)
    return out if draw == dtype else out.to(dtype)


def shard_offsets(split: tuple[int, ...]) -> tuple[int, ...]:
    """First token of each rank's shard in the full sequence."""
    out, acc = [], 0
    for n in split:
        out.append(acc)
        acc += n
    return tuple(out)


def make_query(workload: Workload, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """q ``(B, Hq, D)`` in the KV dtype, identical on every rank (of one device kind) for one seed."""
    w = workload
    return _randn((w.batch, w.q_heads, w.head_dim), sub_seed(seed, "q"), device, torch_dtype(w.kv_dtype))


def kv_shape(workload: Workload, tokens: int) -> tuple[int, ...]:
    """The shape of a KV block of ``tokens`` tokens (module docstring): its elements are
    ``workload.kv_bytes`` of such a block over the KV dtype's size."""
    w = workload
    if w.kv_latent:
        return 1, w.batch, w.kv_heads, tokens, w.head_dim
    if w.value_dim != w.head_dim:
        return 1, w.batch, w.kv_heads, tokens, w.head_dim + w.value_dim
    return 2, w.batch, w.kv_heads, tokens, w.head_dim


def split_kv(kv: torch.Tensor, head_dim: int, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K ``(B, Hkv, N, D)`` and V ``(B, Hkv, N, Dv)``: views of a block of ``kv_shape``."""
    if kv.shape[0] == 2:
        return kv[0], kv[1]
    if kv.shape[-1] == head_dim:  # latents: V is their first Dv values
        return kv[0], kv[0][..., :value_dim]
    return kv[0][..., :head_dim], kv[0][..., head_dim:]


def make_kv_shard(workload: Workload, rank: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s KV shard (``kv_shape``; N_rank may be 0), drawn on ``device`` from the
    rank's own seed: it depends on (seed, rank, its shape) only."""
    w = workload
    return _randn(kv_shape(w, w.split[rank]), sub_seed(seed, "kv", rank), device, torch_dtype(w.kv_dtype))


def choose_kernel(kernel: str, device_type: str, kv_dtype: DType | str, head_dim: int,
                  capability: tuple[int, int] | None = None, flash_attn: bool = False,
                  value_dim: int | None = None) -> str:
    """The concrete kernel ``kernel`` names, from what the device can run (no device needed).

    ``auto`` on CUDA: flash-attn where importable on sm80+ with 16-bit KV, else torch's flash
    op (``sdpa-flash``: sm80+, 16-bit KV), else its memory-efficient op (``sdpa-efficient``:
    fp16 and fp32 KV on any CUDA device, bf16 on sm80+), else the explicit matmuls (the math
    kernel: fp8 KV, a head dim the fused ops do not take). On the CPU: torch's flash op
    (``sdpa``) for fp32/bf16/fp16 KV, else explicit.

    Args:
        kernel: one of ``KERNELS``.
        device_type: ``cpu`` or ``cuda``.
        kv_dtype: the KV dtype.
        head_dim: D (the fused ops take multiples of 8 up to 256).
        capability: the CUDA device's compute capability (major, minor).
        flash_attn: whether the flash-attn package imports.
        value_dim: Dv (None: D); the fused ops take Dv = D only.

    Raises:
        InputError: an unknown name, or a kernel the device or dtype cannot run.
    """
    if kernel not in KERNELS:
        raise InputError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    dtype = DType.parse(kv_dtype)
    half = dtype in (DType.BF16, DType.FP16)
    same_dims = value_dim in (None, head_dim)
    shape_ok = head_dim % 8 == 0 and head_dim <= 256 and same_dims
    if device_type != "cuda":
        options = ["sdpa"] if dtype is not DType.FP8 and same_dims and _sdpa_op(False) is not None else []
    else:
        sm80 = capability is not None and capability >= (8, 0)
        options = []
        if flash_attn and sm80 and half and shape_ok:
            options.append("flash-attn")
        if sm80 and half and shape_ok:
            options.append("sdpa-flash")
        if shape_ok and (dtype in (DType.FP16, DType.FP32) or (dtype is DType.BF16 and sm80)):
            options.append("sdpa-efficient")
    options.append("explicit")
    if kernel == "auto":
        return options[0]
    if kernel == "sdpa" and device_type == "cuda":
        fused = [k for k in options if k.startswith("sdpa-")]
        if fused:
            return fused[0]
    if kernel not in options:
        where = "CUDA" if device_type == "cuda" else "the CPU"
        cap = f" (sm{capability[0]}{capability[1]})" if device_type == "cuda" and capability else ""
        dims = f"head dim {head_dim}" if same_dims else f"head dims {head_dim} (K) and {value_dim} (V)"
        raise InputError(f"kernel {kernel} does not take {dtype.value} KV with {dims} on {where}{cap}; "
                         f"this device runs {', '.join(options)}")
    return kernel


def resolve_kernel(kernel: str, device: torch.device | str, kv_dtype: DType | str = DType.BF16,
                   head_dim: int = 128, value_dim: int | None = None) -> str:
    """``choose_kernel`` for ``device`` (its capability read from the driver)."""
    dev = torch.device(device)
    cap = None
    if dev.type == "cuda" and torch.cuda.is_available():
        cap = torch.cuda.get_device_capability(dev)
    return choose_kernel(kernel, dev.type, kv_dtype, head_dim, cap, _flash_attn() is not None, value_dim)


def _sdpa_op(cuda: bool):  # noqa: ANN202 - the aten op or None
    name = "_scaled_dot_product_flash_attention" if cuda else "_scaled_dot_product_flash_attention_for_cpu"
    return getattr(torch.ops.aten, name, None)


_FLASH_ATTN: list = []
"""The flash-attn function or None, once looked up (a failed import costs ~0.1 ms each time)."""


def _flash_attn():  # noqa: ANN202 - the optional module or None
    if not _FLASH_ATTN:
        try:
            from flash_attn import flash_attn_func  # type: ignore[import-not-found]
        except ImportError:
            flash_attn_func = None
        _FLASH_ATTN.append(flash_attn_func)
    return _FLASH_ATTN[0]


def partial_attention(q: torch.Tensor, kv: torch.Tensor, kernel: str = "explicit",
                      value_dim: int | None = None) -> torch.Tensor:
    """One rank's partial (o_i, lse_i) over its KV, packed ``(Hq * B, Dv + 1)`` fp32.

    Args:
        q: ``(B, Hq, D)``.
        kv: a block of ``kv_shape``; N = 0 gives the empty partial (0, -inf).
        kernel: a concrete kernel name (see ``KERNELS``; resolve ``auto`` first, with the
            value dim: the fused kernels take Dv = D only).
        value_dim: Dv (None: D).

    Returns:
        The packed partial, rows head-major (row = h * B + b).
    """
    bsz, hq, d = q.shape
    dv = d if value_dim is None else value_dim
    if kv.shape[3] == 0:
        return empty_partial(bsz * hq, dv, q.device)
    k, v = split_kv(kv, d, dv)
    o, lse = _attend(q, k, v, kernel, 1.0 / math.sqrt(d))
    return pack_heads(o, lse)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str,
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o ``(B, Hq, Dv)``, lse ``(B, Hq)`` fp32) of decode attention over N >= 1 tokens; o is
    fp32 for ``explicit``, the KV dtype for the fused kernels (which take Dv = D only)."""
    bsz, hq, d = q.shape
    dv = v.shape[-1]
    hkv = k.shape[1]
    g = hq // hkv
    if kernel in ("sdpa", "sdpa-flash", "sdpa-efficient"):
        # GQA decode as attention with G queries per KV head: (B, Hkv, G, D) against (B, Hkv, N, D).
        qg = q.reshape(bsz, hkv, g, d).to(k.dtype)
        if kernel == "sdpa-efficient":
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(qg, k, v, None, True, scale=scale)[:2]
            lse = lse[..., :g]  # padded to a multiple of 32 queries
        else:
            out, lse = _sdpa_op(kernel == "sdpa-flash")(qg, k, v, 0.0, False, scale=scale)[:2]
        return out.reshape(bsz, hq, d), lse.reshape(bsz, hq).float()
    if kernel == "flash-attn":
        fn = _flash_attn()
        out, lse, _ = fn(q.reshape(bsz, 1, hq, d).to(k.dtype), k.transpose(1, 2), v.transpose(1, 2),
                         softmax_scale=scale, return_attn_probs=True)
        return out.reshape(bsz, hq, d), lse.reshape(bsz, hq).float()
    o, lse = _explicit(q.reshape(bsz, hkv, g, d).float(), k, v, scale)
    return o.reshape(bsz, hq, dv), lse.reshape(bsz, hq)


EXPLICIT_BLOCK_BYTES = 64 << 20
"""The explicit kernel's fp32 working set (K and V rows, scores, probabilities) per block of
tokens: an fp32 copy of a whole shard's keys or values is twice an fp8 shard, more than the
memory a plan leaves free (``--mem-fraction``), and no plan's memory check counts it."""


def _explicit(qf: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              block_bytes: int = EXPLICIT_BLOCK_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 matmul attention of ``qf (B, Hkv, G, D)`` over ``k`` ``(B, Hkv, N >= 1, D)`` and
    ``v`` ``(B, Hkv, N, Dv)``, block by block of tokens, each block's partial merged into the
    others with the merge a plan applies across ranks (``merge_into``): (o ``(B, Hkv, G, Dv)``,
    lse ``(B, Hkv, G)``)."""
    bsz, hkv, g, d = qf.shape
    dv = v.shape[-1]
    step = max(1, block_bytes // (4 * bsz * hkv * (d + dv + 2 * g)))

    def block(start: int) -> tuple[torch.Tensor, torch.Tensor]:  # its fp32 copies die on return
        scores = torch.matmul(qf, k[:, :, start:start + step].float().transpose(-1, -2))
        scores.mul_(scale)  # (B, Hkv, G, tokens)
        lse_b = torch.logsumexp(scores, dim=-1)
        return torch.matmul(scores.sub_(lse_b.unsqueeze(-1)).exp_(), v[:, :, start:start + step].float()), lse_b

    o, lse = block(0)
    if k.shape[2] <= step:
        return o, lse
    acc = pack(o, lse)  # rows (b, kv head, query of the group)
    for start in range(step, k.shape[2], step):
        merge_into(acc, pack(*block(start)))
    o, lse = unpack(acc)
    return o.reshape(bsz, hkv, g, dv), lse.reshape(bsz, hkv, g)


def attention_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's partial of one decode step's attention over its KV shard, for ``Merger``.

    Args:
        q: ``(B, Hq, D)``, the step's query (one token per sequence), in k's dtype where a fused
            kernel runs (below); any where the fp32 matmuls do (an fp8 cache, Dv != D).
        k: ``(B, Hkv, N, D)``, this rank's keys (Hkv must divide Hq: grouped-query attention
            when Hkv < Hq; query head h reads KV head h // (Hq / Hkv)); N may be 0.
        v: ``(B, Hkv, N, Dv)``, the values; Dv may differ from D (MLA's latent decode: k the
            cached latents, v their first Dv values, ``k[..., :Dv]``).
        scale: the softmax scale (default ``1 / sqrt(D)``; give the model's where it differs:
            DeepSeek's MLA takes ``1 / sqrt(192)`` times YaRN's mscale², not ``1 / sqrt(576)``).

    Returns:
        ``o (B, Hq, Dv)`` in q's dtype and ``lse (B, Hq)`` fp32 (natural log); for N = 0
        exactly o = 0 and lse = -inf. The kernel is torch's fused flash attention where it
        takes the dtype and shape on this device (it returns the log-sum-exp), else fp32
        matmuls (always where Dv differs from D).

    Raises:
        ValueError / TypeError: wrong ranks, shapes, dtypes or devices (the message says what
            was expected and what came).

    Examples:
        >>> import torch
        >>> q, k, v = torch.randn(1, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> o, lse = attention_partial(q, k, v)
        >>> tuple(o.shape), tuple(lse.shape)
        ((1, 4, 8), (1, 4))
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention_partial: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"attention_partial: {name} must be a floating-point tensor, got {t.dtype}")
        if t.layout != torch.strided:  # torch's kernels would fail naming neither the argument nor the layout
            raise TypeError(f"attention_partial: {name} must be a dense (strided) tensor, got layout {t.layout}")
    if q.dim() != 3:
        raise ValueError(f"attention_partial: q must be (B, Hq, D), got shape {tuple(q.shape)}")
    if k.dim() != 4 or v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"attention_partial: k and v must be (B, Hkv, N, D) and (B, Hkv, N, Dv), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    bsz, hq, d = q.shape
    if d < 1:
        raise ValueError(f"attention_partial: the head dimension must be at least 1, got q {tuple(q.shape)}")
    if v.shape[3] < 1:
        raise ValueError(f"attention_partial: the value head dimension must be at least 1, got v {tuple(v.shape)}")
    if k.shape[0] != bsz or k.shape[3] != d:
        raise ValueError(f"attention_partial: k is {tuple(k.shape)}; with q {tuple(q.shape)} it must be "
                         f"({bsz}, Hkv, N, {d})")
    hkv = k.shape[1]
    if hkv < 1 or hq % hkv:
        raise ValueError(f"attention_partial: KV heads ({hkv}) must divide query heads ({hq}); k and v are "
                         "(B, Hkv, N, D): a cache laid out (B, N, Hkv, D), as FlashAttention's, is k.transpose(1, 2)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention_partial: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.dtype != v.dtype:
        raise TypeError(f"attention_partial: k and v must share a dtype, got {k.dtype} and {v.dtype}")
    scale = 1.0 / math.sqrt(d) if scale is None else _finite_scale(scale)
    dv = v.shape[3]
    kernel = _kernel_for(q.device, k.dtype, d, dv)
    if q.dtype != k.dtype and kernel != "explicit":
        # A fused kernel takes q in the cache's dtype: an fp32 q would lose its precision unsaid.
        # Checked for an empty shard too: its rank must refuse where its peers do.
        raise TypeError(f"attention_partial: q is {q.dtype} and k, v {k.dtype}: give q in the cache's dtype "
                        f"(q.to(k.dtype)), as the fused attention kernel ({kernel}) takes it")
    if k.shape[2] == 0:
        return (q.new_zeros(bsz, hq, dv),
                torch.full((bsz, hq), float("-inf"), dtype=torch.float32, device=q.device))
    o, lse = _attend(q, k, v, kernel, scale)
    return o.to(q.dtype), lse


def _finite_scale(scale: object) -> float:
    """``scale`` as a float; anything float() takes (numpy or 0-d torch numbers too), else ValueError
    naming it: torch's own conversion error would not say which argument it was."""
    try:
        value = math.nan if isinstance(scale, bool) else float(scale)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"attention_partial: scale must be a finite number (or None: 1/sqrt(D)), got {scale!r}")
    return value


_KERNEL_FOR: dict[tuple[torch.device, torch.dtype, int, int], str] = {}
"""``attention_partial``'s kernel per (device, dtype, D, Dv): it runs every decode step of every layer."""


def _kernel_for(device: torch.device, dtype: torch.dtype, head_dim: int, value_dim: int) -> str:
    key = (device, dtype, head_dim, value_dim)
    kernel = _KERNEL_FOR.get(key)
    if kernel is None:
        kernel = _KERNEL_FOR[key] = _resolve_for(device, dtype, head_dim, value_dim)
    return kernel


def _resolve_for(device: torch.device, dtype: torch.dtype, head_dim: int, value_dim: int) -> str:
    kinds = {torch.float32: DType.FP32, torch.bfloat16: DType.BF16, torch.float16: DType.FP16}
    if dtype not in kinds:
        return "explicit"
    return resolve_kernel("auto", device, kinds[dtype], head_dim, value_dim)


def make_raw(payload: RawPayload, rank: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s raw buffer: ``rows`` small integers in the payload dtype, drawn on
    ``device``, so that any summation order is exact (a check with zero tolerance)."""
    gen = torch.Generator(device=device).manual_seed(sub_seed(seed, "raw", rank))
    bound = 1 if payload.dtype is DType.FP8 else 8
    values = torch.randint(-bound, bound + 1, (payload.rows,), generator=gen, dtype=torch.int32, device=device)
    return values.to(torch_dtype(payload.dtype))
