#!/usr/bin/env bash
# Install (scripts/setup.sh), lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check treeattn tests benchmarks examples
.venv/bin/python -m pytest "$@"
