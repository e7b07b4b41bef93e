"""Per-rank peak bytes (``treeattn.cost.memory``) of the library-collective methods, in closed form."""

from __future__ import annotations

from tests.unit.test_cost_helpers import cluster_topo
from treeattn.cost.memory import kv_cache_bytes, rank_peak_bytes
from treeattn.plan.builders import build
from treeattn.workload import Workload


def test_alltoall_holds_p_pieces_of_its_own_rows_and_allgather_p_partials():
    p, d = 4, 64
    w = Workload(batch=4, q_heads=8, kv_heads=2, head_dim=d, split=(256,) * p)
    topo = cluster_topo(1, p)
    row = (d + 1) * 4  # a packed fp32 partial row: D values and the lse
    base = kv_cache_bytes(w, 0) + w.batch * w.q_heads * d * w.kv_dtype.nbytes + w.payload_bytes
    seg = w.batch * w.q_heads // p  # rows a rank owns in the heads layout
    a2a = build("dcp-a2a", w, topo, result="heads")
    assert rank_peak_bytes(a2a, 0) == base + p * seg * row
    gather = build("allgather-merge", w, topo)
    assert rank_peak_bytes(gather, 0) == base + p * w.rows * row


def test_the_accumulator_is_fp32_rows_whatever_the_wire():
    # A rank merges into fp32 rows (D values and the lse) however narrow the partials it sends:
    # a one-rank plan holds its KV, the query and that accumulator, nothing else.
    for dtype in ("fp32", "bf16", "fp8"):
        w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(50,), partial_dtype=dtype)
        plan = build("star", w, cluster_topo(1, 1))
        assert rank_peak_bytes(plan, 0) == kv_cache_bytes(w, 0) + w.rows * 64 * w.kv_dtype.nbytes + w.rows * 65 * 4


def test_uneven_heads_charge_the_rank_that_owns_the_most():
    # 8 heads on 3 ranks: segments of 3, 3 and 2 heads; an all-to-all delivers each rank
    # three pieces of its own rows, so the largest owner holds 3 x 3 heads' rows.
    p, d = 3, 64
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=d, split=(256,) * p)
    plan = build("dcp-a2a", w, cluster_topo(1, p), result="heads")
    assert plan.owned_rows(None) == (6, 6, 4)
    base = kv_cache_bytes(w, 0) + w.batch * w.q_heads * d * w.kv_dtype.nbytes + w.payload_bytes
    assert rank_peak_bytes(plan, 0) == base + p * 6 * (d + 1) * 4


def test_an_exchange_holds_its_own_partial_as_sent_beside_what_it_receives():
    # direct: every rank sends its partial to every other and merges theirs in one step, so
    # its stack holds p partials (its own as sent); a star's root merges p - 1 beside its own.
    from treeattn.plan.ir import exchanged_chunks, message_bytes

    w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=16, split=(32,) * 4)
    direct, star = build("direct", w, cluster_topo(1, 4)), build("star", w, cluster_topo(1, 4))
    steps = {op.step for op in direct.programs[1]}
    exchange = [s for s in steps if exchanged_chunks(op for op in direct.programs[1] if op.step == s)]
    assert len(exchange) == 1
    assert not any(exchanged_chunks(op for op in star.programs[0] if op.step == s) for s in range(5))
    partial = message_bytes(direct, next(op for op in direct.programs[1] if op.step == exchange[0]))
    base = kv_cache_bytes(w, 1) + w.batch * w.q_heads * w.head_dim * w.kv_dtype.nbytes + w.payload_bytes
    assert rank_peak_bytes(direct, 1) - base == 4 * partial
    assert rank_peak_bytes(star, 0) - base == 3 * partial


def test_a_raw_sum_holds_nothing_in_place_and_a_padded_reduce_scatter_its_pieces():
    # exec.collectives: a raw all-reduce, reduce and even reduce-scatter sum the accumulator's
    # rows in place; uneven segments are padded to the longest, p of them handed to the library
    # and one taken back; fp8 goes through fp32 copies of what is summed and what comes back.
    from treeattn.workload import RawPayload

    topo = cluster_topo(1, 4)
    for dtype, widen in (("fp32", 0), ("fp8", 4)):
        even = RawPayload(nbytes=64 * 4096, ranks=4, dtype=dtype)  # rows split 4 ways evenly
        row = even.row_bytes
        for name, kw, extra in (("allreduce", {}, even.rows * row * widen),
                                ("allreduce", {"result": "root", "root": 2}, even.rows * row * widen),
                                ("allreduce", {"result": "heads"}, (even.rows + even.rows // 4) * row * widen)):
            plan = build(name, even, topo, **kw)
            assert rank_peak_bytes(plan, 0) == even.payload_bytes + extra, (dtype, kw)
        uneven = RawPayload(nbytes=6 * even.dtype.nbytes, ranks=4, dtype=dtype)  # 2, 2, 1, 1 rows
        plan = build("allreduce", uneven, topo, result="heads")
        assert plan.padded_runs and max(b - a for a, b in plan.segments) == 2
        held = (4 * 2 + 2) * uneven.row_bytes * (1 + widen)
        assert rank_peak_bytes(plan, 0) == uneven.payload_bytes + held


def test_the_memory_messages_tell_a_need_from_a_limit_it_is_over():
    """deepseek-v3's latent cache at B 64: a rank's KV 1 MB over dgx-h100's 72 GiB printed as
    'needs 72 GiB ... (72 GiB usable)'; a schedule 1 MB over as 'needs 68.68 GiB, over the 68.68 GiB'."""
    import re

    import pytest

    from treeattn.cost.memory import MemoryCheck, check_kv_fits
    from treeattn.errors import InputError
    from treeattn.topology.library import resolve

    topo = resolve("dgx-h100")
    w = Workload.create(ranks=8, seq_len=137_520, batch=64, model="deepseek-v3")
    with pytest.raises(InputError) as err:
        check_kv_fits(w, topo)
    need, usable = re.search(r"needs ([\d.]+) GiB of KV .*\(([\d.]+) GiB usable", str(err.value)).groups()
    assert float(need) > float(usable)
    why = MemoryCheck(peak_bytes=73_745_000_000, limit_bytes=73_744_000_000, rank=0).why()
    need, limit = re.search(r"needs ([\d.]+) GiB on rank 0, over the ([\d.]+) GiB", why).groups()
    assert float(need) > float(limit)


def test_llama_presets_count_their_parameters_from_config_json():
    from treeattn.workload import MODELS

    # config.json: hidden_size, intermediate_size, vocab_size, tie_word_embeddings.
    configs = {"llama-3.2-1b": (2048, 8192, 128256, True), "llama-3.2-3b": (3072, 8192, 128256, True),
               "llama-3.1-8b": (4096, 14336, 128256, False), "llama-3.1-70b": (8192, 28672, 128256, False),
               "llama-3.1-405b": (16384, 53248, 128256, False)}
    for name, (hidden, inter, vocab, tied) in configs.items():
        m = MODELS[name]
        layer = (2 * hidden * m.q_heads * m.head_dim + 2 * hidden * m.kv_heads * m.head_dim + 3 * hidden * inter
                 + 2 * hidden)
        params = vocab * hidden * (1 if tied else 2) + m.layers * layer + hidden
        assert abs(m.params / params - 1) < 1e-3, name


def test_weights_note_says_when_sharded_weights_outgrow_what_the_fraction_leaves():
    from treeattn.cost.memory import weights_note
    from treeattn.topology.library import resolve
    from treeattn.workload import RawPayload, ReduceOp, even_split

    h100 = resolve("dgx-h100")  # 80 GiB a GPU: 0.9 leaves 8 GiB

    def shape(model, q_heads=None):
        from treeattn.workload import MODELS

        m = MODELS[model]
        return Workload(batch=1, q_heads=q_heads or m.q_heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                        split=even_split(131072, 8), layers=m.layers, model=model, v_head_dim=m.v_head_dim,
                        kv_latent=m.kv_latent)

    # 70.6 B parameters in bf16 over 8 GPUs: 16.4 GiB a GPU, more than 8 GiB; 0.79 leaves 16.8.
    note = weights_note(shape("llama-3.1-70b"), h100)
    assert note is not None and "16.43 GiB a GPU sharded over 8 ranks" in note
    assert note.endswith("--mem-fraction 0.79 at most leaves them room (activations besides)")
    assert weights_note(shape("llama-3.1-70b"), h100, 0.79) is None
    # Beside a known plan: only where the weights and the plan's peak outgrow what the fraction lets
    # a GPU use (its rest is for activations, the CUDA context and the library's buffers).
    assert weights_note(shape("llama-3.1-70b"), h100, peak_bytes=5 << 30) is None
    assert weights_note(shape("llama-3.1-70b"), h100, peak_bytes=int(55.5 * 2**30)) is None  # 71.9 GiB in all
    beside = weights_note(shape("llama-3.1-70b"), h100, peak_bytes=60 << 30)  # 76.4 GiB: under 80, over 72
    assert beside.endswith("and the plan's peak (60 GiB a GPU) need more than the 72 GiB --mem-fraction 0.9 lets a "
                           "GPU use: --mem-fraction 0.79 at most leaves them room (activations besides)"), beside
    # a peak no fraction leaves the weights room beside
    over = weights_note(shape("llama-3.1-70b"), h100, peak_bytes=70 << 30)
    assert over.endswith("and the plan's peak (70 GiB a GPU) need more than a GPU's 80 GiB: more ranks, a shorter "
                         "sequence or a smaller batch, or weights in fewer bytes"), over
    # 79.83 GiB in all: under 80, but 0.79 (to 0.01) holds not the 63.4 GiB peak; the note names no fraction
    edge = weights_note(shape("llama-3.1-70b"), h100, peak_bytes=int(63.4 * 2**30))
    assert "--mem-fraction 0.79" not in edge and "leave 177 MiB of a GPU's 80 GiB" in edge, edge
    # DeepSeek-V3 in fp8 beside a 1 GiB plan fills all but 0.8 GiB of an H100: said
    assert "leave no room" in weights_note(shape("deepseek-v3"), h100, peak_bytes=int(1.075 * 2**30))
    assert weights_note(shape("llama-3.1-70b"), h100, 1.0).endswith(
        "get no room: --mem-fraction 1 gives the whole GPU to the KV cache and the merge; --mem-fraction 0.79 at "
        "most leaves them room (activations besides)")
    assert weights_note(shape("llama-3.1-70b"), h100, 0.8) is not None
    assert weights_note(shape("llama-3.1-8b"), h100) is None  # 1.9 GiB a GPU
    assert "leave no room for the KV cache on a GPU (80 GiB)" in weights_note(shape("llama-3.1-405b"), h100)
    # 78 GiB of 80: a fraction under 0.05 is no advice
    assert "in fp8, 624.9 GiB: 78.11 GiB a GPU" in weights_note(shape("deepseek-v3"), h100)
    assert "leave no room" in weights_note(shape("deepseek-v3"), h100)
    # Not the preset's shape, or no model: nothing to say.
    assert weights_note(shape("llama-3.1-70b", q_heads=32), h100) is None
    assert weights_note(RawPayload(nbytes=1 << 20, op=ReduceOp.SUM, ranks=8), h100) is None


def test_weights_note_names_no_fraction_the_kv_cache_does_not_fit_in():
    """Llama 3.1 70B on one DGX H100 at 1.7M tokens: 64.9 GiB of KV and 16.4 GiB of weights a
    GPU, more than its 80 GiB together. --mem-fraction 0.79 leaves the weights room but not
    the KV cache (plan refused it), so the note says neither fits rather than name it."""
    import pytest

    from treeattn.cost.memory import check_kv_fits, kv_cache_bytes, weights_note
    from treeattn.errors import InputError
    from treeattn.topology.library import resolve
    from treeattn.workload import MODELS, even_split

    h100 = resolve("dgx-h100")
    m = MODELS["llama-3.1-70b"]

    def shape(n, layers=m.layers):
        return Workload(batch=1, q_heads=m.q_heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                        split=even_split(n, 8), layers=layers, model=m.name)

    long = shape(1_700_000)
    check_kv_fits(long, h100, 0.9)  # the KV cache alone fits at the default
    with pytest.raises(InputError):
        check_kv_fits(long, h100, 0.79)  # not at the fraction that leaves the weights room
    note = weights_note(long, h100)
    assert note is not None and "--mem-fraction 0.79" not in note
    assert "and rank 0's KV cache (64.85 GiB) need more than its GPU's 80 GiB" in note
    assert kv_cache_bytes(long, 0) + m.params * 2 / 8 > 80 * 2**30
    # a shorter sequence still gets the fraction
    assert weights_note(shape(131072), h100).endswith("--mem-fraction 0.79 at most leaves them room "
                                                      "(activations besides)")
    # --layers makes another shape: the preset's parameter count is not its weights
    assert weights_note(shape(131072, layers=1), h100) is None
