"""``treeattn check-model`` on a small corpus: figures, JSON, PNG and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
    for args in (["check-model", str(tmp_path / "missing")], ["check-model", str(tmp_path)],
                 ["check-model", "--png", str(tmp_path / "x.jpg")]):
        res = run_cli(*args)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


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
    name = f"{tmp_path / 'run'}/all_reduce"
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


def test_own_log_env_reaches_the_model(tmp_path):
    log = tmp_path / "all_reduce_perf.txt"
    shutil.copy(FIXTURE, log)
    default = json.loads(run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--json").stdout)["rows"]
    ring = run_cli("check-model", str(log), "-t", "dgx-h100:nodes=4", "--env", "NCCL_ALGO=Ring", "--json")
    assert ring.exit_code == 0, ring.stderr
    rows = json.loads(ring.stdout)["rows"]
    assert all(r["how"].startswith("ring/") for r in rows) and rows != default


def test_own_log_bad_input_is_one_line_and_exit_2(tmp_path):
    log = tmp_path / "run.txt"
    shutil.copy(FIXTURE, log)
    for args, said in ((["check-model", str(log)], "needs --topology"),
                       (["check-model", "-t", "dgx-h100"], "--topology applies to nccl-tests logs"),
                       (["check-model", str(log), "-t", "dgx-h100:nodes=2"], "places 16 ranks but the table ran on 32"),
                       (["check-model", str(log), "-t", "dgx-h100:nodes=4", "--env", "ALGO=Ring"], "NCCL_ name"),
                       (["check-model", str(log), str(log), "-t", "dgx-h100:nodes=4"], "given twice"),
                       (["check-model", str(tmp_path / "gone.txt"), "-t", "dgx-h100"], "no such file or folder")):
        res = run_cli(*args)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and said in res.stderr, res.stderr
