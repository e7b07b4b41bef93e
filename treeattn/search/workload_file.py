"""The YAML form of a workload (docs/workload-format.md), and the one function that turns plain
data into a Payload.

A decode shape (every key optional except the sequence length and a way to get the heads,
which a file may leave to flags: ``load_workload``'s ``missing``)::

    workload:                 # optional wrapper key
      model: llama-3.1-8b     # preset: heads, head dim and layers; explicit keys override it
      batch: 16               # B
      q_heads: 32             # Hq (alias: heads)
      kv_heads: 8             # Hkv, must divide Hq
      head_dim: 128           # D, of q and K
      v_head_dim: 128         # Dv, of V and the output (D unless given)
      kv_latent: false        # MLA: one cached vector of D a token, whose first Dv are V
      seq_len: 128K           # N in tokens; K/M/G are powers of 1024 (128K = 131072)
      split: even             # or tokens per rank, zeros allowed: [64K, 64K, 0, 0]
      kv_dtype: bf16
      partial_dtype: fp32
      layers: 32
      ranks: 4                # optional: the topology says how many ranks there are

A raw payload (a plain reduction, compared with nccl-tests)::

    kind: raw
    bytes: 1MiB               # per rank; KB/MB powers of 1000; KiB/MiB and a bare 1M powers of 1024
    op: sum                   # a raw buffer is summed (a decode shape's partials are merged)
    dtype: fp32

CLI flags are mapped onto the same keys (``treeattn.cli.options``), so files and flags are
validated by one code path, ``workload_from_dict``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from treeattn.errors import InputError, KVCacheTooLargeError, WorkloadError
from treeattn.textfile import read_text
from treeattn.units import DType, counted, parse_size
from treeattn.workload import (
    MODELS,
    Payload,
    RawPayload,
    ReduceOp,
    Workload,
    check_model,
    check_split,
    even_split,
    preset_heads,
)
from treeattn.yamlkeys import RepeatedKeyError, refusing_repeats

__all__ = ["ATTENTION_KEYS", "RAW_KEYS", "parse_tokens", "workload_from_dict", "load_workload", "file_length",
           "file_split", "without_replaced"]

_LOADER = refusing_repeats(yaml.SafeLoader)

ATTENTION_KEYS = frozenset(
    {"kind", "model", "batch", "q_heads", "heads", "kv_heads", "head_dim", "v_head_dim", "kv_latent", "seq_len",
     "split", "kv_dtype", "partial_dtype", "layers", "ranks"}
)
RAW_KEYS = frozenset({"kind", "bytes", "op", "dtype", "ranks"})

_TOKENS = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:([kKmMgG])[iI]?)?\s*$")  # "128Ki" as sizes write it: the same
_TOKEN_POW = {"": 0, "k": 1, "m": 2, "g": 3}


def parse_tokens(value: Any, *, where: str = "seq_len", least: int = 0) -> int:
    """Read a token count: an integer, or text such as ``"4096"``, ``"128K"``, ``"1M"``.

    Args:
        value: the count; K, M, G (or Ki, Mi, Gi) are powers of 1024, as context lengths
            are quoted (Llama 3.1's 128K context is 131072 tokens).
        where: the field name, for the error message.
        least: the smallest count allowed (a split's share may be 0 tokens, a sequence not).

    Returns:
        The count, >= ``least``.
    """
    if isinstance(value, bool):
        raise WorkloadError(f"{where} must be a token count, got {value!r}")
    if isinstance(value, int):
        count = value
    else:
        m = _TOKENS.match(str(value))
        if not m:
            raise WorkloadError(f"cannot read {where} {value!r}; write it like 4096, 128K or 1M")
        whole = float(m.group(1)) * 1024 ** _TOKEN_POW[(m.group(2) or "").lower()]
        if whole != int(whole):
            raise WorkloadError(f"{where} {value!r} is not a whole number of tokens")
        count = int(whole)
    if count < least:
        raise WorkloadError(f"{where} must be at least {counted(least, 'token')}, got {value!r}")
    return count


class _Names:
    """How errors name a key: by the flag it came from, else as ``FILE: key`` in a file (also
    where flags were given over it: ``over``, the sentence then the flags' and ``where``
    ``workload``), or ``where.key`` in a mapping inside one (a plan's ``workload.seq_len``)."""

    def __init__(self, where: str, flags: Mapping[str, str] | None, file: bool, over: str | None = None) -> None:
        self.where, self.flags, self.over = where, dict(flags or {}), over
        self.sep = ": " if file else "."

    def __call__(self, key: str) -> str:
        if key in self.flags:
            return self.flags[key]
        return f"{self.over}: {key}" if self.over else f"{self.where}{self.sep}{key}"

    def after(self, named: str, key: str) -> str:
        """``key`` named later in a sentence that has named the file already (in ``named``):
        by its flag, else by the key alone (not ``FILE: a ... FILE: b``)."""
        if key not in self.flags and (named.startswith(f"{self.over}: ") if self.over
                                      else self.sep == ": " and named.startswith(f"{self.where}: ")):
            return key
        return self(key)


def _positive_int(data: dict, key: str, name: _Names) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{name(key)} must be a positive integer, got {value!r}")
    return value


def _split(value: Any, ranks: int | None, seq_len: int, name: _Names) -> tuple[int, ...]:
    where = name.where
    if value is None or value == "even":
        if ranks is None:
            raise WorkloadError(f"{where}: give ranks (or a topology) to split {seq_len} tokens evenly")
        return even_split(seq_len, ranks)
    if isinstance(value, str):
        items = value.split(",")
        if "" in (v.strip() for v in items):  # a slip ("2K,,2K"), not a rank left out
            empty = next(i for i, v in enumerate(items, 1) if not v.strip())
            raise WorkloadError(f"{name('split')} {value!r}: item {empty} is empty; write tokens per rank separated "
                                "by commas (0 for a rank without tokens)")
        value = items
    if not isinstance(value, (list, tuple)) or not value:
        raise WorkloadError(f"{name('split')} must be 'even' or a list of tokens per rank, got {value!r}")
    split = tuple(parse_tokens(v, where=f"{name('split')}[{i}]") for i, v in enumerate(value))
    if ranks is not None and len(split) != ranks:
        raise WorkloadError(f"{name('split')} names {len(split)} ranks but there are {ranks}; give one size per rank")
    return split


def _check_heads(model: str | None, ints: dict[str, int | None], name: _Names, heads_key: str = "q_heads") -> None:
    """Hkv must divide Hq, said in the words that gave them: the flags, the file's keys (its
    ``heads_key`` for Hq), the preset's counts named as such; a mapping inside a file (a plan's)
    or the API's is left to ``Workload``'s own check, which names its fields."""
    if not {"q_heads", "kv_heads"} & set(name.flags) and name.sep != ": ":
        return
    hq, hkv, _ = preset_heads(model, ints["q_heads"], ints["kv_heads"], ints["head_dim"])
    if hq is None or hkv is None or not hq % hkv:
        return
    q_named = name.flags.get("q_heads") or name(heads_key)
    if ints["kv_heads"] is None:
        hint = "--kv-heads" if "q_heads" in name.flags else "kv_heads"
        raise WorkloadError(f"{q_named} ({hq}) must be a multiple of {model}'s {hkv} KV heads; give {hint} as well")
    of = f"{name.after(name('kv_heads'), heads_key) if 'q_heads' not in name.flags else q_named} ({hq})" \
        if ints["q_heads"] is not None else f"{model}'s {hq} query heads"
    raise WorkloadError(f"{name('kv_heads')} ({hkv}) must divide {of}")


def _check_latent(model: str | None, ints: dict[str, int | None], latent: bool | None, name: _Names) -> None:
    """A latent cache's value is the first Dv of its D values: said in the words that gave them
    (the workload's own check names its fields)."""
    preset = MODELS[model] if model is not None else None
    d = preset_heads(model, None, None, ints["head_dim"])[2]
    dv = ints["v_head_dim"] if ints["v_head_dim"] is not None else (preset.v_head_dim if preset else None)
    latent_given = latent is not None
    if latent is None:
        latent = preset.kv_latent if preset else False
    if latent and d is not None and dv is not None and dv > d:
        own = f"{model}'s"  # a value the preset gave, not the user
        dv_of = name("v_head_dim") if ints["v_head_dim"] is not None else f"{own} value dim"
        d_of = name.after(dv_of, "head_dim") if ints["head_dim"] is not None else f"{own} head dim"
        latent_of = name.after(dv_of if dv_of.startswith(name.where) else d_of, "kv_latent") if latent_given else own
        raise WorkloadError(f"{dv_of} ({dv}) must be at most {d_of} ({d}) with a latent cache ({latent_of}): the "
                            "value is the first Dv values of the cached key")


def workload_from_dict(data: dict[str, Any], *, ranks: int | None = None, where: str = "workload",
                       flags: Mapping[str, str] | None = None, file: bool = False,
                       over_file: str | None = None) -> Payload:
    """Validate plain data (a parsed YAML file or CLI flags) into a Workload or RawPayload.

    Args:
        data: the keys of the module docstring; ``None`` values count as absent.
        ranks: rank count from the topology; must agree with ``data['ranks']`` and the split.
        where: prefix for error messages (a file name, or ``workload``).
        flags: the flag each key came from (``{"seq_len": "--seq-len"}``): errors about that key
            name the flag instead of ``where.key``.
        file: ``where`` names a file: errors name a key as ``FILE: key``.
        over_file: the file whose keys ``data`` holds beside the flags' (``make_payload``):
            errors name such a key as ``FILE: key``.

    Returns:
        A ``Workload`` (decode shape) or a ``RawPayload`` (``kind: raw`` or a ``bytes`` key).

    Examples:
        >>> w = workload_from_dict({"model": "llama-3.1-8b", "batch": 1, "seq_len": "128K"}, ranks=8)
        >>> w.split[0], w.payload_bytes
        (16384, 16512)
    """
    if not isinstance(data, dict):
        raise WorkloadError(f"{where} must be a mapping of keys to values, got {type(data).__name__}")
    data = {k: v for k, v in data.items() if v is not None}
    name = _Names(where, flags, file, over_file)
    kind = _kind(data)
    if kind not in ("attention", "raw"):
        raise WorkloadError(f"{name('kind')} must be 'attention' or 'raw', got {kind!r}")
    allowed = RAW_KEYS if kind == "raw" else ATTENTION_KEYS
    unknown = sorted(set(data) - allowed)
    if unknown:
        close = {k: difflib.get_close_matches(str(k), sorted(allowed), n=1) for k in unknown}
        said = ", ".join(f"{k} (did you mean {close[k][0]}?)" if close[k] else str(k) for k in unknown)
        raise WorkloadError(
            f"{where}: unknown key(s) {said} for {'an' if kind == 'attention' else 'a'} {kind} "
            "workload; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    declared = _positive_int(data, "ranks", name)
    if declared is not None and ranks is not None and declared != ranks:
        raise WorkloadError(f"{name('ranks')} is {declared} but the topology places {ranks} ranks")
    ranks = ranks if ranks is not None else declared
    if kind == "raw":
        if "bytes" not in data:
            raise WorkloadError(f"{where}: a raw payload needs bytes (per rank), e.g. bytes: 1MiB")
        if ranks is None:
            raise WorkloadError(f"{where}: give ranks (or a topology) for a raw payload")
        op = str(data.get("op", "sum")).lower()
        if op != ReduceOp.SUM.value:
            # The executor sums a raw buffer; merging needs partials (o, lse), which a decode shape has.
            raise WorkloadError(f"{name('op')}: a raw payload is summed (op sum), got {data['op']!r}; the attention "
                                "merge needs a decode shape (--model, or --heads and --head-dim)")
        dtype = DType.parse(data.get("dtype", "fp32"))
        nbytes = parse_size(data["bytes"], name("bytes"), least=dtype.nbytes,
                            least_text=f"one {dtype.value} element ({counted(dtype.nbytes, 'byte')})")
        if nbytes % dtype.nbytes:
            # Stricter than RawPayload's own check (one element at least), which reads the plans and
            # sizes treeattn makes: a user's 6 bytes of fp32 would be summed as 4 without a word.
            raise WorkloadError(f"{name('bytes')} must be a whole number of {dtype.value} elements "
                                f"({dtype.nbytes} bytes each), got {nbytes}")
        return RawPayload(nbytes=nbytes, ranks=ranks, dtype=dtype, op=op)
    if "seq_len" not in data and "split" not in data:
        raise WorkloadError(f"{where}: give seq_len (tokens in all), e.g. seq_len: 128K")
    model = data.get("model")
    if model is not None:
        check_model(model, name("model"))
    if "heads" in data and "q_heads" in data and data["heads"] != data["q_heads"]:
        raise WorkloadError(f"{where}: heads and q_heads disagree ({data['heads']} vs {data['q_heads']})")
    heads_key = "heads" if "heads" in data else "q_heads"  # for errors: the key the file gives
    if "heads" in data:
        _positive_int(data, "heads", name)  # checked under the name the file gives it
        data["q_heads"] = data.pop("heads")
    if model is None and ("q_heads" not in data or "head_dim" not in data):
        raise WorkloadError(f"{where}: give a model preset or both q_heads (--heads) and head_dim (--head-dim)")
    ints = {k: _positive_int(data, k, name) for k in ("batch", "q_heads", "kv_heads", "head_dim", "v_head_dim",
                                                       "layers")}
    latent = data.get("kv_latent")
    if latent is not None and not isinstance(latent, bool):
        raise WorkloadError(f"{name('kv_latent')} must be true or false, got {latent!r}")
    _check_latent(model, ints, latent, name)
    if "seq_len" in data:
        seq_len = parse_tokens(data["seq_len"], where=name("seq_len"), least=1)
    else:
        seq_len = None
    _check_heads(model, ints, name, heads_key)
    raw_split = data.get("split")
    if seq_len is None:
        split = _split(raw_split, ranks, 0, name)
        check_split(split, name("split"))
        seq_len = sum(split)
    else:
        split = _split(raw_split, ranks, seq_len, name)
        if sum(split) != seq_len:
            raise WorkloadError(f"{name('split')} sums to {sum(split)} tokens but seq_len is {seq_len}")
    dtypes = {}
    for key, default in (("kv_dtype", "bf16"), ("partial_dtype", "fp32")):
        try:
            dtypes[key] = DType.parse(data.get(key, default))
        except (InputError, ValueError) as exc:
            raise WorkloadError(f"{name(key)}: {exc}") from None
    try:
        return Workload.create(
            ranks=len(split),
            seq_len=seq_len,
            batch=ints["batch"] if ints["batch"] is not None else 1,
            model=model,
            q_heads=ints["q_heads"],
            kv_heads=ints["kv_heads"],
            head_dim=ints["head_dim"],
            split=split,
            layers=ints["layers"],
            v_head_dim=ints["v_head_dim"],
            kv_latent=latent,
            **dtypes,
        )
    except (InputError, ValueError) as exc:  # the shape's own checks: name the file they read
        text = str(exc)
        kind = KVCacheTooLargeError if isinstance(exc, KVCacheTooLargeError) else WorkloadError
        text = text.removeprefix("workload: ") if where != "workload" else text  # the shape's own word for itself
        raise kind(text if text.startswith(where) else f"{where}: {text}") from None


def load_workload(path: str | Path, *, ranks: int | None = None,
                  missing: Mapping[str, Any] | None = None, flags: Mapping[str, str] | None = None) -> Payload:
    """Read a workload YAML file (see the module docstring for its keys).

    Args:
        path: the file.
        ranks: rank count from the topology, checked against the file's ``ranks``/``split``.
        missing: what a decode shape needs and the file may leave to flags: the length
            (``seq_len`` or ``split``) where the file gives neither, and the heads (``model``, or
            ``q_heads`` and ``head_dim``) where the file has no way to them. A file of one model's
            shape is then planned at every ``-n`` and compared over ``--seq-lens``; a length
            of its own that no device holds is checked at the one given here instead. Given
            ``bytes`` (``--bytes``), a raw file or one of no key takes it as its size.
        flags: the flag each key of ``missing`` came from (``make_payload``): given, a decode
            file is checked without the keys they replace (``without_replaced``: a value no flag
            leaves in use is not judged), and a key filled from a flag is named by the flag.

    Returns:
        The validated ``Workload`` or ``RawPayload``.
    """
    data = _read_workload_data(Path(path))
    if data is None:  # empty, comments only, or a bare 'workload:': no key given, as {}
        data = {}
    own_length = isinstance(data, dict) and bool({"seq_len", "split"} & set(data))
    filled: dict[str, str] = {}
    if missing and isinstance(data, dict):
        kind = _kind(data)
        if "bytes" in missing:  # --bytes: a raw payload; a raw file, or one of no key, may leave it the size
            if kind == "raw" or not data:
                data = {"kind": "raw", **data}
                data.setdefault("bytes", missing["bytes"])
        elif kind != "raw":
            if flags:  # a value a flag replaces is not judged (the caller checks the flags' with the rest)
                data = without_replaced(data, {k: v for k, v in missing.items() if v is not None})
            fill = _what_the_file_lacks(data, missing)
            data = {**data, **fill}
            filled = {k: flags[k] for k in fill if flags and k in flags}  # named by their flags, not as the file's
    try:
        return workload_from_dict(data, ranks=ranks, where=str(path), file=True, flags=filled)
    except KVCacheTooLargeError as exc:
        given = {k: v for k, v in (missing or {}).items() if v is not None and k in _SIZE_KEYS}
        if not own_length or given:
            # A size the flags give (a length the file leaves them, or one of its own they
            # replace: its length, batch, layers or KV type) is checked at theirs and, too large,
            # said as the flags' (compare leaves that length out); the caller builds it with them.
            replaced = ("seq_len", "split") if {"seq_len", "split"} & set(given) else ()
            kept = {k: v for k, v in data.items() if k not in (*replaced, *given)}
            return workload_from_dict({**kept, **given}, ranks=ranks, where="workload", flags=flags or {},
                                      over_file=str(path))
        raise WorkloadError(str(exc)) from None  # the file's own size, which no flag replaces


_PRESET_KEYS = ("q_heads", "heads", "kv_heads", "head_dim", "v_head_dim", "kv_latent", "layers")
"""What a ``model`` flag replaces in a file (unless given as flags too): its preset's shape."""


def without_replaced(data: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """A file's keys less those the flags ``given`` (workload keys) replace: each key given, a
    file's ``heads`` for ``q_heads``, its length for either length, its shape for a ``model``,
    and its ``kv_heads`` where they equal its heads (one a query head: they follow ``--heads``).
    One rule for the file as read (``load_workload``) and as loaded (``cli.options.make_payload``)."""
    drop = set(given)
    if "q_heads" in given:
        drop.add("heads")
        heads = data.get("heads", data.get("q_heads"))
        if "kv_heads" not in given and heads is not None and data.get("kv_heads") == heads:
            drop.add("kv_heads")
    if "model" in given:
        drop.update(_PRESET_KEYS)
    if {"seq_len", "split"} & set(given):
        drop.update(("seq_len", "split"))
    return {k: v for k, v in data.items() if k not in drop}


_SIZE_KEYS = ("seq_len", "split", "batch", "layers", "kv_dtype")
"""The keys that size a KV cache without changing its shape: a flag that gives one replaces the
file's in the size check (``load_workload``)."""


def file_length(path: str | Path) -> int | None:
    """The tokens a workload file gives itself (its ``seq_len``, or its split's sum), or None
    where it leaves the length to flags (``compare`` then compares its default lengths)."""
    data = _read_workload_data(Path(path))
    if not isinstance(data, dict):
        return None  # load_workload says what is wrong with it
    if data.get("seq_len") is not None:
        return parse_tokens(data["seq_len"], where=f"{path}: seq_len", least=1)
    split = _own_split(data, path)
    return None if split is None else sum(split)


def file_split(path: str | Path) -> tuple[int, ...] | None:
    """A workload file's own split, tokens per rank, or None (none, ``even``, or one that
    ``load_workload`` will refuse, saying why)."""
    return _own_split(_read_workload_data(Path(path)), path)


def _own_split(data: Any, path: str | Path) -> tuple[int, ...] | None:  # noqa: ANN401 - the YAML as read
    split = data.get("split") if isinstance(data, dict) else None
    if split is None or split == "even":
        return None
    values = split.split(",") if isinstance(split, str) else split
    if not isinstance(values, (list, tuple)):
        return None
    try:
        return tuple(parse_tokens(v, where=f"{path}: split[{i}]") for i, v in enumerate(values))
    except InputError:
        return None


def _kind(data: Mapping[str, Any]) -> Any:  # noqa: ANN401 - as written, checked by workload_from_dict
    """A workload mapping's kind: its ``kind``, else raw where it gives ``bytes``, else attention."""
    return data.get("kind", "raw" if "bytes" in data else "attention")


def _what_the_file_lacks(data: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``given`` that supply a decode shape's length or heads the file ``data`` lacks."""
    has = {k for k, v in data.items() if v is not None}
    fill = {}
    if not has & {"seq_len", "split"}:
        fill.update({k: given[k] for k in ("seq_len", "split") if given.get(k) is not None})
    if "model" not in has and not (has & {"q_heads", "heads"} and "head_dim" in has):
        if given.get("model") is not None:
            fill["model"] = given["model"]
        if not has & {"q_heads", "heads"} and given.get("q_heads") is not None:
            fill["q_heads"] = given["q_heads"]
        if "head_dim" not in has and given.get("head_dim") is not None:
            fill["head_dim"] = given["head_dim"]
    return fill


def _read_workload_data(path: Path) -> Any:  # noqa: ANN401 - whatever the YAML holds
    """The parsed YAML of a workload file, its ``workload:`` wrapper removed."""
    text = read_text(path, "workload file", WorkloadError)
    try:
        # 'seq_len: 4K' then 'seq_len: 8K' would plan 8K without a word: refused.
        data = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except RepeatedKeyError as exc:
        raise WorkloadError(f"{path}:{exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise WorkloadError(f"{path}{at}: not valid YAML: {problem}") from None
    except RecursionError:  # the pure-Python loader recurses per level; no workload nests so
        raise WorkloadError(f"{path}: not valid YAML: nested too deeply") from None
    if isinstance(data, dict) and "workload" in data:
        if len(data) > 1:
            beside = ", ".join(str(k) for k in data if k != "workload")
            raise WorkloadError(f"{path}: a 'workload:' mapping holds the whole workload; the keys beside it "
                                f"({beside}) belong inside it (indented under it), or drop the 'workload:' line")
        data = data["workload"]
    return data
