"""Greedy decoding of a Hugging Face Llama with its KV cache sharded by sequence over gloo ranks.

The model is built from a config with random weights (no download): 4 layers, hidden 256,
8 query heads on 2 KV heads (grouped-query attention), RoPE. Every rank holds the whole
model (the weights are the same on every rank: one seed) and a slice of the KV cache along
the sequence. Each rank prefills the prompt with Hugging Face's own forward and keeps its
contiguous share of the prompt's cache; every decode step, each layer's attention is this
rank's partial over its shard (``treeattn.attention_partial``) merged across the ranks by
the plan (``treeattn.Merger``), then ``o_proj`` and the rest of the layer as Llama does.
The new token's K and V are appended on one rank, round-robin (token t on rank t mod p),
so the shards stay within one token of each other.

With ``--result heads`` each rank gets only its own query heads back, as tensor
parallelism wants: it applies its slice of ``o_proj``'s columns and the ranks sum the
results (the all-reduce a tensor-parallel ``o_proj`` ends with).

It checks every step against Hugging Face's own single-process ``generate`` (greedy, same
weights) and prints one line: identical tokens and the largest |logit difference|. Exit 0
only when every token is identical and that difference is at most 1e-3.

    python examples/hf_llama_sharded_decode.py --ranks 4 --prompt-len 512 --new-tokens 32
    python examples/hf_llama_sharded_decode.py --ranks 3 --method dcp-ag-rs --result heads

Needs ``pip install -e .[hf]`` (transformers).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import treeattn
from treeattn.plan.builders import ALGORITHMS, build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import Workload, even_split

LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB = 4, 256, 8, 2, 1024
TOLERANCE = 1e-3


def make_model(seed: int):  # noqa: ANN201 - a LlamaForCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=4096, rope_theta=10000.0, attn_implementation="eager")
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def make_plan(args: argparse.Namespace, ranks: int):  # noqa: ANN201 - a Plan
    head_dim = HIDDEN // HEADS
    w = Workload.create(ranks=ranks, seq_len=args.prompt_len, batch=args.batch, q_heads=HEADS, kv_heads=KV_HEADS,
                        head_dim=head_dim, kv_dtype="fp32")
    if args.method == "searched":
        return treeattn.search_plan(f"cpu:ranks={ranks}", w, result=args.result)
    return treeattn.build_plan(f"cpu:ranks={ranks}", w, args.method, result=args.result)


def reference(model, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:  # noqa: ANN001
    """Hugging Face's own greedy generate: the new tokens and each step's logits."""
    # Every prompt token is real: without a mask generate takes the pad token's id (0, which a
    # random prompt may hold) for padding and masks those positions out.
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=steps,
                         min_new_tokens=steps, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[:, prompt.shape[1]:], [x.float() for x in out.logits]


def decode(model, prompt: torch.Tensor, steps: int, merger, rank: int, p: int) -> tuple[torch.Tensor, list]:  # noqa: ANN001
    """Greedy decode with the KV cache sharded by sequence and attention merged by ``merger``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        out = model(prompt, use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        n = prompt.shape[1]
        lo = sum(even_split(n, p)[:rank])
        share = slice(lo, lo + even_split(n, p)[rank])
        keys = [layer.keys[:, :, share].clone() for layer in cache.layers]
        values = [layer.values[:, :, share].clone() for layer in cache.layers]
        logits = [out.logits[:, -1].float()]
        tokens = [logits[0].argmax(-1)]
        heads = merger.heads
        for t in range(1, steps):
            x = tokens[-1].unsqueeze(1)
            pos = torch.full((x.shape[0], 1), n + t - 1, dtype=torch.long)
            h = model.model.embed_tokens(x)
            cos, sin = model.model.rotary_emb(h, pos)
            owner = (t - 1) % p
            for i, layer in enumerate(model.model.layers):
                attn = layer.self_attn
                res = h
                hn = layer.input_layernorm(h)
                shape = (x.shape[0], 1, -1, attn.head_dim)
                q = attn.q_proj(hn).view(shape).transpose(1, 2)
                k = attn.k_proj(hn).view(shape).transpose(1, 2)
                v = attn.v_proj(hn).view(shape).transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                if rank == owner:
                    keys[i] = torch.cat([keys[i], k], dim=2)
                    values[i] = torch.cat([values[i], v], dim=2)
                o, lse = treeattn.attention_partial(q[:, :, 0], keys[i], values[i], scale=attn.scaling)
                o, _ = merger(o, lse)
                if heads is None:  # a root plan: only the root holds the result; share it
                    o = torch.empty(q[:, :, 0].shape)
                if merger.plan.result.startswith("root"):
                    dist.broadcast(o, merger.plan.result_ranks[0])
                if merger.plan.layout == "heads":
                    h0, h1 = heads
                    cols = attn.o_proj.weight[:, h0 * attn.head_dim:h1 * attn.head_dim]
                    y = o.reshape(o.shape[0], -1) @ cols.T
                    dist.all_reduce(y)  # the tensor-parallel o_proj's all-reduce
                    y = y.unsqueeze(1)
                else:
                    y = attn.o_proj(o.reshape(o.shape[0], 1, -1))
                h = res + y
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            step_logits = model.lm_head(model.model.norm(h))[:, -1].float()
            logits.append(step_logits)
            tokens.append(step_logits.argmax(-1))
    return torch.stack(tokens, dim=1), logits


def worker(rank: int, p: int, port: int, args: argparse.Namespace, out_dir: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=p, timeout=datetime.timedelta(seconds=120))
    try:
        model = make_model(args.seed)
        gen = torch.Generator().manual_seed(args.seed + 1)
        prompt = torch.randint(0, VOCAB, (args.batch, args.prompt_len), generator=gen)
        # One rank searches (or builds) and shares the plan: every rank must hold the same one,
        # and a search on each would repeat its work and its warnings (README, "Python API").
        shared = [make_plan(args, p) if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        merger = treeattn.Merger(shared[0])
        tokens, logits = decode(model, prompt, args.new_tokens, merger, rank, p)
        merger.synchronize()  # before shutdown: every call's communication done (README, "Python API")
        if rank == 0:
            with torch.no_grad():
                ref_tokens, ref_logits = reference(model, prompt, args.new_tokens)
            same = int((tokens == ref_tokens).sum().item())
            diff = max((a - b).abs().max().item() for a, b in zip(logits, ref_logits, strict=True))
            Path(out_dir, "result").write_text(f"{same} {tokens.numel()} {diff!r} {merger.plan.algorithm}")
        # Every rank leaves the group together: a rank that tears its gloo connections down
        # while rank 0 still works on the reference ended once in SIGABRT (std::terminate).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def usable_methods() -> list[str]:
    """The algorithms this example builds as they are (no parameters) whose plans merge
    partials (not ring attention, which moves KV)."""
    from treeattn.exec.interpreter import given_partial_problem

    w = Workload.create(ranks=2, seq_len=8, batch=1, q_heads=HEADS, kv_heads=KV_HEADS, head_dim=HIDDEN // HEADS)
    out = []
    for name, spec in ALGORITHMS.items():
        if "attention" not in spec.payloads:
            continue
        try:
            plan = build(name, w, TopologyRef("cpu:ranks=2", ""))
        except Exception:  # noqa: BLE001 - needs parameters (tree's parents, hierarchical's groups)
            continue
        if given_partial_problem(plan) is None:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="gloo processes the KV cache is split over")
    parser.add_argument("--prompt-len", type=int, default=512, help="tokens prefilled")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded greedily")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    parser.add_argument("--method", default="searched",
                        help="searched (treeattn.search_plan on cpu:ranks=N) or an algorithm: "
                             + ", ".join(usable_methods()))
    parser.add_argument("--result", default="all", help="all, heads or root[:R]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt")
    args = parser.parse_args(argv)
    bad = ([f"--ranks must be >= 2, got {args.ranks}"] if args.ranks < 2 else []) + (
        [f"--prompt-len must be >= --ranks, got {args.prompt_len}"] if args.prompt_len < args.ranks else []) + (
        [f"--new-tokens must be >= 1, got {args.new_tokens}"] if args.new_tokens < 1 else []) + (
        [f"--batch must be >= 1, got {args.batch}"] if args.batch < 1 else []) + (
        [f"--method {args.method!r} is not searched or an attention algorithm"]
        if args.method != "searched" and args.method not in ALGORITHMS else [])
    if bad:
        print(f"error: {bad[0]}", file=sys.stderr)
        return 2
    try:
        from treeattn.exec.interpreter import given_partial_problem

        problem = given_partial_problem(make_plan(args, args.ranks))
        if problem:
            raise ValueError(problem)
        # Found, not imported: importing it costs this process seconds the ranks pay anyway.
        if importlib.util.find_spec("transformers") is None:
            raise ImportError("transformers")
    except ImportError:
        print("error: this example needs transformers: pip install -e .[hf]", file=sys.stderr)
        return 2
    except Exception as exc:  # a layout or method that cannot be built: say so in one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.start_processes(worker, args=(args.ranks, free_port(), args, tmp), nprocs=args.ranks,
                               start_method="spawn")
        except mp.ProcessRaisedException as exc:
            print(f"error: a rank failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
            return 1
        same, total, diff, algorithm = Path(tmp, "result").read_text().split()
    same, total, diff = int(same), int(total), float(diff)
    ok = same == total and diff <= TOLERANCE
    print(f"{args.ranks} ranks, {algorithm} (result {args.result}): {same}/{total} tokens identical to "
          f"Hugging Face generate, max |Δ logit| {diff:.2e} (≤ {TOLERANCE:g}: {'yes' if ok else 'NO'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
