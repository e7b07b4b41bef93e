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
