#!/usr/bin/env bash
# Install (scripts/setup.sh), lint, and run the whole test suite.
#
# With options only (none, --runslow, --hypothesis-profile=explore, -x, -kEXPR): tests/unit on
# one pytest-xdist worker per core (at most 4), then everything else. Those tests start real
# torch.distributed ranks, several per test, and some time how soon a failed rank is noticed or
# how long a transfer takes: beside other tests on a small machine they would measure the
# machine, so they run one at a time. The ones marked `untimed` (they check results only) run
# beside them at a lower priority (nice 10), on the cores the timed ones leave idle while they
# wait on timeouts and peers. Given -m, the rest is one serial run.
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
split=1
for arg in "$@"; do
    [[ $arg == -m* ]] && split=0
done
untimed=5
if (( split )); then
    log=$(mktemp) || exit
    # Its own process group (job control on for the start only), where SIGINT is not ignored as
    # it is in a script's background job: Ctrl-C is passed on to it and the ranks it started.
    set -m
    nice -n 10 .venv/bin/python -m pytest tests --ignore=tests/unit -m untimed "$@" > "$log" 2>&1 &
    beside=$!
    set +m
    stop() {
        kill -INT -- -"$beside" 2>/dev/null
        wait "$beside"
        rm -f "$log"
        exit "$1"
    }
    trap 'stop 130' INT
    trap 'stop 143' TERM
    trap 'stop 129' HUP
    .venv/bin/python -m pytest tests --ignore=tests/unit -m "not untimed" "$@"
    rest=$?
    wait "$beside"
    untimed=$?
    trap - INT TERM HUP
    echo "--- the untimed tests, run beside the ones above:"
    cat "$log"
    rm -f "$log"
else
    .venv/bin/python -m pytest tests --ignore=tests/unit "$@"
    rest=$?
fi
# 5 is pytest's "no test selected": an option that selects tests of one run only.
if (( unit == 5 && rest == 5 && untimed == 5 )); then
    exit 5
fi
for rc in "$unit" "$rest" "$untimed"; do
    if (( rc != 0 && rc != 5 )); then
        echo "test.sh: tests/unit: exit $unit; the rest: exit $rest; the untimed rest: exit $untimed" >&2
        exit "$rc"
    fi
done
