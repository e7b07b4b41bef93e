"""The workloads a validation measures, scaled to an emulated cluster.

Why scaled: the emulated links run at tens to hundreds of Mbit/s (``topologies/emu-*.yaml``),
about 10^4 times below NVLink or InfiniBand, while a message's fixed cost (gloo through the
kernel's network stack, tens of microseconds to milliseconds on a loaded 2-core host) is
10 to 100 times *above* a GPU fabric's. A real model's shapes would put every case deep
in the bandwidth-bound regime and ring attention's KV rotation out of reach of a test run,
so the validation uses a small GQA head shape (``EMU_HEADS``: Hq 8, Hkv 1, D 32, the 8:1
grouping of Llama-3.1-70B) and sweeps the batch:

* ``sweep`` cases, ``B`` in ``SWEEP_BATCHES`` at ``SWEEP_TOKENS_PER_RANK`` tokens per rank:
  one rank's partial is ``B x 8 x 33 x 4`` bytes, 1 KiB at B = 1 (about 0.2 ms on a
  40 Mbit/s link, no more than one message's fixed cost: latency-bound) to 66 KiB at
  B = 64 (13.5 ms: bandwidth-bound). Few tokens per rank keep the local attention small:
  on the emulated cluster every rank computes on the same two host cores at once, a
  contention the compute model does not know (at 256 tokens and B = 64 the 2 MiB shards
  took 15-38 ms per rank in parallel against 2.8 ms alone), so the sweep measures the
  reduction rather than the host's CPU.
* ``heads`` cases, ``B`` in ``HEADS_BATCHES``: the sweep's workload with the ``heads`` result
  layout (each rank ends with its own query heads: reduce-scatter semantics), where vLLM's
  decode-context-parallel methods and the all-reduce's reduce-scatter form are the baselines;
* one ``long-context`` case, B = 1 at ``LONG_TOKENS_PER_RANK`` = 64K tokens per rank: each
  rank's KV shard is ``2 x 1 x 65536 x 32 x 2`` bytes = 8 MiB (bf16), which ring attention
  moves p - 1 times (about 1.7 s per step over a 40 Mbit/s NIC link); with Llama-3.1-8B's
  heads it would be 256 MiB per step, 54 s each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeattn.errors import InputError
from treeattn.topology.model import Topology
from treeattn.units import DType
from treeattn.workload import Workload

__all__ = [
    "HeadShape",
    "EMU_HEADS",
    "SWEEP_BATCHES",
    "HEADS_BATCHES",
    "SWEEP_TOKENS_PER_RANK",
    "LONG_TOKENS_PER_RANK",
    "CaseSpec",
    "default_cases",
]


@dataclass(frozen=True, slots=True)
class HeadShape:
    """Attention heads of a case (Hq, Hkv, D)."""

    q_heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.q_heads, self.kv_heads, self.head_dim) < 1 or self.q_heads % self.kv_heads:
            raise InputError(f"heads {self.q_heads}/{self.kv_heads}, dim {self.head_dim}: need positive numbers "
                             "with the KV heads dividing the query heads")


EMU_HEADS = HeadShape(q_heads=8, kv_heads=1, head_dim=32)
SWEEP_BATCHES = (1, 4, 16, 64)
HEADS_BATCHES = (16,)
SWEEP_TOKENS_PER_RANK = 32
LONG_TOKENS_PER_RANK = 65536


@dataclass(frozen=True, slots=True)
class CaseSpec:
    """One workload to measure on one topology."""

    name: str
    """Short label, unique per topology: ``B1``, ``B64``, ``N64K``."""
    regime: str
    """``sweep``, ``heads`` or ``long-context``."""
    workload: Workload
    result: str = "all"
    """The result layout planned and compared (``all`` or ``heads``)."""

    @property
    def tokens_per_rank(self) -> int:
        return max(self.workload.split)


def _workload(ranks: int, batch: int, tokens: int, heads: HeadShape) -> Workload:
    return Workload.create(ranks=ranks, seq_len=tokens * ranks, batch=batch, q_heads=heads.q_heads,
                           kv_heads=heads.kv_heads, head_dim=heads.head_dim, kv_dtype=DType.BF16,
                           partial_dtype=DType.FP32, layers=1)


def _tokens_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def default_cases(topo: Topology, *, batches: Sequence[int] = SWEEP_BATCHES,
                  tokens_per_rank: int = SWEEP_TOKENS_PER_RANK, long_tokens_per_rank: int = LONG_TOKENS_PER_RANK,
                  heads: HeadShape = EMU_HEADS, heads_batches: Sequence[int] = HEADS_BATCHES) -> list[CaseSpec]:
    """The validation's cases for ``topo`` (see the module docstring).

    Args:
        topo: the topology (its rank count sizes the workloads).
        batches: the sweep's batch sizes, in order.
        tokens_per_rank: KV tokens per rank of the sweep cases.
        long_tokens_per_rank: tokens per rank of the long-context case; 0 leaves it out.
        heads: the head shape of every case.
        heads_batches: batch sizes of the ``heads`` layout cases (left out where the ranks
            outnumber the query heads).

    Returns:
        The sweep cases (``B<b>``), the heads cases (``B<b>-heads``), then the long-context
        one (``N<tokens>``).

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> [c.name for c in default_cases(resolve("emu-mesh"))]
        ['B1', 'B4', 'B16', 'B64', 'B16-heads', 'N64K']
    """
    if tokens_per_rank < 1 or long_tokens_per_rank < 0:
        raise InputError(f"tokens per rank must be >= 1 (long context >= 0), got {tokens_per_rank} and "
                         f"{long_tokens_per_rank}")
    if not batches or min(batches) < 1 or len(set(batches)) != len(batches):
        raise InputError(f"batches must be distinct positive integers, got {list(batches)}")
    p = topo.num_ranks
    cases = [CaseSpec(f"B{b}", "sweep", _workload(p, b, tokens_per_rank, heads)) for b in batches]
    if p <= heads.q_heads:
        cases += [CaseSpec(f"B{b}-heads", "heads", _workload(p, b, tokens_per_rank, heads), "heads")
                  for b in heads_batches]
    if long_tokens_per_rank:
        cases.append(CaseSpec(f"N{_tokens_label(long_tokens_per_rank)}", "long-context",
                              _workload(p, 1, long_tokens_per_rank, heads)))
    return cases
