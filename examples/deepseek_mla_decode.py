"""DeepSeek's multi-head latent attention (MLA) decoded with its latent KV cache split over 4 gloo
ranks: each rank attends its quarter in the absorbed form, treeattn merges the partials, and
the result matches the model's own per-head attention over the whole cache in one process.

Shapes are DeepSeek-V2-Lite's (config.json: 16 heads, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 128, v_head_dim 128; YaRN factor 40, mscale 0.707); weights are random.
"""
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import treeattn

H, LORA, ROPE, NOPE, VDIM = 16, 512, 64, 128, 128
B, N = 2, 4096
MSCALE = 0.1 * 0.707 * math.log(40) + 1.0
SCALE = (NOPE + ROPE) ** -0.5 * MSCALE * MSCALE  # the model's softmax scale, not 1/sqrt(576)


def layer(seed: int = 0) -> dict[str, torch.Tensor]:
    """One decode step of one layer: the query's parts, the cache, the up-projections."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])

    return {"q_nope": rand(B, H, NOPE), "q_rope": rand(B, H, ROPE), "c_kv": rand(B, N, LORA) * 8,
            "k_rope": rand(B, N, ROPE) * 8, "w_uk": rand(H, NOPE, LORA), "w_uv": rand(H, LORA, VDIM)}


def per_head_attention(x: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own attention, head by head over every token: (B, H, v_head_dim)."""
    k_nope = torch.einsum("bnl,hdl->bhnd", x["c_kv"], x["w_uk"])          # keys up-projected per head
    v = torch.einsum("bnl,hlv->bhnv", x["c_kv"], x["w_uv"])               # values likewise
    scores = (torch.einsum("bhd,bhnd->bhn", x["q_nope"], k_nope)
              + torch.einsum("bhr,bnr->bhn", x["q_rope"], x["k_rope"])) * SCALE
    return torch.einsum("bhn,bhnv->bhv", scores.softmax(-1), v)


def rank_main(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = layer()
    # Absorbed: the query moves into the latent space; the cache is one 576-value latent a token.
    q = torch.cat([torch.einsum("bhd,hdl->bhl", x["q_nope"], x["w_uk"]), x["q_rope"]], dim=-1).float()
    cache = torch.cat([x["c_kv"], x["k_rope"]], dim=-1).unsqueeze(1).float()  # (B, 1 KV head, N, 576)
    mine = slice(rank * N // world, (rank + 1) * N // world)             # this rank's share of the sequence
    # Searched once, on rank 0, and sent to every rank (as examples/python_api.py does).
    shared = [treeattn.search_plan(f"cpu:ranks={world}", "deepseek-v2-lite", batch=B, seq_len=N) if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    plan = shared[0]
    merge = treeattn.Merger(plan)
    part = cache[:, :, mine]
    o, lse = merge(*treeattn.attention_partial(q, part, part[..., :LORA], scale=SCALE))  # o: (B, H, 512)
    out = torch.einsum("bhl,hlv->bhv", o.double(), x["w_uv"])           # the value up-projection, after the merge
    exact = per_head_attention(x)
    err = ((out - exact).abs().max() / exact.abs().max()).item()
    lines = [None] * world if rank == 0 else None  # rank 0 prints every rank's line, in rank order
    dist.gather_object(f"rank {rank}: {plan.algorithm}, partial {o.shape[-1]} + 1 values a head, "
                       f"max relative error {err:.1e}", lines, dst=0)
    merge.synchronize()  # every call's communication done, before leaving the group
    dist.destroy_process_group()
    if rank == 0:
        print("\n".join(lines), flush=True)


def free_port() -> int:
    """A port nobody listens on, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(rank_main, args=(4, free_port()), nprocs=4)
