#!/usr/bin/env bash
# Create .venv with treeattn and its dev tools. The CPU build of torch is installed first,
# pinned, so that the package's torch range does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" \
        || .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" \
            --index-url https://download.pytorch.org/whl/cpu
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -c scripts/constraints.txt -e ".[dev,hf]"
