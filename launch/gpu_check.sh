#!/usr/bin/env bash
# The GPU check: on a host with NVIDIA GPUs (the driver, and nothing else: no toolkit, no MPI, no network), run the
# CUDA backend's tests, a set-up fault drill, training runs in fp32, fp16 and bf16, the NCCL all-reduce benchmark
# and the kernel micro-benchmarks from the carried bundle (launch/gpu_bundle.sh), then give one verdict and a table.
#
#   bash launch/gpu_check.sh [BUNDLE]      BUNDLE: the bundle directory or its .tar.gz
#                                          (default build/gpu-bundle, else build/gpu-bundle.tar.gz)
#
# Exit 0 only when every GPU test passed and none was skipped, every training run and the drill ended as they must,
# and the benchmarks' results checked out. Anything else is exit 1 with one line "gpu_check: FAIL: ..." saying why;
# when nothing could run on a GPU (the preflight found something missing), that line is all it prints.
# Bounded to 9.5 minutes in all (each stage has its own limit). Logs: $GPU_CHECK_OUT (default build/gpu-check).
# Step counts: GPU_CHECK_MLP_STEPS (1500), GPU_CHECK_GPT_STEPS (300), GPU_CHECK_CNN_STEPS (300),
# GPU_CHECK_GPT2_STEPS (30).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
start=$SECONDS
deadline=$((SECONDS + 570))
out=${GPU_CHECK_OUT:-$root/build/gpu-check}
rm -rf "$out"
mkdir -p "$out"
left() { echo $((deadline - SECONDS)); }
# A stage's limit: its own, or what is left of the whole check (less 10 s for the table) when that is shorter.
lim() {
  local l=$1 r=$(($(left) - 10))
  (( r < l )) && l=$r
  (( l < 1 )) && l=1
  echo "$l"
}
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
  # CUDA 13 (the bundle's runtime) needs a driver of the R580 branch or newer (CUDA 13.0 release notes).
  [[ ${driver%%.*} =~ ^[0-9]+$ ]] && (( ${driver%%.*} >= 580 )) ||
    missing+=("driver $driver is older than the R580 branch that CUDA 13 needs")
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

# ---- 1. the GPU tests ------------------------------------------------------------------------------------------
# gtest_counts LOG: "passed failed skipped" from gtest's summary lines.
gtest_counts() {
  local p f s
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  echo "${p:-0} ${f:-0} ${s:-0}"
}
declare -A test_row
run_tests() {  # run_tests NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local log=$out/tests_$name.log
  timeout "$(lim "$limit")" "$@" >"$log" 2>&1
  local rc=$? p f s
  read -r p f s < <(gtest_counts "$log")
  test_row[$name]="$p passed, $f failed, $s skipped (exit $rc)"
  say "GPU tests $name: ${test_row[$name]}"
  (( p > 0 )) && ran_on_gpu=1
  (( rc == 0 && f == 0 )) || failures+=("GPU tests $name: exit $rc, $f failed (see $log)")
  if (( s > 0 )); then
    # gtest prints "<file>:<line>: Skipped" and the reason on the next line; else name the first skipped test.
    local why
    why=$(grep -m1 -A1 ': Skipped$' "$log" | tail -1)
    [[ -n $why ]] || why=$(grep -m1 '^\[  SKIPPED \] [A-Za-z]' "$log" | sed 's/^\[  SKIPPED \] //')
    failures+=("GPU tests $name: $s skipped (first: $why)")
  fi
  (( p == 0 && s == 0 && f == 0 )) && failures+=("GPU tests $name: no test ran (exit $rc, see $log)")
}
# One process: everything but the tests that need two ranks.
run_tests np1 150 "$bin/ampdist_gpu_tests" --gtest_filter='-GpuTwoRanks*'
if (( gpus >= 2 )); then
  run_tests "np$gpus" 180 mpirun -np "$gpus" "$bin/ampdist_gpu_tests"
fi

# ---- 2. the NCCL set-up fault drill: one rank fails to join, every rank ends within the deadline, one line, exit 1 --
drill_row="not run"
if (( $(left) > 200 )); then
  drill_log=$out/drill_nccl_setup.log
  t0=$SECONDS
  AMPDIST_FAULT='nccl_setup_error { rank: 1 stage: INIT }' timeout "$(lim 90)" mpirun -q -np 2 "$bin/ampdist" train \
    --config configs/fashion_mnist_mlp.pbtxt --device cuda --set device.allow_sharing=true \
    --set comm.timeout_s=30 --set "data.idx.dir=$bundle/data/fashion-mnist" --set train.steps=5 \
    --run-dir "$out/run_drill" >"$drill_log" 2>&1
  rc=$? dt=$((SECONDS - t0))
  lines=$(grep -c '^ampdist: error:' "$drill_log")
  drill_row="exit $rc in $dt s, $lines error line(s)"
  say "NCCL set-up drill: $drill_row"
  (( rc == 1 && lines == 1 && dt < 60 )) ||
    failures+=("NCCL set-up drill: expected exit 1 with one error line within 60 s, got $drill_row (see $drill_log)")
fi

# ---- 3. training runs ------------------------------------------------------------------------------------------
declare -A sps mfu status
# Dense tensor-core and FP32 peaks of the GPU model, FLOP/s (NVIDIA datasheets: H100/H200 SXM 989 TFLOP/s bf16/fp16
# dense, 67 TFLOP/s FP32; A100 312 and 19.5).
case $gpu_name in
  *H200*|*H100*SXM*|*H100\ 80GB\ HBM3*) peak16=989e12 peak32=67e12 ;;
  *H100*) peak16=756e12 peak32=51e12 ;;
  *A100*) peak16=312e12 peak32=19.5e12 ;;
  *) peak16="" peak32="" ;;
esac
train_run() {  # train_run ROW LIMIT PRECISION CONFIG FLOPS_PER_SAMPLE ARGS...
  local row=$1 limit=$2 p=$3 cfg=$4 fps=$5; shift 5
  local log=$out/train_${row// /_}_$p.log
  if (( $(left) < limit + 30 )); then status[$row/$p]="not run (time)"; failures+=("$row $p: out of time"); return; fi
  timeout "$limit" "$bin/ampdist" train --config "$cfg" --device cuda --precision "$p" "$@" \
    --set checkpoint.save_final=false --run-dir "$out/run_${row// /_}_$p" >"$log" 2>&1
  local rc=$?
  sps[$row/$p]=$(awk '/^samples\/s:/ {print $2}' "$log")
  status[$row/$p]="exit $rc"
  if (( rc != 0 )); then
    failures+=("training $row $p: exit $rc: $(grep -m1 'error' "$log")")
  elif grep -q 'CUDA backend' "$log"; then
    ran_on_gpu=1
  else
    failures+=("training $row $p: did not run on the CUDA backend")
  fi
  local peak=$peak32
  [[ $p != fp32 ]] && peak=$peak16
  if [[ -n ${sps[$row/$p]} && -n $fps && -n $peak ]]; then
    mfu[$row/$p]=$(awk -v s="${sps[$row/$p]}" -v f="$fps" -v pk="$peak" 'BEGIN {printf "%.1f%%", 100 * s * f / pk}')
  fi
}
# GPT FLOPs per sample (a window of T tokens): 6 N T for the parameter GEMMs forward and backward plus 12 L C T^2
# for attention's two GEMMs (PaLM, appendix B; llm.c's estimate_mfu), with N = 12 L C^2 (the blocks' matrices) +
# V C (the tied LM head, which is a GEMM; the position table is not).
gpt_flops() {  # gpt_flops L C T V
  awk -v L="$1" -v C="$2" -v T="$3" -v V="$4" 'BEGIN {N = L * 12 * C * C + V * C; printf "%.6e", 6 * N * T + 12 * L * C * T * T}'
}
mlp_steps=${GPU_CHECK_MLP_STEPS:-1500}
gpt_steps=${GPU_CHECK_GPT_STEPS:-300}
gpt2_steps=${GPU_CHECK_GPT2_STEPS:-30}
fortunes=(--set "data.tokens.train=$bundle/data/fortunes/train.bin" --set "data.tokens.val=$bundle/data/fortunes/val.bin")
for p in fp32 fp16 bf16; do
  train_run "MLP" 60 "$p" configs/fashion_mnist_mlp.pbtxt "" --set "data.idx.dir=$bundle/data/fashion-mnist" \
    --set "train.steps=$mlp_steps" --set log.every_steps=500
done
for p in fp32 fp16 bf16; do
  train_run "GPT fortunes" 60 "$p" configs/fortunes_gpt.pbtxt "$(gpt_flops 2 64 64 256)" "${fortunes[@]}" \
    --set "train.steps=$gpt_steps" --set log.every_steps=100
done
# The conv net (cuDNN convolutions, BatchNorm and pooling kernels), where the build has cuDNN.
for p in fp32 bf16; do
  train_run "CNN" 90 "$p" configs/fashion_mnist_cnn.pbtxt "" --set "data.idx.dir=$bundle/data/fashion-mnist" \
    --set "train.steps=${GPU_CHECK_CNN_STEPS:-300}" --set log.every_steps=100
done
gpt2=(--set model.gpt.n_layer=12 --set model.gpt.n_head=12 --set model.gpt.n_embd=768 --set model.gpt.seq_len=1024
      --set data.global_batch_size=8 --set data.eval_batch_size=8 --set "train.steps=$gpt2_steps"
      --set log.every_steps=10 --set optimizer.schedule.warmup_steps=5)
for p in bf16 fp16; do
  train_run "GPT-2 124M shape" 120 "$p" configs/fortunes_gpt.pbtxt "$(gpt_flops 12 768 1024 256)" \
    "${fortunes[@]}" "${gpt2[@]}"
done

# ---- 4. NCCL all-reduce bus bandwidth, and the kernel micro-benchmarks --------------------------------------------
declare -A busbw
if [[ -x $bin/ampdist_bench_gpu ]]; then
  for n in 1 $(( gpus >= 2 ? gpus : 0 )); do
    (( n > 0 )) || continue
    log=$out/nccl_np$n.log
    timeout "$(lim 60)" mpirun -np "$n" "$bin/ampdist_bench_gpu" allreduce >"$log" 2>&1
    rc=$?
    busbw[$n]=$(awk '/^allreduce max:/ {print $3 " GB/s algbw, " $6 " GB/s busbw at " $10 " bytes"}' "$log")
    (( rc == 0 )) || failures+=("NCCL all-reduce benchmark on $n GPU(s): exit $rc: $(grep -m1 -i 'error\|wrong' "$log")")
  done
  timeout "$(lim 90)" "$bin/ampdist_bench_gpu" kernels >"$out/kernels.log" 2>&1 ||
    failures+=("kernel micro-benchmarks: exit $? (see $out/kernels.log)")
else
  failures+=("the bundle has no ampdist_bench_gpu (NCCL bandwidth and kernel benchmarks not run)")
fi

# ---- verdict and table -------------------------------------------------------------------------------------------
(( ran_on_gpu )) || failures=("nothing ran on a GPU: ${failures[*]:-no test and no run reported the GPU}")
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
echo "==== gpu_check: $gpus x $gpu_name, driver $driver, $((SECONDS - start)) s ===="
printf '%-22s %s\n' "GPU tests (1 process)" "${test_row[np1]:-not run}"
(( gpus >= 2 )) && printf '%-22s %s\n' "GPU tests ($gpus ranks)" "${test_row[np$gpus]:-not run}"
printf '%-22s %s\n' "NCCL set-up drill" "$drill_row"
printf '%-22s %-6s %-14s %-10s %s\n' "run" "prec" "samples/s" "MFU" "status"
for row in "MLP" "GPT fortunes" "CNN" "GPT-2 124M shape"; do
  for p in fp32 fp16 bf16; do
    [[ -n ${status[$row/$p]:-} ]] || continue
    printf '%-22s %-6s %-14s %-10s %s\n' "$row" "$p" "${sps[$row/$p]:-n/a}" "${mfu[$row/$p]:--}" "${status[$row/$p]}"
  done
done
printf '%-22s %s\n' "NCCL all-reduce 1 GPU" "${busbw[1]:-not run}"
(( gpus >= 2 )) && printf '%-22s %s\n' "NCCL all-reduce $gpus GPUs" "${busbw[$gpus]:-not run}"
[[ -f $out/kernels.log ]] && grep '^kernel ' "$out/kernels.log"
echo "logs: $out"
exit $verdict
