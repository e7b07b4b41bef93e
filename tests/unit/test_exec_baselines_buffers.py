"""The all-gather + merge baseline gathers into the runner's pool, as the plan's collective does.

A timed iteration that allocates its gathered stack afresh pays for fresh pages (a 4.2 MB stack
at B = 64 cost tens of page faults per iteration on gloo ranks) that the plan, whose stack is
pooled, does not pay and that a GPU's caching allocator would not either: the comparison would
charge the baseline for the harness, not for its schedule. One process stands in for the
group: its all-gather stacks this rank's partial as every rank's.
"""

from __future__ import annotations

import pytest
import torch

from treeattn.exec import kernels
from treeattn.exec.attention import make_kv_shard, make_query, partial_attention
from treeattn.exec.baselines import run_attention_baseline
from treeattn.exec.comm import BufferPool, Comm
from treeattn.exec.merge import wired
from treeattn.workload import Workload


class _StackingComm(Comm):
    """Rank 0 of 4 without a process group: every rank's partial is this rank's; records the
    buffer each all-gather was given (None where it allocated its own)."""

    def __init__(self) -> None:
        super().__init__(0, 4, "gloo", torch.device("cpu"), op_timeout_s=1.0, setup_timeout_s=1.0)
        self.given: list[torch.Tensor | None] = []

    def all_gather(self, tensor, what, setup=False, out=None):  # noqa: ANN001, ANN201 - Comm's signature
        self.given.append(out)
        stack = tensor.contiguous().unsqueeze(0).expand(self.world, *tensor.shape)
        return stack.clone() if out is None else out.copy_(stack)


@pytest.mark.parametrize("wire", [torch.float32, torch.bfloat16])
def test_allgather_merge_gathers_into_the_pool_and_merges_as_before(wire):
    w = Workload.create(ranks=4, seq_len=4 * 48, batch=2, q_heads=4, kv_heads=2, head_dim=8)
    q, kv = make_query(w, 0, torch.device("cpu")), make_kv_shard(w, 0, 0, torch.device("cpu"))
    comm, pool = _StackingComm(), BufferPool(torch.device("cpu"))
    results = []
    for _ in range(2):  # the runner releases the pool before every iteration (the baseline's prepare)
        pool.release_all()
        results.append(run_attention_baseline("allgather-merge", comm, q, kv, w, "explicit", wire, pool))
        if len(results) == 1:
            held = pool.nbytes
    assert all(out is not None for out in comm.given), "the gathered stack was allocated, not taken from the pool"
    assert comm.given[0].data_ptr() == comm.given[1].data_ptr()  # the same pooled stack both iterations
    assert pool.nbytes == held  # the second iteration took no new slot
    # The merge is unchanged: the fused merge of the four gathered partials, bit for bit.
    mine = wired(partial_attention(q, kv, "explicit"), wire)
    expected = kernels.merged(mine.unsqueeze(0).expand(4, *mine.shape).clone())
    for out in results:
        assert out.dtype == torch.float32 and out.shape == expected.shape
        assert torch.equal(out, expected)
