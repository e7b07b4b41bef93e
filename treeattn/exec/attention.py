"""Deterministic inputs, local attention partials and the single-process reference.

Legend: B batch, Hq query heads, Hkv KV heads, G = Hq / Hkv query heads per KV head, D head
dim, N_i tokens of rank i. q is ``(B, Hq, D)``; a KV shard is one ``(2, B, Hkv, N_i, D)``
tensor (K then V) so it travels as one message. Query head h reads KV head h // G.

Inputs are a pure function of (workload shape, seed): q comes from one generator (the same
on every rank), the KV cache from one generator per (batch element, block of ``KV_BLOCK``
tokens of the *full* sequence). Rank i's shard is tokens [offset_i, offset_i + N_i) of that
full cache, so the concatenation of the shards is the full KV whatever the split, and the
reference can rebuild it block by block from the same seeds.
"""

from __future__ import annotations

import hashlib
import math

import torch

from treeattn.errors import InputError
from treeattn.exec.merge import empty_partial, pack_heads
from treeattn.units import DType
from treeattn.workload import RawPayload, Workload

__all__ = [
    "KV_BLOCK",
    "KERNELS",
    "torch_dtype",
    "sub_seed",
    "shard_offsets",
    "make_query",
    "make_kv",
    "make_kv_shard",
    "partial_attention",
    "attention_partial",
    "reference_attention",
    "make_raw",
    "reference_raw",
    "resolve_kernel",
]

KV_BLOCK = 256
"""Tokens drawn from one generator: the granularity that makes shards split-independent."""

KERNELS = ("auto", "explicit", "sdpa", "flash-attn")
"""``explicit``: matmuls in fp32 (reference quality); ``sdpa``: torch's fused flash attention
op, which returns the log-sum-exp (fp32 accumulation, output rounded to the KV dtype);
``flash-attn``: the flash-attn package on CUDA; ``auto``: see ``resolve_kernel``."""

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


def _randn(shape: tuple[int, ...], seed: int, device: torch.device | str) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    # Drawn on the CPU so CPU and CUDA runs see the same numbers.
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device)


def shard_offsets(split: tuple[int, ...]) -> tuple[int, ...]:
    """First token of each rank's shard in the full sequence."""
    out, acc = [], 0
    for n in split:
        out.append(acc)
        acc += n
    return tuple(out)


def make_query(workload: Workload, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """q ``(B, Hq, D)`` in the KV dtype, identical on every rank for one seed."""
    w = workload
    q = _randn((w.batch, w.q_heads, w.head_dim), sub_seed(seed, "q"), device)
    return q.to(torch_dtype(w.kv_dtype))


def make_kv(
    workload: Workload, start: int, stop: int, seed: int, device: torch.device | str = "cpu",
    batch: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Tokens [start, stop) of the full KV cache: ``(2, B', Hkv, stop - start, D)``.

    Args:
        workload: the shape (B, Hkv, D, dtype).
        start: first token (of the full sequence).
        stop: one past the last token.
        seed: the run's seed.
        device: where the result lives.
        batch: batch elements [b0, b1) to build (all when None).

    Returns:
        K and V stacked, in the workload's KV dtype.
    """
    w = workload
    b0, b1 = batch if batch is not None else (0, w.batch)
    dtype = torch_dtype(w.kv_dtype)
    out = torch.empty((2, b1 - b0, w.kv_heads, stop - start, w.head_dim), dtype=dtype, device=device)
    if stop <= start:
        return out
    for b in range(b0, b1):
        for blk in range(start // KV_BLOCK, (stop - 1) // KV_BLOCK + 1):
            lo, hi = blk * KV_BLOCK, (blk + 1) * KV_BLOCK
            data = _randn((2, w.kv_heads, KV_BLOCK, w.head_dim), sub_seed(seed, "kv", b, blk), device)
            s, e = max(lo, start), min(hi, stop)
            out[:, b - b0, :, s - start : e - start] = data[:, :, s - lo : e - lo].to(dtype)
    return out


def make_kv_shard(workload: Workload, rank: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s KV shard ``(2, B, Hkv, N_rank, D)`` (N_rank may be 0)."""
    start = shard_offsets(workload.split)[rank]
    return make_kv(workload, start, start + workload.split[rank], seed, device)


def resolve_kernel(kernel: str, device: torch.device | str, kv_dtype: DType | str = DType.BF16) -> str:
    """The concrete kernel ``kernel`` names for KV of ``kv_dtype`` on ``device``.

    ``auto`` picks flash-attn on CUDA when importable (16-bit KV), else torch's fused
    ``sdpa`` op where it takes the dtype (CPU: fp32/bf16/fp16; CUDA: bf16/fp16), else the
    explicit matmuls.
    """
    if kernel not in KERNELS:
        raise InputError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    dtype = DType.parse(kv_dtype)
    is_cuda = torch.device(device).type == "cuda"
    sdpa_ok = dtype in (DType.BF16, DType.FP16) or (dtype is DType.FP32 and not is_cuda)
    if kernel == "auto":
        if is_cuda and dtype in (DType.BF16, DType.FP16) and _flash_attn() is not None:
            return "flash-attn"
        return "sdpa" if sdpa_ok and _sdpa_op(is_cuda) is not None else "explicit"
    if kernel == "flash-attn" and (not is_cuda or _flash_attn() is None or dtype not in (DType.BF16, DType.FP16)):
        raise InputError("kernel flash-attn needs CUDA devices, the flash-attn package and bf16/fp16 KV; "
                         "use explicit or sdpa")
    if kernel == "sdpa" and (not sdpa_ok or _sdpa_op(is_cuda) is None):
        raise InputError(f"kernel sdpa does not take {dtype.value} KV on {torch.device(device).type}; use explicit")
    return kernel


def _sdpa_op(cuda: bool):  # noqa: ANN202 - the aten op or None
    name = "_scaled_dot_product_flash_attention" if cuda else "_scaled_dot_product_flash_attention_for_cpu"
    return getattr(torch.ops.aten, name, None)


def _flash_attn():  # noqa: ANN202 - the optional module or None
    try:
        from flash_attn import flash_attn_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_func


def partial_attention(q: torch.Tensor, kv: torch.Tensor, kernel: str = "explicit") -> torch.Tensor:
    """One rank's partial (o_i, lse_i) over its KV, packed ``(Hq * B, D + 1)`` fp32.

    Args:
        q: ``(B, Hq, D)``.
        kv: ``(2, B, Hkv, N, D)``; N = 0 gives the empty partial (0, -inf).
        kernel: a concrete kernel name (see ``KERNELS``; resolve ``auto`` first).

    Returns:
        The packed partial, rows head-major (row = h * B + b).
    """
    bsz, hq, d = q.shape
    if kv.shape[3] == 0:
        return empty_partial(bsz * hq, d, q.device)
    o, lse = _attend(q, kv[0], kv[1], kernel, 1.0 / math.sqrt(d))
    return pack_heads(o, lse)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str,
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o ``(B, Hq, D)``, lse ``(B, Hq)`` fp32) of decode attention over N >= 1 tokens; o is
    fp32 for ``explicit``, the KV dtype for the fused kernels."""
    bsz, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    if kernel == "sdpa":
        # GQA decode as attention with G queries per KV head: (B, Hkv, G, D) against (B, Hkv, N, D).
        qg = q.reshape(bsz, hkv, g, d).to(k.dtype)
        out, lse = _sdpa_op(q.device.type == "cuda")(qg, k, v, 0.0, False, scale=scale)[:2]
        return out.reshape(bsz, hq, d), lse.reshape(bsz, hq).float()
    if kernel == "flash-attn":
        fn = _flash_attn()
        out, lse, _ = fn(q.reshape(bsz, 1, hq, d).to(k.dtype), k.transpose(1, 2), v.transpose(1, 2),
                         softmax_scale=scale, return_attn_probs=True)
        return out.reshape(bsz, hq, d), lse.reshape(bsz, hq).float()
    qf = q.reshape(bsz, hkv, g, d).float()
    scores = torch.matmul(qf, k.float().transpose(-1, -2)) * scale  # (B, Hkv, G, N)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    o = torch.matmul(probs, v.float())
    return o.reshape(bsz, hq, d), lse.reshape(bsz, hq)


def attention_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's partial of one decode step's attention over its KV shard, for ``Merger``.

    Args:
        q: ``(B, Hq, D)``, the step's query (one token per sequence).
        k: ``(B, Hkv, N, D)``, this rank's keys (Hkv must divide Hq: grouped-query attention
            when Hkv < Hq; query head h reads KV head h // (Hq / Hkv)); N may be 0.
        v: ``(B, Hkv, N, D)``, the values.
        scale: the softmax scale (default ``1 / sqrt(D)``).

    Returns:
        ``o (B, Hq, D)`` in q's dtype and ``lse (B, Hq)`` fp32 (natural log); for N = 0
        exactly o = 0 and lse = -inf. The kernel is torch's fused flash attention where it
        takes the dtype on this device (it returns the log-sum-exp), else fp32 matmuls.

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
    if q.dim() != 3:
        raise ValueError(f"attention_partial: q must be (B, Hq, D), got shape {tuple(q.shape)}")
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"attention_partial: k and v must both be (B, Hkv, N, D), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    bsz, hq, d = q.shape
    if k.shape[0] != bsz or k.shape[3] != d:
        raise ValueError(f"attention_partial: k is {tuple(k.shape)}; with q {tuple(q.shape)} it must be "
                         f"({bsz}, Hkv, N, {d})")
    hkv = k.shape[1]
    if hkv < 1 or hq % hkv:
        raise ValueError(f"attention_partial: KV heads ({hkv}) must divide query heads ({hq})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention_partial: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.dtype != v.dtype:
        raise TypeError(f"attention_partial: k and v must share a dtype, got {k.dtype} and {v.dtype}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if k.shape[2] == 0:
        return torch.zeros_like(q), torch.full((bsz, hq), float("-inf"), dtype=torch.float32, device=q.device)
    kernel = _kernel_for(q.device, k.dtype)
    o, lse = _attend(q, k, v, kernel, scale)
    return o.to(q.dtype), lse


def _kernel_for(device: torch.device, dtype: torch.dtype) -> str:
    kinds = {torch.float32: DType.FP32, torch.bfloat16: DType.BF16, torch.float16: DType.FP16}
    if dtype not in kinds:
        return "explicit"
    return resolve_kernel("auto", device, kinds[dtype])


def reference_attention(workload: Workload, seed: int, ranks: tuple[int, ...] | None = None) -> torch.Tensor:
    """Exact attention over the full KV (or the shards of ``ranks``), in fp64, by a plain
    softmax over all tokens at once (no merge operator involved).

    Rebuilds the cache from the seeds one batch element at a time: memory stays at the
    scores (Hq x N fp64) and V (Hkv x N x D in the KV dtype) of one batch element.

    Args:
        workload: the shape.
        seed: the run's seed.
        ranks: whose shards count (a broadcast plan's ``contributors``); None = all.

    Returns:
        Packed ``(Hq * B, D + 1)`` fp32 on the CPU, rows head-major.
    """
    w = workload
    g, d = w.q_heads // w.kv_heads, w.head_dim
    offsets = shard_offsets(w.split)
    step = KV_BLOCK * 64
    spans = []  # (start, stop) token pieces of at most ``step`` tokens
    for r in sorted(set(range(w.ranks) if ranks is None else ranks)):
        for s in range(offsets[r], offsets[r] + w.split[r], step):
            spans.append((s, min(s + step, offsets[r] + w.split[r])))
    n = sum(e - s for s, e in spans)
    if n == 0:
        return empty_partial(w.rows, d)
    q = make_query(w, seed).double()
    outs, lses = [], []
    for b in range(w.batch):
        qb = q[b].reshape(w.kv_heads, g, d)
        scores = torch.empty((w.kv_heads, g, n), dtype=torch.float64)
        values = []  # V kept in the KV dtype between the two passes (a quarter of fp64)
        at = 0
        for s, e in spans:
            kv = make_kv(w, s, e, seed, batch=(b, b + 1))
            scores[..., at : at + e - s] = torch.matmul(qb, kv[0, 0].double().transpose(-1, -2)) / math.sqrt(d)
            values.append(kv[1, 0])
            at += e - s
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse.unsqueeze(-1))
        o = torch.zeros((w.kv_heads, g, d), dtype=torch.float64)
        at = 0
        for (s, e), v in zip(spans, values, strict=True):
            o += torch.matmul(probs[..., at : at + e - s], v.double())
            at += e - s
        outs.append(o.reshape(w.q_heads, d))
        lses.append(lse.reshape(w.q_heads))
    return pack_heads(torch.stack(outs), torch.stack(lses))


def make_raw(payload: RawPayload, rank: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank ``rank``'s raw buffer: ``rows`` small integers in the payload dtype, so that any
    summation order is exact (a check with zero tolerance)."""
    gen = torch.Generator(device="cpu").manual_seed(sub_seed(seed, "raw", rank))
    bound = 1 if payload.dtype is DType.FP8 else 8
    values = torch.randint(-bound, bound + 1, (payload.rows,), generator=gen, dtype=torch.int32)
    return values.to(torch_dtype(payload.dtype)).to(device)


def reference_raw(payload: RawPayload, seed: int, ranks: tuple[int, ...] | None = None) -> torch.Tensor:
    """The sum of the raw buffers of ``ranks`` (None = every rank), as fp64 on the CPU."""
    total = torch.zeros(payload.rows, dtype=torch.float64)
    for r in sorted(set(range(payload.ranks) if ranks is None else ranks)):
        total += make_raw(payload, r, seed).double()
    return total
