#!/usr/bin/env bash
# Create .venv with treeattn and its dev tools. torch is installed first, pinned, from PyTorch's
# CPU index where that is reachable: PyPI's Linux wheel of the same version is the multi-GB CUDA
# build. Where it is not (a machine that reaches a mirror or a wheel folder only), from the
# index pip is configured with.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
cpu_index=https://download.pytorch.org/whl/cpu
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    # Asked once, briefly: pip itself retries an unreachable index for every package.
    if .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$cpu_index/torch/', timeout=10)" \
            >/dev/null 2>&1; then
        .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" --index-url "$cpu_index"
    else
        echo "setup: $cpu_index is not reachable; torch 2.13.0 comes from pip's own index" \
             "(on PyPI, Linux: the CUDA build, several GB)" >&2
        .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    fi
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -c scripts/constraints.txt -e ".[dev,hf]"
# An editable install leaves treeattn's sources uncompiled, where a regular install compiles
# them: with PYTHONDONTWRITEBYTECODE set, every process (each command, each rank) would compile
# them again (a quarter of `treeattn topo list`'s CPU time here).
.venv/bin/python -m compileall -q treeattn
