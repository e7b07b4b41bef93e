"""``treeattn.plan.bits``: which result ranks end with the same bits, as the executor merges
(the real processes' bits are compared with it in tests/distributed/test_api.py)."""

from __future__ import annotations

import dataclasses

import pytest

from treeattn.errors import PlanInvalidError
from treeattn.plan.bits import bit_groups
from treeattn.plan.builders import ALGORITHMS, build
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.workload import RawPayload, Workload

REF = TopologyRef("t", "sha256:0")


def att(p: int, wire: str = "fp32") -> Workload:
    return Workload(batch=2, q_heads=8, kv_heads=2, head_dim=16, split=(32,) * p, partial_dtype=wire)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("wire", ["fp32", "bf16"])
def test_every_family_merging_partials_gives_every_rank_the_same_bits(p, wire):
    # copies of one merge, exchanges (every rank's partial in rank order, its own as sent) and
    # library collectives; rows copied on a narrow wire are rounded by every rank at the end
    for name, spec in ALGORITHMS.items():
        if "attention" not in spec.payloads or name == "ring-attention":
            continue
        for chunks in (1, 2):
            try:
                plan = build(name, att(p, wire), REF, chunks=chunks)
            except Exception:  # noqa: BLE001 - a family that builds nothing for this shape
                continue
            assert bit_groups(plan) == {}, (name, chunks)


def test_ring_attention_merges_the_blocks_in_a_different_order_on_every_rank():
    plan = build("ring-attention", att(4), REF)
    assert bit_groups(plan) == {0: [[0], [1], [2], [3]]}


def test_direct_groups_whose_positions_do_not_line_up_diverge():
    # [[0, 3], [1, 2], [4, 5]]: positions 0 (ranks 0, 1, 4) and 1 (ranks 3, 2, 5) exchange the
    # three groups' merges, each in rank order: the second puts group [1, 2]'s first
    plan = build("direct", att(6), REF, groups=[[0, 3], [1, 2], [4, 5]])
    assert bit_groups(plan) == {0: [[0, 1, 4], [2, 3, 5]]}
    assert bit_groups(build("direct", att(6), REF, groups=[[0, 2], [1, 3], [4, 5]])) == {}
    # unequal groups: rank 6 (position 2 of [4, 5, 6]) merges group [7, 8]'s from rank 7 into
    # its own, where ranks 4 and 7 exchange
    uneven = build("direct", att(9), REF, groups=[[0, 1, 2, 3], [4, 5, 6], [7, 8]])
    assert bit_groups(uneven) == {0: [[0, 1, 5], [2, 3], [4, 6], [7, 8]]}


def test_raw_sums_and_layouts_with_one_holder_a_chunk():
    raw = RawPayload(nbytes=4 * 64, ranks=4)
    assert bit_groups(build("ring", raw, REF)) == {}
    # a raw exchange of three or more sums every rank's part in rank order, its own as sent
    for p in (3, 5, 8):
        assert bit_groups(build("direct", RawPayload(nbytes=4 * 64, ranks=p), REF)) == {}, p
    # where the groups do not line up, the ranks still sum other operands in other orders
    assert bit_groups(build("direct", RawPayload(nbytes=4 * 64, ranks=6), REF, groups=[[0, 3], [1, 2], [4, 5]]))
    # two operands commute: a butterfly's partners, and a raw exchange of two, add the same pair
    for p in (2, 4, 8):
        assert bit_groups(build("butterfly", RawPayload(nbytes=4 * 64, ranks=p), REF, chunks=2)) == {}, p
    assert bit_groups(build("direct", RawPayload(nbytes=4 * 64, ranks=2), REF)) == {}
    assert bit_groups(build("ring", att(4), REF, result="heads")) == {}  # each head on one rank
    assert bit_groups(build("binomial", att(4), REF, result="root", root=2)) == {}


def test_a_chunk_merged_alone_and_among_all_rows_is_merged_twice():
    # Ranks 0 and 1 start from rank 0's partial and merge ranks 2's and 3's. Rank 0 gets both
    # for all rows: one stack, one merge. Rank 1 gets rank 3's chunk by chunk: the executor
    # merges its stack of all rows (rank 2's) and then each chunk's (rank 3's), two merges, and
    # ends with other bits (gloo: `treeattn run` reports them); ranks 2 and 3 copy rank 0's.
    k = OpKind
    programs = (
        (Op(k.COMPUTE, 0), Op(k.SEND, 1, peer=1), Op(k.RECV_MERGE, 2, peer=2), Op(k.RECV_MERGE, 2, peer=3),
         Op(k.SEND, 3, peer=2), Op(k.SEND, 3, peer=3)),
        (Op(k.RECV_COPY, 1, peer=0), Op(k.RECV_MERGE, 2, peer=2), Op(k.RECV_MERGE, 2, peer=3, chunk=0),
         Op(k.RECV_MERGE, 2, peer=3, chunk=1)),
        (Op(k.COMPUTE, 0), Op(k.SEND, 2, peer=0), Op(k.SEND, 2, peer=1), Op(k.RECV_COPY, 3, peer=0)),
        (Op(k.COMPUTE, 0), Op(k.SEND, 2, peer=0), Op(k.SEND, 2, peer=1, chunk=0), Op(k.SEND, 2, peer=1, chunk=1),
         Op(k.RECV_COPY, 3, peer=0)),
    )
    plan = Plan("by-hand", {}, att(4), REF, 2, programs, (0, 1, 2, 3), contributors=(0, 2, 3))
    assert bit_groups(plan) == {0: [[0, 2, 3], [1]], 1: [[0, 2, 3], [1]]}


def test_an_invalid_plan_is_refused():
    plan = build("star", att(3), REF)
    broken = dataclasses.replace(plan, programs=[[*plan.programs[0], Op(OpKind.SEND, 9, peer=1)],
                                                 *plan.programs[1:]])
    with pytest.raises(PlanInvalidError, match="invalid"):
        bit_groups(broken)
