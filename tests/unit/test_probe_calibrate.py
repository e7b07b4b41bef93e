"""nccl-tests logs (real and damaged) and the alpha-beta fits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeattn.calibrate.fit import COLLECTIVE_MODELS, Weighting, fit_alpha_beta, fit_collective
from treeattn.calibrate.nccl_tests import calibrate_from_log, collective_from_name, parse_nccl_tests, read_nccl_tests
from treeattn.errors import ProbeError

FIX = Path(__file__).parents[1] / "fixtures" / "nccl-tests"
ONE = FIX / "all_reduce_perf.8xh100-1node.txt"
FOUR = FIX / "all_reduce_perf.4x8xh100-ib400.txt"


# -- parsing -------------------------------------------------------------------------------------


def test_single_node_log():
    log = read_nccl_tests(ONE)
    assert (log.n_threads, log.n_gpus, log.min_bytes, log.max_bytes) == (1, 8, 134217728, 4294967296)
    assert log.ranks == 8 and log.devices[3].busid == "0xc0" and log.devices[0].name == "NVIDIA H100 80GB HBM3"
    assert [r.size_bytes for r in log.rows] == [134217728 << k for k in range(6)]
    row = log.rows[-1]
    assert (row.out_of_place.time_us, row.out_of_place.algbw_gbps, row.out_of_place.busbw_gbps) == (15870, 270.63,
                                                                                                    473.60)
    assert row.in_place.wrong == 0 and row.dtype == "float" and row.redop == "sum" and row.root == -1
    assert log.avg_busbw_gbps == 439.369 and log.out_of_bounds == "0 OK"
    assert log.collective == "all_reduce" and log.busbw_ratio() == pytest.approx(1.75, abs=1e-3)


def test_multi_node_log_with_trimmed_device_list():
    log = read_nccl_tests(FOUR)
    assert log.ranks is None  # the device lines were trimmed from the published copy
    assert log.ignored == (2,)  # the "[... trimmed ...]" line, skipped and reported
    assert log.nccl_version == "2.26.2+cuda12.8"
    assert len(log.rows) == 32 and log.rows[0].size_bytes == 8 and log.rows[-1].size_bytes == 17179869184
    assert log.avg_busbw_gbps == 107.51


def test_collective_from_name():
    assert collective_from_name("all_reduce_perf.x.txt") == "all_reduce"
    assert collective_from_name("/a/reduce_scatter_perf.log") == "reduce_scatter"
    assert collective_from_name("reduce_perf") == "reduce" and collective_from_name("log.txt") is None


def test_old_column_names_are_read():
    text = "\n".join([
        "# nThread 1 nGpus 2 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 validation: 1",
        "#",
        "#                                                out-of-place                    in-place",
        "#       bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res",
        "        1024           256   float     sum    10.00   0.10   0.10    0e+00    10.00   0.10   0.10    0e+00",
        "        2048           512   float     sum    20.00   0.10   0.10    0e+00    20.00   0.10   0.10    0e+00",
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 0.10",
    ])
    log = parse_nccl_tests(text, "old.txt")
    assert [r.size_bytes for r in log.rows] == [1024, 2048] and log.rows[0].root is None


# -- damage ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("all_reduce_perf.truncated.txt", r"truncated.txt:\d+: the log ends inside the table"),
        ("all_reduce_perf.row-missing.txt", r"31 rows, but minBytes 8 .. maxBytes 17179869184 by step 2\(factor\) "
                                            "gives 32"),
    ],
)
def test_damaged_files_refused(name, match):
    with pytest.raises(ProbeError, match=match):
        read_nccl_tests(FIX / "damaged" / name)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _row_index(lines: list[str], size: int) -> int:
    return next(i for i, ln in enumerate(lines) if ln.split()[:1] == [str(size)])


def _swap_cols(line: str, a: int, b: int) -> str:
    parts = line.split()
    parts[a], parts[b] = parts[b], parts[a]
    return "  ".join(parts)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda ls, i: ls[:i] + [ls[i][: len(ls[i]) // 2]] + ls[i + 1:], r":\d+: row has \d+ fields"),
        (lambda ls, i: ls[:i] + [ls[i].replace("1768.0", "1968.0", 1)] + ls[i + 1:], "algbw 151.83 GB/s but"),
        (lambda ls, i: ls[:i] + [_swap_cols(ls[i], 6, 7)] + ls[i + 1:], "algbw|busbw/algbw"),
        (lambda ls, i: ls[:i] + [ls[i + 1], ls[i]] + ls[i + 2:], "rows out of order"),
        (lambda ls, i: ls[:i] + [ls[i].replace(" sum ", " sum x ", 1)] + ls[i + 1:], "fields"),
        (lambda ls, i: ls[:i] + [ls[i].replace("151.83", "15l.83", 1)] + ls[i + 1:], "'15l.83' is not a number"),
        (lambda ls, i: ls[:i] + [ls[i].replace("294.16", "394.16", 1)] + ls[i + 1:], "busbw/algbw|Avg bus"),
        (lambda ls, i: ls + ls[:4], "second run"),
        (lambda ls, i: [ln for ln in ls if not ln.startswith("# Avg")], "ends inside the table"),
        (lambda ls, i: [ln for ln in ls if "algbw" not in ln], "no table header"),
        (lambda ls, i: ["hello", "world"], "not nccl-tests output"),
        (lambda ls, i: ls[:-1] + ["# Avg bus bandwidth    : 97.5"], "says 97.5 but the rows average"),
    ],
)
def test_generated_damage_refused(edit, match):
    lines = _lines(FOUR)
    i = _row_index(lines, 268435456)
    with pytest.raises(ProbeError, match=match):
        parse_nccl_tests("\n".join(edit(lines, i)), "d.txt")


def test_every_truncation_inside_the_table_is_refused():
    text = ONE.read_text()
    lines = text.splitlines(keepends=True)
    first = _row_index([ln.rstrip("\n") for ln in lines], 134217728)
    for i in range(first, len(lines) - 2):
        cut = sum(len(x) for x in lines[: i + 1])
        with pytest.raises(ProbeError):
            parse_nccl_tests(text[:cut], "cut.txt")


def test_nccl_info_lines_inside_the_table_are_skipped():
    lines = _lines(ONE)
    i = _row_index(lines, 268435456)
    noisy = lines[:i] + ["node005:295203:295203 [0] NCCL INFO Channel 00/24 : 0 1 2 3"] + lines[i:]
    log = parse_nccl_tests("\n".join(noisy), "n.txt")
    assert len(log.rows) == 6 and log.ignored == (i + 1,)


def test_lines_tagged_by_the_launcher_are_read():
    # srun -l prefixes each line with its task (" 0: "); the published 2-node run of nccl-tests issue 290.
    log = read_nccl_tests(FIX / "all_reduce_perf.2x8xh100-srun-l.txt")
    assert (log.n_gpus, log.min_bytes, log.max_bytes, len(log.rows)) == (1, 8388608, 8589934592, 11)
    last = log.rows[-1]
    assert (last.size_bytes, last.out_of_place.time_us, last.in_place.time_us) == (8589934592, 103530, 103538)
    assert last.in_place.wrong is None and log.avg_busbw_gbps == 142.735  # -c 0 prints #wrong N/A
    # mpirun --tag-output: "[1,0]<stdout>:" before every line, NCCL INFO lines of other ranks between.
    tagged = [f"[1,0]<stdout>:{ln}" for ln in _lines(ONE)]
    tagged.insert(3, "[1,3]<stdout>:node005:295203:295210 [3] NCCL INFO comm 0x1 rank 3 nranks 8 - Init COMPLETE")
    log = parse_nccl_tests("\n".join(tagged), "t.txt")
    assert log.ranks == 8 and [r.size_bytes for r in log.rows] == [134217728 << k for k in range(6)]
    assert log.rows[-1].out_of_place.time_us == 15870


def test_a_tagged_second_run_is_refused_not_skipped():
    # Issue 290's text: a one-node run, then a two-node run relayed by srun -l. Read as one file,
    # the second run used to be skipped as noise after the first, and the first calibrated alone.
    text = "\n".join(_lines(ONE) + _lines(FIX / "all_reduce_perf.2x8xh100-srun-l.txt"))
    with pytest.raises(ProbeError, match=r"both.txt:25: a second run starts here"):
        parse_nccl_tests(text, "both.txt")


def test_the_average_is_read_with_the_verdict_nccl_tests_min_bw_adds():
    # NCCL_TESTS_MIN_BW=... makes nccl-tests print "# Avg bus bandwidth : 439.369 OK" (or FAILED).
    for verdict in ("OK", "FAILED"):
        lines = [f"{ln} {verdict}" if ln.startswith("# Avg bus") else ln for ln in _lines(ONE)]
        assert parse_nccl_tests("\n".join(lines), "v.txt").avg_busbw_gbps == 439.369


def test_a_wrong_count_printed_in_g_format_is_a_count():
    # nccl-tests prints #wrong with %6g: a million wrong elements read 1e+06. The old reading
    # (any "e" is an old version's error magnitude: not checked) kept such a timing in the fit.
    lines = _lines(ONE)
    i = _row_index(lines, 268435456)
    parts = lines[i].split()
    parts[8] = "1.23457e+06"
    lines[i] = "  ".join(parts)
    log = parse_nccl_tests("\n".join(lines), "w.txt")
    assert log.rows[1].out_of_place.wrong == 1234570 and log.rows[1].in_place.wrong == 0
    fit = calibrate_from_log(log, placement="out")
    assert any("left out at sizes [268435456]" in n for n in fit.warnings), fit.warnings


def test_an_rccl_tests_log_is_refused_on_an_nvlink_topology():
    # rccl-tests on MI300X (rocm/rccl issue 1562) prints no '#  Rank' lines to tell its GPUs by:
    # its version line does. Calibrated onto dgx-h100 it wrote 317 GB/s into NVLink, exit 0.
    from treeattn.calibrate.nccl_tests import other_devices
    from treeattn.topology.library import resolve

    lines = _lines(ONE)
    head = next(i for i, ln in enumerate(lines) if ln.startswith("# nThread"))
    amd = lines[:head + 1] + ["rccl-tests: Version develop:448c4c7"] + [
        ln for ln in lines[head + 1:] if not ln.startswith("#  Rank")]
    log = parse_nccl_tests("\n".join(amd), "amd.txt")
    assert log.rccl and not log.devices and not read_nccl_tests(ONE).rccl
    assert other_devices(log, resolve("dgx-h100")) == ("the log ran rccl-tests (AMD GPUs); dgx-h100's GPUs are "
                                                       "joined by NVLink (NVIDIA's)")
    assert other_devices(log, resolve("mi300x")) == ""
    # The version line may come anywhere, '#'-prefixed too, and the published reader marks it alike.
    trailing = [ln for ln in lines if not ln.startswith("#  Rank")] + ["# RCCL version : 2.22.3-develop:f5b15f2"]
    assert parse_nccl_tests("\n".join(trailing), "amd2.txt").rccl
    from treeattn.calibrate.nccl_tests import parse_published_table

    assert parse_published_table("\n".join(amd), "amd3.txt").rccl and not parse_published_table(
        "\n".join(lines), "one.txt").rccl


def test_errors_name_the_file_as_given(tmp_path):
    # Every refusal names the path the user typed, not just its last part.
    path = tmp_path / "all_reduce_perf.row-missing.txt"
    path.write_text((FIX / "damaged" / "all_reduce_perf.row-missing.txt").read_text())
    with pytest.raises(ProbeError, match=rf"^{re.escape(str(path))}:38: 31 rows"):
        read_nccl_tests(path)


# -- fitting ----------------------------------------------------------------------------------------


def test_fit_recovers_synthetic_alpha_beta_exactly():
    sizes = [0, 1 << 10, 1 << 20, 1 << 30]
    for weighting in Weighting:
        f = fit_alpha_beta(sizes, [12.5 + s / (37.0 * 1e3) for s in sizes], weighting=weighting)
        assert f.alpha_us == pytest.approx(12.5, rel=1e-9) and f.beta_gbps == pytest.approx(37.0, rel=1e-9)
        assert f.r2 == pytest.approx(1.0) and max(abs(r) for r in f.residuals) < 1e-6


@settings(max_examples=60, deadline=None)
@given(
    alpha=st.floats(0.1, 1000), beta=st.floats(0.05, 5000),
    sizes=st.lists(st.integers(0, 1 << 34), min_size=2, max_size=20, unique=True),
)
def test_fit_recovers_any_line(alpha, beta, sizes):
    times = [alpha + s / (beta * 1e3) for s in sizes]
    f = fit_alpha_beta(sizes, times)
    assert f.predict_us(max(sizes)) == pytest.approx(max(times), rel=1e-6)
    assert f.alpha_us == pytest.approx(alpha, rel=1e-4, abs=1e-6 * max(times))


@pytest.mark.parametrize("collective", sorted(COLLECTIVE_MODELS))
def test_collective_model_is_inverted_exactly(collective):
    m, n, alpha, beta = COLLECTIVE_MODELS[collective], 8, 3.0, 120.0
    sizes = [1 << k for k in range(10, 31, 2)]
    times = [m.steps(n) * alpha + m.volume(n) * s / (beta * 1e3) for s in sizes]
    cf = fit_collective(sizes, times, collective, n)
    assert cf.alpha_step_us == pytest.approx(alpha, rel=1e-9) and cf.beta_link_gbps == pytest.approx(beta, rel=1e-9)


@pytest.mark.parametrize(
    ("sizes", "times", "match"),
    [
        ([1], [1.0], "at least two distinct"),
        ([1, 2], [1.0], "as many times as sizes"),
        ([1, 2], [5.0, 5.0], "does not grow"),
        ([1, 2], [5.0, -1.0], "times > 0"),
        ([1, float("nan")], [1.0, 2.0], "finite"),
    ],
)
def test_fit_refuses_unusable_points(sizes, times, match):
    with pytest.raises(ProbeError, match=match):
        fit_alpha_beta(sizes, times)


def test_fixture_fits_are_sensible():
    one = calibrate_from_log(read_nccl_tests(ONE))
    assert one.ranks == 8 and one.points == 6 and one.fit.r2 > 0.99
    # Bus bandwidth approaches ~470 GB/s at 4 GiB; the fitted link bandwidth is that asymptote.
    assert 460 < one.beta_link_gbps < 490 and 0 < one.alpha_step_us < 30
    four = calibrate_from_log(read_nccl_tests(FOUR))
    assert four.ranks == 32 and any("solved from busbw/algbw" in w for w in four.warnings)
    assert 250 < four.beta_link_gbps < 380 and 0 < four.alpha_step_us < 5
    small = calibrate_from_log(read_nccl_tests(FOUR), max_bytes=1 << 16)
    assert 30 < small.fit.alpha_us < 45  # the ~35 µs small-message plateau of the log


def test_calibration_checks_collective_and_ranks():
    log = read_nccl_tests(ONE)
    with pytest.raises(ProbeError, match="all_gather over 8 ranks gives 0.8750"):
        calibrate_from_log(log, collective="all_gather")
    with pytest.raises(ProbeError, match="all_reduce over 4 ranks gives 1.5000"):
        calibrate_from_log(log, ranks=4)
    with pytest.raises(ProbeError, match="placement"):
        calibrate_from_log(log, placement="both")
    with pytest.raises(ProbeError, match="0 usable size"):
        calibrate_from_log(log, max_bytes=1 << 20)
    out = calibrate_from_log(log, placement="out")
    assert out.points == 6
