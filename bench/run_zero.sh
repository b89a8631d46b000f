#!/usr/bin/env bash
# Sharded optimizer state (optimizer.zero_stage 1) against replicated state, on the 100.7M-parameter MLP of
# bench/configs/mlp_100m.pbtxt with AdamW in bf16:
#   - peak resident memory per rank on 1, 2 and 4 ranks, beside the bytes expected per parameter (replicated:
#     master 4 + moments 8 + gradient 4 + working copy 2 = 18; stage 1: 4 + 2 + 12 / N);
#   - step time of both modes on 2 and 4 ranks (samples/s of `ampdist bench`);
#   - checkpoint load time per rank of the same state (3 buffers of 100.7M FP32), replicated and sharded
#     (ampdist_bench_checkpoint, which also checks every load bitwise).
# Writes a table and bench/results/zero-<date>.json. Numbers are measurements of this machine at its load (recorded),
# never assertions.
#   bash bench/run_zero.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cpu=$(lscpu | sed -n 's/^Model name: *//p')
flags=$(grep -m1 -o -w -E 'avx512_bf16|amx_bf16|avx512_fp16|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
params=100705290  # 4096 x 4096 x 6 + 4096 x 10 + biases (ampdist bench prints the count)
echo "CPU: $cpu ($(nproc) cores; $flags)"
printf '%-6s %-7s %12s %14s %16s %12s %8s\n' ranks stage 'samples/s' 'peak RSS MiB' 'expected MiB' 'state MiB' load
json_rows=()
for np in 1 2 4; do
  for z in 0 1; do
    log="$out/bench_${np}_$z.txt"
    load=$(cut -d' ' -f1 /proc/loadavg)
    mpirun -q --oversubscribe -np "$np" "$build/ampdist" bench --config bench/configs/mlp_100m.pbtxt --precision bf16 \
      --set optimizer.adamw.beta1=0.9 --set optimizer.zero_stage=$z --set train.threads_per_rank=1 \
      --steps "$steps" --warmup 1 >"$log" 2>&1 || { cat "$log"; exit 1; }
    sps=$(sed -n 's/^samples\/s: \([0-9.]*\).*/\1/p' "$log")
    rss=$(sed -n 's/^peak memory per rank (RSS, MiB): max \([0-9.]*\).*/\1/p' "$log")
    state=$(sed -n 's/.*model state on rank 0: \([0-9.]*\) MiB.*/\1/p' "$log")
    if [ "$z" = 0 ]; then per=18; else per=$(python3 -c "print(6 + 12 / $np)"); fi
    expected=$(python3 -c "print(round($params * $per / 2**20, 1))")
    printf '%-6s %-7s %12s %14s %16s %12s %8s\n' "$np" "$z" "$sps" "$rss" "$expected" "$state" "$load"
    json_rows+=("{\"ranks\": $np, \"zero_stage\": $z, \"samples_per_s\": $sps, \"peak_rss_mib\": $rss, \"expected_state_mib\": $expected, \"state_mib\": $state, \"loadavg\": $load}")
  done
done
echo
echo "main job (configs/fashion_mnist_mlp.pbtxt, fp16) on 2 ranks, samples/s, median of 3 alternated runs:"
main_rows=()
for z in 0 1; do vals[$z]=""; done
for rep in 1 2 3; do
  for z in 0 1; do
    v=$(mpirun -q --oversubscribe -np 2 "$build/ampdist" bench --config configs/fashion_mnist_mlp.pbtxt --precision fp16 \
          --set optimizer.zero_stage=$z --steps 400 --warmup 20 2>&1 | sed -n 's/^samples\/s: \([0-9.]*\).*/\1/p')
    vals[$z]="${vals[$z]} $v"
  done
done
for z in 0 1; do
  med=$(python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" ${vals[$z]})
  echo "  zero_stage $z: runs${vals[$z]}, median $med"
  main_rows+=("{\"zero_stage\": $z, \"samples_per_s\": [$(echo ${vals[$z]} | tr ' ' ',')], \"median\": $med}")
done
echo
echo "checkpoint load of the same state (3 x 100.7M FP32 = 1.13 GiB), per rank, page cache not dropped:"
ckpt_rows=()
for np in 2 4; do
  for mode in replicated sharded; do
    log="$out/ckpt_${np}_$mode.txt"
    extra=()
    [ "$mode" = sharded ] && extra=(--sharded)
    mpirun -q --oversubscribe -np "$np" "$build/bench/ampdist_bench_checkpoint" --gib 1.125 --dir "$out/ckpt" \
      --repeat 2 "${extra[@]}" --json "$out/ckpt_${np}_$mode.json" >"$log" 2>&1 || { cat "$log"; exit 1; }
    med=$(python3 -c "import json; print(round(json.load(open('$out/ckpt_${np}_$mode.json'))['load_s_median'], 3))")
    read=$(python3 -c "import json; print(round(json.load(open('$out/ckpt_${np}_$mode.json'))['load_read_gib_across_ranks'], 3))")
    echo "  $np ranks, $mode: load $med s (median of 2, max over ranks), $read GiB read across ranks"
    ckpt_rows+=("{\"ranks\": $np, \"state\": \"$mode\", \"load_s_median\": $med, \"read_gib_across_ranks\": $read}")
  done
done
mkdir -p bench/results
res="bench/results/zero-$(date +%F).json"
{
  echo "{\"cpu\": \"$cpu\", \"flags\": \"$flags\", \"steps\": $steps, \"train\": ["
  (IFS=,; echo "${json_rows[*]}")
  echo "], \"main_job_2_ranks\": ["
  (IFS=,; echo "${main_rows[*]}")
  echo "], \"checkpoint_load\": ["
  (IFS=,; echo "${ckpt_rows[*]}")
  echo "]}"
} >"$res"
echo "wrote $res"
