#!/usr/bin/env bash
# Install (scripts/setup.sh), lint, and run the whole test suite.
#
# With options only (none, --runslow, --hypothesis-profile=explore, -x, -kEXPR), in two runs:
# tests/unit on one pytest-xdist worker per core (at most 4), then everything else serially.
# Those tests start real torch.distributed ranks, several per test, and some time how soon a
# failed rank is noticed: beside other tests on a small machine they would measure the machine.
# With a test path (or an option's value given apart, -k EXPR), one serial run of what is given.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit
.venv/bin/ruff check treeattn tests benchmarks examples || exit

for arg in "$@"; do
    if [[ $arg != -* ]]; then
        exec .venv/bin/python -m pytest "$@"
    fi
done

cores=$(nproc 2>/dev/null || echo 1)
workers=$(( cores < 4 ? cores : 4 ))
parallel=()
if (( workers > 1 )); then
    parallel=(-n "$workers")
fi
.venv/bin/python -m pytest "${parallel[@]}" tests/unit "$@"
unit=$?
# 2, 3, 4: interrupted (Ctrl-C), an internal error, a usage error: the second run would meet the same.
if (( unit >= 2 && unit <= 4 )); then
    exit "$unit"
fi
.venv/bin/python -m pytest tests --ignore=tests/unit "$@"
rest=$?
# 5 is pytest's "no test selected": an option that selects tests of one run only.
if (( unit == 5 && rest == 5 )); then
    exit 5
fi
for rc in "$unit" "$rest"; do
    if (( rc != 0 && rc != 5 )); then
        echo "test.sh: tests/unit: exit $unit; the rest: exit $rest" >&2
        exit "$rc"
    fi
done
