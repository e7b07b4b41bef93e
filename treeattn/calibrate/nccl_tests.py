"""nccl-tests / rccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...): parse and fit.

The format, as printed by rank 0::

    # nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 ...
    # Using devices
    #  Rank  0 Group  0 Pid 1234 on host device  0 [0x18] NVIDIA H100 80GB HBM3
    #                         out-of-place                       in-place
    #       size   count   type   redop   root   time   algbw   busbw #wrong   time   algbw   busbw #wrong
    #        (B) (elements)                      (us)  (GB/s)  (GB/s)           (us)  (GB/s)  (GB/s)
             8       2    float     sum     -1   34.6    0.00    0.00      0   34.7    0.00    0.00      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 107.51

Older versions name the columns ``bytes N type op`` and ``error``/``res``; the parser reads the
column header. Columns recent nccl-tests add on request are read past: ``-I 1``'s (2.19)
``i_min i_max i_p99 i_cv%`` after each group's ``#wrong``, ``-S 1``'s ``timestamp`` (printed
``%Y-%m-%d %H:%M:%S``) after the last group. ``-C 1`` names the time column ``cputime``: the
host's time to launch the calls, not the GPU time the model predicts (algbw and busbw stay
GPU figures), so such a table is refused. The NCCL release is read from an ``NCCL version``
line, or from the ``nccl-library=`` code nccl-tests 2.17.4 and later print first. The JSON
file ``-J FILE`` writes is read into the same log (``nccl_tests_json``): ``parse_nccl_tests``
and ``read_nccl_tests`` take either.

Lines a launcher tagged (``srun -l``'s ``0:``, ``mpirun --tag-output``'s ``[1,0]<stdout>:``,
MPICH Hydra ``-prepend-rank``'s ``[0] ``) or a log collector stamped (``kubectl logs
--timestamps``) are read untagged. Lines outside the table that are not recognised (shell
echo, ``NCCL INFO``, trimmed device lists) are skipped and their numbers kept in
``ignored``; of ``NCCL_DEBUG=INFO``'s lines, NCCL's version (where no plain version line
gives one) and the variables it says the environment set (``env``) are kept. Inside the
table a line that does not begin as a row does (a whole number, the size, then the count) is
skipped the same way: what a launcher prints between the rows (Open MPI's ``8 more processes
have sent help message ...``, a UCX warning); the table must still hold every size its header
gives (below), so a row damaged past recognition is still refused. A line that begins as a row
must be a whole one.

Tables copied from publications (``parse_published_table``) are read more leniently: a
range of lines holding one table, with or without its headers, trailer or ``#  Rank`` lines,
rows possibly tagged by the launcher (``0:``, ``[1,0]<stdout>:``, ``[0] ``), a launcher's lines
between them (read past, as above) and columns not aligned; the layout comes from the column
header when there is one, else from the number of fields (size count type [redop] [root],
then one or two time/algbw/busbw/#wrong groups). Each row is still checked (algbw against
size/time, one busbw/algbw ratio, sizes increasing), so
a copying mistake is caught; rows of 0 bytes are left out.

A damaged log is refused (``ProbeError`` with the line): a row with the wrong number of
fields or an unreadable number, ``algbw`` that is not size/time, ``busbw``/``algbw`` ratios
that disagree between rows, sizes out of order, fewer rows than ``minBytes``..``maxBytes``
by ``step`` gives (``maxBytes`` as nccl-tests lowers it where the GPU's memory is short, which
it prints: ``# Reducing maxBytes to N due to memory limitation``), an average bus bandwidth
the rows do not give, or a log that ends inside the table (unless the caller takes its whole
rows: ``partial``, a run that stopped early, its ``cut_short`` saying where).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from treeattn.calibrate.fit import COLLECTIVE_MODELS, CollectiveFit, Weighting, fit_collective
from treeattn.cost.nvls import REDUCTION_DTYPES, dtype_name
from treeattn.errors import ProbeError
from treeattn.probe.text import fail, read_input
from treeattn.units import format_size

__all__ = ["Timing", "NcclRow", "NcclDevice", "NcclTestsLog", "parse_nccl_tests", "read_nccl_tests",
           "parse_published_table", "calibrate_from_log", "collective_from_name", "launch_notes", "log_run",
           "looks_like_a_log"]

_HEADER = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)(.*)$")
_STEP = re.compile(r"step:\s*(\d+)\((factor|bytes)\)")
_HEADER_GRAPH = re.compile(r"\bgraph:\s*(\d+)")
_HEADER_AGG = re.compile(r"\bagg iters:\s*(\d+)")
_DEVICE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_ERR_COLS = ("#wrong", "wrong", "error", "res")
_NAME = re.compile(r"(all_reduce|all_gather|reduce_scatter|broadcast|sendrecv|alltoallv|alltoall|hypercube|reduce|"
                   r"gather|scatter)_perf")
_STARTING = re.compile(r"^#?\s*Collective test starting:\s*(\S+)")
"""nccl-tests 2.13 and later name the test before the header."""
_LIBRARY = re.compile(r"^#\s*nccl-tests version \S+ nccl-headers=\d+ nccl-library=(\d+)")
"""nccl-tests 2.17.4 and later print the NCCL they ran with as its version code first."""
_VERSION_LINE = re.compile(r"^[NR]CCL version\s*:?\s*\d")
"""NCCL's ``NCCL version 2.24.3+cuda12.6`` and rccl-tests' ``RCCL version : 2.22.3-develop``."""
_REDUCED = re.compile(r"^#\s*Reducing maxBytes to (\d+) due to memory limitation")
"""Where the buffers of ``maxBytes`` would not fit the GPU, nccl-tests lowers it (and ``minBytes``
with it, where that is larger) before the first row and says so."""
_TAG = re.compile(r"^\s*(?:\[\d+(?:,\d+)?\](?:<std(?:out|err)>)?:|\[\d+\](?=\s|$)|\d+:"
                  r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?(?=\s|$))\s?")
"""What a launcher or log collector puts before each line it relays: ``mpirun --tag-output``
(``[1,0]<stdout>:``), MPICH Hydra ``-prepend-rank`` / ``-l`` (``[0] ``), ``srun -l`` (``0:``),
``kubectl logs --timestamps`` (``2025-07-14T09:30:01.123456789Z ``). Anchored at the line's
start: an ``NCCL INFO`` line starts with its host (``node005:1234:1234 [0] NCCL INFO``). Not
``pdsh``'s ``host: ``, which tool output's own lines share (``rccl-tests: Version ...``)."""
_INFO_VERSION = re.compile(r"NCCL INFO NCCL version (\d+\.\d+\.\d+\S*)")
"""NCCL's own version line under ``NCCL_DEBUG=INFO`` (``host:pid:tid [0] NCCL INFO NCCL version 2.26.2+cuda12.8``)."""
_INFO_ENV = re.compile(r"NCCL INFO ((?:NCCL|RCCL)_[A-Z0-9_]+) set by environment to (.*)$")
"""NCCL's word, under ``NCCL_DEBUG=INFO``, of a variable the run's environment set (``NCCL_ALGO set
by environment to Ring``; an integer one ends in a full stop: ``misc/param.cc``)."""
_INFO_INT = re.compile(r"^(-?\d+)\.$")
_PER_ITER = ["i_min", "i_max", "i_p99", "i_cv%"]
"""The per-iteration figures ``-I 1`` prints after each group's ``#wrong``."""
_DATE, _CLOCK = re.compile(r"\d{4}-\d\d-\d\d"), re.compile(r"\d\d:\d\d:\d\d")
"""``-S 1``'s timestamp, ``%Y-%m-%d %H:%M:%S``: two fields of a row."""


@dataclass(frozen=True, slots=True)
class Timing:
    """One placement (out-of-place or in-place) of one row."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: float | None
    """Validation errors (``#wrong``; ``error`` in old versions); None when not checked (N/A)."""


@dataclass(frozen=True, slots=True)
class NcclRow:
    line: int
    size_bytes: int
    count: int | None
    dtype: str
    redop: str
    root: int | None
    out_of_place: Timing | None
    in_place: Timing | None


@dataclass(frozen=True, slots=True)
class NcclDevice:
    rank: int
    host: str
    device: int
    busid: str
    name: str


@dataclass(frozen=True)
class NcclTestsLog:
    source: str
    n_threads: int
    n_gpus: int
    min_bytes: int
    max_bytes: int
    rows: tuple[NcclRow, ...]
    devices: tuple[NcclDevice, ...] = ()
    avg_busbw_gbps: float | None = None
    out_of_bounds: str = ""
    nccl_version: str = ""
    collective: str | None = None
    """From the line nccl-tests 2.13 and later print before the header (``# Collective test
    starting: all_reduce_perf``), else from the file name (``all_reduce_perf...``)."""
    ignored: tuple[int, ...] = field(default=())
    """Lines outside the table that were skipped."""
    rccl: bool = False
    """rccl-tests' output (a ``rccl-tests: Version`` or ``RCCL version`` line): AMD GPUs."""
    n_ranks: int | None = None
    """Ranks in the run where ``devices`` does not list each: nccl-tests' JSON lists one device
    a process."""
    env: tuple[tuple[str, str], ...] = ()
    """The NCCL and RCCL variables the run's environment held (``NCCL_*``, ``RCCL_*``), where
    the log records it: nccl-tests' JSON writes the process environment; a text log, under
    ``NCCL_DEBUG=INFO``, those NCCL says it read (``NCCL_ALGO set by environment to Ring``)."""
    graph: int = 0
    """The header's ``graph:`` (nccl-tests ``-G N``: the timed calls captured in CUDA graphs
    and launched N at a time), 0 where the header does not say."""
    agg_iters: int = 1
    """The header's ``agg iters:`` (``-a``: that many calls grouped into one launch)."""
    cut_short: str = ""
    """Where a log read with ``partial`` ends inside its table (and so which rows it has);
    empty for a whole log."""

    @property
    def ranks(self) -> int | None:
        """Ranks in the run: listed in the ``#  Rank`` lines (or counted from the JSON's
        processes); None when the log lists none."""
        return self.n_ranks or len(self.devices) or None

    def widest_timing(self) -> Timing:
        """The timing with the largest algbw: the most digits of busbw / algbw."""
        timings = [t for r in self.rows for t in (r.out_of_place, r.in_place) if t and t.algbw_gbps > 0]
        if not timings:
            raise ProbeError(f"{self.source}: no row with a non-zero algbw: cannot tell the busbw factor")
        return max(timings, key=lambda t: t.algbw_gbps)

    def busbw_ratio(self) -> float:
        """busbw / algbw of the row with the largest algbw (most digits)."""
        best = self.widest_timing()
        return best.busbw_gbps / best.algbw_gbps


_LOOSE_NAME = re.compile(r"(?<![a-z])(all_?reduce|all_?gather|reduce_?scatter|broadcast|send_?recv|all_?to_?all)"
                         r"(?![a-z])")
"""A test named in a file's name without ``_perf`` (``allgather.log``, ``nccl_reduce_scatter_8gpu.txt``);
``reduce``, ``gather`` and ``scatter`` alone are words of too many names to be read so."""
_CANONICAL = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}
"""nccl-tests' names of the tests ``_LOOSE_NAME`` finds, by their letters (underscores dropped)."""


def looks_like_a_log(path: str | Path) -> bool:
    """Whether a file starts as nccl-tests' output does (its header line, or the ``-J`` file's
    ``config`` and ``results``): a log given where a topology was asked for is said to be one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return ("nThread" in head and "minBytes" in head) or (
        head.lstrip().startswith("{") and '"config"' in head and '"results"' in head)


def collective_from_name(name: str) -> str | None:
    """The collective a file name names (``all_reduce_perf.8xh100.txt`` -> ``all_reduce``; the
    test's binary name anywhere in the path, else one of ``_LOOSE_NAME`` in the file's name)."""
    if m := _NAME.search(name):
        return m.group(1)
    if m := _LOOSE_NAME.search(Path(name).name.lower()):
        letters = m.group(1).replace("_", "")
        return _CANONICAL.get(letters, letters)
    return None


def release_of_code(code: int) -> str:
    """The release NCCL's version code names (22703: ``2.27.3``; before 2.9, 2708: ``2.7.8``);
    empty for none (0)."""
    if code <= 0:
        return ""
    major, rest = divmod(code, 10000 if code >= 20900 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _run_line(line: str) -> tuple[str, str] | None:
    """What an untagged line outside the table says of the run: ``("test", NAME)`` from the
    line nccl-tests 2.13 and later print before the header, ``("release", X.Y.Z)`` from
    nccl-tests 2.17.4's version line (the NCCL it ran with, as a code), ``("version", TEXT)``
    from NCCL's or rccl-tests' ``NCCL version`` / ``RCCL version`` line; None for any other."""
    if m := _STARTING.match(line):
        return "test", m.group(1)
    if m := _LIBRARY.match(line):
        return "release", release_of_code(int(m.group(1)))
    if _VERSION_LINE.match(line):  # not "NCCL versions differ ..."
        return "version", line.split("version", 1)[1].strip(" :")
    return None


def _says_rccl(line: str) -> bool:
    """Whether a line is rccl-tests' or RCCL's own (``rccl-tests: Version``, ``RCCL version``)."""
    return line.lstrip("# ").startswith(("rccl-tests", "RCCL version"))


def _num(text: str, source: str, lineno: int, what: str, *, integer: bool = False) -> float | None:
    if text == "N/A":
        return None
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise fail(source, lineno, f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise fail(source, lineno, f"{what} {text!r} is not finite")
    return value


@dataclass(frozen=True, slots=True)
class _Layout:
    """A table's columns: the prefix (size count type ...), then ``groups`` placements of time,
    algbw, busbw and #wrong, each followed by ``-I 1``'s figures or not, then ``-S 1``'s
    timestamp or not."""

    prefix: list[str]
    groups: int
    counts: bool | None = None
    """The last of each group counts wrong elements (``#wrong``); False: an old version's
    largest error (``error``); None: no header is known (told apart by the figure)."""
    per_iter: bool = False
    timestamp: bool = False

    @property
    def group_width(self) -> int:
        return 4 + len(_PER_ITER) * self.per_iter

    @property
    def width(self) -> int:
        return len(self.prefix) + self.groups * self.group_width + 2 * self.timestamp


def _columns(line: str, source: str, lineno: int) -> _Layout:
    """The layout a column header names."""
    tokens = line.lstrip("#").split()
    if "cputime" in tokens:
        # -C 1 prints the host's time to launch the calls there; its algbw/busbw are still GPU time's.
        raise fail(source, lineno, "the time column is 'cputime' (nccl-tests -C 1): the host's time to launch the "
                   "calls, not the GPU time the model predicts; rerun without -C 1")
    first = tokens.index("time")
    prefix, rest = tokens[:first], tokens[first:]
    if not prefix or prefix[0] not in ("size", "bytes"):
        raise fail(source, lineno, f"column header starts with {prefix[:1]}, expected size/bytes")
    timestamp = rest[-1:] == ["timestamp"]
    rest = rest[:-1] if timestamp else rest
    per_iter = _PER_ITER[0] in rest
    width = 4 + len(_PER_ITER) * per_iter
    if len(rest) % width or len(rest) // width not in (1, 2):
        raise fail(source, lineno, f"column header has {len(rest)} timing columns, expected {width} or {2 * width}")
    for g in range(len(rest) // width):
        group = rest[width * g: width * g + width]
        if group[:3] != ["time", "algbw", "busbw"] or group[3] not in _ERR_COLS or group[4:] != _PER_ITER[:width - 4]:
            raise fail(source, lineno, f"timing columns {group} are not time/algbw/busbw/#wrong"
                       + ("/i_min/i_max/i_p99/i_cv%" if per_iter else ""))
    return _Layout(prefix, len(rest) // width, rest[3] in ("#wrong", "wrong"), per_iter, timestamp)


# nccl-tests' and rccl-tests' names of the data types (the column before redop).
_TYPE_NAMES = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
                         "f8e4m3", "f8e5m2", "fp8_e4m3", "fp8_e5m2"})


def _row(parts: list[str], layout: _Layout, source: str, lineno: int) -> NcclRow:
    """One table row, read by its table's layout."""
    prefix = layout.prefix
    width = layout.width
    if len(parts) == width - 1 and "redop" in prefix:
        at = prefix.index("redop")
        if parts[at - 1] in _TYPE_NAMES and re.fullmatch(r"[\d.]+", parts[at]):
            # Old versions print alltoall's operation as an empty name: the column is there, blank.
            parts = [*parts[:at], "", *parts[at:]]
    if len(parts) != width:
        raise fail(source, lineno, f"row has {len(parts)} fields, the table has {width} columns: damaged or truncated")
    if layout.timestamp:
        if not (_DATE.fullmatch(parts[-2]) and _CLOCK.fullmatch(parts[-1])):
            raise fail(source, lineno, f"row ends {' '.join(parts[-2:])!r}, not the timestamp (YYYY-MM-DD hh:mm:ss) "
                       "its header names: columns shifted or values damaged")
        parts = parts[:-2]
    cells = dict(zip(prefix, parts, strict=False))
    size = _num(cells.get("size", cells.get("bytes", "")), source, lineno, "size", integer=True)
    if size is None or size < 0:
        raise fail(source, lineno, f"size {parts[0]!r} is not a byte count")
    count_text = cells.get("count", cells.get("N"))
    count = _num(count_text, source, lineno, "count", integer=True) if count_text is not None else None
    root_text = cells.get("root")
    root = _num(root_text, source, lineno, "root", integer=True) if root_text is not None else None
    timings: list[Timing | None] = []
    for g in range(layout.groups):
        at = len(prefix) + layout.group_width * g
        t, alg, bus, err = parts[at: at + 4]
        values = [_num(v, source, lineno, w) for v, w in ((t, "time"), (alg, "algbw"), (bus, "busbw"))]
        for v, w in zip(parts[at + 4: at + layout.group_width], _PER_ITER, strict=False):
            _num(v, source, lineno, w)  # read past, but a damaged figure is still damage
        # Old versions print the largest numerical error there ("error", e.g. 5e-07), not a count;
        # a count is printed %g: past 999,999 wrong elements it reads 1.23457e+06.
        if layout.counts:
            wrong = _num(err, source, lineno, "#wrong")
        else:
            wrong = None if any(c in err for c in ".eE") and err != "N/A" else _num(err, source, lineno, "#wrong")
        if all(v is None for v in values):
            timings.append(None)
            continue
        if any(v is None for v in values):
            raise fail(source, lineno, "time, algbw and busbw must be all numbers or all N/A")
        timings.append(_timing(int(size), *values, wrong, f"{source}:{lineno}"))
    return NcclRow(lineno, int(size), count, cells.get("type", ""), cells.get("redop", cells.get("op", "")),
                   root, timings[0], timings[1] if layout.groups > 1 else None)


def _timing(size: int, time_us: float, algbw: float, busbw: float, wrong: float | None, at: str) -> Timing:
    """One placement's figures, checked; ``at``: where they are (``file:line``, or a JSON path)."""
    if time_us <= 0 or algbw < 0 or busbw < 0:
        raise ProbeError(f"{at}: time {time_us:g} must be > 0 and bandwidths >= 0")
    expect = size / time_us / 1e3
    if abs(algbw - expect) > 0.02 * expect + 0.011:
        raise ProbeError(f"{at}: algbw {algbw:g} GB/s but size/time = {expect:.3f} GB/s: columns shifted or values "
                         "damaged")
    return Timing(time_us, algbw, busbw, wrong)


def parse_nccl_tests(text: str, source: str = "nccl-tests log", path: str | None = None,
                     partial: bool = False) -> NcclTestsLog:
    """Read one nccl-tests run (see the module docstring for what is checked).

    Args:
        text: the program's output, or the JSON file its ``-J`` writes (told by a leading ``{``
            or a ``.json`` name).
        source: the log's name (its file's); a name like ``all_reduce_perf*`` sets ``collective``.
        path: the file as the user gave it, which errors name (default ``source``).
        partial: take the whole rows of a log that ends inside its table (a run that
            stopped early), saying so in ``cut_short``, instead of refusing it.

    Returns:
        The parsed log.

    Raises:
        ProbeError: the log is damaged, truncated, or not nccl-tests output.
    """
    shown = path or source
    if not text.strip():
        raise fail(shown, None, "the file is empty")
    json_named = Path(source).suffix.lower() == ".json" and "nThread" not in text
    if text.lstrip().startswith("{") or json_named:  # a text log named .json is read as text
        from treeattn.calibrate.nccl_tests_json import parse_nccl_tests_json

        return parse_nccl_tests_json(text, source, shown, partial)
    lines = text.splitlines()
    header: re.Match | None = None
    header_line = 0
    by_bytes = False  # the header steps sizes by bytes (-i): a size may print twice
    devices: list[NcclDevice] = []
    ignored: list[int] = []
    layout: _Layout | None = None
    rccl = False
    rows: list[NcclRow] = []
    avg: float | None = None
    oob = version = info_version = after_version = ""
    info_env: dict[str, str] = {}
    named = None
    reduced: int | None = None
    avg_line, avg_cut = 0, False
    cut = ""
    state = "pre"
    last_line = max((i for i, raw in enumerate(lines, 1) if raw.strip()), default=0)
    for lineno, raw in enumerate(lines, 1):
        # Untagged, so that a tagged header or second run is seen as one (not skipped as noise).
        line = _TAG.sub("", raw, count=1).strip()
        if not line:
            continue
        rccl = rccl or _says_rccl(line)  # wherever it is printed
        said = _run_line(line)
        if "NCCL INFO" in line or "NCCL WARN" in line:  # anywhere, a comm made after the table's included
            if m := _INFO_VERSION.search(line):
                info_version = info_version or m.group(1)
            elif m := _INFO_ENV.search(line):
                info_env.setdefault(m.group(1), _INFO_INT.sub(r"\1", m.group(2).strip()))
            ignored.append(lineno)
            continue
        if state == "done":
            if _HEADER.match(line):
                raise fail(shown, lineno, "a second run starts here; give one run per file")
            if said and said[0] in ("release", "version"):  # printed at the end by some harnesses
                after_version = after_version or said[1]
            if line != "#":
                ignored.append(lineno)
            continue
        if state == "pre":
            if m := _HEADER.match(line):
                header, header_line, state = m, lineno, "head"
                by_bytes = _steps_bytes(m)
            else:
                if said and said[0] == "test":
                    named = collective_from_name(said[1])
                elif said and said[0] in ("release", "version"):
                    version = version if version and said[0] == "release" else said[1]
                ignored.append(lineno)
            continue
        if state == "head":
            if m := _DEVICE.match(line):
                devices.append(NcclDevice(int(m.group(1)), m.group(4), int(m.group(5)), m.group(6), m.group(7)))
            elif line.startswith("#") and _names_columns(line):
                layout = _columns(line, shown, lineno)
                state = "table"
            elif said and said[0] == "version":
                version = said[1]
            elif m := _REDUCED.match(line):
                reduced = int(m.group(1))
            elif _HEADER.match(line):
                raise fail(shown, lineno, f"a second header before any table (first on line {header_line}): a "
                                          f"retried job? delete lines {header_line}-{lineno - 1} to read the second")
            elif not line.startswith("#"):
                ignored.append(lineno)
            continue
        # state == "table"
        if line.startswith("#"):
            if _HEADER.match(line):  # the first run's table has no end: it was cut, and another follows
                first = (f"the first run (header on line {header_line}) has no row: a retried job? delete lines "
                         f"{header_line}-{lineno - 1} to read the second" if not rows else
                         f"inside the first's table (its header on line {header_line}, no '# Avg bus bandwidth' "
                         "line between); give one run per file")
                raise fail(shown, lineno, f"a second run starts here, {first}")
            body = line.lstrip("#").strip()
            if body.startswith("Out of bounds values"):
                oob = body.split(":", 1)[-1].strip()
            elif _is_avg_line(line):
                # With NCCL_TESTS_MIN_BW set, nccl-tests follows the figure with its verdict (OK / FAILED).
                figure = body.split(":", 1)[-1].split()
                text = figure[0] if figure and ":" in body else ""
                avg_line = lineno
                if lineno == last_line and (not text or _cut_figure(text, rows)):
                    # The file ends on this line, its figure missing or not the rows' mean: cut in it.
                    avg_cut = True
                else:
                    avg = _num(text, shown, lineno, "average bus bandwidth")
                state = "done"
            continue
        assert layout is not None
        parts = line.split()
        if not _begins_as_a_row(parts):
            ignored.append(lineno)
            continue
        try:
            row = _row(parts, layout, shown, lineno)
        except ProbeError:
            # The table's last row, nothing of the table after it: a run that stopped mid-row, whether
            # the cut left fewer fields or half of one (a trailing N/A, -S's timestamp), or the run
            # failed there (nccl-tests prints a row's size and type before it runs the size, and
            # "Test NCCL failure" after them or on lines of their own; a scheduler's line may follow).
            if _table_ends_at(lines, lineno):
                if not (partial and rows):
                    raise fail(shown, lineno, _cut_short("the log ends inside a row", rows)) from None
                cut = f"line {lineno}: ends inside a row"
                break
            raise
        if rows and out_of_order(row.size_bytes, rows[-1].size_bytes, by_bytes):
            raise fail(shown, lineno, f"size {row.size_bytes} after {rows[-1].size_bytes} (line {rows[-1].line}): "
                       "rows out of order or two runs mixed")
        rows.append(row)
    if header is None:
        for lineno, raw in enumerate(lines, 1):
            # The header behind a prefix no launcher this reads writes (pdsh's "host: ", a logger's fields).
            if (at := raw.find("#", 0, 200)) > 0 and _HEADER.match(raw[at:].strip()):
                raise fail(shown, lineno, f"nccl-tests' header follows {raw[:at].strip()!r}: its lines carry a "
                                          "prefix this reader does not strip; remove it from every line")
        raise fail(shown, None, "no '# nThread N nGpus M minBytes ... maxBytes ...' header: not nccl-tests output")
    if state == "head":
        raise fail(shown, len(lines), "no table header (# size count type ... time algbw busbw): truncated?")
    if not rows:
        raise fail(shown, len(lines), "the table has no rows")
    if avg_cut:
        if not partial:
            raise fail(shown, avg_line, _cut_short("the log ends inside its '# Avg bus bandwidth' line (its figure "
                                                   "cut short)", rows))
        cut = f"line {avg_line}: ends inside the '# Avg bus bandwidth' line"
    if state != "done" and not cut:
        if not partial:
            raise fail(shown, len(lines), _cut_short("the log ends inside the table (no '# Avg bus bandwidth' "
                                                     "line)", rows))
        cut = f"line {len(lines)}: ends inside the table (no '# Avg bus bandwidth' line)"
    if cut:
        cut += f", after {_whole_rows(rows)}"
    max_bytes = int(header.group(4)) if reduced is None else min(int(header.group(4)), reduced)
    graph, agg = _HEADER_GRAPH.search(header.group(5)), _HEADER_AGG.search(header.group(5))
    log = NcclTestsLog(
        source=shown, n_threads=int(header.group(1)), n_gpus=int(header.group(2)),
        min_bytes=min(int(header.group(3)), max_bytes), max_bytes=max_bytes, rows=tuple(rows),
        devices=tuple(devices),
        avg_busbw_gbps=avg, out_of_bounds=oob, nccl_version=version or info_version or after_version,
        collective=named or collective_from_name(source), ignored=tuple(ignored), rccl=rccl,
        env=tuple(sorted(info_env.items())), graph=int(graph.group(1)) if graph else 0,
        agg_iters=int(agg.group(1)) if agg else 1, cut_short=cut,
    )
    ranks = [d.rank for d in log.devices]
    if ranks and ranks != list(range(len(ranks))):
        raise fail(shown, header_line, f"'#  Rank' lines list ranks {ranks[:8]}..., not 0..{len(ranks) - 1}")
    step = _STEP.search(header.group(5))
    _check(log, (int(step.group(1)), step.group(2)) if step else None, lambda n: f"{shown}:{n}" if n else shown)
    return log


def launch_notes(log: NcclTestsLog) -> list[str]:
    """How a log's header says its calls were launched, where not each on its own, as
    nccl-tests' loop does by default and the model times them: as CUDA graphs (``graph: N``,
    nccl-tests ``-G``) or grouped into one launch (``agg iters: N``, ``-a``); its small sizes,
    which the launches set, then run faster than such a loop."""
    out = []
    if log.graph:
        out.append(f"its calls ran as CUDA graphs (graph: {log.graph}, nccl-tests -G)")
    if log.agg_iters > 1:
        out.append(f"{log.agg_iters} calls a launch (agg iters: {log.agg_iters}, nccl-tests -a)")
    return out


def out_of_order(size: int, prev: int, by_bytes: bool) -> bool:
    """Whether a row's size may not follow the previous row's in one run. Sizes under one element
    a rank print as 0, several times (all-gather, reduce-scatter); a byte step (``by_bytes``)
    under nccl-tests' rounding (16 bytes a rank, all-gather's) prints a size twice."""
    return size < prev or size == prev != 0 and not by_bytes


def _steps_bytes(header: re.Match) -> bool:
    """Whether a run's header steps its sizes by bytes (``-i``), not by a factor."""
    step = _STEP.search(header.group(5))
    return step is not None and step.group(2) == "bytes"


def _table_ends_at(lines: list[str], lineno: int) -> bool:
    """Whether nothing of a table follows line ``lineno`` (1-based): no row, no '# Avg bus
    bandwidth' line, no second header; launcher, scheduler and NCCL lines may."""
    for raw in lines[lineno:]:
        line = _TAG.sub("", raw, count=1).strip()
        if _begins_as_a_row(line.split()) or _HEADER.match(line) or _is_avg_line(line):
            return False
    return True


def _is_avg_line(line: str) -> bool:
    """Whether an (untagged, stripped) line is the table's '# Avg bus bandwidth' line, its end."""
    return line.startswith("#") and line.lstrip("#").strip().startswith("Avg bus bandwidth")


def _rows_busbw_mean(rows: list[NcclRow] | tuple[NcclRow, ...]) -> float:
    """The mean of every busbw the rows print: what nccl-tests' '# Avg bus bandwidth' gives."""
    bus = [t.busbw_gbps for r in rows for t in (r.out_of_place, r.in_place) if t]
    return sum(bus) / len(bus) if bus else math.nan


def _avg_differs(avg: float, mean: float) -> bool:
    return abs(mean - avg) > 0.005 * avg + 0.01


def _cut_figure(text: str, rows: list[NcclRow]) -> bool:
    """Whether an average bus bandwidth figure on a log's last line reads as cut: none, or the
    first digits of the rows' mean but not that mean (``4`` of 439.37); another figure is one
    altered, which the checks refuse as such."""
    if not text:
        return True
    mean = _rows_busbw_mean(rows)
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(mean) and _avg_differs(value, mean) and f"{mean:.6f}".startswith(text)


def _cut_short(what: str, rows: list[NcclRow]) -> str:
    """A log that ends inside its table: what, and the whole rows before."""
    if not rows:
        return f"{what}: truncated? no whole row before it"
    return f"{what}: truncated? {_whole_rows(rows, 'before it, ')} (line {rows[-1].line}); --partial takes them"


def _whole_rows(rows: list[NcclRow], where: str = "") -> str:
    """``N whole rows [where]up to SIZE``: what a log cut short holds."""
    return f"{len(rows)} whole row{'s' if len(rows) > 1 else ''} {where}up to {format_size(rows[-1].size_bytes)}"


def _begins_as_a_row(parts: list[str]) -> bool:
    """Whether a line's fields begin as a table row's: a size (a whole number) and a count (or
    old versions' bytes and N) that starts with a digit, so a row whose count is damaged
    (``262l44``) is still read, and refused where it is; ``8 more processes have sent help
    message ...``, ``[host:1234] ...`` and a logger's ``2025-06-11 12:00:01 ...`` are not rows.
    A row whose size is damaged is read past: a log's sizes are then short of its header's
    (refused there), a published table's are not checked so."""
    return len(parts) >= 2 and parts[0].isdigit() and parts[1][:1].isdigit()


def _names_columns(line: str) -> bool:
    """Whether a ``#`` line is the column header (``-C 1`` names the time column ``cputime``)."""
    tokens = line.split()
    return "algbw" in tokens and ("time" in tokens or "cputime" in tokens)


def step_sizes(min_bytes: int, max_bytes: int, step: tuple[int, str]) -> list[int]:
    """The sizes nccl-tests' loop runs from ``min_bytes`` to ``max_bytes`` by ``step`` (a factor
    or bytes, ``(value, kind)``), before each test rounds them (at most 10,000; a factor of 1,
    which nccl-tests prints as a byte step, gives one)."""
    value, kind = step
    sizes, size = [], min_bytes
    while size <= max_bytes and len(sizes) < 10_000:
        sizes.append(size)
        if kind == "factor" and value <= 1:  # -i 0 repeats minBytes until stopped: so do these
            break
        size = size * value if kind == "factor" else size + value
    return sizes


def _check(log: NcclTestsLog, step: tuple[int, str] | None, where: Callable[[int | None], str]) -> None:
    """Refuse what the rows disagree with; ``step``: the size step and its kind (``factor`` or
    ``bytes``); ``where``: the place of a row's ``line`` (None: the file) in an error, which
    names the file as the user gave it."""
    if step and log.min_bytes > 0:
        value, kind = step
        sizes = step_sizes(log.min_bytes, log.max_bytes, step)
        if not log.cut_short and len(log.rows) != len(sizes):
            raise ProbeError(f"{where(log.rows[-1].line)}: {len(log.rows)} rows, but minBytes {log.min_bytes} .. "
                             f"maxBytes {log.max_bytes} by step {value}({kind}) gives {len(sizes)}: rows missing or "
                             "added")
        # A size prints rounded down, never up, by less than its rounding unit (``_rounding_unit``):
        # a row printing more than its place's size follows a missing row, one printing less an
        # added one; a size printed twice (a byte step under the unit) is in its place.
        ranks = log.ranks or (_ranks_from_counts(log.collective, log) if log.collective else None)
        for j, row in enumerate(log.rows):
            unit = _rounding_unit(log.collective, row, ranks)
            if unit is not None:
                low = sizes[j] - unit if j < len(sizes) else 0
            elif not log.cut_short:
                continue  # unknown unit: a whole log's row count is its check
            elif kind == "bytes" and 0 < j and row.size_bytes == log.rows[j - 1].size_bytes:
                low = row.size_bytes - 1
            else:
                low = sizes[j - 1] if 0 < j <= len(sizes) and row.size_bytes > 0 else -1
            if j >= len(sizes) or row.size_bytes > sizes[j] or row.size_bytes <= low:
                raise ProbeError(f"{where(row.line)}: row {j + 1} prints {row.size_bytes} bytes, but minBytes "
                                 f"{log.min_bytes} by step {value}({kind}) gives "
                                 f"{sizes[j] if j < len(sizes) else 'no more sizes'} there: rows missing or "
                                 "added")
    ratios = [(t.busbw_gbps / t.algbw_gbps, r.line) for r in log.rows for t in (r.out_of_place, r.in_place)
              if t and t.algbw_gbps >= 1.0]
    if ratios:
        ref = log.busbw_ratio()
        for ratio, line in ratios:
            if abs(ratio - ref) > 0.01 * ref + 0.006:
                raise ProbeError(f"{where(line)}: busbw/algbw = {ratio:.4f} here but {ref:.4f} in the largest row: "
                                 "values damaged or columns swapped")
    if log.avg_busbw_gbps is not None:
        mean = _rows_busbw_mean(log.rows)
        if _avg_differs(log.avg_busbw_gbps, mean):
            raise ProbeError(f"{where(None)}: the average bus bandwidth says {log.avg_busbw_gbps:g} but the rows "
                             f"average {mean:.3f}: rows missing or altered")


# Fields of a row -> (prefix fields, timing groups): size count type, then redop and/or root.
_LAYOUTS = {7: (3, 1), 8: (4, 1), 9: (5, 1), 11: (3, 2), 12: (4, 2), 13: (5, 2)}


def _published_prefix(parts: list[str], n: int) -> list[str]:
    if n == 4:  # old versions print either the reduction (all-reduce) or the root (broadcast) there
        return ["size", "count", "type", "root" if parts[3].lstrip("-").isdigit() else "redop"]
    return ["size", "count", "type", "redop", "root"][:n]


def parse_published_table(text: str, source: str, lines: tuple[int, int] | None = None,
                          collective: str | None = None) -> NcclTestsLog:
    """Read one nccl-tests / rccl-tests table as published (see the module docstring).

    Args:
        text: the published text (a log, a README excerpt, an issue comment).
        source: name for messages and the result's ``source``.
        lines: 1-based inclusive line range holding the table; None: the whole text.
        collective: the collective the caller takes the table for; a ``Collective test
            starting`` line in the range that names another is refused.

    Returns:
        An NcclTestsLog with the rows (header fields 0 when the text has no header line).

    Raises:
        ProbeError: no rows, a row that does not fit the table's columns, an unreadable number,
            algbw that is not size/time, busbw/algbw ratios that disagree, sizes out of order,
            a test named other than ``collective``.
    """
    all_lines = text.splitlines()
    first, last = lines if lines is not None else (1, len(all_lines))
    if not 1 <= first <= last <= len(all_lines):
        raise fail(source, None, f"lines {first}-{last} are not inside the text ({len(all_lines)} lines)")
    header: re.Match | None = None
    layout: _Layout | None = None
    rows: list[NcclRow] = []
    version = coded = ""
    named: str | None = None
    rccl = False
    for lineno in range(first, last + 1):
        line = _TAG.sub("", all_lines[lineno - 1], count=1).strip()
        if not line:
            continue
        rccl = rccl or _says_rccl(line)
        said = _run_line(line)
        if said and said[0] == "test":
            named = collective_from_name(said[1])
            if collective is not None and named is not None and named != collective:
                raise fail(source, lineno, f"the run names its test {said[1]}, not {collective}")
            continue
        if said:
            if said[0] == "release":
                coded = said[1]
            else:
                version = said[1]
            continue
        if line.startswith("#"):
            if m := _HEADER.match(line):
                header = m
            elif _names_columns(line):
                layout = _columns(line, source, lineno)
            continue
        parts = line.split()
        if not _begins_as_a_row(parts):
            continue
        if layout is not None:
            row = _row(parts, layout, source, lineno)
        else:
            fields = _LAYOUTS.get(len(parts))
            if fields is None:
                raise fail(source, lineno, f"row has {len(parts)} fields; a table row has 7-9 or 11-13")
            row = _row(parts, _Layout(_published_prefix(parts, fields[0]), fields[1]), source, lineno)
        if row.size_bytes == 0:
            continue
        if rows and row.size_bytes <= rows[-1].size_bytes:
            raise fail(source, lineno, f"size {row.size_bytes} after {rows[-1].size_bytes} (line {rows[-1].line}): "
                       "rows out of order or two tables in one range")
        rows.append(row)
    if not rows:
        raise fail(source, first, f"no table rows in lines {first}-{last}")
    log = NcclTestsLog(
        source=source, n_threads=int(header.group(1)) if header else 0, n_gpus=int(header.group(2)) if header else 0,
        min_bytes=rows[0].size_bytes, max_bytes=rows[-1].size_bytes, rows=tuple(rows), nccl_version=version or coded,
        collective=named or collective_from_name(source), rccl=rccl,
    )
    _check(log, None, lambda n: f"{source}:{n}" if n else source)  # no step, no average: the ratios
    return log


def printed_version(log: NcclTestsLog) -> str:
    """The release in the ``NCCL version`` (or rccl-tests' ``RCCL version``: ``log.rccl``) line
    a table prints; empty when it prints none."""
    printed = re.match(r"\d+\.\d+\.\d+", log.nccl_version)
    return printed.group(0) if printed else ""


def read_nccl_tests(path: str | Path, partial: bool = False) -> NcclTestsLog:
    """Read and parse a saved nccl-tests log file (``partial``: as ``parse_nccl_tests``)."""
    p = Path(path)
    return parse_nccl_tests(read_input(p, "nccl-tests"), p.name, str(p), partial)


def calibrate_from_log(
    log: NcclTestsLog,
    *,
    collective: str | None = None,
    ranks: int | None = None,
    likely: int | None = None,
    placement: str = "min",
    min_bytes: int = 1,
    max_bytes: int | None = None,
    weighting: Weighting = Weighting.RELATIVE,
) -> CollectiveFit:
    """Fit per-step latency and per-link bandwidth to a log (model in ``treeattn.calibrate.fit``).

    Args:
        log: a parsed log.
        collective, ranks, likely: as ``log_run`` takes them.
        placement: ``out`` (out-of-place), ``in`` (in-place) or ``min`` (the faster of the two
            per size, less sensitive to one-off stalls).
        min_bytes: smallest size used (0-byte rows are always left out).
        max_bytes: largest size used (default all).
        weighting: see ``treeattn.calibrate.fit.Weighting``.

    Returns:
        The fit; its warnings say what was inferred and which rows were left out.

    Raises:
        ProbeError: the collective or rank count cannot be known or disagrees with busbw/algbw,
            or fewer than two sizes remain.
    """
    name, n, inferred = log_run(log, collective, ranks, likely)
    notes = list(inferred)
    if placement not in ("out", "in", "min"):
        raise ProbeError(f"placement must be out, in or min, got {placement!r}")
    sizes, times, wrong = [], [], []
    for r in log.rows:
        if r.size_bytes < max(min_bytes, 1) or (max_bytes is not None and r.size_bytes > max_bytes):
            continue
        options = {"out": [r.out_of_place], "in": [r.in_place], "min": [r.out_of_place, r.in_place]}[placement]
        good = [t for t in options if t is not None and not t.wrong]
        if any(t is not None and t.wrong for t in options):
            wrong.append(r.size_bytes)
        if good:
            sizes.append(r.size_bytes)
            times.append(min(t.time_us for t in good))
    if wrong:
        notes.append(f"timings with validation errors (#wrong > 0) left out at sizes {wrong}")
    if len(set(sizes)) < 2:  # a size printed twice (a byte step under the rounding unit) is one
        raise ProbeError(f"{log.source}: {len(set(sizes))} usable size(s) in the chosen range; need at least 2")
    result = fit_collective(sizes, times, name, n, weighting=weighting)
    return CollectiveFit(result.collective, result.ranks, result.fit, result.alpha_step_us, result.beta_link_gbps,
                         result.model, result.points, result.size_range, tuple(notes) + result.warnings)


def log_run(log: NcclTestsLog, collective: str | None = None, ranks: int | None = None,
            likely: int | None = None) -> tuple[str, int, tuple[str, ...]]:
    """Which collective made ``log`` and on how many ranks, checked against its busbw/algbw.

    Args:
        log: a parsed log.
        collective: which test made it; default the log's (its printed test name or file name), else
            ``all_reduce`` when busbw > algbw (only all-reduce has a factor above 1).
        ranks: ranks in the run; default the ``#  Rank`` lines, else solved from busbw/algbw.
        likely: the ranks of the machine the log is read onto (its topology's), taken where
            busbw/algbw, as printed, allows it as well as the count it solves to.

    Returns:
        (collective, ranks, notes saying what was inferred).

    Raises:
        ProbeError: the collective or rank count cannot be known or disagrees with busbw/algbw.
    """
    notes: list[str] = []
    ratio = log.busbw_ratio()
    name = collective or log.collective
    if name is None:
        if ratio <= 1.0 + 1e-3:
            raise ProbeError(f"{log.source}: say which collective made this log (busbw/algbw = {ratio:.4f} fits "
                             "several): keep the '# Collective test starting' line nccl-tests prints, or name "
                             "the file like all_gather_perf.txt")
        name = "all_reduce"
        notes.append("collective taken as all_reduce (busbw > algbw)")
    model = COLLECTIVE_MODELS.get(name)
    if model is None:
        known = ", ".join(COLLECTIVE_MODELS)
        raise ProbeError(f"{log.source}: no model of a {name} test (the models cover {known})")
    n = ranks or log.ranks
    if n is None and (n := _ranks_from_counts(name, log)) is not None:
        notes.append(f"{n} ranks solved from the rows' size / (count x element size) (no '#  Rank' lines)")
    if n is None:
        n = _ranks_from_ratio(name, ratio)
        # a factor the same at every count (broadcast, reduce, sendrecv) says nothing of it
        telling = model.busbw_factor(2) != model.busbw_factor(4)
        wide = _ratio_range(name, log, likely) if telling and likely is not None and likely >= 2 and likely != n \
            else None
        if wide is not None:
            # the machine the user names decides where the printed figures cannot
            upto = f"-{wide[1]}" if wide[1] is not None else " or more"
            notes.append(f"{likely} ranks, the topology's: busbw/algbw = {ratio:.4f}, to the digits the log prints, "
                         f"allows {wide[0]}{upto} (no '#  Rank' lines; a run on fewer ranks: select them with "
                         "[ranks ...])")
            n = likely
        elif n is None:
            raise ProbeError(f"{log.source}: no '#  Rank' lines and busbw = algbw for {name}: the rank count is "
                             "unknown; keep the '#  Rank' lines nccl-tests prints")
        else:
            notes.append(f"{n} ranks solved from busbw/algbw = {ratio:.4f} (no '#  Rank' lines)")
    if n < 2:
        raise ProbeError(f"{log.source}: a run on one rank: nccl-tests times a copy inside one GPU, which moves "
                         "nothing between ranks; the model has nothing of it to predict or fit")
    want = model.busbw_factor(n)
    # within the digits the log prints (small sizes' 0.0x GB/s say little), or close to them
    if abs(ratio - want) > 0.01 * want + 0.006 and _ratio_range(name, log, n) is None:
        raise ProbeError(f"{log.source}: busbw/algbw = {ratio:.4f}, but {name} over {n} ranks gives {want:.4f}: "
                         "the collective or the rank count is not what the log was made with")
    per_process = max(1, log.n_threads) * max(1, log.n_gpus)
    if per_process > n:
        raise ProbeError(f"{log.source}: the header's nThread {log.n_threads} x nGpus {log.n_gpus} = {per_process} "
                         f"ranks a process, but the run has {n} ranks: the header is damaged or another run's")
    return name, n, tuple(notes)


_PER_RANK_COUNT = ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter")
"""Tests whose count column is a rank's share: nccl-tests prints size = count x ranks x the
element's bytes (an all-gather's, reduce-scatter's, gather's or scatter's one rank's part, an
alltoall's one peer's; ``src/*.cu`` ``GetCollByteCount``)."""


def _rounding_unit(name: str | None, row: NcclRow, ranks: int | None) -> int | None:
    """The bytes a row's size may print under its place's (nccl-tests' ``GetCollByteCount``):
    a whole element (all-reduce, broadcast, reduce, sendrecv); for the tests of a rank's share
    (``_PER_RANK_COUNT``, hypercube, and an unknown test) 16 bytes a rank, 4 elements a rank in
    nccl-tests 2.13.4-2.16 (32 bytes of doubles). None where the element or the ranks it needs
    are not known, and for alltoallv."""
    elem = REDUCTION_DTYPES.get(dtype_name(row.dtype)) if row.dtype else None
    if name is None or name in (*_PER_RANK_COUNT, "hypercube"):
        return max(16, 4 * (elem or 8)) * ranks if ranks else None
    # alltoallv prints its largest rank's bytes, which may pass its place's size: no unit
    return elem if name in ("all_reduce", "broadcast", "reduce", "sendrecv") else None


def _ranks_from_counts(name: str, log: NcclTestsLog) -> int | None:
    """The ranks every row's size, count and data type agree on (``_PER_RANK_COUNT``), exact where
    busbw/algbw, printed to two decimals, cannot tell 79 ranks from 80; None where they do not
    determine it (another test, an unknown type, rows that disagree). Rows of size 0 (nccl-tests
    prints them for sizes under 16 bytes a rank) say nothing and are passed over."""
    if name not in _PER_RANK_COUNT:
        return None
    got = set()
    for r in log.rows:
        if r.size_bytes == 0:
            continue
        elem = REDUCTION_DTYPES.get(dtype_name(r.dtype)) if r.dtype else None
        if not r.count or elem is None or r.size_bytes % (r.count * elem):
            return None
        got.add(r.size_bytes // (r.count * elem))
    return got.pop() if len(got) == 1 and min(got) >= 2 else None


def _ranks_from_ratio(name: str, ratio: float) -> int | None:
    """Invert the busbw factor: 2(n-1)/n = f gives n = 2/(2-f); (n-1)/n = f gives n = 1/(1-f)."""
    if name == "all_reduce" and ratio < 2:
        return max(2, round(2 / (2 - ratio)))
    if COLLECTIVE_MODELS[name].busbw_factor(4) < 1 and ratio < 1:
        return max(2, round(1 / (1 - ratio)))
    return None


def _ratio_range(name: str, log: NcclTestsLog, near: int) -> tuple[int, int | None] | None:
    """The rank counts around ``near`` whose busbw factor gives ``log``'s busbw/algbw within the
    two decimals nccl-tests prints them to (its largest row's): past a hundred ranks or so, or
    where a log has small sizes only, several do. (lowest, highest; None: no end within 4 times
    ``near``); None where ``near`` does not give it."""
    best = log.widest_timing()
    factor = COLLECTIVE_MODELS[name].busbw_factor

    def fits(n: int) -> bool:  # the printed figures are within 0.005 of the true ones
        return abs(best.busbw_gbps - factor(n) * best.algbw_gbps) <= 0.005 * (1 + factor(n)) + 1e-9

    if not fits(near):
        return None
    lo, hi = near, near
    while lo > 2 and fits(lo - 1):
        lo -= 1
    while fits(hi + 1):
        hi += 1
        if hi > 4 * near:
            return lo, None
    return lo, hi
