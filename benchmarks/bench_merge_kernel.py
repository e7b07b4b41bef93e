"""The merge of k partials into an accumulator: compiled (one fused kernel) against eager.

Usage: .venv/bin/python benchmarks/bench_merge_kernel.py [--device cpu|cuda] [--rows 32,2048,32768]
       [--k 1,4] [--dtype fp32] [--repeats 200] [--threads 1]

For each size it times ``treeattn.exec.kernels.merge_into`` with ``TREEATTN_MERGE=fused`` and
``eager`` (D = 128, Llama-3.1-8B's head dim; rows = batch x query heads: 32 is one sequence,
2048 a batch of 64) and prints the median µs per call, the ratio, the compile time of the fused
kernel and which the executor uses on that device (``auto``). On CUDA each call is timed with
events after a synchronisation, so the figure is the kernel(s) plus the launch. On the CPU
``--threads`` defaults to 1: what each rank of a run of two or more ranks on this machine gets
(``launch_local`` gives each rank the cores divided by the ranks).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from treeattn.cli.script import ArgumentParser, count, count_list, run
from treeattn.exec import kernels
from treeattn.exec.attention import torch_dtype
from treeattn.exec.merge import wired


def stack(k: int, rows: int, d: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(k * 1000 + rows)
    x = torch.randn(k, rows, d + 1, generator=gen) * 3
    x[..., -1] = torch.randn(k, rows, generator=gen) * 20
    return wired(x, dtype).to(device)  # partials as they arrive: outputs in dtype, lse fp32


def median_us(fn, repeats: int, device: str) -> float:  # noqa: ANN001 - a callable
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def measure(rows: int, k: int, dtype: torch.dtype, device: str, repeats: int, d: int = 128) -> dict:
    """Median µs of one merge of ``k`` partials of ``rows`` rows, fused and eager, and the
    fused kernel's first-call (compile) seconds."""
    acc0 = stack(1, rows, d, torch.float32, device)[0]
    parts = stack(k, rows, d, dtype, device)
    out = {}
    for m in ("fused", "eager"):
        os.environ["TREEATTN_MERGE"] = m
        acc = acc0.clone()
        t = time.perf_counter()
        kernels.merge_into(acc, parts)
        if device == "cuda":
            torch.cuda.synchronize()
        out[f"{m}_first_s"] = time.perf_counter() - t
        out[f"{m}_us"] = median_us(lambda acc=acc: kernels.merge_into(acc.copy_(acc0), parts), repeats, device)
    os.environ.pop("TREEATTN_MERGE", None)
    return out


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=count_list, default="32,2048,32768")
    ap.add_argument("--k", type=count_list, default="1,4")
    ap.add_argument("--dtype", default="fp32", help="dtype of the received partials (the accumulator is fp32)")
    ap.add_argument("--repeats", type=count, default=200)
    ap.add_argument("--threads", type=count, default=1, help="torch CPU threads")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    dtype = torch_dtype(args.dtype)
    print(f"device {args.device}, threads {torch.get_num_threads()}, partials {args.dtype}, D = 128; "
          "µs per call (median), reset copy included in both")
    print(f"{'rows':>7} {'k':>3} {'fused µs':>10} {'eager µs':>10} {'eager/fused':>12} {'compile s':>10}")
    for rows in args.rows:
        for k in args.k:
            r = measure(rows, k, dtype, args.device, args.repeats)
            print(f"{rows:>7} {k:>3} {r['fused_us']:>10.1f} {r['eager_us']:>10.1f} "
                  f"{r['eager_us'] / r['fused_us']:>12.2f} {r['fused_first_s']:>10.2f}")
    print(f"the executor uses: {'fused' if kernels.fused_on(torch.device(args.device)) else 'eager'} "
          f"on {args.device} (TREEATTN_MERGE unset)")


if __name__ == "__main__":
    sys.exit(run(main))
