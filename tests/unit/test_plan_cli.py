"""``treeattn verify``: exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from tests.cli_helpers import run_cli
from tests.unit.test_plan_helpers import REF, attention, with_program
from treeattn.plan import build
from treeattn.plan.io import save_plan

TREEATTN = Path(sys.executable).parent / "treeattn"


def _valid(tmp_path: Path) -> Path:
    return save_plan(build("kary", attention(6), REF, chunks=2, fanout=3), tmp_path / "kary.yaml")


def _invalid(tmp_path: Path) -> Path:
    plan = build("kary", attention(6), REF, chunks=2, fanout=3)
    return save_plan(with_program(plan, 4, list(plan.programs[4][1:])), tmp_path / "bad.json")  # no compute


def test_verify_a_valid_plan(tmp_path: Path) -> None:
    res = run_cli("verify", str(_valid(tmp_path)))
    assert res.exit_code == 0, res.stderr
    assert "valid kary plan: 6 ranks, 2 chunks" in res.stdout and "result on every rank\n" in res.stdout
    heads = save_plan(build("ring", attention(6), REF, result="heads"), tmp_path / "heads.yaml")
    res = run_cli("verify", str(heads))
    assert res.exit_code == 0 and "result on every rank, its own heads" in res.stdout, res.stderr


def test_verify_an_invalid_plan_prints_one_line(tmp_path: Path) -> None:
    res = run_cli("verify", str(_invalid(tmp_path)))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 4 op 0" in lines[0] and "no contribution yet" in lines[0]
    assert "Traceback" not in res.stderr


def test_verify_json(tmp_path: Path) -> None:
    res = run_cli("verify", str(_valid(tmp_path)), "--json")
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["valid"] is True and data["violation"] is None
    assert (data["ranks"], data["algorithm"], data["chunks"]) == (6, "kary", 2) and data["ops"] > 0
    bad = run_cli("verify", str(_invalid(tmp_path)), "--json")
    assert bad.exit_code == 2
    data = json.loads(bad.stdout)
    assert data["valid"] is False and data["violation"]["kind"] == "empty-send"
    assert data["bit_groups"] is None  # not an empty mapping: that would say every rank's bits agree
    assert (data["violation"]["rank"], data["violation"]["op_index"]) == (4, 0)


def test_verify_says_whether_the_result_ranks_end_with_the_same_bits(tmp_path: Path) -> None:
    same = run_cli("verify", str(_valid(tmp_path)))
    assert "every result rank ends with the same bits" in same.stdout
    crossed = save_plan(build("direct", attention(6), REF, groups=[[0, 5], [1, 3], [2, 4]]), tmp_path / "d.yaml")
    res = run_cli("verify", str(crossed))
    assert res.exit_code == 0, res.stderr  # valid: it merges every contribution once
    assert "may end with different bits in 1 chunk (chunk 0: ranks 0,1,2 | 3,4,5)" in res.stdout
    assert json.loads(run_cli("verify", str(crossed), "--json").stdout)["bit_groups"] == {"0": [[0, 1, 2], [3, 4, 5]]}
    root = save_plan(build("star", attention(3), REF, result="root", root=1), tmp_path / "r.yaml")
    assert "bits" not in run_cli("verify", str(root)).stdout  # one rank holds the result


def test_verify_a_malformed_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("format: treeattn-plan\nversion: 7\n")
    res = run_cli("verify", str(path))
    assert res.exit_code == 2 and "newer treeattn" in res.stderr and "Traceback" not in res.stderr
    assert run_cli("verify", str(tmp_path / "absent.yaml")).exit_code == 2


def test_verify_as_a_user_runs_it(tmp_path: Path) -> None:
    plan = replace(build("ring", attention(4), REF), notes={"source": "test"})
    path = save_plan(plan, tmp_path / "ring.yaml")
    done = subprocess.run([str(TREEATTN), "verify", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "valid ring plan" in done.stdout
    done = subprocess.run([str(TREEATTN), "verify", str(_invalid(tmp_path))], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and done.stderr.startswith("error: ")


def test_plan_schema_command_prints_the_schema():
    from treeattn.plan.io import plan_json_schema

    res = run_cli("plan-schema")
    assert res.exit_code == 0 and json.loads(res.stdout) == plan_json_schema()
    assert "source" in json.loads(res.stdout)["$defs"]["_TopologyFile"]["properties"]
    # Every command that prints data takes --json (README); the schemas are JSON already.
    assert run_cli("plan-schema", "--json").stdout == res.stdout
    topo = run_cli("topo", "schema")
    assert topo.exit_code == 0 and run_cli("topo", "schema", "--json").stdout == topo.stdout


def test_plan_simulate_and_compare_say_which_pairs_go_through_host_memory(tmp_path: Path) -> None:
    # 4 L40S under 2 PCIe switches of one socket: the pairs meeting at the CPU are beyond NCCL's
    # default P2P level (PXB) and move at 2.7 GB/s, a tenth of their PCIe rate; every command
    # that predicts on the box says so, as topo show does, not topo show alone.
    box = tmp_path / "l40s4.yaml"
    box.write_text("name: l40s4\nnode:\n  gpus: {count: 4, model: L40S, mem_bw_gbps: 864, mem_gb: 48}\n"
                   "  pcie: {generation: 4, width: 16, bw_gbps: 25, switches: 2}\n")
    said = ("8 of 12 rank pairs are further apart than NCCL's P2P level (PXB) connects peer-to-peer: NCCL moves "
            "their data through host memory, at most 2.7 GB/s a pair")
    plan = tmp_path / "p.yaml"
    for args in (("plan", "-t", str(box), "-m", "llama-3.1-8b", "-b", "1", "-n", "4K", "-o", str(plan)),
                 ("simulate", str(plan)),
                 ("compare", "-t", str(box), "-m", "llama-3.1-8b", "-n", "4K")):
        res = run_cli(*args)
        assert res.exit_code == 0, res.stderr
        assert said in " ".join(res.stdout.split()), (args[0], res.stdout)
    # at NCCL_P2P_LEVEL=PHB every pair is peer-to-peer: nothing to say
    box.write_text(box.read_text() + "cost: {p2p_level: PHB}\n")
    res = run_cli("plan", "-t", str(box), "-m", "llama-3.1-8b", "-b", "1", "-n", "4K", "-o", str(plan))
    assert res.exit_code == 0 and "host memory" not in res.stdout, res.stdout


def test_plan_warns_of_a_named_plan_whose_ranks_end_with_different_bits(tmp_path):
    # verify says it; plan wrote such a plan without a word (the search leaves them out)
    shape = ("-t", "cpu:ranks=3", "-m", "llama-3.2-1b", "-n", "1K", "--no-progress")
    res = run_cli("plan", *shape, "-a", "direct", "--groups", "0-1/2", "-o", str(tmp_path / "d.yaml"))
    assert res.exit_code == 0, res.output
    assert ("warning: direct plan: its result ranks may end with different bits in 1 chunk "
            "(chunk 0: ranks 0 | 1 | 2)") in res.stderr
    same = run_cli("verify", str(tmp_path / "d.yaml"))
    assert "its result ranks may end with different bits in 1 chunk (chunk 0: ranks 0 | 1 | 2)" in same.stdout
    quiet = run_cli("plan", *shape, "-a", "star", "-o", str(tmp_path / "s.yaml"))
    assert quiet.exit_code == 0 and "different bits" not in quiet.stderr


def test_verify_says_whose_contributions_a_plan_with_contributors_holds(tmp_path: Path) -> None:
    # A hand-edited star plan that drops rank 3's partial and names the others as its contributors
    # is valid (the result holds exactly theirs), and was said to be as any other: a Merger then
    # returned attention without rank 3's KV. verify says so, and a Merger refuses it.
    from treeattn.plan.validate import given_partial_problem

    plan = build("star", attention(4), REF)
    plan = with_program(plan, 0, [op for op in plan.programs[0] if not (op.step == 1 and op.peer == 3)])
    plan = replace(with_program(plan, 3, [op for op in plan.programs[3] if op.step != 1]), contributors=(0, 1, 2))
    res = run_cli("verify", str(save_plan(plan, tmp_path / "three.yaml")))
    assert res.exit_code == 0, res.stderr
    assert ("result on every rank, over the KV of ranks 0, 1, 2 only (its contributors: a Merger, which merges "
            "every rank's partial, refuses it)\n") in res.stdout
    assert given_partial_problem(plan) == ("plan 'star' merges the partials of its contributors only, not of rank 3: "
                                           "a Merger merges every rank's partial (drop the plan's contributors, or "
                                           "build it anew)")
    from treeattn.workload import RawPayload

    raw = build("broadcast", RawPayload(nbytes=64, ranks=4), REF, root=2)
    res = run_cli("verify", str(save_plan(raw, tmp_path / "bcast.yaml")))
    assert res.exit_code == 0, res.stderr
    assert "result on every rank, of rank 2's contribution only (its contributors)\n" in res.stdout
