#!/usr/bin/env bash
# The main job on a fresh machine, no GPU needed: install, measure this machine's CPU ranks
# (gloo over loopback), search the best merge schedule for a Llama-3.1-8B decode step on
# them, then run that plan and the baselines for real, printing predicted vs measured.
# Environment: RANKS (default 4), SEQ_LEN (default 16K tokens in all), BATCH (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
T=.venv/bin/treeattn
RANKS=${RANKS:-4}
mkdir -p topologies/local plans/local
$T calibrate --topology "cpu:ranks=$RANKS" --max-size 4MiB --sizes 9 --repeats 8 \
    --compute attention --out "topologies/local/cpu-$RANKS.yaml"
$T plan --topology "topologies/local/cpu-$RANKS.yaml" --model llama-3.1-8b \
    --batch "${BATCH:-1}" --seq-len "${SEQ_LEN:-16K}" --out "plans/local/cpu-$RANKS.yaml" --no-progress
$T run "plans/local/cpu-$RANKS.yaml" --baselines --repeats 10
