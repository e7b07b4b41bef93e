"""Every ``treeattn`` command shown in the README's code blocks runs as shown.

The commands run in order (later ones read what earlier ones wrote) with the installed
console script, in a scratch folder holding what they read from the repository. The few
that need root and network namespaces, or measure for minutes, are listed in ``SKIPPED``
with the reason, so that a skip is visible; every other command must exit 0.
"""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREEATTN = str(Path(sys.executable).with_name("treeattn"))
SKIPPED = {
    "treeattn calibrate": "measures the ranks for minutes (scripts/quickstart.sh runs it)",
    "treeattn emulate": "needs root and network namespaces (tests/distributed/test_emulate.py)",
    "treeattn validate": "needs root and network namespaces, and runs for tens of minutes",
}
COPIED = ("results/validate-emu",)
"""What the commands read from the repository's root, copied into the scratch folder."""


def _syntax(cmd: str) -> bool:
    """A span that shows syntax, not a command: placeholders (TOPO, PLAN), '…' or optional
    parts ([--out FILE])."""
    return bool(re.search(r"\b[A-Z]{2,}\b|…|\[", cmd))


def readme_commands() -> list[str]:
    """``treeattn ...`` lines of the README's fenced and indented code blocks, then the inline
    ``treeattn ...`` spans that show a whole command (options, no placeholder)."""
    out, fenced = [], False
    text = (ROOT / "README.md").read_text()
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        code = line.strip() if fenced or line.startswith("    ") else ""
        if code.startswith("treeattn "):
            out.append(code)
    # An inline span with options and no placeholder is a command to run; without options it
    # names a command (`treeattn run`), which test_every_command_named_in_the_text_exists checks.
    spans = [m for m in re.findall(r"`(treeattn [^`]+)`", text) if " -" in m and not _syntax(m)]
    return out + [m for m in dict.fromkeys(spans) if m not in out]


def test_the_readme_shows_commands_and_names_no_placeholder_in_them() -> None:
    cmds = readme_commands()
    assert len(cmds) >= 10
    for cmd in cmds:
        assert not _syntax(cmd), f"a placeholder in a command shown to run: {cmd}"


def test_every_readme_command_runs_as_shown(tmp_path: Path) -> None:
    for rel in COPIED:
        shutil.copytree(ROOT / rel, tmp_path / rel)
    ran = []
    for cmd in readme_commands():
        if any(cmd.startswith(prefix) for prefix in SKIPPED):
            continue
        proc = subprocess.run([TREEATTN, *shlex.split(cmd)[1:]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr
        ran.append(cmd)
    assert len(ran) >= 10
    # What the tour writes is the user's: in a clone, git ignores every file of it.
    written = [str(f.relative_to(tmp_path)) for f in sorted(tmp_path.rglob("*"))
               if f.is_file() and not any(f.is_relative_to(tmp_path / rel) for rel in COPIED)]
    assert written
    tracked = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--verbose", "--non-matching",
                              "--stdin"], input="\n".join(written), capture_output=True, text=True, check=False)
    kept = [line.split("\t")[-1] for line in tracked.stdout.splitlines() if line.startswith("::")]
    assert not kept, f"README commands write files git would track: {kept}"


def _subcommands(span: str) -> list[list[str]]:
    """The command paths an inline span names: ``treeattn emulate up/run TOPO`` ->
    [emulate up], [emulate run] (its leading lower-case words, slashes as alternatives)."""
    words = []
    for word in span.split()[1:]:
        if not re.fullmatch(r"[a-z][a-z-]*(/[a-z][a-z-]*)*", word):
            break
        words.append(word.split("/"))
    return [list(p) for p in itertools.product(*words)]


def _positionals(span: str, path: list[str]) -> int:
    """How many arguments a span gives its command after ``path`` that no option takes:
    ``treeattn emulate run TOPO PLAN`` 2, ``treeattn plan -t TOPO`` 0, ``... exec TOPO -- CMD…`` 2."""
    words = span.split()[1 + len(path):]
    count, i = 0, 0
    while i < len(words):
        word = words[i].strip("[]")
        if word == "--":
            return count + 1
        if word.startswith("-"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            i += 2 if nxt and not nxt.lstrip("[").startswith("-") and not words[i].endswith("]") else 1
            continue
        count, i = count + 1, i + 1
    return count


@pytest.mark.parametrize("span", sorted(set(re.findall(r"`(treeattn [^`]+)`", (ROOT / "README.md").read_text()))))
def test_every_command_named_in_the_text_exists(span: str) -> None:
    """Inline spans show syntax (``treeattn plan -t TOPO ...``): the commands they name exist
    and take as many arguments as the span gives them (``emulate down TOPO`` took none)."""
    for path in _subcommands(span):
        proc = subprocess.run([TREEATTN, *path, "--help"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"`{span}`: treeattn {' '.join(path)} --help: {proc.stderr[-500:]}"
        usage = re.search(r"Usage: (.*)", proc.stdout)
        assert usage, proc.stdout[:300]
        # {ARG} is required, [ARG] optional; [OPTIONS] stands for the options, not an argument.
        taken = re.findall(r"\{[^}]+\}|\[(?!OPTIONS\])[A-Z_]+\](?:\.\.\.)?", usage.group(1))
        given = _positionals(span, path)
        assert given <= len(taken), f"`{span}` gives {given} argument(s); {usage.group(1).strip()}"


def test_the_readme_shows_the_python_example_as_it_is() -> None:
    # the block under `examples/python_api.py` is that file's code from rank_main on, verbatim
    text = (ROOT / "README.md").read_text()
    block = text[text.index("```python\n", text.index("`examples/python_api.py`, four gloo ranks")):]
    block = block[len("```python\n"):block.index("```", len("```python\n"))]
    example = (ROOT / "examples" / "python_api.py").read_text()
    assert block.strip() == example[example.index("def rank_main"):].strip()


def test_the_readme_says_how_slurm_tasks_choose_their_threads() -> None:
    # A user of srun sizes --cpus-per-task and --cpu-bind by this rule
    # (treeattn.exec.launch.slurm_threads); the README states it with the variables it reads.
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    code = (ROOT / "treeattn" / "exec" / "launch.py").read_text(encoding="utf-8")
    assert "each rank runs `--cpus-per-task` threads where given" in text
    assert "(`--cpu-bind`, as `SLURM_CPU_BIND_TYPE` reports it) runs a thread per CPU it may use" in text
    assert "divided by the node's task count" in text and "sets `OMP_NUM_THREADS=1`" in text
    for variable in ("SLURM_CPUS_PER_TASK", "SLURM_CPU_BIND_TYPE", "SLURM_STEP_TASKS_PER_NODE", "OMP_NUM_THREADS"):
        assert f'"{variable}"' in code, variable


def test_the_tour_leaves_what_the_quickstart_wrote_alone() -> None:
    # The quickstart (first command of the README) writes its calibrated topology and plan; a
    # tour command writing over either would make the quickstart's plan warn of a changed topology.
    script = (ROOT / "scripts" / "quickstart.sh").read_text()
    written = {path.replace("$RANKS", "4") for path in re.findall(r'--out "([^"]+)"', script)}
    assert written == {"topologies/local/cpu-4.yaml", "plans/local/cpu-4.yaml"}
    for cmd in readme_commands():
        args = shlex.split(cmd)
        outs = {args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--out", "-o")}
        assert not outs & written, cmd
