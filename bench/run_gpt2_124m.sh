#!/usr/bin/env bash
# GPT-2 124M in its real shape (12 layers, 12 heads, 768 channels, context 1024, vocabulary 50257 padded to 50304,
# random weights) against the same model in PyTorch (bench/torch_gpt.py: scaled_dot_product_attention with
# is_causal, AdamW), on the same batch of windows of the fortunes text: s/step and peak resident memory per rank.
#   - ampdist in fp32 and bf16 with the default recompute (POINTWISE) and with recompute BLOCK, and fp32 as it was
#     before the fused attention (attention MATERIALIZED, recompute NONE), each beside its set-up estimate
#     (`ampdist train --dry-run`);
#   - PyTorch (from PyPI, installed once into TORCH_VENV, default ~/.cache/ampdist-bench/venv) in fp32 and under
#     bf16 autocast;
#   - 1 rank x N threads, and N ranks x 1 thread (RANKS=1 skips the second).
# Each run is warm-up steps then REPEAT timed windows of STEPS steps; the medians are printed. Numbers are this
# machine's at its load (recorded), never assertions. Writes bench/results/gpt2_124m-<date>.json.
#   bash bench/run_gpt2_124m.sh [BUILD_DIR] [BATCH] [STEPS] [REPEAT]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
build=${1:-build}
batch=${2:-8}
steps=${3:-1}
repeat=${4:-2}
N=${THREADS:-$(nproc)}
# No binding: a 1-rank row runs N threads, as PyTorch does (Open MPI binds each rank to one core by default).
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
TORCH_VENV=${TORCH_VENV:-$HOME/.cache/ampdist-bench/venv}
PY=$TORCH_VENV/bin/python3
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "run_gpt2_124m: installing torch from PyPI into $TORCH_VENV (once)" >&2
  /usr/bin/python3 -m venv "$TORCH_VENV" && "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check torch numpy >&2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cfg=$out/gpt2_124m.pbtxt
cat >"$cfg" <<EOF
name: "gpt2_124m_bench"
model { gpt { n_layer: 12 n_head: 12 n_embd: 768 seq_len: 1024 vocab_size: 50257 padded_vocab_multiple: 128 } }
data { text { paths: "/usr/share/games/fortunes" val_fraction: 0.1 } global_batch_size: $batch }
optimizer { adamw { beta1: 0.9 beta2: 0.95 } lr: 0.0006 weight_decay: 0.1 }
precision { dtype: FP32 }
train { seed: 1234 }
EOF
cpu=$(lscpu | sed -n 's/^Model name: *//p')
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16|avx512_fp16)$' | paste -sd' ' -)
echo "CPU: $cpu ($(nproc) cores; $flags); GPT-2 124M, batch $batch x 1024; $steps step(s) x $repeat windows"
printf '%-34s %-9s %10s %14s %14s %8s\n' run layout 's/step' 'peak RSS GiB' 'estimate GiB' load
rows=()
med() { python3 -c "import json,statistics,sys; d=json.load(open(sys.argv[1])); print(round(d['step_s_median'],2))" "$1"; }
rss_a() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['memory']['peak_rss_bytes_max_over_ranks']/2**30,2))" "$1"; }
rss_t() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['peak_rss_bytes']/2**30,2))" "$1"; }
row() {  # name layout s/step rss estimate
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  printf '%-34s %-9s %10s %14s %14s %8s\n' "$1" "$2" "$3" "$4" "$5" "$load"
  rows+=("{\"run\": \"$1\", \"layout\": \"$2\", \"step_s\": $3, \"peak_rss_gib\": $4, \"estimate_gib\": \"$5\", \"loadavg\": $load}")
}
layouts=("1x$N")
[ "${RANKS:-$N}" != 1 ] && [ "$N" -gt 1 ] && layouts+=("${N}x1")
for layout in "${layouts[@]}"; do
  np=${layout%x*}
  th=${layout#*x}
  for spec in "fp32 POINTWISE FLASH" "bf16 POINTWISE FLASH" "fp32 BLOCK FLASH" "bf16 BLOCK FLASH" "fp32 NONE MATERIALIZED"; do
    read -r p r a <<<"$spec"
    name="ampdist $p recompute $r attention $a"
    sets=(--set "model.gpt.recompute=$r" --set "model.gpt.attention=$a" --set "train.threads_per_rank=$th")
    # The set-up estimate per rank for this world size (the dry run creates and allocates nothing).
    est=$(mpirun -q --oversubscribe --bind-to none -np "$np" "$build/ampdist" train --config "$cfg" --precision "$p" "${sets[@]}" \
          --dry-run 2>/dev/null | sed -n 's/^memory estimate per rank: \([0-9.]*\) GiB.*/\1/p' | head -1 || true)
    [ -z "$est" ] && est=refused
    json=$out/a.json
    mpirun -q --oversubscribe --bind-to none -np "$np" "$build/bench/ampdist_bench_train" --config "$cfg" --precision "$p" "${sets[@]}" \
      --warmup 1 --steps "$steps" --repeat "$repeat" --json "$json" >"$out/a.log" 2>&1 || { cat "$out/a.log"; exit 1; }
    row "$name" "$layout" "$(med "$json")" "$(rss_a "$json")" "$est"
  done
  for p in fp32 bf16; do
    json=$out/t.json
    if [ "$np" = 1 ]; then
      OMP_NUM_THREADS=$th "$PY" bench/torch_gpt.py --config "$cfg" --precision "$p" --threads "$th" --warmup 1 \
        --steps "$steps" --repeat "$repeat" --json "$json" >"$out/t.log" 2>&1 || { cat "$out/t.log"; exit 1; }
    else
      pids=()
      for r in $(seq 0 $((np - 1))); do
        RANK=$r WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 OMP_NUM_THREADS=$th "$PY" bench/torch_gpt.py \
          --config "$cfg" --precision "$p" --threads "$th" --warmup 1 --steps "$steps" --repeat "$repeat" \
          --json "$json" >"$out/t$r.log" 2>&1 &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || { cat "$out"/t*.log; exit 1; }; done
    fi
    row "PyTorch $p$([ "$p" = bf16 ] && echo ' autocast')" "$layout" "$(med "$json")" "$(rss_t "$json")" "-"
  done
done
mkdir -p bench/results
res=bench/results/gpt2_124m-$(date +%Y%m%d-%H%M%S).json
{
  echo "{\"date\": \"$(date -Iseconds)\", \"cpu\": \"$cpu\", \"cpu_flags\": \"$flags\", \"nproc\": $(nproc),"
  echo " \"batch\": $batch, \"steps\": $steps, \"repeat\": $repeat,"
  echo " \"torch\": \"$("$PY" -c 'import torch; print(torch.__version__)')\", \"git_commit\": \"$(git -C "$ROOT" describe --always --dirty)\","
  echo " \"rows\": [$(IFS=,; echo "${rows[*]}")]}"
} >"$res"
echo "wrote $res"
