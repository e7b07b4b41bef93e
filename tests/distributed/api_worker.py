"""What each rank of the API tests runs (forked processes; no test here), and the tasks of
``baselines_worker`` (the executor's baselines on the same gloo ranks).

Every scenario: each rank builds its KV shard (deterministic from the seed, uneven, some
empty), computes its partial with ``treeattn.attention_partial``, merges it with
``treeattn.Merger`` and compares what it got with exact attention over the whole KV
(``attention_partial`` on one process, in fp64 inputs), for the rows the layout gives it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

import treeattn
from tests.distributed import baselines_worker
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.plan.trees import reroot
from treeattn.workload import Workload

REF = TopologyRef("cpu:test", "sha256:test")


def shard_split(p: int, total: int) -> list[int]:
    """Uneven shards, the second empty."""
    base = [total // p + 7 * i for i in range(p)]
    base[1 % p] = 0 if p > 1 else base[0]
    return base


def full_kv(b: int, hkv: int, d: int, split: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = sum(split)
    return torch.randn(b, hkv, n, d, generator=g, dtype=torch.float64), torch.randn(b, hkv, n, d, generator=g,
                                                                                    dtype=torch.float64)


def scenario(rank: int, p: int, plan, dtype: torch.dtype, seed: int, group=None) -> dict:  # noqa: ANN001
    w = plan.workload
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(w.batch, w.q_heads, w.head_dim, generator=g, dtype=torch.float64)
    k, v = full_kv(w.batch, w.kv_heads, w.head_dim, list(w.split), seed)
    # An MLA latent cache: the value is the key's first Dv values; else V has Dv values of its own.
    v = k[..., :w.value_dim] if w.kv_latent else v[..., :w.value_dim]
    start = sum(w.split[:rank])
    mine = slice(start, start + w.split[rank])
    o, lse = treeattn.attention_partial(q.to(dtype), k[:, :, mine].to(dtype), v[:, :, mine].to(dtype))
    merger = treeattn.Merger(plan, group=group)
    out_o, out_l = merger(o, lse)
    # a second call (every rank makes it: the program runs on all) reuses every buffer
    pool = merger._exec.pool
    before = pool.nbytes
    out2, _ = merger(o, lse)
    after = pool.nbytes
    merger.synchronize()  # every earlier call finished (gloo: each call already waited)
    got = {"rank": rank, "heads": merger.heads, "none": out_o is None}
    if out_o is None:
        return got
    ref_o, ref_l = treeattn.attention_partial(q, k, v)  # fp64, one process, every token
    h0, h1 = merger.heads
    got["dtype"] = str(out_o.dtype)
    got["shape"] = list(out_o.shape)
    got["err_o"] = (out_o.double() - ref_o[:, h0:h1]).abs().max().item()
    got["err_l"] = (out_l.double() - ref_l[:, h0:h1]).abs().max().item()
    got["bits"] = hashlib.sha256(out_o.float().contiguous().numpy().tobytes()).hexdigest()
    got["pooled"] = before == after
    got["repeat_equal"] = bool(torch.equal(out2, out_o))
    return got


def run_worker(rank: int, p: int, port: int, out_dir: str, task: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=p, timeout=datetime.timedelta(seconds=60))
    results = []
    try:
        for item in (spaces(rank, p, out_dir) if task == "spaces" else TASKS[task](rank, p)):
            results.append(item)
    except Exception:  # the parent reads it and fails the test with it
        results.append({"error": traceback.format_exc()})
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    if dist.is_initialized():  # a task may have destroyed it (misuse)
        dist.destroy_process_group()


def _workload(p: int, q_heads: int = 8, kv_heads: int = 2, batch: int = 2, dtype: str = "fp32") -> Workload:
    return Workload(batch=batch, q_heads=q_heads, kv_heads=kv_heads, head_dim=16, split=tuple(shard_split(p, 64)),
                    kv_dtype=dtype, partial_dtype="fp32")


def every_method(rank: int, p: int):  # noqa: ANN201 - a generator of result dicts
    """Every family and baseline method that merges partials, in every layout it builds."""
    from treeattn.plan.builders import ALGORITHMS

    w = _workload(p, q_heads=12 if p == 3 else 8)
    for name, spec in ALGORITHMS.items():
        if "attention" not in spec.payloads or name == "ring-attention":
            continue
        for result in spec.results:
            kwargs = {"parents": [-1] + [0] * (p - 1)} if name == "tree" else {}
            if name == "hierarchical":
                kwargs = {"group_size": 2}
            if result == "root":
                if name == "tree":
                    kwargs["parents"] = reroot(kwargs["parents"], p - 1)
                else:
                    kwargs["root"] = p - 1
            plan = build(name, w, REF, chunks=2 if result != "heads" else 1, result=result, **kwargs)
            for dtype in (torch.float32, torch.bfloat16):
                yield {"method": name, "result": result, "dtype_in": str(dtype),
                       **scenario(rank, p, plan, dtype, seed=11)}
            if result == "all":  # a bf16 wire under fp32 o: exchanges, copies (rounded) and both
                plan = build(name, dataclasses.replace(w, partial_dtype="bf16"), REF, chunks=2, result=result, **kwargs)
                yield {"method": f"{name}/bf16-wire", "result": result, "dtype_in": str(torch.float32),
                       **scenario(rank, p, plan, torch.float32, seed=11)}


def mla(rank: int, p: int):  # noqa: ANN201
    """An MLA-shaped workload (D = 24 keys, the first Dv = 16 of them the values, one KV head):
    each merging method in each layout it builds, as ``every_method`` does with D = Dv."""
    from treeattn.plan.builders import ALGORITHMS

    w = dataclasses.replace(_workload(p, kv_heads=1), head_dim=24, v_head_dim=16, kv_latent=True)
    for name in ("binomial", "direct", "butterfly", "allgather-merge", "allreduce3", "allreduce2", "dcp-ag-rs",
                 "dcp-a2a", "ring"):
        for result in ALGORITHMS[name].results:
            kwargs = {"root": p - 1} if result == "root" else {}
            plan = build(name, w, REF, chunks=2 if result != "heads" else 1, result=result, **kwargs)
            for dtype in (torch.float32, torch.bfloat16):
                yield {"method": name, "result": result, "dtype_in": str(dtype),
                       **scenario(rank, p, plan, dtype, seed=13)}
    # an odd Dv on a bf16 wire: the lse sits at an odd offset and is copied out before the merge
    odd = dataclasses.replace(w, v_head_dim=15, partial_dtype="bf16")
    for name in ("binomial", "allgather-merge", "dcp-a2a"):
        result = "heads" if name == "dcp-a2a" else "all"
        plan = build(name, odd, REF, chunks=1, result=result)
        yield {"method": f"{name}/bf16-wire", "result": result, "dtype_in": str(torch.float32),
               **scenario(rank, p, plan, torch.float32, seed=13)}


def searched(rank: int, p: int):  # noqa: ANN201
    w = _workload(p)
    for result in ("all", "heads", "root:1"):
        plan = treeattn.search_plan(f"cpu:ranks={p}", w, result=result)
        yield {"method": "searched", "result": result, **scenario(rank, p, plan, torch.float32, seed=5)}


def subgroup(rank: int, p: int):  # noqa: ANN201
    """A Merger over ranks 1..p-1 of the world: plan rank i is rank i of that group."""
    members = list(range(1, p))
    group = dist.new_group(members)
    if rank not in members:
        yield {"outside": True}
        return
    w = _workload(len(members))
    plan = build("binomial", w, REF, chunks=2)
    yield {"method": "subgroup", **scenario(members.index(rank), len(members), plan, torch.float32, 3, group)}


def _unwarned(call):  # noqa: ANN001, ANN202 - a refusal says one thing: no warning before it
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            return call()
        finally:
            if seen:
                raise AssertionError(f"warned before refusing: {seen[0].message}")


def errors(rank: int, p: int):  # noqa: ANN201
    """Bad input raises before anything is sent; a rank that raised leaves the others a timeout."""
    import time

    from treeattn.errors import ExecutionError

    w = _workload(p)
    plan = build("binomial", w, REF)
    out = {}
    for label, call in (
        ("group-size", lambda: treeattn.Merger(build("binomial", _workload(p + 1), REF))),
        # at p + 1 ranks ring attention's ranks end with other bits: refused without that warning
        ("ring", lambda: _unwarned(lambda: treeattn.Merger(build("ring-attention", _workload(p + 1), REF)))),
        ("plan-type", lambda: treeattn.Merger(None)),
        ("timeout", lambda: treeattn.Merger(plan, timeout_s=None)),
        ("device", lambda: treeattn.Merger(plan, device="meta")),
    ):
        try:
            call()
            out[label] = "no error"
        except (ValueError, TypeError) as exc:
            out[label] = f"{type(exc).__name__}: {exc}"
    o = torch.randn(w.batch, w.q_heads, w.head_dim)
    lse = torch.randn(w.batch, w.q_heads)
    # built (and first called) under inference mode, as a model's setup may be; called outside later
    try:
        with torch.inference_mode():
            built = treeattn.Merger(plan, timeout_s=5.0)
            first, _ = built(o, lse)
        again, _ = built(o, lse)
        out["inference"] = "same" if (first is None and again is None) or torch.equal(first, again) else "differ"
    except RuntimeError as exc:
        out["inference"] = f"RuntimeError: {exc}"
    merger = treeattn.Merger(plan, timeout_s=2.0)
    o, lse = o.zero_(), lse.zero_()
    for label, args in (("shape", (o[:, :4], lse)), ("lse-dtype", (o, lse.double())), ("not-tensor", (o, 1.0))):
        try:
            merger(*args)
            out[label] = "no error"
        except (ValueError, TypeError) as exc:
            out[label] = f"{type(exc).__name__}: {exc}"
    # rank 0 gets a bad shape and raises; the others wait for it, and give up by the timeout
    t0 = time.monotonic()
    try:
        merger(o[:, :4] if rank == 0 else o, lse)
        out["peer"] = "no error"
    except ValueError:
        out["peer"] = "raised"
    except ExecutionError as exc:
        out["peer"] = f"ExecutionError: {exc}"
    out["peer_s"] = time.monotonic() - t0
    yield out


def misuse(rank: int, p: int):  # noqa: ANN201
    """What a model's code gets wrong: a group that is not a ProcessGroup, sparse inputs, a call
    after the process group is gone. Each raises one error naming the argument, on the rank that
    made it, before anything is sent: the good call after them merges as if they had not been made."""
    w = _workload(p)
    plan = build("binomial", w, REF)
    out = {}

    def attempt(label, call):  # noqa: ANN001, ANN202
        try:
            call()
            out[label] = "no error"
        except (ValueError, TypeError) as exc:
            out[label] = f"{type(exc).__name__}: {exc}"

    attempt("group-list", lambda: treeattn.Merger(plan, group=list(range(p))))
    attempt("group-str", lambda: treeattn.Merger(plan, group="world"))
    merger = treeattn.Merger(plan, timeout_s=5.0)
    g = torch.Generator().manual_seed(rank)
    o, lse = torch.randn(w.batch, w.q_heads, w.head_dim, generator=g), torch.randn(w.batch, w.q_heads, generator=g)
    attempt("o-sparse", lambda: merger(o.to_sparse(), lse))
    attempt("lse-sparse", lambda: merger(o, lse.to_sparse()))
    got, _ = merger(o, lse)
    every = [torch.zeros_like(o) for _ in range(p)]
    dist.all_gather(every, o)
    lses = [torch.zeros_like(lse) for _ in range(p)]
    dist.all_gather(lses, lse)
    stack_l = torch.stack(lses)
    want = (torch.stack(every) * torch.softmax(stack_l, 0).unsqueeze(-1)).sum(0)
    out["good"] = None if got is None else (got - want).abs().max().item()
    merger.synchronize()
    dist.destroy_process_group()
    attempt("destroyed", lambda: merger(o, lse))
    yield out


def lonely(rank: int, p: int):  # noqa: ANN201
    """Rank 0 constructs its Merger; the others do not (yet): rank 0 gives up by its timeout,
    saying that every rank must construct one."""
    import time

    from treeattn.errors import ExecutionError

    out = {}
    t0 = time.monotonic()
    if rank == 0:
        try:
            treeattn.Merger(build("binomial", _workload(p), REF), timeout_s=2.0)
            out["lonely"] = "no error"
        except ExecutionError as exc:
            out["lonely"] = f"{type(exc).__name__}: {exc}"
    else:
        time.sleep(4.0)
    out["lonely_s"] = time.monotonic() - t0
    yield out


def _two_inputs(rank: int, p: int, w) -> tuple[dict, dict]:  # noqa: ANN001 - a Workload
    """Two partials of this rank, "a" and "b", and their exact merges over the world."""
    g = torch.Generator().manual_seed(rank)
    inputs = {name: (torch.randn(w.batch, w.q_heads, w.head_dim, generator=g), torch.randn(w.batch, w.q_heads,
                                                                                        generator=g))
              for name in ("a", "b")}

    def want(o, lse):  # noqa: ANN001, ANN202
        every, lses = [torch.zeros_like(o) for _ in range(p)], [torch.zeros_like(lse) for _ in range(p)]
        dist.all_gather(every, o)
        dist.all_gather(lses, lse)
        return (torch.stack(every) * torch.softmax(torch.stack(lses), 0).unsqueeze(-1)).sum(0)

    return inputs, {name: want(*inputs[name]) for name in inputs}


def orders(rank: int, p: int):  # noqa: ANN201
    """Two Mergers of one plan (two layers, say): called in one order on every rank they merge
    exactly, also where the messages' sequence numbers wrap; called in different orders, rank
    0 A then B, the others B then A, each rank raises by its timeout instead of merging the
    other Merger's partials."""
    import time

    from treeattn.errors import ExecutionError
    from treeattn.exec import comm
    from treeattn.exec.comm import SEQ_BITS

    w = _workload(p)
    plan = build("binomial", w, REF)
    a, b = treeattn.Merger(plan, timeout_s=3.0), treeattn.Merger(plan, timeout_s=3.0)
    inputs, exact = _two_inputs(rank, p, w)
    out = {}
    for key in [k for k in comm._TAGS if k[1] == a._comm._space]:  # the next message's number wraps to 0
        comm._TAGS[key] = (1 << SEQ_BITS) - 1
    for step in range(2):
        got = {"a": a(*inputs["a"])[0], "b": b(*inputs["b"])[0]}
        out[f"same-{step}"] = max((got[n] - exact[n]).abs().max().item() for n in got if got[n] is not None)
    first, second = (("a", a), ("b", b)) if rank == 0 else (("b", b), ("a", a))
    t0 = time.monotonic()
    try:
        for name, merger in (first, second):
            merger(*inputs[name])
        out["swapped"] = "no error"
    except ExecutionError as exc:
        out["swapped"] = f"{type(exc).__name__}: {exc}"
    out["swapped_s"] = time.monotonic() - t0
    yield out


def order_check(rank: int, p: int):  # noqa: ANN201
    """Two Mergers of a plan of collectives (all-gather + merge: no tag tells two Mergers' calls
    apart) with check_order: in one order they merge exactly; rank 0 calling A then B while the
    others call B then A raises ExecutionError on every rank before anything is sent, and calls in
    one order merge exactly again afterwards."""
    import time

    from treeattn.errors import ExecutionError

    w = _workload(p)
    plan = build("allgather-merge", w, REF)
    a, b = (treeattn.Merger(plan, timeout_s=10.0, check_order=True) for _ in range(2))
    inputs, exact = _two_inputs(rank, p, w)

    def error(name_merger):  # noqa: ANN001, ANN202
        name, merger = name_merger
        return (merger(*inputs[name])[0] - exact[name]).abs().max().item()

    out = {"in_order": max(error(x) for x in (("a", a), ("b", b)))}
    first = ("a", a) if rank == 0 else ("b", b)
    t0 = time.monotonic()
    try:
        error(first)
        out["swapped"] = "no error"
    except ExecutionError as exc:
        out["swapped"] = f"{type(exc).__name__}: {exc}"
    out["swapped_s"] = time.monotonic() - t0
    out["again"] = max(error(x) for x in (("a", a), ("b", b)))
    yield out


def order_misuse(rank: int, p: int):  # noqa: ANN201
    """check_order misused: a group's Merger checking otherwise than its first is refused at
    construction; a call interrupted on rank 1 after the check (its peers then inside the merge)
    leaves the group's Mergers, the next layer's too, and any new one refusing, instead of meeting
    them out of step (gloo aborted the process: '16512 vs 8', '544 vs 8')."""
    from treeattn.errors import ExecutionError

    w = _workload(p)
    plan = build("allgather-merge", w, REF)
    a = treeattn.Merger(plan, timeout_s=3.0, check_order=True)
    b = treeattn.Merger(plan, timeout_s=3.0, check_order=True)  # the next layer's
    out = {"number": [a.number, b.number]}
    try:
        treeattn.Merger(plan, timeout_s=3.0)
        out["mixed"] = "no error"
    except ValueError as exc:
        out["mixed"] = str(exc)
    inputs, _ = _two_inputs(rank, p, w)
    if rank == 1:
        prepare = a._exec.prepare

        def interrupted() -> None:
            a._exec.prepare = prepare
            raise KeyboardInterrupt

        a._exec.prepare = interrupted
    for key, merger in (("first", a), ("again", a), ("sibling", b)):
        try:
            merger(*inputs["a"])
            out[key] = "no error"
        except (ExecutionError, KeyboardInterrupt) as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
    try:
        treeattn.Merger(plan, timeout_s=3.0, check_order=True)
        out["built"] = "no error"
    except ExecutionError as exc:
        out["built"] = f"{type(exc).__name__}: {exc}"
    yield out


def _out_of_memory_once(merger, args) -> str:  # noqa: ANN001
    """Call ``merger`` with its preparation failing once, out of memory (before anything is
    sent); the error's text, or 'no error'."""
    prepare = merger._exec.prepare

    def out_of_memory() -> None:
        merger._exec.prepare = prepare
        raise torch.OutOfMemoryError("simulated")

    merger._exec.prepare = out_of_memory
    try:
        merger(*args)
    except torch.OutOfMemoryError as exc:
        return str(exc)
    return "no error"


def unsent_failure(rank: int, p: int):  # noqa: ANN201
    """A call that fails on rank 1 before it sends anything (out of memory in its preparation)
    leaves the group callable: rank 1 calls again and meets rank 0's call in step."""
    w = _workload(p)
    merger = treeattn.Merger(build("allgather-merge", w, REF), timeout_s=10.0)
    inputs, exact = _two_inputs(rank, p, w)
    out = {}
    if rank == 1:
        out["failed"] = _out_of_memory_once(merger, inputs["a"])
    out["max_err"] = max((merger(*inputs[n])[0] - exact[n]).abs().max().item() for n in ("a", "b"))
    yield out


def refused_call(rank: int, p: int):  # noqa: ANN201
    """A call refused for its arguments counts as made. Refused on every rank, the calls after it
    merge exactly; refused on rank 1 alone while rank 0 goes into that call, and rank 1's loop
    going on to its next step, both ranks raise at their next calls (check_order: an
    ExecutionError naming the refused call; without it, by the timeout), where rank 1's next
    step met rank 0's call and rank 0 returned the two steps' partials merged, without an error."""
    from treeattn.errors import ExecutionError

    w = _workload(p)
    inputs, exact = _two_inputs(rank, p, w)
    bad = (inputs["b"][0][..., :8], inputs["b"][1])
    out = {}

    def call(merger, key: str, args) -> None:  # noqa: ANN001
        try:
            out[key] = (merger(*args)[0] - exact["a" if args is inputs["a"] else "b"]).abs().max().item()
        except (ValueError, ExecutionError) as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    every = treeattn.Merger(build("allgather-merge", w, REF), dist.new_group(list(range(p))), timeout_s=2.0)
    call(every, "every_refused", bad)
    if rank == 1:  # and out of memory preparing the next call, after its order check: retried, it meets rank 0's
        out["every_oom"] = _out_of_memory_once(every, inputs["a"]) == "simulated"
    call(every, "every_a", inputs["a"])
    call(every, "every_b", inputs["b"])
    for case, algorithm, check in (("checked", "allgather-merge", True), ("unchecked", "star", False)):
        merger = treeattn.Merger(build(algorithm, w, REF), dist.new_group(list(range(p))), timeout_s=2.0,
                                 check_order=check)
        call(merger, f"{case}_a", inputs["a"])
        call(merger, f"{case}_b", bad if rank == 1 else inputs["b"])
        call(merger, f"{case}_next", inputs["a"] if rank == 1 else inputs["b"])
    yield out


def spaces(rank: int, p: int, out_dir: str):  # noqa: ANN201
    """Tag spaces agree across ranks. Two Mergers, one given the world as None and one as
    ``dist.group.WORLD``, called in different orders time out instead of merging each other's
    partials. Then (the process group made again after that timeout) rank 0's Merger fails
    before it communicates (a bad argument there only) and the others' time out; the group is
    made again once more, and a Merger built on every rank then merges exactly."""
    import time

    from treeattn.errors import ExecutionError

    w = _workload(p)
    plan = build("binomial", w, REF)
    g = torch.Generator().manual_seed(rank)
    inputs = {name: (torch.randn(w.batch, w.q_heads, w.head_dim, generator=g), torch.randn(w.batch, w.q_heads,
                                                                                        generator=g))
              for name in ("a", "b")}

    def again(name: str) -> None:
        dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=f"file://{out_dir}/{name}", rank=rank, world_size=p,
                                timeout=datetime.timedelta(seconds=60))

    out = {}
    a, b = treeattn.Merger(plan, timeout_s=3.0), treeattn.Merger(plan, group=dist.group.WORLD, timeout_s=3.0)
    try:
        for name, merger in ((("a", a), ("b", b)) if rank == 0 else (("b", b), ("a", a))):
            merger(*inputs[name])
        out["swapped"] = "no error"
    except ExecutionError as exc:
        out["swapped"] = f"{type(exc).__name__}: {exc}"
    time.sleep(1.0)
    again("store-1")
    try:
        treeattn.Merger(plan, timeout_s=-1.0 if rank == 0 else 2.0)
    except (ValueError, ExecutionError) as exc:
        out["failed"] = type(exc).__name__
    time.sleep(3.0)  # every rank has given up
    again("store-2")
    every, lses = [torch.zeros_like(inputs["a"][0]) for _ in range(p)], [torch.zeros_like(inputs["a"][1])
                                                                         for _ in range(p)]
    dist.all_gather(every, inputs["a"][0])
    dist.all_gather(lses, inputs["a"][1])
    exact = (torch.stack(every) * torch.softmax(torch.stack(lses), 0).unsqueeze(-1)).sum(0)
    try:
        got = treeattn.Merger(plan, timeout_s=3.0)(*inputs["a"])[0]
        out["again"] = None if got is None else (got - exact).abs().max().item()
    except ExecutionError as exc:
        out["again"] = f"{type(exc).__name__}: {exc}"
    yield out


def agreement(rank: int, p: int):  # noqa: ANN201
    """Ranks holding different plans or check_order (rank 0 alone checking took its peers' partials
    for its check), inputs that require grad, a group this rank is not in: one ValueError each, on
    every rank, at once; fp8 partials on the wire merge."""
    w = _workload(p)
    out = {}
    other = Workload(batch=1, q_heads=16, kv_heads=2, head_dim=16, split=w.split)  # as many rows as w
    for label, mine in (("algorithm", "binomial" if rank == 0 else "ring"),
                        ("shape", _workload(p) if rank == 0 else other), ("check_order", rank == 0)):
        plan = (build(mine, w, REF) if label == "algorithm" else
                build("allgather-merge", mine if label == "shape" else w, REF))
        try:
            treeattn.Merger(plan, timeout_s=5.0, check_order=mine if label == "check_order" else False)
            out[label] = "no error"
        except ValueError as exc:
            out[label] = str(exc)
    merger = treeattn.Merger(build("binomial", w, REF), timeout_s=5.0)
    o, lse = torch.zeros(w.batch, w.q_heads, w.head_dim, requires_grad=True), torch.zeros(w.batch, w.q_heads)
    try:
        merger(o, lse)
        out["grad"] = "no error"
    except ValueError as exc:
        out["grad"] = str(exc)
    with torch.no_grad():
        out["no_grad"] = merger(o, lse)[0] is not None
    group = dist.new_group([0, 1])
    if rank >= 2:
        try:
            treeattn.Merger(build("binomial", _workload(2), REF), group=group)
            out["outside"] = "no error"
        except ValueError as exc:
            out["outside"] = str(exc)
    yield out
    for name in ("binomial", "ring", "allgather-merge", "dcp-a2a"):
        wire8 = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=16, split=w.split, partial_dtype="fp8")
        plan = build(name, wire8, REF, result="heads" if name.startswith("dcp") else "all")
        yield {"method": name, **scenario(rank, p, plan, torch.float32, seed=7)}


def mixed_trio(rank: int, p: int):  # noqa: ANN201
    """The paper's three all-reduces over different chunkings: the max over every row, the
    numerator chunk by chunk, the denominator in the other order (each row takes effect once
    all three have run over it)."""
    from treeattn.plan.ir import Plan
    from treeattn.plan.schedule import Programs
    from treeattn.plan.validate import check

    w = _workload(p)
    progs = Programs(p)
    for r in range(p):
        progs.compute(r, 0)
        progs.collective(r, 1, "allreduce", "max", "lse")
        progs.collective(r, 2, "allreduce", "sum", "num", chunk=0)
        progs.collective(r, 3, "allreduce", "sum", "den", chunk=2)
        progs.collective(r, 4, "allreduce", "sum", "num", chunk=1)
        progs.collective(r, 5, "allreduce", "sum", "num", chunk=2)
        progs.collective(r, 6, "allreduce", "sum", "den", chunk=1)
        progs.collective(r, 7, "allreduce", "sum", "den", chunk=0)
    plan = Plan(algorithm="allreduce3", params={"chunks": 3}, workload=w, topology=REF, chunks=3,
                programs=progs.build(), result_ranks=tuple(range(p)))
    check(plan)
    yield {"method": "mixed-trio", "result": "all", "dtype_in": str(torch.float32),
           **scenario(rank, p, plan, torch.float32, seed=3)}


def bits_as_predicted(rank: int, p: int):  # noqa: ANN201
    """Plans whose ranks the bit tracker (``plan.bits``) says end with the same bits, and plans
    it says do not: the bits each rank gets, and the prediction."""
    from treeattn.plan.bits import bit_groups

    w = _workload(p)
    plans = {
        "direct/lined-up": build("direct", w, REF, groups=[[0, 2], [1, 3], [4, 5]]),
        "direct/crossed": build("direct", w, REF, groups=[[0, 3], [1, 2], [4, 5]]),
        "direct/rotated": build("direct", w, REF, groups=[[0, 5], [1, 3], [2, 4]]),
        "direct/unequal": build("direct", w, REF, groups=[[0, 1, 2], [3, 4], [5]]),
        "direct/crossed/bf16-wire": build("direct", dataclasses.replace(w, partial_dtype="bf16"), REF,
                                          groups=[[0, 3], [1, 2], [4, 5]]),
        "butterfly": build("butterfly", w, REF),
        "hierarchical": build("hierarchical", w, REF, group_size=3),
    }
    for name, plan in plans.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = scenario(rank, p, plan, torch.float32, seed=3)
        yield {"method": name, "predicted": {str(c): g for c, g in bit_groups(plan).items()},
               "warned": [str(w.message) for w in caught if "different bits" in str(w.message)], **got}


def empty_conventions(rank: int, p: int):  # noqa: ANN201
    """Empty shards as kernels give them: rank 1 FlashAttention-2's row with no keys (o = 0, lse =
    +inf), rank 2 a fully masked row (o = NaN, lse = -inf); then every rank empty so. The merged
    rows must be rank 0's partial alone, then (0, -inf): no NaN."""
    w = _workload(p)
    g = torch.Generator().manual_seed(5)
    o0, l0 = torch.randn(w.batch, w.q_heads, w.head_dim, generator=g), torch.randn(w.batch, w.q_heads, generator=g)
    for name, result in (("binomial", "all"), ("ring", "heads"), ("allgather-merge", "all"), ("allreduce3", "all"),
                         ("allreduce2", "root"), ("dcp-ag-rs", "heads"), ("dcp-a2a", "heads")):
        kwargs = {"root": p - 1} if result == "root" else {}
        merger = treeattn.Merger(build(name, w, REF, result=result, **kwargs))
        for every in (False, True):
            o, lse = (o0, l0) if rank == 0 and not every else (
                (torch.zeros_like(o0), torch.full_like(l0, float("inf"))) if rank % 2 else
                (torch.full_like(o0, float("nan")), torch.full_like(l0, float("-inf"))))
            out_o, out_l = merger(o, lse)
            if out_o is None:
                continue
            h0, h1 = merger.heads
            want_o, want_l = (torch.zeros_like(o0), torch.full_like(l0, float("-inf"))) if every else (o0, l0)
            yield {"method": name, "every": every, "nan": bool(out_o.isnan().any() or out_l.isnan().any()),
                   "equal": torch.allclose(out_o, want_o[:, h0:h1], atol=1e-6) and torch.allclose(
                       out_l, want_l[:, h0:h1], atol=1e-6)}


def narrow_sums(rank: int, p: int):  # noqa: ANN201
    """Every rank's partial the same o (exact in the partial dtype) and lse: the result is that
    o, also where the library sums p weighted rows (the two and three all-reduces: fp16 in its
    own dtype, fp8 through fp32), whose sum is up to p times o: past fp16's 65504 and fp8
    e4m3's 448 here."""
    for dtype, value in (("fp8", 160.0), ("fp16", 20000.0)):
        w = dataclasses.replace(_workload(p), partial_dtype=dtype)
        o, lse = torch.full((w.batch, w.q_heads, w.head_dim), value), torch.full((w.batch, w.q_heads), 3.0)
        for name, result in (("allreduce2", "all"), ("allreduce2", "heads"), ("allreduce2", "root"),
                             ("allreduce3", "all"), ("binomial", "all")):
            kwargs = {"root": p - 1} if result == "root" else {}
            out_o, out_l = treeattn.Merger(build(name, w, REF, result=result, **kwargs))(o, lse)
            if out_o is not None:
                yield {"method": f"{name} {result} {dtype}", "o": sorted(set(out_o.flatten().tolist())),
                       "lse_err": float((out_l - (3.0 + math.log(p))).abs().max())}


TASKS = {"bits_as_predicted": bits_as_predicted, "narrow_sums": narrow_sums, "empty_conventions": empty_conventions,
         "every_method": every_method, "mla": mla, "searched": searched, "subgroup": subgroup, "errors": errors,
         "mixed_trio": mixed_trio, "agreement": agreement, "orders": orders,
         "order_check": order_check, "order_misuse": order_misuse,
         "unsent_failure": unsent_failure, "refused_call": refused_call, "misuse": misuse, "lonely": lonely,
         "baselines_pooled": baselines_worker.pooled, "baselines_runner_pools": baselines_worker.runner_pools}


SPAWNED = {"searched"}
"""Tasks whose ranks are spawned, not forked (``main``)."""


def main() -> None:
    """``python -m tests.distributed.api_worker TASK RANKS PORT OUT_DIR``: run TASK on RANKS
    processes forked from this one (in this process, not pytest's: starting them leaves a
    resource-tracker process behind for the life of its parent). Forked, the ranks share this
    process's import of torch instead of each importing it again (4 ranks on 2 slow cores: 31
    -> 15 s a test); the API under test runs the same either way, on the CPU. The searched
    plans' ranks are spawned, each with a string hash of its own as under a launcher: ranks
    that built their plans in a hash-dependent order would disagree there."""
    import sys

    import torch.multiprocessing as mp

    task, p, port, out_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.start_processes(run_worker, args=(p, port, out_dir, task), nprocs=p,
                       start_method="spawn" if task in SPAWNED else "fork")


if __name__ == "__main__":
    main()
