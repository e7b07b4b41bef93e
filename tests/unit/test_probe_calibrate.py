"""nccl-tests logs (real and damaged) and the alpha-beta fits."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeattn.calibrate.fit import COLLECTIVE_MODELS, Weighting, fit_alpha_beta, fit_collective
from treeattn.calibrate.nccl_tests import (
    NcclTestsLog,
    Timing,
    calibrate_from_log,
    collective_from_name,
    log_run,
    parse_nccl_tests,
    parse_published_table,
    printed_version,
    read_nccl_tests,
)
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
    # the tests named as users name their files (new-user trial), but only in the file's own name
    for name, coll in (("all_gather.log", "all_gather"), ("allgather.txt", "all_gather"),
                       ("nccl_allgather_8gpu.log", "all_gather"), ("run-AllReduce-16.txt", "all_reduce"),
                       ("reducescatter.txt", "reduce_scatter"), ("all_to_all.txt", "alltoall"),
                       ("send_recv.log", "sendrecv"), ("bcast.log", None), ("reduce.txt", None),
                       ("allreduce/run1.txt", None), ("gather_results.txt", None), ("fallgather.txt", None)):
        assert collective_from_name(name) == coll, name


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
        ("all_reduce_perf.truncated.txt", r"truncated.txt:35: the log ends inside the table .*truncated\? 28 whole "
                                          r"rows before it, up to 1 GiB \(line 35\); --partial takes them$"),
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
    # a run that stopped mid-row (buffered output cut) says so, and how many rows were whole
    mid = sum(len(x) for x in lines[: first + 2]) + 30
    with pytest.raises(ProbeError, match=rf"cut.txt:{first + 3}: the log ends inside a row: truncated\? 2 whole rows "
                                         rf"before it, up to 256 MiB \(line {first + 2}\); --partial takes them$"):
        parse_nccl_tests(text[:mid], "cut.txt")
    # Taken, the whole rows are the log's, and it says where it ends; a log cut before its first
    # row, or damaged inside the table (not at its end), is refused still.
    log = parse_nccl_tests(text[:mid], "cut.txt", partial=True)
    assert [r.size_bytes for r in log.rows][-2:] == [134217728, 268435456]
    assert log.cut_short == f"line {first + 3}: ends inside a row, after {len(log.rows)} whole rows up to 256 MiB"
    whole = parse_nccl_tests(text, "cut.txt")
    assert log.rows == whole.rows[: len(log.rows)] and not whole.cut_short
    header = max(i for i, ln in enumerate(lines) if ln.startswith("#") and "algbw" in ln)
    with pytest.raises(ProbeError, match="no whole row before it"):
        parse_nccl_tests("".join(lines[: header + 1]) + "8  2  float  sum  -1  17", "cut.txt", partial=True)
    damaged = lines[: first + 1] + [lines[first + 1][:40] + "\n"] + lines[first + 2:]
    with pytest.raises(ProbeError, match="row has"):
        parse_nccl_tests("".join(damaged), "cut.txt", partial=True)


def test_a_cut_inside_a_rows_last_field_ends_inside_a_row():
    # A cut inside -S 1's timestamp or a trailing N/A leaves the row its fields, one of them
    # half: still a run that stopped mid-row (the file's last line), not a damaged row.
    lines = (FIX / "all_reduce_perf.8xh100-S1.txt").read_text().splitlines()
    last = max(i for i, ln in enumerate(lines) if ln.strip()[:1].isdigit())
    for cut in (lines[last][:-3], lines[last].rsplit(" ", 1)[0] + " 14:"):
        with pytest.raises(ProbeError, match=rf"s1.txt:{last + 1}: the log ends inside a row: truncated\? "):
            parse_nccl_tests("\n".join(lines[:last] + [cut]), "s1.txt")
    # a damaged row with lines after it is refused as damaged still
    bad = lines[:last] + [lines[last][:-3]] + ["# Avg bus bandwidth    : 100"]
    with pytest.raises(ProbeError, match="not a number|fields|timestamp|damaged"):
        parse_nccl_tests("\n".join(bad), "s1.txt")


def test_a_log_cut_short_keeps_its_checks_on_the_rows_it_has():
    # A cut log missing a row inside its table is refused with --partial too: its sizes up to
    # the last whole row are checked against minBytes and the step.
    lines = (FIX / "damaged" / "all_reduce_perf.truncated.txt").read_text().splitlines()
    gap = [ln for ln in lines if not ln.startswith("     1048576 ")]
    with pytest.raises(ProbeError, match=r"gap.txt:25: row 18 prints 2097152 bytes, but minBytes 8 by step "
                                         r"2\(factor\) gives 1048576 there: rows missing or added"):
        parse_nccl_tests("\n".join(gap), "gap.txt", partial=True)
    # a row added to a cut log (768 KiB, between 512 KiB and 1 MiB) is refused too
    extra = list(lines)
    k = next(i for i, ln in enumerate(extra) if ln.startswith("     1048576 "))
    f = extra[k].split()  # the 1 MiB row at three quarters of its size and times: the same rates
    f[0], f[1], f[5], f[9] = "786432", "196608", f"{float(f[5]) * 0.75:.2f}", f"{float(f[9]) * 0.75:.2f}"
    extra.insert(k, "  ".join(f))
    with pytest.raises(ProbeError, match=r"row \d+ prints \d+ bytes, but minBytes 8 by step 2\(factor\) gives "
                                         r"\d+ there: rows missing or added"):
        parse_nccl_tests("\n".join(extra), "extra.txt", partial=True)
    # where the '#  Rank' lines give the ranks, a last row printing far under its place's size is
    # refused too (768 MiB where the 1 GiB row belongs, 8 ranks)
    one = ONE.read_text().splitlines()
    k = next(i for i, ln in enumerate(one) if ln.startswith("  1073741824 "))
    f = one[k].split()
    f[0], f[1], f[5], f[9] = "805306368", "201326592", f"{float(f[5]) * 0.75:.1f}", f"{float(f[9]) * 0.75:.1f}"
    with pytest.raises(ProbeError, match=r"row 4 prints 805306368 bytes, .* gives 1073741824 there"):
        parse_nccl_tests("\n".join(one[:k] + ["  ".join(f)]), "short.txt", partial=True)
    # An all-gather's sizes print rounded down (here to whole elements of every rank: -b 40 -i 40
    # on 8 ranks of floats, 120 printing as 96): a cut log of them is taken.
    head = [ln for ln in lines if ln.startswith("#")][:3]
    rows = [f"{n}  {n // 32}  float  none  -1  10.0  {n / 1e4:.2f}  {n / 1e4 * 7 / 8:.2f}  0  10.0  {n / 1e4:.2f}  "
            f"{n / 1e4 * 7 / 8:.2f}  0" for n in (32, 64, 96, 160)]
    text = "\n".join(["# nThread 1 nGpus 8 minBytes 40 maxBytes 400 step: 40(bytes) warmup iters: 5 iters: 20",
                      "#", "#       size         count      type   redop    root     time   algbw   busbw #wrong"
                      "     time   algbw   busbw #wrong", *rows])
    assert [r.size_bytes for r in parse_nccl_tests(text, "ag.txt", partial=True).rows] == [32, 64, 96, 160]
    assert head  # the fixture's header lines, for the shape above
    # A file that ends inside its '# Avg bus bandwidth' line (its figure gone, or the first
    # digits of the rows' mean left) is cut there, with every row whole: --partial takes them.
    text = ONE.read_text()
    at = text.index("# Avg bus bandwidth")
    whole = parse_nccl_tests(text, "one.txt")
    mean = f"{whole.avg_busbw_gbps:.6f}"
    colon = at + text[at:].index(":")
    assert text[colon + 2: colon + 4] == mean[:2] == "43"
    for cut in (text[: at + 20], text[: colon + 1], text[: colon + 3], text[: colon + 4]):  # "", "4", "43"
        with pytest.raises(ProbeError, match=r"ends inside its '# Avg bus bandwidth' line .*--partial takes them$"):
            parse_nccl_tests(cut, "one.txt")
        log = parse_nccl_tests(cut, "one.txt", partial=True)
        assert log.rows == whole.rows and "ends inside the '# Avg bus bandwidth' line" in log.cut_short
    # another figure on that last line is an altered one, refused as such
    with pytest.raises(ProbeError, match="says 97.5 but the rows average"):
        parse_nccl_tests(text[:at] + "# Avg bus bandwidth    : 97.5", "one.txt", partial=True)


def _all_gather_by_bytes(first: int, last: int, step: int, ranks: int = 8, rank_lines: bool = True) -> str:
    """An all-gather log of floats stepped by ``step`` bytes (``-b first -e last -i step``), its sizes
    and counts as nccl-tests prints them: each rank's count rounded down to 16 bytes, and printed
    (all_gather.cu)."""
    sizes = [(n // 4 // ranks) // 4 * 4 * ranks * 4 for n in range(first, last + 1, step)]
    rows, bus = [], []
    for n in sizes:
        t = 20.0 + n / 5e4
        alg = n / t / 1e3
        bus += [round(alg * (ranks - 1) / ranks, 2)] * 2
        rows.append(f"{n:>12} {n // 4 // ranks:>12}  float  none  -1  {t:.2f}  {alg:.2f}  {bus[-1]:.2f}  0  {t:.2f}  "
                    f"{alg:.2f}  {bus[-1]:.2f}  0")
    ranked = [f"#  Rank {r:2d} Group  0 Pid 1 on node1 device {r:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3"
              for r in range(ranks)] if rank_lines else []
    return "\n".join([f"# nThread 1 nGpus {ranks} minBytes {first} maxBytes {last} step: {step}(bytes) warmup iters: 5 "
                      "iters: 20", "#", "# Using devices", *ranked, "#",
                      "#       size         count      type   redop    root     time   algbw   busbw #wrong"
                      "     time   algbw   busbw #wrong", *rows, "# Out of bounds values : 0 OK",
                      f"# Avg bus bandwidth    : {sum(bus) / len(bus):.6f}", "#"])


def test_a_byte_step_under_the_rounding_unit_prints_sizes_twice():
    # -b 1048576 -i 64 on 8 ranks of floats: the rounding unit is 128 bytes, so every other size
    # prints as the one before it; nccl-tests ran (and timed) both.
    text = _all_gather_by_bytes(1 << 20, (1 << 20) + 1024, 64)
    log = parse_nccl_tests(text, "all_gather_perf.txt")
    sizes = [r.size_bytes for r in log.rows]
    assert len(sizes) == 17 and sizes[:4] == [1 << 20, 1 << 20, (1 << 20) + 128, (1 << 20) + 128]
    # cut short, with or without the '#  Rank' lines that give the ranks, it is taken with --partial
    for rank_lines in (True, False):
        lines = _all_gather_by_bytes(1 << 20, (1 << 20) + 1024, 64, rank_lines=rank_lines).splitlines()
        end = next(i for i, ln in enumerate(lines) if ln.startswith("# Out of bounds"))
        for cut in range(end - 14, end):
            got = parse_nccl_tests("\n".join(lines[:cut]), "all_gather_perf.txt", partial=True)
            assert [r.size_bytes for r in got.rows] == sizes[:len(got.rows)] and got.cut_short
    # a size printed twice is still out of order where the sizes step by a factor
    lines = ONE.read_text().splitlines()
    k = _row_index(lines, 268435456)
    with pytest.raises(ProbeError, match=r"size 268435456 after 268435456 \(line \d+\): rows out of order"):
        parse_nccl_tests("\n".join(lines[:k + 1] + lines[k:]), "d.txt")
    # A size printed twice where the step is not under the unit is a row added (16 bytes a rank
    # of 8: 128; a step of 256), in a whole log with a row dropped to keep the count, or cut short,
    # the '#  Rank' lines there or not (the ranks then from the rows' size and count)
    for rank_lines in (True, False):
        lines = _all_gather_by_bytes(1 << 20, (1 << 20) + 4096, 256, rank_lines=rank_lines).splitlines()
        k = _row_index(lines, (1 << 20) + 512)
        for damaged, partial in (("\n".join(lines[:k + 1] + lines[k:k + 3] + lines[k + 4:]), False),
                                 ("\n".join(lines[:k + 1] + lines[k:k + 3]), True),
                                 ("\n".join(lines[:k + 1] + lines[k:k + 1]), True)):
            with pytest.raises(ProbeError, match=r"row \d+ prints \d+ bytes, but minBytes 1048576 by step "
                                                 r"256\(bytes\) gives \d+ there: rows missing or added"):
                parse_nccl_tests(damaged, "all_gather_perf.txt", partial=partial)
    # rows of one size printed twice are one size to fit, said with the log's name
    one = parse_nccl_tests(_all_gather_by_bytes(1 << 20, (1 << 20) + 64, 64), "all_gather_perf.txt")
    with pytest.raises(ProbeError, match=r"^all_gather_perf.txt: 1 usable size\(s\) in the chosen range"):
        calibrate_from_log(one)
    # and a row added to a whole log stepped by bytes leaves the rows one more than the step gives
    lines = text.splitlines()
    k = _row_index(lines, (1 << 20) + 128)
    with pytest.raises(ProbeError, match=r"18 rows, but minBytes 1048576 .. maxBytes 1049600 by step 64\(bytes\) "
                                         r"gives 17: rows missing or added"):
        parse_nccl_tests("\n".join(lines[:k + 1] + lines[k:]), "all_gather_perf.txt")


def test_a_run_that_failed_mid_table_is_cut_where_it_failed():
    # nccl-tests prints a row's size, count, type, reduction and root before it runs the size,
    # and its failure after them, or on lines of their own; a scheduler's line may follow.
    lines = ONE.read_text().splitlines()
    i = _row_index(lines, 268435456)
    prefix = "   268435456      67108864     float     sum      -1"
    failure = ["node005: Test NCCL failure common.cu:1008 'unhandled cuda error'",
               " .. node005 pid 295203: Test failure common.cu:891",
               "slurmstepd: error: *** STEP 42.0 ON node005 CANCELLED AT 2026-01-01T00:00:00 ***"]
    for tail in ([prefix + " " + failure[0], *failure[1:]], [prefix, *failure]):
        text = "\n".join(lines[:i] + tail)
        with pytest.raises(ProbeError, match=r"ends inside a row: truncated\? \d+ whole rows? before it, up to "
                                             "128 MiB"):
            parse_nccl_tests(text, "failed.txt")
        log = parse_nccl_tests(text, "failed.txt", partial=True)
        assert log.rows[-1].size_bytes == 134217728 and "ends inside a row" in log.cut_short
    # a damaged row with the table going on after it is damaged, not cut
    with pytest.raises(ProbeError, match="row has"):
        parse_nccl_tests("\n".join(lines[:i] + [prefix] + lines[i + 1:]), "damaged.txt", partial=True)


def test_a_retried_job_says_which_lines_to_delete():
    # the first attempt died before its column header; a whole run follows
    lines = ONE.read_text().splitlines()
    columns = next(k for k, ln in enumerate(lines) if ln.startswith("#") and "algbw" in ln)
    head = lines[:columns - 1] + ["node005: Test NCCL failure common.cu:1008 'unhandled system error'"]
    with pytest.raises(ProbeError, match=rf"r.txt:{len(head) + 1}: a second header before any table \(first on line "
                                         rf"1\): a retried job\? delete lines 1-{len(head)} to read the second"):
        parse_nccl_tests("\n".join(head + lines), "r.txt")


def test_a_second_run_inside_a_cut_table_is_refused():
    lines = ONE.read_text().splitlines()
    i = _row_index(lines, 268435456)
    assert any(ln.startswith("# nThread") for ln in lines)
    columns = max(k for k, ln in enumerate(lines[:i]) if ln.startswith("#") and "algbw" in ln)
    # cut after some rows, and cut after the column header before any row
    with pytest.raises(ProbeError, match=r"a second run starts here, inside the first's table"):
        parse_nccl_tests("\n".join(lines[:i] + lines), "two.txt", partial=True)
    # a first attempt that died before its first row, a whole run after it (a retried job)
    first = next(k for k, ln in enumerate(lines) if ln.startswith("# nThread")) + 1
    with pytest.raises(ProbeError, match=rf"two.txt:{columns + 2 + first - 1}: a second run starts here, the first run "
                                         rf"\(header on line {first}\) has no row: a retried job\? delete lines "
                                         rf"{first}-{columns + 1 + first - 1} to read the second"):
        parse_nccl_tests("\n".join(lines[: columns + 1] + lines), "two.txt")


def test_nccl_info_lines_inside_the_table_are_skipped():
    lines = _lines(ONE)
    i = _row_index(lines, 268435456)
    noisy = lines[:i] + ["node005:295203:295203 [0] NCCL INFO Channel 00/24 : 0 1 2 3"] + lines[i:]
    log = parse_nccl_tests("\n".join(noisy), "n.txt")
    assert len(log.rows) == 6 and log.ignored == (i + 1,)


def test_a_launchers_lines_inside_the_table_are_read_past():
    # Open MPI's aggregated help messages land between the rows of an mpirun run (a published
    # log: results/published/unnamed-a100-80gb-thanos.txt, lines 72 and 102); they begin with a
    # number, but not as a row does (size and count).
    lines = _lines(ONE)
    i = _row_index(lines, 268435456)
    mpi = ["8 more processes have sent help message help-mtl-ofi.txt / OFI call fail",
           "Set MCA parameter \"orte_base_help_aggregate\" to 0 to see all help / error messages",
           "2025-06-11 12:00:01,123 - root - INFO - gpu0 72C", "1718100000.123 42 heartbeat",
           "10.0.0.1: 8 more processes"]
    log = parse_nccl_tests("\n".join(lines[:i] + mpi + lines[i:]), "m.txt")
    assert [r.size_bytes for r in log.rows] == [r.size_bytes for r in parse_nccl_tests("\n".join(lines), "o.txt").rows]
    assert log.ignored[-len(mpi):] == tuple(range(i + 1, i + 1 + len(mpi)))
    published = parse_published_table("\n".join(lines[:i] + mpi + lines[i:]), "m.txt")
    assert len(published.rows) == len(log.rows)
    # a row the launcher's line took the place of is missing, and said so; a cut row is still damage
    with pytest.raises(ProbeError, match="rows missing"):
        parse_nccl_tests("\n".join(lines[:i] + mpi[:1] + lines[i + 1:]), "gone.txt")
    with pytest.raises(ProbeError, match="row has 7 fields"):
        parse_nccl_tests("\n".join(lines[:i] + [" ".join(lines[i].split()[:7])] + lines[i + 1:]), "cut.txt")
    # a row whose figures are damaged still begins as one, and is named, in a published table too
    f = lines[i].split()
    damaged = " ".join([f[0], f[1][:2] + "l" + f[1][3:], *f[2:]])
    for parse in (parse_nccl_tests, parse_published_table):
        with pytest.raises(ProbeError, match=rf":{i + 1}: count '{f[1][:2]}l{f[1][3:]}' is not a number"):
            parse("\n".join(lines[:i] + [damaged] + lines[i + 1:]), "d.txt")


def test_nccl_info_lines_give_the_release_and_the_variables_the_environment_set():
    # NCCL_DEBUG=INFO prints its version (as the tinygrad PR 22 log in results/published does:
    # "NCCL INFO NCCL version 2.23.4+cuda12.6") and each variable it read from the environment
    # (tuning.cc "NCCL_ALGO set by environment to %s", misc/param.cc "%s set by environment to %lld.").
    lines = _lines(ONE)
    i = _row_index(lines, 268435456)
    info = ["myles-MC62-G40-00:6742:6742 [0] NCCL INFO NCCL version 2.23.4+cuda12.6",
            "node005:295203:295203 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
            "node005:295203:295203 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.",
            "node005:295203:295210 [3] NCCL INFO NCCL_ALGO set by environment to Ring"]
    log = parse_nccl_tests("\n".join(lines[:4] + info[:3] + lines[4:i] + info[3:] + lines[i:]), "i.txt")
    assert log.nccl_version == "2.23.4+cuda12.6" and printed_version(log) == "2.23.4"
    assert log.env == (("NCCL_ALGO", "Ring"), ("NCCL_NVLS_ENABLE", "0"))
    assert len(log.rows) == 6
    # lines after the table count too (a communicator made at the end); a rank's differing value does not
    after = lines + ["node005:295203:295203 [0] NCCL INFO NCCL_PROTO set by environment to Simple",
                     "node005:295203:295203 [1] NCCL INFO NCCL_PROTO set by environment to LL"]
    assert parse_nccl_tests("\n".join(after), "a.txt").env == (("NCCL_PROTO", "Simple"),)
    # a plain version line, where the log has one, is the one read
    plain = parse_nccl_tests("\n".join(lines[:4] + ["NCCL version 2.26.2+cuda12.8"] + info[:1] + lines[4:]), "p.txt")
    assert plain.nccl_version == "2.26.2+cuda12.8"


def test_a_selection_of_ranks_follows_the_logs_hosts():
    from treeattn.calibrate.log_machine import ranks_like_hosts
    from treeattn.calibrate.nccl_tests import NcclDevice
    from treeattn.topology.library import resolve

    log = read_nccl_tests(ONE)
    topo = resolve("dgx-h100:nodes=4")

    def on(*hosts: str) -> NcclTestsLog:
        return dataclasses.replace(log, devices=tuple(NcclDevice(r, h, 0, "", "") for r, h in enumerate(hosts)))

    assert ranks_like_hosts(on("a", "b"), topo) == "0,8"
    assert ranks_like_hosts(on("a"), topo) is None  # one rank: no run to place (log_run refuses it)
    assert ranks_like_hosts(on("a", "a", "b", "b", "c", "c"), topo) == "0-1,8-9,16-17"
    assert ranks_like_hosts(on(*"a" * 8), topo) == "0-7"
    # round-robin: a selection renumbers its ranks in the order it lists them
    assert ranks_like_hosts(on("a", "b", "a", "b"), topo) == "0,8,1,9"
    assert ranks_like_hosts(on(*"abcdabcd"), topo) == "0,8,16,24,1,9,17,25"
    assert ranks_like_hosts(on(*"abcde"), topo) is None  # more hosts than nodes
    assert ranks_like_hosts(on(*"a" * 9), topo) is None  # more ranks on a host than a node holds
    assert ranks_like_hosts(dataclasses.replace(log, devices=()), topo) is None


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
    # skipping the second run as noise would calibrate on the first alone, unsaid: it is refused
    # at the line where it starts.
    text = "\n".join(_lines(ONE) + _lines(FIX / "all_reduce_perf.2x8xh100-srun-l.txt"))
    with pytest.raises(ProbeError, match=r"both.txt:25: a second run starts here"):
        parse_nccl_tests(text, "both.txt")


def test_the_average_is_read_with_the_verdict_nccl_tests_min_bw_adds():
    # NCCL_TESTS_MIN_BW=... makes nccl-tests print "# Avg bus bandwidth : 439.369 OK" (or FAILED).
    for verdict in ("OK", "FAILED"):
        lines = [f"{ln} {verdict}" if ln.startswith("# Avg bus") else ln for ln in _lines(ONE)]
        assert parse_nccl_tests("\n".join(lines), "v.txt").avg_busbw_gbps == 439.369


def test_a_max_size_nccl_tests_lowered_for_memory_sets_the_rows_expected():
    # Where -e's buffers do not fit the GPU, nccl-tests lowers maxBytes before the table and says
    # so ("# Reducing maxBytes to N due to memory limitation"; 24 tables of xxrjun's published
    # cluster logs): the header's maxBytes then overcounts the rows, and such a log was refused
    # as "rows missing or added".
    lines = _lines(ONE)
    last = _row_index(lines, 4294967296)
    kept = lines[:last] + lines[last + 1:]
    bus = [float(ln.split()[i]) for ln in kept if ln.split()[:1] and ln.split()[0].isdigit() for i in (7, 11)]
    kept = [f"# Avg bus bandwidth    : {sum(bus) / len(bus):.3f}" if ln.startswith("# Avg bus") else ln
            for ln in kept]
    with pytest.raises(ProbeError, match=r"5 rows, but minBytes 134217728 .. maxBytes 4294967296"):
        parse_nccl_tests("\n".join(kept), "r.txt")
    i = _row_index(kept, 134217728) - 3
    reduced = kept[:i] + ["#", "# Reducing maxBytes to 3221225472 due to memory limitation"] + kept[i:]
    log = parse_nccl_tests("\n".join(reduced), "r.txt")
    assert (log.min_bytes, log.max_bytes, len(log.rows)) == (134217728, 3221225472, 5)
    # launcher tags included; and minBytes follows a maxBytes lowered below it, as nccl-tests does
    tagged = [f" 0: {ln}" for ln in reduced]
    assert parse_nccl_tests("\n".join(tagged), "r.txt").max_bytes == 3221225472
    one = [ln.replace("minBytes 134217728 maxBytes 4294967296", "minBytes 8589934592 maxBytes 17179869184")
           .replace("3221225472", "134217728") for ln in reduced]
    one = [ln for ln in one if not ln.split()[:1] or not ln.split()[0].isdigit()
           or ln.split()[0] == "134217728"]
    one = [f"# Avg bus bandwidth    : {(382.99 + 382.34) / 2:.3f}" if ln.startswith("# Avg bus") else ln
           for ln in one]
    log = parse_nccl_tests("\n".join(one), "r.txt")
    assert (log.min_bytes, log.max_bytes, len(log.rows)) == (134217728, 134217728, 1)


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
    from treeattn.calibrate.log_machine import other_devices
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


# -- what nccl-tests 2.19 prints on request ----------------------------------------------------------
# The *-S1, *-I1, *-C1 logs and run.2x8xh100-I1.json were written to nccl-tests 2.19.6's printf
# formats (src/util.cu), not captured from runs: tests/fixtures/nccl-tests/README.md.

S1 = FIX / "all_reduce_perf.8xh100-S1.txt"
I1 = FIX / "all_reduce_perf.8xh100-I1.txt"
C1 = FIX / "all_reduce_perf.8xh100-C1.txt"
JSON_LOG = FIX / "run.2x8xh100-I1.json"


def _timings(log: NcclTestsLog) -> list[tuple]:
    return [(r.size_bytes, r.count, r.root, r.out_of_place, r.in_place) for r in log.rows]


def test_a_timestamp_column_is_read_past():
    # -S 1 prints "%Y-%m-%d %H:%M:%S" right-aligned in 21 columns after the in-place #wrong: two fields.
    log = read_nccl_tests(S1)
    assert (log.ranks, len(log.rows), log.avg_busbw_gbps, log.collective) == (8, 8, 283.453, "all_reduce")
    last = log.rows[-1]
    assert (last.size_bytes, last.out_of_place.time_us, last.in_place.busbw_gbps, last.in_place.wrong) == (
        134217728, 554.62, 418.48, 0)
    assert log.nccl_version == "2.27.3"  # from "nccl-library=22703" in the first line nccl-tests prints
    lines = _lines(S1)
    i = _row_index(lines, 8388608)
    for damaged, match in ((lines[i].rsplit(" ", 1)[0], r"^S1.txt:23: row has 14 fields, the table has 15"),
                           (lines[i].replace("14:03:14", "14.03.14"), r"^S1.txt:23: row ends .* not the timestamp")):
        with pytest.raises(ProbeError, match=match):
            parse_nccl_tests("\n".join([*lines[:i], damaged, *lines[i + 1:]]), "S1.txt")


def test_per_iteration_columns_are_read_past():
    # -I 1 prints i_min i_max i_p99 i_cv% after each group's #wrong; the -S 1 log holds the same figures.
    log = read_nccl_tests(I1)
    assert _timings(log) == _timings(read_nccl_tests(S1)) and log.avg_busbw_gbps == 283.453
    # -I 1 -S 1: the timestamp follows the in-place per-iteration figures, as writeResultHeader
    # labels it (" %*s", 19 wide) and common.cu prints it ("%21s" after the in-place report).
    lines = _lines(I1)
    head = next(k for k, ln in enumerate(lines) if ln.split()[1:2] == ["size"])
    stamped = [*lines[:head], lines[head] + f"{'timestamp':>19}", lines[head + 1] + f"{'%Y-%m-%d %H:%M:%S':>19}"]
    stamped += [ln + (f"{f'2026-07-20 14:03:{k:02d}':>21}" if ln[:1] == " " else "")
                for k, ln in enumerate(lines[head + 2:])]
    assert _timings(parse_nccl_tests("\n".join(stamped), "IS.txt")) == _timings(log)
    # The figures read past are still numbers: a damaged one is damage.
    i = _row_index(lines, 4194304)
    parts = lines[i].split()
    parts[11] = "3x.84"
    with pytest.raises(ProbeError, match=r"^I1.txt:23: i_p99 '3x.84' is not a number"):
        parse_nccl_tests("\n".join([*lines[:i], "  ".join(parts), *lines[i + 1:]]), "I1.txt")


def test_cpu_time_is_refused_for_the_gpu_time_the_model_predicts():
    # -C 1 prints the host's time to launch the calls as "cputime"; algbw and busbw stay GPU time's,
    # so the columns disagree and neither calibration nor check-model may read the times.
    with pytest.raises(ProbeError, match=r"C1.txt:18: the time column is 'cputime' \(nccl-tests -C 1\): .* the GPU "
                                         r"time the model predicts; rerun without -C 1$"):
        read_nccl_tests(C1)
    with pytest.raises(ProbeError, match="rerun without -C 1"):
        parse_published_table(C1.read_text(), "c1.txt")


def test_json_output_is_read_as_the_same_log(tmp_path):
    # mpirun -np 2 all_reduce_perf -g 8 -I 1 -J ...: the JSON lists each process's first device.
    log = read_nccl_tests(JSON_LOG)
    assert (log.n_threads, log.n_gpus, log.ranks, [d.rank for d in log.devices]) == (1, 8, 16, [0, 8])
    assert log.devices[1].host == "gpu-a08" and log.devices[1].name == "NVIDIA H100 80GB HBM3"
    assert log.collective == "all_reduce"  # from the command line it records: the file name says nothing
    assert (log.nccl_version, log.out_of_bounds, log.avg_busbw_gbps) == ("2.27.3", "0 OK", 90.540504)
    first = log.rows[0]
    assert (first.line, first.size_bytes, first.count, first.dtype, first.redop, first.root) == (
        1, 1048576, 262144, "float", "sum", -1)
    assert first.out_of_place == Timing(55.540773, 18.879392, 35.398859, 0.0)
    assert [r.size_bytes for r in log.rows] == [1048576 << k for k in range(5)]
    assert log_run(log) == ("all_reduce", 16, ()) and calibrate_from_log(log).ranks == 16
    # nccl-tests writes to NAME.json.0 when NAME.json exists: read by its content.
    again = tmp_path / "all_reduce.json.0"
    again.write_text(JSON_LOG.read_text())
    assert _timings(read_nccl_tests(again)) == _timings(log)


def _edited(edit: Callable[[dict], object]) -> str:
    data = json.loads(JSON_LOG.read_text())
    edit(data)
    return json.dumps(data)


def _set(d: dict, key: str, value: object) -> None:
    d[key] = value


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (JSON_LOG.read_text()[:1500], r"^j.json: the JSON ends early: the run was cut short\?$"),
        (JSON_LOG.read_text()[:5000], r"^j.json: the JSON ends early \(the run was cut short\?\); 4 whole rows up to "
                                      r"8 MiB in it, --partial takes them$"),
        (JSON_LOG.read_text()[:-60], r"^j.json: the JSON ends early"),
        ("", r"^j.json: the file is empty$"),
        # text named .json is read as the text it is (a header cut short here)
        ("# nThread 1 nGpus 8", r"^j.json: no '# nThread N nGpus M minBytes \.\.\. maxBytes \.\.\.' header"),
        ("nonsense", r"^j.json: not JSON \(Expecting value, line 1 column 1\)$"),
        ('{"version": 1, "results": []}', r"^j.json: JSON, but not nccl-tests' -J output"),
        ("[1, 2]", r"^j.json: JSON, but not nccl-tests' -J output"),
        (_edited(lambda d: d["results"][2]["in_place"].update(cpu_time=d["results"][2]["in_place"].pop("time"))),
         r"^j.json: results\[2\]\.in_place gives cpu_time \(nccl-tests -C 1\).*rerun without -C 1$"),
        (_edited(lambda d: d["results"][1]["out_of_place"].pop("alg_bw")),
         r"^j.json: results\[1\]\.out_of_place\.alg_bw is missing, expected a number$"),
        (_edited(lambda d: _set(d["results"][3]["in_place"], "time", "nan")),
         r"^j.json: results\[3\]\.in_place\.time is 'nan', expected a number$"),
        (_edited(lambda d: _set(d["results"][3]["in_place"], "alg_bw", 12.5)),
         r"^j.json: results\[3\]\.in_place: algbw 12.5 GB/s but size/time"),
        (_edited(lambda d: _set(d["results"][3]["in_place"], "bus_bw", 12.5)), r"^j.json: results\[3\]: busbw/algbw"),
        (_edited(lambda d: d["results"].pop(2)), r"^j.json: results\[3\]: 4 rows, but minBytes 1048576 .. maxBytes "
                                                 r"16777216 by step 2\(factor\) gives 5"),
        (_edited(lambda d: d["results"].insert(0, d["results"].pop(1))),
         r"^j.json: results\[1\]: size 1048576 after 2097152: rows out of order"),
        (_edited(lambda d: d.pop("average_bus_bandwidth")), r"^j.json: no average_bus_bandwidth: the run did not "
                                                            r"finish; 5 whole rows up to 16 MiB in it, --partial takes "
                                                            "them$"),
        (_edited(lambda d: _set(d["average_bus_bandwidth"], "bandwidth", 50.0)),
         r"^j.json: the average bus bandwidth says 50 but the rows average 90.54"),
        (_edited(lambda d: _set(d["config"]["devices"][1], "rank", 1)),
         r"^j.json: config.devices lists ranks \[0, 1\], not each process's first \(8 apart from 0\)$"),
        (_edited(lambda d: d["config"].pop("step_factor")), r"^j.json: config.step_bytes is missing, expected an "
                                                            "integer$"),
        (_edited(lambda d: _set(d["config"], "devices", 16)), r"^j.json: config.devices is 16, expected a list$"),
        ("[" * 100_000, r"^j.json: not JSON \(nested too deeply\)$"),
    ],
)
def test_damaged_or_foreign_json_is_refused(text, match):
    with pytest.raises(ProbeError, match=match):
        parse_nccl_tests(text, "j.json")


def test_a_json_file_of_a_run_cut_short_or_failed_gives_its_whole_rows_with_partial():
    whole = parse_nccl_tests(JSON_LOG.read_text(), "j.json")
    text = JSON_LOG.read_text()
    # killed: the file ends wherever its last buffered block did; every cut after the first row
    # gives the rows before it, as the whole file reads them
    for end in range(text.index('"results"') + 400, len(text), 97):
        try:
            log = parse_nccl_tests(text[:end], "j.json", partial=True)
        except ProbeError as exc:
            assert "no whole row in it" in str(exc)
            continue
        assert log.rows == whole.rows[:len(log.rows)]
        # a cut after the table's figures (its average read whole) loses nothing
        assert log.cut_short.startswith("the JSON ends early") or (
            log.rows == whole.rows and log.avg_busbw_gbps == whole.avg_busbw_gbps and not log.cut_short)
    # failed: nccl-tests wrote the next size's first fields, then closed the file as it exited
    data = json.loads(text)
    data["results"] = data["results"][:3] + [{k: data["results"][3][k] for k in ("size", "count", "type", "redop",
                                                                                  "root")}]
    for key in ("out_of_bounds", "average_bus_bandwidth", "errors", "end_time"):
        data.pop(key)
    failed = json.dumps(data)
    with pytest.raises(ProbeError, match=r"^j.json: results\[3\] has no timings: the run failed at its size; 3 whole "
                                         r"rows up to 4 MiB in it, --partial takes them$"):
        parse_nccl_tests(failed, "j.json")
    log = parse_nccl_tests(failed, "j.json", partial=True)
    assert log.rows == whole.rows[:3] and log.cut_short == ("results[3] has no timings: the run failed at its size: "
                                                            "3 whole rows up to 4 MiB")
    # a failed run's rows are still checked against the step, before --partial is named: a
    # missing one is refused, with --partial or not; so is a row with no timings but the last
    for partial in (False, True):
        gap = {**data, "results": [data["results"][0], *data["results"][2:]]}
        with pytest.raises(ProbeError, match="rows missing or added"):
            parse_nccl_tests(json.dumps(gap), "j.json", partial=partial)
        early = {**data, "results": [data["results"][3], *data["results"][1:]]}
        with pytest.raises(ProbeError, match=r"^j.json: results\[0\] has no timings \(no in_place\): rows damaged"):
            parse_nccl_tests(json.dumps(early), "j.json", partial=partial)
    # a run that ended before its first size; a whole file with anything after it (not a cut)
    none = {k: v for k, v in data.items() if k != "results"}
    with pytest.raises(ProbeError, match=r"^j.json: no results: the run ended before its first size"):
        parse_nccl_tests(json.dumps(none), "j.json", partial=True)
    # a finished run short of its maxBytes (nccl-tests lowered it for memory, and -J keeps the
    # size asked for; or rows were lost): refused naming both and --partial, which takes the rows
    lowered = json.loads(text)
    lowered["config"]["maximum_bytes"] *= 4
    with pytest.raises(ProbeError, match=r"^j.json: ends at 16 MiB, short of maxBytes 64 MiB \(rows lost, or "
                                         r"nccl-tests lowered maxBytes for memory, which -J does not record\); 5 "
                                         r"whole rows up to 16 MiB in it, --partial takes them$"):
        parse_nccl_tests(json.dumps(lowered), "j.json")
    log = parse_nccl_tests(json.dumps(lowered), "j.json", partial=True)
    assert log.rows == whole.rows and log.max_bytes == whole.max_bytes and log.cut_short
    # rows lost from the end, the average edited to theirs: the same (only --partial takes them)
    short = {**json.loads(text), "results": json.loads(text)["results"][:2]}
    bus = [r[k]["bus_bw"] for r in short["results"] for k in ("out_of_place", "in_place")]
    short["average_bus_bandwidth"] = {**short["average_bus_bandwidth"], "bandwidth": sum(bus) / len(bus)}
    with pytest.raises(ProbeError, match=r"ends at 2 MiB, short of maxBytes 16 MiB"):
        parse_nccl_tests(json.dumps(short), "j.json")
    for tail in ("1", "tr", " 0", "1.5e", "x"):
        with pytest.raises(ProbeError, match=r"^j.json: not JSON \(Extra data"):
            parse_nccl_tests(text + tail, "j.json", partial=True)


def test_json_of_an_unchecked_or_in_place_only_run_is_read():
    # -c 0 writes nwrong null (not checked); a run without out-of-place timings writes null there.
    def edit(d: dict) -> None:
        for r in d["results"]:
            r["in_place"]["nwrong"] = None
            r["out_of_place"] = None
        bus = [r["in_place"]["bus_bw"] for r in d["results"]]
        d["average_bus_bandwidth"]["bandwidth"] = sum(bus) / len(bus)

    log = parse_nccl_tests(_edited(edit), "j.json")
    assert all(r.out_of_place is None and r.in_place.wrong is None for r in log.rows)


def test_lines_mpich_hydra_tagged_are_read():
    # mpiexec -prepend-rank (or -l) puts "[rank] " before each line it relays; NCCL's own lines
    # start with their host, and stay NCCL INFO lines, skipped, tagged or not.
    from treeattn.calibrate.nccl_tests import _TAG

    info = "node005:295203:295210 [3] NCCL INFO comm 0x1 rank 3 nranks 8 - Init COMPLETE"
    assert _TAG.sub("", info, count=1) == info
    tagged = [f"[0] {ln}" for ln in _lines(ONE)]
    tagged[3:3] = [f"[3] {info}", "[0]"]
    i = _row_index(_lines(ONE), 268435456) + 2
    tagged.insert(i, info)
    log = parse_nccl_tests("\n".join(tagged), "h.txt")
    assert log.ranks == 8 and [r.size_bytes for r in log.rows] == [134217728 << k for k in range(6)]
    assert log.rows[-1].out_of_place.time_us == 15870 and 4 in log.ignored and i + 1 in log.ignored
    assert [r.size_bytes for r in parse_published_table("\n".join(tagged), "h.txt").rows] == [
        r.size_bytes for r in log.rows]


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


def test_lines_a_log_collector_stamped_are_read():
    # kubectl logs --timestamps puts an RFC 3339 time before each line; an NCCL INFO line's own
    # host stays as it is.
    from treeattn.calibrate.nccl_tests import _TAG

    info = "node005:295203:295210 [3] NCCL INFO comm 0x1 rank 3 nranks 8 - Init COMPLETE"
    assert _TAG.sub("", info, count=1) == info
    plain = parse_nccl_tests("\n".join(_lines(ONE)), "p.txt")
    for prefix in ("2025-07-14T09:30:01.123456789Z ", "2025-07-14T09:30:01+02:00 ", "2025-07-14T09:30:01Z "):
        stamped = parse_nccl_tests("\n".join(prefix + ln for ln in _lines(ONE)), "s.txt")
        assert stamped.rows == plain.rows and stamped.ranks == plain.ranks, prefix


def test_a_utf16_log_is_named_so(tmp_path):
    # Windows PowerShell's `>` writes UTF-16 with a byte-order mark: its NULs are not binary data.
    path = tmp_path / "log.txt"
    path.write_bytes("\n".join(_lines(ONE)).encode("utf-16"))
    with pytest.raises(ProbeError, match="it is UTF-16 text; save it as UTF-8"):
        read_nccl_tests(path)


def test_a_gzipped_log_is_named_so(tmp_path):
    import gzip

    path = tmp_path / "all_reduce_perf.log.gz"
    path.write_bytes(gzip.compress("\n".join(_lines(ONE)).encode()))
    with pytest.raises(ProbeError, match="gzip-compressed data, not text; gunzip it first"):
        read_nccl_tests(path)


def test_a_prefix_this_reader_does_not_strip_is_named():
    # pdsh's "host: " is not stripped (rccl-tests' own lines start so); the refusal says what is wrong.
    text = "\n".join(f"node005: {ln}" for ln in _lines(ONE))
    with pytest.raises(ProbeError, match=r"p.txt:\d+: nccl-tests' header follows 'node005:': its lines carry a "
                                         r"prefix this reader does not strip"):
        parse_nccl_tests(text, "p.txt")
    with pytest.raises(ProbeError, match="header: not nccl-tests output"):
        parse_nccl_tests("just some text\n# a comment\n", "q.txt")
