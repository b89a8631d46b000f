#!/usr/bin/env bash
# What per-phase step timing (log.phase_timing) costs the main job: samples/s with it on and off.
#
#   bench/run_phase_timing_overhead.sh [AMPDIST] [RUNS] [STEPS]
#
# Runs the main job (configs/fashion_mnist_mlp.pbtxt, 2 ranks, fp16) for STEPS optimizer steps (default 1000)
# RUNS times each way (default 5), alternating on/off so that load from other work on the machine falls on both
# alike, and prints each run's samples/s (the summary line's: training steps only, evaluation excluded), the medians
# and the overhead (1 - median_on / median_off).
set -euo pipefail
cd "$(dirname "$0")/.."
AMPDIST=${1:-build/ampdist}
RUNS=${2:-5}
STEPS=${3:-1000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
on=() off=()
for i in $(seq 1 "$RUNS"); do
  for mode in true false; do
    mpirun -q --oversubscribe -np 2 "$AMPDIST" train --config configs/fashion_mnist_mlp.pbtxt --precision fp16 \
      --set train.steps="$STEPS" --set log.every_steps=100 --set train.eval_every_epochs=0 \
      --set checkpoint.save_final=false --set log.tensorboard=false --set log.phase_timing=$mode \
      --run-dir "$tmp/run" > "$tmp/out.txt"
    sps=$(sed -n 's/^samples\/s: \([0-9.]*\) .*/\1/p' "$tmp/out.txt")
    echo "run $i phase_timing=$mode: $sps samples/s"
    if [ "$mode" = true ]; then on+=("$sps"); else off+=("$sps"); fi
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
m_on=$(median "${on[@]}")
m_off=$(median "${off[@]}")
echo "median samples/s: phase_timing on $m_on, off $m_off"
awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "overhead of phase timing: %.2f%% (1 - on/off; negative = within noise)\n", 100 * (1 - a / b)}'
