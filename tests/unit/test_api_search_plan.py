"""``treeattn.search_plan`` called as the README shows, with the values a user types."""

from __future__ import annotations

import pytest

import treeattn
from treeattn.errors import TreeattnError
from treeattn.plan.io import dump_plan


def test_seq_len_reads_as_the_cli_reads_it():
    text = treeattn.search_plan("cpu:ranks=2", "llama-3.2-1b", batch=1, seq_len="4K")
    number = treeattn.search_plan("cpu:ranks=2", "llama-3.2-1b", batch=1, seq_len=4096)
    assert text.workload.split == (2048, 2048)
    assert dump_plan(text) == dump_plan(number)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"batch": 1, "seq_len": 0}, "seq_len must be at least 1 token"),
    ({"batch": 1, "seq_len": "12Q"}, "cannot read search_plan.seq_len '12Q'"),
    ({"batch": 0, "seq_len": 4096}, "batch must be a positive integer"),
])
def test_bad_values_raise_the_library_error_naming_the_argument(kwargs, needle):
    with pytest.raises(TreeattnError, match=needle):
        treeattn.search_plan("cpu:ranks=2", "llama-3.2-1b", **kwargs)


@pytest.mark.parametrize(("options", "needle"), [
    ({"seed": "a"}, "seed must be an integer"),
    ({"seed": True}, "seed must be an integer"),
    ({"effort": "x"}, "effort must be a treeattn.search.search.Effort"),
])
def test_search_options_of_the_wrong_type_raise_the_library_error(options, needle):
    with pytest.raises(TreeattnError, match=needle):
        treeattn.search_plan("cpu:ranks=2", "llama-3.2-1b", batch=1, seq_len=4096, **options)
