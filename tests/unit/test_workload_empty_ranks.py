"""A sequence shorter than the rank count, split evenly, leaves ranks with no KV cache: said
before planning (``treeattn.workload.empty_ranks_note``), by the CLI and the API alike."""

import warnings

import pytest

import treeattn
from tests.cli_helpers import run_cli
from treeattn.workload import Workload, empty_ranks_note

NOTE = "N=3 tokens split evenly over 8 ranks leaves 5 of them no KV cache"


def test_an_even_split_with_empty_ranks_is_noted_and_others_are_not():
    assert NOTE in empty_ranks_note(Workload.create(model="llama-3.1-8b", batch=1, seq_len=3, ranks=8))
    for w in (Workload.create(model="llama-3.1-8b", batch=1, seq_len=8, ranks=8),  # one token each
              # zeros given on purpose (a rank kept empty), not an even split's
              Workload.create(model="llama-3.1-8b", batch=1, seq_len=3, ranks=8, split=(0, 1, 1, 0, 0, 1, 0, 0)),
              Workload.create(model="llama-3.1-8b", batch=1, seq_len=4096, ranks=8)):
        assert empty_ranks_note(w) is None, w.split


def test_plan_and_the_api_warn_of_empty_ranks(tmp_path):
    res = run_cli("plan", "-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "3", "-o", str(tmp_path / "p.yaml"),
                  "--no-progress")
    assert res.exit_code == 0 and res.stderr.count(f"warning: {NOTE}") == 1, res.stderr
    res = run_cli("plan", "-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "3K", "-o", str(tmp_path / "q.yaml"),
                  "--no-progress")
    assert res.exit_code == 0 and "no KV cache" not in res.stderr, res.stderr
    with pytest.warns(UserWarning, match=NOTE):
        treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len=8)


def test_compare_warns_for_each_topology_whose_ranks_an_even_split_leaves_empty():
    res = run_cli("compare", "-t", "dgx-h100:nodes={1,2}", "-m", "llama-3.1-8b", "-n", "8", "--no-progress",
                  "--json")
    assert res.exit_code == 0, res.stderr
    # 8 tokens fill the 8 ranks of one node, not the 16 of two
    assert res.stderr.splitlines() == ["warning: dgx-h100:nodes=2: N=8 tokens split evenly over 16 ranks leaves "
                                       "8 of them no KV cache; they take part in the merge with empty partials"]


def test_the_api_warns_of_a_workload_given_whole_too():
    w = Workload.create(model="llama-3.1-8b", batch=1, seq_len=3, ranks=8)
    with pytest.warns(UserWarning, match=NOTE):
        treeattn.search_plan("dgx-h100", w)
