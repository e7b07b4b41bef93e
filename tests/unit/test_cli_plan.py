"""``treeattn plan`` and ``treeattn compare`` as a user runs them."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.plan.builders import build
from treeattn.plan.io import load_plan
from treeattn.plan.validate import check

TREEATTN = str(Path(sys.executable).parent / "treeattn")
SHAPE = ("--model", "llama-3.1-8b", "--batch", "1", "--seq-len", "128K")


def test_plan_json_keys_and_plan_file(tmp_path):
    out = tmp_path / "p.yaml"
    res = run_cli("plan", "--topology", "dgx-h100-2node", *SHAPE, "--out", str(out), "--json", "--top", "5")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert {"best", "lower_bound_us", "baselines", "candidates", "plan_path"} <= set(data)
    assert {"algorithm", "params", "chunks", "predicted_us"} <= set(data["best"])
    assert {"allreduce3_nccl_us", "allreduce2_us", "allgather_merge_us", "ring_attention_us"} == set(data["baselines"])
    assert 1 <= len(data["candidates"]) <= 5
    assert data["plan_path"] == str(out)
    plan = load_plan(out)
    check(plan)
    assert plan.predicted_us == data["best"]["predicted_us"] == data["candidates"][0]["predicted_us"]
    # The headline: on two DGX nodes at B=1 the plan beats the paper's three all-reduces.
    assert data["best"]["predicted_us"] < data["baselines"]["allreduce3_nccl_us"]


def test_plan_is_byte_identical_on_rerun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ("plan", "--topology", "dgx-h100", *SHAPE, "--json", "--seed", "7")
    first = run_cli(*args)
    path = Path(json.loads(first.stdout)["plan_path"])
    # Under plans/local/, which .gitignore leaves to the user: a clone's tracked plans stay as shipped.
    assert path == Path("plans/local/dgx-h100.llama-3.1-8b.b1.n128K.yaml")
    blob = path.read_bytes()
    second = run_cli(*args)
    assert first.stdout == second.stdout and path.read_bytes() == blob


def test_plan_table_and_explain(tmp_path):
    res = run_cli("plan", "-t", "dgx-h100-2node", "--ranks", "0-3,8-11", *SHAPE, "-o", str(tmp_path / "x.yaml"),
                  "--explain", "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert "Candidates" in res.stdout and "Per-level cost" in res.stdout
    # The schedules the search skipped because their floor could not beat the best are counted.
    skipped = re.search(r"searched \d+ schedules \((\d+) simulations, (\d+) skipped by their floor\)", res.stdout)
    assert skipped and int(skipped.group(2)) > 0
    plan = load_plan(tmp_path / "x.yaml")
    assert plan.ranks == 8 and "ranks 0-3,8-11" in plan.topology.name
    # the pick here is a direct exchange (no tree to draw); a tree plan draws its tree
    res = run_cli("plan", "-t", "dgx-h100-2node", "--ranks", "0-3,8-11", *SHAPE, "-o", str(tmp_path / "t.yaml"),
                  "--algorithm", "binomial", "--explain")
    assert res.exit_code == 0, res.stderr
    assert "root rank" in res.stdout and "Per-level cost" in res.stdout


def test_algorithm_list():
    res = run_cli("plan", "--algorithm", "list", "--json")
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert {"tree", "star", "kary", "binomial", "butterfly", "ring", "hierarchical", "multirail",
            "allreduce3"} <= set(data)
    assert "fanout" in data["kary"]["params"]
    text = run_cli("plan", "--algorithm", "list")
    assert text.exit_code == 0 and "hierarchical" in text.stdout and "fanout" in text.stdout


def test_named_algorithm(tmp_path):
    out = tmp_path / "k.yaml"
    res = run_cli("plan", "-t", "dgx-h100", *SHAPE, "--algorithm", "kary", "--fanout", "3", "--chunks", "2",
                  "-o", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["best"]["algorithm"] == "kary" and data["best"]["chunks"] == 2
    assert data["best"]["params"]["fanout"] == 3
    plan = load_plan(out)
    assert plan.algorithm == "kary" and plan.predicted_us == data["best"]["predicted_us"]
    # the same keys as a search's candidates: what rebuilds it
    assert data["best"]["build_params"] == {"fanout": 3, "result": "all"}
    again = build("kary", plan.workload, plan.topology, chunks=2, **data["best"]["build_params"])
    assert again.programs == plan.programs and again.params == plan.params
    res = run_cli("plan", "-t", "dgx-h100-2node", *SHAPE, "-a", "hierarchical", "--groups", "0-7/8-15",
                  "--intra", "binomial", "-o", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["best"]["params"]["groups"] == [list(range(8)), list(range(8, 16))]


def test_whole_rows_builds_heads_of_an_all_plan(tmp_path):
    out = tmp_path / "w.yaml"
    res = run_cli("plan", "-t", "dgx-h100-2node", *SHAPE, "-a", "direct", "--groups", "0-7/8-15", "--result",
                  "heads", "--whole-rows", "-o", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    plan = load_plan(out)
    assert plan.result == "heads" and plan.params["whole_rows"] is True and plan.chunks == 16
    assert plan.params["groups"] == [list(range(8)), list(range(8, 16))]
    full = run_cli("plan", "-t", "dgx-h100-2node", *SHAPE, "-a", "direct", "--groups", "0-7/8-15", "-o",
                   str(tmp_path / "f.yaml"), "--json")
    # the same messages: the same time (the merge of every row on every rank)
    assert json.loads(res.stdout)["best"]["predicted_us"] == json.loads(full.stdout)["best"]["predicted_us"]
    assert "--whole-rows" in run_cli("plan", "--algorithm", "list").stdout


def test_raw_payload(tmp_path):
    res = run_cli("plan", "-t", "dgx-h100", "--bytes", "1MiB", "--op", "sum", "-o", str(tmp_path / "r.yaml"),
                  "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["workload"]["kind"] == "raw" and set(data["baselines"]) == {"allreduce_nccl_us", "allgather_merge_us"}
    res = run_cli("plan", "-t", "cpu-4", "--bytes", "64KiB", "-a", "binomial", "-o", str(tmp_path / "b.yaml"))
    assert res.exit_code == 0, res.stderr
    assert load_plan(tmp_path / "b.yaml").is_raw


@pytest.mark.parametrize(
    "args, needle",
    [
        (("-t", "dgx-h100", "--model", "gpt-9", "--seq-len", "1K"), "unknown model 'gpt-9'"),
        # a mistyped model is named before the missing sequence length
        (("-t", "dgx-h100", "--model", "llama3"), "--model: unknown model 'llama3'"),
        (("-t", "dgx-h100", *SHAPE, "--ranks", "0-9"), "rank 8 does not exist"),
        (("-t", "dgx-h100", *SHAPE, "--ranks", "3-1"), "runs backwards"),
        (("-t", "dgx-h101", *SHAPE), "unknown topology 'dgx-h101'"),
        (("-t", "dgx-h100", "--model", "llama-3.1-8b", "--batch", "-4", "--seq-len", "1K"), "--batch must be"),
        (("-t", "dgx-h100", "--model", "llama-3.1-8b", "-n", "12Q"), "cannot read --seq-len '12Q'"),
        # a negative length is read, then refused as a zero is: not as text that cannot be read
        (("-t", "dgx-h100", "--model", "llama-3.1-8b", "-n", "-5"), "--seq-len must be at least 1 token, got '-5'"),
        # a number typer cannot convert is said as treeattn says a bad value, not in pydantic's words
        (("-t", "dgx-h100", "--model", "llama-3.1-8b", "-n", "1K", "-b", "1.5"),
         "treeattn plan: --batch must be a whole number, got '1.5' (see --help)"),
        (("-t", "dgx-h100", *SHAPE, "--mem-fraction", "half"), "--mem-fraction must be a number, got 'half'"),
        # a flag's bad value is the flag's, however the workload's reader names the key it sets
        (("-t", "dgx-h100", *SHAPE, "--heads", "0"), "error: --heads must be a positive integer, got 0"),
        # a KV cache no device holds says every term of it, whichever flag, file key or preset set it
        (("-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "999G"), "error: workload: rank 0's KV cache of 32 layers "
         "(batch 1 x 134083510272 tokens x 8 KV heads x 256 values x 2 bytes a layer) is 1.598e+04 TiB, over 1 TiB"),
        (("-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "1K", "--layers", "100000000"),
         "error: workload: rank 0's KV cache of 100000000 layers (batch 1 x 128 tokens x 8 KV heads x 256 values x 2 "
         "bytes a layer) is 47.68 TiB"),
        (("-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "1K", "--batch", "nan"),
         "--batch must be a whole number, got 'nan'"),
        # named by the flags that give them, not the workload file's keys (seq_len: 128K)
        (("-t", "dgx-h100", "--model", "llama-3.1-8b"), "give the sequence length: --seq-len N (-n 128K)"),
        (("-t", "dgx-h100", "--heads", "8", "-n", "8K"), "give --model NAME (--model list shows them), or --heads "
         "and --head-dim"),
        (("-t", "dgx-h100", "--bytes", "0"), "--bytes must be at least one fp32 element (4 bytes), got '0'"),
        (("-t", "dgx-h100", "--bytes", "6"), "--bytes must be a whole number of fp32 elements (4 bytes each), got 6"),
        (("-t", "dgx-h100", "--bytes", "1.5B"), "--bytes '1.5B' is not a whole number of bytes"),
        ((*SHAPE,), "give --topology"),
        (("-t", "dgx-h100", *SHAPE, "--chunks", "2"), "add --algorithm"),
        (("-t", "dgx-h100", *SHAPE, "-a", "star", "--fanout", "3"), "takes no fanout"),
        # a builder's own checks name the flag, not the API's parameter ('group_size must be ...')
        (("-t", "cpu:ranks=4", *SHAPE, "-a", "hierarchical", "--group-size", "0"),
         "--group-size must be an integer >= 1, got 0"),
        (("-t", "cpu:ranks=4", *SHAPE, "-a", "kary", "--fanout", "0"), "--fanout must be an integer >= 1, got 0"),
        (("-t", "cpu:ranks=4", *SHAPE, "-a", "multirail", "--trees", "0"), "--trees must be an integer in [1, 4]"),
        (("-t", "dgx-h100", *SHAPE, "-a", "tree", "--parents", "1,0,1,2,3,4,5,5"), "exactly one root"),
        # an empty item is a slip, not a rank left out: -1,0,0,1,1 would be a valid tree of five ranks
        (("-t", "cpu:ranks=5", *SHAPE, "-a", "tree", "--parents", "-1,0,0,1,,1"),
         "--parents '-1,0,0,1,,1': item 5 is empty; write integers separated by commas"),
        (("-t", "cpu:ranks=8", *SHAPE, "-a", "tree", "--parents", "-1,0,0,1/-1,x"),
         "--parents '-1,x': item 2 ('x') is not an integer"),
        # the tree's own checks, said with the flag (they named none)
        (("-t", "cpu:ranks=4", *SHAPE, "-a", "tree", "--parents=-1,0,0"),
         "--parents '-1,0,0': the parent list names 3 ranks but there are 4"),
        (("-t", "cpu:ranks=4", *SHAPE, "-a", "tree", "--parents=-1,0,0,9"),
         "--parents '-1,0,0,9': rank 3's parent 9 is not a rank in [0, 4)"),
        (("-t", "cpu:ranks=4", *SHAPE, "-a", "tree", "--parents", "-1,0,0,0/1,-1,1,1"),
         "--parents '-1,0,0,0/1,-1,1,1': tree takes one parent list; '/' separates the trees of multirail"),
        (("-t", "dgx-h100", "--bytes", "1KB", "--heads", "8"), "--bytes gives a raw payload"),
        (("-t", "dgx-h100", "--bytes", "-1"), "--bytes must be at least one fp32 element (4 bytes), got '-1'"),
        (("-t", "dgx-h100", *SHAPE, "--whole-rows"), "--whole-rows set(s) a named algorithm's parameters"),
        # a raw buffer is summed; only a decode shape's partials are merged
        (("-t", "dgx-h100", "--bytes", "1M", "--op", "merge"), "a raw payload is summed (op sum), got 'merge'"),
        (("-t", "dgx-h100", "--bytes", "1M", "--op", "merge", "-a", "allgather-merge"), "a raw payload is summed"),
        (("-t", "dgx-h100", *SHAPE, "-a", "star", "--whole-rows"), "--whole-rows keeps each rank's own heads of an all "
         "plan: add --result heads (not all)"),
        (("-t", "dgx-h100", *SHAPE, "-a", "dcp-a2a", "--whole-rows"),  # not "add --result heads", then this
         "--whole-rows keeps each rank's own heads of an all plan; dcp-a2a builds no all plan"),
        (("-t", "dgx-h100", *SHAPE, "-a", "star", "--result", "heads", "--whole-rows", "--chunks", "2"),
         "--whole-rows sends every row in one message: --chunks must be 1, not 2"),
        (("-t", "dgx-h100", *SHAPE, "-a", "ring", "--result", "heads", "--whole-rows"), "ring cuts the rows"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    res = run_cli("plan", *args)
    assert res.exit_code == 2
    assert needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_compare_csv_and_json(tmp_path):
    out = tmp_path / "c.csv"
    res = run_cli("compare", "-t", "dgx-h100:nodes={1,2}", "--seq-lens", "8K,64K", "--heads", "16",
                  "--head-dim", "128", "--csv", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == 2 * 2 * 8
    with open(out) as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == len(rows) and lines[0]["method"] == "tree"
    speed = {(r["ranks"], r["seq_len"]): r["speedup_of_tree"] for r in rows if r["method"] == "ring-attention"}
    # the tree's advantage over ring attention grows with sequence length and with rank count
    assert speed[(8, 65536)] > speed[(8, 8192)] and speed[(16, 65536)] > speed[(16, 8192)]
    assert speed[(16, 65536)] > speed[(8, 65536)]
    peak = {r["method"]: r["peak_bytes"] for r in rows if r["ranks"] == 16 and r["seq_len"] == 65536}
    assert peak["ring-attention"] > peak["tree"]
    delivered = {r["method"]: r["result"] for r in rows}
    assert delivered["dcp-a2a"] == delivered["dcp-ag-rs"] == "heads" and delivered["allreduce2"] == "all"
    assert all(r["fits"] for r in rows)


def test_compare_takes_plans_length_flags():
    # A user coming from `plan -n 1M` types the same flag to compare: one length, or several.
    by = {}
    for flag in ("--seq-lens", "--seq-len", "-n"):
        res = run_cli("compare", "-t", "dgx-h100", "-m", "llama-3.1-8b", flag, "8K,64K", "--json")
        assert res.exit_code == 0, res.stderr
        by[flag] = json.loads(res.stdout)["rows"]
    assert by["-n"] == by["--seq-len"] == by["--seq-lens"] and {r["seq_len"] for r in by["-n"]} == {8192, 65536}


@pytest.mark.parametrize("flag", ["-n", "--seq-len", "--seq-lens"])
def test_compare_names_its_length_flag_by_all_its_names(flag):
    # `compare -n abc` said "--seq-lens", a flag the user had not typed; plan's -n says --seq-len.
    res = run_cli("compare", "-t", "dgx-h100", "-m", "llama-3.1-8b", flag, "abc")
    assert res.exit_code == 2
    assert res.stderr == "error: cannot read -n/--seq-len/--seq-lens 'abc'; write it like 4096, 128K or 1M\n"


def test_compare_heads_layout_and_rank_order_ring():
    base = ("compare", "-t", "dgx-h100:nodes=4", "--seq-lens", "64K", "-m", "llama-3.1-8b", "--json")
    rows = {r["method"]: r for r in json.loads(run_cli(*base, "--result", "heads").stdout)["rows"]}
    assert {r["result"] for r in rows.values() if r["method"] not in ("ring-attention", "allreduce3",
                                                                      "allgather-merge")} == {"heads"}
    rank = {r["method"]: r for r in json.loads(run_cli(*base, "--ring", "rank").stdout)["rows"]}
    topo = {r["method"]: r for r in json.loads(run_cli(*base).stdout)["rows"]}
    # the rank-order ring changes rails at every node boundary, two crossings meet on a spine link
    assert rank["ring-attention"]["predicted_us"] > topo["ring-attention"]["predicted_us"]


def test_compare_legend_says_what_each_row_assumes_and_delivers():
    # Under root:R, AR2 reduces to R; ring attention, the ring, AR3 and all-gather + merge give
    # every rank the result, vLLM's DCP each rank its heads: each legend line says so.
    res = run_cli("compare", "-t", "dgx-h100", "--seq-lens", "8K", "-m", "llama-3.1-8b", "--result", "root:3",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    from treeattn.search.compare import SHORT

    def legend_of(text: str) -> dict[str, str]:
        return {line.split()[0]: line for line in text.splitlines()
                if line.startswith("  ") and line.split()[:1] and line.split()[0] in SHORT.values()}

    legend = legend_of(res.stdout)
    assert legend["AR2"].endswith("one library sum of (w o, w)"), legend["AR2"]
    assert all(legend[m].endswith(" [all]") for m in ("ringA", "ring", "AR3", "AG+M")), legend
    assert legend["AG+RS"].endswith(" [heads]") and legend["A2A"].endswith(" [heads]"), legend
    assert max(len(line) for line in legend.values()) <= 80
    # Where every method delivers the layout compared (heads on 8 ranks: ringA, AR3 and AG+M
    # cannot), nothing is marked but what differs.
    res = run_cli("compare", "-t", "dgx-h100", "--seq-lens", "8K", "-m", "llama-3.1-8b", "--result", "heads",
                  "--no-progress")
    marked = {m for m, line in legend_of(res.stdout).items() if line.endswith("]")}
    assert marked == {"ringA", "AR3", "AG+M"}, marked


def test_compare_tells_apart_two_topologies_of_one_rank_count():
    # Both have 8 ranks: labelled by the rank count alone ("8 8K"), the figures of two
    # machines could not be told apart, so each gets a letter the header explains.
    res = run_cli("compare", "-t", "{dgx-h100,hgx-h200}", "--seq-lens", "8K", "-m", "llama-3.1-8b", "--no-progress")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "8 ranks: dgx-h100 (8a), hgx-h200 (8b)", lines[0]
    labels = [line.split()[:2] for line in lines if line.startswith(" 8")]
    assert labels == [["8a", "8K"], ["8b", "8K"]] * 4, labels  # one row each in each of the four tables


def test_compare_marks_a_speedup_over_a_method_that_does_not_fit():
    # 70B over 8 H100s at 1800K: 70.3 GiB of KV a GPU fits the 72 usable, ring attention's two
    # blocks in flight (1.76 GiB) do not; a speedup over it must say it could not run.
    res = run_cli("compare", "-t", "dgx-h100", "-m", "llama-3.1-70b", "--seq-lens", "1800K,1M", "--no-progress")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    at = lines.index("tree faster by (x); * does not fit")
    rows = {line.split()[1]: line.split()[2:] for line in lines[at:at + 7] if line.startswith(" 8 ")}
    assert rows["1800K"][1].endswith("*") and not any(c.endswith("*") for c in rows["1800K"][2:]), rows
    assert not any(c.endswith("*") for c in rows["1M"]), rows
    # where everything fits, the title has no footnote to explain
    res = run_cli("compare", "-t", "dgx-h100", "-m", "llama-3.1-70b", "--seq-lens", "1M", "--no-progress")
    assert "tree faster by (x)" in res.stdout.splitlines() and "*" not in res.stdout.split("peak bytes")[0]


def test_compare_bad_input():
    res = run_cli("compare", "-t", "dgx-h100", "--nodes", "1,2", "--seq-lens", "8K", "--model", "gpt-9")
    assert res.exit_code == 2 and "unknown model" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = run_cli("compare", "-t", "dgx-h100:nodes={1,2}", "--nodes", "4", "--seq-lens", "8K", "-m", "llama-3.1-8b")
    assert res.exit_code == 2 and "not both" in res.stderr
    res = run_cli("compare", "-t", "dgx-h100", "--seq-lens", "0", "-m", "llama-3.1-8b")
    assert res.exit_code == 2 and "--seq-lens" in res.stderr
    res = run_cli("compare", "-t", "cpu-4", "--nodes", "2", "--seq-lens", "8K", "-m", "llama-3.1-8b")
    assert res.exit_code == 2 and "cpu-4" in res.stderr
    res = run_cli("compare", "-t", "dgx-h100", "--seq-lens", "8K,,64K", "-m", "llama-3.1-8b")
    assert res.exit_code == 2, res.stderr  # not read as "8K,64K"
    assert "cannot read -n/--seq-len/--seq-lens '8K,,64K': item 2 ''" in res.stderr
    # not read as 1,2, as no --nodes at all (one node), or as 1
    for nodes, said in (("1,,2", "item 2 is empty"), (",", "names nothing"), ("1,", "item 2 is empty")):
        res = run_cli("compare", "-t", "dgx-h100", "--nodes", nodes, "--seq-lens", "8K", "-m", "llama-3.1-8b")
        assert res.exit_code == 2 and res.stderr.startswith(f"error: --nodes {nodes!r}{':' if 'item' in said else ''} "
                                                            f"{said}"), res.stderr
    # a bad fraction is said as such, not as a KV cache that fits no device
    res = run_cli("compare", "-t", "dgx-h100", "--seq-lens", "8K,16K", "--mem-fraction", "1.5", "-m", "llama-3.1-8b")
    assert res.exit_code == 2 and res.stderr == "error: --mem-fraction must be in (0, 1], got 1.5\n", res.stderr


def test_compare_leaves_out_the_lengths_whose_kv_cache_fits_no_device():
    # 70B at B = 16 over 16 A100s: 128K fits (40 GiB of KV a GPU), 256K does not (80 of 72 usable).
    base = ("compare", "-t", "dgx-a100:nodes=2", "-m", "llama-3.1-70b", "-b", "16")
    res = run_cli(*base, "--seq-lens", "128K,256K", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {r["seq_len"] for r in out["rows"]} == {131072}
    [gone] = out["left_out"]
    assert (gone["topology"], gone["seq_len"]) == ("dgx-a100:nodes=2", 262144)
    assert gone["why"].startswith("N=256K: needs 80 GiB of KV per GPU")
    text = run_cli(*base, "--seq-lens", "128K,256K").stdout
    assert "left out, the KV cache does not fit: N=256K: needs 80 GiB of KV per GPU" in text
    res = run_cli(*base, "--seq-lens", "256K,1M")
    assert res.exit_code == 2 and res.stderr.startswith("error: no sequence length fits any topology; N=256K")
    # A KV cache past any device's memory (over 1 TiB a rank) is left out the same way, not the whole run.
    res = run_cli(*base, "--seq-lens", "128K,100M", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {r["seq_len"] for r in out["rows"]} == {131072}
    [gone] = out["left_out"]
    assert gone["why"].startswith("N=100M: workload: rank 0's KV cache of 80 layers (batch 16 x 6553600 tokens")
    assert "over 1 TiB" in gone["why"]


def _plan_over(tmp_path: Path, topology: str, workload: Path, *flags: str) -> tuple:
    """``plan`` of ``workload`` with ``flags`` over it: the result and the plan file's text ("" if none)."""
    out = tmp_path / "p.yaml"
    out.unlink(missing_ok=True)
    res = run_cli("plan", "-t", topology, "--workload", str(workload), *flags, "-o", str(out))
    return res, out.read_text() if out.exists() else ""


def test_a_workload_files_own_batch_no_device_holds_is_checked_at_the_flags(tmp_path):
    # 405B at 1M tokens for a batch of 4096 is 252 TiB of KV a rank: --batch 1 (or a shorter
    # -n, a smaller --kv-dtype, fewer --layers) replaces the size the file's own checks met
    # first, which refused the file before the flag could apply.
    wl = tmp_path / "big.yaml"
    wl.write_text("model: llama-3.1-405b\nseq_len: 1M\nbatch: 4096\n")
    res, text = _plan_over(tmp_path, "dgx-h100", wl, "--batch", "1")
    assert res.exit_code == 0, res.stderr
    assert "batch: 1," in text and "seq_len: 1048576," in text
    res, _ = _plan_over(tmp_path, "dgx-h100", wl, "--kv-dtype", "fp8")
    assert res.exit_code == 2 and res.stderr.startswith(  # still too large: said at the flag's size, as the flags'
        "error: workload: rank 0's KV cache of 126 layers (batch 4096 x 131072 tokens x 8 KV heads x 256 values x 1 "
        "byte a"), res.stderr


def test_compare_takes_a_workload_files_own_length(tmp_path):
    # It compared the default 128K and 1M instead (and spread an uneven split evenly, saying so).
    wl = tmp_path / "w.yaml"
    for text, lens in (("model: llama-3.1-8b\nseq_len: 16K\n", [16384]),
                       ("model: llama-3.1-8b\nsplit: [3K, 1K, 0, 0]\n", [4096]),
                       ("model: llama-3.1-8b\nbatch: 2\n", [131072, 1048576])):  # none of its own: the defaults
        wl.write_text(text)
        res = run_cli("compare", "-t", "cpu:ranks=4", "--workload", str(wl), "--json")
        assert res.exit_code == 0 and "split evenly" not in res.stderr, res.stderr
        assert sorted({r["seq_len"] for r in json.loads(res.stdout)["rows"]}) == lens
    res = run_cli("compare", "-t", "cpu:ranks=4", "--workload", str(wl), "-n", "4K", "--json")  # -n still wins
    assert sorted({r["seq_len"] for r in json.loads(res.stdout)["rows"]}) == [4096]


@pytest.mark.parametrize(("text", "flags"), [
    ("heads: 30\nkv_heads: 8\nhead_dim: 128\nseq_len: 16K\n", ("--heads", "32")),
    ("heads: 32\nkv_heads: 7\nhead_dim: 128\nseq_len: 16K\n", ("--kv-heads", "8")),
    ("heads: 32\nkv_heads: 7\nhead_dim: 128\nseq_len: 16K\n", ("-m", "llama-3.1-8b")),  # a preset replaces heads
    ("model: llama-3.1-8b\nbatch: 0\nseq_len: 16K\n", ("-b", "2")),
    ("model: llama-3.1-8b\nseq_len: 16K\nkv_dtype: int4\n", ("--kv-dtype", "fp16")),
    ("model: llama-3.1-8x\nseq_len: 16K\n", ("-m", "llama-3.1-8b")),
    ("model: llama-3.1-8b\nsplit: [1K, 1K, 1K]\n", ("-n", "4K")),
    ("heads: 8\nkv_heads: 1\nhead_dim: 128\nv_head_dim: 256\nkv_latent: true\nseq_len: 4K\n", ("--no-kv-latent",)),
    ("heads: 32\nq_heads: 16\nhead_dim: 64\nseq_len: 4K\n", ("--heads", "16")),
])
def test_a_flag_replaces_a_files_value_before_it_is_judged(tmp_path, text, flags):
    # The file was checked alone first, and refused for the value the flag replaces.
    wl = tmp_path / "w.yaml"
    wl.write_text(text)
    res, plan = _plan_over(tmp_path, "cpu:ranks=4", wl, *flags)
    assert res.exit_code == 0 and plan, res.stderr
    alone, _ = _plan_over(tmp_path, "cpu:ranks=4", wl, *(("-n", "8K") if "-n" not in flags else ("-b", "1")))
    assert alone.exit_code == 2 and alone.stderr.startswith(f"error: {wl}: "), alone.stderr  # still the file's own


def test_a_flags_length_no_device_holds_is_said_as_the_flags(tmp_path):
    # It named the file ('w.yaml: rank 0's KV cache ...') for -n's length over the file's own
    # or where the file gives none; one parent list is a multirail of one rail (a traceback).
    wl = tmp_path / "w.yaml"
    for text in ("model: llama-3.1-8b\nseq_len: 4K\n", "model: llama-3.1-8b\n"):
        wl.write_text(text)
        res, _ = _plan_over(tmp_path, "cpu-4", wl, "-n", "1000M")
        assert res.exit_code == 2 and res.stderr.startswith("error: workload: rank 0's KV cache of 32 layers (batch 1 "
                                                            "x 262144000 tokens"), res.stderr
    res = run_cli("plan", "-t", "cpu-4", "-m", "llama-3.1-8b", "-n", "8K", "-a", "multirail", "--parents=-1,0,0,0",
                  "-o", str(tmp_path / "m.yaml"))
    assert res.exit_code == 0, res.stderr


def test_bytes_over_a_decode_shape_file_is_refused(tmp_path):
    # The file's shape was dropped unsaid (a raw payload of --bytes planned instead), where
    # --bytes beside shape flags, and shape flags over a raw file, are refused.
    wl = tmp_path / "w.yaml"
    wl.write_text("model: llama-3.1-8b\nseq_len: 4K\nbatch: 16\n")
    res, text = _plan_over(tmp_path, "cpu:ranks=4", wl, "--bytes", "2MiB")
    assert res.exit_code == 2 and not text, res.stderr
    assert res.stderr == f"error: {wl} is a decode shape; --bytes gives a raw payload: drop one of them\n"
    wl.write_text("")  # a file of no key takes --bytes as its size
    res, text = _plan_over(tmp_path, "cpu:ranks=4", wl, "--bytes", "2MiB")
    assert res.exit_code == 0 and "kind: raw" in text, res.stderr


def test_a_workload_files_own_length_no_device_holds_is_refused_unless_replaced(tmp_path):
    # 70B at 64M tokens is 2.5 TiB of KV a rank on one node: the file's error, said as the
    # file's, where nothing replaces its length; -n's length replaces it (and is what is checked).
    wl = tmp_path / "mid.yaml"
    wl.write_text("model: llama-3.1-70b\nbatch: 1\nseq_len: 64M\n")
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(wl), "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 2 and res.stderr.startswith(
        f"error: {wl}: rank 0's KV cache of 80 layers (batch 1 x 8388608 tokens x 8 KV heads x 256 values x "
        "2 bytes a layer) is 2.5 TiB, over 1 TiB"), res.stderr
    res = run_cli("compare", "-t", "dgx-h100", "--nodes", "1,4", "-n", "64K", "--workload", str(wl), "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {(r["topology"], r["seq_len"]) for r in out["rows"]} == {("dgx-h100", 65536), ("dgx-h100:nodes=4", 65536)}
    assert out["left_out"] == []
    wl.write_text("model: llama-3.1-70b\nbatch: 1\n")  # no length of its own: -n's lengths are compared
    res = run_cli("compare", "-t", "dgx-h100", "--nodes", "1,4", "-n", "64K,100M", "--workload", str(wl), "--json")
    assert res.exit_code == 0, res.stderr
    assert {(x["topology"], x["seq_len"]) for x in json.loads(res.stdout)["left_out"]} == {
        ("dgx-h100", 104857600), ("dgx-h100:nodes=4", 104857600)}


def test_heads_over_a_workload_file_without_kv_heads_takes_them_along(tmp_path):
    # kv_heads defaults to the query heads: a file that leaves it out follows --heads (it was
    # refused: 'workload.kv_heads (12) must divide --heads (7)', a key the file does not have)
    wl = tmp_path / "wl.yaml"
    wl.write_text("heads: 12\nhead_dim: 64\nseq_len: 4K\n")
    res, text = _plan_over(tmp_path, "cpu:ranks=4", wl, "--heads", "7")
    assert res.exit_code == 0, res.stderr
    assert "kv_heads: 7," in text and "q_heads: 7," in text
    wl.write_text("heads: 12\nkv_heads: 4\nhead_dim: 64\nseq_len: 4K\n")  # grouped: its KV heads stay
    res, text = _plan_over(tmp_path, "cpu:ranks=4", wl, "--heads", "8")
    assert res.exit_code == 0 and "kv_heads: 4," in text, res.stderr
    # a file's key that a flag does not fit is named as the file's (it was 'workload.kv_heads')
    res, _ = _plan_over(tmp_path, "cpu:ranks=4", wl, "--heads", "6")
    assert res.exit_code == 2 and res.stderr == f"error: {wl}: kv_heads (4) must divide --heads (6)\n", res.stderr
    # and a file that does not hold alone is refused as the file, in its keys' words (the preset's named as such)
    wl.write_text("model: llama-3.1-8b\nheads: 7\nseq_len: 4K\n")
    res, _ = _plan_over(tmp_path, "cpu:ranks=4", wl)
    assert res.exit_code == 2 and res.stderr == (f"error: {wl}: heads (7) must be a multiple of llama-3.1-8b's 8 KV "
                                                 "heads; give kv_heads as well\n"), res.stderr


def test_a_workload_files_uneven_split_replaced_by_a_length_is_said(tmp_path):
    wl = tmp_path / "wl.yaml"
    wl.write_text("model: llama-3.1-8b\nseq_len: 64K\nsplit: [32K, 16K, 16K, 0]\n")
    res = run_cli("plan", "-t", "cpu:ranks=4", "--workload", str(wl), "-n", "128K", "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    assert (f"warning: --seq-len replaces {wl}'s split [32768, 16384, 16384, 0]: the tokens are split evenly "
            "(--split gives tokens per rank)") in res.stderr
    assert "split: [32768, 32768, 32768, 32768]" in (tmp_path / "p.yaml").read_text().replace("\n  - ", "")
    res = run_cli("compare", "-t", "cpu:ranks=4", "--workload", str(wl), "-n", "64K,128K", "--json")
    assert res.exit_code == 0 and res.stderr.count("replaces") == 1, res.stderr
    # an even split, or the file's own length, says nothing
    wl.write_text("model: llama-3.1-8b\nseq_len: 64K\nsplit: even\n")
    res = run_cli("plan", "-t", "cpu:ranks=4", "--workload", str(wl), "-n", "128K", "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0 and "replaces" not in res.stderr, res.stderr


@pytest.mark.parametrize(("fraction", "advice"), [("0.9", "use more ranks or a larger --mem-fraction"),
                                                   ("1", "use more ranks")])
def test_plan_that_fits_nowhere_advises_only_what_can_help(tmp_path, fraction, advice):
    res = run_cli("plan", "-t", "dgx-h100", "--bytes", "1TiB", "--mem-fraction", fraction, "-o", str(tmp_path / "p"))
    assert res.exit_code == 2
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("error: no schedule fits in memory") and line.endswith(advice), line


@pytest.mark.parametrize("args", [("--bytes", "9999999999999999999999"),
                                  ("-m", "llama-3.1-8b", "-b", "9999999999999", "-n", "128K")])
def test_plan_refuses_sizes_past_any_memory_in_one_line(tmp_path, args):
    # On host ranks (no device memory to check against) these overflowed 64-bit arrays: a traceback.
    res = run_cli("plan", "-t", "cpu-4", *args, "-o", str(tmp_path / "p"))
    assert res.exit_code == 2
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and " over 1 TiB, more than any device's memory" in line, line


@pytest.mark.parametrize("spec, needle", [
    ("cpu:ranks={2,,3}", "{2,,3} has an empty item 2"),
    ("cpu:ranks={2,}", "{2,} has an empty item 2"),
    ("cpu:ranks={,2}", "{,2} has an empty item 1"),
    ("cpu:ranks={ }", "has an empty {}"),
])
def test_compare_refuses_an_empty_alternative(spec, needle):
    # as --nodes 1,,2 is refused: a dropped item would compare one case fewer, unsaid
    res = run_cli("compare", "-t", spec, "--seq-lens", "4K", "-m", "llama-3.2-1b", "--json")
    assert res.exit_code == 2 and res.stdout == "", res.stdout
    [line] = res.stderr.strip().splitlines()
    assert needle in line, line


@pytest.mark.parametrize(("args", "needle"), [
    (("-t", "dgx-h100", "--nodes", "1,1", "--seq-lens", "8K"), "--nodes '1,1' names 1 twice"),
    (("-t", "dgx-h100", "--seq-lens", "8K,8192"), "--seq-lens '8K,8192' names 8192 twice"),
    (("-t", "dgx-h100:nodes={2,2}", "--seq-lens", "8K"), "names dgx-h100:nodes=2 twice"),
    # Two names of one machine: a shipped file and the family member it is.
    (("-t", "{dgx-h100-2node,dgx-h100:nodes=2}", "--seq-lens", "8K"),
     "names one machine twice: dgx-h100-2node and dgx-h100:nodes=2 are the same topology"),
    (("-t", "{cpu-4,cpu}", "--seq-lens", "8K"), "names one machine twice: cpu-4 and cpu:ranks=4,cores=2"),
])
def test_compare_refuses_a_repeated_case(args, needle):
    # A repeat would be compared twice: printed once in the table but twice in --json and --csv.
    res = run_cli("compare", *args, "-m", "llama-3.1-8b", "--json")
    assert res.exit_code == 2 and res.stdout == "", res.stdout
    [line] = res.stderr.strip().splitlines()
    assert needle in line, line


def test_compare_refuses_a_copy_of_a_topology_file(tmp_path):
    # The same machine is found by what it is (its fingerprint), not by its name or file.
    from treeattn.topology.library import shipped_files

    copy = tmp_path / "my-cluster.yaml"
    copy.write_text(shipped_files()["dgx-h100"].read_text().replace("name: dgx-h100", "name: my-cluster", 1))
    res = run_cli("compare", "-t", f"{{dgx-h100,{copy}}}", "--seq-lens", "8K", "-m", "llama-3.1-8b", "--json")
    assert res.exit_code == 2 and res.stdout == "", res.stdout
    [line] = res.stderr.strip().splitlines()
    assert "names one machine twice: dgx-h100 and my-cluster are the same topology" in line, line
    # Different machines are still compared.
    res = run_cli("compare", "-t", "{dgx-h100,hgx-h200}", "--seq-lens", "8K", "-m", "llama-3.1-8b", "--json")
    assert res.exit_code == 0, res.stderr
    assert {r["topology"] for r in json.loads(res.stdout)["rows"]} == {"dgx-h100", "hgx-h200"}


def test_console_script(tmp_path):
    proc = subprocess.run([TREEATTN, "plan", "-t", "cpu-4", *SHAPE, "-o", str(tmp_path / "c.yaml"), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan_path"] == str(tmp_path / "c.yaml")
    proc = subprocess.run([TREEATTN, "plan", "-t", "cpu-4", "--model", "nope", "--seq-len", "1K"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown model" in proc.stderr


@pytest.mark.parametrize("name, args", [
    ("dgx-h100-2node.llama-3.1-8b.b1.yaml", ("--topology", "dgx-h100-2node", "--model", "llama-3.1-8b", "--batch", "1",
                                             "--seq-len", "128K")),
    ("cpu-4.llama-3.1-8b.yaml", ("--topology", "cpu-4", "--model", "llama-3.1-8b", "--batch", "1", "--seq-len", "16K")),
])
def test_example_plans_are_what_the_cli_writes(tmp_path, name, args):
    shipped = Path(__file__).resolve().parents[2] / "plans" / name
    check(load_plan(shipped))
    res = run_cli("plan", *args, "--out", str(tmp_path / name), "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / name).read_bytes() == shipped.read_bytes(), (
        f"plans/{name} is stale (the planner or cost model changed): regenerate with plans/make_search_plans.sh")


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_model_list_works_on_its_own(command):
    from treeattn.workload import MODELS

    res = run_cli(command, "-m", "list")
    assert res.exit_code == 0, res.stderr
    assert all(name in res.stdout for name in MODELS)
    shapes = json.loads(run_cli(command, "--model", "list", "--json").stdout)
    assert shapes["llama-3.1-8b"] == {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128,
                                      "kv_latent": False, "layers": 32, "params": 8.03e9, "weight_dtype": "bf16"}
    assert shapes["deepseek-v3"] == {"q_heads": 128, "kv_heads": 1, "head_dim": 576, "v_head_dim": 512,
                                     "kv_latent": True, "layers": 61, "params": 671e9, "weight_dtype": "fp8"}
    assert all(name in run_cli(command, "--help").stdout for name in MODELS)


def test_hierarchical_without_groups_groups_by_node(tmp_path):
    out = tmp_path / "h.yaml"
    res = run_cli("plan", "-t", "dgx-h100-2node", *SHAPE, "-a", "hierarchical", "-o", str(out))
    assert res.exit_code == 0, res.stderr
    assert load_plan(out).params["groups"] == [list(range(8)), list(range(8, 16))]
    one = run_cli("plan", "-t", "dgx-h100", *SHAPE, "-a", "hierarchical", "-o", str(out))
    assert one.exit_code == 2 and "one node" in one.stderr and "--groups" in one.stderr


def test_compare_says_why_a_method_has_no_figure():
    # 32 query heads cannot be split over 128 ranks: the heads methods have no figure there,
    # the table says why, and the JSON does not call them out of memory.
    args = ("compare", "-t", "dgx-h100:nodes=16", "--seq-lens", "64K", "-m", "llama-3.1-8b", "--no-progress")
    res = run_cli(*args)
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "- A2A at 128 ranks: result heads gives every rank a share" in text
    assert "tree the planner's pick (the fastest plan its search found)" in text  # its column's legend
    rows = {r["method"]: r for r in json.loads(run_cli(*args, "--json").stdout)["rows"]}
    assert rows["dcp-a2a"]["predicted_us"] is None and rows["dcp-a2a"]["fits"] is None
    assert "32 query heads cannot go to 128 ranks" in rows["dcp-a2a"]["detail"]
    assert rows["tree"]["fits"] is True


def test_plan_summary_names_each_baseline_on_its_own_line(tmp_path):
    res = run_cli("plan", "--topology", "dgx-h100-2node", *SHAPE, "--out", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("lower bound "))
    named = [line for line in lines[head + 1:] if line.startswith("  ")]
    assert [line.split(" ")[2] for line in named[:2]] == ["3", "2"]  # "  3 all-reduces ...", "  2 all-reduces ..."
    assert len(named) == 4 and all("x the plan's time" in line for line in named)


def test_candidate_parameters_are_cut_at_whole_entries_and_the_rest_counted():
    from treeattn.cli.plan import _short

    params = {"from": "hierarchical", "levels": "fabric", "shapes": "kary4/chain", "root": 0, "moves": 5}
    assert _short(params) == "from=hierarchical levels=fabric shapes=kary4/chain root=0 moves=5"
    assert _short(params, limit=41) == "from=hierarchical levels=fabric (+3 more)"
    assert _short(params, limit=40) == "from=hierarchical (+4 more)"
    assert _short({"order": list(range(40))}) == "order=[0,1,2,3,4,5,6,7,8,9,..."


def test_compare_byte_cells_never_print_exponents():
    from treeattn.cli.plan import _bytes

    assert [_bytes(n) for n in (512, 1536, 999 << 20, 1010 << 20, 1023 << 20, 1 << 30, 3 << 40, 5000 << 40)] == [
        "512B", "1.5K", "999M", "1010M", "1023M", "1G", "3T", "5000T"]


def test_a_bad_flag_over_a_workload_file_is_named_as_the_flag(tmp_path):
    wl = tmp_path / "wl.yaml"
    wl.write_text("model: llama-3.1-8b\nbatch: 1\nseq_len: 4K\n")
    for flags, key in ((("-m", "nosuch"), "--model: unknown model"), (("--head-dim", "0"), "--head-dim must be")):
        res = run_cli("plan", "-t", "cpu-4", "--workload", str(wl), *flags, "-o", str(tmp_path / "p.yaml"))
        assert res.exit_code == 2
        line = res.stderr.strip()
        assert "\n" not in line and key in line and str(wl) not in line, line
    # --op over a raw file: the flag's value is wrong, not the file's op (it has none).
    raw = tmp_path / "raw.yaml"
    raw.write_text("kind: raw\nbytes: 1MB\n")
    res = run_cli("plan", "-t", "cpu-4", "--workload", str(raw), "--op", "merge", "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 2 and res.stderr.startswith("error: --op: a raw payload is summed"), res.stderr
    # The file alone is still named by its path.
    wl.write_text("model: nosuch\nbatch: 1\nseq_len: 4K\n")
    res = run_cli("plan", "-t", "cpu-4", "--workload", str(wl), "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 2 and str(wl) in res.stderr


def test_a_plan_is_not_written_over_a_file_that_is_not_one(tmp_path):
    """``plan -o`` given the wrong path (a topology beside the plan) must not lose that file,
    and says so before searching; a plan (YAML or JSON), an empty file and a device are written."""
    from treeattn.errors import InputError
    from treeattn.plan.io import check_plan_path, load_plan, save_plan

    shape = ("-t", "cpu-4", "-m", "llama-3.1-8b", "-b", "1", "-n", "4K")
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\nfamily: cpu\nranks: 4\n")
    res = run_cli("plan", *shape, "-o", str(mine))
    assert res.exit_code == 2 and "is not a treeattn plan" in res.stderr and "not replaced" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stdout == ""
    assert mine.read_text() == "name: mine\nfamily: cpu\nranks: 4\n"
    plan = tmp_path / "p.json"
    assert run_cli("plan", *shape, "-o", str(plan)).exit_code == 0
    assert run_cli("plan", *shape, "-o", str(plan)).exit_code == 0  # a JSON plan is replaced
    loaded = load_plan(plan)
    save_plan(loaded, tmp_path / "p.yaml")
    save_plan(loaded, tmp_path / "p.yaml")  # and a YAML one
    (tmp_path / "empty.yaml").write_text("")
    minified = tmp_path / "sorted.json"  # `jq -cS .`: one line, keys sorted, the tag not first
    minified.write_text(json.dumps(json.loads(plan.read_text()), sort_keys=True, separators=(",", ":")))
    for fine in (tmp_path / "empty.yaml", Path("/dev/null"), tmp_path / "absent.yaml", minified):
        check_plan_path(fine)
    with pytest.raises(InputError, match="not a treeattn plan"):
        save_plan(loaded, mine)


def test_plan_kv_cache_past_any_memory_says_what_to_change(tmp_path):
    # 405B at B=64, 1M tokens on 8 GPUs: 3.9 TiB of KV a rank, refused before the memory check
    # and, like it, naming what to change.
    res = run_cli("plan", "-t", "dgx-h100", "-m", "llama-3.1-405b", "-b", "64", "-n", "1M", "-o", str(tmp_path / "p"))
    assert res.exit_code == 2
    [line] = res.stderr.strip().splitlines()
    assert ("KV cache of 126 layers (batch 64 x 131072 tokens x 8 KV heads x 256 values x 2 bytes a layer) is "
            "3.938 TiB, over 1 TiB") in line, line
    assert line.endswith("use more ranks, a shorter sequence or a smaller batch"), line



def test_compare_says_which_decode_shape_it_compared(tmp_path):
    # A --model over a --workload file replaces the file's heads, dims and latent cache
    # (docs/workload-format.md): compare printed no shape, so an MLA file (Kimi-K2: 64 heads,
    # one latent of 576, Dv 512) compared as llama-3.1-8b read the same as the file itself.
    kimi = tmp_path / "kimi.yaml"
    kimi.write_text("q_heads: 64\nkv_heads: 1\nhead_dim: 576\nv_head_dim: 512\nkv_latent: true\nlayers: 61\n"
                    "batch: 8\nseq_len: 8K\n")
    mla = run_cli("compare", "-t", "dgx-h100", "--workload", str(kimi), "--seq-lens", "8K", "--no-progress")
    gqa = run_cli("compare", "-t", "dgx-h100", "--workload", str(kimi), "-m", "llama-3.1-8b", "--seq-lens", "8K",
                  "--no-progress")
    assert mla.exit_code == 0 and gqa.exit_code == 0, mla.stderr + gqa.stderr
    assert "B=8 Hq=64 Hkv=1 D=576 Dv=512 (latent), bf16 cache, fp32 partials, 61 layers" in mla.stdout, mla.stdout
    assert "B=8 Hq=32 Hkv=8 D=128, bf16 cache, fp32 partials, 32 layers" in gqa.stdout, gqa.stdout


def test_plan_and_compare_say_nothing_of_weights_that_fit_beside_the_plan(tmp_path):
    # 16.4 GiB of weights a GPU are more than the 8 GiB --mem-fraction 0.9 leaves, but the
    # plan's peak at 128K (its KV cache of 80 layers, 5 GiB) leaves them room: no warning,
    # as none at the fraction that would leave them room whatever the plan took.
    base = ("-t", "dgx-h100", "-m", "llama-3.1-70b", "-n", "128K", "--no-progress")
    for args in (("plan", *base, "-o", str(tmp_path / "p.yaml")),
                 ("plan", *base, "--mem-fraction", "0.79", "-o", str(tmp_path / "p.yaml")),
                 ("compare", *base)):
        res = run_cli(*args)
        assert res.exit_code == 0 and res.stderr == "", (args, res.stderr)


def test_compare_weighs_the_weights_beside_its_longest_kv_cache_that_fits():
    # 128K first: its KV cache leaves room for 0.79, but 1700K's (66.4 GiB a GPU, 72 usable at
    # 0.9) does not fit beside 16.4 GiB of weights at any fraction; the note named 0.79 (at
    # which compare then leaves 1700K out) and now says neither fits.
    res = run_cli("compare", "-t", "dgx-h100", "-m", "llama-3.1-70b", "-n", "128K,1700K", "--no-progress")
    assert res.exit_code == 0, res.stderr
    [line] = res.stderr.splitlines()
    assert "and rank 0's KV cache (66.41 GiB) need more than its GPU's 80 GiB" in line, line
    assert "--mem-fraction 0.79" not in line


def test_a_winner_built_by_another_builder_is_named_as_the_plan_file_names_it(tmp_path):
    # The table names the candidate by its family (an improved tree, a double-binary tree across
    # nodes); the plan file, simulate and run by the builder that made it (tree, multirail).
    out = tmp_path / "p.yaml"
    res = run_cli("plan", "-t", "cpu:ranks=6", "-m", "llama-3.1-8b", "-n", "4K", "-b", "16", "-o", str(out))
    assert res.exit_code == 0, res.stderr
    plan = load_plan(out)
    assert plan.algorithm == "tree" and plan.notes["search"]["family"] == "improved"
    last = res.stdout.splitlines()[-1]
    assert re.fullmatch(r"  the plan file: tree \(6 ranks, 1 chunk\), the search's improved \(from=\w+, .*\)",
                        last), last
    assert run_cli("simulate", str(out)).stdout.startswith("tree (6 ranks, 1 chunk), the search's improved (")


@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize(("given", "said"), [
    ("head", "error: --result must be all, heads or root[:R], got 'head'"),
    ("root:x", "error: --result root:R needs an integer rank R, got 'root:x'"),
    ("root:4", "error: --result root:4: rank 4 is out of range: there are 4 ranks"),
])
def test_a_bad_result_layout_is_named_by_its_flag(command, given, said):
    # 'result must be all, heads or root[:R]' named no flag, unlike every other option's error
    res = run_cli(command, "-t", "cpu-4", "-m", "llama-3.1-8b", "-n", "4K", "--result", given)
    assert res.exit_code == 2 and res.stderr.startswith(said), res.stderr


def test_plan_compare_and_simulate_note_attention_timed_by_the_defaults(tmp_path):
    # mi300x-8 ran 70B at 128K in 40 us a layer to dgx-h100's 71 on 5 us and 0.8 of memory
    # bandwidth, no fitted figure, and only topo show said so
    said = ("note: mi300x-8 times decode attention by the merge kernels' figures, launch_us 5 us a call and "
            "mem_efficiency 0.8 of memory bandwidth: no published decode kernel on MI300X was fitted, so its "
            "attention may look faster than a fitted GPU's (the published MI300X decode kernels (composable_kernel "
            "pull 1789's example, FlashInfer+ROCm's fa2 and AITER's paged attention through it) took 1.4-6.9 times "
            "what these figures give, at 0.12-0.59 of the memory bandwidth; docs/attention-model.md; "
            "treeattn calibrate --compute attention measures one)")
    shape = ("-m", "llama-3.1-70b", "-n", "128K", "--no-progress")
    plan = tmp_path / "p.yaml"
    for args in (("plan", "-t", "mi300x-8", *shape, "-o", str(plan)), ("compare", "-t", "mi300x-8", *shape),
                 ("simulate", str(plan))):
        res = run_cli(*args)
        assert res.exit_code == 0 and said in res.stderr.splitlines(), (args, res.stderr)
    for args in (("plan", "-t", "dgx-h100", *shape, "-o", str(plan)), ("compare", "-t", "dgx-h100", *shape),
                 ("plan", "-t", "mi300x-8", "--bytes", "1M", "-o", str(plan))):  # fitted; no attention
        res = run_cli(*args)
        assert res.exit_code == 0 and "decode attention" not in res.stderr, (args, res.stderr)


def test_compare_says_which_ring_attention_it_times():
    # ringA's ratio runs to hundreds at long N: the legend says it moves KV, and where pass-Q stands
    res = run_cli("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "-n", "4K", "--no-progress")
    assert res.exit_code == 0, res.stderr
    legend = ("  pass-KV: ringA moves KV, as the tree attention paper's baseline does; pass-Q\n"
              "  (the query moving instead) ends in a merge of partials, as the other columns\n")
    assert legend in res.stdout, res.stdout


def test_plan_notes_gpus_without_a_memory_size_and_a_refused_argument_is_the_one_line(tmp_path):
    # MI300X without mem_gb planned 512 GiB a rank without a word; and the notes came before
    # the error of a refused argument (two lines on stderr)
    topo = tmp_path / "mi.yaml"
    topo.write_text("name: my-mi\nnode:\n  gpus: {count: 8, model: MI300X, mem_bw_gbps: 5300}\n  pcie: {bw_gbps: 55}\n"
                    "  fabric: {kind: full-mesh, link: xgmi, bw_gbps: 64}\n")
    shape = ("-t", str(topo), "-m", "llama-3.1-70b", "-n", "16M", "--no-progress")
    res = run_cli("plan", *shape, "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    assert ("note: my-mi gives its MI300X GPUs no mem_gb: no schedule was checked against their memory (the KV "
            "cache alone is 640 GiB on the busiest rank); give their mem_gb (GiB)") in res.stderr.splitlines()
    for bad in (("--mem-fraction", "0"), ("--result", "root:9"), ("--chunks", "0", "--algorithm", "binomial"),
                ("--algorithm", "binomial", "--whole-rows"), ("--algorithm", "kary", "--fanout", "0"),
                ("--algorithm", "nosuch")):
        res = run_cli("plan", *shape, *bad, "-o", str(tmp_path / "p.yaml"))
        assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, (bad, res.stderr)
    topo.write_text(topo.read_text().replace("mem_bw_gbps: 5300", "mem_bw_gbps: 5300, mem_gb: 192"))
    res = run_cli("plan", *shape[:5], "1M", "--no-progress", "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0 and "no mem_gb" not in res.stderr, res.stderr
