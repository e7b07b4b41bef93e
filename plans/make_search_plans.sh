#!/usr/bin/env bash
# Regenerate the searched example plans (treeattn plan); re-running gives byte-identical files.
set -euo pipefail
cd "$(dirname "$0")/.."
T=.venv/bin/treeattn
$T plan --topology dgx-h100-2node --model llama-3.1-8b --batch 1 --seq-len 128K \
    --out plans/dgx-h100-2node.llama-3.1-8b.b1.yaml --no-progress "$@"
$T plan --topology dgx-h100-16node --model llama-3.1-8b --batch 1 --seq-len 1M \
    --out plans/dgx-h100-16node.llama-3.1-8b.b1.yaml --no-progress "$@"
$T plan --topology dgx-h100 --model llama-3.1-8b --batch 16 --seq-len 128K \
    --out plans/dgx-h100.llama-3.1-8b.b16.yaml --no-progress "$@"
$T plan --topology cpu-4 --model llama-3.1-8b --batch 1 --seq-len 16K \
    --out plans/cpu-4.llama-3.1-8b.yaml --no-progress "$@"
