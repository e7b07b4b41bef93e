"""``treeattn check-model`` on a small corpus: figures, JSON, PNG and bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.validate.corpus import corpus_dir


def _small_corpus(tmp: Path) -> Path:
    src = corpus_dir()
    for name in ("rccl-issue-1562", "li-plus-playground-a100-sendrecv"):
        for ext in (".yaml", ".txt"):
            shutil.copy(src / (name + ext), tmp / (name + ext))
    return tmp


def test_json_reports_every_row_and_the_figures(tmp_path):
    res = run_cli("check-model", str(_small_corpus(tmp_path)), "--json", "--png", str(tmp_path / "p.png"))
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    rows = data["rows"]
    assert len(rows) == 25 + 4 and {r["collective"] for r in rows} == {"all_reduce", "sendrecv"}
    assert all(r["how"] == "p2p" for r in rows if r["collective"] == "sendrecv")
    for r in rows:
        assert r["error"] == round(r["predicted_us"] / r["published_us"] - 1, 4) or abs(
            r["error"] - (r["predicted_us"] / r["published_us"] - 1)) < 1e-3
    assert data["summary"]["all"]["rows"] == 29
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_table_output_names_regimes_and_tables(tmp_path):
    res = run_cli("check-model", str(_small_corpus(tmp_path) / "rccl-issue-1562.yaml"))
    assert res.exit_code == 0, res.stderr
    for word in ("<=64KiB", ">=256MiB", "all_reduce", "rccl-issue-1562/1node"):
        assert word in res.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "a-file").write_text("")
    # An unwritable --png is refused before the corpus is predicted, not after a minute's work.
    for args in (["check-model", str(tmp_path / "missing")], ["check-model", str(tmp_path)],
                 ["check-model", "--png", str(tmp_path / "a-file" / "x.png")]):
        res = run_cli(*args)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_png_follows_the_output_file_rule(tmp_path):
    corpus = _small_corpus(tmp_path) / "rccl-issue-1562.yaml"
    (tmp_path / "plots").mkdir()
    res = run_cli("check-model", str(corpus), "--png", str(tmp_path / "plots"), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["png"] == str(tmp_path / "plots" / "check-model.png")
    assert (tmp_path / "plots" / "check-model.png").stat().st_size > 10_000
    res = run_cli("check-model", str(corpus), "--png", str(tmp_path / "new" / "cm"))
    assert res.exit_code == 0, res.stderr
    assert f"wrote {tmp_path / 'new' / 'cm.png'}" in res.stdout and (tmp_path / "new" / "cm.png").exists()


def test_table_versions_in_json_and_a_malformed_one_is_exit_2(tmp_path):
    corpus = _small_corpus(tmp_path)
    res = run_cli("check-model", str(corpus / "rccl-issue-1562.yaml"), "--json")
    assert res.exit_code == 0, res.stderr
    table = json.loads(res.stdout)["tables"]["rccl-issue-1562/1node"]
    assert table["library_version"] == "RCCL 2.20.5"
    mapping = corpus / "rccl-issue-1562.yaml"
    mapping.write_text(mapping.read_text().replace('version: "2.20.5"', 'version: "2.20.x"'))
    res = run_cli("check-model", str(mapping))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "rccl-issue-1562.yaml: library_version: version '2.20.x'" in res.stderr


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests" / "all_reduce_perf.4x8xh100-ib400.txt"


def test_own_log_is_scored_as_the_same_table_in_a_mapping_would_be(tmp_path):
    # A user's log, named so that nothing but its busbw/algbw and NCCL line tell what it is.
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE, log)
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    name = f"{log}/all_reduce"
    table = data["tables"][name]
    assert table["ranks"] == 32 and table["library_version"] == "NCCL 2.26.2"
    assert table["topology"] == "dgx-h100:nodes=4"
    # The same text through a mapping file: the same rows and predictions.
    lines = len(log.read_text().splitlines())
    (tmp_path / "map.yaml").write_text(
        f"source: a test\ntables:\n  - id: t\n    file: run.txt\n    lines: [1, {lines}]\n    collective: all_reduce\n"
        "    topology: dgx-h100:nodes=4\n    ranks: 32\n")
    mapped = run_cli("check-model", str(tmp_path / "map.yaml"), "--json")
    assert mapped.exit_code == 0, mapped.stderr
    ours = [(r["bytes"], r["predicted_us"], r["published_us"]) for r in data["rows"]]
    assert ours == [(r["bytes"], r["predicted_us"], r["published_us"]) for r in json.loads(mapped.stdout)["rows"]]
    assert len(ours) == 32
    text = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4")
    assert text.exit_code == 0 and "all_reduce over 32 ranks on dgx-h100:nodes=4, NCCL 2.26.2 (printed)" in text.stdout
    assert "32 ranks solved from busbw/algbw" in text.stdout
    # A user's log is measured, not published: the table's first line says so.
    assert "error = predicted / measured time - 1" in text.stdout


def test_own_log_env_reaches_the_model(tmp_path):
    log = tmp_path / "all_reduce_perf.txt"
    shutil.copy(FIXTURE, log)
    default = json.loads(run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--json").stdout)["rows"]
    ring = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--env", "NCCL_ALGO=Ring", "--json")
    assert ring.exit_code == 0, ring.stderr
    rows = json.loads(ring.stdout)["rows"]
    assert all(r["how"].startswith("ring/") for r in rows) and rows != default


def test_own_log_env_is_said_not_to_reach_point_to_point_rows(tmp_path):
    # A sendrecv log: li-plus's published table (one process driving 8 GPUs, -g 8) under the
    # header and device lines of the one-node fixture (a run of the same form) set to the sizes
    # of li-plus's command (-b 128M -e 1G), which its README left out, and the closing lines
    # nccl-tests prints.
    corpus = Path(__file__).resolve().parents[2] / "results" / "published"
    head = (FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt").read_text().splitlines()[:12]
    head[0] = head[0].replace("maxBytes 4294967296", "maxBytes 1073741824")
    rows = (corpus / "li-plus-playground-a100-sendrecv.txt").read_text().splitlines()[7:15]
    log = tmp_path / "sendrecv_perf.txt"
    log.write_text("\n".join([*head, *rows, "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 172.031"])
                   + "\n")
    res = run_cli("check-model", str(log), "-t", "dgx-a100", "--env", "NCCL_PROTO=Simple")
    assert res.exit_code == 0, res.stderr
    said = [line for line in res.stdout.splitlines() if "not applied" in line]
    assert len(said) == 1 and said[0].startswith(f"{log}: sendrecv over 8 ranks")
    assert "--env NCCL_PROTO not applied (the point-to-point model reads only NCCL_P2P_DISABLE and " in said[0]
    assert "not applied" not in run_cli("check-model", str(log), "-t", "dgx-a100").stdout
    collective = run_cli("check-model", str(FIXTURE), "-t", "dgx-h100:nodes=4", "--env", "NCCL_PROTO=Simple")
    assert collective.exit_code == 0 and "not applied" not in collective.stdout
    # The P2P settings do reach it: without peer-to-peer, the NVSwitch pairs go through host memory.
    default = json.loads(run_cli("check-model", str(log), "-t", "dgx-a100", "--json").stdout)["rows"]
    off = run_cli("check-model", str(log), "-t", "dgx-a100", "--env", "NCCL_P2P_DISABLE=1")
    assert off.exit_code == 0 and "not applied" not in off.stdout, off.stdout
    # ... and the log's line says which level its rows were predicted at, and what it does
    assert "; P2P level LOC (NCCL_P2P_DISABLE=1): 56 of 56 rank pairs through host memory" in off.stdout
    assert "P2P level" not in run_cli("check-model", str(log), "-t", "dgx-a100").stdout
    rows = json.loads(run_cli("check-model", str(log), "-t", "dgx-a100", "--env", "NCCL_P2P_DISABLE=1",
                              "--json").stdout)["rows"]
    assert all(r["predicted_us"] > 5 * d["predicted_us"] for r, d in zip(rows, default, strict=True))


def test_own_log_names_the_p2p_level_a_pcie_box_is_predicted_at(tmp_path):
    # 8 L40S under 4 PCIe switches on two EPYC sockets: NCCL's default (PXB) connects only the
    # pairs under one switch peer-to-peer; the line names the level, where it comes from and
    # how many pairs go through host memory, so that a setting that changes nothing is seen
    # to be applied.
    box = tmp_path / "l40s8.yaml"
    box.write_text("name: l40s8\nnode:\n  gpus: {count: 8, model: L40S, mem_bw_gbps: 864, mem_gb: 48}\n"
                   "  cpus: {count: 2, model: AMD EPYC 9354, link: {kind: infinity-fabric, bw_gbps: 64}}\n"
                   "  pcie: {generation: 4, width: 16, bw_gbps: 25, switches: 4}\n")
    log = tmp_path / "all_reduce_perf.txt"
    shutil.copy(FIXTURE.parent / "all_reduce_perf.8xh100-S1.txt", log)

    def line(*env: str) -> str:
        res = run_cli("check-model", str(log), "-t", str(box), *(x for e in env for x in ("--env", e)))
        assert res.exit_code == 0, res.stderr
        # the topology's own level (topo show's sentence) is not printed beside the log's
        assert "further apart than NCCL's P2P level" not in res.stdout, res.stdout
        return next(ln for ln in res.stdout.splitlines() if ln.startswith(f"{log}: all_reduce"))

    assert line().endswith("; P2P level PXB (NCCL 2.27.3's default): 48 of 56 rank pairs through host memory")
    assert line("NCCL_P2P_LEVEL=SYS").endswith("; P2P level SYS (NCCL_P2P_LEVEL=SYS): 0 of 56 rank pairs through "
                                                "host memory")
    # the setting that decides is named, not one it overrides or one that sets nothing
    assert line("NCCL_P2P_DISABLE=1", "NCCL_P2P_LEVEL=SYS").endswith(
        "; P2P level LOC (NCCL_P2P_DISABLE=1): 56 of 56 rank pairs through host memory")
    assert line("NCCL_P2P_DISABLE=0", "NCCL_P2P_LEVEL=SYS").endswith(
        "; P2P level SYS (NCCL_P2P_LEVEL=SYS): 0 of 56 rank pairs through host memory")
    box.write_text(box.read_text() + "cost: {p2p_level: PHB}\n")
    assert line().endswith("; P2P level PHB (the topology's cost.p2p_level): 32 of 56 rank pairs through host memory")


def test_own_log_of_gpus_without_peer_to_peer_says_no_level_connects_them(tmp_path):
    # kalavai's 2 x RTX 4090 run (-g 2): GeForce cards have no peer-to-peer, so every pair goes
    # through host memory whatever NCCL_P2P_LEVEL says. The line named the level as if it were
    # the cause ("P2P level SYS (NCCL_P2P_LEVEL=SYS): 2 of 2 rank pairs through host memory").
    corpus = Path(__file__).resolve().parents[2] / "results" / "published"
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text("\n".join((corpus / "kalavai-rtx4090.txt").read_text().splitlines()[15:55]) + "\n")

    def line(*env: str) -> str:
        res = run_cli("check-model", str(log), "-t", "rtx4090:gpus=2", *(x for e in env for x in ("--env", e)))
        assert res.exit_code == 0, res.stderr
        return next(ln for ln in res.stdout.splitlines() if ln.startswith(f"{log}: all_reduce"))

    assert line().endswith("; P2P level PXB (NCCL 2.30.7's default): 2 of 2 rank pairs through host memory "
                           "(GPUs without peer-to-peer, at any level)"), line()
    assert line("NCCL_P2P_LEVEL=SYS").endswith("; P2P level SYS (NCCL_P2P_LEVEL=SYS): 2 of 2 rank pairs through "
                                                "host memory (GPUs without peer-to-peer, at any level)")


def test_own_log_bad_input_is_one_line_and_exit_2(tmp_path):
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE, log)
    own = ["check-model", str(log), "-t", "dgx-h100:nodes=4"]
    for args, said in ((["check-model", str(log)], "needs --topology"),
                       (["check-model", "-t", "dgx-h100"], "--topology applies to nccl-tests logs"),
                       (["check-model", str(tmp_path), "-t", "dgx-h100"],
                        f"{tmp_path}: a folder is read as a corpus, whose .yaml mappings name each table's machine, "
                        f"and it has none; give its logs as files with --topology (e.g. {tmp_path / '*.txt'})"),
                       (["check-model", str(log), "-t", "dgx-h100:nodes=2"], "places 16 ranks but the table ran on 32"),
                       (["check-model", str(log), "-t", "nosuch"], "--topology 'nosuch': "),
                       ([*own, "--env", "ALGO=Ring"], "the model reads only NCCL_ALGO"),
                       ([*own, "--env", "NCCL_MIN_NCHANNELS=32"], "the model reads only NCCL_ALGO"),
                       ([*own, "--env", "NCCL_ALGO=Ring", "--env", "NCCL_ALGO=Tree"], "names NCCL_ALGO twice"),
                       ([*own, "--env", "NCCL_ALGO=Bogus"], "NCCL knows tree, ring, nvls, nvlstree and collnetdirect, "
                        "collnetchain, pat, which the model does not time"),
                       (["check-model", str(log), "-t", "dgx-h100:nodes=0"],
                        "--topology 'dgx-h100:nodes=0': nodes must be"),  # the spec named once
                       (["check-model", str(log), "-t", str(log)], f"--topology {str(log)!r}: an nccl-tests log, not a "
                        "topology: give logs as PATHs, and the machine they ran on here"),
                       (["check-model", str(log), "-t", str(FIXTURE.with_name("run.2x8xh100-I1.json"))],
                        "run.2x8xh100-I1.json': an nccl-tests log, not a topology"),  # -J's file too
                       ([*own, "--env", "NCCL_P2P_LEVEL=NODE"], "--env: NCCL_P2P_LEVEL='NODE': NCCL reads LOC"),
                       ([*own, str(log)], "given twice"),
                       (["check-model", str(tmp_path / "gone.txt"), "-t", "dgx-h100"], "no such file or folder")):
        res = run_cli(*args)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and said in res.stderr, res.stderr


def test_an_integer_setting_nccl_reads_as_0_is_warned_of(tmp_path):
    # NCCL_P2P_DISABLE=x: NCCL reads 0 (strtoll) without a word, and so did check-model: the
    # rows were scored with peer-to-peer on while the user may have meant it off.
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE, log)
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--env", "NCCL_P2P_DISABLE=x")
    assert res.exit_code == 0, res.stderr
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert said == ["warning: --env NCCL_P2P_DISABLE='x' is not a number: NCCL reads it as 0 without a word, and so "
                    "does the model"]
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--env", "NCCL_P2P_DISABLE=0")
    assert res.exit_code == 0 and "warning:" not in res.stderr


def test_own_logs_of_nccl_tests_2_19_options_and_json_are_scored(tmp_path):
    # Written to nccl-tests 2.19.6's formats: -S 1's timestamps, -I 1's per-iteration columns,
    # -J's JSON (two processes of 8 GPUs, each listing its first device), NCCL 2.27.3 printed by both.
    fixtures = FIXTURE.parent
    res = run_cli("check-model", str(fixtures / "run.2x8xh100-I1.json"), "-t", "dgx-h100:nodes=2")
    assert res.exit_code == 0, res.stderr
    assert (f"{fixtures / 'run.2x8xh100-I1.json'}: all_reduce over 16 ranks on dgx-h100:nodes=2, 8 GPUs a process "
            "(-g), NCCL 2.27.3 (printed)") in res.stdout
    texts = [str(fixtures / f"all_reduce_perf.8xh100-{flag}.txt") for flag in ("S1", "I1")]
    res = run_cli("check-model", *texts, "-t", "dgx-h100", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert [data["tables"][f"{t}/all_reduce"]["library_version"] for t in texts] == ["NCCL 2.27.3"] * 2
    by_log = [[(r["bytes"], r["published_us"]) for r in data["rows"] if r["table"].startswith(t)] for t in texts]
    assert by_log[0] == by_log[1] and len(by_log[0]) == 8
    # -C 1's CPU times are not what the model predicts; JSON that is not nccl-tests' is said so.
    foreign = tmp_path / "run.json"
    foreign.write_text("[1, 2, 3]")
    for path, said in ((fixtures / "all_reduce_perf.8xh100-C1.txt", "'cputime' (nccl-tests -C 1)"),
                       (foreign, "JSON, but not nccl-tests' -J output")):
        res = run_cli("check-model", str(path), "-t", "dgx-h100")
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and said in res.stderr, res.stderr


def _voltage_park_all_gather(tmp_path: Path, name: str) -> Path:
    """Voltage Park's all-gather run as its log holds it (results/published): the collective
    named by the line nccl-tests prints, sizes under one element per rank printed as 0."""
    lines = (corpus_dir() / "voltagepark-h100-4node.txt").read_text().splitlines()
    log = tmp_path / name
    log.write_text("\n".join(lines[165:247]) + "\n")
    return log


def test_own_log_with_zero_rows_scores_as_its_corpus_table(tmp_path):
    log = _voltage_park_all_gather(tmp_path, "run.txt")
    assert "       0 " in log.read_text()
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--json")
    assert res.exit_code == 0, res.stderr
    ours = [(r["bytes"], r["predicted_us"]) for r in json.loads(res.stdout)["rows"]]
    mapped = run_cli("check-model", str(corpus_dir() / "voltagepark-h100-4node.yaml"), "--json")
    theirs = [(r["bytes"], r["predicted_us"]) for r in json.loads(mapped.stdout)["rows"]
              if r["table"] == "voltagepark-h100-4node/allgather"]
    assert ours == theirs and len(ours) == 25


def test_own_log_of_an_older_nccl_takes_the_topology_release(tmp_path):
    log = _voltage_park_all_gather(tmp_path, "old.txt")
    log.write_text(log.read_text().replace("NCCL version 2.24.3", "NCCL version 2.18.3"))
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 0, res.stderr
    assert "NCCL 2.18.3: the model follows NCCL 2.19-2.30" in res.stdout and "the topology's release used" in res.stdout
    # A topology that names its release: the JSON reports the one the rows were predicted at.
    from treeattn.topology.io import dump_topology
    from treeattn.topology.library import resolve

    topo = resolve("dgx-h100:nodes=4")
    (tmp_path / "t.yaml").write_text(dump_topology(dataclasses.replace(topo, cost=topo.cost.updated(
        nccl_version="2.21.5"))))
    res = run_cli("check-model", str(log), "-t", str(tmp_path / "t.yaml"), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["tables"][f"{log}/all_gather"]["nccl_release"] == "2.21.5"


def test_own_logs_of_one_name_stay_apart(tmp_path):
    for name in ("run.txt", "run.log"):
        shutil.copy(FIXTURE, tmp_path / name)
    res = run_cli("check-model", str(tmp_path / "run.txt"), str(tmp_path / "run.log"), "-t", "dgx-h100:nodes=4",
                  "--json")
    assert res.exit_code == 0, res.stderr
    assert len(json.loads(res.stdout)["summary"]["tables"]) == 2


def test_own_log_from_other_gpus_than_the_topologys_is_said_so(tmp_path):
    # This fixture's device lines name H100s: scored on an A100 or a CPU topology, as asked, with a note.
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE.with_name("all_reduce_perf.8xh100-1node.txt"), log)
    same = run_cli("check-model", str(log), "-t", "dgx-h100")
    assert same.exit_code == 0 and "the log ran on" not in same.stdout
    other = run_cli("check-model", str(log), "-t", "dgx-a100")
    assert other.exit_code == 0, other.stderr
    said = " ".join(other.stdout.split())  # the line wraps at the console's width
    assert "the log ran on NVIDIA H100 80GB HBM3, not dgx-a100's A100-SXM4-80GB" in said
    hosts = run_cli("check-model", str(log), "-t", "cpu:ranks=8")
    assert hosts.exit_code == 0 and "ranks are no GPUs" in " ".join(hosts.stdout.split()), hosts.stdout


def test_own_logs_json_says_what_the_text_line_says(tmp_path):
    # --json gave the rows and the table's name, but not the line's notes: a script scoring an
    # H100 log on dgx-a100 (or 2 RTX 4090 through host memory, -g 2) was not told.
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE.with_name("all_reduce_perf.8xh100-1node.txt"), log)
    res = run_cli("check-model", str(log), "-t", "dgx-a100", "--json")
    assert res.exit_code == 0, res.stderr
    (table,) = json.loads(res.stdout)["tables"].values()
    assert table["gpus_per_process"] == 8
    assert len(table["notes"]) == 1
    assert table["notes"][0].endswith("; the log ran on NVIDIA H100 80GB HBM3, not dgx-a100's A100-SXM4-80GB")
    off = json.loads(run_cli("check-model", str(log), "-t", "dgx-h100", "--env", "NCCL_P2P_DISABLE=1",
                             "--json").stdout)["tables"]
    assert [t["notes"][-1] for t in off.values()] == [
        "P2P level LOC (NCCL_P2P_DISABLE=1): 56 of 56 rank pairs through host memory"]
    # A corpus table is not the user's log: no notes, even where one of these would apply (the
    # RTX 4090 pairs go through host memory).
    corpus = json.loads(run_cli("check-model", str(corpus_dir() / "kalavai-rtx4090.yaml"), "--json").stdout)["tables"]
    assert len(corpus) == 4 and not any("notes" in t for t in corpus.values())


def test_own_log_on_a_topology_of_another_size_says_how_to_select_ranks(tmp_path):
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE.with_name("all_reduce_perf.8xh100-1node.txt"), log)
    more = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2")
    assert more.exit_code == 2 and "(e.g. 'dgx-h100:nodes=2[ranks 0-7]', as the log places them on hosts)" in (
        more.stderr), more.stderr
    picked = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2[ranks 0-7]")
    assert picked.exit_code == 0, picked.stderr
    fewer = run_cli("check-model", str(log), "-t", "cpu:ranks=4")
    assert fewer.exit_code == 2 and "use a topology of that size" in fewer.stderr, fewer.stderr


def test_a_selection_of_ranks_is_suggested_as_the_logs_hosts_hold_them(tmp_path):
    # xxrjun's sendrecv of one GPU on each of two hosts (results/published): ranks 0-1 of a
    # 2 x 8 H100 topology are one node's, and scored there it was -88 %; the log's hosts say 0,8.
    from treeattn.validate.corpus import corpus_dir

    lines = (corpus_dir() / "xxrjun-nccl-tests-cluster.txt").read_text().splitlines()[711:728]
    log = tmp_path / "sendrecv_perf.txt"
    log.write_text("\n".join(lines) + "\n")
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2")
    assert res.exit_code == 2 and "(e.g. 'dgx-h100:nodes=2[ranks 0,8]', as the log places them on hosts)" in (
        res.stderr), res.stderr
    assert run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2[ranks 0,8]").exit_code == 0
    # a spec that selects already is told to select fewer: its ranks are not the family's
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2[ranks 0-3,8-11]")
    assert res.exit_code == 2 and "select 2 of its ranks in its '[ranks ...]'" in res.stderr, res.stderr
    # calibrate names the topology as it was given, not by the name inside its file
    from treeattn.topology.io import dump_topology
    from treeattn.topology.library import resolve

    own = tmp_path / "mine.yaml"
    own.write_text(dump_topology(resolve("dgx-h100:nodes=2")))
    res = run_cli("calibrate", "--from-nccl-tests", str(log), "-t", str(own))
    assert res.exit_code == 2 and f"(e.g. '{own}[ranks 0,8]')" in res.stderr, res.stderr


def test_a_recorded_per_function_algorithm_list_is_read_for_the_logs_test(tmp_path):
    # NCCL 2.24+ prints NCCL_ALGO as set: "allreduce:tree;ring" (tuning.cc parseList syntax)
    lines = FIXTURE.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "nThread" in ln) + 1
    for value, said in (("allreduce:tree;ring", "read for allreduce as tree"),
                        ("broadcast:ring", "read for allreduce as no restriction")):
        log = tmp_path / "all_reduce_perf.txt"
        log.write_text("\n".join(lines[:at] + [f"n1:1:1 [0] NCCL INFO NCCL_ALGO set by environment to {value}"]
                                 + lines[at:]) + "\n")
        res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--no-progress")
        assert res.exit_code == 0 and f"NCCL_ALGO={value} {said}" in " ".join(res.stdout.split()), res.stdout
    # a P2P level NCCL read says NCCL_P2P_DISABLE was not 1: --env cannot say it was
    log.write_text("\n".join(lines[:at] + ["n1:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to NVL"]
                             + lines[at:]) + "\n")
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--env", "NCCL_P2P_DISABLE=1")
    assert res.exit_code == 2 and "which NCCL reads only where NCCL_P2P_DISABLE is not 1" in res.stderr, res.stderr


@pytest.mark.parametrize(("model", "device", "other"), [
    ("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", False), ("B200-GB200", "NVIDIA GB200", False),
    ("MI300X", "AMD Instinct MI300X", False), ("RTX-4090", "NVIDIA GeForce RTX 4090", False),
    ("A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", False), ("unknown-gpu", "NVIDIA H100 80GB HBM3", False),
    ("H20", "NVIDIA H200", True), ("A10", "NVIDIA A100-SXM4-40GB", True), ("H200-SXM-141GB", "NVIDIA H100", True),
    # a hand-written model spelled with spaces or run together; a name without a product number says nothing
    ("H100 SXM", "NVIDIA H100 80GB HBM3", False), ("RTX4090", "NVIDIA GeForce RTX 4090", False),
    ("GeForce RTX 4090", "NVIDIA GeForce RTX 4090", False), ("B200-GB200", "NVIDIA Graphics Device", False),
    ("RTX4090", "NVIDIA GeForce RTX 3090", True), ("H100 SXM", "NVIDIA A100-SXM4-40GB", True),
])
def test_a_logs_devices_are_told_from_the_topologys_gpus_by_whole_product_numbers(model, device, other):
    from types import SimpleNamespace

    from treeattn.calibrate.log_machine import other_devices
    from treeattn.calibrate.nccl_tests import NcclDevice
    from treeattn.topology.model import Device, DeviceKind

    gpu = Device("g", DeviceKind.GPU, model=model, mem_bw_gbps=1.0, mem_gb=1.0)
    topo = SimpleNamespace(name="t", num_ranks=1, rank_device=lambda r: gpu)
    log = SimpleNamespace(devices=[NcclDevice(0, "host", 0, "0x1", device)], rccl=False)
    assert bool(other_devices(log, topo)) == other


def test_own_rccl_log_is_not_taken_for_an_nccl_release(tmp_path):
    # RCCL numbers its releases as NCCL does, but NCCL's release-dependent figures are not RCCL's:
    # a log that prints "RCCL version 2.22.3" is RCCL 2.22.3, predicted at the topology's release.
    text = (corpus_dir() / "rocm-blogs-mi300x-rccl-xgmi.txt").read_text().splitlines()[:58]
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text("\n".join(text) + "\n")
    assert "RCCL version : 2.22.3" in log.read_text()
    res = run_cli("check-model", str(log), "-t", "mi300x", "--json")
    assert res.exit_code == 0, res.stderr
    table = json.loads(res.stdout)["tables"][f"{log}/all_reduce"]
    assert table["library_version"] == "RCCL 2.22.3"
    mapped = run_cli("check-model", str(corpus_dir() / "rocm-blogs-mi300x-rccl-xgmi.yaml"), "--json")
    corpus_table = json.loads(mapped.stdout)["tables"]["rocm-blogs-mi300x-rccl-xgmi/1node"]
    assert table["nccl_release"] == corpus_table["nccl_release"]
    # The text names the library the log printed.
    res = run_cli("check-model", str(log), "-t", "mi300x", "--no-progress")
    assert res.exit_code == 0 and "RCCL 2.22.3 (printed)" in res.stdout and "NCCL 2.22.3" not in res.stdout


def test_own_rccl_log_without_its_release_says_which_rccl_it_is_timed_as(tmp_path):
    # rccl issue 1562's table prints no release (the issue says 2.20.5, which the corpus maps):
    # one process drives 8 GPUs, where MSCCL runs from RCCL 2.21 only; the line says how to
    # time an older one, and --env's setting gives the corpus's figures.
    import yaml

    mapping = yaml.safe_load((corpus_dir() / "rccl-issue-1562.yaml").read_text())
    first, last = mapping["tables"][0]["lines"]
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text("\n".join((corpus_dir() / "rccl-issue-1562.txt").read_text().splitlines()[first - 1:last]) + "\n")
    res = run_cli("check-model", str(log), "-t", "mi300x", "--no-progress")
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "RCCL, its release not printed (NCCL 2.30.7's figures, RCCL 2.21's MSCCL" in text
    assert "--nccl-version gives the run's RCCL release" in text
    corpus = run_cli("check-model", str(corpus_dir() / "rccl-issue-1562.yaml"), "--json")
    for flags in (("--nccl-version", "2.20.5"), ("--env", "RCCL_MSCCL_ENABLE_SINGLE_PROCESS=0")):
        older = run_cli("check-model", str(log), "-t", "mi300x", *flags, "--json")
        assert ([r["predicted_us"] for r in json.loads(older.stdout)["rows"]]
                == [r["predicted_us"] for r in json.loads(corpus.stdout)["rows"]]), flags


def test_own_rccl_log_of_doubles_is_covered_by_msccl_by_its_element_count(tmp_path):
    # RCCL's MSCCL all-pairs files cover element counts: 1 KiB is 256 floats (all-pairs) but
    # 128 doubles, which no file covers (RCCL's ring).
    text = (corpus_dir() / "rocm-blogs-mi300x-rccl-xgmi.txt").read_text().splitlines()[:58]
    floats = tmp_path / "floats.txt"
    floats.write_text("\n".join(text) + "\n")
    doubles = tmp_path / "doubles.txt"
    rows = []
    for line in text:
        parts = line.split()
        if len(parts) > 4 and parts[2] == "float" and parts[0].isdigit():
            line = line.replace(f" {parts[1]} ", f" {int(parts[0]) // 8} ", 1).replace(" float ", " double ", 1)
        rows.append(line)
    doubles.write_text("\n".join(rows) + "\n")
    how = {}
    for log in (floats, doubles):
        res = run_cli("check-model", str(log), "-t", "mi300x", "--json")
        assert res.exit_code == 0, res.stderr
        how[log.stem] = {r["bytes"]: r["how"].split("+")[0] for r in json.loads(res.stdout)["rows"]}
    assert how["floats"][1024] == "allpairs/LL" and how["doubles"][1024] == "ring/LL"
    assert how["floats"][4096] == how["doubles"][4096] == "allpairs/LL"


def test_a_topology_file_given_as_a_table_mapping_is_named_as_one():
    from treeattn.topology.library import shipped_files

    topo = str(shipped_files()["dgx-h100"])
    for args in ((topo,), (topo, "-t", "dgx-h100")):
        res = run_cli("check-model", *args)
        assert res.exit_code == 2 and "a topology file, not a table mapping" in res.stderr, res.stderr
        assert "--topology FILE" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_own_log_on_another_layout_of_hosts_is_said(tmp_path):
    # One host's 8 ranks read onto two nodes of 4: scored as asked, and the line says so
    # (calibrate refuses the same mismatch: its rates would be written into the wrong links).
    log = tmp_path / "all_reduce_perf.txt"
    shutil.copy(FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt", log)
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2[ranks 0-3,8-11]")
    assert res.exit_code == 0, res.stderr
    assert ("the log ran its 8 ranks on 1 host(s) (node005), but 'dgx-h100:nodes=2[ranks 0-3,8-11]' places ranks "
            "0-7 on 2 node(s)") in res.stdout
    same = run_cli("check-model", str(log), "-t", "dgx-h100")
    assert "host(s)" not in same.stdout
    # Two hosts dealt round-robin (mpirun --map-by node): the line names the selection that
    # places the ranks as the log does (a selection renumbers its ranks in the order it lists).
    lines = log.read_text().splitlines()
    log.write_text("\n".join(ln.replace("on    node005 ", f"on {'ab'[int(ln.split()[2]) % 2]:>10} ")
                             if ln.startswith("#  Rank") else ln for ln in lines) + "\n")
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2")
    assert res.exit_code == 2 and "(e.g. 'dgx-h100:nodes=2[ranks 0,8,1,9,2,10,3,11]', as the log places them on " \
        "hosts)" in res.stderr
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2[ranks 0-3,8-11]")
    assert res.exit_code == 0 and "the log ran ranks 0 and 1 on different hosts" in res.stdout
    # Two hosts of four onto one node of eight: the family on two nodes, as the log places them.
    block = tmp_path / "block.txt"
    block.write_text("\n".join(ln.replace("on    node005 ", f"on {'ab'[int(ln.split()[2]) // 4]:>10} ")
                               if ln.startswith("#  Rank") else ln.replace("nGpus 8", "nGpus 4")
                               for ln in lines) + "\n")
    res = run_cli("check-model", str(block), "-t", "dgx-h100")
    assert res.exit_code == 0, res.stderr
    assert "(-t 'dgx-h100:nodes=2[ranks 0-3,8-11]' places them as the log does)" in res.stdout
    # Three hosts onto two nodes: the family on three nodes places them; a file of its own, not a
    # family, has no selection that does, and none is offered.
    three = tmp_path / "three.txt"
    three.write_text("\n".join(ln.replace("on          a ", "on          c ") if ln.startswith("#  Rank  6")
                               or ln.startswith("#  Rank  7") else ln for ln in log.read_text().splitlines()) + "\n")
    res = run_cli("check-model", str(three), "-t", "dgx-h100:nodes=2")
    assert res.exit_code == 2 and "(e.g. 'dgx-h100:nodes=3[ranks 0,8,1,9,2,10,16,11]'" in res.stderr
    # On a machine of its size, the line names the selection that deals them as the log does.
    four = tmp_path / "h100-4x2.yaml"
    four.write_text("name: h100-4x2\nnodes: 2\nnode:\n  gpus: {count: 4, model: H100-SXM5-80GB, mem_bw_gbps: 3350}\n"
                    "  pcie: {generation: 5, bw_gbps: 55}\n  fabric: {kind: nvswitch, bw_gbps: 450}\n"
                    "  nics: {count: 4, bw_gbps: 50}\nnetwork: {kind: infiniband, topology: rail-optimized}\n")
    res = run_cli("check-model", str(log), "-t", str(four))
    assert res.exit_code == 0, res.stderr
    assert f"places them on one node (-t '{four}[ranks 0,4,1,5,2,6,3,7]' places them as the log does)" in res.stdout
    assert run_cli("check-model", str(log), "-t", f"{four}[ranks 0,4,1,5,2,6,3,7]").exit_code == 0
    res = run_cli("check-model", str(three), "-t", str(four))  # a file, not a family: no selection places them
    assert res.exit_code == 0 and "on 3 host(s)" in res.stdout and "[ranks" not in res.stdout.splitlines()[1]
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2[ranks 0,8,1,9,2,10,3,11]")
    assert res.exit_code == 0 and "different hosts" not in res.stdout
    # every table scored: the per-table heading marks nothing
    assert "By table" in same.stdout and "not scored: marked" not in same.stdout


def test_own_log_on_a_calibrated_topology_counts_the_pairs_nccls_level_sends_through_host_memory(tmp_path):
    # A topology calibrated from a log keeps its measured rates where it names no shared-memory
    # rate: the pairs NCCL_P2P_DISABLE=1 sends through host memory are timed at them. The line
    # said "0 of 56 rank pairs through host memory" at level LOC; it counts them and says so.
    log = FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt"
    cal = tmp_path / "cal.yaml"
    res = run_cli("calibrate", "-t", "dgx-h100", "--from-nccl-tests", str(log), "-o", str(cal))
    assert res.exit_code == 0, res.stderr
    res = run_cli("check-model", str(log), "-t", str(cal), "--env", "NCCL_P2P_DISABLE=1")
    assert res.exit_code == 0, res.stderr
    assert ("; P2P level LOC (NCCL_P2P_DISABLE=1): 56 of 56 rank pairs through host memory (timed at the "
            "calibrated links' rates: the topology names no cost.shm_gbps)") in res.stdout, res.stdout


def test_env_help_names_every_setting_the_model_reads(monkeypatch):
    # The help is written out (it is read before the model's modules are imported): it must
    # name what --env accepts, no more and no fewer.
    from treeattn import cli
    from treeattn.cost.nccl_env import ENV_SETTINGS

    # named in the command's text, where a terminal of 80 columns shows each whole
    text = cli.built_command().commands["check-model"].help
    named = {w.strip(",.():") for w in text.split("--env", 1)[1].split() if w.strip(",.():").isupper() and "_" in w}
    assert named == set(ENV_SETTINGS), named
    monkeypatch.setenv("COLUMNS", "80")
    res = run_cli("check-model", "--help")
    assert "RCCL_MSCCL_ENABLE_SINGLE_PROCESS" in res.stdout and "…" not in res.stdout, res.stdout


def test_own_log_timings_nccl_tests_found_wrong_are_left_out_and_said(tmp_path):
    text = (FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt").read_text()
    # 256 MiB: both timings with wrong elements; 512 MiB: the out-of-place one only.
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("268435456 "):
            lines[i] = line.replace("412.35      0", "412.35     12").replace("413.97      0", "413.97     12")
        if line.lstrip().startswith("536870912 "):
            lines[i] = line.replace("431.81      0", "431.81      3")
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text("".join(lines))
    res = run_cli("check-model", str(log), "-t", "dgx-h100", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    rows = {r["bytes"]: r["published_us"] for r in data["rows"]}
    assert 268435456 not in rows and rows[536870912] == 2181.4  # the in-place timing, checked clean
    assert data["tables"][f"{log}/all_reduce"]["notes"] == [
        "timings with validation errors (#wrong > 0) left out at sizes 268435456, 536870912 B"]
    said = run_cli("check-model", str(log), "-t", "dgx-h100")
    assert "left out at sizes 268435456, 536870912 B" in said.stdout
    # A trailer that says the check failed, over rows that count no wrong element, is said too.
    log.write_text(text.replace("Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED"))
    res = run_cli("check-model", str(log), "-t", "dgx-h100", "--json")
    assert json.loads(res.stdout)["tables"][f"{log}/all_reduce"]["notes"] == [
        "the log's check failed ('Out of bounds values : 3 FAILED') though no row counts wrong elements: its "
        "timings are scored as they stand"]


def test_own_log_of_a_reduction_nvlink_sharp_cannot_run_is_predicted_without_it(tmp_path):
    text = (FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt").read_text()
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text(text)
    summed = json.loads(run_cli("check-model", str(log), "-t", "dgx-h100", "--json").stdout)["rows"]
    assert all(r["how"].startswith("nvls/") for r in summed)
    # nccl-tests -o max on float: NCCL runs a ring (ncclNvlsSupported: fp32 by sum only).
    log.write_text(text.replace("float     sum", "float     max"))
    res = run_cli("check-model", str(log), "-t", "dgx-h100", "--json")
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == len(summed) and not any(r["how"].startswith("nvls") for r in rows)


def test_own_json_log_is_predicted_with_the_environment_it_records(tmp_path):
    # nccl-tests' -J file records the process environment: its NCCL settings reach the model.
    data = json.loads((FIXTURE.parent / "run.2x8xh100-I1.json").read_text())
    default = run_cli("check-model", str(FIXTURE.parent / "run.2x8xh100-I1.json"), "-t", "dgx-h100:nodes=2", "--json")
    assert not all(r["how"].startswith("ring/") for r in json.loads(default.stdout)["rows"])
    data["env"] = [*data["env"], "NCCL_ALGO=Ring"]
    log = tmp_path / "run.json"
    log.write_text(json.dumps(data))
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert all(r["how"].startswith("ring/") for r in out["rows"])
    table = out["tables"][f"{log}/all_reduce"]
    assert table["env"] == {"NCCL_ALGO": "Ring"}
    assert "NCCL_ALGO=Ring from the environment the file records" in table["notes"]
    # --env saying otherwise is refused; saying the same is fine.
    clash = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2", "--env", "NCCL_ALGO=Tree")
    assert clash.exit_code == 2 and clash.stderr.count("\n") == 1
    assert (f"error: {log}: the run's environment, as the file records it, has NCCL_ALGO=Ring, but --env gives "
            "NCCL_ALGO=Tree; leave --env NCCL_ALGO out") in clash.stderr
    assert run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2", "--env", "NCCL_ALGO=Ring").exit_code == 0
    data["env"] = [*data["env"][:-1], "NCCL_ALGO=Rign"]
    log.write_text(json.dumps(data))
    bad = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2")
    assert bad.exit_code == 2
    assert f"error: {log}: the run's environment, as the file records it: NCCL_ALGO=" in bad.stderr


def _map_one(tmp: Path, log: Path, collective: str, extra: str = "") -> Path:
    lines = len(log.read_text().splitlines())
    mapping = tmp / "map.yaml"
    mapping.write_text(f"source: a test\ntables:\n  - id: t\n    file: {log.name}\n    lines: [1, {lines}]\n"
                       f"    collective: {collective}\n    topology: dgx-h100\n    ranks: 8\n{extra}")
    return mapping


def test_a_mapping_is_read_as_the_log_it_maps_is(tmp_path):
    # nccl-tests 2.19's own lines name the test and the library: a mapping of those lines reads
    # them as the log does (collective checked, release from nccl-library=).
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE.parent / "all_reduce_perf.8xh100-S1.txt", log)
    as_log = json.loads(run_cli("check-model", str(log), "-t", "dgx-h100", "--json").stdout)
    res = run_cli("check-model", str(_map_one(tmp_path, log, "all_reduce")), "--json")
    assert res.exit_code == 0, res.stderr
    mapped = json.loads(res.stdout)
    release = as_log["tables"][f"{log}/all_reduce"]["nccl_release"]
    assert mapped["tables"]["map/t"]["nccl_release"] == release == "2.27.3"
    assert [r["predicted_us"] for r in mapped["rows"]] == [r["predicted_us"] for r in as_log["rows"]]
    # busbw/algbw cannot tell an all-gather from a reduce-scatter; the test's own line can.
    text = log.read_text().replace("all_reduce_perf", "all_gather_perf")
    log.write_text(text.replace(" sum ", " none "))
    other = run_cli("check-model", str(_map_one(tmp_path, log, "reduce_scatter")))
    assert other.exit_code == 2
    assert other.stderr == (f"error: {tmp_path / 'map.yaml'}: table 't': run.txt:4: the run names its test "
                            "all_gather_perf, not reduce_scatter\n")


def test_a_mappings_bad_environment_or_lines_name_the_mapping_and_table(tmp_path):
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE.parent / "all_reduce_perf.8xh100-S1.txt", log)
    res = run_cli("check-model", str(_map_one(tmp_path, log, "all_reduce", "    env: {NCCL_ALGO: Rign}\n")))
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {tmp_path / 'map.yaml'}: table 't': env: NCCL_ALGO='Rign': unknown 'rign'")
    mapping = _map_one(tmp_path, log, "all_reduce")
    mapping.write_text(mapping.read_text().replace("lines: [1, 33]", "lines: [1, 900]"))
    res = run_cli("check-model", str(mapping))
    assert res.exit_code == 2
    assert res.stderr == (f"error: {mapping}: table 't': run.txt: lines 1-900 are not inside the text (33 lines)\n")
    mapping.write_text(mapping.read_text().replace("lines: [1, 900]", "lines: [1, 33]").replace(
        "topology: dgx-h100", "topology: dgx-h100[ranks 0-15]"))
    res = run_cli("check-model", str(mapping))
    assert res.exit_code == 2 and res.stderr.startswith("error: map/t: topology 'dgx-h100[ranks 0-15]': ")


def test_an_own_logs_error_names_it_by_the_path_given(tmp_path):
    # Runs of two nodes in two folders may share a file name: the error names the folder too.
    (tmp_path / "node2").mkdir()
    log = tmp_path / "node2" / "broadcast_perf.txt"
    shutil.copy(FIXTURE, log)  # an all-reduce, named as a broadcast
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {log}: "), res.stderr


def test_own_log_of_an_nccl_newer_than_the_model_follows_says_whose_figures_time_it(tmp_path):
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text(FIXTURE.read_text().replace("NCCL version 2.26.2", "NCCL version 2.31.1"))
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--json")
    assert res.exit_code == 0, res.stderr
    notes = json.loads(res.stdout)["tables"][f"{log}/all_reduce"]["notes"]
    assert notes[0].endswith("; NCCL 2.31.1 is newer than the releases the model follows (2.19-2.30.7): timed by "
                             "2.30.7's figures")


def test_a_recorded_environment_is_read_as_nccl_reads_it(tmp_path):
    data = json.loads((FIXTURE.parent / "run.2x8xh100-I1.json").read_text())
    log = tmp_path / "run.json"

    def check(env: list[str], *flags: str):  # noqa: ANN202 - a CliResult
        log.write_text(json.dumps({**data, "env": [*data["env"], *env]}))
        return run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2", "--json", *flags)

    # An empty value is unset to NCCL (parseList of "" enables every algorithm).
    res = check(["NCCL_ALGO="])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["tables"][f"{log}/all_reduce"]["env"] == {}
    # NCCL reads algorithm names in any case: the same setting given again is no clash.
    assert check(["NCCL_ALGO=ring"], "--env", "NCCL_ALGO=Ring").exit_code == 0
    # An integer NCCL reads as its leading number is said, as --env says it.
    notes = json.loads(check(["NCCL_NVLS_ENABLE=true"]).stdout)["tables"][f"{log}/all_reduce"]["notes"]
    assert any("NCCL_NVLS_ENABLE='true'" in n and n.endswith("(recorded in the file)") for n in notes), notes


def test_a_recorded_setting_the_point_to_point_model_does_not_read_is_not_taken(tmp_path):
    data = json.loads((FIXTURE.parent / "run.2x8xh100-I1.json").read_text())
    data["args"] = ["./build/sendrecv_perf", *data["args"][1:]]
    # A sendrecv's bus bandwidth is its algorithm bandwidth; the average follows the rows.
    sides = ("out_of_place", "in_place")
    data["results"] = [{**r, **{k: {**r[k], "bus_bw": r[k]["alg_bw"]} for k in sides}} for r in data["results"]]
    data["average_bus_bandwidth"]["bandwidth"] *= 8 / 15
    log = tmp_path / "run.json"
    log.write_text(json.dumps({**data, "env": [*data["env"], "NCCL_ALGO=Ring", "NCCL_P2P_LEVEL=NVL"]}))
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=2", "--json", "--env", "NCCL_ALGO=Tree")
    assert res.exit_code == 0, res.stderr
    table = json.loads(res.stdout)["tables"][f"{log}/sendrecv"]
    assert table["env"] == {"NCCL_ALGO": "Tree", "NCCL_P2P_LEVEL": "NVL"}
    assert table["notes"][0] == "NCCL_P2P_LEVEL=NVL from the environment the file records"
    assert any(n.startswith("--env NCCL_ALGO not applied") for n in table["notes"])


def test_a_corpus_tables_wrong_timings_are_left_out_and_warned_of(tmp_path):
    text = (FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt").read_text()
    log = tmp_path / "run.txt"
    log.write_text(text.replace("412.35      0", "412.35      7").replace("413.97      0", "413.97      7"))
    res = run_cli("check-model", str(_map_one(tmp_path, log, "all_reduce")), "--json")
    assert res.exit_code == 0, res.stderr
    assert 268435456 not in {r["bytes"] for r in json.loads(res.stdout)["rows"]}
    assert res.stderr == ("warning: map/t: timings with validation errors (#wrong > 0) left out at sizes "
                          "268435456 B\n")


def test_own_log_without_its_release_takes_the_one_given_with_nccl_version(tmp_path):
    # The tinybox's six RTX 4090s with tinygrad's P2P driver (results/published, its README's
    # run, NCCL before 2.22): at the topology's release (2.30.7) NCCL's default P2P level on an
    # AMD host puts every pair through host memory, which that run did not; the log prints no
    # release, and --nccl-version gives it.
    text = (corpus_dir() / "tinygrad-p2p-readme-tinybox.txt").read_text().splitlines()[:18]
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text("\n".join(text) + "\n")

    def run(*extra: str) -> tuple[str, float]:
        res = run_cli("check-model", str(log), "-t", "tinybox-green", "--json", *extra)
        assert res.exit_code == 0, res.stderr
        got = json.loads(res.stdout)
        return got["tables"][f"{log}/all_reduce"]["nccl_release"], got["rows"][0]["error"]

    release, error = run()
    assert release == "2.30.7" and error > 5  # +813 %
    release, error = run("--nccl-version", "<2.22")
    assert release == "2.21.x" and abs(error) < 0.1  # +5.4 %, as the corpus's table scores
    res = run_cli("check-model", str(log), "-t", "tinybox-green", "--nccl-version", "<2.22")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(f"{log}: all_reduce"))
    assert "NCCL <2.22 (--nccl-version)" in line and "P2P level" not in line
    res = run_cli("check-model", str(log), "-t", "tinybox-green")
    assert "NCCL's release not printed: the topology's (2.30.7); --nccl-version gives the run's" in res.stdout


def test_nccl_version_is_checked_against_what_a_log_prints(tmp_path):
    log = _voltage_park_all_gather(tmp_path, "printed.txt")  # prints NCCL 2.24.3
    for given, ok in (("2.24.3", True), ("2.24", True), ("<2.25", True), ("2.24.2", False), ("<2.24", False)):
        res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--nccl-version", given)
        if ok:
            assert res.exit_code == 0 and "NCCL 2.24.3 (printed)" in res.stdout, (given, res.stderr)
        else:
            said = f"error: --nccl-version {given}: {log} prints NCCL 2.24.3"
            assert res.exit_code == 2 and res.stderr.strip() == said
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--nccl-version", "2.3O")
    assert res.exit_code == 2 and res.stderr.startswith("error: --nccl-version: version '2.3O': write a release")
    res = run_cli("check-model", "--nccl-version", "2.24.3")  # the corpus's tables name their own
    assert res.exit_code == 2 and "--nccl-version applies to nccl-tests logs" in res.stderr


def _as_if_on(ranks: int, path: Path, largest: int = 1 << 40) -> Path:
    """The 4-node fixture (no '#  Rank' lines) with busbw as ``ranks`` ranks' all-reduce gives
    it, its sizes up to ``largest``."""
    out, bus = [], []
    for line in FIXTURE.read_text().splitlines():
        f = line.split()
        if line.startswith("# nThread"):
            line = line.replace(f"maxBytes {f[8]}", f"maxBytes {min(int(f[8]), largest)}")
        if not line.startswith("#") and len(f) == 13 and f[0].isdigit() and int(f[0]) > largest:
            continue
        if not line.startswith("#") and len(f) == 13 and f[0].isdigit():
            for at in (6, 10):
                f[at + 1] = f"{float(f[at]) * 2 * (ranks - 1) / ranks:.2f}"
                bus.append(float(f[at + 1]))
            line = " ".join(f)
        elif line.startswith("# Avg bus bandwidth"):
            line = f"# Avg bus bandwidth    : {sum(bus) / len(bus):.4f}"
        out.append(line)
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_large_runs_rank_count_is_the_topologys_where_busbw_over_algbw_allows_both(tmp_path):
    # Printed to two decimals, busbw/algbw of 256 ranks (1.9922) reads as 255 as well: the
    # topology's count is taken where the digits allow it, and said; elsewhere the solved one.
    log = _as_if_on(256, tmp_path / "all_reduce_perf.txt")
    res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=32", "--json")
    assert res.exit_code == 0, res.stderr
    table = json.loads(res.stdout)["tables"][f"{log}/all_reduce"]
    assert table["ranks"] == 256
    assert any("256 ranks, the topology's: busbw/algbw = 1.9922, to the digits the log prints, allows 253-257" in n
               for n in table["notes"])
    from treeattn.calibrate.nccl_tests import calibrate_from_log, read_nccl_tests

    assert calibrate_from_log(read_nccl_tests(log), likely=256).ranks == 256
    assert calibrate_from_log(read_nccl_tests(log)).ranks == 255  # no machine to go by: the solved count
    # a count the digits do not allow is not taken: 32 ranks' log read onto 256 ranks
    res = run_cli("check-model", str(FIXTURE), "-t", "dgx-h100:nodes=32")
    assert res.exit_code == 2 and "the table ran on 32" in res.stderr
    # a log of small sizes tells little (up to 64 KiB: 0.0x-2 GB/s): the machine named decides,
    # and the line says how little the figures tell
    small = _as_if_on(256, tmp_path / "small.txt", largest=1 << 16)
    res = run_cli("check-model", str(small), "-t", "dgx-h100:nodes=32")
    assert res.exit_code == 0 and "256 ranks, the topology's" in res.stdout and "a run on fewer ranks" in res.stdout


def test_a_header_of_graphs_or_grouped_launches_is_said_and_a_header_of_too_many_gpus_refused(tmp_path):
    text = FIXTURE.read_text()
    assert "agg iters: 1 " in text and "graph: 0" in text
    graph = tmp_path / "graph.txt"
    graph.write_text(text.replace("graph: 0", "graph: 1"))
    res = run_cli("check-model", str(graph), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 0, res.stderr
    assert "its calls ran as CUDA graphs (graph: 1, nccl-tests -G), which the model does not time" in res.stdout
    # calibrate says so where it writes the log's latency: Together's one-node ring (lines 2-54)
    # does; the 4-node log's network latency is not written (below the overhead)
    ring = (corpus_dir() / "together-h100-1node.txt").read_text().splitlines()[1:54]
    agg = tmp_path / "agg.txt"
    for log, said in ((ring, True), (text.splitlines(), False)):
        agg.write_text("\n".join(log).replace("agg iters: 1 ", "agg iters: 8 ") + "\n")
        res = run_cli("calibrate", "--from-nccl-tests", str(agg), "-t", "dgx-h100" if said else "dgx-h100:nodes=4",
                      "-o", str(tmp_path / "c.yaml"))
        assert res.exit_code == 0, res.stderr
        assert ("8 calls a launch (agg iters: 8, nccl-tests -a): the latency fitted is theirs" in res.stderr) == said
    many = tmp_path / "many.txt"
    many.write_text(text.replace("nGpus 1 ", "nGpus 64 "))
    for cmd in (["check-model", str(many)], ["calibrate", "--from-nccl-tests", str(many)]):
        res = run_cli(*cmd, "-t", "dgx-h100:nodes=4")
        assert res.exit_code == 2 and res.stderr.strip() == (
            f"error: {many}: the header's nThread 1 x nGpus 64 = 64 ranks a process, but the run has 32 ranks: the "
            "header is damaged or another run's"), res.stderr


def test_small_things_a_trial_met_with_own_logs(tmp_path):
    text = FIXTURE.read_text()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = run_cli("check-model", str(empty), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 2 and res.stderr.strip() == f"error: {empty}: the file is empty"
    # a text log named .json is read as text; one named .yaml is said to be a log
    named = tmp_path / "run.json"
    named.write_text(text)
    assert run_cli("check-model", str(named), "-t", "dgx-h100:nodes=4").exit_code == 0
    named = tmp_path / "run.yaml"
    named.write_text(text)
    res = run_cli("check-model", str(named), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 2 and "an nccl-tests log named .yaml" in res.stderr
    # NCCL's version line where some harnesses print it: before nccl-tests' header, after its trailer
    plain = text.replace("NCCL version 2.26.2+cuda12.8\n", "")
    assert "NCCL version" not in plain
    for where in ("NCCL version 2.21.5+cuda12.4\n" + plain, plain + "NCCL version 2.21.5+cuda12.4\n"):
        log = tmp_path / "v.txt"
        log.write_text(where)
        res = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4")
        assert res.exit_code == 0 and "NCCL 2.21.5 (printed)" in res.stdout, res.stdout
    # the settings given are said on the log's line; RCCL's on an NCCL log are said to do nothing
    res = run_cli("check-model", str(FIXTURE), "-t", "dgx-h100:nodes=4", "--env", "NCCL_ALGO=Ring", "--env",
                  "RCCL_MSCCL_ENABLE=1")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(f"{FIXTURE}: all_reduce"))
    assert "run with NCCL_ALGO=Ring RCCL_MSCCL_ENABLE=1 (--env); RCCL_* settings apply to rccl-tests logs" in line
    # an algorithm the model does not hold is named as a setting, not as a Python dict
    res = run_cli("check-model", str(FIXTURE), "-t", "dgx-h100:nodes=4", "--env", "NCCL_ALGO=CollnetDirect")
    assert res.exit_code == 2 and "NCCL_ALGO=CollnetDirect leaves no algorithm and protocol the model knows" in \
        res.stderr and "{" not in res.stderr


def test_logs_of_several_machines_take_a_topology_each_in_their_order(tmp_path):
    one = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests" / "all_reduce_perf.8xh100-1node.txt"
    logs = [str(one), str(FIXTURE)]
    res = run_cli("check-model", *logs, "-t", "dgx-h100", "-t", "dgx-h100:nodes=4", "--json")
    assert res.exit_code == 0, res.stderr
    tables = json.loads(res.stdout)["tables"]
    assert {n: (t["topology"], t["ranks"]) for n, t in tables.items()} == {
        f"{one}/all_reduce": ("dgx-h100", 8), f"{FIXTURE}/all_reduce": ("dgx-h100:nodes=4", 32)}
    # Each log as it scores on its own: pairing by order changes nothing in a log's rows.
    rows = json.loads(res.stdout)["rows"]
    alone = json.loads(run_cli("check-model", str(FIXTURE), "-t", "dgx-h100:nodes=4", "--json").stdout)["rows"]
    assert [r["predicted_us"] for r in rows if r["table"] == f"{FIXTURE}/all_reduce"] == [
        r["predicted_us"] for r in alone]
    # One -t for logs of two sizes names the log and the way out; a count of -t that pairs with
    # nothing is refused before any log is read.
    res = run_cli("check-model", *logs, "-t", "dgx-h100")
    assert res.exit_code == 2 and "once a log, in the logs' order" in res.stderr and str(FIXTURE) in res.stderr
    res = run_cli("check-model", *logs, "-t", "dgx-h100", "-t", "dgx-h100", "-t", "dgx-h100")
    assert res.exit_code == 2 and "--topology given 3 times for 2 logs" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "given 2 times for 1 log:" in run_cli("check-model", str(one), "-t", "dgx-h100", "-t", "dgx-h100").stderr
    # one -t larger than a log: its ranks selected as its hosts hold them, or a -t a log
    res = run_cli("check-model", *logs, "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 2 and (f"{one}: ran on 8 ranks, and --topology 'dgx-h100:nodes=4' places 32; select its "
                                   "ranks ('dgx-h100:nodes=4[ranks 0-7]') or give --topology once a log") in res.stderr
    # a bad name says whose log it was for; an empty one says so
    res = run_cli("check-model", *logs, "-t", "dgx-h100", "-t", "dgx-hundred")
    assert res.exit_code == 2 and f"--topology 'dgx-hundred' (for {FIXTURE}): unknown topology" in res.stderr
    res = run_cli("check-model", str(one), "-t", "")
    assert res.exit_code == 2 and "--topology '': empty" in res.stderr
    # a bad rank selection is the flag's error too, in check-model and calibrate alike
    for args in (("check-model", str(one)), ("calibrate", "--from-nccl-tests", str(one))):
        res = run_cli(*args, "-t", "dgx-h100[ranks 0,0]")
        assert res.exit_code == 2 and res.stderr.startswith("error: --topology 'dgx-h100[ranks 0,0]': ranks '0,0' "
                                                           "names rank 0 twice"), res.stderr
    # a machine named two ways (a file as 'x.yaml' and './x.yaml') gets one rates note
    cal = tmp_path / "cal.yaml"
    fit = run_cli("calibrate", "--from-nccl-tests", str(one), "-t", "dgx-h100", "-o", str(cal))
    assert fit.exit_code == 0, fit.stderr
    shutil.copy(one, tmp_path / "copy.txt")
    twice = run_cli("check-model", str(one), str(tmp_path / "copy.txt"), "-t", str(cal), "-t", f"{tmp_path}/./cal.yaml")
    assert twice.exit_code == 0, twice.stderr
    assert twice.stdout.count("link rates: ") == 1


def test_a_log_cut_short_is_scored_on_its_whole_rows_with_partial(tmp_path):
    cut = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests" / "damaged" / "all_reduce_perf.truncated.txt"
    res = run_cli("check-model", str(cut), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 2 and "28 whole rows before it, up to 1 GiB (line 35); --partial takes them" in res.stderr
    res = run_cli("check-model", str(cut), "-t", "dgx-h100:nodes=4", "--partial", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    rows = data["rows"]
    assert len(rows) == 28 and rows[-1]["bytes"] == 1 << 30
    assert any("after 28 whole rows up to 1 GiB: those scored (--partial)" in n
               for n in data["tables"][f"{cut}/all_reduce"]["notes"])
    # The rows it has score as the whole run's same rows do.
    whole = json.loads(run_cli("check-model", str(FIXTURE), "-t", "dgx-h100:nodes=4", "--json").stdout)["rows"]
    assert [(r["bytes"], r["predicted_us"]) for r in rows] == [(r["bytes"], r["predicted_us"]) for r in whole[:28]]
    res = run_cli("check-model", "--partial")
    assert res.exit_code == 2 and "--partial applies to nccl-tests logs" in res.stderr
    # a -J file cut short is scored on its whole rows too, as the whole file's same rows
    json_log = FIXTURE.parent / "run.2x8xh100-I1.json"
    (tmp_path / "cut.json").write_text(json_log.read_text()[:3000])
    res = run_cli("check-model", str(tmp_path / "cut.json"), "-t", "dgx-h100:nodes=2")
    assert res.exit_code == 2 and res.stderr.strip().endswith(
        "cut.json: the JSON ends early (the run was cut short?); 2 whole rows up to 2 MiB in it, --partial takes them")
    res = run_cli("check-model", str(tmp_path / "cut.json"), "-t", "dgx-h100:nodes=2", "--partial", "--json")
    assert res.exit_code == 0, res.stderr
    whole = json.loads(run_cli("check-model", str(json_log), "-t", "dgx-h100:nodes=2", "--json").stdout)["rows"]
    assert [r["predicted_us"] for r in json.loads(res.stdout)["rows"]] == [r["predicted_us"] for r in whole[:2]]
    # cut before its first row: nothing to take
    (tmp_path / "cut.json").write_text(json_log.read_text()[:1500])
    res = run_cli("check-model", str(tmp_path / "cut.json"), "-t", "dgx-h100:nodes=2", "--partial")
    assert res.exit_code == 2 and "the JSON ends early: the run was cut short? (no whole row in it)" in res.stderr


def test_a_one_rank_log_is_refused_with_why(tmp_path):
    # nccl-tests on one rank times a copy inside one GPU: nothing between ranks to predict
    lines = (FIXTURE.parent / "all_reduce_perf.8xh100-1node.txt").read_text().splitlines()
    one = [ln.replace("nGpus 8", "nGpus 1") for ln in lines if not (ln.startswith("#  Rank") and
                                                                     not ln.startswith("#  Rank  0 "))]
    (tmp_path / "one.txt").write_text("\n".join(one) + "\n")
    for args in (("check-model", str(tmp_path / "one.txt"), "-t", "dgx-h100"),
                 ("calibrate", "--from-nccl-tests", str(tmp_path / "one.txt"), "-t", "dgx-h100")):
        res = run_cli(*args)
        assert res.exit_code == 2 and "a run on one rank" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("test", ["gather", "scatter", "hypercube", "alltoallv"])
def test_a_log_of_a_test_the_model_does_not_score_is_refused_in_one_wording(tmp_path, test):
    # calibrate fits gather and scatter logs; check-model scores none of the three, and says so alike
    text = FIXTURE.with_name("all_reduce_perf.8xh100-1node.txt").read_text()
    (tmp_path / f"{test}_perf.txt").write_text(f"# Collective test starting: {test}_perf\n" + text)
    res = run_cli("check-model", str(tmp_path / f"{test}_perf.txt"), "-t", "dgx-h100")
    assert res.exit_code == 2 and res.stderr.strip().endswith(
        f"{test}_perf.txt: a {test} test; the model scores all_reduce, all_gather, reduce_scatter, broadcast, "
        "reduce, sendrecv, alltoall") and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_logs_of_several_machines_are_told_apart_in_the_png(tmp_path):
    from treeattn.validate.corpus import load_logs
    from treeattn.validate.published import plot_corpus, predict_corpus

    one = FIXTURE.with_name("all_reduce_perf.8xh100-1node.txt")
    res = run_cli("check-model", str(one), str(FIXTURE), "-t", "dgx-h100", "-t", "dgx-h100:nodes=4",
                  "--png", str(tmp_path / "two.png"))
    assert res.exit_code == 0, res.stderr
    rows = predict_corpus(load_logs([one, FIXTURE], ["dgx-h100", "dgx-h100:nodes=4"]))
    machines = {f"{one}/all_reduce": "dgx-h100", f"{FIXTURE}/all_reduce": "dgx-h100:nodes=4"}
    drawn = (tmp_path / "two.png").read_bytes()
    assert drawn == plot_corpus(rows, tmp_path / "marked.png", "your", machines).read_bytes()
    assert drawn != plot_corpus(rows, tmp_path / "plain.png", "your").read_bytes()
    # one machine, however it is named, keeps the plain figure
    shutil.copy(one, tmp_path / "copy.txt")
    res = run_cli("check-model", str(one), str(tmp_path / "copy.txt"), "-t", "dgx-h100", "-t",
                  str(corpus_dir().parents[1] / "topologies" / "dgx-h100.yaml"), "--png", str(tmp_path / "one.png"))
    assert res.exit_code == 0, res.stderr
    rows = predict_corpus(load_logs([one, tmp_path / "copy.txt"], "dgx-h100"))
    assert (tmp_path / "one.png").read_bytes() == plot_corpus(rows, tmp_path / "p1.png", "your").read_bytes()
    # more machines than markers, unscored rows among them: drawn (hollow shapes with a face)
    many = [dataclasses.replace(r, table=f"t{k}", scored=k % 3 != 0) for k, r in enumerate(rows)]
    assert plot_corpus(many, tmp_path / "many.png", "your", {r.table: f"m{k}" for k, r in enumerate(many)}).exists()
