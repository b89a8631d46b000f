#!/usr/bin/env bash
# What a checkpoint every N steps costs a training run: samples/s with no saves, with blocking saves and with
# asynchronous saves (checkpoint.async), on NP ranks (default 2).
#
#   bench/run_async_checkpoint_bench.sh [AMPDIST] [RUNS] [STEPS] [EVERY] [CONFIG] [PRECISION]
#
# Defaults: build/ampdist, 3 runs of each mode, 60 steps, a save every 10 steps, bench/configs/mlp_100m.pbtxt (the
# 100M MLP), bf16. The modes alternate within each run so that other load on the machine falls on all three alike.
# samples/s here is the global batch over the whole time of a step including its share of the saves: the sum of
# rank 0's phases (log.phase_timing: data_wait ... optimizer, and checkpoint, which holds a blocking save, or an async
# save's staging copy, progress all-reduce and commit). The summary line's own samples/s counts Trainer::step only
# and leaves the saves out, so it is not used. checkpoint.save_final is off and no evaluation runs. Prints each run,
# the medians, the ratios to no saves, the checkpoint phase (ms per step) of each mode, and the machine (lscpu model
# and the flags that select kernels). The run directories are in a temporary directory under BENCH_TMP (default
# build/bench_tmp: the file system measured), removed on exit. NP=1 THREADS=1 runs one rank of one thread, which
# leaves the other cores to the background writer, as a GPU node's host CPU is left while the GPU computes.
set -euo pipefail
cd "$(dirname "$0")/.."
AMPDIST=${1:-build/ampdist}
RUNS=${2:-3}
STEPS=${3:-60}
EVERY=${4:-10}
CONFIG=${5:-bench/configs/mlp_100m.pbtxt}
PRECISION=${6:-bf16}
BENCH_TMP=${BENCH_TMP:-build/bench_tmp}
NP=${NP:-2}
THREADS=${THREADS:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$BENCH_TMP"
tmp=$(mktemp -d "$BENCH_TMP/async_ckpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

declare -A sps phase
for i in $(seq 1 "$RUNS"); do
  for mode in none blocking async; do
    args=(--set train.steps="$STEPS" --set log.every_steps="$STEPS" --set train.eval_every_epochs=0
      --set train.eval_every_steps=0 --set checkpoint.save_final=false --set checkpoint.keep_last=2
      --set log.tensorboard=false --set log.phase_timing=true)
    [[ -n $THREADS ]] && args+=(--set train.threads_per_rank="$THREADS")
    case $mode in
      none) args+=(--set checkpoint.every_steps=0) ;;
      blocking) args+=(--set checkpoint.every_steps="$EVERY" --set checkpoint.async=false) ;;
      async) args+=(--set checkpoint.every_steps="$EVERY" --set checkpoint.async=true) ;;
    esac
    rm -rf "$tmp/run"
    mpirun -q --oversubscribe -np "$NP" "$AMPDIST" train --config "$CONFIG" --precision "$PRECISION" "${args[@]}" \
      --run-dir "$tmp/run" > "$tmp/out.txt"
    line=$(grep '^phases (ms/step, rank 0):' "$tmp/out.txt")
    batch=$(sed -n 's/.*| global batch \([0-9]*\) = .*/\1/p' "$tmp/out.txt")
    ms=$(sed 's/^[^:]*://' <<<"$line" | awk '{t = 0; for (i = 2; i <= NF; i += 2) t += $i; print t}')
    s=$(awk -v b="$batch" -v ms="$ms" 'BEGIN {printf "%.1f", b * 1000 / ms}')
    c=$(sed -n 's/.* checkpoint \([0-9.]*\).*/\1/p' <<<"$line")
    echo "run $i $mode: $s samples/s, checkpoint phase ${c:-0} ms/step"
    sps[$mode]="${sps[$mode]:-} $s"
    phase[$mode]="${phase[$mode]:-} ${c:-0}"
  done
done
median() { printf '%s\n' $@ | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
m_none=$(median ${sps[none]})
m_block=$(median ${sps[blocking]})
m_async=$(median ${sps[async]})
echo "config $CONFIG, $PRECISION, $NP ranks${THREADS:+ x $THREADS threads}, $STEPS steps, a save every $EVERY steps, $RUNS runs each"
echo "median samples/s: none $m_none, blocking $m_block, async $m_async"
awk -v n="$m_none" -v b="$m_block" -v a="$m_async" \
  'BEGIN {printf "ratio to no saves: blocking %.3f, async %.3f\n", b / n, a / n}'
echo "median checkpoint phase (ms/step, rank 0): blocking $(median ${phase[blocking]}), async $(median ${phase[async]})"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "file system of $BENCH_TMP: $(df -PT "$BENCH_TMP" | awk 'NR==2 {print $2, $1}')"
