"""The Python API on one page: 4 gloo ranks, each with a quarter of the KV cache, merge their partials."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import treeattn


def rank_main(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # Search once, on rank 0, and send every rank that plan (a deployment: save_plan once, load_plan on each rank):
    shared = [treeattn.search_plan(f"cpu:ranks={world}", "llama-3.1-8b", batch=2, seq_len=4096) if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    plan = shared[0]
    merge = treeattn.Merger(plan)                        # once; then every decode step:
    g = torch.Generator().manual_seed(0)                 # the same q, K, V on every rank
    q, k, v = torch.randn(2, 32, 128, generator=g), torch.randn(2, 8, 4096, 128, generator=g), torch.randn(
        2, 8, 4096, 128, generator=g)
    mine = slice(rank * 1024, (rank + 1) * 1024)         # this rank's quarter of the sequence
    o, lse = merge(*treeattn.attention_partial(q, k[:, :, mine], v[:, :, mine]))
    exact, _ = treeattn.attention_partial(q, k, v)       # one process over every token, to compare
    err = (o - exact).abs().max().item()
    lines = [None] * world if rank == 0 else None        # rank 0 prints every rank's line, in rank order
    dist.gather_object(f"rank {rank}: {plan.algorithm}, max |error| {err:.1e}", lines, dst=0)
    merge.synchronize()                                  # at shutdown: every call's communication done
    dist.destroy_process_group()
    if rank == 0:
        print("\n".join(lines))


if __name__ == "__main__":
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(4, port), nprocs=4)
