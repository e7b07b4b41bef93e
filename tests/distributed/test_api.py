"""The public API on real gloo processes: ``attention_partial`` + ``Merger`` give exact attention
for every method and layout, on 2, 3 and 4 ranks, bf16 and fp32 inputs, GQA, empty shards;
subgroups; errors before anything is sent, and a rank that raised leaves its peers a timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from treeattn.exec.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(task: str, p: int, tmp_path) -> list[list[dict]]:  # noqa: ANN001
    res = subprocess.run([sys.executable, "-m", "tests.distributed.api_worker", task, str(p), str(free_port()),
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(p)]
    for r, items in enumerate(out):
        for item in items:
            assert "error" not in item, f"rank {r}: {item['error']}"
    return out


def tolerance(dtype_in: str) -> float:
    return 2e-2 if "bfloat16" in dtype_in else 1e-5


@pytest.mark.parametrize("p", [2, 3, 4])
def test_every_method_and_layout_is_exact(p, tmp_path):
    ranks = run("every_method", p, tmp_path)
    # Every rank of an "all" layout holds the same bits, as an all-reduce gives (the ranks of
    # direct and butterfly each merge the same partials: in rank order, as sent; on a bf16
    # wire under fp32 o, rows some rank copies end rounded on every rank, as the copies are).
    bits: dict[tuple, set[str]] = {}
    for items in ranks:
        for item in items:
            if item["result"] == "all":
                bits.setdefault((item["method"], item["dtype_in"]), set()).add(item["bits"])
    assert {key for key, seen in bits.items() if len(seen) > 1} == set()
    assert {"direct/bf16-wire", "butterfly/bf16-wire"} <= {m for m, _ in bits}
    seen = set()
    for r, items in enumerate(ranks):
        for item in items:
            seen.add((item["method"], item["result"]))
            key = (item["method"], item["result"], item["dtype_in"], r)
            if item["result"] == "root":
                assert item["none"] == (r != p - 1), key
                if r != p - 1:
                    continue
            assert not item["none"], key
            h0, h1 = item["heads"]
            if item["result"] == "heads":
                hq = 12 if p == 3 else 8
                assert (h0, h1) == (r * hq // p, (r + 1) * hq // p), key
            assert item["shape"][1] == h1 - h0
            assert item["dtype"] == item["dtype_in"], key
            tol = 2e-2 if item["method"].endswith("/bf16-wire") else tolerance(item["dtype_in"])
            assert item["err_o"] <= tol and item["err_l"] <= tol, key
            assert item["pooled"] and item["repeat_equal"], key
    assert {"allreduce3", "allreduce2", "allgather-merge", "dcp-ag-rs", "dcp-a2a", "binomial", "ring",
            "hierarchical"} <= {m for m, _ in seen}
    assert {("binomial", "heads"), ("binomial", "root"), ("allreduce2", "root"), ("ring", "heads")} <= seen


def test_an_mla_workload_merges_exactly(tmp_path):
    # D = 24 keys whose first Dv = 16 values are the values (one latent KV head): o and the
    # merge carry Dv, and every method in every layout gives exact attention
    ranks = run("mla", 3, tmp_path)
    seen = set()
    for r, items in enumerate(ranks):
        for item in items:
            key = (item["method"], item["result"], item["dtype_in"], r)
            if item["none"]:
                assert item["result"] == "root" and r != 2, key
                continue
            seen.add(item["method"])
            assert item["shape"][2] == (15 if item["method"].endswith("/bf16-wire") else 16), key
            tol = 2e-2 if item["method"].endswith("/bf16-wire") else tolerance(item["dtype_in"])
            assert item["err_o"] <= tol and item["err_l"] <= tol, key
            assert item["pooled"] and item["repeat_equal"], key
    assert seen == {"binomial", "direct", "butterfly", "allgather-merge", "allreduce3", "allreduce2", "dcp-ag-rs",
                    "dcp-a2a", "ring", "binomial/bf16-wire", "allgather-merge/bf16-wire", "dcp-a2a/bf16-wire"}


def test_the_ranks_end_with_the_bits_the_tracker_predicts(tmp_path):
    # plan.bits follows the executor's merges symbolically: ranks it says end with the same
    # bits must get them. It tells merges apart by their operands' order, so ranks it puts
    # apart may still agree (a sum of a and b first is a sum of b and a: direct/crossed swaps
    # only the first two of three), but where more moves, they differ.
    ranks = run("bits_as_predicted", 6, tmp_path)
    methods = [item["method"] for item in ranks[0]]
    measured: dict[str, list[list[int]]] = {}
    for i, method in enumerate(methods):
        by_bits: dict[str, list[int]] = {}
        for r, items in enumerate(ranks):
            by_bits.setdefault(items[i]["bits"], []).append(r)
        measured[method] = sorted(by_bits.values())
        predicted = ranks[0][i]["predicted"].get("0", [list(range(6))])
        assert all(any(set(g) <= set(m) for m in measured[method]) for g in predicted), (method, measured[method])
        # the Merger of such a plan warns when it is built
        assert bool(ranks[0][i]["warned"]) == bool(ranks[0][i]["predicted"]), method
    assert {m for m in methods if ranks[0][methods.index(m)]["predicted"]} == {
        "direct/crossed", "direct/rotated", "direct/unequal", "direct/crossed/bf16-wire"}
    assert measured["direct/rotated"] == [[0, 1, 2], [3, 4, 5]]
    assert measured["butterfly"] == measured["hierarchical"] == measured["direct/lined-up"] == [list(range(6))]


def test_trio_over_different_chunkings_is_exact(tmp_path):
    for r, (item,) in enumerate(run("mixed_trio", 2, tmp_path)):
        assert not item["none"] and item["err_o"] <= 1e-5 and item["err_l"] <= 1e-5, (r, item)
        assert item["pooled"] and item["repeat_equal"], (r, item)


def test_empty_shards_as_kernels_give_them_merge_as_empty(tmp_path):
    # lse = +inf (FlashAttention-2's row with no keys) and o = NaN beside lse = -inf (a fully
    # masked row) are empty partials: the result is the other ranks' merge, or (0, -inf)
    ranks = run("empty_conventions", 3, tmp_path)
    for r, items in enumerate(ranks):
        assert len(items) == (14 if r == 2 else 12)
        for item in items:
            assert not item["nan"] and item["equal"], (r, item)


def test_library_sums_of_narrow_partials_stay_in_their_range(tmp_path):
    # 4 ranks' o = 160 summed in fp8 e4m3 (range 448) came back 112, fp16's 20000 inf
    ranks = run("narrow_sums", 4, tmp_path)
    for r, items in enumerate(ranks):
        assert len(items) == (10 if r == 3 else 8)
        for item in items:
            want = 160.0 if item["method"].endswith("fp8") else 20000.0
            assert item["o"] == [want] and item["lse_err"] < 1e-5, (r, item)


def test_searched_plans_and_subgroups(tmp_path):
    ranks = run("searched", 4, tmp_path)
    for r, items in enumerate(ranks):
        assert [i["result"] for i in items] == ["all", "heads", "root:1"]
        for item in items:
            if item["result"] == "root:1" and r != 1:
                assert item["none"]
                continue
            assert item["err_o"] <= 1e-5 and item["err_l"] <= 1e-5, (r, item)
    ranks = run("subgroup", 3, tmp_path / "sub") if (tmp_path / "sub").mkdir() is None else None
    assert ranks[0] == [{"outside": True}]
    for items in ranks[1:]:
        assert items[0]["err_o"] <= 1e-5 and items[0]["heads"] == [0, 8]


def test_bad_input_raises_and_peers_time_out(tmp_path):
    ranks = run("errors", 3, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert "has 4 ranks but the process group has 3" in item["group-size"]
        assert "moves KV, not partials" in item["ring"]
        assert item["plan-type"] == ("TypeError: Merger: plan must be a Plan, or a plan file's path or text, got "
                                     "NoneType")
        assert item["timeout"] == "ValueError: Merger: timeout_s must be a number of seconds > 0, got None"
        assert item["device"] == "ValueError: Merger: device meta cannot hold the merge's buffers; give cpu or cuda"
        assert item["inference"] == "same", item["inference"]
        assert item["shape"].startswith("ValueError: Merger: o must be (B, Hq, Dv) = (2, 8, 16)")
        assert item["lse-dtype"].startswith("TypeError: Merger: lse must be float32")
        assert item["not-tensor"].startswith("TypeError: Merger: lse must be a torch.Tensor")
        if r == 0:
            assert item["peer"] == "raised"
        else:
            assert item["peer"].startswith("ExecutionError"), item
            # What to look for, beside the library's 'Operation timed out!' or 'Connection closed'. The
            # three calls refused on every rank above count as made: this call first checks the order.
            assert item["peer"].startswith(f"ExecutionError: rank {r}: Merger order check failed: "), item
            assert item["peer"].endswith("(the order check of Merger call 4 after call 3 of the group's Merger 2 was "
                                         "refused on this rank (TypeError: its arguments): every rank calls its "
                                         "Mergers in one order; a peer that raised before its call and lives on, or "
                                         "stopped calling, leaves the others here after timeout_s = 2 s; one whose "
                                         "process ended, at once (its connections close))"), item
            assert item["peer_s"] < 15


def test_misused_groups_sparse_inputs_and_a_destroyed_group_raise_one_clear_error(tmp_path):
    # Each came from inside torch naming no argument: 'unhashable type: list', 'Group world is not
    # registered', 'Could not run aten::cat.out with arguments from the SparseCPU backend', and,
    # after destroy_process_group, 'Default process group has not been initialized' from the
    # program's first message.
    ranks = run("misuse", 2, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert item["group-list"] == ("TypeError: Merger: group must be a torch.distributed ProcessGroup "
                                      "(dist.new_group(ranks)) or None (the world), got list [0, 1]"), (r, item)
        assert item["group-str"].startswith("TypeError: Merger: group must be a torch.distributed ProcessGroup"), r
        assert item["o-sparse"] == "TypeError: Merger: o must be a dense (strided) tensor, got layout torch.sparse_coo"
        assert item["lse-sparse"] == ("TypeError: Merger: lse must be a dense (strided) tensor, got layout "
                                      "torch.sparse_coo")
        assert item["good"] is not None and item["good"] <= 1e-5, (r, item)  # nothing was sent by the bad calls
        assert item["destroyed"].startswith("ValueError: Merger: called after torch.distributed."
                                            "destroy_process_group()"), (r, item)


def test_a_merger_built_on_one_rank_only_says_every_rank_builds_one(tmp_path):
    # It said 'rank 0: Merger plan check failed: Operation timed out!' and no more.
    item = run("lonely", 2, tmp_path)[0][0]
    assert item["lonely"].startswith("CommError: rank 0: Merger plan check failed: "), item
    assert item["lonely"].endswith("(Merger construction: every rank of the group constructs its Merger at the same "
                                   "point of its program; a rank that did not within timeout_s = 2 s, or failed "
                                   "before it, leaves the others here)"), item
    assert item["lonely_s"] < 4


def test_mergers_called_in_different_orders_time_out_instead_of_mixing_their_partials(tmp_path):
    # Both Mergers' messages had tags from one sequence per pair: rank 1's second Merger took
    # rank 0's first Merger's partial, and every rank returned wrong rows without an error.
    ranks = run("orders", 2, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert item["same-0"] <= 1e-5 and item["same-1"] <= 1e-5, (r, item)
        assert item["swapped"].startswith(f"CommError: rank {r}: "), (r, item)
        assert item["swapped_s"] < 15, (r, item)
    # The first rank to time out ends its scenario and closes its connections; its peer, waiting
    # too, may then hear the connection close before its own deadline.
    assert any("Timed out" in item["swapped"] for (item,) in ranks), ranks
    assert all("Timed out" in item["swapped"] or "Connection closed by peer" in item["swapped"]
               for (item,) in ranks), ranks


def test_check_order_catches_mergers_called_in_different_orders_before_anything_is_sent(tmp_path):
    # A plan of collectives has no tags to tell two Mergers apart: called in different orders,
    # the ranks merged each other's partials without an error. With check_order every rank
    # raises at once, naming each rank's call, and calls in one order merge exactly afterwards.
    ranks = run("order_check", 2, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert item["in_order"] <= 1e-5 and item["again"] <= 1e-5, (r, item)
        assert item["swapped"].startswith("ExecutionError: Merger: the ranks make different calls (rank 0: the "
                                          "group's Merger "), (r, item)
        assert "call 2; rank 1: the group's Merger " in item["swapped"], (r, item)
        assert item["swapped"].endswith("nothing was sent, so calls in one order from here on merge as before"), item
        assert item["swapped_s"] < 5, (r, item)


def test_a_call_interrupted_once_communicating_leaves_the_groups_mergers_refusing_calls(tmp_path):
    # A call interrupted on rank 1 after the order check, then called again (or the next layer's
    # Merger called), met rank 0 inside the merge's all-gather with the check's: gloo aborted the
    # process ('16512 vs 8'). A group's Mergers with and without the check met the same way.
    ranks = run("order_misuse", 2, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert item["number"] == [1, 2], item
        assert item["mixed"] == ("Merger: the Mergers of one process group check their order alike; this group's "
                                 "first Merger has check_order=True, this one False (a new group, dist.new_group, "
                                 "may check otherwise)"), item
        why = "was interrupted (KeyboardInterrupt)" if r else "failed (CommError)"
        for key in ("again", "sibling", "built"):
            assert item[key].startswith(f"ExecutionError: Merger: the process group's Mergers are not callable after "
                                        f"call 1 of the group's Merger 1 {why}: its peers may still be inside that "
                                        "call"), (r, key, item)
    assert ranks[1][0]["first"] == "KeyboardInterrupt: "
    assert ranks[0][0]["first"].startswith("CommError: rank 0: "), ranks[0]


def test_a_call_that_failed_before_sending_anything_leaves_the_group_callable(tmp_path):
    ranks = run("unsent_failure", 2, tmp_path)
    assert ranks[1][0]["failed"] == "simulated"
    for r, (item,) in enumerate(ranks):
        assert item["max_err"] <= 1e-5, (r, item)


def test_a_call_refused_on_one_rank_counts_as_made_so_no_later_call_merges_out_of_step(tmp_path):
    # Rank 1's refused call did not count: its next step met rank 0's call of the step before,
    # and rank 0 returned the two steps' partials merged, without an error (a new-user trial's
    # decode loop that caught the error and went on: every later step wrong on every rank).
    ranks = run("refused_call", 2, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert item["every_refused"].startswith("ValueError: Merger: o must be (B, Hq, Dv)"), (r, item)
        assert item["every_a"] <= 1e-5 and item["every_b"] <= 1e-5, (r, item)  # refused on every rank: in step
        # rank 1's call after it failed preparing (out of memory), after the order check had passed,
        # and was retried: the group was left uncallable (the check counted as communication)
        assert item.get("every_oom") is (True if r == 1 else None), (r, item)
        assert item["checked_a"] <= 1e-5 and item["unchecked_a"] <= 1e-5, (r, item)
        for key in ("checked_b",) if r == 0 else ("checked_next",):  # the calls that met
            assert item[key].startswith("ExecutionError: Merger: the ranks make different calls (rank 0: the "
                                        "group's Merger 1, call 2; rank 1: the group's Merger 1, call 3 (1 refused "
                                        "there for arguments)"), (r, key, item)
            assert item[key].endswith("(where a rank's call was refused for its arguments and its peers went on, "
                                      "only a new process group gets them in step)"), (r, key, item)
    assert ranks[1][0]["checked_b"].startswith("ValueError: Merger: o must be (B, Hq, Dv)"), ranks[1]
    assert ranks[0][0]["checked_next"].startswith("CommError: rank 0: Merger order check failed"), ranks[0]
    assert ranks[1][0]["unchecked_b"].startswith("ValueError: Merger: o must be (B, Hq, Dv)"), ranks[1]
    assert ranks[0][0]["unchecked_b"].startswith("CommError: rank 0: recv_merge chunk 0 with rank 1"), ranks[0]
    assert ranks[1][0]["unchecked_next"].startswith("CommError: rank 1: Merger order check failed"), ranks[1]
    assert ("the order check of Merger call 3 after call 2 of the group's Merger 1 was refused on this rank "
            "(ValueError: its arguments)") in ranks[1][0]["unchecked_next"], ranks[1]


@pytest.mark.parametrize("case", ["one", "two"])
def test_a_peer_inside_a_collective_when_a_call_is_refused_never_returns_wrong_rows(case):
    # Rank 1 refuses its third call and goes on; rank 0 is then inside that call's all-gather of
    # partials. The next call's order check met it: gloo took the check's shorter message into
    # rank 0's buffer without a word and rank 0 returned wrong rows (2 runs in 6; "two": the check
    # sized by the next Merger, a B=1 one, after a refusal in a B=8 call, 6 in 8). Now rank 0
    # gets a longer message and gloo aborts it; no step anywhere returns wrong rows.
    for attempt in range(3):  # a race in the first forms: a few runs
        port = str(free_port())
        procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.refused_worker", str(r), "2", port, case],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        outs = [proc.communicate(timeout=120) for proc in procs]
        lines = [out.splitlines() for out, _ in outs]
        assert lines[0][:2] == ["step 0: ok", "step 1: ok"] and lines[1][:3] == [
            "step 0: ok", "step 1: ok", "step 2: ValueError"], (attempt, outs)
        assert not any("WRONG" in line for rank in lines for line in rank), (attempt, outs)
        # every later call raised, or its process was ended by gloo (the peer inside the collective)
        for r, (proc, said) in enumerate(zip(procs, lines, strict=True)):
            later = [line for line in said[3 if r else 2:]]
            assert all(line.split(": ")[1] in ("ExecutionError", "CommError") for line in later), (attempt, outs)
            assert proc.returncode == 0 or proc.returncode == -signal.SIGABRT, (attempt, r, outs)
        assert any(p.returncode == -signal.SIGABRT for p in procs) or all(len(x) == 6 for x in lines), outs


def test_tag_spaces_agree_after_a_failed_construction_and_for_the_world_given_as_itself(tmp_path):
    # Each rank counted its Mergers' tag spaces alone: after rank 0's Merger failed before its
    # Comm, every later Merger had space 1 on rank 0 and 2 on rank 1, and every call timed out
    # (also after the process group was made again). A Merger given dist.group.WORLD counted
    # apart from one given None: the two shared space 1 and merged each other's partials (max
    # error about 3) when called in different orders.
    ranks = run("spaces", 2, tmp_path)
    for r, (item,) in enumerate(ranks):
        assert item["failed"] == ("ValueError" if r == 0 else "CommError"), (r, item)
        assert isinstance(item["again"], float) and item["again"] <= 1e-5, (r, item)
        assert item["swapped"].startswith(f"CommError: rank {r}: "), (r, item)
    # as in the test above: a peer that timed out first may close the connection on the other
    assert any("Timed out" in item["swapped"] for (item,) in ranks), ranks
    assert all("Timed out" in item["swapped"] or "Connection closed by peer" in item["swapped"]
               for (item,) in ranks), ranks


def test_plans_that_differ_across_ranks_grad_and_outsiders_raise_and_fp8_wire_merges(tmp_path):
    ranks = run("agreement", 3, tmp_path)
    for r, (item, *fp8) in enumerate(ranks):
        for label in ("algorithm", "shape", "check_order"):  # every rank says so, at construction, not hanging
            assert item[label].startswith("Merger: the ranks of the group hold different plans or check_order (ranks "
                                          "1, 2 differ from rank 0"), (r, label, item[label])
        assert f"check_order={r == 0})" in item["check_order"], item["check_order"]
        assert "requires grad" in item["grad"] and item["no_grad"], (r, item)
        if r >= 2:
            assert "not a member of the process group" in item["outside"], item
        for merged in fp8:  # e4m3 keeps 3 mantissa bits: o within a few percent; the lse travels in fp32
            assert not merged["none"] and merged["err_o"] <= 0.25 and merged["err_l"] <= 1e-4, (r, merged)


def test_attention_partial_checks_and_empty_shards():
    from treeattn import attention_partial

    q = torch.randn(2, 8, 16)
    o, lse = attention_partial(q, torch.zeros(2, 2, 0, 16), torch.zeros(2, 2, 0, 16))
    assert torch.equal(o, torch.zeros_like(q)) and bool(torch.isneginf(lse).all())
    with pytest.raises(ValueError, match="KV heads \\(3\\) must divide query heads \\(8\\)"):
        attention_partial(q, torch.zeros(2, 3, 4, 16), torch.zeros(2, 3, 4, 16))
    # a FlashAttention / HF flash cache (B, N, Hkv, D) given as is: said how to give it
    with pytest.raises(ValueError, match="a cache laid out \\(B, N, Hkv, D\\), as FlashAttention's, is "
                                         "k.transpose\\(1, 2\\)"):
        attention_partial(q, torch.zeros(2, 5, 2, 16), torch.zeros(2, 5, 2, 16))
    with pytest.raises(ValueError, match="q must be \\(B, Hq, D\\)"):
        attention_partial(q[0], torch.zeros(2, 2, 4, 16), torch.zeros(2, 2, 4, 16))
    with pytest.raises(TypeError, match="floating-point"):
        attention_partial(q, torch.zeros(2, 2, 4, 16, dtype=torch.int32), torch.zeros(2, 2, 4, 16))
    k = torch.randn(2, 2, 5, 16)
    o, lse = attention_partial(q, k, k, scale=0.5)
    s = torch.einsum("bhd,bhnd->bhn", q, k.repeat_interleave(4, dim=1)) * 0.5
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)
    for name, args in (("q", (q.to_sparse(), k, k)), ("k", (q, k.to_sparse(), k)), ("v", (q, k, k.to_sparse()))):
        with pytest.raises(TypeError, match=f"attention_partial: {name} must be a dense \\(strided\\) tensor, "
                                            "got layout torch.sparse_coo"):
            attention_partial(*args)
    for bad in ("x", float("nan"), [1]):  # named, not torch's bare conversion error
        with pytest.raises(ValueError, match="attention_partial: scale must be a finite number"):
            attention_partial(q, k, k, scale=bad)


def test_merger_needs_a_process_group():
    import treeattn
    from treeattn.plan.builders import build
    from treeattn.plan.ir import TopologyRef
    from treeattn.workload import Workload

    plan = build("binomial", Workload(batch=1, q_heads=4, kv_heads=4, head_dim=8, split=(3, 3)), TopologyRef("t", "f"))
    with pytest.raises(ValueError, match="init_process_group"):
        treeattn.Merger(plan)


@pytest.mark.parametrize(("device", "needle"), [
    ("meta", "device meta cannot hold the merge's buffers"),
    ("nonsense", "device 'nonsense' is not a torch device"),
    pytest.param("cuda", "this torch sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
])
def test_merger_refuses_an_unusable_device_before_it_allocates(device, needle):
    from treeattn.exec.merger import _usable_device

    with pytest.raises(ValueError, match=needle):
        _usable_device(device, "gloo")
    assert _usable_device("cpu", "gloo") == torch.device("cpu")
    # where torch puts a tensor asked for on cpu:1, which the inputs' device check compares with
    assert _usable_device("cpu:1", "gloo") == torch.device("cpu") == torch.empty(1, device="cpu:1").device
    with pytest.raises(ValueError, match="NCCL process group sends from CUDA devices"):
        _usable_device("cpu", "nccl")


def _two_cuda_devices_current_0(monkeypatch) -> None:
    """Make this torch say it has CUDA devices 0 and 1, 0 current (no device is touched)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_merger_device_cuda_is_the_current_device_and_another_is_refused(monkeypatch):
    # "cuda" without an index must become cuda:N: the inputs' device check compares with the
    # tensors' devices (cuda:0 != cuda), which refused every call's tensors. A device other
    # than the current one would put the markers and the Merger's own CUDA graph on the
    # current device's streams while the merge ran on the other's: refused before anything.
    from treeattn.exec.merger import _usable_device

    _two_cuda_devices_current_0(monkeypatch)
    assert _usable_device("cuda", "nccl") == torch.device("cuda", 0) == torch.device("cuda:0")
    assert _usable_device(torch.device("cuda", 0), "nccl") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"cuda:1 is not the current CUDA device \(cuda:0\); call "
                                         r"torch.cuda.set_device\(1\)"):
        _usable_device("cuda:1", "nccl")


@pytest.mark.parametrize(("name", "config", "device", "want"), [
    # init_process_group without a backend on a CUDA machine: CUDA tensors go by NCCL
    ("undefined", "cpu:gloo,cuda:nccl", None, ("nccl", torch.device("cuda", 0))),
    ("undefined", "cpu:gloo,cuda:nccl", "cuda", ("nccl", "cuda")),
    ("undefined", "cpu:gloo,cuda:nccl", "cpu", ("gloo", "cpu")),
    ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", None, ("nccl", torch.device("cuda", 0))),
    ("undefined", "cpu:gloo", None, ("gloo", torch.device("cpu"))),  # a CPU build's
    ("nccl", "cuda:nccl", None, ("nccl", torch.device("cuda", 0))),
    ("gloo", "cpu:gloo,cuda:gloo", None, ("gloo", torch.device("cpu"))),
    ("gloo", "cpu:gloo,cuda:gloo", "cuda", ("gloo", "cuda")),
])
def test_merger_takes_the_backend_of_its_tensors_device(monkeypatch, name, config, device, want):
    # A group made by init_process_group() without a backend is 'undefined' to get_backend:
    # read as gloo, the Merger ran on the CPU by default and, given CUDA tensors, took the gloo
    # path over NCCL (host-blocking waits, one op at a time in program order, no CUDA graph).
    from treeattn.exec import merger

    _two_cuda_devices_current_0(monkeypatch)
    monkeypatch.setattr(merger.dist, "get_backend", lambda group=None: name)
    monkeypatch.setattr(merger.dist, "get_backend_config", lambda group=None: config)
    assert merger._backend_and_device(None, device) == want
