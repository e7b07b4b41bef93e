"""``treeattn.search_plan`` called as the README shows, with the values a user types."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

import treeattn
from tests.cli_helpers import run_cli
from treeattn.errors import InputError, TreeattnError
from treeattn.plan.io import dump_plan
from treeattn.topology.io import dump_topology
from treeattn.topology.library import resolve


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
    ({"families": "star"}, "families must be a list of family names"),
    ({"families": 3}, "families must be a list of family names"),
    ({"chunk_choices": 4}, "chunk_choices must be a list of chunk counts"),
    ({"progress": True}, "progress must be a callable"),
    ({"mem_fraction": 1.5}, r"mem_fraction must be a number in \(0, 1\], got 1.5"),
    ({"mem_fraction": "0.5"}, r"mem_fraction must be a number in \(0, 1\], got '0.5'"),
])
def test_search_options_of_the_wrong_type_raise_the_library_error(options, needle):
    with pytest.raises(TreeattnError, match=needle):
        treeattn.search_plan("cpu:ranks=2", "llama-3.2-1b", batch=1, seq_len=4096, **options)


def test_families_that_build_nothing_for_the_layout_are_named():
    with pytest.raises(TreeattnError, match=r"with result heads from families \['multirail'\]"):
        treeattn.search_plan("cpu:ranks=4", "llama-3.2-1b", batch=1, seq_len=4096, result="heads",
                             families=["multirail"])


def test_a_plan_saved_from_the_api_finds_its_topology_file_from_anywhere(tmp_path, monkeypatch):
    # A topology file of the user's, a plan searched on it and saved elsewhere: simulate and
    # verify read the plan from a third directory and find the topology, as for `plan --out`.
    (tmp_path / "topo").mkdir()
    topo_file = tmp_path / "topo" / "mine.yaml"
    topo_file.write_text(dump_topology(dataclasses.replace(resolve("cpu:ranks=2"), name="mine")))
    monkeypatch.chdir(tmp_path / "topo")
    plan = treeattn.search_plan("mine.yaml", "llama-3.2-1b", batch=1, seq_len=4096)
    (tmp_path / "plans").mkdir()
    saved = treeattn.save_plan(plan, tmp_path / "plans" / "p.yaml")
    assert yaml.safe_load(saved.read_text())["topology"]["source"] == "../topo/mine.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = run_cli("simulate", str(saved), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["topology"]["name"] == "mine"
    # Loaded and saved again two levels deeper: still found (the loaded source was relative
    # to the first plan's folder).
    (tmp_path / "b" / "sub").mkdir(parents=True)
    again = treeattn.save_plan(treeattn.load_plan(saved), tmp_path / "b" / "sub" / "q.yaml")
    assert yaml.safe_load(again.read_text())["topology"]["source"] == "../../topo/mine.yaml"
    res = run_cli("simulate", str(again), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["topology"]["name"] == "mine", res.stderr
    # A plan on a shipped name or family records none: the name finds it.
    assert treeattn.search_plan("cpu:ranks=2", "llama-3.2-1b", batch=1, seq_len=4096).topology.source is None
    with pytest.raises(TreeattnError, match="cannot write plan"):
        treeattn.save_plan(plan, tmp_path / "no-such-dir" / "p.yaml")
    # A folder is not taken for plan --out's default name inside it: said so, with what to give.
    with pytest.raises(TreeattnError, match=r"^save_plan path '.*/b' is a folder: give the plan file's path "
                                            r"\('.*/b/NAME\.yaml', or \.json\)$"):
        treeattn.save_plan(plan, tmp_path / "b")
    # A folder that does not exist yet, named as one, is not taken for a file of that name.
    with pytest.raises(TreeattnError, match=r"^save_plan path '.*/new' is a folder"):
        treeattn.save_plan(plan, f"{tmp_path}/new/")
    assert not (tmp_path / "new").exists()
    # A name for another kind of file is refused as plan --out refuses it; .txt and no suffix are taken
    for name in ("x.csv", "x.png", "x.md"):
        with pytest.raises(TreeattnError, match=rf"^save_plan path '.*/{name}': a \.\w+ name for a plan file; end "
                                                r"it in \.yaml or \.json$"):
            treeattn.save_plan(plan, tmp_path / name)
        assert not (tmp_path / name).exists()
    yaml_text = treeattn.save_plan(plan, tmp_path / "x.yaml").read_text()
    for name in ("x.txt", "x"):
        assert treeattn.save_plan(plan, tmp_path / name).read_text() == yaml_text


def test_a_plan_loaded_from_text_is_never_saved_where_its_topology_file_is_lost(tmp_path):
    # Its source is relative to the plan file's folder, which text does not carry: written
    # elsewhere as it is, `simulate` would look for the topology beside the new file and fail.
    (tmp_path / "topo").mkdir()
    (tmp_path / "topo" / "mine.yaml").write_text(dump_topology(dataclasses.replace(resolve("cpu:ranks=2"),
                                                                                   name="mine")))
    plan = treeattn.search_plan(str(tmp_path / "topo" / "mine.yaml"), "llama-3.2-1b", batch=1, seq_len=4096)
    (tmp_path / "plans").mkdir()
    first = treeattn.save_plan(plan, tmp_path / "plans" / "p.yaml")
    text = first.read_text()
    assert yaml.safe_load(text)["topology"]["source"] == "../topo/mine.yaml"
    (tmp_path / "a" / "b").mkdir(parents=True)
    with pytest.raises(TreeattnError, match=r"cannot save the plan to .*'\.\./topo/mine\.yaml' relative to the "
                                            r"folder of the plan file it came from.*load_plan\(PATH\)"):
        treeattn.save_plan(treeattn.load_plan(text), tmp_path / "a" / "b" / "q.yaml")
    assert not (tmp_path / "a" / "b" / "q.yaml").exists()
    # Beside the file it came from the path still holds; from the file itself, anywhere.
    for saved in (treeattn.save_plan(treeattn.load_plan(text), tmp_path / "plans" / "again.yaml"),
                  treeattn.save_plan(treeattn.load_plan(first), tmp_path / "a" / "b" / "q.yaml")):
        res = run_cli("simulate", str(saved), "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["topology"]["name"] == "mine", res.stderr


def test_a_raw_payload_is_planned_as_plan_bytes_plans_it(tmp_path):
    from treeattn.workload import RawPayload

    payload = RawPayload(nbytes=1 << 20, ranks=8)
    plan = treeattn.search_plan("dgx-h100", payload)
    assert plan.is_raw and plan.workload == payload
    saved = treeattn.save_plan(plan, tmp_path / "api.yaml")
    cli = run_cli("plan", "-t", "dgx-h100", "--bytes", "1MiB", "--no-progress", "-o", str(tmp_path / "cli.yaml"))
    assert cli.exit_code == 0, cli.stderr
    assert saved.read_bytes() == (tmp_path / "cli.yaml").read_bytes()
    assert treeattn.build_plan("dgx-h100", payload, "butterfly").workload == payload
    with pytest.raises(TreeattnError, match="not with a RawPayload"):
        treeattn.search_plan("dgx-h100", payload, batch=1)
    with pytest.raises(TreeattnError, match="the workload has 4 ranks but topology 'dgx-h100' places 8"):
        treeattn.search_plan("dgx-h100", RawPayload(nbytes=1 << 20, ranks=4))


def test_mem_fraction_is_the_share_a_rank_may_use_as_plan_takes_it():
    # Llama-3.1-8B at B = 8, 256K on 8 GPUs: 32 GiB of KV a GPU fits 0.5 of 80 GiB, not 0.1
    kw = {"batch": 8, "seq_len": "256K"}
    assert treeattn.search_plan("dgx-h100", "llama-3.1-8b", **kw, mem_fraction=0.5).predicted_us > 0
    for name, call in (("search_plan", treeattn.search_plan),
                       ("build_plan", lambda *a, **k: treeattn.build_plan(*a[:2], "star", **k))):
        with pytest.raises(TreeattnError, match=rf"^{name}: needs 32 GiB of KV per GPU .*\(8 GiB usable at "
                                                r"mem_fraction 0.1\)"):
            call("dgx-h100", "llama-3.1-8b", **kw, mem_fraction=0.1)


def test_errors_from_below_name_the_call_they_came_through():
    with pytest.raises(TreeattnError, match=r"^search_plan: unknown topology 'dgx-h900'"):
        treeattn.search_plan("dgx-h900", "llama-3.1-8b", batch=1, seq_len=4096)
    with pytest.raises(TreeattnError, match=r"^build_plan: algorithm 'dcp-a2a' builds result heads, not all"):
        treeattn.build_plan("dgx-h100", "llama-3.1-8b", "dcp-a2a", batch=1, seq_len=4096)
    with pytest.raises(TreeattnError, match=r"^search_plan\.batch must be a positive integer"):  # named once
        treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=0, seq_len=4096)


@pytest.mark.parametrize("call", [treeattn.search_plan, lambda *a: treeattn.build_plan(*a, "butterfly")])
def test_a_workload_made_for_other_ranks_is_named_not_an_index_error(call):
    # A Workload carries its own rank count (its split): one made for 2 ranks, given with a
    # topology of 4, was read past its split's end (IndexError) before anything named it.
    from treeattn.workload import RawPayload, Workload

    two = Workload.create(ranks=2, seq_len=64, q_heads=8, kv_heads=2, head_dim=32)
    for payload in (two, RawPayload(nbytes=1024, ranks=2)):
        with pytest.raises(TreeattnError, match=r"has 2 ranks but topology 'cpu:ranks=4,cores=\d+' places 4"):
            call("cpu:ranks=4", payload)
        with pytest.raises(TreeattnError, match="has 2 ranks but topology"):
            call(resolve("cpu:ranks=4"), payload)


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: treeattn.search_plan(None, "llama-3.2-1b", batch=1, seq_len=64),
     "^search_plan topology must be a name, a file's path or a Topology, got None"),
    (lambda: treeattn.build_plan(8, "llama-3.2-1b", "star", batch=1, seq_len=64),
     "^build_plan topology must be a name, a file's path or a Topology, got 8"),
    (lambda: treeattn.save_plan("plan.yaml", "out.yaml"), "^save_plan plan must be a Plan"),
    (lambda: treeattn.save_plan(treeattn.build_plan("cpu:ranks=2", "llama-3.2-1b", "star", batch=1, seq_len=64),
                                None), "^save_plan path must be a file's path"),
    (lambda: treeattn.load_plan(None), "^load_plan takes a plan file's path or a plan's text, got None"),
    (lambda: treeattn.load_plan(3), "^load_plan takes a plan file's path or a plan's text, got 3"),
])
def test_arguments_of_the_wrong_type_are_named(call, needle):
    # Not "unknown topology 'None'", nor an AttributeError or TypeError from deep inside.
    with pytest.raises(TreeattnError, match=needle):
        call()


def test_search_plan_warns_where_the_models_weights_and_the_plan_outgrow_a_device():
    import warnings

    import treeattn

    # 1700K: each GPU's KV cache (66.4 GiB) and its share of the weights (16.4) pass 80 GiB.
    with pytest.warns(UserWarning, match=r"llama-3.1-70b's weights .* and rank 0's KV cache \(66.41 GiB\)"):
        treeattn.search_plan("dgx-h100", "llama-3.1-70b", batch=1, seq_len="1700K")
    with pytest.warns(UserWarning, match=r"llama-3.1-70b's weights .* and rank 0's KV cache \(66.41 GiB\)"):
        treeattn.build_plan("dgx-h100", "llama-3.1-70b", "binomial", batch=1, seq_len="1700K")
    # 128K: 16.4 GiB of weights are more than mem_fraction 0.9 leaves (8 GiB), but the plan's
    # peak (5 GiB) leaves them room.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        treeattn.search_plan("dgx-h100", "llama-3.1-70b", batch=1, seq_len="128K")
        treeattn.build_plan("dgx-h100", "llama-3.1-70b", "binomial", batch=1, seq_len="128K")


def test_a_workload_file_given_as_the_model_is_pointed_to_its_reader(tmp_path):
    # plan --workload takes a file; search_plan said "unknown model 'w.yaml'" and named presets.
    path = tmp_path / "w.yaml"
    path.write_text("model: llama-3.1-8b\nbatch: 1\nseq_len: 64K\n")
    with pytest.raises(InputError, match=r"search_plan: '.*w\.yaml' is a file, not a model preset: read a workload "
                                         r"file with treeattn\.search\.workload_file\.load_workload\("):
        treeattn.search_plan("cpu:ranks=4", str(path), batch=1, seq_len=1024)
    from treeattn.search.workload_file import load_workload

    assert treeattn.search_plan("cpu:ranks=4", load_workload(path, ranks=4)).ranks == 4
