"""The repository stands on its own: nothing in it points at a file outside it.

A fresh clone has only what is committed: code, tests and docs may not read or cite the
development machine's folders, and every Markdown file they name must be in the clone.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("treeattn", "tests", "docs", "topologies", "scripts", "benchmarks", ".ci", "README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ""}
# Recorded outputs are kept as they were written; third-party fixture files are verbatim.
SKIPPED = ("tests/fixtures/nccl-tests/all_", "tests/fixtures/nccl-tests/damaged/", "tests/fixtures/probe/damaged/")
OUTSIDE = re.compile("/" + "work/|\\.\\./" + "shared|shared/(?:fixtures|reference)/|/home/|/root/")
# The project's own Markdown: bare upper-case names (README.md, NOTES.md) and docs/*.md.
# Paths into other repositories (cited fixture sources) are not checked.
MARKDOWN = re.compile(r"(?<![\w./-])((?:docs/[\w.-]+|[A-Z][A-Z0-9_-]*)\.md)\b")


def _files() -> list[Path]:
    out = []
    for name in SCANNED:
        top = ROOT / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if (path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in rel
                    and not rel.startswith(SKIPPED) and not (rel.startswith("tests/fixtures/probe/")
                                                             and not rel.endswith("README.md"))):
                out.append(path)
    return out


def _lines() -> list[tuple[Path, int, str]]:
    me = Path(__file__).resolve()
    return [(p, i, line) for p in _files() if p != me
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)]


def test_nothing_points_outside_the_repository() -> None:
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p, i, line in _lines() if OUTSIDE.search(line)]
    assert not found, "paths outside the repository:\n" + "\n".join(found)


def test_every_markdown_file_named_is_in_the_repository() -> None:
    names = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    missing = [f"{p.relative_to(ROOT)}:{i}: {ref}" for p, i, line in _lines() for ref in MARKDOWN.findall(line)
               if not (ROOT / ref).is_file() and not (p.parent / ref).is_file()
               and not ("/" not in ref and ref in names)]
    assert not missing, "Markdown files named but not in the repository:\n" + "\n".join(missing)
