"""``treeattn.simulate_plan``: a plan's predicted time from Python, the whole layer or one ``Merger``
call (each rank's partial given), and ``treeattn simulate``'s "merge only" line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import treeattn
from tests.cli_helpers import run_cli
from treeattn.cost.simulate import simulate
from treeattn.errors import InputError, PlanFormatError
from treeattn.topology.library import resolve
from treeattn.workload import RawPayload

ROOT = Path(__file__).resolve().parents[2]


def _free_attention(topo):  # noqa: ANN001, ANN202 - a Topology with attention kernels that take no time
    return dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, attn_launch_us=0.0, attn_next_launch_us=0.0,
                                                              attn_gbps=1e18))


def test_by_default_it_predicts_what_the_plan_records_on_the_plans_own_topology(tmp_path):
    plan = treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=1, seq_len="128K")
    assert treeattn.simulate_plan(plan).predicted_us == plan.predicted_us
    topo_file = tmp_path / "topo" / "box.yaml"
    topo_file.parent.mkdir()
    (tmp_path / "plans").mkdir()
    topo_file.write_text((ROOT / "topologies" / "cpu-4.yaml").read_text())
    plan = treeattn.build_plan(str(topo_file), "llama-3.2-1b", "binomial", batch=1, seq_len=4096)
    loaded = treeattn.load_plan(treeattn.save_plan(plan, tmp_path / "plans" / "p.yaml"))
    assert treeattn.simulate_plan(loaded).predicted_us == plan.predicted_us  # the file found from the plan's folder
    other = treeattn.simulate_plan(plan, "cpu:ranks=4,cores=4")
    assert other.predicted_us == simulate(plan, resolve("cpu:ranks=4,cores=4")).predicted_us != plan.predicted_us


def test_a_plan_file_or_text_is_read_as_load_plan_reads_it(tmp_path):
    # As Merger takes it: the plan every rank loads from the same file.
    topo_file = tmp_path / "topo" / "box.yaml"
    topo_file.parent.mkdir()
    (tmp_path / "plans").mkdir()
    topo_file.write_text((ROOT / "topologies" / "cpu-4.yaml").read_text())
    plan = treeattn.build_plan(str(topo_file), "llama-3.2-1b", "binomial", batch=1, seq_len=4096)
    path = treeattn.save_plan(plan, tmp_path / "plans" / "p.yaml")
    for given in (path, str(path)):  # its topology file found from the plan's folder, as load_plan finds it
        assert treeattn.simulate_plan(given).predicted_us == plan.predicted_us
    assert treeattn.simulate_plan(given, given_partials=True).predicted_us \
        == treeattn.simulate_plan(plan, given_partials=True).predicted_us
    shipped = treeattn.build_plan("dgx-h100", "llama-3.1-8b", "binomial", batch=1, seq_len="64K")
    text = treeattn.save_plan(shipped, tmp_path / "s.yaml").read_text()
    assert treeattn.simulate_plan(text).predicted_us == shipped.predicted_us
    with pytest.raises(PlanFormatError, match=r"^simulate_plan: .*nosuch\.yaml"):
        treeattn.simulate_plan(tmp_path / "nosuch.yaml")


@pytest.mark.parametrize(("algorithm", "result"), [("binomial", "all"), ("direct", "all"), ("allgather-merge", "all"),
                                                   ("dcp-a2a", "heads"), ("star", "root:3")])
def test_a_merger_call_is_the_layer_with_attention_that_takes_no_time(algorithm, result):
    topo = resolve("dgx-h100-2node")
    plan = treeattn.build_plan(topo, "llama-3.1-8b", algorithm, batch=2, seq_len="256K", result=result)
    call = treeattn.simulate_plan(plan, topo, given_partials=True).predicted_us
    assert call == pytest.approx(simulate(plan, _free_attention(topo)).predicted_us, rel=1e-9)
    assert 0 < call < plan.predicted_us


def test_only_the_ranks_own_partial_is_given():
    from treeattn.cost.compute import ComputeModel

    topo = resolve("dgx-h100")
    plan = treeattn.build_plan(topo, "llama-3.1-8b", "binomial", batch=1, seq_len="64K")
    cm = ComputeModel.of(plan.workload, topo, given_partials=True)
    assert cm.partial_us(3) == 0.0 and cm.partial_us(3, 3) == 0.0
    assert cm.partial_us(3, 4) == ComputeModel.of(plan.workload, topo).partial_us(3, 4) > 0


def test_plans_a_merger_cannot_run_and_bad_arguments_are_refused_by_name():
    ring = treeattn.build_plan("cpu:ranks=4", "llama-3.2-1b", "ring-attention", batch=1, seq_len=4096)
    with pytest.raises(InputError, match=r"^simulate_plan: plan 'ring-attention' computes over KV blocks of other "
                                         r"ranks \(it moves KV, not partials\)"):
        treeattn.simulate_plan(ring, given_partials=True)
    assert treeattn.simulate_plan(ring).predicted_us == ring.predicted_us
    raw = treeattn.build_plan("cpu:ranks=4", RawPayload(1 << 20, 4), "binomial")
    with pytest.raises(InputError, match=r"^simulate_plan: plan 'binomial' reduces a raw payload: it has no "
                                         r"partials to be given$"):
        treeattn.simulate_plan(raw, given_partials=True)
    with pytest.raises(InputError, match=r"^simulate_plan plan must be a Plan .*, a plan file's path or a plan's "
                                         r"text, got int$"):
        treeattn.simulate_plan(3)
    with pytest.raises(InputError, match=r"^simulate_plan given_partials must be True or False, got 1$"):
        treeattn.simulate_plan(ring, given_partials=1)
    with pytest.raises(InputError, match=r"^simulate_plan: plan has 4 ranks but topology 'dgx-h100' places 8"):
        treeattn.simulate_plan(ring, "dgx-h100")


def test_simulate_prints_a_merger_calls_time_where_the_plan_merges_given_partials(tmp_path):
    topo = resolve("dgx-h100")
    plan = treeattn.build_plan(topo, "llama-3.1-8b", "binomial", batch=1, seq_len="128K")
    path = treeattn.save_plan(plan, tmp_path / "p.yaml")
    want = treeattn.simulate_plan(plan, given_partials=True).predicted_us
    out = run_cli("simulate", str(path))
    assert out.exit_code == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("merge only"))
    assert float(line.split()[2]) == pytest.approx(want, abs=5e-4)
    assert line.endswith("µs   a Merger call: partials given, no attention") and len(line) <= 80
    assert json.loads(run_cli("simulate", str(path), "--json").stdout)["merger_call_us"] == want
    ring = treeattn.save_plan(treeattn.build_plan("cpu:ranks=4", "llama-3.2-1b", "ring-attention", batch=1,
                                                  seq_len=4096), tmp_path / "ring.yaml")
    out = run_cli("simulate", str(ring))
    assert out.exit_code == 0 and "merge only" not in out.stdout
    assert json.loads(run_cli("simulate", str(ring), "--json").stdout)["merger_call_us"] is None


def test_a_plan_whose_topology_is_not_found_or_differs_is_told_to_give_topology_not_a_cli_flag(tmp_path):
    topo = resolve("dgx-h100")
    edited = dataclasses.replace(topo, cost=dataclasses.replace(topo.cost, launch_us=topo.cost.launch_us + 1.0))
    plan = treeattn.build_plan(edited, "llama-3.1-8b", "binomial", batch=1, seq_len="64K")
    with pytest.raises(InputError, match=r"another topology of that name, or dgx-h100 changed since\); pass "
                                         r"topology=dgx-h100 to predict on it as it is, or plan again$") as err:
        treeattn.simulate_plan(plan)
    assert "--topology" not in str(err.value)
    assert treeattn.simulate_plan(plan, edited).predicted_us == plan.predicted_us
    topo_file = tmp_path / "box.yaml"
    topo_file.write_text((ROOT / "topologies" / "cpu-4.yaml").read_text())
    (tmp_path / "plans").mkdir()
    saved = treeattn.save_plan(treeattn.build_plan(str(topo_file), "llama-3.2-1b", "binomial", batch=1, seq_len=4096),
                               tmp_path / "plans" / "p.yaml")
    text = treeattn.load_plan(saved.read_text())  # from text: the file's folder is not known
    with pytest.raises(InputError, match=r"; pass topology=FILE\|NAME with that topology$"):
        treeattn.simulate_plan(text)
