"""treeattn.cli.lists: one reading of comma-separated flag values for every command."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treeattn.cli.lists import comma_items, int_items
from treeattn.errors import InputError


@pytest.mark.parametrize(("text", "kwargs", "message"), [
    ("", {}, "--x '' names nothing"),
    (" , ", {}, "--x ' , ' names nothing"),
    ("1,,2", {}, "--x '1,,2': item 2 is empty; write integers separated by commas"),
    ("1,", {"least": 1}, "--x '1,': item 2 is empty; write positive integers separated by commas"),
    ("1_6", {}, "--x '1_6': item 1 ('1_6') is not an integer"),  # int() reads 16
    ("+3", {}, "item 1 ('+3') is not an integer"),
    ("1 2", {}, "item 1 ('1 2') is not an integer"),
    ("١", {}, "is not an integer"),  # a digit int() takes, not one a user types for a count
    ("2,0", {"least": 1}, "--x '2,0': item 2 (0) must be at least 1"),
    ("-2", {"least": -1}, "item 1 (-2) must be at least -1"),
    ("3,03", {"distinct": True}, "--x '3,03' names 3 twice"),
])
def test_bad_integer_lists_are_refused_naming_the_item(text, kwargs, message):
    with pytest.raises(InputError, match=re.escape(message)):
        int_items(text, "--x", **kwargs)


def test_items():
    assert int_items(" -1, 0 ,7", "--x") == [-1, 0, 7]
    assert int_items("4,4", "--x") == [4, 4]  # repeats allowed unless distinct
    assert comma_items("a, b", "--f", "names") == ["a", "b"]
    with pytest.raises(InputError, match="^--f 'a,a' names a twice$"):
        comma_items("a,a", "--f", "names", distinct=True)


@given(st.lists(st.integers(min_value=-10**6, max_value=10**6), min_size=1, max_size=8))
def test_a_written_list_reads_back(values):
    assert int_items(",".join(map(str, values)), "--x") == values
