"""RCCL's MSCCL all-pairs all-reduce (treeattn.cost.msccl) and where the NCCL model runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from treeattn.cost import msccl, nccl, nccl_env, nccl_fabric, nccl_tuning
from treeattn.topology.library import resolve

XGMI = 64.0 * 0.75  # NCCL's rating of one MI300X xGMI link

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("nbytes", "proto"), [
    (512, None),              # 128 floats: fewer than the file's 256 chunks a loop
    (1024, "LL"), (1536, None), (65536, "LL"),
    (65536 + 1024, None),     # 16,640 floats: the second file wants multiples of 512
    (131072, "LL"), (524287, None),
    (524288, "Simple"), (1 << 24, "Simple"), ((1 << 24) + 2048, None),
])
def test_the_algorithm_files_cover_what_rccl_runs_them_for(nbytes, proto):
    got = msccl.allpairs_allreduce(8, XGMI, nbytes)
    assert (got[0] if got else None) == proto


@pytest.mark.parametrize(("nbytes", "latency", "share"), [
    (1 << 18, 12.0 + 2 * 0.8, 0.5), (1 << 23, 17.0 + 2 * 2.1, msccl.SIMPLE_ACHIEVED)])
def test_two_steps_at_rccls_latency_and_a_share_of_each_link(nbytes, latency, share):
    _, t, lat = msccl.allpairs_allreduce(8, XGMI, nbytes)
    assert lat == pytest.approx(latency)
    assert t == pytest.approx(lat + 2 * nbytes / 8 / (XGMI * share * 1e3))
    assert msccl.allpairs_allreduce(4, XGMI, nbytes) is None
    assert msccl.allpairs_allreduce(8, 0.0, nbytes) is None


def test_rccl_on_eight_mi300x_runs_all_pairs_where_a_file_covers_the_size():
    topo = resolve("mi300x")
    fab = nccl_fabric.fabric(topo)
    assert fab.allpairs_gbps == pytest.approx(XGMI)
    assert nccl.pick(fab, "allreduce", 16384).algorithm is nccl_tuning.Algorithm.ALLPAIRS
    assert nccl.pick(fab, "allreduce", 512).algorithm is nccl_tuning.Algorithm.RING
    assert nccl.pick(fab, "allreduce", 1 << 20).algorithm is nccl_tuning.Algorithm.ALLPAIRS
    assert nccl.pick(fab, "allreduce", 1 << 25).algorithm is not nccl_tuning.Algorithm.ALLPAIRS
    assert nccl.pick(fab, "allgather", 16384).algorithm is not nccl_tuning.Algorithm.ALLPAIRS
    # NCCL_ALGO does not reach MSCCL; RCCL's own switch does.
    assert nccl.pick(fab, "allreduce", 16384, env={"NCCL_ALGO": "Ring"}).algorithm is nccl_tuning.Algorithm.ALLPAIRS
    off = nccl.pick(fab, "allreduce", 16384, env={"RCCL_MSCCL_ENABLE": "0"})
    assert off.algorithm is not nccl_tuning.Algorithm.ALLPAIRS


@pytest.mark.parametrize("spec", ["mi300x:nodes=2", "mi300x-4", "dgx-h100"])
def test_no_all_pairs_off_one_node_of_eight_xgmi_peers(spec):
    fab = nccl_fabric.fabric(resolve(spec))
    assert fab.allpairs_gbps == 0.0
    assert all(e.algorithm is not nccl_tuning.Algorithm.ALLPAIRS for e in nccl.predict(fab, "allreduce", 16384))


def _implied_simple_share(table: str) -> list[float]:
    """Per published row RCCL's Simple file covers: the share of NCCL's xGMI rating one link
    moved, the model's latency taken off."""
    from treeattn.validate.corpus import load_corpus

    (t,) = [t for t in load_corpus() if t.name == table]
    out = []
    for nbytes, us in t.points():
        got = msccl.allpairs_allreduce(8, XGMI, nbytes)
        if got and got[0] == "Simple":
            out.append(2 * nbytes / 8 / ((us - got[2]) * 1e3) / XGMI)
    return out


def test_the_simple_share_is_the_median_the_fitted_table_implies_and_holds_on_the_other():
    import statistics

    fitted = _implied_simple_share("hisohara-ai-scripts-rccl/mi300x-1node")
    assert len(fitted) == 6 and round(statistics.median(fitted), 2) == msccl.SIMPLE_ACHIEVED
    held_out = _implied_simple_share("rocm-blogs-mi300x-rccl-xgmi/1node")
    assert len(held_out) == 6 and abs(statistics.median(held_out) / msccl.SIMPLE_ACHIEVED - 1) < 0.1


def test_rccl_counts_elements_of_the_calls_own_type():
    fab = nccl_fabric.fabric(resolve("mi300x"))
    assert nccl.pick(fab, "allreduce", 512, elem_bytes=2).algorithm is nccl_tuning.Algorithm.ALLPAIRS
    assert nccl.pick(fab, "allreduce", 512).algorithm is nccl_tuning.Algorithm.RING


def test_a_library_collective_passes_its_buffers_element_size():
    from treeattn.plan.ir import element_bytes
    from treeattn.workload import RawPayload, Workload

    w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=64, split=(1,) * 8, partial_dtype="bf16")
    assert element_bytes(w, "lse") == 4 and element_bytes(w, "num") == 2 and element_bytes(w, "q") == 2
    assert element_bytes(RawPayload(nbytes=1024, ranks=8, dtype="fp16"), "partial") == 2


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("00", False),
                                           (" 0 ", False), ("x", False), ("2", True), ("0x1", True),
                                           ("0x0", False)])
def test_rccls_switch_reads_as_an_integer(value, on):
    env = {} if value is None else {"RCCL_MSCCL_ENABLE": value}
    assert ("allpairs" in nccl_env.allowed_by_env(env)[0]) is on
    fab = nccl_fabric.fabric(resolve("mi300x"))
    got = nccl.pick(fab, "allreduce", 1 << 22, env={**env, "NCCL_PROTO": "LL"})
    assert (got.algorithm is nccl_tuning.Algorithm.ALLPAIRS) is on  # NCCL_PROTO does not reach MSCCL


@pytest.mark.parametrize(("per_process", "release", "allpairs"), [
    (1, (2, 20, 5), True),    # one process a rank: MSCCL in every release
    (8, (2, 20, 5), False),   # -g 8 under RCCL 2.20.5 (ROCm 6.2): mscclCommCompatible refuses
    (8, (2, 21, 5), True),    # RCCL 2.21 (ROCm 6.3): RCCL_MSCCL_ENABLE_SINGLE_PROCESS defaults to 1
    (8, None, True),          # release unknown: the 2.21 rules this model follows
])
def test_before_rccl_2_21_msccl_needs_a_process_per_rank(per_process, release, allpairs):
    fab = nccl_fabric.fabric(resolve("mi300x"))
    got = nccl.pick(fab, "allreduce", 1 << 22, ranks_per_process=per_process, rccl_release=release)
    assert (got.algorithm is nccl_tuning.Algorithm.ALLPAIRS) is allpairs
    assert msccl.single_process_blocks(per_process, release) is not allpairs


@pytest.mark.parametrize(("per_process", "release", "value", "allpairs"), [
    (8, (2, 21, 5), "0", False),   # 2.21 with the setting off: refused again
    (8, None, "0", False),
    (1, (2, 21, 5), "0", True),    # a process a rank: the setting does not apply
    (8, (2, 20, 5), "1", False),   # 2.20.5 has no such setting: refused whatever it says
    (8, (2, 21, 5), "1", True),
])
def test_rccl_msccl_enable_single_process_turns_the_rule_off_from_2_21(per_process, release, value, allpairs):
    fab = nccl_fabric.fabric(resolve("mi300x"))
    env = {"RCCL_MSCCL_ENABLE_SINGLE_PROCESS": value}
    got = nccl.pick(fab, "allreduce", 1 << 22, env=env, ranks_per_process=per_process, rccl_release=release)
    assert (got.algorithm is nccl_tuning.Algorithm.ALLPAIRS) is allpairs


def test_check_model_takes_rccl_msccl_enable_single_process():
    # rccl issue 1562's -g 8 log as a user's own, its release not printed (the 2.21 rules apply)
    import json

    from tests.cli_helpers import run_cli

    hows = {}
    for env in ([], ["--env", "RCCL_MSCCL_ENABLE_SINGLE_PROCESS=0"]):
        res = run_cli("check-model", "--no-progress", "--json", "-t", "mi300x", *env,
                      str(ROOT / "results" / "published" / "rccl-issue-1562.txt"))
        assert res.exit_code == 0, res.stderr
        hows[bool(env)] = {r["how"].split("/")[0] for r in json.loads(res.stdout)["rows"]}
    assert "allpairs" in hows[False] and "allpairs" not in hows[True]


def test_rccl_issue_1562s_g8_rows_run_rccls_tuner_not_msccl():
    from treeattn.validate import corpus, published
    table = next(t for t in corpus.load_corpus() if t.name == "rccl-issue-1562/1node")
    rows = {r.nbytes: r for r in published.predict_table(table)}
    assert not any(r.how.startswith("allpairs") for r in rows.values())
    assert rows[1 << 22].how == "ring/LL"  # RCCL 2.20.5 runs LL128 on gfx90a only, not this MI300X's gfx942
