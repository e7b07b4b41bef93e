"""Plan files: exact round trips, deterministic bytes, and errors that name the field."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.test_plan_helpers import REF, attention, every_plan, raw
from treeattn.errors import PlanFormatError
from treeattn.plan import PLAN_VERSION, build
from treeattn.plan.io import (
    UPGRADES,
    YAML_HEADER,
    _fast_yaml,
    dump_plan,
    load_plan,
    payload_from_dict,
    plan_json_schema,
    plan_to_dict,
    save_plan,
)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_every_builder_round_trips_byte_for_byte(fmt: str) -> None:
    for p, chunks in ((1, 1), (5, 3), (8, 4)):
        for plan in every_plan(p, chunks):
            text = dump_plan(plan, fmt)
            again = load_plan(text)
            assert again == plan, plan.algorithm
            assert dump_plan(again, fmt) == text


def test_yaml_fast_path_reads_what_yaml_reads() -> None:
    for plan in every_plan(4, 2):
        text = dump_plan(plan)
        assert _fast_yaml(text) == yaml.safe_load(text)


def test_other_layouts_of_the_same_data_load_too() -> None:
    plan = build("ring-attention", attention(3), REF, chunks=2)
    data = plan_to_dict(plan)
    assert load_plan(yaml.safe_dump(data)) == plan  # block style: the full YAML parser reads it
    assert load_plan(json.dumps(data, indent=None)) == plan
    hand_edited = dump_plan(plan).replace("{kind: compute, step: 0}", "{kind: compute, step: 0}  # local partial")
    assert _fast_yaml(hand_edited) is None and load_plan(hand_edited) == plan


def test_files_and_suffixes(tmp_path: Path) -> None:
    plan = build("binomial", raw(5), REF, chunks=2)
    assert load_plan(save_plan(plan, tmp_path / "p.json")) == plan
    assert (tmp_path / "p.json").read_text().startswith("{")
    assert load_plan(str(save_plan(plan, tmp_path / "p.yaml"))) == plan
    text = (tmp_path / "p.yaml").read_text()
    assert text.startswith("\n".join(YAML_HEADER) + "\nformat: treeattn-plan\nversion: 2\n")
    assert "predicted_us" in YAML_HEADER[0] and "one layer" in YAML_HEADER[1] and "included" in YAML_HEADER[1]


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.recursive(
            st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=12)
            | st.floats(allow_nan=False, allow_infinity=False),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
            max_leaves=8,
        ),
        max_size=4,
    ),
    st.none() | st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),  # a time: 0 or more
    st.sampled_from(["yaml", "json"]),
)
def test_any_params_notes_and_prediction_round_trip(notes: dict, predicted: float | None, fmt: str) -> None:
    plan = replace(build("star", attention(3), REF), notes=notes, predicted_us=predicted,
                   topology=replace(REF, name="yes: no"))
    text = dump_plan(plan, fmt)
    assert load_plan(text) == plan
    assert dump_plan(load_plan(text), fmt) == text


# Any text UTF-8 can encode: control characters and YAML's own line breaks (NEL, LS, PS) too.
_ANY_CHAR = st.characters(exclude_categories=("Cs",))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(_ANY_CHAR, min_size=1, max_size=6),
                       st.text(_ANY_CHAR, max_size=6) | st.dictionaries(st.text(_ANY_CHAR, max_size=4),
                                                                         st.text(_ANY_CHAR, max_size=4), max_size=2),
                       max_size=3),
       st.text(_ANY_CHAR, min_size=1, max_size=6), st.sampled_from(["yaml", "json"]))
@example({"A\n": None}, "x", "yaml")  # "$" matches before a final newline: such a key must be quoted
@example({"k": {"a\nb": "c"}}, "n", "yaml")
@example({"\x85": "\u2028"}, "\u2029", "yaml")
@example({"k": "\ufeff"}, "a\tb", "yaml")
def test_every_string_the_writer_emits_round_trips(notes: dict, name: str, fmt: str) -> None:
    plan = replace(build("star", attention(3), REF), notes=notes, algorithm=name,
                   topology=replace(REF, name=name, source=name),
                   params={**build("star", attention(3), REF).params, **notes})
    text = dump_plan(plan, fmt)
    assert load_plan(text) == plan
    assert dump_plan(load_plan(text), fmt) == text


def test_a_lone_surrogate_is_refused_not_written() -> None:
    plan = replace(build("star", attention(3), REF), notes={"k": "\ud800"})
    for fmt in ("yaml", "json"):
        with pytest.raises(PlanFormatError, match="cannot write .*lone surrogate"):
            dump_plan(plan, fmt)


def test_schema_describes_the_file() -> None:
    schema = plan_json_schema()
    assert schema["additionalProperties"] is False
    assert {"format", "version", "programs", "workload"} <= set(schema["required"])
    assert json.dumps(schema, sort_keys=True) == json.dumps(plan_json_schema(), sort_keys=True)


def test_payload_parser_reads_to_dict() -> None:
    for payload in (attention(3), raw(4)):
        assert payload_from_dict(payload.to_dict()) == payload
    with pytest.raises(PlanFormatError, match="workload.batch"):
        payload_from_dict({**attention(3).to_dict(), "batch": "8"})


def _text(**changes: object) -> str:
    data = plan_to_dict(build("binomial", attention(4), REF, chunks=2))
    for key, value in changes.items():
        data[key] = value
    return json.dumps(data)


def _broken_op(r: int, i: int, **fields: object) -> str:
    data = plan_to_dict(build("binomial", attention(4), REF, chunks=2))
    data["programs"][r][i].update(fields)
    return json.dumps(data)


@pytest.mark.parametrize("text, message", [
    (_text(version=PLAN_VERSION + 1), f"plan version {PLAN_VERSION + 1} was written by a newer treeattn"),
    (_text(version=0), "plan version 0 is not supported and cannot be upgraded"),
    (_text(version="1"), "version must be an integer"),
    (_text(format="treeattn-topology"), "format is 'treeattn-topology', expected 'treeattn-plan'"),
    (_text(colour="blue"), "colour is not a known field"),
    (_text(chunks=0), "chunks: Input should be greater than or equal to 1"),
    (_text(chunks=1000), "plan.chunks \\(1000\\) exceeds the payload's rows \\(64\\)"),
    (_text(workload={**attention(4).to_dict(), "seq_len": 1}), "workload.seq_len is 1 but split sums to 640"),
    (_text(workload={**attention(3).to_dict()}), "3 ranks"),
    (_text(workload={"kind": "attention"}), "workload.batch is missing"),
    (_text(workload={**raw(4).to_dict(), "nbytes": 2 << 40}),
     "workload.nbytes is 2 TiB, over 1 TiB, more than any device's memory"),
    (_broken_op(0, 7, bogus=1), "programs\\[0\\]\\[7\\].bogus is not a known field"),
    (_broken_op(2, 1, peer="one"), "programs\\[2\\]\\[1\\].peer: Input should be a valid integer, got 'one'"),
    (_broken_op(1, 2, peer=None), "programs\\[1\\]\\[2\\].peer: a send op needs a peer"),
    (_broken_op(0, 0, kind="launch"), "programs\\[0\\]\\[0\\].kind: Input should be"),
    (_broken_op(0, 0, step=-1), "programs\\[0\\]\\[0\\].step: Input should be greater than or equal to 0"),
    ("[1, 2]\n", "not a plan file"),
    ("# only a comment\n", "not a plan file: it is empty$"),
    ("format: treeattn-plan\nversion: [\n", "not valid YAML at line 3"),
    ("{\"format\": ", "not valid JSON at line 1"),
    ("{\"format\": " + "[" * 100_000, "not valid JSON: nested too deeply$"),
])
def test_format_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(PlanFormatError, match=message):
        load_plan(text)


def test_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(_broken_op(2, 1, peer="one"))
    with pytest.raises(PlanFormatError, match=f"^{path}: programs\\[2\\]\\[1\\].peer"):
        load_plan(path)
    with pytest.raises(PlanFormatError, match="cannot read plan file"):
        load_plan(tmp_path / "missing.yaml")


def test_older_versions_are_upgraded(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = build("star", attention(3), REF)
    old = plan_to_dict(plan)
    old["version"] = 0
    old["algorithm_name"] = old.pop("algorithm")  # pretend version 0 called it that

    def v0_to_v1(data: dict) -> dict:
        data["algorithm"] = data.pop("algorithm_name")
        data["version"] = 1
        return data

    monkeypatch.setitem(UPGRADES, 0, v0_to_v1)
    assert load_plan(json.dumps(old)) == plan


def test_a_version_1_file_loads_as_the_same_plan() -> None:
    # tests/fixtures/plans/v1-dgx-h100-binomial.yaml: plans/examples/dgx-h100-binomial.yaml as
    # treeattn wrote it before version 2 (heads layouts, compute beside transfers).
    path = Path(__file__).resolve().parents[1] / "fixtures" / "plans" / "v1-dgx-h100-binomial.yaml"
    text = path.read_text()
    assert "\nversion: 1\n" in text
    plan = load_plan(path)
    assert plan.version == 2 and plan.layout == "full" and plan.result == "all"
    assert dump_plan(plan) == "\n".join(YAML_HEADER) + "\n" + text.replace("\nversion: 1\n", "\nversion: 2\n")


def test_heads_layout_round_trips() -> None:
    plan = build("binomial", attention(4), REF, chunks=2, result="heads")
    text = dump_plan(plan)
    assert "\nlayout: heads\n" in text
    assert load_plan(text) == plan and load_plan(dump_plan(plan, "json")) == plan


def test_example_plans_load_validate_and_redump_identically() -> None:
    from treeattn.plan import check

    folder = Path(__file__).resolve().parents[2] / "plans" / "examples"
    paths = sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.json"))
    assert len(paths) >= 5
    for path in paths:
        plan = load_plan(path)
        check(plan)
        assert dump_plan(plan, "json" if path.suffix == ".json" else "yaml") == path.read_text()


def test_the_format_page_shows_a_shipped_plan_as_it_is():
    # docs/plan-format.md's example is what a user compares a file against: it must be the
    # start of the shipped plan it names, line for line, in the current version.
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "plan-format.md").read_text()
    assert f"\n    version: {PLAN_VERSION}\n" in page
    example = page.split("## Example\n", 1)[1].split("\n## ", 1)[0]
    shown = [ln[4:] for ln in example.splitlines() if ln.startswith("    ")]
    assert shown[-1].strip() == "..."
    shipped = (root / "plans" / "examples" / "dgx-h100-binomial.yaml").read_text().splitlines()
    assert "plans/examples/dgx-h100-binomial.yaml" in example
    for line, real in zip(shown[:-1], shipped, strict=False):
        assert line == real or (line.endswith(", ...}") and real.startswith(line[:-5])), (line, real)


def test_a_plan_prints_as_a_summary_not_its_programs():
    from treeattn.plan.builders import build
    from treeattn.plan.ir import TopologyRef
    from treeattn.workload import RawPayload

    plan = build("butterfly", RawPayload(nbytes=4 * 1024, ranks=32), TopologyRef("t", "sha256:0"), chunks=2)
    text = repr(plan)
    assert text.startswith("Plan(algorithm='butterfly', params=") and "ranks=32, chunks=2, result='all'" in text
    assert f"ops={sum(map(len, plan.programs))}" in text and 10 * len(text) < len(repr(plan.programs))



@pytest.mark.parametrize("name", ["cpu-4-chain.yaml", "dgx-h100-2node-multirail.json"])
def test_a_key_given_twice_in_a_plan_is_refused(tmp_path, name):
    """A hand-edited plan with ``algorithm: binomial`` and then ``algorithm: star`` was read as
    the star plan with binomial's programs; YAML and JSON keep the last key by default."""
    text = (Path(__file__).resolve().parents[2] / "plans" / "examples" / name).read_text()
    assert load_plan(text).algorithm
    if name.endswith(".json"):
        twice = text.replace('"algorithm": ', '"algorithm": "star",\n  "algorithm": ', 1)
    else:
        twice = text.replace("\nalgorithm: ", "\nalgorithm: star\nalgorithm: ", 1)
    assert twice != text
    path = tmp_path / name
    path.write_text(twice)
    with pytest.raises(PlanFormatError, match="'algorithm' is given twice") as err:
        load_plan(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
