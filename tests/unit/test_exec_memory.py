"""What a rank holds while it runs a plan, against the memory model (``cost.memory``): the
receive pool, the raw sums, and the reference of the correctness check (single process: the
peers are stand-ins)."""

from __future__ import annotations

import pytest
import torch

from tests.rss import can_reset_peak, peak_growth_bytes
from treeattn.cost.memory import run_bytes
from treeattn.exec.attention import make_raw
from treeattn.exec.comm import BufferPool
from treeattn.exec.interpreter import PlanExecutor, RankInputs
from treeattn.exec.merge import sum_into, sum_many_into
from treeattn.exec.reference import EXACT_MAX_KV_BYTES, compute_reference
from treeattn.exec.runner import Job, PlanJob, _RankRun
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import RawPayload, Workload

REF = TopologyRef("t", "sha256:0")
CPU = torch.device("cpu")
MIB = 1 << 20
needs_rss = pytest.mark.skipif(not can_reset_peak(), reason="needs Linux's /proc/self/clear_refs and VmHWM")


class _Stand:
    """Rank ``rank`` of ``world`` whose peers are not there: a receive lands (its pages are
    written), a send and an all-reduce leave their tensors as they are (a sum with zeros)."""

    cuda = False
    device = CPU
    backend = "gloo"

    def __init__(self, rank: int = 0, world: int = 4) -> None:
        self.rank, self.world, self.reductions = rank, world, 0

    def post(self, posts):  # noqa: ANN001, ANN201
        for p in posts:
            if not p.send:
                p.tensor.fill_(1)
        return [None] * len(posts)

    def all_reduce(self, tensor, op, what, setup=False, widen=False):  # noqa: ANN001, ANN201
        self.reductions += 1
        return tensor

    def reduce(self, tensor, root, op, what, widen=False):  # noqa: ANN001, ANN201
        return tensor

    def reduce_scatter(self, out, tensor, op, what, widen=False):  # noqa: ANN001, ANN201
        n = out.shape[0]
        return out.copy_(tensor[self.rank * n:(self.rank + 1) * n])

    def wait(self, work, what, setup=False):  # noqa: ANN001, ANN201
        pass

    def all_gather(self, tensor, what, setup=False):  # noqa: ANN001, ANN201
        return torch.stack([tensor] * self.world)

    def broadcast(self, tensor, src, what):  # noqa: ANN001, ANN201
        return tensor


def _ptrs(bufs: list[torch.Tensor]) -> list[int]:
    return [b.data_ptr() for b in bufs]


def test_the_pool_reuses_a_free_buffer_of_any_shape_and_dtype_that_is_large_enough():
    pool = BufferPool(CPU)
    stack = pool.take((3, 1000), torch.float32)
    pool.release(stack)
    row = pool.take((1000,), torch.float32)  # a later step's receive: another shape
    assert row.data_ptr() == stack.data_ptr() and row.shape == (1000,) and row.dtype == torch.float32
    pool.release(row)
    wide = pool.take((2, 6000), torch.uint8)
    assert wide.data_ptr() == stack.data_ptr() and wide.shape == (2, 6000)
    # Lent buffers never share storage; a view is given back by identity.
    other = pool.take((10,), torch.float16)
    assert other.untyped_storage().data_ptr() != wide.untyped_storage().data_ptr()
    pool.release(wide)
    assert pool.take((4,), torch.int64).data_ptr() == stack.data_ptr()


def test_the_pool_holds_the_largest_need_not_the_sum():
    pool = BufferPool(CPU)
    small = pool.take((100,), torch.float32)
    pool.release(small)
    big = pool.take((3, 100), torch.float32)  # none free is large enough: the free one grows
    pool.release(big)
    assert pool.nbytes == 1200


@pytest.mark.parametrize("sequence", [
    # Best fit alone, freeing smaller buffers for a larger one, allocates again in the second
    # iteration of this one: its first take gets the 20 bytes made last, and the last take
    # then finds nothing large enough.
    [("take", 12), ("release", 0), ("take", 8), ("take", 8), ("release", 0), ("take", 20)],
    [("take", 4), ("take", 40), ("release", 0), ("take", 16), ("release", 1), ("take", 40), ("take", 4)],
])
def test_every_iteration_after_the_first_takes_the_same_buffers(sequence):
    # A CUDA graph replays the addresses its capture saw, and a capture must not allocate.
    pool = BufferPool(CPU)

    def iteration() -> list[int]:
        pool.release_all()
        held, taken = [], []
        for what, arg in sequence:
            if what == "take":
                held.append(pool.take((arg,), torch.uint8))
                taken.append(held[-1])
            else:
                pool.release(held.pop(arg))
        return _ptrs(taken)

    iteration()
    held = pool.nbytes
    second = iteration()
    assert pool.nbytes == held  # nothing allocated, nothing freed
    assert iteration() == second
    pool.release_all()  # a second call without takes between keeps the order
    assert iteration() == second and pool.nbytes == held


@needs_rss
def test_a_two_chunk_multirail_root_holds_what_the_model_counts():
    # The root of each tree merges three halves in step 0 and copies the other tree's half in
    # step 1: the model counts the accumulator and the larger step, P + 3P/2 (not P + 4P/2,
    # nor a temporary half for the sum of the three).
    payload = RawPayload(nbytes=64 * MIB, ranks=4)
    plan = build("multirail", payload, REF, trees=2, shape="star", roots=[0, 1])
    assert plan.chunks == 2
    raw = make_raw(payload, 0, 0)

    def run() -> None:
        executor = PlanExecutor(plan, _Stand(), RankInputs(raw=raw), timed=False)
        for _ in range(3):
            executor.prepare()
            executor.run()

    grew = peak_growth_bytes(run)
    model = run_bytes(plan, 0)
    assert model == 160 * MIB
    assert grew < model + 8 * MIB, f"rank 0 held {grew / MIB:.0f} MiB, the model counts {model / MIB:.0f}"


@needs_rss
def test_a_raw_sum_of_a_stack_makes_no_temporary_of_the_rows():
    acc = torch.ones(8 << 20)  # 32 MiB
    parts = torch.ones((3, 8 << 20))
    grew = peak_growth_bytes(lambda: sum_many_into(acc, parts))
    assert torch.equal(acc[:3], torch.full((3,), 4.0))
    assert grew < 4 * MIB, f"the sum grew the resident set by {grew / MIB:.0f} MiB"
    # fp8 is summed through fp32 (torch adds no fp8), a block of the rows at a time: not the
    # rows in fp32 beside each part's (2 x 4 x 8 MiB), nor the whole stack (gloo's fp8 chain
    # held 8-12x its chunk beside the count); one part too
    acc8, parts8 = torch.ones(8 << 20).to(torch.float8_e4m3fn), torch.ones((3, 8 << 20)).to(torch.float8_e4m3fn)
    sum_many_into(torch.zeros(1 << 20).to(torch.float8_e4m3fn), parts8[:, :1 << 20])  # the threads' first use
    grew = peak_growth_bytes(lambda: sum_many_into(acc8, parts8))
    assert torch.equal(acc8.float(), torch.full((8 << 20,), 4.0))
    assert grew < 24 * MIB, f"the fp8 sum grew the resident set by {grew / MIB:.0f} MiB"  # two 32 MiB copies before
    grew = peak_growth_bytes(lambda: sum_into(acc8, parts8[0]))
    assert torch.equal(acc8.float(), torch.full((8 << 20,), 5.0))
    assert grew < 24 * MIB, f"the fp8 sum grew the resident set by {grew / MIB:.0f} MiB"


@needs_rss
def test_a_rank_that_does_not_check_holds_no_copy_of_the_raw_reference():
    payload = RawPayload(nbytes=32 * MIB, ranks=2)
    mine = make_raw(payload, 1, 0)
    got = []
    grew = peak_growth_bytes(lambda: got.append(compute_reference(_Stand(1, 2), payload, 0, mine, None, None,
                                                                  keep=False)))
    assert got == [None]
    assert grew < 24 * MIB, f"the reference grew the resident set by {grew / MIB:.0f} MiB"  # fp64: 64 MiB
    kept = compute_reference(_Stand(1, 2), payload, 0, mine, None, None)
    assert torch.equal(kept.values, mine.double())  # the stand-in's peer adds nothing


_REFERENCE_RUN = """
import sys
from tests.rss import peak_growth_bytes
from tests.unit.test_exec_memory import _Stand
from treeattn.exec.attention import make_kv_shard, make_query
from treeattn.exec.footprint import reference_bytes
from treeattn.exec.reference import compute_reference
from treeattn.workload import Workload
w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(int(sys.argv[1]),) * 2, kv_dtype="fp32")
mine, q = make_kv_shard(w, 0, 0), make_query(w, 0)
small = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(500, 500), kv_dtype="fp32")
compute_reference(_Stand(0, 2), small, 0, make_kv_shard(small, 0, 0), make_query(small, 0), None)
grew = peak_growth_bytes(lambda: compute_reference(_Stand(0, 2), w, 0, mine, q, None))
print(grew, sum(reference_bytes(w, frozenset({0}), None, 0, gpu=False)))
"""


@needs_rss
@pytest.mark.parametrize("tokens", [20000, 100000])  # exact on rank 0 (gathering); sampled rows
def test_an_attention_reference_holds_what_the_memory_check_counts(tokens):
    # In a fresh process (memory this one freed would be taken again unseen), after a small
    # reference (the process's first fp64 products set up the BLAS's threads and buffers, 10-20
    # MiB). Seen here (B = 2, 8 x 2 heads of 64): 66-71 MiB against 63.5 counted, and sampled
    # 39-40 against 34.4.
    import subprocess
    import sys
    from pathlib import Path

    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(tokens, tokens), kv_dtype="fp32")
    assert (sum(w.kv_bytes(r) for r in range(2)) <= EXACT_MAX_KV_BYTES) == (tokens == 20000)
    out = subprocess.run([sys.executable, "-c", _REFERENCE_RUN, str(tokens)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=300, check=True).stdout
    grew, count = map(int, out.split())
    assert abs(grew - count) <= 0.15 * count + 16 * MIB, (grew / MIB, count / MIB)


def test_only_the_ranks_that_check_keep_the_reference_and_all_compute_it_together():
    payload = RawPayload(nbytes=4 * 16, ranks=4)
    plan = build("allreduce", payload, REF)
    runs = {}
    for rank in range(4):
        comm = _Stand(rank, 4)
        run = _RankRun(Job((PlanJob("p", plan),)), comm, {})
        run._inputs[repr(payload)] = RankInputs(raw=make_raw(payload, rank, 0))
        got = [run.reference(payload, None, checks) for checks in [(0,), (0,), (0, 2), (2,), (1, 2, 3)]]
        runs[rank] = (got, comm.reductions)
    # Every rank takes part in the same computations (a collective), whoever keeps the result.
    assert {n for _, n in runs.values()} == {3}
    assert [r is not None for r in runs[0][0]] == [True, True, True, False, False]
    assert [r is not None for r in runs[1][0]] == [False, False, False, False, True]
    assert [r is not None for r in runs[2][0]] == [False, False, True, True, True]
    assert runs[2][0][2] is runs[2][0][4]  # computed once, then kept


@pytest.mark.parametrize("algorithm", ["ring", "star", "chain", "binomial", "butterfly"])
def test_sends_on_a_narrower_wire_hold_what_the_model_counts(algorithm):
    # Each chunk a step sends is converted to the wire's dtype once, and its buffer is given
    # back when the step ends: the pool holds the busiest step, as the model counts it (it
    # held every send of the iteration, 14 times the model on a bf16 ring of 8).
    from treeattn.cost.memory import kv_cache_bytes, rank_peak_bytes
    from treeattn.workload import Workload

    p = 8
    w = Workload(batch=4, q_heads=32, kv_heads=8, head_dim=128, split=(64,) * p, partial_dtype="bf16")
    plan = build(algorithm, w, REF, chunks=2)
    for rank in (0, 1):
        executor = PlanExecutor(plan, _Stand(rank, p), RankInputs(partial=torch.zeros(w.rows, w.head_dim + 1)),
                                timed=False)
        for _ in range(2):
            executor.prepare()
            executor.run()
        q = w.batch * w.q_heads * w.head_dim * w.kv_dtype.nbytes
        model = rank_peak_bytes(plan, rank) - kv_cache_bytes(w, rank) - q - w.payload_bytes
        # plans that copy rows (all but the butterfly here) round them at the end, in a buffer of their own
        assert (executor.buffer_bytes > executor.pool.nbytes) == bool(plan.rounded_runs) == (algorithm != "butterfly")
        assert executor.buffer_bytes <= model, (rank, executor.buffer_bytes, model)


@pytest.mark.parametrize(("nbytes", "result"), [(64 * 4096, "root"), (64 * 4096, "heads"), (6 * 4, "heads")])
def test_a_raw_library_sum_holds_what_the_model_counts(nbytes, result):
    # In place but for uneven segments (6 rows on 4 ranks), whose padded pieces and output the
    # pool lends: what it lends is the model's count beside the payload.
    from treeattn.cost.memory import rank_peak_bytes

    payload = RawPayload(nbytes=nbytes, ranks=4)
    plan = build("allreduce", payload, REF, result=result)
    for rank in range(4):
        executor = PlanExecutor(plan, _Stand(rank, 4), RankInputs(raw=make_raw(payload, rank, 0)), timed=False)
        for _ in range(2):
            executor.prepare()
            executor.run()
        assert executor.buffer_bytes == rank_peak_bytes(plan, rank) - payload.payload_bytes, rank


@pytest.mark.parametrize(("algorithm", "p"), [("direct", 4), ("direct", 2), ("butterfly", 4)])
def test_a_raw_exchange_holds_what_the_model_counts(algorithm, p):
    # An exchange of three or more sums every rank's part in rank order, its own copied into the
    # stack (a message more); a sum of two (a butterfly's partners) adds the one part in place.
    from treeattn.cost.memory import rank_peak_bytes

    payload = RawPayload(nbytes=4 * 4096, ranks=p)
    plan = build(algorithm, payload, REF)
    for rank in range(p):
        executor = PlanExecutor(plan, _Stand(rank, p), RankInputs(raw=make_raw(payload, rank, 0)), timed=False)
        for _ in range(2):
            executor.prepare()
            executor.run()
        assert executor.buffer_bytes == rank_peak_bytes(plan, rank) - payload.payload_bytes, rank
        stacked = p if algorithm == "direct" and p > 2 else 1
        assert executor.pool.nbytes == stacked * payload.payload_bytes, rank


class _Clocked(_Stand):
    """A stand whose clock counts ``origin`` calls (on CUDA each waits for the device)."""

    def __init__(self, rank: int = 0, world: int = 4) -> None:
        super().__init__(rank, world)
        self.origins = 0

    def mark(self) -> object:
        return object()

    def origin(self) -> tuple[float, object]:
        self.origins += 1
        return float(self.origins), self.mark()


def test_a_timed_run_counts_from_the_clock_it_is_given_and_takes_none_of_its_own():
    # The harness times a plan from its own Comm.origin; a second one inside the run would add a
    # wait for the device to the plan's time that a baseline's run does not pay.
    payload = RawPayload(nbytes=4096, ranks=4)
    plan = build("allreduce", payload, REF)
    comm = _Clocked()
    executor = PlanExecutor(plan, comm, RankInputs(raw=make_raw(payload, 0, 0)), timed=True)
    given = (7.0, object())
    executor.clock = given
    executor.run()
    assert comm.origins == 0 and executor._clock == (given, 7.0) and executor.clock is None
    executor.run()  # no clock given: the run takes its own
    assert comm.origins == 1 and executor._clock[0][0] == 1.0
