"""The decode shape (what each rank holds and what is merged) and model presets.

Legend: B batch, Hq query heads, Hkv KV heads, D head dim (of q and K), Dv value head dim
(of V and the output; D unless set), N sequence length (tokens of KV cache in all), N_i
tokens held by rank i, p ranks. A *row* is one batch element x one query head: Dv + 1
values (output and log-sum-exp) merged independently of other rows.

Multi-head latent attention (MLA, DeepSeek-V2/V3) decodes in its latent space: each token
caches one latent vector of D = 576 values (512 compressed KV and 64 rotary) for one KV head,
every query head attends to it as its key, and its first Dv = 512 values are the value
(``kv_latent``: the cache holds D values a token and KV head, not D + Dv). The merge moves
Dv + 1 values a row, as for any other attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from treeattn.errors import InputError, KVCacheTooLargeError, WorkloadError
from treeattn.units import DType, check_bytes, counted

__all__ = ["ModelPreset", "MODELS", "ReduceOp", "Workload", "RawPayload", "Payload", "check_model", "check_split",
           "empty_ranks_note", "even_split", "latent_value_note", "payload_notes", "preset_heads"]


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """Attention shape of a published model (from its config.json); an MLA model's as its
    weight-absorbed decode attends (module docstring)."""

    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    layers: int
    v_head_dim: int | None = None
    kv_latent: bool = False
    params: float = 0.0
    """Parameters of the whole model (0: not known), as its checkpoint holds them."""
    weight_dtype: DType = DType.BF16
    """The published checkpoint's element type (DeepSeek-V3's: FP8)."""


MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        # Llama's parameters counted from config.json (hidden_size, intermediate_size,
        # vocab_size, tie_word_embeddings): embeddings, q/k/v/o and the gated MLP of every
        # layer, the norms; they match the model cards' 1.24B, 3.21B, 8.03B, 70.6B and 406B.
        ModelPreset("llama-3.2-1b", q_heads=32, kv_heads=8, head_dim=64, layers=16, params=1.236e9),
        ModelPreset("llama-3.2-3b", q_heads=24, kv_heads=8, head_dim=128, layers=28, params=3.213e9),
        ModelPreset("llama-3.1-8b", q_heads=32, kv_heads=8, head_dim=128, layers=32, params=8.030e9),
        ModelPreset("llama-3.1-70b", q_heads=64, kv_heads=8, head_dim=128, layers=80, params=70.554e9),
        ModelPreset("llama-3.1-405b", q_heads=128, kv_heads=8, head_dim=128, layers=126, params=405.853e9),
        # config.json: num_attention_heads, num_hidden_layers; D = kv_lora_rank (512) +
        # qk_rope_head_dim (64), Dv = kv_lora_rank. Parameters: the model cards' totals (15.7B;
        # 671B without the 14B multi-token-prediction module), V3's checkpoint in FP8.
        ModelPreset("deepseek-v2-lite", q_heads=16, kv_heads=1, head_dim=576, layers=27, v_head_dim=512,
                    kv_latent=True, params=15.7e9),
        ModelPreset("deepseek-v3", q_heads=128, kv_heads=1, head_dim=576, layers=61, v_head_dim=512,
                    kv_latent=True, params=671e9, weight_dtype=DType.FP8),
    )
}


class ReduceOp(StrEnum):
    """What a reduction computes: ``merge`` is the attention operator (o, lse) (+) (o, lse)
    of docs/design.md section 1; ``sum`` a plain elementwise sum (raw payloads)."""

    MERGE = "merge"
    SUM = "sum"


def check_model(model: object, where: str = "") -> None:
    """Refuse a model name that is no preset of ``MODELS``; ``where`` (a flag or a file's key)
    starts the message."""
    if not isinstance(model, str) or model not in MODELS:
        hint = _model_hint(model) if isinstance(model, str) else None
        meant = f" (did you mean {hint!r}?)" if hint else ""
        raise WorkloadError(f"{where + ': ' if where else ''}unknown model {model!r}{meant}; choose one of "
                            f"{', '.join(sorted(MODELS))}")


def _model_hint(model: str) -> str | None:
    """The preset a mistyped name most likely meant: Hugging Face's ``meta-llama/Llama-3.1-70B``
    or ``Llama-3.1-70B-Instruct`` by its lower-cased name, else the nearest spelling."""
    import difflib

    name = model.strip().rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-base", "-chat"):
        name = name.removesuffix(suffix)
    if name in MODELS:
        return name
    close = difflib.get_close_matches(name, list(MODELS), n=1, cutoff=0.75)
    return close[0] if close else None


def latent_value_note(w: Payload) -> str | None:
    """What to say where ``w`` takes a latent cache for a preset that has none (not MLA), or an
    MLA preset's latent cache with another value dim than the preset's (config.json's
    ``v_head_dim``, 128 for DeepSeek-V3, is the value a head has after the up-projection; the
    absorbed decode merges ``kv_lora_rank`` values, 512); None elsewhere."""
    preset = MODELS.get(w.model) if isinstance(w, Workload) and w.model else None
    if preset is not None and w.kv_latent and not preset.kv_latent:
        return (f"{preset.name} is no MLA model: it caches K and V a KV head each, and a latent cache (kv_latent, "
                "--kv-latent) keeps one, half its KV cache's bytes")
    if preset is None or not (preset.kv_latent and w.kv_latent) or w.value_dim == preset.v_head_dim:
        return None
    return (f"{preset.name}'s absorbed decode merges the first {preset.v_head_dim} values of its latent a head "
            f"(kv_lora_rank); v_head_dim {w.value_dim} merges {w.value_dim}. config.json's v_head_dim is a head's "
            "value after the up-projection, which comes after the merge")


def empty_ranks_note(w: Payload) -> str | None:
    """What to say where an even split of ``w``'s sequence leaves ranks without a token (N
    under the rank count: ``-n 3`` on 8 ranks, where ``-n 3K`` was likely meant); None
    elsewhere, as for a split that keeps other ranks empty (on purpose)."""
    if not isinstance(w, Workload):
        return None
    empty = w.split.count(0)
    if not empty or w.split != even_split(w.seq_len, w.ranks):
        return None
    return (f"N={w.seq_len} tokens split evenly over {w.ranks} ranks leaves {empty} of them no KV cache; they "
            "take part in the merge with empty partials")


def payload_notes(w: Payload) -> list[str]:
    """What to warn a user of about ``w`` before planning it (``latent_value_note``,
    ``empty_ranks_note``)."""
    return [note for note in (latent_value_note(w), empty_ranks_note(w)) if note]


def preset_heads(model: str | None, q_heads: int | None, kv_heads: int | None,
                 head_dim: int | None) -> tuple[int | None, int | None, int | None]:
    """Hq, Hkv and D: those given, else the preset ``model``'s (Hkv: Hq without a preset);
    None where neither gives one."""
    preset = None
    if model is not None:
        check_model(model)
        preset = MODELS[model]
    hq = q_heads if q_heads is not None else (preset.q_heads if preset else None)
    hkv = kv_heads if kv_heads is not None else (preset.kv_heads if preset else hq)
    d = head_dim if head_dim is not None else (preset.head_dim if preset else None)
    return hq, hkv, d


def check_split(split: tuple[int, ...], where: str = "workload.split") -> None:
    """Refuse a split (tokens per rank) that names no rank, holds a share that is no count of
    tokens, or holds no tokens at all (nothing to attend to). ``where`` names it in the
    message: a flag (``--split``) or a file's key."""
    if not split:
        raise WorkloadError(f"{where} must name at least one rank")
    if any((not isinstance(n, int)) or isinstance(n, bool) or n < 0 for n in split):
        raise WorkloadError(f"{where} must hold tokens >= 0 per rank, got {split}")
    if sum(split) < 1:
        raise WorkloadError(f"{where} holds no tokens at all")


def even_split(total: int, ranks: int) -> tuple[int, ...]:
    """Split ``total`` tokens over ``ranks`` as evenly as possible, larger shares first."""
    if ranks < 1:
        raise WorkloadError(f"rank count must be >= 1, got {ranks}")
    base, extra = divmod(total, ranks)
    return tuple(base + (1 if i < extra else 0) for i in range(ranks))


@dataclass(frozen=True, slots=True)
class Workload:
    """One decode step of one attention layer, KV cache sharded along the sequence."""

    batch: int
    """B: sequences decoded together."""
    q_heads: int
    """Hq: query heads."""
    kv_heads: int
    """Hkv: KV heads (GQA when < Hq); must divide Hq."""
    head_dim: int
    """D: head dimension."""
    split: tuple[int, ...]
    """N_i: tokens of KV cache held by each rank (zeros allowed); len(split) = ranks."""
    kv_dtype: DType = DType.BF16
    """Element type of K, V and q."""
    partial_dtype: DType = DType.FP32
    """Element type of the partials (o_i, lse_i) that are sent and merged."""
    layers: int = 1
    """Layers per decode step (times are per layer unless a report says otherwise)."""
    model: str | None = None
    """Preset name the shape came from, if any."""
    v_head_dim: int | None = None
    """Dv: the value (and output) head dimension; None (or D) = D."""
    kv_latent: bool = False
    """MLA: the cache holds one vector of D values a token and KV head, the key, whose first
    Dv values are the value (module docstring); else K and V are cached apart."""

    kind = "attention"

    def __post_init__(self) -> None:
        for name in ("batch", "q_heads", "kv_heads", "head_dim", "layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise WorkloadError(f"workload.{name} must be a positive integer, got {value!r}")
        if self.q_heads % self.kv_heads:
            raise WorkloadError(
                f"workload.kv_heads ({self.kv_heads}) must divide q_heads ({self.q_heads})"
            )
        dv = self.v_head_dim
        if dv is not None and (not isinstance(dv, int) or isinstance(dv, bool) or dv < 1):
            raise WorkloadError(f"workload.v_head_dim must be a positive integer, got {dv!r}")
        if dv == self.head_dim:
            object.__setattr__(self, "v_head_dim", None)  # one shape, one form (and one plan file)
        if not isinstance(self.kv_latent, bool):
            raise WorkloadError(f"workload.kv_latent must be true or false, got {self.kv_latent!r}")
        if self.kv_latent and self.value_dim > self.head_dim:
            raise WorkloadError(f"workload.v_head_dim ({self.value_dim}) must be at most head_dim ({self.head_dim}) "
                                "with kv_latent: the value is the first v_head_dim values of the cached key")
        check_split(self.split)
        object.__setattr__(self, "kv_dtype", DType.parse(self.kv_dtype))
        object.__setattr__(self, "partial_dtype", DType.parse(self.partial_dtype))
        check_bytes(self.payload_bytes, "workload: a rank's partial (batch x q_heads rows)")
        worst = max(range(len(self.split)), key=lambda r: self.split[r])
        try:
            per_token = self.head_dim if self.kv_latent else self.head_dim + self.value_dim
            # every term of the product, so that the one too large is seen (a flag's, a file's, a preset's)
            check_bytes(self.cache_bytes(worst),
                        f"workload: rank {worst}'s KV cache of {counted(self.layers, 'layer')} (batch {self.batch} x "
                        f"{self.split[worst]} tokens x {counted(self.kv_heads, 'KV head')} x {per_token} values x "
                        f"{counted(self.kv_dtype.nbytes, 'byte')} a layer)")
        except InputError as exc:  # say what to change, as plan's memory check does below this size
            raise KVCacheTooLargeError(f"{exc}: use more ranks, a shorter sequence or a smaller batch") from None

    @classmethod
    def create(
        cls,
        *,
        ranks: int,
        seq_len: int,
        batch: int = 1,
        model: str | None = None,
        q_heads: int | None = None,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        split: tuple[int, ...] | None = None,
        kv_dtype: DType | str = DType.BF16,
        partial_dtype: DType | str = DType.FP32,
        layers: int | None = None,
        v_head_dim: int | None = None,
        kv_latent: bool | None = None,
    ) -> Workload:
        """Build a workload from a model preset or explicit head counts.

        Args:
            ranks: p, the number of ranks the KV cache is split over.
            seq_len: N, tokens in all.
            model: a key of ``MODELS``; explicit head counts override it.
            split: tokens per rank; even when omitted.
            v_head_dim, kv_latent: Dv and the MLA cache (None: the preset's, else D and False).
        """
        hq, hkv, d = preset_heads(model, q_heads, kv_heads, head_dim)
        if hq is None or d is None:
            raise WorkloadError("give --model or both --heads and --head-dim")
        if split is None:
            split = even_split(seq_len, ranks)
        else:
            split = tuple(split)
            if len(split) != ranks:
                raise WorkloadError(f"split names {len(split)} ranks but there are {ranks}")
            if sum(split) != seq_len:
                raise WorkloadError(f"split sums to {sum(split)} tokens, seq_len is {seq_len}")
        return cls(
            batch=batch,
            q_heads=hq,
            kv_heads=hkv,
            head_dim=d,
            split=split,
            kv_dtype=DType.parse(kv_dtype),
            partial_dtype=DType.parse(partial_dtype),
            layers=layers if layers is not None else (MODELS[model].layers if model is not None else 1),
            model=model,
            v_head_dim=v_head_dim if v_head_dim is not None else (MODELS[model].v_head_dim if model else None),
            kv_latent=kv_latent if kv_latent is not None else (MODELS[model].kv_latent if model else False),
        )

    @property
    def ranks(self) -> int:
        return len(self.split)

    @property
    def seq_len(self) -> int:
        return sum(self.split)

    @property
    def reduce_op(self) -> ReduceOp:
        return ReduceOp.MERGE

    @property
    def value_dim(self) -> int:
        """Dv: the values of one row of the output (``v_head_dim``, else D)."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def rows(self) -> int:
        """Independent rows of the merge: B x Hq."""
        return self.batch * self.q_heads

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of a partial on the wire: Dv values of the partial dtype and the lse,
        fp32 whatever that dtype (see ``treeattn.exec.merge``)."""
        return self.value_dim * self.partial_dtype.nbytes + 4

    @property
    def acc_row_bytes(self) -> int:
        """Bytes of one row of the accumulator a rank merges into: Dv + 1 fp32 values."""
        return (self.value_dim + 1) * 4

    @property
    def payload_bytes(self) -> int:
        """Bytes of one rank's whole partial."""
        return self.rows * self.row_bytes

    @property
    def query_bytes(self) -> int:
        """Bytes of the query: B x Hq x D values of the KV dtype."""
        return self.batch * self.q_heads * self.head_dim * self.kv_dtype.nbytes

    def kv_bytes(self, rank: int) -> int:
        """Bytes of rank ``rank``'s K and V shard (D + Dv values a token and KV head; D with
        ``kv_latent``)."""
        per_token = self.head_dim if self.kv_latent else self.head_dim + self.value_dim
        return self.batch * self.kv_heads * self.split[rank] * per_token * self.kv_dtype.nbytes

    def cache_bytes(self, rank: int) -> int:
        """Bytes of the KV cache rank ``rank`` keeps: its shard of every layer."""
        return self.layers * self.kv_bytes(rank)

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "batch": self.batch,
            "q_heads": self.q_heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "seq_len": self.seq_len,
            "split": list(self.split),
            "kv_dtype": self.kv_dtype.value,
            "partial_dtype": self.partial_dtype.value,
            "layers": self.layers,
            "model": self.model,
            # Written only where set, so that every other workload's plan reads as it did.
            **({"v_head_dim": self.v_head_dim} if self.v_head_dim is not None else {}),
            **({"kv_latent": True} if self.kv_latent else {}),
        }


@dataclass(frozen=True, slots=True)
class RawPayload:
    """A plain reduction of ``nbytes`` per rank (compare with nccl-tests)."""

    nbytes: int
    """Bytes each rank contributes (and receives back)."""
    ranks: int
    dtype: DType = DType.FP32
    op: ReduceOp = ReduceOp.SUM
    split: tuple[int, ...] = field(default=())

    kind = "raw"

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise WorkloadError(f"payload.ranks must be a positive integer, got {self.ranks!r}")
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        object.__setattr__(self, "op", ReduceOp(self.op))
        if self.op is not ReduceOp.SUM:
            raise WorkloadError(f"payload.op: a raw payload is summed (op sum), got {self.op.value!r}; the "
                                "attention merge needs a Workload (a decode shape)")
        if not isinstance(self.nbytes, int) or self.nbytes < self.dtype.nbytes:
            raise WorkloadError(
                f"payload.nbytes must be at least one {self.dtype.value} element, got {self.nbytes!r}"
            )
        object.__setattr__(self, "split", tuple([0] * self.ranks))

    @property
    def reduce_op(self) -> ReduceOp:
        return self.op

    @property
    def rows(self) -> int:
        return self.nbytes // self.dtype.nbytes

    @property
    def row_bytes(self) -> int:
        return self.dtype.nbytes

    @property
    def acc_row_bytes(self) -> int:
        """Bytes of one element of the buffer a rank sums into: the payload's dtype."""
        return self.dtype.nbytes

    @property
    def payload_bytes(self) -> int:
        return self.rows * self.row_bytes

    def kv_bytes(self, rank: int) -> int:
        return 0

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "nbytes": self.nbytes,
            "ranks": self.ranks,
            "dtype": self.dtype.value,
            "op": self.op.value,
        }


Payload = Workload | RawPayload
