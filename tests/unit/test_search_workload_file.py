"""The workload YAML form and the flag-to-workload path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from treeattn.cli.options import make_payload, parse_ranks
from treeattn.errors import InputError, WorkloadError
from treeattn.search.workload_file import load_workload, parse_tokens, workload_from_dict
from treeattn.workload import RawPayload, Workload


def test_parse_tokens():
    assert parse_tokens("128K") == 131072
    assert parse_tokens("1M") == 1 << 20
    assert parse_tokens(4096) == 4096
    assert parse_tokens("0.5K") == 512
    # as --bytes writes sizes: the same powers of 1024
    assert parse_tokens("1Mi") == parse_tokens("1m") == parse_tokens("1MI") == 1 << 20
    for bad in ("-3", "12X", True, -1, "0.3K", "1MiB", "1e6", "1i", "", "Ki"):
        with pytest.raises(WorkloadError):
            parse_tokens(bad)
    assert parse_tokens(0) == 0
    for bad in (0, -5, "0", "-5", "-1K"):  # a sequence's length is at least one token, whatever the sign
        with pytest.raises(WorkloadError, match=f"^seq_len must be at least 1 token, got {bad!r}$"):
            parse_tokens(bad, least=1)


def test_yaml_form_round_trips_through_to_dict(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text(
        "workload:\n  model: llama-3.1-8b\n  batch: 16\n  seq_len: 128K\n"
        "  split: [64K, 64K, 0, 0]\n  kv_dtype: fp16\n  layers: 2\n"
    )
    w = load_workload(f, ranks=4)
    assert isinstance(w, Workload)
    assert (w.batch, w.q_heads, w.kv_heads, w.head_dim, w.layers) == (16, 32, 8, 128, 2)
    assert w.split == (65536, 65536, 0, 0) and w.kv_dtype.value == "fp16"
    again = workload_from_dict(w.to_dict(), ranks=4)
    assert again == w


def test_yaml_raw_payload(tmp_path):
    f = tmp_path / "raw.yaml"
    f.write_text("kind: raw\nbytes: 1MiB\nop: sum\n")
    w = load_workload(f, ranks=8)
    assert isinstance(w, RawPayload) and w.nbytes == 1 << 20 and w.ranks == 8
    # A raw buffer is summed: the executor has no (o, lse) in it to merge.
    f.write_text("kind: raw\nbytes: 1MiB\nop: merge\n")
    with pytest.raises(WorkloadError, match=r"op: a raw payload is summed \(op sum\), got 'merge'"):
        load_workload(f, ranks=8)
    with pytest.raises(WorkloadError, match="a raw payload is summed"):
        RawPayload(nbytes=64, ranks=2, op="merge")


@pytest.mark.parametrize(
    "data, ranks, needle",
    [
        ({"model": "gpt-9", "seq_len": 10}, 2, "unknown model 'gpt-9'"),
        ({"model": "llama-3.1-8b", "seq_len": 10, "batch": -1}, 2, "workload.batch"),
        ({"model": "llama-3.1-8b", "seq_len": 10, "colour": 1}, 2, "unknown key(s) colour for an attention workload"),
        ({"model": "llama-3.1-8b", "seqlen": 10}, 2, "unknown key(s) seqlen (did you mean seq_len?) for an attention"),
        ({"model": "llama-3.1-8b", "seq_len": 10, "heads": "x"}, 2, "workload.heads must be a positive integer"),
        ({"heads": 8, "seq_len": 10}, 2, "head_dim"),
        ({"model": "llama-3.1-8b", "seq_len": 10, "split": [5, 5, 0]}, 2, "names 3 ranks"),
        ({"model": "llama-3.1-8b", "seq_len": 11, "split": [5, 5]}, 2, "sums to 10"),
        ({"model": "llama-3.1-8b", "seq_len": 11, "ranks": 3}, 2, "topology places 2"),
        ({"model": "llama-3.1-8b"}, 2, "give seq_len"),
        ({"heads": 6, "kv_heads": 4, "head_dim": 8, "seq_len": 4}, 2, "must divide"),
        ({"model": "llama-3.1-8b", "seq_len": 10, "kv_dtype": "bf17"}, 2, "workload.kv_dtype: unknown dtype 'bf17'"),
    ],
)
def test_bad_workloads_name_the_field(data, ranks, needle):
    with pytest.raises(WorkloadError) as exc:
        workload_from_dict(data, ranks=ranks)
    assert needle in str(exc.value)


def test_bad_file(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read workload file"):
        load_workload(tmp_path / "missing.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("batch: [1\n")
    with pytest.raises(WorkloadError, match="bad.yaml:2: not valid YAML: expected ',' or ']'"):
        load_workload(f)
    f.write_text("batch: " + "[" * 100_000 + "\n")
    with pytest.raises(WorkloadError, match="bad.yaml: not valid YAML: nested too deeply$"):
        load_workload(f)
    # the shape's own checks name the file too
    f.write_text("workload:\n  q_heads: 64\n  kv_heads: 7\n  head_dim: 128\n  seq_len: 128K\n")
    with pytest.raises(WorkloadError, match=r"bad.yaml: kv_heads \(7\) must divide q_heads \(64\)$"):
        load_workload(f, ranks=2)


def test_a_key_given_twice_is_refused(tmp_path):
    # YAML would keep the last one and plan 8K where the reader of the file sees 4K first.
    f = tmp_path / "w.yaml"
    f.write_text("model: llama-3.2-1b\nseq_len: 4K\nseq_len: 8K\n")
    with pytest.raises(WorkloadError, match=r"w.yaml:3: key 'seq_len' is given twice"):
        load_workload(f, ranks=2)
    f.write_text("workload:\n  model: llama-3.2-1b\n  seq_len: 4K\n  split: [1K, 3K]\n  model: llama-3.1-8b\n")
    with pytest.raises(WorkloadError, match=r"w.yaml:5: key 'model' is given twice"):
        load_workload(f, ranks=2)
    # equal keys in different mappings are fine
    f.write_text("workload:\n  model: llama-3.2-1b\n  seq_len: 4K\n")
    assert load_workload(f, ranks=2).seq_len == 4096


def test_keys_beside_a_workload_wrapper_are_named_as_out_of_it(tmp_path):
    # Not "unknown key(s) workload": the wrapper is known, the key dedented out of it is the mistake.
    f = tmp_path / "w.yaml"
    f.write_text("workload:\n  model: llama-3.2-1b\nseq_len: 4K\nbatch: 2\n")
    with pytest.raises(WorkloadError, match=r"w.yaml: a 'workload:' mapping .* the keys beside it \(seq_len, batch\) "
                                            r"belong inside it"):
        load_workload(f, ranks=2)


@pytest.mark.parametrize(("data", "flags", "message"), [
    # Each count is named by what gave it: a flag by the flag, a preset's by the preset, so the
    # user knows which to change (not "workload.kv_heads (8) must divide q_heads (7)").
    ({"model": "llama-3.1-8b", "heads": 7}, {"q_heads": "--heads"},
     "--heads (7) must be a multiple of llama-3.1-8b's 8 KV heads; give --kv-heads as well"),
    ({"model": "llama-3.1-8b", "kv_heads": 5}, {"kv_heads": "--kv-heads"},
     "--kv-heads (5) must divide llama-3.1-8b's 32 query heads"),
    ({"heads": 8, "kv_heads": 3, "head_dim": 4}, {"q_heads": "--heads", "kv_heads": "--kv-heads"},
     "--kv-heads (3) must divide --heads (8)"),
    ({"heads": 8, "head_dim": 4, "split": "0,0"}, {"split": "--split"}, "--split holds no tokens at all"),
])
def test_shape_errors_name_the_flags(data, flags, message):
    data = data if "split" in data else {**data, "seq_len": 64}
    with pytest.raises(WorkloadError, match=f"^{re.escape(message)}$"):
        workload_from_dict(data, ranks=2, flags=flags)


def test_an_empty_split_is_refused_by_one_check():
    # Files, flags and Workload itself refuse a split of no tokens through check_split, so the
    # words (and the name of what gave the split) cannot drift apart.
    package = Path(__file__).resolve().parents[2] / "treeattn"
    said = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                  if "holds no tokens" in p.read_text(encoding="utf-8"))
    assert said == ["workload.py"]
    with pytest.raises(WorkloadError, match=r"^workload\.split holds no tokens at all$"):
        Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(0, 0))
    with pytest.raises(WorkloadError, match=r"^w\.yaml: split holds no tokens at all$"):
        workload_from_dict({"heads": 2, "head_dim": 4, "split": [0, 0]}, ranks=2, where="w.yaml", file=True)


@pytest.mark.parametrize("file", ["model: llama-3.1-8b\nseq_len: 1K\n",
                                  "heads: 32\nkv_heads: 8\nhead_dim: 128\nseq_len: 1K\n"])
def test_heads_against_a_files_kv_heads_name_both(tmp_path, file):
    # --heads overrides the file's query heads but not its KV heads: the message names the
    # flag and the file's field it does not fit, so the user sees which of the two to change.
    f = tmp_path / "w.yaml"
    f.write_text(file)
    with pytest.raises(WorkloadError, match=rf"^{re.escape(str(f))}: kv_heads \(8\) must divide --heads \(7\)$"):
        make_payload(2, workload_file=f, heads=7)
    with pytest.raises(WorkloadError, match=rf"^--kv-heads \(5\) must divide {re.escape(str(f))}: q_heads \(32\)$"):
        make_payload(2, workload_file=f, kv_heads=5)


def test_flags_override_file(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("model: llama-3.1-8b\nbatch: 4\nseq_len: 1K\n")
    w = make_payload(2, workload_file=f, batch=8, seq_len="2K")
    assert (w.batch, w.seq_len, w.split) == (8, 2048, (1024, 1024))
    w = make_payload(2, workload_file=f, split="2K,0")
    assert w.split == (2048, 0)
    with pytest.raises(InputError, match="--bytes"):
        make_payload(2, nbytes="1KB", model="llama-3.1-8b")
    with pytest.raises(InputError, match="--op"):
        make_payload(2, model="llama-3.1-8b", seq_len="1K", op="sum")


def test_parse_ranks():
    assert parse_ranks("0-3,8", 16) == (0, 1, 2, 3, 8)
    assert parse_ranks("6,2", 8) == (6, 2)
    for bad in ("0-", "a", "3-1", "0-8", "1,1"):
        with pytest.raises(InputError):
            parse_ranks(bad, 8)


def test_payloads_past_the_largest_buffer_are_refused():
    # Byte counts past 1 TiB a rank overflowed the simulator's 64-bit arrays (a traceback).
    with pytest.raises(InputError, match=r"^workload.bytes '2TiB' is over 1 TiB, more than any device's memory$"):
        workload_from_dict({"bytes": "2TiB"}, ranks=2)
    shape = {"model": "llama-3.1-8b", "seq_len": "128K"}
    with pytest.raises(InputError, match=r"a rank's partial .* is 1.502e\+05 TiB, over 1 TiB"):
        workload_from_dict({**shape, "batch": 10**13}, ranks=4)
    with pytest.raises(InputError, match=r"rank 0's KV cache of 32 layers \(batch 1 x \d+ tokens x 8 KV heads x 256 "
                                          r"values x 2 bytes a layer\) is .* TiB, over 1 TiB"):
        workload_from_dict({**shape, "seq_len": 10**20}, ranks=4)
    with pytest.raises(InputError, match=r"KV cache of 10000000000 layers \(.*\) is .* TiB, over 1 TiB"):
        workload_from_dict({**shape, "layers": 10**10}, ranks=4)
    assert workload_from_dict({**shape, "batch": 64}, ranks=4).batch == 64


def test_a_files_key_is_named_after_the_file_and_a_colon(tmp_path):
    # "wl0.yaml.ranks" read as a file name; a plan's workload mapping keeps its key path.
    with pytest.raises(WorkloadError, match=r"^wl0\.yaml: ranks is 4 but the topology places 8 ranks$"):
        workload_from_dict({"model": "llama-3.1-8b", "seq_len": 1024, "ranks": 4}, ranks=8, where="wl0.yaml", file=True)
    with pytest.raises(WorkloadError, match=r"^workload\.ranks is 4 but the topology places 8 ranks$"):
        workload_from_dict({"model": "llama-3.1-8b", "seq_len": 1024, "ranks": 4}, ranks=8, where="workload")
    bare = tmp_path / "wl"  # no suffix: still a file
    bare.write_text("model: llama-3.1-8b\nseq_len: 1024\nranks: 4\n")
    with pytest.raises(WorkloadError, match=r": ranks is 4 but the topology places 8 ranks$"):
        load_workload(bare, ranks=8)


@pytest.mark.parametrize("split", ["2K,,2K,0", "2K,2K,0,0,"])
def test_an_empty_item_of_a_written_split_is_refused(split):
    # It was dropped: '--split 2K,,2K,0' was read as three ranks ("names 3 ranks but there are 4").
    with pytest.raises(WorkloadError, match=r"^--split '.*': item \d is empty; write tokens per rank"):
        workload_from_dict({"model": "llama-3.2-1b", "split": split}, ranks=4, flags={"split": "--split"})
