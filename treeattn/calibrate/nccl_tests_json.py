"""nccl-tests' JSON output (``-J FILE``, nccl-tests 2.17.4 and later) read into an ``NcclTestsLog``.

The file is one object: ``config`` (``nthreads``, ``ngpus``, ``minimum_bytes``,
``maximum_bytes``, ``step_factor`` or ``step_bytes``, and ``devices``: the first rank of each
process), ``results`` (a row each: ``size``, ``count``, ``type``, ``redop``, ``root``, and
``out_of_place`` / ``in_place`` holding ``time``, ``alg_bw``, ``bus_bw`` and ``nwrong``),
``out_of_bounds``, ``average_bus_bandwidth``, the NCCL release as ``nccl_version`` (a code,
22602 for 2.26.2), the command line as ``args`` and the process environment as ``env``
(``NAME=VALUE`` strings: its ``NCCL_*`` and ``RCCL_*`` are kept). ``-I 1`` adds ``*_per_iter`` figures,
which are not read. The rows are checked as a text log's are; a row's ``line`` is its place
in ``results`` counted from 1, and errors name it ``results[i]``.
"""

from __future__ import annotations

import json
import math
import re

from treeattn.calibrate.nccl_tests import (
    NcclDevice,
    NcclRow,
    NcclTestsLog,
    _check,
    _timing,
    collective_from_name,
    out_of_order,
    release_of_code,
    step_sizes,
)
from treeattn.errors import ProbeError
from treeattn.units import format_size

__all__ = ["parse_nccl_tests_json"]


# What is left where the decoder stopped, in a file cut short: nothing, or a token cut inside
# (``65.`` of 65.43, ``tr`` of true).
_CUT_TOKEN = re.compile(r"[-+0-9.eE]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?")

_KINDS = {int: "an integer", str: "a string", dict: "an object", list: "a list", (int, float): "a number"}


def _get(obj: object, key: str, kind: type | tuple[type, ...], where: str, shown: str):  # noqa: ANN202 - as kind
    """``obj[key]``, checked to be a ``kind``; ``where``: ``obj``'s path, for the error."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) or isinstance(value, float) and not math.isfinite(value):
        raise ProbeError(f"{shown}: {where}{'.' if where else ''}{key} is "
                         f"{'missing' if value is None else repr(value)}, expected {_KINDS[kind]}")
    return value


def parse_nccl_tests_json(text: str, source: str, shown: str, partial: bool = False) -> NcclTestsLog:
    """Read the JSON file nccl-tests' ``-J`` writes (see the module docstring).

    Args:
        partial: take the whole rows of a run cut short (the file left open where a killed
            process's output stopped) or failed (closed after its last size's first fields, no
            ``average_bus_bandwidth``), saying so in ``cut_short``, instead of refusing it.
        text: the file's text.
        source: the file's name (a name like ``all_reduce_perf*`` sets ``collective`` when the
            recorded command line does not).
        shown: the file as the user gave it, which errors name.

    Raises:
        ProbeError: not JSON, cut short, not nccl-tests' output, CPU times (``-C 1``), or rows
            the checks refuse.
    """
    if not text.strip():
        raise ProbeError(f"{shown}: the file is empty")
    cut = ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # nccl-tests closes the object as it ends: a process killed (its buffered output lost
        # past the last block written) leaves it open.
        short = exc.msg != "Extra data" and (_CUT_TOKEN.fullmatch(text[exc.pos:].strip()) is not None
                                             or exc.msg.startswith("Unterminated string"))
        if not short:
            raise ProbeError(f"{shown}: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
        data = _whole_part(text)
        if data is None:
            raise ProbeError(f"{shown}: the JSON ends early: the run was cut short?"
                             + (" (no whole row in it)" if partial else "")) from None
        if "average_bus_bandwidth" not in data:  # else the cut came after the table's figures
            cut = "the JSON ends early (the run was cut short?)"
    except RecursionError:  # brackets opened thousands deep: no writer of nccl-tests' output
        raise ProbeError(f"{shown}: not JSON (nested too deeply)") from None
    if isinstance(data, dict) and "config" in data and "args" in data and "results" not in data:
        raise ProbeError(f"{shown}: no results: the run ended before its first size (a failed set-up?)")
    if not isinstance(data, dict) or not {"config", "results"} <= set(data):
        raise ProbeError(f"{shown}: JSON, but not nccl-tests' -J output (no 'config' and 'results')")
    config = _get(data, "config", dict, "", shown)
    threads, gpus = _get(config, "nthreads", int, "config", shown), _get(config, "ngpus", int, "config", shown)
    kind = "factor" if "step_factor" in config else "bytes"
    step = (_get(config, f"step_{kind}", int, "config", shown), kind)
    devices = []
    listed = _get(config, "devices", list, "config", shown) if config.get("devices") is not None else []
    for i, d in enumerate(listed):
        at = f"config.devices[{i}]"
        devices.append(NcclDevice(_get(d, "rank", int, at, shown), _get(d, "hostname", str, at, shown),
                                  _get(d, "device", int, at, shown), _get(d, "device_hex", str, at, shown),
                                  _get(d, "device_info", str, at, shown).strip()))
    # One device a process, its first rank: the processes' ranks follow on.
    if [d.rank for d in devices] != [k * threads * gpus for k in range(len(devices))]:
        raise ProbeError(f"{shown}: config.devices lists ranks {[d.rank for d in devices][:8]}, not each process's "
                         f"first ({threads * gpus} apart from 0)")
    results = _get(data, "results", list, "", shown)
    if "average_bus_bandwidth" not in data and results and isinstance(results[-1], dict) and (
            "in_place" not in results[-1]):
        # A run that failed: nccl-tests writes a row's size, count, type, reduction and root
        # before it runs the size, and closes the file as it exits.
        cut = cut or f"results[{len(results) - 1}] has no timings: the run failed at its size"
        results = results[:-1]
    elif "average_bus_bandwidth" not in data and not cut:
        cut = "no average_bus_bandwidth: the run did not finish"
    if cut and not results:
        raise ProbeError(f"{shown}: {cut} (no whole row before it)")
    rows = [_row(r, i, shown) for i, r in enumerate(results)]
    if not rows:
        raise ProbeError(f"{shown}: results is empty")
    for prev, row in zip(rows, rows[1:], strict=False):
        if out_of_order(row.size_bytes, prev.size_bytes, kind == "bytes"):
            raise ProbeError(f"{shown}: results[{row.line - 1}]: size {row.size_bytes} after {prev.size_bytes}: rows "
                             "out of order or two runs mixed")
    min_bytes = _get(config, "minimum_bytes", int, "config", shown)
    max_bytes = _get(config, "maximum_bytes", int, "config", shown)
    sizes = step_sizes(min_bytes, max_bytes, step) if min_bytes > 0 else []
    if not cut and 0 < len(rows) < len(sizes) and rows[-1].size_bytes <= sizes[len(rows) - 1]:
        # A finished run short of its maxBytes: rows lost, or nccl-tests lowered maxBytes where the
        # GPU's memory was short, which its text log says ("Reducing maxBytes") and -J does not
        # (util.cu writes the config before common.cu lowers it). The rows it has, checked in
        # their places, are what --partial takes.
        cut = (f"ends at {format_size(sizes[len(rows) - 1])}, short of maxBytes {format_size(max_bytes)} (rows lost, "
               "or nccl-tests lowered maxBytes for memory, which -J does not record)")
        max_bytes = sizes[len(rows) - 1]
    oob = data.get("out_of_bounds") if isinstance(data.get("out_of_bounds"), dict) else {}
    code = data.get("nccl_version")
    args = data.get("args") if isinstance(data.get("args"), list) else []
    program = args[0] if args and isinstance(args[0], str) else ""
    log = NcclTestsLog(
        source=shown, n_threads=threads, n_gpus=gpus,
        min_bytes=min_bytes,
        max_bytes=max_bytes, rows=tuple(rows), devices=tuple(devices),
        avg_busbw_gbps=None if "average_bus_bandwidth" not in data else _get(
            data["average_bus_bandwidth"], "bandwidth", (int, float), "average_bus_bandwidth", shown),
        out_of_bounds=f"{oob.get('count', '')} {'OK' if oob.get('okay') == 'true' else 'FAILED'}" if oob else "",
        nccl_version=release_of_code(code) if isinstance(code, int) and not isinstance(code, bool) else "",
        collective=collective_from_name(program) or collective_from_name(source),
        n_ranks=len(devices) * threads * gpus or None,
        env=_recorded_env(data.get("env")),
        cut_short=f"{cut}: {_rows_said(results)}" if cut else "",
    )
    _check(log, step, lambda n: f"{shown}: results[{n - 1}]" if n else shown)
    if cut and not partial:  # the rows it has passed every check: --partial would take them
        raise ProbeError(f"{shown}: {cut}; {_rows_said(results)} in it, --partial takes them")
    return log


def _rows_said(results: list) -> str:
    """``N whole rows up to SIZE`` of ``results`` (whose last row's size is read as it is)."""
    last = results[-1].get("size") if results and isinstance(results[-1], dict) else None
    upto = f" up to {format_size(last)}" if isinstance(last, int) and not isinstance(last, bool) else ""
    return f"{len(results)} whole row{'s' if len(results) != 1 else ''}{upto}"


def _whole_part(text: str) -> dict | None:
    """The members of a JSON object cut short, read up to the cut, its ``results`` list to the
    last whole row; None where no whole row is in it (the cut before or at the first row)."""
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    i = ws.match(text, 0).end()
    if text[i:i + 1] != "{":
        return None
    out: dict = {}
    i += 1
    try:
        while True:
            i = ws.match(text, i).end()
            key, i = dec.raw_decode(text, i)
            i = ws.match(text, i).end()
            if text[i:i + 1] != ":" or not isinstance(key, str):
                return None
            i = ws.match(text, i + 1).end()
            if key == "results":
                if text[i:i + 1] != "[":
                    return None
                rows: list = []
                out["results"] = rows
                i += 1
                while True:
                    i = ws.match(text, i).end()
                    if text[i:i + 1] == "]":
                        i += 1
                        break
                    row, i = dec.raw_decode(text, i)
                    rows.append(row)
                    i = ws.match(text, i).end()
                    if text[i:i + 1] == ",":
                        i += 1
            else:
                out[key], i = dec.raw_decode(text, i)
            i = ws.match(text, i).end()
            if text[i:i + 1] == ",":
                i += 1
    except (json.JSONDecodeError, RecursionError):
        pass
    return out if out.get("results") else None


def _recorded_env(env: object) -> tuple[tuple[str, str], ...]:
    """The NCCL and RCCL variables of the ``env`` list nccl-tests writes (``NAME=VALUE``
    strings, the process environment), sorted by name; nothing where it is not such a list."""
    if not isinstance(env, list):
        return ()
    pairs = (item.partition("=") for item in env if isinstance(item, str))
    return tuple(sorted({(name, value) for name, eq, value in pairs
                         if eq and name.startswith(("NCCL_", "RCCL_"))}))


def _row(r: object, i: int, shown: str) -> NcclRow:
    at = f"results[{i}]"
    size = _get(r, "size", int, at, shown)
    if "in_place" not in r:  # nccl-tests writes it for every size it ran (out_of_place may be null)
        raise ProbeError(f"{shown}: {at} has no timings (no in_place): rows damaged, or a failed run's last row "
                         "with rows after it")
    timings = []
    for placement in ("out_of_place", "in_place"):
        where = f"{at}.{placement}"
        t = r.get(placement)
        if t is None:  # nccl-tests writes null where it ran one placement only
            timings.append(None)
            continue
        if isinstance(t, dict) and "cpu_time" in t:
            raise ProbeError(f"{shown}: {where} gives cpu_time (nccl-tests -C 1): the host's time to launch the "
                             "calls, not the GPU time the model predicts; rerun without -C 1")
        time_us, algbw, busbw = (_get(t, k, (int, float), where, shown) for k in ("time", "alg_bw", "bus_bw"))
        # nwrong is null where nccl-tests did not check the results (-c 0).
        wrong = None if isinstance(t, dict) and t.get("nwrong") is None else _get(t, "nwrong", (int, float), where,
                                                                                   shown)
        timings.append(_timing(size, time_us, algbw, busbw, wrong, f"{shown}: {where}"))
    root = _get(r, "root", str, at, shown).strip()  # printed %6i into a string
    return NcclRow(i + 1, size, _get(r, "count", int, at, shown), _get(r, "type", str, at, shown),
                   _get(r, "redop", str, at, shown), int(root) if root.lstrip("-").isdigit() else None, *timings)
