"""One rank of ``test_api.py``'s refused-call scenarios, started as its own process (a peer that
gloo aborts must not take the others with it): a decode loop over Mergers of a plan of
collectives where the last rank's call is refused once for its arguments and the loop goes on.

    python -m tests.distributed.refused_worker RANK WORLD PORT CASE   (CASE: one, two)

``one``: one Merger (allgather-merge, B=2); ``two``: one per batch size, B=8 and B=1 called in
turn, the refusal in a B=8 call. Prints one line a step: ``step N: ok``, ``step N: WRONG err``
or ``step N: ErrorType``."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

import treeattn
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import Workload

REF = TopologyRef("cpu:test", "sha256:test")


def main() -> None:
    rank, p, port, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=p, timeout=datetime.timedelta(seconds=30))
    heads, kv_heads, dim, tokens = 8, 2, 32, 64
    batches = (2,) * 6 if case == "one" else (8, 1) * 3

    def merger(batch: int) -> treeattn.Merger:
        w = Workload.create(ranks=p, seq_len=tokens, batch=batch, q_heads=heads, kv_heads=kv_heads, head_dim=dim,
                            kv_dtype="fp32")
        return treeattn.Merger(build("allgather-merge", w, REF), timeout_s=3.0)

    mergers = {b: merger(b) for b in sorted(set(batches), reverse=True)}
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(8, kv_heads, tokens, dim, generator=g), torch.randn(8, kv_heads, tokens, dim, generator=g)
    q = torch.randn(len(batches), 8, heads, dim, generator=g)
    mine = slice(rank * tokens // p, (rank + 1) * tokens // p)
    for step, b in enumerate(batches):
        o, lse = treeattn.attention_partial(q[step, :b], k[:b, :, mine], v[:b, :, mine])
        if rank == p - 1 and step == 2:
            o = o[..., : dim // 2]  # a wrong shape on one rank, once
        try:
            got, _ = mergers[b](o, lse)
            exact, _ = treeattn.attention_partial(q[step, :b], k[:b], v[:b])
            err = (got - exact).abs().max().item()
            said = "ok" if err <= 1e-5 else f"WRONG {err:.2e}"
        except Exception as exc:  # noqa: BLE001 - each step's outcome is the output
            said = type(exc).__name__
        print(f"step {step}: {said}", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
