"""``resolve`` reads back the names ``plan --ranks`` writes (``NAME[ranks SEL]``)."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli
from treeattn.cli.options import load_topology
from treeattn.errors import InputError
from treeattn.topology.library import parse_ranks, resolve, subset_topology


def test_a_subset_name_resolves_to_the_same_machine():
    sub = load_topology("dgx-h100-2node", "0-3, 8-11")
    assert sub.name == "dgx-h100-2node[ranks 0-3,8-11]"
    again = resolve(sub.name)
    assert again.name == sub.name and again.fingerprint == sub.fingerprint
    assert again.ranks == tuple(f"n{n}.gpu{g}" for n in (0, 1) for g in range(4))
    # family specs, the order given, and a subset of a subset
    fam = resolve("dgx-h100:nodes=2[ranks 9,1]")
    assert fam.ranks == ("n1.gpu1", "n0.gpu1") and fam.num_ranks == 2
    nested = resolve("dgx-h100-2node[ranks 0-3,8-11][ranks 4-7]")
    assert nested.ranks == again.ranks[4:]
    assert resolve("cpu-4[ranks 0-3]").name == "cpu-4"  # every rank in order: the machine itself


def test_one_implementation_of_the_subset():
    topo = resolve("emu-2x4")
    assert subset_topology(topo, (0, 4)).name == "emu-2x4[ranks 0,4]"
    assert subset_topology(topo, tuple(range(8))) is topo
    assert parse_ranks("6,2", 8) == (6, 2)


@pytest.mark.parametrize("spec, text", [
    ("dgx-h100-2node[ranks 0-99]", "rank 16 does not exist"),
    # refused before the range is built: this one overflowed range() with a traceback
    ("dgx-h100-2node[ranks 0-3,20-99999999999999999999]", "rank 20 does not exist"),
    ("dgx-h100-2node[ranks 3-1]", "runs backwards"),
    ("dgx-h100-2node[ranks a]", "cannot read topology"),
    ("dgx-h100-2node[ranks 1,1]", "twice"),
    ("nope[ranks 0-1]", "unknown topology 'nope'"),
    # a malformed selection is named as such, not as a bad family parameter or an unknown name
    ("dgx-h100:nodes=2[ranks ]", "cannot read its rank selection"),
    ("dgx-h100:nodes=2[ranks 0-3", "cannot read its rank selection"),
    ("dgx-h100:nodes=2[rank 0-3]", "cannot read its rank selection"),
    ("dgx-h100-2node[ranks=0-3]", "cannot read its rank selection"),
])
def test_bad_selections_name_the_topology(spec, text):
    with pytest.raises(InputError, match=text):
        resolve(spec)


def test_a_missing_file_with_a_bracket_is_named_as_a_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        resolve(str(tmp_path / "run[1].yaml"))
    (tmp_path / "x").mkdir()
    topo = tmp_path / "x" / "c[2].yaml"
    topo.write_text("name: c\nfamily: cpu\nparams: {ranks: 2}\n")
    assert resolve(str(topo)).num_ranks == 2


def test_simulate_reads_the_topology_a_ranks_plan_names(tmp_path):
    out = tmp_path / "p.yaml"
    res = run_cli("plan", "-t", "dgx-h100-2node", "--ranks", "0-1,8-9", "--algorithm", "binomial", "--model",
                  "llama-3.1-8b", "--seq-len", "8K", "-o", str(out))
    assert res.exit_code == 0, res.stderr
    res = run_cli("simulate", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["topology"]["name"] == "dgx-h100-2node[ranks 0-1,8-9]" and data["fingerprint_mismatch"] is False


@pytest.mark.parametrize("flag, value, algorithm", [
    ("--order", "0,1,x", "ring"),
    ("--groups", "0-3/4-8", "hierarchical"),
    ("--roots", "0,9", "multirail"),
])
def test_a_bad_rank_list_names_its_own_flag(tmp_path, flag, value, algorithm):
    # They share --ranks's reader, and its messages named --ranks, which the command line did not give.
    res = run_cli("plan", "-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "1K", "--algorithm", algorithm, flag, value,
                  "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr and "--ranks" not in res.stderr
    assert not list(tmp_path.iterdir())
