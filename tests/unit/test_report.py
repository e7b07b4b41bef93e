"""Report rendering from a small synthetic results folder: figures, files, determinism, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli_helpers import run_cli
from treeattn.errors import InputError
from treeattn.report import ROW_COLUMNS, TIMELINE_COLUMNS, load_folder, render_folder, summarize, summary_json
from treeattn.report.plots import choose_timeline
from treeattn.report.summary import case_frame, error_frame

# (method, role, is_pick, predicted_us, measured_us) per case; measured / predicted gives the error.
CASES = {
    ("emu-a", "B1", 1, 256): [("multirail", "candidate", True, 1000.0, 1100.0),
                              ("star", "candidate", False, 2000.0, 1600.0),
                              ("allreduce3", "baseline", False, 3000.0, 3300.0),
                              ("ring-attention", "baseline", False, 5000.0, 4000.0)],
    ("emu-a", "B64", 64, 256): [("multirail", "candidate", True, 10000.0, 12000.0),
                                ("star", "candidate", False, 11000.0, 10000.0),
                                ("allreduce3", "baseline", False, 20000.0, 25000.0)],
    ("emu-a", "N64K", 1, 65536): [("multirail", "candidate", True, 4000.0, 5000.0),
                                  ("ring-attention", "baseline", False, 900000.0, 1000000.0)],
    ("emu-b", "B1", 1, 256): [("butterfly", "candidate", True, 500.0, 400.0),
                              ("allreduce3", "baseline", False, 800.0, 1000.0)],
}


def _rows() -> pd.DataFrame:
    out = []
    for (topo, case, batch, tokens), methods in CASES.items():
        for method, role, pick, pred, meas in methods:
            out.append({
                "topology": topo, "case": case, "regime": "long-context" if tokens > 256 else "sweep",
                "ranks": 8 if topo == "emu-a" else 4, "batch": batch, "q_heads": 8, "kv_heads": 1, "head_dim": 32,
                "tokens_per_rank": tokens, "payload_bytes": batch * 8 * 33 * 4, "kv_bytes_per_rank": tokens * 128,
                "method": method, "role": role, "is_pick": pick, "algorithm": method, "chunks": 2,
                "predicted_us": pred, "predicted_nominal_us": pred * 2, "measured_median_us": meas,
                "measured_p10_us": meas * 0.9, "measured_p90_us": meas * 1.1, "repeats": 5, "correct": True,
                "max_rel_err": 1e-6,
            })
    return pd.DataFrame(out, columns=list(ROW_COLUMNS))


def _timeline() -> pd.DataFrame:
    out = []
    for source, scale in (("predicted", 1.0), ("measured", 1.3)):
        for rank in range(2):
            for i, (kind, peer, start, end) in enumerate([("compute", None, 0, 50), ("send", 1 - rank, 50, 400),
                                                           ("recv_merge", 1 - rank, 50, 420)]):
                out.append({"topology": "emu-a", "case": "B1", "method": "multirail", "source": source, "rank": rank,
                            "op_index": i, "kind": kind, "peer": peer, "chunk": None, "start_us": start * scale,
                            "end_us": end * scale})
    return pd.DataFrame(out, columns=list(TIMELINE_COLUMNS))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "res"
    d.mkdir()
    _rows().to_csv(d / "rows.csv", index=False)
    _timeline().to_csv(d / "timeline.csv", index=False)
    (d / "meta.json").write_text(json.dumps({"primary_topology": "emu-a",
                                             "command": "treeattn validate emu-a --out res"}))
    return d


def test_error_figures():
    err = error_frame(_rows())
    assert len(err) == 11
    # |pred - meas| / meas: 1/11, 1/4, 1/11, 1/4, 1/6, 1/10, 1/5, 1/5, 1/10, 1/4, 1/5
    assert err["error"].median() == pytest.approx(0.2)
    s = summarize(_rows())
    assert s["errors"]["all"]["n"] == 11
    assert s["errors"]["all"]["median"] == pytest.approx(0.2)
    assert s["errors"]["all"]["p90"] == pytest.approx(0.25)
    assert s["errors"]["nominal"]["median"] > s["errors"]["all"]["median"]  # the nominal predictions are 2x off
    assert set(s["errors"]["by_topology"]) == {"emu-a", "emu-b"}


def test_case_figures_and_targets():
    cases = case_frame(_rows()).set_index(["topology", "case"])
    b1 = cases.loc[("emu-a", "B1")]
    assert b1["pick"] == "multirail" and b1["best"] == "multirail" and b1["regret"] == pytest.approx(0.0)
    assert b1["speedup_allreduce3"] == pytest.approx(3.0) and b1["speedup_ring_attention"] == pytest.approx(4000 / 1100)
    b64 = cases.loc[("emu-a", "B64")]
    assert b64["best"] == "star" and b64["regret"] == pytest.approx(0.2)
    # against the baselines alone the pick is ahead: 12 ms against allreduce3's 25
    assert b64["best_baseline"] == "allreduce3" and b64["regret_baselines"] == pytest.approx(12000 / 25000 - 1)
    s = summarize(_rows(), {"primary_topology": "emu-a"})
    t = s["targets"]
    assert s["primary_topology"] == "emu-a"
    assert t["speedup_allreduce3_b1"]["value"] == pytest.approx(3.0) and t["speedup_allreduce3_b1"]["reached"]
    assert t["speedup_ring_attention_64k"]["value"] == pytest.approx(200.0)
    assert t["regret"]["value"] == pytest.approx(0.2) and t["regret"]["reached"] is False
    assert t["error_cases"]["reached"] is False  # 11 rows < 30
    # emu-b has fewer ranks: without meta the primary is still the larger cluster
    assert summarize(_rows())["primary_topology"] == "emu-a"


def test_wrong_results_leave_the_error_set():
    rows = _rows()
    rows.loc[0, "correct"] = False
    s = summarize(rows)
    assert s["errors"]["all"]["n"] == 10 and s["errors"]["excluded_rows"] == 1
    assert s["cases"][0]["pick_us"] is None and s["cases"][0]["regret"] is None


def test_render_writes_files_and_is_deterministic(folder: Path):
    done = render_folder(folder)
    names = sorted(p.name for p in done.files)
    assert names == ["README.md", "scatter.png", "speedup.png", "summary.json", "timeline.png"]
    text = (folder / "README.md").read_text()
    assert "treeattn validate emu-a --out res" in text and "| regret | 20.0% | <= 10.0% | **no** |" in text
    assert all((folder / n).stat().st_size > 1000 for n in names if n.endswith(".png"))
    assert done.timeline == ("emu-a", "B1", "multirail")
    first = (folder / "summary.json").read_bytes()
    render_folder(folder, plots=False)
    assert (folder / "summary.json").read_bytes() == first
    assert json.loads(first) == json.loads(summary_json(summarize(load_folder(folder).rows, {"primary_topology":
                                                                                             "emu-a"})))


def test_no_plots_keeps_the_readme_true_to_the_files(folder: Path):
    # Before any PNG exists the README names the timeline's plan and says what is not drawn;
    # once they are drawn, a --no-plots render writes the README a full render writes.
    bare = render_folder(folder, plots=False)
    text = (folder / "README.md").read_text()
    assert bare.timeline == ("emu-a", "B1", "multirail") and "`timeline.png`: emu-a:B1:multirail" in text
    assert "not drawn yet: scatter.png, speedup.png, timeline.png" in text
    render_folder(folder)
    full = (folder / "README.md").read_text()
    assert "not drawn yet" not in full
    render_folder(folder, plots=False)
    assert (folder / "README.md").read_text() == full


def test_a_readme_report_did_not_write_is_kept(folder: Path):
    # Before, a user's own README.md in the folder was replaced without a word (--no-plots too).
    (folder / "README.md").write_text("my own notes\n")
    with pytest.raises(InputError, match=r"README\.md is not a README\.md treeattn report wrote \(it begins b'my own "):
        render_folder(folder, plots=False)
    assert (folder / "README.md").read_text() == "my own notes\n" and not (folder / "summary.json").exists()
    (folder / "README.md").unlink()
    render_folder(folder, plots=False)
    render_folder(folder, plots=False)  # its own, rewritten


def test_a_summary_or_folder_in_the_way_or_an_unknown_timeline_is_refused_before_anything_is_written(folder: Path):
    # A user's summary.json was replaced without a word; one that was a folder gave a traceback
    # (IsADirectoryError, status 1); a --timeline naming no plan was refused after the summary
    # was rewritten.
    (folder / "summary.json").write_text("my precious notes\n")
    with pytest.raises(InputError, match=r"summary\.json is not a summary\.json treeattn report wrote; move it away"):
        render_folder(folder, plots=False)
    assert (folder / "summary.json").read_text() == "my precious notes\n"
    (folder / "summary.json").unlink()
    (folder / "summary.json").mkdir()
    with pytest.raises(InputError, match=r"summary\.json: a folder where report writes its summary\.json"):
        render_folder(folder, plots=False)
    (folder / "summary.json").rmdir()
    with pytest.raises(InputError, match="no timeline for"):
        render_folder(folder, method="nosuch", plots=False)
    assert not (folder / "summary.json").exists()
    res = run_cli("report", str(folder), "--no-plots")
    assert res.exit_code == 0, res.stderr


def test_timeline_choice(folder: Path):
    f = load_folder(folder)
    assert choose_timeline(f.rows, f.timeline, method="multirail") == ("emu-a", "B1", "multirail")
    with pytest.raises(InputError, match="no timeline for"):
        choose_timeline(f.rows, f.timeline, case="B64")


def test_cli_report_json(folder: Path):
    res = run_cli("report", str(folder), "--json", "--no-plots")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["targets"]["regret"]["value"] == pytest.approx(0.2)
    assert res.stdout == (folder / "summary.json").read_text()


def test_cli_report_tables(folder: Path):
    res = run_cli("report", str(folder), "--timeline", "B1:multirail")
    assert res.exit_code == 0, res.stderr
    assert "Targets" in res.stdout and "timeline.png" in res.stdout


@pytest.mark.parametrize(("setup", "match"), [
    ("missing", "does not exist"),
    ("a-file", "is a file"),
    ("no-rows", "has no rows.csv"),
    ("bad-column", "lacks the columns"),
    ("bad-number", "rows.csv:3: ranks is 'eight', not a number"),
    ("deep-meta", "meta.json: not JSON: nested too deeply"),
    ("negative-time", "rows.csv:2: measured_median_us is -5.0, not a time"),
    ("infinite-time", "rows.csv:3: predicted_us is inf, not a time"),
    ("cut-row", "the row has fewer fields than the header, or the file ends inside it: the file was cut short?"),
    # cut inside the last row's last field: as many fields, its value shorter (accepted before)
    ("cut-last-field", "rows.csv:12: the row has fewer fields than the header, or the file ends inside it"),
    ("negative-ranks", "rows.csv:2: ranks is -5, not a whole number of at least 1"),
    ("half-chunk", "rows.csv:3: chunks is 1.5, not a whole number of at least 1"),
])
def test_cli_report_bad_folders(tmp_path: Path, setup: str, match: str):
    d = tmp_path / "r"
    if setup == "a-file":
        d.write_text("rows\n")
    elif setup != "missing":
        d.mkdir()
    if setup == "bad-column":
        _rows().drop(columns=["predicted_us"]).to_csv(d / "rows.csv", index=False)
    if setup == "bad-number":
        rows = _rows().astype({"ranks": object})
        rows.loc[1, "ranks"] = "eight"  # the second row: line 3 of the file
        rows.to_csv(d / "rows.csv", index=False)
    if setup in ("negative-time", "infinite-time"):
        rows = _rows()
        rows.loc[0 if setup == "negative-time" else 1,
                 "measured_median_us" if setup == "negative-time" else "predicted_us"] = (
            -5.0 if setup == "negative-time" else float("inf"))
        rows.to_csv(d / "rows.csv", index=False)
    if setup in ("negative-ranks", "half-chunk"):
        rows = _rows().astype({"chunks": float})
        rows.loc[0 if setup == "negative-ranks" else 1, "ranks" if setup == "negative-ranks" else "chunks"] = (
            -5 if setup == "negative-ranks" else 1.5)
        rows.to_csv(d / "rows.csv", index=False)
    if setup == "cut-row":
        text = _rows().to_csv(index=False)
        (d / "rows.csv").write_text(text[: text.rstrip("\n").rfind(",", 0, len(text) - 40)])
    if setup == "cut-last-field":
        (d / "rows.csv").write_text(_rows().to_csv(index=False).rstrip("\n")[:-3])
    if setup == "deep-meta":
        _rows().to_csv(d / "rows.csv", index=False)
        (d / "meta.json").write_text('{"primary_topology": ' + "[" * 100_000)
    res = run_cli("report", str(d))
    assert res.exit_code == 2
    assert match in res.stderr and "Traceback" not in res.stderr


def _rename_topology(folder: Path, old: str, new: str) -> None:
    """A results folder's topology renamed in its rows, timeline and meta.json."""
    for name in ("rows.csv", "timeline.csv"):
        frame = pd.read_csv(folder / name)
        frame["topology"] = frame["topology"].replace(old, new)
        frame.to_csv(folder / name, index=False)
    (folder / "meta.json").write_text((folder / "meta.json").read_text().replace(old, new))


def test_the_timeline_drawn_is_named_as_timeline_takes_it(folder: Path):
    # a topology with a rank selection ("[ranks 0,4]") lost it to rich's markup in the name
    # printed, which --timeline then refused
    _rename_topology(folder, "emu-a", "emu-a[ranks 0,4]")
    res = run_cli("report", str(folder))
    assert res.exit_code == 0 and "(timeline: emu-a[ranks 0,4]:B1:multirail)" in res.stdout, res.stdout
    again = run_cli("report", str(folder), "--timeline", "emu-a[ranks 0,4]:B1:multirail")
    assert again.exit_code == 0, again.stderr
    # a family spec's name holds ':' itself (rtx4090:gpus=2): the name printed is taken back
    _rename_topology(folder, "emu-a[ranks 0,4]", "emu-a:gpus=2")
    res = run_cli("report", str(folder))
    assert "(timeline: emu-a:gpus=2:B1:multirail)" in res.stdout, res.stdout
    again = run_cli("report", str(folder), "--timeline", "emu-a:gpus=2:B1:multirail")
    assert again.exit_code == 0, again.stderr


def test_cli_report_unknown_timeline(folder: Path):
    res = run_cli("report", str(folder), "--timeline", "emu-a:B1:nope")
    assert res.exit_code == 2 and "no timeline for emu-a:B1:nope" in res.stderr


def test_report_imports_no_torch():
    code = "import sys, treeattn.report, treeattn.validate; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 1e6), st.floats(10, 1e6)), min_size=2, max_size=8),
       st.integers(0, 7))
def test_regret_and_error_properties(times, pick):
    pick %= len(times)
    recs = []
    base = _rows().iloc[0].to_dict()
    for i, (pred, meas) in enumerate(times):
        recs.append({**base, "method": f"m{i}", "is_pick": i == pick, "predicted_us": pred,
                     "measured_median_us": meas})
    rows = pd.DataFrame(recs, columns=list(ROW_COLUMNS))
    s = summarize(rows)
    c = s["cases"][0]
    assert c["regret"] >= 0
    assert c["best_us"] == pytest.approx(min(m for _, m in times), rel=1e-5)
    e = s["errors"]["all"]
    assert e["median"] <= e["p90"] * (1 + 1e-9) <= e["max"] * (1 + 1e-9)


def _case_with_times(times: dict[str, list[float]], pick: str) -> pd.DataFrame:
    rows = _rows()
    rows = rows[(rows["topology"] == "emu-a") & (rows["case"] == "B1")].copy()
    rows = rows[rows["method"].isin(times)]
    rows["is_pick"] = rows["method"] == pick
    rows["measured_times_us"] = [" ".join(f"{t:.1f}" for t in times[m]) for m in rows["method"]]
    rows["measured_median_us"] = [float(pd.Series(times[m]).median()) for m in rows["method"]]
    return rows


def test_regret_interval_keeps_rounds_paired():
    # The pick is 10 % slower than star in every round; round 2 was a slow spell for both.
    star = [1000.0, 1010.0, 3000.0, 990.0, 1005.0]
    case = case_frame(_case_with_times({"multirail": [1.1 * t for t in star], "star": star}, "multirail")).iloc[0]
    assert case["regret"] == pytest.approx(0.1)
    # Resampling rounds, not each method's iterations alone, keeps the spell shared: every
    # resample gives the same 10 %.
    assert case["regret_low"] == pytest.approx(0.1) and case["regret_high"] == pytest.approx(0.1)
    # A pick fastest in every round: no regret in any resample.
    faster = case_frame(_case_with_times({"multirail": [0.9 * t for t in star], "star": star}, "multirail")).iloc[0]
    assert faster["regret"] == 0.0 and faster["regret_low"] == 0.0 and faster["regret_high"] == 0.0


def test_regret_interval_spans_the_noise_and_is_deterministic():
    pick = [1100.0, 1300.0, 900.0, 1250.0, 950.0, 1200.0, 1120.0]
    star = [1100.0, 1000.0, 1150.0, 980.0, 1120.0, 1010.0, 1090.0]
    rows = _case_with_times({"multirail": pick, "star": star}, "multirail")
    a, b = case_frame(rows).iloc[0], case_frame(rows).iloc[0]
    assert a["regret_low"] == b["regret_low"] and a["regret_high"] == b["regret_high"]
    assert a["regret_low"] == 0.0 < a["regret"] < a["regret_high"]


@pytest.mark.parametrize("cells", [["", "1 2 3"], ["1 2 3", "1 2"], ["1 2 x", "1 2 3"]])
def test_regret_interval_needs_every_methods_times(cells):
    rows = _case_with_times({"multirail": [1.0, 2.0, 3.0], "star": [1.0, 2.0, 3.0]}, "multirail")
    rows["measured_times_us"] = cells
    case = case_frame(rows).iloc[0]
    assert case["regret"] is not None and case["regret_low"] is None and case["regret_high"] is None


def test_folders_without_iteration_times_still_load(folder: Path):
    rows = pd.read_csv(folder / "rows.csv").drop(columns=["measured_times_us"])
    rows.to_csv(folder / "rows.csv", index=False)
    got = load_folder(folder)
    assert (got.rows["measured_times_us"] == "").all()
    assert summarize(got.rows, got.meta)["regret"]["primary_max_interval"] is None


def test_readme_and_tables_give_the_worst_regrets_interval(folder: Path):
    rows = pd.read_csv(folder / "rows.csv")
    # emu-a B64 is the worst case (20 %): multirail 12 ms against star's 10 ms in every round.
    rows["measured_times_us"] = [" ".join(f"{m * f:.1f}" for f in (1.0, 1.02, 0.98)) for m in
                                 rows["measured_median_us"]]
    rows.to_csv(folder / "rows.csv", index=False)
    render_folder(folder, plots=False)
    text = (folder / "README.md").read_text()
    assert "5th percentile 20.0%, 95th 20.0%" in text
    res = run_cli("report", str(folder))
    assert res.exit_code == 0 and "20% (20%–20%)" in res.stdout


def test_a_candidate_named_like_a_baseline_is_told_apart():
    # The all-gather + merge family can be the pick while the baseline of that name runs too.
    rows = _case_with_times({"star": [1000.0, 1000.0, 1000.0]}, "star")
    pick = rows.iloc[0].copy()
    base = rows.iloc[0].copy()
    pick["method"], pick["role"], pick["is_pick"] = "allgather-merge", "candidate", True
    base["method"], base["role"], base["is_pick"] = "allgather-merge", "baseline", False
    base["measured_times_us"], base["measured_median_us"] = "1500.0 1500.0 1500.0", 1500.0
    pick["measured_times_us"], pick["measured_median_us"] = "1200.0 1200.0 1200.0", 1200.0
    rows["is_pick"] = False
    case = case_frame(pd.concat([pd.DataFrame([base]), rows, pd.DataFrame([pick])], ignore_index=True)).iloc[0]
    assert case["regret"] == pytest.approx(0.2)
    assert case["regret_low"] == pytest.approx(0.2) and case["regret_high"] == pytest.approx(0.2)
    assert case["speedup_allgather_merge"] == pytest.approx(1.25)


def test_regret_is_reported_for_every_topology(folder: Path):
    # emu-b's only case: butterfly (the pick, 400 us) is the only candidate: no regret there; emu-a's
    # worst is B64 at 20 %.
    rows = pd.read_csv(folder / "rows.csv")
    extra = rows[rows["topology"] == "emu-b"].copy()
    extra["method"], extra["role"], extra["is_pick"] = "star", "candidate", False
    extra["measured_median_us"] = 320.0  # faster than the pick: 25 % regret on emu-b
    extra = extra.iloc[:1]
    pd.concat([rows, extra], ignore_index=True).to_csv(folder / "rows.csv", index=False)
    s = summarize(load_folder(folder).rows, {"primary_topology": "emu-a"})
    by = s["regret"]["by_topology"]
    assert by["emu-a"]["max"] == pytest.approx(0.2) and by["emu-a"]["case"] == "B64"
    assert by["emu-b"]["max"] == pytest.approx(0.25) and by["emu-b"]["reached"] is False
    # against the baselines: emu-a's worst is B64 (12 ms / 25 ms), emu-b's its one case (400 / 1000 us)
    assert by["emu-a"]["baselines_max"] == pytest.approx(-0.52) and by["emu-a"]["baselines_case"] == "B64"
    assert by["emu-b"]["baselines_max"] == pytest.approx(-0.6) and by["emu-b"]["baselines_case"] == "B1"
    render_folder(folder, plots=False)
    text = (folder / "README.md").read_text()
    assert "| emu-b | B1 | 25.0% |" in text and "| emu-a | B64 | 20.0% |" in text
    assert "| -52.0% (B64) |" in text and "| -60.0% (B1) |" in text
    res = run_cli("report", str(folder))
    assert res.exit_code == 0 and "Regret on every topology" in res.stdout and "emu-b" in res.stdout
    assert "vs baselines" in res.stdout
