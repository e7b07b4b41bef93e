"""The corpus of published nccl-tests / rccl-tests tables (``results/published/``).

Each source is a text file, the tables as published (``NAME.txt``), and a mapping file
(``NAME.yaml``) saying where the text comes from and, per table, which lines hold it, which
collective made it, on how many ranks, with which NCCL environment, and which topology
(a shipped name, a family spec, either with a rank selection) stands for the machine:

    source: https://github.com/NVIDIA/nccl-tests/issues/309
    retrieved: issue text as of 2025-06-19
    hardware: ...            # free text, kept for SOURCES.md
    library: NCCL 2.26.2
    library_version:         # the library's release, as data (a table may give its own)
      library: NCCL          # NCCL or RCCL
      version: "2.26.2"      # a release, a series "2.26", a bound "<2.28" / "<=2.27.3", or unknown
      evidence: printed in the table's header
    quality: ...             # what the source says about its own numbers
    cut: ...                 # what was left out when copying
    tables:
      - id: 2node
        lines: [1, 42]       # 1-based, inclusive, in NAME.txt (or in ``file:``)
        collective: all_reduce
        topology: dgx-h100:nodes=2
        ranks: 16            # checked against the table's busbw/algbw
        env: {NCCL_ALGO: Ring}
        scored: false        # optional: kept and predicted, left out of the figures
        why: degraded fabric

An NCCL table's version chooses the NCCL model's release-dependent figures
(``treeattn.topology.nccl_version``: the newest release the version allows). Without a
``library_version`` the version the table prints (``NCCL version ...``, else nccl-tests 2.17.4's
``nccl-library=`` code) is taken, as a log file's would be; ``unknown``,
RCCL tables, tables with neither and releases older than the model's figures (2.19): the
topology's release (by default the newest NCCL the model follows). An older release still
counts where nccl-tests' own host work depends on it (``published.group_launch_us``).

``corpus_dir`` finds the shipped corpus the way ``topologies_dir`` finds the shipped
topologies: ``$TREEATTN_PUBLISHED``, else ``results/published`` in the source tree, else
``<prefix>/share/treeattn/published`` of an installed wheel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from treeattn.calibrate.log_machine import other_devices, other_hosts, other_vendor, selection_like_hosts
from treeattn.calibrate.nccl_tests import (
    NcclTestsLog,
    launch_notes,
    log_run,
    looks_like_a_log,
    parse_published_table,
    printed_version,
    read_nccl_tests,
)
from treeattn.cost.nvls import REDUCTION_DTYPES, dtype_name
from treeattn.errors import InputError, ProbeError
from treeattn.probe.text import read_input
from treeattn.topology.library import installed_data_dir
from treeattn.topology.nccl_version import (
    OLDEST,
    Release,
    allows,
    nccl_release,
    newer_note,
    parse_version,
    version_flag,
    version_text,
)

__all__ = ["COLLECTIVES", "POINT_TO_POINT", "LIBRARIES", "reads_env", "check_env", "PublishedTable", "corpus_dir",
           "is_mapping", "load_corpus", "load_logs", "busbw_factor"]

ENV_DIR = "TREEATTN_PUBLISHED"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "sendrecv", "alltoall")
POINT_TO_POINT = ("sendrecv", "alltoall")
"""Collectives the point-to-point model times (it reads the P2P level alone); the NCCL model the rest."""
_SOURCE_KEYS = {"source", "retrieved", "hardware", "library", "library_version", "quality", "cut", "tables"}
_TABLE_KEYS = {"id", "file", "lines", "collective", "topology", "ranks", "env", "scored", "why", "library_version"}
_VERSION_KEYS = ("library", "version", "evidence")
LIBRARIES = ("NCCL", "RCCL")


def busbw_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` on ``ranks`` ranks."""
    if collective == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True)
class PublishedTable:
    """One published table, parsed and mapped."""

    source_id: str
    """The mapping file's stem."""
    table_id: str
    url: str
    collective: str
    topology: str
    ranks: int
    env: dict[str, str]
    log: NcclTestsLog
    scored: bool = True
    why: str = ""
    meta: dict = field(default_factory=dict)
    """The source's free-text fields (retrieved, hardware, library, quality, cut)."""
    library: str = ""
    """``NCCL`` or ``RCCL`` (``library_version.library``; empty: not given)."""
    version: str = ""
    """The release as the mapping writes it (``library_version.version``; empty: not given)."""
    evidence: str = ""
    """Where the version comes from, or the evidence for its bound."""

    @property
    def nccl_release(self) -> Release | None:
        """The NCCL release the model takes for this table; None where it gives no NCCL version
        (RCCL, ``unknown``, none) or one older than the model's figures (``OLDEST``): the
        topology's own then applies (by default the newest)."""
        release = self.nccl_bound
        return None if release is None or release < OLDEST else release

    @property
    def nccl_bound(self) -> Release | None:
        """The newest NCCL release the table's version allows, older than the model's figures or
        not (what the harness's own costs follow, ``published.group_launch_us``); None where it
        gives no NCCL version."""
        if self.library != "NCCL" or not self.version:
            return None
        return parse_version(self.version)

    @property
    def rccl_release(self) -> Release | None:
        """The RCCL release the table's version gives (None: not RCCL, or no version)."""
        if self.library != "RCCL" or not self.version:
            return None
        return parse_version(self.version)

    @property
    def name(self) -> str:
        return f"{self.source_id}/{self.table_id}"

    def points(self) -> list[tuple[int, float]]:
        """(size in bytes, time in us) per row: the faster of the out-of-place and in-place
        timings (the same operation twice; a one-off stall in one of them is noise), those
        nccl-tests found wrong results in (``#wrong`` > 0) left out, as ``calibrate`` leaves
        them (``validation_note``)."""
        out = []
        for r in self.log.rows:
            if r.size_bytes == 0:  # a saved log's rows under one element per rank: nothing moved
                continue
            times = [t.time_us for t in (r.out_of_place, r.in_place) if t is not None and not t.wrong]
            if times:
                out.append((r.size_bytes, min(times)))
        return out

    def validation_note(self) -> str | None:
        """What the log says of its own results' check: timings with wrong results (left out
        of ``points``), or a trailer saying the check failed; None where neither."""
        wrong = [r.size_bytes for r in self.log.rows
                 if any(t is not None and t.wrong for t in (r.out_of_place, r.in_place))]
        if wrong:
            shown = ", ".join(map(str, wrong[:4])) + (f" and {len(wrong) - 4} more" if len(wrong) > 4 else "")
            return f"timings with validation errors (#wrong > 0) left out at sizes {shown} B"
        if "FAILED" in self.log.out_of_bounds.upper():
            return (f"the log's check failed ('Out of bounds values : {self.log.out_of_bounds}') though no row "
                    "counts wrong elements: its timings are scored as they stand")
        return None

    @property
    def reduction(self) -> tuple[str, str]:
        """(data type, reduction op) as the table's rows print them (nccl-tests' defaults,
        float and sum, where a row leaves them out): NVLink SHARP reduces only some."""
        row = self.log.rows[0] if self.log.rows else None
        dtype = row.dtype if row is not None and row.dtype else "float"
        op = row.redop if row is not None and row.redop not in ("", "none") else "sum"
        return dtype, op

    @property
    def elem_bytes(self) -> int:
        """The bytes of one element of the rows' data type (4, nccl-tests' float, where the
        type is not printed or not one of nccl-tests' and rccl-tests' names): RCCL's MSCCL
        files cover element counts, not bytes."""
        return REDUCTION_DTYPES.get(dtype_name(self.reduction[0]), 4)


def corpus_dir() -> Path | None:
    """The shipped corpus folder (see the module docstring), or None when there is none."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2] / "results" / "published"
    return here if here.is_dir() else installed_data_dir("published")


def is_mapping(path: Path) -> bool:
    """Whether a file is read as a mapping (by its suffix); any other file is a log."""
    return path.suffix.lower() in (".yaml", ".yml")


def _mapping_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if is_mapping(f) and f.is_file())
            if not found:
                raise InputError(f"{p}: no mapping files (*.yaml) in this folder")
            out.extend(found)
        elif is_mapping(p) and p.is_file():
            out.append(p)
        else:
            raise InputError(f"{p}: not a corpus folder or a mapping file (.yaml)")
    return out


def load_corpus(paths: list[str | Path] | None = None) -> list[PublishedTable]:
    """Parse and map every table of the given folders or mapping files (default: the shipped corpus).

    Raises:
        InputError: a path that is neither, a mapping file that does not follow the format
            (the message names the file and field), a table whose busbw/algbw disagrees with
            its collective and rank count, or whose ``Collective test starting`` line names
            another test, a table that does not parse (the message names the mapping, the
            table, the text file and line).
    """
    if not paths:
        d = corpus_dir()
        if d is None or not d.is_dir():
            raise InputError("no published corpus found: give a folder or set $TREEATTN_PUBLISHED")
        paths = [d]
    tables: list[PublishedTable] = []
    for mf in _mapping_files([Path(p) for p in paths]):
        tables.extend(_load_source(mf))
    return tables


def load_logs(paths: list[str | Path], topology: str | list[str], env: dict[str, str] | None = None,
              version: str | None = None, partial: bool = False) -> list[PublishedTable]:
    """Saved nccl-tests / rccl-tests logs (one run a file, as ``calibrate --from-nccl-tests``
    reads them) mapped onto ``topology`` (one for all, or one a log in their order): your own
    cluster's runs, scored like the corpus.
    The collective and rank count are inferred as ``log_run`` does, the NCCL release from the
    ``NCCL version`` line the log prints, else ``version`` (``check-model --nccl-version``: a
    release, a series or a bound, as a mapping's ``library_version``; RCCL's for an rccl-tests
    log), else the topology's. ``partial``: a log that ends inside its table is scored on its
    whole rows (``check-model --partial``), its line saying so, instead of refused.

    Raises:
        InputError: ``version`` malformed, or other than the release a log prints."""
    from treeattn.topology.library import resolve

    wanted = version_flag(version) if version is not None else None
    machines = [topology] * len(paths) if isinstance(topology, str) else list(topology)
    if len(machines) != len(paths):
        raise ValueError(f"{len(machines)} topologies for {len(paths)} logs")
    out = []
    seen: set[Path] = set()
    for p, topology in zip(map(Path, paths), machines, strict=True):
        topo = resolve(topology)
        if p.resolve() in seen:
            raise InputError(f"{p}: given twice")
        seen.add(p.resolve())
        log = read_nccl_tests(p, partial)
        if log.collective and log.collective not in COLLECTIVES:  # before log_run, whose models are calibrate's
            raise InputError(f"{p}: a {log.collective} test; the model scores {', '.join(COLLECTIVES)}")
        coll, ranks, inferred = log_run(log, likely=topo.num_ranks)
        notes = [f"{log.cut_short}: those scored (--partial)"] if log.cut_short else []
        notes += list(inferred) + [f"{how}, which the model does not time (it times calls launched one by one): "
                                   "its small sizes may come out slow" for how in launch_notes(log)]
        if other := other_devices(log, topo) or other_vendor(log, topo):
            notes.append(other)
        if ranks <= topo.num_ranks and (other := other_hosts(log, topo, ranks)):
            like = selection_like_hosts(log, topo, topology)
            notes.append(other + (f" (-t '{like}' places them as the log does)" if like else ""))
        library = "RCCL" if log.rccl else "NCCL"  # RCCL's releases are not NCCL's figures
        release, evidence = printed_version(log), "printed in the log"
        if release and wanted is not None and not allows(wanted, release):
            raise InputError(f"--nccl-version {wanted}: {p} prints {library} {release}")
        if not release and wanted is not None:
            release, evidence = wanted, "given with --nccl-version"
        if not release:
            library = evidence = ""
        elif library == "NCCL":
            try:
                nccl_release(release)
            except InputError as exc:  # the table's nccl_release is None: its topology's applies
                own = f" (the {'printed' if evidence.startswith('printed') else 'given'} one for the -g launches)" \
                    if log.n_gpus > 1 else ""
                notes.append(f"{exc}: the topology's release used instead{own}")
            if newer := newer_note(release):
                notes.append(newer)
        run_env = _with_recorded_env(p, log, coll, env or {}, notes)
        # Named by the path: runs in two folders may share a file name.
        out.append(PublishedTable(
            source_id=str(p), table_id=coll, url=str(p), collective=coll, topology=topology,
            ranks=ranks, env=run_env, log=log, library=library, version=release, evidence=evidence,
            meta={"inferred": "; ".join(notes)} if notes else {}))
    return out


def _with_recorded_env(path: Path, log: NcclTestsLog, coll: str, given: dict[str, str],
                       notes: list[str]) -> dict[str, str]:
    """``given`` (``--env``) with the settings the table's model reads (``reads_env``) that the
    log records from its run's environment (nccl-tests' JSON; an empty value is unset, as NCCL
    reads it), checked as ``--env``'s are; what was taken, and an integer NCCL would read as
    its leading number, are noted.

    Raises:
        InputError: ``--env`` sets a variable the run recorded with another meaning, or a
            recorded value the model cannot read.
    """
    from treeattn.cost.nccl_env import function_list, p2p_level_from_env, setting_meaning, unread_numbers

    where = f"{path}: the run's environment, as the file records it"
    recorded = {name: value for name, value in log.env if name in reads_env(coll) and value.strip()}
    function = coll.replace("_", "")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):  # NCCL 2.24's per-function lists, as NCCL reads them for this test
        if name in recorded and (";" in recorded[name] or ":" in recorded[name]):
            own = function_list(recorded[name], function)
            notes.append(f"{name}={recorded[name]} read for {function} as "
                         + (own if own is not None else "no restriction"))
            if own is None:
                del recorded[name]
            else:
                recorded[name] = own
    check_env(where, recorded)
    for name, value in recorded.items():
        if name in given and setting_meaning(name, given[name]) != setting_meaning(name, value):
            raise InputError(f"{where}, has {name}={value}, but --env gives {name}={given[name]}; leave --env "
                             f"{name} out")
    if "NCCL_P2P_LEVEL" in recorded and "NCCL_P2P_DISABLE" in given and p2p_level_from_env(
            {"NCCL_P2P_DISABLE": given["NCCL_P2P_DISABLE"]}) == "LOC":
        raise InputError(f"{where}, has NCCL_P2P_LEVEL={recorded['NCCL_P2P_LEVEL']}, which NCCL reads only where "
                         f"NCCL_P2P_DISABLE is not 1, but --env gives NCCL_P2P_DISABLE={given['NCCL_P2P_DISABLE']}; "
                         "leave --env NCCL_P2P_DISABLE out")
    merged = {**given, **recorded}  # each side checked: --env by its reader, the file's above
    if taken := [f"{k}={v}" for k, v in recorded.items() if k not in given]:
        notes.append(f"{', '.join(taken)} from the environment the file records")
    notes.extend(f"{said} (recorded in the file)" for said in unread_numbers(recorded))
    return merged


def reads_env(collective: str) -> tuple[str, ...]:
    """The NCCL settings the model of ``collective`` reads: the point-to-point model's P2P level
    (``POINT_TO_POINT``), the NCCL model's all of ``ENV_SETTINGS``."""
    from treeattn.cost.nccl_env import ENV_SETTINGS, P2P_SETTINGS

    return P2P_SETTINGS if collective in POINT_TO_POINT else ENV_SETTINGS


def check_env(where: str, env: dict[str, str]) -> None:
    """Raise ``InputError`` naming ``where`` where the model cannot read a setting of ``env``."""
    from treeattn.cost.nccl_env import allowed_by_env, p2p_level_from_env

    try:
        allowed_by_env(env)
        p2p_level_from_env(env)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _field(where: str, data: dict, key: str, kind: type, default=None):  # noqa: ANN001, ANN202 - small reader
    value = data.get(key, default)
    if value is None:
        raise InputError(f"{where}: field {key!r} is missing")
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InputError(f"{where}: field {key!r} must be a {kind.__name__}, got {value!r}")
    return value


# Fields only a topology file has (explicit, compact and family forms): a topology given where a
# mapping is read is named as such.
_TOPOLOGY_KEYS = {"devices", "links", "node", "nodes", "family", "network", "cost"}


def _load_source(mf: Path) -> list[PublishedTable]:
    try:
        text = read_input(mf, "mapping")
    except ProbeError as exc:
        raise InputError(str(exc)) from None
    if looks_like_a_log(mf):
        raise InputError(f"{mf}: an nccl-tests log named .yaml, which is read as a table mapping: give it another "
                         "name (.txt, .log)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{mf}: not YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:  # the pure-Python loader recurses per level; no mapping nests so
        raise InputError(f"{mf}: not YAML (nested too deeply)") from None
    if not isinstance(data, dict):
        raise InputError(f"{mf}: a mapping file is a YAML mapping with 'source' and 'tables'")
    unknown = sorted(set(data) - _SOURCE_KEYS)
    if "tables" not in data and "name" in data and set(data) & _TOPOLOGY_KEYS:
        raise InputError(f"{mf}: a topology file, not a table mapping ('source', 'tables'); score your own "
                         "nccl-tests logs on it with: treeattn check-model LOG... --topology FILE")
    if unknown:
        raise InputError(f"{mf}: unknown field {unknown[0]!r}; fields: {', '.join(sorted(_SOURCE_KEYS))}")
    url = _field(str(mf), data, "source", str)
    specs = _field(str(mf), data, "tables", list)
    meta = {k: str(data[k]) for k in ("retrieved", "hardware", "library", "quality", "cut") if k in data}
    source_version = _library_version(str(mf), data)
    texts: dict[Path, str] = {}
    out = []
    for i, spec in enumerate(specs):
        where = f"{mf}: tables[{i}]"
        if not isinstance(spec, dict):
            raise InputError(f"{where}: each table is a mapping")
        unknown = sorted(set(spec) - _TABLE_KEYS)
        if unknown:
            raise InputError(f"{where}: unknown field {unknown[0]!r}; fields: {', '.join(sorted(_TABLE_KEYS))}")
        tid = _field(where, spec, "id", str)
        where = f"{mf}: table {tid!r}"
        coll = _field(where, spec, "collective", str)
        if coll not in COLLECTIVES:
            raise InputError(f"{where}: collective {coll!r}; choose one of {', '.join(COLLECTIVES)}")
        lines = _field(where, spec, "lines", list)
        if len(lines) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in lines):
            raise InputError(f"{where}: field 'lines' must be [first, last], got {lines!r}")
        ranks = _field(where, spec, "ranks", int)
        if ranks < 2:
            raise InputError(f"{where}: field 'ranks' must be >= 2, got {ranks}")
        env = {str(k): str(v) for k, v in _field(where, spec, "env", dict, {}).items()}
        check_env(f"{where}: env", env)
        text_path = mf.parent / _field(where, spec, "file", str, mf.stem + ".txt")
        if text_path not in texts:
            try:
                texts[text_path] = read_input(text_path, "published table")
            except ProbeError as exc:
                raise InputError(f"{where}: {exc}") from None
        try:
            log = parse_published_table(texts[text_path], text_path.name, (lines[0], lines[1]), coll)
        except ProbeError as exc:
            raise InputError(f"{where}: {exc}") from None
        ratio, want = log.busbw_ratio(), busbw_factor(coll, ranks)
        if abs(ratio - want) > 0.01 * want + 0.006:
            raise InputError(f"{where}: busbw/algbw = {ratio:.4f} in the table, but {coll} over {ranks} ranks "
                             f"gives {want:.4f}: wrong collective or rank count")
        library, version, evidence = _library_version(where, spec) or source_version or ("", "", "")
        printed = printed_version(log)
        if printed and version and parse_version(version) != parse_version(printed):
            raise InputError(f"{where}: library_version {version!r}, but the table prints {log.nccl_version!r}")
        if printed and not version and log.rccl:
            library, version, evidence = "RCCL", printed, "printed in the table"
        elif printed and not version:
            library, version, evidence = "NCCL", printed, "printed in the table"
        out.append(PublishedTable(
            source_id=mf.stem, table_id=tid, url=url, collective=coll,
            topology=_field(where, spec, "topology", str), ranks=ranks,
            env=env, log=log,
            scored=_field(where, spec, "scored", bool, True), why=str(spec.get("why", "")), meta=meta,
            library=library, version=version, evidence=evidence,
        ))
    return out


def _library_version(where: str, data: dict) -> tuple[str, str, str] | None:
    """A mapping's ``library_version`` (library, version, evidence), checked; None when absent."""
    spec = data.get("library_version")
    if spec is None:
        return None
    where = f"{where}: library_version"
    if not isinstance(spec, dict):
        raise InputError(f"{where}: a mapping with {', '.join(_VERSION_KEYS)}")
    unknown = sorted(set(spec) - set(_VERSION_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r}; fields: {', '.join(_VERSION_KEYS)}")
    library = _field(where, spec, "library", str)
    if library not in LIBRARIES:
        raise InputError(f"{where}: library {library!r}; choose one of {', '.join(LIBRARIES)}")
    version = spec.get("version")
    if version is None:
        raise InputError(f"{where}: field 'version' is missing")
    try:
        version = version_text(version)
        parse_version(version)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    return library, version.strip(), _field(where, spec, "evidence", str)
