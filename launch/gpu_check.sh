#!/usr/bin/env bash
# The GPU check: on a host with NVIDIA GPUs (the driver, and nothing else: no toolkit, no MPI, no network), run the
# CUDA backend's tests, a set-up fault drill, training runs in fp32, fp16 and bf16, on 2 or more GPUs data-parallel
# runs in ZeRO stages 0 and 1, the NCCL all-reduce benchmark and the kernel micro-benchmarks from the carried bundle
# (launch/gpu_bundle.sh), then give one verdict and a table.
#
#   bash launch/gpu_check.sh [BUNDLE]      BUNDLE: the bundle directory or its .tar.gz
#                                          (default build/gpu-bundle, else build/gpu-bundle.tar.gz)
#
# Exit 0 only when every GPU test passed and none was skipped, every training run and the drill ended as they must,
# ZeRO stage 1 matched stage 0, and the benchmarks' results checked out. Anything else is exit 1 with one line
# "gpu_check: FAIL: ..." naming every failure (failed tests by name, a crashed test binary, a stage that timed out or
# that had no time left to start); when nothing could run on a GPU (the preflight found something missing), that line
# is all it prints.
# Bounded to GPU_CHECK_SECONDS in all (default 570): each stage has its own limit, and the limits of the stages that
# run on this host are scaled to fit the time left after the preflight. Logs: $GPU_CHECK_OUT (default
# build/gpu-check). Step counts: GPU_CHECK_MLP_STEPS (1500), GPU_CHECK_GPT_STEPS (300), GPU_CHECK_CNN_STEPS (300),
# GPU_CHECK_GPT2_STEPS (30); the multi-GPU runs take a fifth of the MLP's and a third of the GPT's and the CNN's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
start=$SECONDS
total=${GPU_CHECK_SECONDS:-570}
deadline=$((SECONDS + total))
out=${GPU_CHECK_OUT:-$root/build/gpu-check}
rm -rf "$out"
mkdir -p "$out"
left() { echo $((deadline - SECONDS)); }
say() { echo "gpu_check: $*"; }
fail_line() { echo "gpu_check: FAIL: $*"; }

# ---- the bundle -------------------------------------------------------------------------------------------------
bundle=${1:-}
if [[ -z $bundle ]]; then
  bundle=build/gpu-bundle
  [[ -d $bundle ]] || bundle=build/gpu-bundle.tar.gz
fi
if [[ -f $bundle && $bundle == *.tar.gz ]]; then
  t0=$SECONDS
  mkdir -p "$out/unpacked"
  tar -C "$out/unpacked" -xzf "$bundle" || { fail_line "nothing ran on a GPU: cannot unpack $bundle"; exit 1; }
  bundle=$(find "$out/unpacked" -mindepth 1 -maxdepth 1 -type d | head -1)
  echo "unpacked in $((SECONDS - t0)) s" > "$out/unpack.txt"
fi
if [[ ! -x $bundle/bin/ampdist || ! -f $bundle/env.sh ]]; then
  fail_line "nothing ran on a GPU: no bundle at ${1:-build/gpu-bundle[.tar.gz]} (make one with launch/gpu_bundle.sh)"
  exit 1
fi
bundle=$(cd "$bundle" && pwd)
# shellcheck disable=SC1091
source "$bundle/env.sh"
bin=$bundle/bin

# ---- preflight: everything a run needs, then one line of what is missing ------------------------------------------
missing=()
pre=$out/preflight.txt
: > "$pre"
gpus=0 gpu_name="" driver=""
if ! command -v nvidia-smi >/dev/null; then
  missing+=("nvidia-smi is not on PATH (no NVIDIA driver installed?)")
elif ! nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader \
       >"$out/gpus.csv" 2>&1; then
  missing+=("nvidia-smi failed: $(head -1 "$out/gpus.csv")")
else
  gpus=$(grep -c . "$out/gpus.csv")
  gpu_name=$(head -1 "$out/gpus.csv" | cut -d, -f2 | sed 's/^ *//;s/ *$//')
  driver=$(head -1 "$out/gpus.csv" | cut -d, -f3 | tr -d ' ')
  sed 's/^/gpu: /' "$out/gpus.csv" >> "$pre"
  (( gpus > 0 )) || missing+=("nvidia-smi lists no GPU")
  # The oldest driver branch that runs the bundle's CUDA runtime (its MANIFEST, from the toolkit it was built with).
  driver_min=$(sed -n 's/^driver_min: \([0-9]*\).*/\1/p' "$bundle/MANIFEST" 2>/dev/null)
  cuda_rt=$(sed -n 's/^cuda_runtime: \([0-9.]*\).*/\1/p' "$bundle/MANIFEST" 2>/dev/null)
  if [[ -z $driver_min ]]; then
    missing+=("the bundle's MANIFEST names no driver_min (rebuild it with launch/gpu_bundle.sh)")
  elif ! [[ ${driver%%.*} =~ ^[0-9]+$ ]] || (( ${driver%%.*} < driver_min )); then
    missing+=("driver $driver is older than the R$driver_min branch that the bundle's CUDA ${cuda_rt:-runtime} needs")
  fi
fi
echo "driver: ${driver:-none}; GPUs: $gpus x ${gpu_name:-none}" >> "$pre"
# Device code for this GPU: its own cubin (sm_XY), or PTX of an older architecture that the driver compiles.
archs=$(sed -n 's/^cuda_architectures: //p' "$bundle/MANIFEST" 2>/dev/null)
cc=$(head -1 "$out/gpus.csv" 2>/dev/null | cut -d, -f5 | tr -d ' .')
if [[ -z $archs ]]; then
  missing+=("the bundle's MANIFEST names no device code (cuda_architectures)")
elif [[ -n $cc && " $archs " != *" sm_$cc "* ]]; then
  ptx_ok=0
  for a in $archs; do [[ $a == compute_* ]] && (( ${a#compute_} <= cc )) && ptx_ok=1; done
  (( ptx_ok )) || missing+=("the bundle has no device code for compute capability $cc (it has: $archs)")
fi
echo "device code: ${archs:-unknown}" >> "$pre"
# Every library of every carried ELF file resolves (the bundle's own self-check).
if ! bash "$bundle/selfcheck.sh" > "$out/selfcheck.txt" 2>&1; then
  missing+=("carried libraries unresolved: $(grep -v '^selfcheck: [0-9]* ELF' "$out/selfcheck.txt" | head -3 | tr '\n' ' ')")
fi
cat "$out/selfcheck.txt" >> "$pre"
# The driver's libcuda.so.1, which the statically linked CUDA runtime loads at run time.
"$bin/ampdist" env > "$out/env.txt" 2>&1
cuda_line=$(grep -m1 'CUDA driver:' "$out/env.txt" | sed 's/^ *CUDA driver: *//')
echo "libcuda: ${cuda_line:-unknown}" >> "$pre"
if [[ -z $cuda_line ]]; then
  missing+=("ampdist env failed: $(tail -1 "$out/env.txt")")
elif [[ $cuda_line == *"not found"* || $cuda_line == *rror* ]]; then
  missing+=("the NVIDIA driver's libcuda.so.1 cannot be loaded: $cuda_line (no driver in this machine or container)")
fi
# The host CPU: the bundle's binaries need x86-64 with AVX2 (launch/check_isa.sh's baseline), or every flag of the
# build machine's CPU when it was built with -march=native.
cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
cpu_flags=$(awk -F': ' '/^flags/ {print $2; exit}' /proc/cpuinfo)
echo "cpu: $cpu_model; $(for f in avx2 fma f16c avx512f avx512_bf16 avx512_fp16 amx_bf16; do
  [[ " $cpu_flags " == *" $f "* ]] && printf '%s ' "$f"; done)" >> "$pre"
need=$(sed -n 's/^cpu_flags_required: \([^(]*\).*/\1/p' "$bundle/MANIFEST" 2>/dev/null)
lacking=""
for f in ${need:-avx2}; do [[ " $cpu_flags " == *" $f "* ]] || lacking+="$f "; done
[[ -z $lacking ]] || missing+=("the host CPU ($cpu_model) lacks ${lacking% } that the bundle's binaries may use (MANIFEST: cpu_flags_required; rebuild with -DAMPDIST_NATIVE=OFF for a portable bundle)")
grep -h '^isa_check:' "$bundle/MANIFEST" >> "$pre" 2>/dev/null
if (( ${#missing[@]} > 0 )); then
  reason=$(printf '%s; ' "${missing[@]}")
  fail_line "nothing ran on a GPU: ${reason%; } (nvidia-smi: ${gpus} x ${gpu_name:-none}; details in $pre)"
  exit 1
fi
cat "$pre"


failures=()
ran_on_gpu=0
mpi=(mpirun)
(( $(id -u) == 0 )) && mpi+=(--allow-run-as-root)

# ---- the stages and their limits ----------------------------------------------------------------------------------
mlp_steps=${GPU_CHECK_MLP_STEPS:-1500}
gpt_steps=${GPU_CHECK_GPT_STEPS:-300}
cnn_steps=${GPU_CHECK_CNN_STEPS:-300}
gpt2_steps=${GPU_CHECK_GPT2_STEPS:-30}
zero_steps_mlp=$(( mlp_steps / 5 > 0 ? mlp_steps / 5 : 1 ))
zero_steps_gpt=$(( gpt_steps / 3 > 0 ? gpt_steps / 3 : 1 ))
zero_steps_cnn=$(( cnn_steps / 3 > 0 ? cnn_steps / 3 : 1 ))
# On exactly 2 GPUs ZeRO stage 1 must end with stage 0's master weights hash in any precision (every sum has two
# terms), so those runs are bf16; on more GPUs the order of a gradient sum may differ between the stages and the
# step losses are compared within a bound derived for FP32 sums, so those runs are fp32.
zero_p=fp32
(( gpus == 2 )) && zero_p=bf16
zero_models=("MLP" "GPT fortunes" "CNN")

# GPT-2 small's shape: vocabulary 50257, 12 layers, C 768, T 1024. Its tokens: token files written here.
# write_tokens FILE COUNT SEED: COUNT tokens in runtime/data/token_data.h's layout (256 little-endian int32: magic
# 20240520, version 1, token count, vocabulary size; then the tokens as little-endian uint16), each drawn from the
# vocabulary of 50257 by the Park-Miller generator (x = 16807 x mod 2^31 - 1, exact in awk's doubles). awk writes
# the bytes as \xHH escapes that bash's printf turns into bytes (gawk's %c writes a character above 127 as UTF-8
# under a UTF-8 locale).
write_tokens() {
  local file=$1 n=$2 seed=$3 line
  awk -v n="$n" -v x="$seed" -v v=50257 '
    function le(x, k,  s, i) { s = ""; for (i = 0; i < k; ++i) { s = s sprintf("\\x%02x", x % 256); x = int(x / 256) } return s }
    BEGIN {
      printf "%s%s%s%s", le(20240520, 4), le(1, 4), le(n, 4), le(v, 4)
      for (i = 4; i < 256; ++i) printf "%s", le(0, 4)
      printf "\n"
      for (i = 0; i < n; ++i) {
        x = (x * 16807) % 2147483647
        printf "%s", le(x % v, 2)
        if (i % 512 == 511) printf "\n"
      }
      printf "\n"
    }' | while IFS= read -r line; do
    # shellcheck disable=SC2059  # the line is the format: only \xHH escapes
    printf "$line"
  done > "$file"
  [[ $(wc -c < "$file") -eq $((1024 + 2 * n)) ]]
}
# 64 training windows of 1024 + 1 tokens and 8 validation windows (one evaluation batch).
mkdir -p "$out/gpt2_tokens"
gpt2_tokens=0
write_tokens "$out/gpt2_tokens/train.bin" $((64 * 1024 + 1)) 1 && write_tokens "$out/gpt2_tokens/val.bin" $((8 * 1024 + 1)) 2 &&
  gpt2_tokens=1

# Nominal limits in seconds, in the order the stages run. When their sum does not fit the time left (less the table's
# reserve, the kill grace of one stage and 1 s per stage for reading its log), every limit but the drill's is scaled
# down by the same factor (to at least 5 s), so that the stages that run on this host fit in GPU_CHECK_SECONDS. The
# drill keeps 60 s, the time within which it must end.
grace=5
reserve=$((10 + grace))
declare -A cap
stage_names=() stage_nominal=() stage_fixed=()
plan() { stage_names+=("$1"); stage_nominal+=("$2"); stage_fixed+=("${3:-0}"); }  # plan NAME SECONDS [1: not scaled]
plan "GPU tests np1" 150
(( gpus >= 2 )) && plan "GPU tests np$gpus" 150
plan "NCCL set-up drill" 60 1
for p in fp32 fp16 bf16; do plan "training MLP $p" 25; done
for p in fp32 fp16 bf16; do plan "training GPT fortunes $p" 25; done
for p in fp32 bf16; do plan "training CNN $p" 35; done
(( gpt2_tokens )) && for p in bf16 fp16; do plan "training GPT-2 124M shape $p" 50; done
if (( gpus >= 2 )); then
  for m in "${zero_models[@]}"; do
    for z in 0 1; do
      case $m in CNN) n=25 ;; *) n=20 ;; esac
      plan "training $m $gpus GPUs ZeRO $z $zero_p" "$n"
    done
  done
fi
if [[ -x $bin/ampdist_bench_gpu ]]; then
  plan "NCCL all-reduce benchmark on 1 GPU(s)" 15
  (( gpus >= 2 )) && plan "NCCL all-reduce benchmark on $gpus GPU(s)" 25
  plan "kernel micro-benchmarks" 50
fi
fixed_sum=0 scaled_sum=0
for i in "${!stage_names[@]}"; do
  if (( stage_fixed[i] )); then fixed_sum=$((fixed_sum + stage_nominal[i])); else scaled_sum=$((scaled_sum + stage_nominal[i])); fi
done
budget=$(( $(left) - reserve - ${#stage_names[@]} - fixed_sum ))
(( budget < 0 )) && budget=0
for i in "${!stage_names[@]}"; do
  c=${stage_nominal[i]}
  if (( !stage_fixed[i] && scaled_sum > budget )); then
    c=$(( c * budget / scaled_sum ))
    (( c < 5 )) && c=5
  fi
  cap[${stage_names[i]}]=$c
done
{
  echo "time: $total s in all, $(left) s left after the preflight; stage limits (nominal $((fixed_sum + scaled_sum)) s):"
  for s in "${stage_names[@]}"; do echo "  ${cap[$s]} s  $s"; done
} > "$out/limits.txt"
out_of_time=()

# run_stage NAME LOG COMMAND...: COMMAND under NAME's limit, its output in LOG. Returns 1 without running it when its
# whole limit no longer fits in the time left (NAME joins the failure "out of time, not started: ..."). Sets st_rc (exit status), st_dt
# (seconds) and st_timed_out (1 when the limit stopped it: a failure "NAME: timed out after N s").
run_stage() {
  local name=$1 log=$2; shift 2
  local c=${cap[$name]} avail=$(( $(left) - reserve )) t0=$SECONDS
  st_rc=-1 st_dt=0 st_timed_out=0
  if (( avail < c )); then
    out_of_time+=("$name")
    return 1
  fi
  timeout -k "$grace" "$c" "$@" >"$log" 2>&1
  st_rc=$? st_dt=$((SECONDS - t0))
  # 124: timeout stopped it with SIGTERM; 137 after the limit: it ignored SIGTERM and was killed $grace s later.
  if (( st_rc == 124 || (st_rc == 137 && st_dt >= c) )); then
    st_timed_out=1
    failures+=("$name: timed out after $c s (see $log)")
  fi
  return 0
}

# ---- 1. the GPU tests ------------------------------------------------------------------------------------------
# gtest_counts LOG: "passed failed skipped" from gtest's summary lines.
gtest_counts() {
  local p f s
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  echo "${p:-0} ${f:-0} ${s:-0}"
}
# gtest_failed LOG: the failed tests' names, each once, from gtest's "[  FAILED  ] Suite.Test" lines (under mpirun
# every rank prints its own), joined by ", ".
gtest_failed() {
  sed -n 's/^\[  FAILED  \] \([A-Za-z_][^ ]*\).*/\1/p' "$1" | awk '!seen[$0]++ {printf "%s%s", (n++ ? ", " : ""), $0}'
}
declare -A test_row
run_tests() {  # run_tests NAME COMMAND...
  local name=$1; shift
  local stage="GPU tests $name" log=$out/tests_$name.log
  if ! run_stage "$stage" "$log" "$@"; then test_row[$name]="not run (out of time)"; say "$stage: not run (out of time)"; return; fi
  local rc=$st_rc p f s started summary last sig how
  read -r p f s < <(gtest_counts "$log")
  (( p > 0 )) && ran_on_gpu=1
  started=$(grep -c '^\[ RUN      \]' "$log")
  summary=$(grep -c '^\[==========\] [0-9]* tests\{0,1\} from .* ran\.' "$log")
  last=$(sed -n 's/^\[ RUN      \] \([^ ]*\).*/\1/p' "$log" | tail -1)
  # mpirun names a rank that a signal ended: "mpirun noticed that process rank R ... exited on signal N (...)".
  sig=$(sed -n 's/.*exited on signal \([0-9]*\).*/\1/p' "$log" | head -1)
  if (( st_timed_out )); then
    test_row[$name]="timed out after ${cap[$stage]} s${last:+ during $last} ($p passed, $f failed so far)"
    [[ -n $last ]] && failures[-1]="$stage: timed out after ${cap[$stage]} s during test $last (see $log)"
  elif (( rc >= 128 )) || [[ -n $sig ]] || (( summary == 0 && started > 0 )); then
    if [[ -n $sig ]]; then how="signal $sig"; elif (( rc > 128 )); then how="signal $((rc - 128))"; else how="exit $rc"; fi
    test_row[$name]="crashed ($how) after test ${last:-none} ($p passed, $f failed before)"
    failures+=("$stage: crashed ($how) after test ${last:-none} (see $log)")
  else
    test_row[$name]="$p passed, $f failed, $s skipped (exit $rc)"
    if (( f > 0 )); then
      failures+=("$stage: $f failed: $(gtest_failed "$log") (see $log)")
    elif (( rc != 0 )); then
      failures+=("$stage: exit $rc (see $log)")
    fi
    if (( s > 0 )); then
      # gtest prints "<file>:<line>: Skipped" and the reason on the next line; else name the first skipped test.
      local why
      why=$(grep -m1 -A1 ': Skipped$' "$log" | tail -1)
      [[ -n $why ]] || why=$(grep -m1 '^\[  SKIPPED \] [A-Za-z]' "$log" | sed 's/^\[  SKIPPED \] //; s/ ([0-9]* ms)$//')
      failures+=("$stage: $s skipped (first: $why)")
    fi
    (( p == 0 && s == 0 && f == 0 )) && failures+=("$stage: no test ran (exit $rc, see $log)")
  fi
  say "$stage: ${test_row[$name]}"
}
# One process: everything but the tests that need two ranks.
run_tests np1 "$bin/ampdist_gpu_tests" --gtest_filter='-GpuTwoRanks*'
if (( gpus >= 2 )); then
  run_tests "np$gpus" "${mpi[@]}" -np "$gpus" "$bin/ampdist_gpu_tests"
fi

# ---- 2. the NCCL set-up fault drill: one rank fails to join, every rank ends within the deadline, one line, exit 1 --
drill_row="not run (out of time)"
drill_log=$out/drill_nccl_setup.log
if run_stage "NCCL set-up drill" "$drill_log" env AMPDIST_FAULT='nccl_setup_error { rank: 1 stage: INIT }' \
     "${mpi[@]}" -q -np 2 "$bin/ampdist" train --config configs/fashion_mnist_mlp.pbtxt --device cuda \
     --set device.allow_sharing=true --set comm.timeout_s=30 --set "data.idx.dir=$bundle/data/fashion-mnist" \
     --set train.steps=5 --run-dir "$out/run_drill"; then
  if (( st_timed_out )); then
    drill_row="timed out after ${cap[NCCL set-up drill]} s"
  else
    lines=$(grep -c '^ampdist: error:' "$drill_log")
    drill_row="exit $st_rc in $st_dt s, $lines error line(s)"
    (( st_rc == 1 && lines == 1 && st_dt < 60 )) ||
      failures+=("NCCL set-up drill: expected exit 1 with one error line within 60 s, got $drill_row (see $drill_log)")
  fi
fi
say "NCCL set-up drill: $drill_row"

# ---- 3. training runs ------------------------------------------------------------------------------------------
declare -A sps steady mfu status whash row_seen
rows=()  # the table's rows, in the order they ran
# Dense tensor-core and FP32 peaks of the GPU model, FLOP/s (NVIDIA datasheets: H100/H200 SXM 989 TFLOP/s bf16/fp16
# dense, 67 TFLOP/s FP32; A100 312 and 19.5).
case $gpu_name in
  *H200*|*H100*SXM*|*H100\ 80GB\ HBM3*) peak16=989e12 peak32=67e12 ;;
  *H100*) peak16=756e12 peak32=51e12 ;;
  *A100*) peak16=312e12 peak32=19.5e12 ;;
  *) peak16="" peak32="" ;;
esac
# At least the steps up to this one (CUDA, cuBLAS and cuDNN initialisation, the memory pool's growth) are left out
# of the steady samples/s and so of the MFU.
warm=5
# steady_sps METRICS_JSONL: samples/s over the steps after the first train record at or after step $warm. A train
# record's samples_per_s is the rate of the steps since the record before it and its time_s the training seconds so
# far, so a window's samples are samples_per_s x (time_s - the previous record's time_s). Empty when no record
# follows that first one.
steady_sps() {
  [[ -f $1 ]] || return 0
  awk -v warm="$warm" '
    function num(k) {
      if (!match($0, "\"" k "\":[-+0-9.eE]+")) return -1
      return substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3) + 0
    }
    /"type":"train"/ {
      t = num("time_s")
      if (have) samples += num("samples_per_s") * (t - prev)
      else if (num("step") >= warm) { have = 1; base = t }
      prev = t
    }
    END { if (have && prev > base) printf "%.1f", samples / (prev - base) }' "$1"
}
# train_run ROW PRECISION RANKS CONFIG FLOPS_PER_SAMPLE ARGS...: one training run (under mpirun when RANKS > 1).
train_run() {
  local row=$1 p=$2 np=$3 cfg=$4 fps=$5; shift 5
  local key="$row/$p" stage="training $row $p" tag=${row// /_}_$p
  local log=$out/train_$tag.log run=$out/run_$tag launch=()
  (( np > 1 )) && launch=("${mpi[@]}" -np "$np")
  [[ -n ${row_seen[$row]:-} ]] || { rows+=("$row"); row_seen[$row]=1; }
  if ! run_stage "$stage" "$log" "${launch[@]}" "$bin/ampdist" train --config "$cfg" --device cuda --precision "$p" \
       "$@" --set checkpoint.save_final=false --run-dir "$run"; then
    status[$key]="not run (out of time)"
    return
  fi
  local rc=$st_rc
  sps[$key]=$(awk '/^samples\/s:/ {print $2}' "$log")
  steady[$key]=$(steady_sps "$run/metrics.jsonl")
  whash[$key]=$(sed -n 's/^master weights hash: \([0-9a-f]\{16\}\)$/\1/p' "$log" | tail -1)
  status[$key]="exit $rc"
  if (( st_timed_out )); then
    status[$key]="timed out after ${cap[$stage]} s"
  elif (( rc != 0 )); then
    failures+=("$stage: exit $rc: $(grep -m1 'error' "$log")")
  elif grep -q 'CUDA backend' "$log"; then
    ran_on_gpu=1
  else
    failures+=("$stage: did not run on the CUDA backend")
  fi
  local peak=$peak32
  [[ $p != fp32 ]] && peak=$peak16
  if [[ -n ${steady[$key]} && -n $fps && -n $peak ]]; then
    mfu[$key]=$(awk -v s="${steady[$key]}" -v f="$fps" -v pk="$peak" -v n="$np" 'BEGIN {printf "%.1f%%", 100 * s * f / (pk * n)}')
  fi
}
# GPT FLOPs per sample (a window of T tokens): 6 N T for the parameter GEMMs forward and backward plus 12 L C T^2
# for attention's two GEMMs (PaLM, appendix B; llm.c's estimate_mfu), with N = 12 L C^2 (the blocks' matrices) +
# V C (the tied LM head, which is a GEMM; the position table is not).
gpt_flops() {  # gpt_flops L C T V
  awk -v L="$1" -v C="$2" -v T="$3" -v V="$4" 'BEGIN {N = L * 12 * C * C + V * C; printf "%.6e", 6 * N * T + 12 * L * C * T * T}'
}
fortunes=(--set "data.tokens.train=$bundle/data/fortunes/train.bin" --set "data.tokens.val=$bundle/data/fortunes/val.bin")
for p in fp32 fp16 bf16; do
  train_run "MLP" "$p" 1 configs/fashion_mnist_mlp.pbtxt "" --set "data.idx.dir=$bundle/data/fashion-mnist" \
    --set "train.steps=$mlp_steps" --set log.every_steps=500
done
for p in fp32 fp16 bf16; do
  train_run "GPT fortunes" "$p" 1 configs/fortunes_gpt.pbtxt "$(gpt_flops 2 64 64 256)" "${fortunes[@]}" \
    --set "train.steps=$gpt_steps" --set log.every_steps=100
done
# The conv net (cuDNN convolutions, BatchNorm and pooling kernels), where the build has cuDNN.
for p in fp32 bf16; do
  train_run "CNN" "$p" 1 configs/fashion_mnist_cnn.pbtxt "" --set "data.idx.dir=$bundle/data/fashion-mnist" \
    --set "train.steps=$cnn_steps" --set log.every_steps=100
done

if (( gpt2_tokens )); then
  gpt2=(--set model.gpt.n_layer=12 --set model.gpt.n_head=12 --set model.gpt.n_embd=768 --set model.gpt.seq_len=1024
        --set model.gpt.vocab_size=50257
        --set "data.tokens.train=$out/gpt2_tokens/train.bin" --set "data.tokens.val=$out/gpt2_tokens/val.bin"
        --set data.global_batch_size=8 --set data.eval_batch_size=8 --set "train.steps=$gpt2_steps"
        --set log.every_steps=1 --set optimizer.schedule.warmup_steps=5)
  for p in bf16 fp16; do
    train_run "GPT-2 124M shape" "$p" 1 configs/fortunes_gpt.pbtxt "$(gpt_flops 12 768 1024 50257)" "${gpt2[@]}"
  done
else
  rows+=("GPT-2 124M shape")
  for p in bf16 fp16; do status["GPT-2 124M shape/$p"]="not run (no token file)"; done
  failures+=("GPT-2 124M shape: could not write its token files in $out/gpt2_tokens")
fi

# ---- 4. data parallel on every GPU: ZeRO stage 1 against stage 0 ----------------------------------------------------
declare -A zero_row
# batch_for B: B rounded up to a multiple of the GPU count (the global batch must split evenly over the ranks).
batch_for() { echo $(( ($1 + gpus - 1) / gpus * gpus )); }
# loss_gap A B: "WORST STEP", the largest relative difference between the train records' losses of two metrics.jsonl
# files and the step where it is; "missing" when their steps differ or a loss is not a number.
loss_gap() {
  [[ -s $1 && -s $2 ]] || { echo missing; return; }
  awk '
    function num(k) {
      if (!match($0, "\"" k "\":[-+0-9.eE]+")) return ""
      return substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3) + 0
    }
    FNR == 1 { f++ }
    /"type":"train"/ {
      s = num("step"); l = num("loss")
      if (l == "") { bad = 1; next }
      if (f == 1) { a[s] = l; na++; next }
      if (!(s in a)) { bad = 1; next }
      nb++
      d = a[s] - l; if (d < 0) d = -d
      m = a[s]; if (m < 0) m = -m
      if (m > 0) d /= m
      if (!have || d > worst) { worst = d; at = s; have = 1 }
    }
    END { if (bad || na == 0 || na != nb) print "missing"; else printf "%.3g %d\n", worst, at }' "$1" "$2"
}
if (( gpus >= 2 )); then
  # Relative bound on the step losses' differences on more than 2 GPUs (the argument of tests/e2e/test_zero.sh):
  # each step's summed gradient may differ by the rounding of a (GPUs)-term FP32 sum in another order, at most
  # gamma_{GPUs-1} = (GPUs-1) u / (1 - (GPUs-1) u) relative (u = 2^-24), so S steps differ by at most
  # S x gamma_{GPUs-1}, and never by less than the README's 1e-5.
  zero_bound() {
    awk -v g="$gpus" -v s="$1" 'BEGIN {u = 2 ^ -24; b = s * (g - 1) * u / (1 - (g - 1) * u); if (b < 1e-5) b = 1e-5; printf "%.3g", b}'
  }
  for m in "${zero_models[@]}"; do
    case $m in
      MLP) cfg=configs/fashion_mnist_mlp.pbtxt zs=$zero_steps_mlp fps="" b=128
           args=(--set "data.idx.dir=$bundle/data/fashion-mnist") ;;
      "GPT fortunes") cfg=configs/fortunes_gpt.pbtxt zs=$zero_steps_gpt fps=$(gpt_flops 2 64 64 256) b=32
           args=("${fortunes[@]}") ;;
      CNN) cfg=configs/fashion_mnist_cnn.pbtxt zs=$zero_steps_cnn fps="" b=128
           args=(--set "data.idx.dir=$bundle/data/fashion-mnist") ;;
    esac
    every=10
    (( gpus > 2 )) && every=1
    for z in 0 1; do
      train_run "$m $gpus GPUs ZeRO $z" "$zero_p" "$gpus" "$cfg" "$fps" "${args[@]}" --set "train.steps=$zs" \
        --set "log.every_steps=$every" --set "data.global_batch_size=$(batch_for "$b")" --set "optimizer.zero_stage=$z"
    done
    k0="$m $gpus GPUs ZeRO 0/$zero_p" k1="$m $gpus GPUs ZeRO 1/$zero_p"
    [[ ${status[$k0]} == "exit 0" && ${status[$k1]} == "exit 0" ]] || { zero_row[$m]="not compared"; continue; }
    name="ZeRO stage 1 against stage 0, $m on $gpus GPUs"
    if (( gpus == 2 )); then
      if [[ -n ${whash[$k0]} && ${whash[$k0]} == "${whash[$k1]}" ]]; then
        zero_row[$m]="same master weights hash ${whash[$k1]}"
      else
        zero_row[$m]="master weights hash ${whash[$k1]:-none}, stage 0 ${whash[$k0]:-none}"
        failures+=("$name: stage 1 ends with master weights hash ${whash[$k1]:-none}, stage 0 with ${whash[$k0]:-none} (they must be equal on 2 ranks)")
      fi
    else
      bound=$(zero_bound "$zs")
      read -r worst at < <(loss_gap "$out/run_${m// /_}_${gpus}_GPUs_ZeRO_0_$zero_p/metrics.jsonl" \
                                    "$out/run_${m// /_}_${gpus}_GPUs_ZeRO_1_$zero_p/metrics.jsonl")
      if [[ $worst == missing ]]; then
        zero_row[$m]="step losses missing"
        failures+=("$name: the runs' metrics.jsonl do not hold a loss for the same steps")
      elif awk -v w="$worst" -v b="$bound" 'BEGIN {exit !(w <= b)}'; then
        zero_row[$m]="step losses within $worst relative (bound $bound)"
      else
        zero_row[$m]="step losses differ by $worst relative at step $at (bound $bound)"
        failures+=("$name: step losses differ by $worst relative at step $at, more than $bound")
      fi
    fi
    say "$name: ${zero_row[$m]}"
  done
fi

# ---- 5. NCCL all-reduce bus bandwidth, and the kernel micro-benchmarks --------------------------------------------
declare -A busbw
if [[ -x $bin/ampdist_bench_gpu ]]; then
  for n in 1 $(( gpus >= 2 ? gpus : 0 )); do
    (( n > 0 )) || continue
    log=$out/nccl_np$n.log
    stage="NCCL all-reduce benchmark on $n GPU(s)"
    run_stage "$stage" "$log" "${mpi[@]}" -np "$n" "$bin/ampdist_bench_gpu" allreduce || { busbw[$n]="not run (out of time)"; continue; }
    busbw[$n]=$(awk '/^allreduce max:/ {print $3 " GB/s algbw, " $6 " GB/s busbw at " $10 " bytes"}' "$log")
    if (( st_timed_out )); then
      busbw[$n]="timed out after ${cap[$stage]} s"
    elif (( st_rc != 0 )); then
      failures+=("$stage: exit $st_rc: $(grep -m1 -i 'error\|wrong' "$log")")
    fi
  done
  stage="kernel micro-benchmarks"
  if run_stage "$stage" "$out/kernels.log" "$bin/ampdist_bench_gpu" kernels && (( !st_timed_out && st_rc != 0 )); then
    failures+=("$stage: exit $st_rc (see $out/kernels.log)")
  fi
else
  failures+=("the bundle has no ampdist_bench_gpu (NCCL bandwidth and kernel benchmarks not run)")
fi

# ---- verdict and table -------------------------------------------------------------------------------------------
if (( ${#out_of_time[@]} > 0 )); then
  names=$(printf '%s, ' "${out_of_time[@]}")
  failures+=("out of time, not started: ${names%, } (limits in $out/limits.txt)")
fi
if (( !ran_on_gpu )); then
  reason=$(printf '%s; ' "${failures[@]}")
  (( ${#failures[@]} > 0 )) || reason="no test and no run reported the GPU; "
  failures=("nothing ran on a GPU: ${reason%; }")
fi
echo
if (( ${#failures[@]} > 0 )); then
  reason=$(printf '%s; ' "${failures[@]}")
  fail_line "${reason%; }"
  verdict=1
else
  say "PASS: every GPU test passed (none skipped), every run and the drill ended as they must ($((SECONDS - start)) s)"
  verdict=0
fi
echo
echo "==== gpu_check: $gpus x $gpu_name, driver $driver, $((SECONDS - start)) s of $total ===="
printf '%-30s %s\n' "GPU tests (1 process)" "${test_row[np1]:-not run}"
(( gpus >= 2 )) && printf '%-30s %s\n' "GPU tests ($gpus ranks)" "${test_row[np$gpus]:-not run}"
printf '%-30s %s\n' "NCCL set-up drill" "$drill_row"
# samples/s: the whole run's; steady: after step $warm (the MFU's).
printf '%-30s %-6s %-11s %-11s %-8s %s\n' "run" "prec" "samples/s" "steady" "MFU" "status"
for row in "${rows[@]}"; do
  for p in fp32 fp16 bf16; do
    [[ -n ${status[$row/$p]:-} ]] || continue
    printf '%-30s %-6s %-11s %-11s %-8s %s\n' "$row" "$p" "${sps[$row/$p]:-n/a}" "${steady[$row/$p]:-n/a}" \
      "${mfu[$row/$p]:--}" "${status[$row/$p]}"
  done
done
if (( gpus >= 2 )); then
  for m in "${zero_models[@]}"; do
    printf '%-30s %s\n' "ZeRO 1 vs 0, $m" "${zero_row[$m]:-not compared}"
  done
fi
printf '%-30s %s\n' "NCCL all-reduce 1 GPU" "${busbw[1]:-not run}"
(( gpus >= 2 )) && printf '%-30s %s\n' "NCCL all-reduce $gpus GPUs" "${busbw[$gpus]:-not run}"
[[ -f $out/kernels.log ]] && grep '^kernel ' "$out/kernels.log"
echo "logs: $out (stage limits: $out/limits.txt)"
exit $verdict
