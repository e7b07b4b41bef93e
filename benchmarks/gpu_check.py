"""Measured against modelled on this machine's GPUs (run by scripts/gpu-check.sh).

Usage: python benchmarks/gpu_check.py --out results/gpu-NAME [--topology FILE] [--repeats N]

Prints one table and writes it to OUT/check.csv and OUT/check.md:

* the merge kernel (4 bf16 partials into the fp32 accumulator, D = 128), fused and eager, at
  32, 2,048 and 32,768 rows (one sequence of Llama-3.1-8B heads; a batch of 64; of 1,024);
  modelled: ``ComputeModel.merge_us`` (the fused kernel's launch and bytes);
* the decode attention kernel the runs pick (``resolve_kernel("auto")``) over one shard of
  8K, 128K and 1M tokens with Llama-3.1-8B heads (32 query, 8 KV, D = 128, bf16, batch 1);
  modelled: ``ComputeModel.partial_us``;
* a world-size-1 plan (COMPUTE only) through ``treeattn.exec`` on NCCL at 128K tokens,
  modelled by the simulator.

Kernels are timed with CUDA events around ``CALLS`` back-to-back calls queued behind a spin
kernel (per call: their time over ``CALLS``), the median of ``--repeats`` after warm-up: calls
timed on an idle GPU would time the host's dispatch of them (the compiled function's guards)
wherever it is slower than the kernel, which a run replaying its CUDA graph does not pay, and
the model does not charge. The spin (``torch.cuda._sleep``) keeps the GPU busy until all
``CALLS`` are queued. The topology
modelled on is ``--topology`` (gpu-check.sh writes this machine's with ``treeattn probe``),
else the library's topology of this GPU (``LIBRARY_TOPOLOGY``) cut to the GPUs present; a GPU
the library has none of is refused.
"""

from __future__ import annotations

import csv
import io
import os
import statistics
import sys
from pathlib import Path

import torch

from treeattn.cli.paths import output_folder
from treeattn.cli.script import ArgumentParser, count, run
from treeattn.cost.compute import ComputeModel
from treeattn.errors import InputError
from treeattn.exec import kernels
from treeattn.exec.attention import make_kv_shard, make_query, partial_attention, resolve_kernel
from treeattn.exec.footprint import gpu_peak_line
from treeattn.exec.launch import launch
from treeattn.exec.merge import wired
from treeattn.exec.predict import predict
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.probe.hardware import gpu_spec
from treeattn.textfile import write_file
from treeattn.topology.library import resolve, subset_topology
from treeattn.topology.model import Topology
from treeattn.workload import Workload

LIBRARY_TOPOLOGY = {
    "V100-SXM2-16GB": "dgx1-v100", "V100-SXM2-32GB": "dgx1-v100", "A100-SXM4-80GB": "dgx-a100",
    "H100-SXM5-80GB": "dgx-h100", "H200-SXM-141GB": "hgx-h200", "B200": "gb200-nvl72", "RTX-4090": "rtx4090",
    "MI300X": "mi300x", "MI308X": "mi300x",
}
"""The library topology that models a GPU (by its ``treeattn.probe.hardware.gpu_spec`` model)
when no ``--topology`` is given: one whose GPUs have about the same memory bandwidth (within
5 %), which the modelled kernel times follow. A GPU not listed (a PCIe or 40 GB part, GH200,
one the probe does not know) has none: modelled on another's figures, its rows would compare
against the wrong GPU."""


def llama(tokens: int, batch: int = 1, ranks: int = 1) -> Workload:
    split = tuple([tokens // ranks] * ranks)
    return Workload(batch=batch, q_heads=32, kv_heads=8, head_dim=128, split=split, kv_dtype="bf16",
                    partial_dtype="bf16", model="llama-3.1-8b")


def library_topology(gpu_name: str, gpus: int) -> Topology:
    """The library's topology of the GPU named ``gpu_name`` (as CUDA names it), cut to ``gpus``.

    Raises:
        InputError: no library topology models that GPU (``LIBRARY_TOPOLOGY``).
    """
    spec = gpu_spec(gpu_name)
    family = LIBRARY_TOPOLOGY.get(spec.model) if spec is not None else None
    if family is None:
        read = f" (read as {spec.model})" if spec is not None else ""
        raise InputError(f"no library topology models the GPU {gpu_name!r}{read}: give --topology FILE "
                         "(treeattn probe -o FILE writes this machine's)")
    topo = resolve(family)
    return subset_topology(topo, tuple(range(min(gpus, topo.num_ranks))))


def topology(path: str | None) -> Topology:
    if path:  # as given (a file or a preset): a typo must not fall back to the family unsaid
        return resolve(path)
    return library_topology(torch.cuda.get_device_name(0), torch.cuda.device_count())


CALLS = 10
SPIN_CYCLES = 20_000_000
"""About 10 ms at 2 GHz: longer than the host takes to queue ``CALLS`` calls."""


def event_us(fn, repeats: int) -> float:  # noqa: ANN001 - a callable
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


def merge_rows(topo: Topology, repeats: int) -> list[dict]:
    out = []
    dev = torch.device("cuda", 0)
    cm = ComputeModel.of(llama(8192, ranks=topo.num_ranks), topo)
    for rows in (32, 2048, 32768):
        acc = torch.randn(rows, 129, device=dev)
        acc[:, -1] *= 10
        stack = wired(torch.randn(4, rows, 129, device=dev), torch.bfloat16)  # as they arrive on a bf16 wire
        for mode in ("fused", "eager"):
            os.environ["TREEATTN_MERGE"] = mode
            us = event_us(lambda acc=acc, stack=stack: kernels.merge_into(acc, stack), repeats)
            out.append(dict(what=f"merge 4 partials ({mode})", size=f"{rows} rows", measured_us=us,
                            modelled_us=cm.merge_us(0, rows, 4)))
    os.environ.pop("TREEATTN_MERGE", None)
    return out


def attention_rows(topo: Topology, repeats: int) -> list[dict]:
    out = []
    dev = torch.device("cuda", 0)
    for tokens in (8 << 10, 128 << 10, 1 << 20):
        w = llama(tokens)
        kernel = resolve_kernel("auto", dev, w.kv_dtype, w.head_dim)
        q, kv = make_query(w, 0, dev), make_kv_shard(w, 0, 0, dev)
        us = event_us(lambda q=q, kv=kv, kernel=kernel: partial_attention(q, kv, kernel), repeats)
        cm = ComputeModel.of(w if topo.num_ranks == 1 else llama(tokens * topo.num_ranks, ranks=topo.num_ranks), topo)
        out.append(dict(what=f"attention ({kernel})", size=f"{tokens >> 10}K tokens", measured_us=us,
                        modelled_us=cm.partial_us(0)))
        del q, kv
    return out


def plan_rows(topo: Topology) -> list[dict]:
    one = subset_topology(topo, (0,)) if topo.num_ranks > 1 else topo
    w = llama(128 << 10)
    plan = build("star", w, TopologyRef.of(one))
    job = Job((PlanJob("star-1", plan),), RunOptions(backend="nccl", repeats=20, warmup=3))
    result = launch(job)
    m = result.measurements[0]
    print(gpu_peak_line(result.gpu_peak_bytes, job))
    pred = predict(plan, one).us.get("plan")
    return [dict(what=f"plan star, 1 rank ({m.kernel}, graphs {'on' if result.graphs else 'off'})",
                 size="128K tokens", measured_us=m.median_us, modelled_us=pred, correct=m.correct)]


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--topology", default=None, help="topology (file or preset) to model on (default: the GPU's "
                    "family)")
    ap.add_argument("--repeats", type=count, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("this torch sees no CUDA device")
    topo = topology(args.topology)
    out = output_folder(args.out, "--out")  # once every flag is read, and before the minutes of GPU work
    print(f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}; torch {torch.__version__}; "
          f"modelled on {topo.name}")
    rows = merge_rows(topo, args.repeats) + attention_rows(topo, args.repeats) + plan_rows(topo)
    lines = ["| what | size | measured µs | modelled µs | measured / modelled |", "|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = r["measured_us"] / r["modelled_us"] if r.get("modelled_us") else float("nan")
        r["ratio"] = ratio
        model = f"{r['modelled_us']:.1f}" if r.get("modelled_us") is not None else "—"
        lines.append(f"| {r['what']} | {r['size']} | {r['measured_us']:.1f} | {model} | {ratio:.2f} |")
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=["what", "size", "measured_us", "modelled_us", "ratio", "correct"])
    writer.writeheader()
    writer.writerows(rows)
    write_file(out / "check.csv", table.getvalue())
    write_file(out / "check.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(run(main))
