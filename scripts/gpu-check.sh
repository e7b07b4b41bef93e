#!/usr/bin/env bash
# The one command for the first GPU machine (about 8 minutes on one GPU at most):
#   bash scripts/gpu-check.sh [FOLDER]
# Finds a Python whose torch sees CUDA (the machine's own, else .venv-gpu with the CUDA build
# of torch from PyPI), runs tests/gpu, then prints measured against modelled (merge kernel fused
# and eager, the decode attention kernel at 8K/128K/1M tokens, a world-size-1 plan; with 2 or
# more GPUs a searched plan and the baselines under `treeattn run`) and writes everything to
# FOLDER (default results/gpu-<gpu name>/) with the command that made it. Without CUDA: one
# line, exit 0. A machine without network whose Python lacks pydantic (a CUDA image's) installs
# it from .whl/, which `bash scripts/gpu-wheels.sh` fills beforehand on a machine with network.
set -uo pipefail
folder=""
[ -n "${1:-}" ] && folder=$(realpath -m -- "$1")  # as typed from where the script was called
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no CUDA GPU on this machine (nvidia-smi finds none); nothing to check"
    exit 0
fi
start=$(date +%s)
PY=""
# treeattn needs Python 3.11 (enum.StrEnum) and torch 2.6 (torch.distributed's group_peer,
# group_dst and group_src): a 3.10 python3, or a torch before 2.6, with CUDA is passed over.
usable='import sys, torch; v = tuple(int(x) for x in torch.__version__.split(".")[:2]); sys.exit(0 if sys.version_info >= (3, 11) and v >= (2, 6) and torch.cuda.is_available() else 1)'
for cand in "${PYTHON:-}" python3 .venv-gpu/bin/python; do
    if [ -n "$cand" ] && "$cand" -c "$usable" 2>/dev/null; then
        PY=$cand
        break
    fi
done
if [ -z "$PY" ]; then
    if ! python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
        echo "gpu-check: treeattn needs Python 3.11 or later; python3 is $(python3 --version 2>&1) (set PYTHON=...)"
        exit 1
    fi
    echo "gpu-check: installing the CUDA build of torch into .venv-gpu (PyPI's Linux wheel; needs network)"
    python3 -m venv .venv-gpu && .venv-gpu/bin/python -m pip install -q "torch==2.13.0" || exit 1
    PY=.venv-gpu/bin/python
    if ! "$PY" -c "$usable"; then  # e.g. a driver older than the wheel's CUDA: every test would skip
        built=$("$PY" -c 'import torch; print(torch.version.cuda)')
        driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
        echo "gpu-check: the installed torch (CUDA $built) sees no GPU under driver $driver; install a torch" \
             "built for this driver (PyTorch's --index-url for your CUDA) into .venv-gpu, then run this again"
        exit 1
    fi
fi
# Every import of the package's dependencies (pyproject.toml), and the tests'.
deps="import networkx, numpy, pandas, typer, rich, yaml, pydantic, matplotlib, pytest, hypothesis"
if ! "$PY" -c "$deps" 2>/dev/null; then
    if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels, installed beside the image's packages
        site="${TMPDIR:-/tmp}/treeattn-site"
        pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl || {
            echo "gpu-check: the wheels in .whl/ do not install under $PY (Python $pyver):" \
                 "run 'bash scripts/gpu-wheels.sh $pyver' where PyPI is reachable"
            exit 1
        }
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    else  # from PyPI; where there is no network, fail at once rather than retry for minutes
        "$PY" -m pip install -q --retries 0 --timeout 10 networkx numpy pandas typer rich pyyaml pydantic matplotlib \
            pytest hypothesis || {
            pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
            missing=$("$PY" -c "import importlib.util as u
print(' '.join(m for m in '${deps#import }'.split(', ') if u.find_spec(m) is None))")
            echo "gpu-check: $PY lacks ${missing:-working copies of its dependencies} and pip could" \
                 "not install them (above); where PyPI cannot" \
                 "be reached and only pydantic is missing, run 'bash scripts/gpu-wheels.sh $pyver' on a" \
                 "machine with network and bring .whl/ along (it fetches pydantic and what it needs)"
            exit 1
        }
    fi
    "$PY" -c "$deps" || { echo "gpu-check: treeattn's dependencies do not import under $PY"; exit 1; }
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
treeattn=("$PY" -c 'import sys; from treeattn.cli import main; sys.argv[0] = "treeattn"; main()')

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
n=$("$PY" -c "import torch; print(torch.cuda.device_count())")  # honours CUDA_VISIBLE_DEVICES; MIG lines aside
out="${folder:-results/gpu-$gpu}"
mkdir -p "$out"
{
    echo "bash scripts/gpu-check.sh${1:+ $1}   # $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
    nvidia-smi -L
} > "$out/command.txt"
cat "$out/command.txt"

status=0
echo "== tests/gpu"
timeout 270 "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider 2>&1 | tee "$out/tests.txt" || status=1

echo "== measured against modelled"
"${treeattn[@]}" probe --out "$out/topology.yaml" >"$out/probe.txt" 2>&1 || echo "probe failed (see $out/probe.txt): modelling on the library's topology of this GPU, where it has one"
topo_arg=()
[ -s "$out/topology.yaml" ] && topo_arg=(--topology "$out/topology.yaml")
timeout 180 "$PY" benchmarks/gpu_check.py --out "$out" ${topo_arg[@]+"${topo_arg[@]}"} 2>&1 | tee "$out/check.txt" || status=1

if [ "$n" -ge 2 ] && [ ${#topo_arg[@]} -eq 0 ]; then
    echo "== no searched plan on $n GPUs: probe wrote no topology of this machine to plan on (see $out/probe.txt)"
    status=1
elif [ "$n" -ge 2 ]; then
    echo "== a searched plan and the baselines on $n GPUs"
    t=${topo_arg[1]}
    if "${treeattn[@]}" plan -t "$t" -m llama-3.1-8b -b 1 -n 131072 --out "$out/plan.yaml" >"$out/plan.txt" 2>&1; then
        rm -f "$out/run.csv" "$out/run.timeline.csv"  # this check's rows, as its other files are (an older run's columns may differ)
        timeout 150 "${treeattn[@]}" run "$out/plan.yaml" --baselines -t "$t" --repeats 20 --out "$out/run.csv" 2>&1 \
            | tee "$out/run.txt" || status=1
    else
        echo "plan failed: $(tail -1 "$out/plan.txt")"
        status=1
    fi
fi
echo "gpu-check: done in $(( $(date +%s) - start )) s; results in $out (status $status)"
exit $status
