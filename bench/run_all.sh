#!/usr/bin/env bash
# ampdist against its peers and the machine's limits, side by side in one run: one table on stdout and
# bench/results/<date>.json. See docs/performance.md for what each row measures and what limits it.
#
#   bench/run_all.sh            # the full suite (about 30 minutes on 2 cores)
#   QUICK=1 bench/run_all.sh    # tiny sizes, a few seconds per part: the CTest smoke test (label bench)
#
# Environment: BUILD_DIR (default build), OUT (default bench/results/<date>.json; QUICK runs default to
# $BUILD_DIR/bench_smoke.json), NO_TORCH=1 to skip the PyTorch rows, NP4=0 to skip the oversubscribed 4-rank rows
# (QUICK runs skip them unless NP4=1). PyTorch: the full suite compares against the current torch from PyPI,
# installed once into a cached virtual environment TORCH_VENV (default ~/.cache/ampdist-bench/venv, outside the
# tree and build/); `pip install torch` there also brings the CUDA runtime wheels the PyPI build links against
# (about 5 GB, used only to load torch; the rows run on the CPU). TORCH_VERSION pins a version (default: newest);
# TORCH_FP16=1 runs the PyTorch fp16 model rows also on a CPU without fp16 hardware (skipped there otherwise).
# QUICK runs use PYTHON (default /usr/bin/python3 with Debian's python3-torch) so that CI downloads nothing.
#
# Parts (raw JSON of each run goes to $BUILD_DIR/bench_raw/):
#   1. main job throughput, ampdist_bench_train on configs/fashion_mnist_mlp.pbtxt, fp32/fp16/bf16 on 1 and 2 ranks
#      (threads per rank = nproc / ranks), and bench/torch_mlp.py (PyTorch, gloo DDP on 2 ranks) for fp32 and bf16,
#      each under OMP_WAIT_POLICY unset and =passive (the table takes the better: busy-waiting OpenMP threads lose
#      badly on a machine with other load, passive ones lose a little on an idle one); fp32 on 4 ranks x 1 thread
#      (oversubscribed on 2 cores, labelled so) for scaling;
#   2. ampdist_bench_allreduce on 2 and 4 ranks, 1 KiB to 256 MiB;
#   3. ampdist_bench_train on bench/configs/mlp_100m.pbtxt (100.7M parameters), fp16 and bf16, 1 rank;
#   4. ampdist_bench_kernels (Google Benchmark): GEMM per dtype beside oneDNN's own f32 matmul, casts, unscale,
#      AdamW beside memcpy;
#   5. models against PyTorch, fp32/fp16/bf16, 1 rank x NPROC threads and NPROC ranks x 1 thread: the 100M MLP
#      (torch_mlp.py --synthetic), the GPT-2-small-shaped model (bench/configs/gpt2_small_shaped.pbtxt, batch 16 x 256,
#      with peak memory per rank) and the fortunes GPT (torch_gpt.py). Each row: median of windows; every result
#      file records the CPU, its bf16/fp16 features, oneDNN's implementation per dtype and the load at each run.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
QUICK=${QUICK:-0}
TORCH_VENV=${TORCH_VENV:-$HOME/.cache/ampdist-bench/venv}
if [[ $QUICK == 1 ]]; then PYTHON=${PYTHON:-/usr/bin/python3}; else PYTHON=${PYTHON:-$TORCH_VENV/bin/python3}; fi
NO_TORCH=${NO_TORCH:-0}
NP4=${NP4:-$([[ $QUICK == 1 ]] && echo 0 || echo 1)}
NPROC=$(nproc)
RAW=$BUILD_DIR/bench_raw$([[ $QUICK == 1 ]] && echo _smoke || true)
if [[ $QUICK == 1 ]]; then OUT=${OUT:-$BUILD_DIR/bench_smoke.json}; else OUT=${OUT:-$ROOT/bench/results/$(date +%F).json}; fi
BIN=$BUILD_DIR/bench
MAIN_CFG=$ROOT/configs/fashion_mnist_mlp.pbtxt
BIG_CFG=$ROOT/bench/configs/mlp_100m.pbtxt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun -q --oversubscribe --bind-to none)  # no binding: a 1-rank row runs nproc threads, as PyTorch does

say() { printf '%s\n' "$*" >&2; }
die() { say "run_all: $*"; exit 1; }
START=$(date +%s)

# ---- build (if needed)
TARGETS=(ampdist_bench_train ampdist_bench_allreduce ampdist_bench_kernels)
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null; fi
if ! cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -j"$NPROC" >"$BUILD_DIR/bench_build.log" 2>&1; then
  cmake -S "$ROOT" -B "$BUILD_DIR" >/dev/null  # a tree configured before these targets existed
  cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -j"$NPROC" >"$BUILD_DIR/bench_build.log" 2>&1 ||
    die "build failed (bench/ is built only when Google Benchmark is found); see $BUILD_DIR/bench_build.log"
fi
if [[ $NO_TORCH != 1 && $QUICK != 1 && $PYTHON == "$TORCH_VENV/bin/python3" ]] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  say "run_all: installing torch${TORCH_VERSION:+==$TORCH_VERSION} from PyPI into $TORCH_VENV (once)"
  /usr/bin/python3 -m venv "$TORCH_VENV" && "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check \
    "torch${TORCH_VERSION:+==$TORCH_VERSION}" numpy >&2 || die "pip install torch into $TORCH_VENV failed"
fi
if [[ $NO_TORCH != 1 ]] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  die "$PYTHON cannot import torch: install python3-torch (launch/setup/install_deps.sh), set PYTHON, or NO_TORCH=1"
fi
rm -rf "$RAW" && mkdir -p "$RAW" "$(dirname "$OUT")"
if [[ $QUICK == 1 ]]; then  # the 100M model's shape at 64 wide, batch 8
  sed 's/4096/64/g; s/global_batch_size: 256/global_batch_size: 8/' "$BIG_CFG" >"$RAW/mlp_tiny.pbtxt"
  BIG_CFG=$RAW/mlp_tiny.pbtxt
fi

# ---- sizes
if [[ $QUICK == 1 ]]; then
  TRAIN=(--warmup 2 --steps 3 --repeat 2 --mp-iters 3 --sgemm-n 128)
  TORCH=(--warmup 2 --steps 3 --repeat 2)
  TORCH_BF16=(--warmup 1 --steps 2 --repeat 2)
  BIG=(--warmup 1 --steps 2 --repeat 2 --mp-iters 3 --sgemm-n 128)
  ALLREDUCE=(--min-bytes 1024 --max-bytes 16384 --target-bytes 65536 --min-iters 2 --max-iters 3)
  KERNELS=(--benchmark_filter='/(256|65536)$' --benchmark_min_time=0.01)
  PRECS=(fp32 bf16); BIG_PRECS=(fp16); WAITS=(default); TORCH_PRECS=(fp32 bf16)
  MODEL_PRECS=(bf16); GPT=(--warmup 1 --steps 1 --repeat 2 --mp-iters 1 --sgemm-n 128)
else
  TRAIN=(--warmup 20 --steps 60 --repeat 5 --mp-iters 20 --sgemm-n 1024)
  TORCH=(--warmup 20 --steps 40 --repeat 5)
  TORCH_BF16=(--warmup 5 --steps 20 --repeat 3)  # PyTorch bf16 is slow on CPUs without native bf16
  BIG=(--warmup 2 --steps 3 --repeat 3 --mp-iters 7 --sgemm-n 1024)
  ALLREDUCE=(--min-bytes 1024 --max-bytes $((256 << 20)) --target-bytes 6e8 --min-iters 5 --max-iters 40)
  KERNELS=(--benchmark_min_time=0.2)
  PRECS=(fp32 fp16 bf16); BIG_PRECS=(fp16 bf16); WAITS=(default passive); TORCH_PRECS=(fp32 fp16 bf16)
  MODEL_PRECS=(fp32 fp16 bf16); GPT=(--warmup 1 --steps 2 --repeat 3 --mp-iters 3 --sgemm-n 1024)
fi

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
# A TCP port free on this host now, for a PyTorch rendezvous (a fixed or random one may belong to another job).
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
step_title() { say ""; say "== $* ($(($(date +%s) - START)) s, load $(cut -d' ' -f1 /proc/loadavg))"; }
# The load average (1, 5, 15 min) as each raw result is written: name -> load, for the results file.
note_load() { printf '"%s": "%s",\n' "$1" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$RAW/loads.txt"; }

# torch_run NAME SCRIPT NP THREADS ARGS...: NP PyTorch processes (gloo DDP when NP > 1), rank 0's JSON to NAME, each
# rank's output to NAME.rankR.log; TORCH_ENV (an array) is added to their environment. A rank that outlives
# TORCH_TIMEOUT gets SIGTERM, on which the scripts print every thread's Python stack (faulthandler), then SIGKILL; a
# failed row prints the end of every rank's log.
TORCH_TIMEOUT=$([[ $QUICK == 1 ]] && echo 120 || echo 1800)  # a rank left waiting on a gone peer ends, with an error
TORCH_ENV=()
torch_run() {
  local name=$1 script=$2 np=$3 threads=$4; shift 4
  local port pids=() r failed=0
  port=$(free_port)
  for ((r = 0; r < np; r++)); do
    env "${TORCH_ENV[@]}" RANK=$r WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 "$TORCH_TIMEOUT" "$PYTHON" "$ROOT/bench/$script" --threads "$threads" "$@" \
      --json "$RAW/$name.json" </dev/null >"$RAW/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if ((failed)); then
    for ((r = 0; r < np; r++)); do say "--- $name rank $r (last 30 lines)"; tail -n 30 "$RAW/$name.rank$r.log" >&2; done
    die "$script ($name) failed"
  fi
  note_load "$name"
}

# ---- 1. main job throughput
for np in 1 2; do
  threads=$((NPROC / np > 0 ? NPROC / np : 1))
  for p in "${PRECS[@]}"; do
    step_title "ampdist main job, $p, $np rank(s) x $threads thread(s)"
    "${MPIRUN[@]}" -np $np "$BIN/ampdist_bench_train" --config "$MAIN_CFG" --precision $p \
      --set train.threads_per_rank=$threads "${TRAIN[@]}" --json "$RAW/ampdist_${p}_np$np.json" >/dev/null ||
      die "ampdist_bench_train $p np$np failed"
    note_load "ampdist_${p}_np$np"
  done
  [[ $NO_TORCH == 1 ]] && continue
  for p in "${TORCH_PRECS[@]}"; do
    # QUICK: PyTorch's start-up dominates; fp32 on 1 rank and bf16 DDP on 2 cover every path of torch_mlp.py.
    [[ $QUICK == 1 && $p-$np != fp32-1 && $p-$np != bf16-2 ]] && continue
    args=("${TORCH[@]}"); [[ $p == bf16 ]] && args=("${TORCH_BF16[@]}")
    for wait in "${WAITS[@]}"; do
      step_title "PyTorch main job, $p, $np rank(s) x $threads thread(s), OMP_WAIT_POLICY $wait"
      TORCH_ENV=(); [[ $wait == passive ]] && TORCH_ENV=(OMP_WAIT_POLICY=passive)
      torch_run "torch_${p}_np${np}_$wait" torch_mlp.py $np $threads --precision $p "${args[@]}"
      TORCH_ENV=()
    done
  done
done
if [[ $NP4 == 1 ]]; then
  step_title "ampdist main job, fp32, 4 ranks x 1 thread (oversubscribed)"
  "${MPIRUN[@]}" -np 4 "$BIN/ampdist_bench_train" --config "$MAIN_CFG" --precision fp32 \
    --set train.threads_per_rank=1 "${TRAIN[@]}" --json "$RAW/ampdist_fp32_np4.json" >/dev/null ||
    die "ampdist_bench_train fp32 np4 failed"
fi

# ---- 2. all-reduce
for np in 2 4; do
  [[ $np == 4 && $NP4 != 1 ]] && continue
  step_title "Reducer vs MPI_Allreduce, $np ranks"
  "${MPIRUN[@]}" -np $np "$BIN/ampdist_bench_allreduce" "${ALLREDUCE[@]}" --json "$RAW/allreduce_np$np.json" >&2 ||
    die "ampdist_bench_allreduce np$np failed"
done

# ---- 3. the 100M model: in part 5 (model_mlp100m_*), whose rows also give the mixed-precision overhead

# ---- 4. kernels
step_title "kernels (Google Benchmark)"
"$BIN/ampdist_bench_kernels" "${KERNELS[@]}" --benchmark_out="$RAW/kernels.json" --benchmark_out_format=json \
  >/dev/null || die "ampdist_bench_kernels failed"

# ---- 5. models against PyTorch: the 100M MLP, the GPT-2-small-shaped model, the fortunes GPT
GPT2_CFG=$ROOT/bench/configs/gpt2_small_shaped.pbtxt
FORTUNES_CFG=$ROOT/configs/fortunes_gpt.pbtxt
if [[ $QUICK == 1 ]]; then  # one layer, 64 wide, 32 tokens: every path, in seconds
  sed 's/n_layer: 4/n_layer: 1/; s/n_embd: 768/n_embd: 64/; s/n_head: 12/n_head: 4/; s/seq_len: 256/seq_len: 32/; s/global_batch_size: 16/global_batch_size: 4/' \
    "$GPT2_CFG" >"$RAW/gpt_tiny.pbtxt"
  GPT2_CFG=$RAW/gpt_tiny.pbtxt
  MODEL_NPS=(2); FORTUNES=(--warmup 2 --steps 2 --repeat 2 --mp-iters 1 --sgemm-n 128); TORCH_GPT=(--warmup 1 --steps 1 --repeat 2)
  TORCH_BIG=(--warmup 1 --steps 1 --repeat 2)
else
  MODEL_NPS=(1 2); FORTUNES=(--warmup 20 --steps 40 --repeat 5 --mp-iters 5 --sgemm-n 1024)
  TORCH_GPT=(--warmup 1 --steps 2 --repeat 3); TORCH_BIG=(--warmup 2 --steps 3 --repeat 3)
fi
for np in "${MODEL_NPS[@]}"; do
  threads=$((NPROC / np > 0 ? NPROC / np : 1))
  for p in "${MODEL_PRECS[@]}"; do
    for model in mlp100m gpt2s fortunes; do
      case $model in
        mlp100m) cfg=$BIG_CFG; sizes=("${BIG[@]}"); tscript=torch_mlp.py
                 targs=(--synthetic $([[ $QUICK == 1 ]] && echo 64 || echo 4096) --hidden "$(grep -o 'hidden: \[[0-9, ]*\]' "$BIG_CFG" | tr -dc '0-9,')"
                        --global-batch "$(grep -o 'global_batch_size: [0-9]*' "$BIG_CFG" | tr -dc '0-9')" --lr 0.01 "${TORCH_BIG[@]}") ;;
        gpt2s) cfg=$GPT2_CFG; sizes=("${GPT[@]}"); tscript=torch_gpt.py; targs=(--config "$GPT2_CFG" "${TORCH_GPT[@]}") ;;
        fortunes) cfg=$FORTUNES_CFG; sizes=("${FORTUNES[@]}"); tscript=torch_gpt.py
                  targs=(--config "$FORTUNES_CFG" $([[ $QUICK == 1 ]] && echo "--warmup 1 --steps 2 --repeat 2" || echo "--warmup 20 --steps 40 --repeat 5")) ;;
      esac
      step_title "ampdist $model, $p, $np rank(s) x $threads thread(s)"
      "${MPIRUN[@]}" -np $np "$BIN/ampdist_bench_train" --config "$cfg" --precision $p \
        --set train.threads_per_rank=$threads "${sizes[@]}" --json "$RAW/model_${model}_${p}_np$np.json" >/dev/null ||
        die "ampdist_bench_train $model $p np$np failed"
      note_load "model_${model}_${p}_np$np"
      [[ $NO_TORCH == 1 ]] && continue
      # Debian's torch 1.13 (QUICK runs) has no CPU fp16 autocast. Without fp16 hardware (AVX512-FP16, AMX-FP16)
      # PyTorch's CPU fp16 autocast runs far below its fp32 (the ResNet-18 and main-job fp16 rows: 1/18 and 1/6
      # on an AMD EPYC with AVX512-BF16 only), and the 100M MLP row did not finish in 15 minutes: skipped there
      # unless TORCH_FP16=1.
      [[ $p == fp16 && $QUICK == 1 ]] && continue
      if [[ $p == fp16 && ${TORCH_FP16:-0} != 1 ]] && ! grep -qwE 'avx512_fp16|amx_fp16' /proc/cpuinfo; then
        say "PyTorch $model fp16 skipped: this CPU has no fp16 hardware (TORCH_FP16=1 runs it)"
        continue
      fi
      step_title "PyTorch $model, $p, $np rank(s) x $threads thread(s)"
      torch_run "torchmodel_${model}_${p}_np$np" "$tscript" $np $threads --precision $p "${targs[@]}"
    done
  done
done

# ---- table and results file
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
CPU=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
CPU_FLAGS=$(awk -F': ' '/^flags/ { print $2; exit }' /proc/cpuinfo | tr ' ' '\n' |
  grep -E '^(avx2|f16c|fma|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|amx_int8|avx_vnni)$' | paste -sd' ' -)
TORCH_VERSION=$([[ $NO_TORCH == 1 ]] && echo none || "$PYTHON" -c 'import torch; print(torch.__version__)')
cat >"$RAW/meta.json.in" <<EOF
{"date": "$(date -Iseconds)", "command": "$([[ $QUICK == 1 ]] && echo "QUICK=1 ")bench/run_all.sh",
 "host": "$(hostname)", "cpu": "$CPU", "cpu_flags": "$CPU_FLAGS", "nproc": $NPROC,
 "loads": {$(sed '$ s/,$//' "$RAW/loads.txt" 2>/dev/null | tr -d '\n')},
 "mem_total_kib": $(awk '/MemTotal/ { print $2 }' /proc/meminfo),
 "git_commit": "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)",
 "git_dirty": $(git -C "$ROOT" diff --quiet HEAD 2>/dev/null && echo false || echo true),
 "mpirun": "$(mpirun --version 2>/dev/null | head -1)", "torch": "$TORCH_VERSION",
 "loadavg_start": "$LOAD_START", "loadavg_end": "$LOAD_END", "seconds": $(($(date +%s) - START))}
EOF
"$PYTHON" "$ROOT/bench/report.py" "$RAW" "$OUT" --meta "$RAW/meta.json.in"
say "wrote ${OUT#"$ROOT"/} ($(($(date +%s) - START)) s)"
