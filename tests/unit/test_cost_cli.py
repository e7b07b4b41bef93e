"""``treeattn simulate`` and ``treeattn nccl-model`` as a user runs them."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.cost.simulate import simulate

io = pytest.importorskip("treeattn.plan.io")
builders = pytest.importorskip("treeattn.plan.builders")
library = pytest.importorskip("treeattn.topology.library")

from treeattn.workload import Workload  # noqa: E402

TREEATTN = Path(sys.executable).with_name("treeattn")


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for key, spec, algo, chunks in [("p16", "dgx-h100:nodes=2", "binomial", 4), ("p72", "dgx-h100:nodes=9", "kary", 1)]:
        topo = library.resolve(spec)
        w = Workload.create(ranks=topo.num_ranks, seq_len=topo.num_ranks * 2048, model="llama-3.1-8b")
        out[key] = io.save_plan(builders.build(algo, w, topo, chunks=chunks), d / f"{key}.yaml")
    return out


def test_simulate_json(plans):
    r = run_cli("simulate", str(plans["p16"]), "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    for key in ("predicted_us", "lower_bound_us", "gap", "per_rank_finish_us", "critical_path", "bounds"):
        assert key in data
    plan = io.load_plan(plans["p16"])
    topo = library.resolve("dgx-h100:nodes=2")
    assert data["predicted_us"] == simulate(plan, topo).predicted_us
    assert data["predicted_us"] >= data["lower_bound_us"] > 0
    assert len(data["per_rank_finish_us"]) == 16
    assert data["critical_path"][-1]["end_us"] <= data["predicted_us"]
    assert data["fingerprint_mismatch"] is False
    assert r.stderr == ""


def test_simulate_names_the_plan_file_it_refuses(plans, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = plans["p16"].read_text()
    first = next(line for line in text.splitlines() if "kind: send, step:" in line and "peer: " in line)
    bad.write_text(text.replace(first, first.replace("peer: ", "peer: 9", 1), 1))
    r = run_cli("simulate", str(bad))
    # verify's check runs first and names the file, the plan, the rank and the op.
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and f"{bad}: plan 'binomial' is invalid: rank 0 op " in said
    assert "peer 91 is out of range" in said, r.stderr


def test_run_names_the_plan_file_it_refuses(plans, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = plans["p16"].read_text()
    first = next(line for line in text.splitlines() if "kind: send, step:" in line and "peer: " in line)
    bad.write_text(text.replace(first, first.replace("peer: ", "peer: 9", 1), 1))
    r = run_cli("run", str(bad), "--out", str(tmp_path / "rows.csv"))
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and f"{bad}: plan 'binomial' is invalid: rank 0 op " in said
    assert not (tmp_path / "rows.csv").exists()  # refused before any rank started or any row was written


def test_simulate_refuses_a_plan_that_does_not_compute_the_merge(plans, tmp_path):
    # Well formed for the simulator (every send received), but the receiver copies where it must
    # merge: a contribution is lost. verify refuses it; simulate must not print a time for it.
    bad = tmp_path / "copy.yaml"
    text = plans["p16"].read_text()
    assert "kind: recv_merge" in text
    bad.write_text(text.replace("kind: recv_merge", "kind: recv_copy", 1))
    assert run_cli("verify", str(bad)).exit_code == 2
    r = run_cli("simulate", str(bad))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and str(bad) in r.stderr and "predicted" not in r.stdout


def test_simulate_text(plans):
    r = run_cli("simulate", str(plans["p72"]))
    assert r.exit_code == 0, r.stderr
    for word in ("predicted", "lower bound", "gap", "median", "Critical path"):
        assert word in r.stdout
    # The bound names the term that sets it and lists every term, each line short when piped.
    lines = r.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("lower bound"))
    assert re.search(r"set by (compute|depth|spread|the cut \S+) \(see --help\)$", lines[at])
    assert re.match(r"  terms: depth [\d.]+, cut [\d.]+, spread [\d.]+, compute [\d.]+ µs$", lines[at + 1])
    assert max(len(lines[at]), len(lines[at + 1])) <= 80
    # The path's ops end before the predicted time where the last rank's own work (its last
    # merge) follows its last op: said, with the figures of --json.
    data = json.loads(run_cli("simulate", str(plans["p72"]), "--json").stdout)
    last = data["critical_path"][-1]
    tail = data["per_rank_finish_us"][last["rank"]] - last["end_us"]
    assert tail > 0 and data["per_rank_finish_us"][last["rank"]] == data["predicted_us"]
    said = " ".join(r.stdout.split())
    assert (f"after its last op, rank {last['rank']}'s own work takes {tail:.3f} µs more, to the predicted "
            f"{data['predicted_us']:.3f} µs") in said
    assert all(len(x) <= 80 for x in lines if not x.startswith(("┏", "┃", "┡", "│", "└")))


def test_simulate_says_in_one_short_line_when_every_rank_finishes_together(plans):
    data = json.loads(run_cli("simulate", str(plans["p16"]), "--json").stdout)
    line = next(x for x in run_cli("simulate", str(plans["p16"])).stdout.splitlines() if x.startswith("finish µs"))
    if len(set(data["per_rank_finish_us"])) == 1:
        assert line == f"finish µs   {data['per_rank_finish_us'][0]:.2f} on every rank"
    else:
        assert line.startswith("finish µs   min ") and len(line) <= 80


def test_simulate_on_another_topology_warns(plans):
    r = run_cli("simulate", str(plans["p16"]), "--topology", "dgx-h200:nodes=2", "--json")
    assert r.exit_code == 0
    assert "warning" in r.stderr and "dgx-h200" in r.stderr
    assert json.loads(r.stdout)["fingerprint_mismatch"] is True
    assert json.loads(r.stdout)["kv_overflow"] is None and "does not fit" not in r.stderr


def test_simulate_on_a_topology_that_cannot_hold_the_kv_cache_says_so(tmp_path):
    # 70B at B = 2 over 1M tokens on 4 MI300X (160 GiB of KV a GPU), simulated on 4 RTX 4090 (24 GiB).
    plan = tmp_path / "big.yaml"
    made = run_cli("plan", "-t", "mi300x-4", "-m", "llama-3.1-70b", "-b", "2", "-n", "1M", "-o", str(plan))
    assert made.exit_code == 0, made.stderr
    r = run_cli("simulate", str(plan), "--topology", "rtx4090-p2p-4", "--json")
    assert r.exit_code == 0, r.stderr
    over = "needs 160 GiB of KV per GPU (80 layers); rtx4090-p2p-4 has 24 GiB per GPU"
    assert json.loads(r.stdout)["kv_overflow"] == over
    assert f"warning: the plan's KV cache does not fit: {over}" in r.stderr


def test_simulate_rank_mismatch_is_one_line_exit_2(plans):
    r = run_cli("simulate", str(plans["p16"]), "--topology", "dgx-h100")
    assert r.exit_code == 2 and r.stdout == ""
    # One line (no fingerprint warning first), naming the plan file, and no hint of an option simulate lacks.
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: --topology 'dgx-h100' places 8 ranks") and str(plans["p16"]) in line, line
    assert "runs on 16" in line and "--ranks" not in line, line


def test_simulate_timeline_png(plans, tmp_path):
    png = tmp_path / "gantt.png"
    r = run_cli("simulate", str(plans["p72"]), "--timeline", str(png))
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "first 64 of 72 ranks" in r.stdout


def test_nccl_model_json_and_sizes():
    r = run_cli("nccl-model", "--topology", "dgx-h100:nodes=4", "--collective", "allreduce", "--bytes", "1MiB",
                "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["bytes"] == 1 << 20 and data["ranks"] == 32
    # NCCL picks by its own estimate (nccl_us); time_us is what the pick achieves
    assert data["pick"] == min(data["estimates"], key=lambda e: e["nccl_us"])
    assert len(data["estimates"]) == 7  # tree and ring x 3 protocols, NVLSTree
    assert data["bus_limit"] == ""  # NVLink and rails: NCCL's own figures stand
    assert data["nccl_release"] == "2.30.7"  # the newest the model follows, without cost.nccl_version
    r = run_cli("nccl-model", "-t", "dgx-h100", "-c", "broadcast", "--bytes", "16KB")
    assert r.exit_code == 0 and "NCCL's pick" in r.stdout
    # no peer-to-peer: the bounce through the CPU shares each switch's uplink between 4 ring flows
    r = run_cli("nccl-model", "-t", "rtx4090-8", "-c", "allreduce", "--bytes", "1MiB")
    assert r.exit_code == 0 and "bus bandwidth 6.25 GB/s" in r.stdout and "capped by the routes" in r.stdout
    assert "at most 2.7 GB/s of bus bandwidth through host memory" in " ".join(r.stdout.split())
    # One fact a line: each route cap on its own, no line far past 80 columns when piped.
    assert r.stdout.count("capped by the routes: ") == 2 and max(map(len, r.stdout.splitlines())) <= 105
    assert data["shm_gbps"] is None
    r = run_cli("nccl-model", "-t", "rtx4090-8", "-c", "allreduce", "--bytes", "1GiB", "--json")
    big = json.loads(r.stdout)
    assert big["shm_gbps"] == 2.7 and big["pick"]["busbw_gbps"] == pytest.approx(2.7, rel=1e-3)
    r = run_cli("nccl-model", "-t", "mi300x", "-c", "allreduce", "--bytes", "512")
    flat = " ".join(r.stdout.split())
    assert "RCCL, timed with NCCL 2.30.7's figures" in flat and "RCCL's pick (NCCL's tuning figures): ring/LL" in flat
    assert "picks by" in r.stdout  # the column NCCL's tuner ranks by, beside what runs
    r = run_cli("nccl-model", "-t", "mi300x", "-c", "allreduce", "--bytes", "16KiB")
    assert r.exit_code == 0 and "RCCL runs its MSCCL all-pairs algorithm ahead of its tuner: allpairs/LL" in (
        " ".join(r.stdout.split()))


def test_nccl_model_says_why_a_two_node_tree_outruns_the_network():
    r = run_cli("nccl-model", "-t", "dgx-h100:nodes=2[ranks 0,1,8,9]", "-c", "allreduce", "--bytes", "8GiB")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert ("bus bandwidth 100 GB/s (tree 200 GB/s) (tree: on two nodes each byte crosses the network once each way)"
            in text)
    assert "NCCL's pick: tree/Simple" in text
    for spec in ("dgx-h100:nodes=4[ranks 0,1,8,9,16,17,24,25]", "dgx-h100:nodes=2"):  # more nodes; NVLink binds
        r = run_cli("nccl-model", "-t", spec, "-c", "allreduce", "--bytes", "8GiB")
        assert r.exit_code == 0 and "crosses the network once" not in r.stdout, spec


def test_nccl_model_says_which_nccl_release_it_follows(tmp_path):
    newer = tmp_path / "newer.yaml"
    newer.write_text('family: dgx-h100\nparams: {nodes: 2}\nname: newer\ncost: {nccl_version: "2.31"}\n')
    r = run_cli("nccl-model", "-t", str(newer), "-c", "allreduce", "--bytes", "1MiB")
    assert r.exit_code == 0 and "NCCL 2.31.x, modelled with 2.30.7's figures" in " ".join(r.stdout.split())
    older = tmp_path / "older.yaml"
    older.write_text('family: dgx-h100\nparams: {nodes: 2}\nname: older\ncost: {nccl_version: "2.26.2"}\n')
    r = run_cli("nccl-model", "-t", str(older), "-c", "allreduce", "--bytes", "1MiB", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["nccl_release"] == "2.26.2"


def test_nccl_model_says_what_plan_adds_to_its_figure(tmp_path):
    # The same 1 MiB all-reduce, printed by nccl-model and by plan: the note accounts for the gap.
    r = run_cli("nccl-model", "-t", "dgx-h100", "-c", "allreduce", "--bytes", "1MiB", "--json")
    nccl_us = json.loads(r.stdout)["pick"]["time_us"]
    p = run_cli("plan", "-t", "dgx-h100", "--bytes", "1MiB", "-a", "allreduce", "--json", "--no-progress",
                "-o", str(tmp_path / "ar.yaml"))
    assert p.exit_code == 0, p.stderr
    assert json.loads(p.stdout)["best"]["predicted_us"] == pytest.approx(nccl_us + 2.0)
    text = " ".join(run_cli("nccl-model", "-t", "dgx-h100", "-c", "allreduce", "--bytes", "1MiB").stdout.split())
    assert "plan and simulate add cost.overhead_us, 2 µs, per call" in text


@pytest.mark.parametrize("args,needle", [(("-c", "alltoall", "--bytes", "1KB"), "unknown collective"),
                                         (("-c", "allreduce", "--bytes", "lots"), "cannot read --bytes 'lots'"),
                                         (("-c", "allreduce", "--bytes", "-1"), "--bytes must be at least 1 byte, "
                                          "got '-1'"),
                                         (("-c", "allreduce", "--bytes", "0"), "--bytes must be at least 1 byte, "
                                          "got '0'")])
def test_nccl_model_bad_input(args, needle):
    r = run_cli("nccl-model", "-t", "dgx-h100", *args)
    assert r.exit_code == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_console_script_json_is_deterministic(plans):
    cmd = [str(TREEATTN), "simulate", str(plans["p16"]), "--json"]
    a = subprocess.run(cmd, capture_output=True, text=True, check=True)
    b = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert a.stdout == b.stdout and json.loads(a.stdout)["predicted_us"] > 0


def test_nccl_model_on_one_rank_is_one_line_exit_2():
    r = run_cli("nccl-model", "-t", "cpu:ranks=1", "-c", "allreduce", "--bytes", "1MiB")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "at least 2" in r.stderr and r.stdout == ""


def test_nccl_model_refuses_host_ranks_where_gloo_runs():
    r = run_cli("nccl-model", "-t", "cpu:ranks=2", "-c", "allreduce", "--bytes", "1MiB")
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "places its ranks on hosts, where gloo runs the collectives, not NCCL" in r.stderr


def test_gpus_that_name_no_model_are_said_to_be_read_as_hopper(tmp_path):
    box = tmp_path / "box.yaml"
    box.write_text("name: box\nnode:\n  gpus: {count: 2, mem_bw_gbps: 864, mem_gb: 48}\n  pcie: {bw_gbps: 25}\n")
    r = run_cli("nccl-model", "-t", str(box), "-c", "allreduce", "--bytes", "1MiB")
    assert r.exit_code == 0
    assert "warning: the GPUs of box name no model (node.gpus.model" in r.stderr
    assert "NCCL's figures are read as for hopper GPUs" in r.stderr


def test_simulate_title_names_the_searched_family_and_the_chunks_a_tree(plans, tmp_path):
    # A double-binary tree across nodes, as the search writes it: built by multirail over its two
    # trees, 4 chunks a tree (the candidates table's count), 8 in all. The title said only
    # 'multirail (16 ranks, 8 chunks)', which the table named double-binary with 4 chunks.
    from treeattn.plan.trees import double_binary_parents

    topo = library.resolve("dgx-h100:nodes=2")
    w = Workload.create(ranks=16, seq_len=16 * 2048, model="llama-3.1-8b")
    plan = builders.build("multirail", w, topo, chunks=4, parents=list(double_binary_parents(16)))
    notes = {"search": {"family": "double-binary", "describe": {"scope": "all ranks"}}}
    path = io.save_plan(dataclasses.replace(plan, notes=notes), tmp_path / "db.yaml")
    first = run_cli("simulate", str(path)).stdout.splitlines()[0]
    assert first == ("multirail (16 ranks, 8 chunks: 4 a tree), the search's double-binary (scope=all ranks) on "
                     "dgx-h100:nodes=2"), first
    plain = run_cli("simulate", str(plans["p16"])).stdout.splitlines()[0]
    assert plain == "binomial (16 ranks, 4 chunks) on dgx-h100:nodes=2", plain
    # A heads layout's chunks are each rank's heads cut by the builder's count, not trees.
    heads = io.save_plan(builders.build("star", w, topo, chunks=2, result="heads"), tmp_path / "h.yaml")
    first = run_cli("simulate", str(heads)).stdout.splitlines()[0]
    assert first == "star (16 ranks, 32 chunks: 2 a rank's heads) on dgx-h100:nodes=2", first


def test_simulate_notes_a_recorded_prediction_it_does_not_reproduce(tmp_path):
    # predicted_us edited to 12.0 was printed over by the simulation without a word
    plan = tmp_path / "p.yaml"
    assert run_cli("plan", "-t", "cpu-4", "-m", "llama-3.1-8b", "-n", "4K", "-o", str(plan)).exit_code == 0
    r = run_cli("simulate", str(plan), "--json")
    assert r.exit_code == 0 and r.stderr == "" and json.loads(r.stdout)["recorded_predicted_us"] is None
    text = plan.read_text()
    edited = tmp_path / "edited.yaml"
    edited.write_text(re.sub(r"(?m)^predicted_us: .*$", "predicted_us: 12.0", text, count=1))
    r = run_cli("simulate", str(edited), "--json")
    data = json.loads(r.stdout)
    assert data["recorded_predicted_us"] == 12.0 and data["predicted_us"] > 12.0
    assert r.stderr == (f"note: {edited} records predicted_us 12.000; the simulation gives "
                        f"{data['predicted_us']:.3f} on the same topology (the file was edited, or made by another "
                        "release of treeattn's model)\n"), r.stderr


def test_nccl_model_times_the_reduction_asked_for():
    # NVLink SHARP reduces float by sum, bf16 by max, but not float by max (ncclNvlsSupported).
    def pick(*flags: str) -> dict:
        res = run_cli("nccl-model", "-t", "dgx-h100", "-c", "allreduce", "--bytes", "64MiB", "--json", *flags)
        assert res.exit_code == 0, res.stderr
        return json.loads(res.stdout)

    assert pick()["pick"]["algorithm"] == "nvls" and pick()["op"] == "sum" and pick()["dtype"] == "float"
    assert pick("--dtype", "bf16", "--op", "max")["pick"]["algorithm"] == "nvls"
    floatmax = pick("--op", "max")
    assert floatmax["pick"]["algorithm"] != "nvls"
    assert not any(e["algorithm"].startswith("nvls") for e in floatmax["estimates"])
    text = run_cli("nccl-model", "-t", "dgx-h100", "-c", "allreduce", "--bytes", "64MiB", "--op", "max")
    assert "NVLink SHARP does not reduce float by max: NCCL offers no NVLS here" in text.stdout
    assert floatmax["nvls_note"] == "NVLink SHARP does not reduce float by max: NCCL offers no NVLS here"
    assert pick("--dtype", "float32", "--op", "max") == floatmax  # an alias names the same type
    bad = run_cli("nccl-model", "-t", "dgx-h100", "-c", "allreduce", "--bytes", "64MiB", "--op", "foo")
    assert bad.exit_code == 2 and bad.stderr == ("error: --op 'foo': choose one of sum, prod, max, min, avg, "
                                                 "mulsum\n")
    odd = run_cli("nccl-model", "-t", "dgx-h100", "-c", "allreduce", "--bytes", "3", "--dtype", "bf16")
    assert odd.exit_code == 2 and "whole number of bfloat16 elements (2 bytes each), got 3" in odd.stderr
    # Nothing is said where the model offers no NVLS anyway (a broadcast); its op is no reduction's.
    cast = run_cli("nccl-model", "-t", "dgx-h100", "-c", "broadcast", "--bytes", "64MiB", "--op", "max", "--json")
    assert json.loads(cast.stdout)["nvls_note"] is None and json.loads(cast.stdout)["op"] is None


def test_nccl_model_counts_the_elements_of_the_dtype_asked_for():
    # RCCL's MSCCL all-pairs files cover element counts: 1536 B of bf16 is 768 elements (a
    # multiple of 256: covered), 1024 B of double 128 (not covered); as the simulator counts them.
    from treeattn.cost import nccl, nccl_fabric
    from treeattn.topology.library import resolve

    fab = nccl_fabric.fabric(resolve("mi300x"))
    for nbytes, dtype, elem in ((1536, "bf16", 2), (1024, "double", 8)):
        res = run_cli("nccl-model", "-t", "mi300x", "-c", "allreduce", "--bytes", str(nbytes), "--dtype", dtype,
                      "--json")
        want = nccl.pick(fab, "allreduce", nbytes, elem_bytes=elem)
        assert json.loads(res.stdout)["pick"]["algorithm"] == want.algorithm.value, (nbytes, dtype)
    assert {nccl.pick(fab, "allreduce", 1536, elem_bytes=2).algorithm.value,
            nccl.pick(fab, "allreduce", 1024, elem_bytes=8).algorithm.value} == {"allpairs", "ring"}


def test_nccl_model_says_rccl_picks_no_ll128_on_mi300x():
    # RCCL (to 2.21.5) runs LL128 on gfx90a only: the table lists LL128 rows it never picks
    note = "RCCL (to 2.21.5) runs LL128 on gfx90a GPUs only: no LL128 row is picked"
    res = run_cli("nccl-model", "-t", "mi300x-8", "-c", "allgather", "--bytes", "8M")
    assert res.exit_code == 0 and note in res.stdout.splitlines(), res.stdout
    assert json.loads(run_cli("nccl-model", "-t", "mi300x-8", "-c", "allgather", "--bytes", "8M",
                              "--json").stdout)["ll128_note"] == note
    assert json.loads(run_cli("nccl-model", "-t", "dgx-h100", "-c", "allgather", "--bytes", "8M",
                              "--json").stdout)["ll128_note"] is None
