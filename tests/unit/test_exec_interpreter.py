"""The interpreter refuses what the IR forbids before it posts anything (no peer needed)."""

from __future__ import annotations

import pytest
import torch

from treeattn.errors import PlanInvalidError
from treeattn.exec.comm import Comm
from treeattn.exec.interpreter import PlanExecutor, RankInputs
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.workload import Workload


def test_a_recv_merge_of_a_kv_block_is_refused_before_posting():
    w = Workload(batch=1, q_heads=2, kv_heads=1, head_dim=4, split=(3, 3))
    plan = Plan(algorithm="hand", params={}, workload=w, topology=TopologyRef("t", "sha256:0"), chunks=1,
                programs=[(Op(OpKind.RECV_MERGE, 0, peer=1, block=1),), (Op(OpKind.SEND, 0, peer=0, block=1),)],
                result_ranks=(0,))
    comm = Comm(0, 2, "gloo", torch.device("cpu"), op_timeout_s=1.0, setup_timeout_s=1.0)
    kv = torch.zeros(2, 1, 1, 3, 4, dtype=torch.bfloat16)
    with pytest.raises(PlanInvalidError, match="recv_merge of KV block 1; use recv_copy"):
        # refused when the program is compiled: no process group exists, posting would fail otherwise
        PlanExecutor(plan, comm, RankInputs(q=torch.zeros(1, 2, 4, dtype=torch.bfloat16), kv=kv))


def test_a_replay_counts_its_ops_for_the_fault_injection(monkeypatch):
    from treeattn.exec.interpreter import FAULT_ENV, InjectedFault

    w = Workload(batch=1, q_heads=2, kv_heads=1, head_dim=4, split=(3, 3))
    plan = Plan(algorithm="hand", params={}, workload=w, topology=TopologyRef("t", "sha256:0"), chunks=1,
                programs=[(Op(OpKind.COMPUTE, 0), Op(OpKind.RECV_MERGE, 1, peer=1)),
                          (Op(OpKind.COMPUTE, 0), Op(OpKind.SEND, 1, peer=0))],
                result_ranks=(0,))
    comm = Comm(0, 2, "gloo", torch.device("cpu"), op_timeout_s=1.0, setup_timeout_s=1.0)
    inputs = RankInputs(partial=torch.zeros(2, 5))
    ex = PlanExecutor(plan, comm, inputs, timed=False)
    for _ in range(3):  # no fault configured: counted without a loop over the ops
        ex.replaying()
    assert ex._ops_done == 6
    monkeypatch.setenv(FAULT_ENV, "0:3:raise")  # the 4th op: the second replay's second op
    ex = PlanExecutor(plan, comm, inputs, timed=False)
    ex.replaying()
    with pytest.raises(InjectedFault, match="at op 3 \\(program op 1\\)"):
        ex.replaying()
