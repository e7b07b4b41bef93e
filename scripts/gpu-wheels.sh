#!/usr/bin/env bash
# For a GPU machine without network whose Python has torch but not pydantic (a CUDA image's):
# downloads, here, the wheels treeattn needs beyond such an image into .whl/, which
# scripts/gpu-check.sh installs from when it finds them (`pip install --no-index`).
#   bash scripts/gpu-wheels.sh [PYTHON_VERSION]     # the GPU machine's, default 3.12
# Versions are the ones the suite was last green with (scripts/constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
names=(pydantic pydantic_core annotated-types typing-inspection typing_extensions)
pins=()
for name in "${names[@]}"; do
    pin=$(grep -i -E "^${name//[-_]/[-_]}==" scripts/constraints.txt) \
        || { echo "gpu-wheels: $name is not pinned in scripts/constraints.txt"; exit 1; }
    pins+=("$pin")
done
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${pins[@]}"
ls .whl
