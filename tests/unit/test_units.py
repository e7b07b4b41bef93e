"""Units: element sizes, size parsing and formatting."""

from __future__ import annotations

import re

import pytest

from treeattn.errors import InputError
from treeattn.units import MAX_BYTES, DType, counted, format_size, parse_size, transfer_us


def test_every_dtype_has_its_element_size():
    assert {d.value: d.nbytes for d in DType} == {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
    assert DType.parse("bfloat16").nbytes == 2 and DType.parse("float").nbytes == 4
    with pytest.raises(InputError, match="unknown dtype"):
        DType.parse("int4")


def test_sizes_parse_and_format():
    assert parse_size("16KB") == 16_000 and parse_size("1MiB") == 1 << 20 and parse_size(4096) == 4096
    assert format_size(1 << 20) == "1 MiB" and format_size(100) == "100 B"
    assert counted(1, "rank") == "1 rank" and counted(8, "rank") == "8 ranks" and counted(0, "chunk") == "0 chunks"


def test_a_bare_prefix_counts_in_1024s_as_nccl_tests_and_token_counts_do():
    assert parse_size("1K") == 1024 and parse_size("2M") == 2 << 20 and parse_size("1.5G") == 3 << 29
    assert parse_size("1KB") == 1000 and parse_size("1KiB") == 1024 and parse_size("8B") == 8
    assert parse_size("4 m") == 4 << 20
    assert parse_size("1.1MB") == 1_100_000 and parse_size("0.5KiB") == 512  # decimal, not float, arithmetic
    with pytest.raises(InputError, match=r"^--bytes '1.5B' is not a whole number of bytes$"):
        parse_size("1.5B", "--bytes")
    assert transfer_us(50_000, 50.0) == pytest.approx(1.0)
    with pytest.raises(InputError, match="cannot read size"):
        parse_size("lots")
    with pytest.raises(InputError, match="size must be >= 0, got '-5'"):
        parse_size("-5")


def test_a_size_below_the_least_is_refused_in_one_message_whatever_its_sign():
    # 0 and -4 are both below one element: the message says what is enough, not ">= 0".
    for bad in ("0", "-4", 0, -4, "2B"):
        with pytest.raises(InputError, match=f"^--bytes must be at least one fp32 element \\(4 bytes\\), "
                                             f"got {re.escape(repr(bad))}$"):
            parse_size(bad, "--bytes", least=4, least_text="one fp32 element (4 bytes)")
    for bad in ("0", "-4", 0, -4):
        with pytest.raises(InputError, match=f"^--bytes must be at least 1 byte, got {re.escape(repr(bad))}$"):
            parse_size(bad, "--bytes", least=1)
    assert parse_size("4B", least=4) == 4 and parse_size(0) == 0


def test_sizes_past_the_largest_buffer_are_refused_where_read():
    assert parse_size("1TiB") == MAX_BYTES and parse_size(MAX_BYTES) == MAX_BYTES
    with pytest.raises(InputError, match=r"^--bytes '2TiB' is over 1 TiB, more than any device's memory$"):
        parse_size("2TiB", "--bytes")
    with pytest.raises(InputError, match=r"^--max-size is 2 TiB, over 1 TiB, more than any device's memory$"):
        parse_size(2 * MAX_BYTES, "--max-size")


def test_a_need_over_a_limit_never_prints_as_the_same_size():
    """'needs 72 GiB of KV per GPU ... (72 GiB usable)' (deepseek-v3, B 64, 137,520 tokens on
    dgx-h100) read as if it fitted: two different counts print with the digits that tell them apart."""
    from treeattn.units import format_sizes

    need, limit = 77_310_443_520, 77_309_411_328  # 72.00096 and 72 GiB
    assert format_size(need) == format_size(limit) == "72 GiB"
    a, b = format_sizes(need, limit)
    assert a != b and a.endswith(" GiB") and b.endswith(" GiB")
    assert float(a.split()[0]) > float(b.split()[0])
    assert format_sizes(1 << 20, 72 << 30) == ("1 MiB", "72 GiB")  # apart already: as format_size prints
    assert format_sizes(5 << 30, 5 << 30) == ("5 GiB", "5 GiB")
    assert format_sizes(1001, 1000) == ("1001 B", "1000 B")
    a, b = format_sizes((1 << 40) + 1, 1 << 40)  # no digits tell them apart: the bytes do
    assert a != b and a.replace(",", "").startswith("1099511627777")


@pytest.mark.parametrize(("text", "want"), [
    ("1Gb", "--bytes '1Gb': a lower-case b is bits; write 1GB (powers of 1000) or 1GiB (of 1024) for bytes"),
    ("16kb", "--bytes '16kb': a lower-case b is bits; write 16KB (powers of 1000) or 16KiB (of 1024) for bytes"),
    ("2Gib", "--bytes '2Gib': a lower-case b is bits"),
    ("1PiB", "--bytes '1PiB' is over 1 TiB, more than any device's memory"),
])
def test_a_size_in_bits_or_past_the_largest_is_told_as_such(text, want):
    # 1Gb was read as 10^9 bytes, and 1PiB refused as unreadable
    with pytest.raises(InputError) as info:
        parse_size(text, "--bytes")
    assert str(info.value).startswith(want), str(info.value)
    assert parse_size("512B") == 512 and parse_size("1GB") == 10**9 and parse_size("1GiB") == 1 << 30
    with pytest.raises(InputError, match=r"'8b': a lower-case b is bits; write 8B or 8 for bytes"):
        parse_size("8b", "--bytes")


@pytest.mark.parametrize(("given", "meant"), [("llama-3.1-70", "llama-3.1-70b"), ("Llama-3.1-70B", "llama-3.1-70b"),
                                             ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
                                             ("deepseek-ai/DeepSeek-V3", "deepseek-v3")])
def test_a_mistyped_model_name_is_told_the_preset_it_likely_meant(given, meant):
    from treeattn.workload import check_model

    with pytest.raises(InputError, match=rf"^--model: unknown model '{re.escape(given)}' \(did you mean '{meant}'\?\); "
                                         "choose one of "):
        check_model(given, "--model")
    with pytest.raises(InputError, match=r"unknown model 'gpt-9'; choose one of"):
        check_model("gpt-9", "--model")
