#!/usr/bin/env bash
# The GPU check's bundle and its refusal to pass without a GPU, on a machine with no CUDA driver:
#  1. launch/gpu_bundle.sh builds the bundle (without its archive) and its self-check finds every library of every
#     carried ELF file inside the bundle or the C library; bundle/selfcheck.sh alone says the same, and names a
#     carried library that goes missing.
#  2. With a stand-in nvidia-smi on PATH that lists one H200 on a new enough driver (so the check gets past its
#     first look), launch/gpu_check.sh against the bundle exits non-zero and prints exactly one line: that nothing
#     ran on a GPU, and why (the driver's libcuda.so.1 cannot be loaded).
#  3. A stand-in listing a driver older than the R580 branch, a GPU older than the bundle's device code (compute
#     capability 7.0), a bundle that needs a CPU instruction this machine lacks, and no nvidia-smi at all, are each
#     named in that one line too.
#  4. The verdict after the preflight, with stand-in programs in a bundle of the same layout (tests/e2e/standin: a
#     driver that loads, an mpirun that starts one copy per rank, tests, training runs and benchmarks that print what
#     the real ones print, with the master weights hash and the run's metrics.jsonl): all passing gives exit 0, a PASS
#     line and the table (samples/s per precision, after warm-up, MFU for the GPT rows, the ZeRO stage 0 and 1 rows
#     on every GPU, NCCL bandwidth for 1 and 2 GPUs), on 1, 2 and 4 GPUs. Each of these gives exit 1 and one FAIL
#     line naming it: one skipped GPU test, a failed GPU test (by name), a test binary that crashed (its signal and
#     the test it was in), one failed training run, a drill that does not end in one line, wrong all-reduce results,
#     ZeRO stage 1 ending with another master weights hash than stage 0 on 2 GPUs, step losses of the two stages
#     apart by more than the bound on 4 GPUs, a stage that runs past its limit (timed out), and stages left no time
#     to start (out of time).
# Needs a build with the CUDA backend (exit 77, skipped, otherwise).
# Usage: test_gpu_check.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" gpu_check "$@"
BUILD=$(dirname "$AMPDIST")
if [ ! -x "$BUILD/tests/ampdist_gpu_tests" ]; then
  echo "skipped: $BUILD has no CUDA backend (tests/ampdist_gpu_tests missing)"
  exit 77
fi
if ldconfig -p | grep -q 'libcuda\.so\.1 '; then
  echo "skipped: this machine has a CUDA driver (libcuda.so.1); the check could run for real"
  exit 77
fi
BUNDLE=$TMP/gpu-bundle

# ---- 1. the bundle and its self-check ------------------------------------------------------------------------------
if (cd "$SRC" && bash launch/gpu_bundle.sh --no-archive "$BUILD" "$BUNDLE") > "$TMP/bundle.log" 2>&1; then
  ok "gpu_bundle.sh builds the bundle"
else
  not_ok "gpu_bundle.sh" "exit $?"
  show "$TMP/bundle.log"
fi
grep -q '^gpu_bundle: selfcheck: [0-9]* ELF files, every library resolved within the bundle or the C library$' \
  "$TMP/bundle.log" && ok "the bundle's self-check passes while it is built" ||
  { not_ok "self-check during the build" "no success line"; show "$TMP/bundle.log"; }
grep -q "^gpu_bundle: $BUNDLE: [0-9.]*[KMG]$" "$TMP/bundle.log" && ok "the bundle states its size" ||
  { not_ok "bundle size" "no size line"; show "$TMP/bundle.log"; }
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libdnnl.so.2 libgomp.so.1 libmpi.so.40 libprotobuf.so.32; do
  [ -f "$BUNDLE/lib/$lib" ] || not_ok "carried $lib" "missing from $BUNDLE/lib"
done
if readelf -d "$BUNDLE/bin/ampdist" | grep -q 'libcudart'; then
  not_ok "static CUDA runtime" "bin/ampdist needs a shared libcudart"
else
  ok "the CUDA runtime is linked statically"
fi
grep -q '^cuda_architectures: .*sm_90' "$BUNDLE/MANIFEST" && ok "the MANIFEST names the device code (sm_90 for H100/H200)" ||
  { not_ok "MANIFEST" "no cuda_architectures line with sm_90"; show "$BUNDLE/MANIFEST"; }
grep -q '^isa_check: ' "$BUNDLE/MANIFEST" && ok "the MANIFEST says what the ISA check found" ||
  not_ok "MANIFEST" "no isa_check line"
# The driver minimum follows the toolkit the build used (13.x here: R580), and NVRTC travels for cuDNN's
# runtime-compiled engines.
major=$(sed -n 's/^cuda_runtime: \([0-9]*\)\..*/\1/p' "$BUNDLE/MANIFEST")
case $major in 12) want_min=525 ;; 13) want_min=580 ;; *) want_min=unknown ;; esac
grep -q "^driver_min: $want_min " "$BUNDLE/MANIFEST" && ok "the MANIFEST names the driver minimum of CUDA $major (R$want_min)" ||
  { not_ok "MANIFEST" "no driver_min $want_min line for CUDA '$major'"; show "$BUNDLE/MANIFEST"; }
ls "$BUNDLE/lib/libnvrtc.so.$major" "$BUNDLE"/lib/libnvrtc-builtins.so.* > /dev/null 2>&1 &&
  ok "NVRTC and its builtins are carried" || not_ok "NVRTC" "libnvrtc.so.$major or libnvrtc-builtins missing from $BUNDLE/lib"
if bash "$BUNDLE/selfcheck.sh" > "$TMP/self.log" 2>&1; then ok "selfcheck.sh passes"; else
  not_ok "selfcheck.sh" "exit $?"
  show "$TMP/self.log"
fi
mv "$BUNDLE/lib/libxxhash.so.0" "$TMP/"
if bash "$BUNDLE/selfcheck.sh" > "$TMP/self_bad.log" 2>&1; then
  not_ok "selfcheck.sh with a carried library removed" "passed"
elif grep -q 'libxxhash.so.0 \(not found\|resolves outside the bundle\)' "$TMP/self_bad.log"; then
  ok "selfcheck.sh names a carried library that went missing"
else
  not_ok "selfcheck.sh with a carried library removed" "did not name libxxhash.so.0"
  show "$TMP/self_bad.log"
fi
mv "$TMP/libxxhash.so.0" "$BUNDLE/lib/"

# ---- 2. and 3. gpu_check.sh on a machine without a CUDA driver ------------------------------------------------------
# check_once NAME PATH_PREFIX WANT [ENV...]: gpu_check.sh must exit non-zero with exactly one line, the FAIL line
# saying nothing ran on a GPU, and containing WANT.
check_once() {
  local name=$1 path=$2 want=$3
  shift 3
  env "$@" PATH="$path" GPU_CHECK_OUT="$TMP/check_$name" timeout 120 bash "$SRC/launch/gpu_check.sh" "$BUNDLE" \
    > "$TMP/check_$name.log" 2>&1
  local rc=$? lines
  lines=$(wc -l < "$TMP/check_$name.log")
  if [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && grep -q '^gpu_check: FAIL: nothing ran on a GPU: ' "$TMP/check_$name.log" &&
     grep -qF "$want" "$TMP/check_$name.log"; then
    ok "$name: exit $rc, one line: $(cut -c1-150 "$TMP/check_$name.log")"
  else
    not_ok "$name" "exit $rc, $lines lines, wanted one FAIL line naming '$want'"
    show "$TMP/check_$name.log"
  fi
}
mkdir -p "$TMP/smi"
cp "$SRC/tests/e2e/standin/nvidia-smi" "$TMP/smi/"
check_once no_driver "$TMP/smi:$PATH" "libcuda.so.1"
check_once old_driver "$TMP/smi:$PATH" "driver 535.104.05 is older than the R580 branch" STANDIN_DRIVER=535.104.05
check_once old_gpu "$TMP/smi:$PATH" "no device code for compute capability 70" STANDIN_CC=7.0
# A bundle built for instructions this CPU lacks (as a -march=native build records them).
cp "$BUNDLE/MANIFEST" "$TMP/MANIFEST.orig"
sed -i 's/^cpu_flags_required: .*/cpu_flags_required: avx2 avx512_fictional (built with -march=native)/' "$BUNDLE/MANIFEST"
check_once cpu_flags "$TMP/smi:$PATH" "lacks avx512_fictional that the bundle's binaries may use"
cp "$TMP/MANIFEST.orig" "$BUNDLE/MANIFEST"
# No nvidia-smi anywhere on PATH: only the directories of the tools the script itself needs.
mkdir -p "$TMP/tools"
for t in bash sed awk grep cut head tail tr find wc mkdir rm cat date timeout sort ldd dirname basename uname; do
  p=$(command -v "$t") && ln -sf "$p" "$TMP/tools/$t"
done
check_once no_smi "$TMP/tools" "nvidia-smi is not on PATH"

# ---- 4. the verdict, with stand-ins --------------------------------------------------------------------------------
FAKE=$TMP/fake-bundle
mkdir -p "$FAKE/bin" "$FAKE/lib" "$FAKE/data/fashion-mnist" "$FAKE/data/fortunes"
cp "$BUNDLE/env.sh" "$BUNDLE/selfcheck.sh" "$BUNDLE/MANIFEST" "$FAKE/"
cp "$BUNDLE/lib/libxxhash.so.0" "$FAKE/lib/"  # one real ELF file for the self-check
for f in mpirun ampdist ampdist_gpu_tests ampdist_bench_gpu; do cp "$SRC/tests/e2e/standin/$f" "$FAKE/bin/"; done
verdict() {  # verdict NAME WANT_RC WANT_LINE [ENV...]
  local name=$1 want_rc=$2 want=$3
  shift 3
  env STANDIN_GPUS=2 "$@" PATH="$TMP/smi:$PATH" GPU_CHECK_OUT="$TMP/verdict_$name" GPU_CHECK_GPT2_STEPS=10 \
    timeout 120 bash "$SRC/launch/gpu_check.sh" "$FAKE" > "$TMP/verdict_$name.log" 2>&1
  local rc=$? verdicts
  verdicts=$(grep -c '^gpu_check: \(PASS\|FAIL\)' "$TMP/verdict_$name.log")
  if [ "$rc" -eq "$want_rc" ] && [ "$verdicts" -eq 1 ] && grep -q "$want" "$TMP/verdict_$name.log"; then
    ok "verdict $name: exit $rc, $(grep '^gpu_check: \(PASS\|FAIL\)' "$TMP/verdict_$name.log" | cut -c1-160)"
  else
    not_ok "verdict $name" "exit $rc (want $want_rc), $verdicts verdict lines, wanted '$want'"
    show "$TMP/verdict_$name.log"
  fi
}
# table NAME WHAT PATTERN...: every PATTERN matches a line of verdict NAME's output.
table() {
  local name=$1 what=$2 pat
  shift 2
  for pat in "$@"; do
    grep -q "$pat" "$TMP/verdict_$name.log" || { not_ok "verdict $name: $what" "no line matches '$pat'"; show "$TMP/verdict_$name.log"; return; }
  done
  ok "verdict $name: $what"
}
# The stand-in's steps: the first takes 0.5 s, the others 8 ms, so after warm-up a batch of 8 is 1000 samples/s.
verdict all_pass 0 '^gpu_check: PASS'
table all_pass "the table has samples/s, after warm-up, MFU for the GPT rows, NCCL bandwidth and both test runs" \
  '^GPT-2 124M shape  *bf16  *[0-9.]*  *1000.0  *[0-9.]*%  *exit 0$' \
  '^MLP  *fp32  *[0-9.]*  *16000.0  *-  *exit 0$' \
  '^NCCL all-reduce 2 GPUs *350.00 GB/s algbw, 350.00 GB/s busbw' \
  '^GPU tests (2 ranks) *30 passed, 0 failed, 0 skipped'
table all_pass "the table has ZeRO stage 0 and 1 on 2 GPUs for the MLP, the GPT and the CNN, with equal hashes" \
  '^MLP 2 GPUs ZeRO 0  *bf16  .*exit 0$' '^MLP 2 GPUs ZeRO 1  *bf16  .*exit 0$' \
  '^GPT fortunes 2 GPUs ZeRO 1  *bf16  *[0-9.]*  *[0-9.]*  *[0-9.]*%  *exit 0$' '^CNN 2 GPUs ZeRO 1  *bf16  .*exit 0$' \
  '^ZeRO 1 vs 0, MLP  *same master weights hash 4e7cc4ab3e7635c6$' \
  '^ZeRO 1 vs 0, GPT fortunes  *same master weights hash' '^ZeRO 1 vs 0, CNN  *same master weights hash'
verdict one_gpu 0 '^gpu_check: PASS' STANDIN_GPUS=1
if grep -q 'ZeRO\|GPU tests ([0-9]* ranks)\|NCCL all-reduce [0-9]* GPUs' "$TMP/verdict_one_gpu.log"; then
  not_ok "verdict one_gpu" "multi-GPU rows on a host with one GPU"
  show "$TMP/verdict_one_gpu.log"
else
  ok "verdict one_gpu: no multi-GPU rows"
fi
verdict four_gpus 0 '^gpu_check: PASS' STANDIN_GPUS=4
table four_gpus "on 4 GPUs ZeRO runs in fp32 and the step losses are compared within the bound" \
  '^CNN 4 GPUs ZeRO 1  *fp32  .*exit 0$' '^ZeRO 1 vs 0, MLP  *step losses within 0 relative (bound [0-9.e-]*)$' \
  '^NCCL all-reduce 4 GPUs'
verdict skipped 1 'FAIL: .*GPU tests np1: 1 skipped (first: GpuKernels.CastsEqualTheCpuBitForBit)' FAKE_SKIP=1
verdict failed_test 1 'FAIL: .*GPU tests np1: 1 failed: GpuTrain.MlpBf16 (see .*GPU tests np2: 1 failed: GpuTrain.MlpBf16 (see' \
  FAKE_FAIL_TEST=1
verdict crashed 1 'FAIL: .*GPU tests np1: crashed (signal 11) after test GpuConv.ResNet18MatchesCpu (see .*GPU tests np2: crashed (signal 11) after test GpuConv.ResNet18MatchesCpu' \
  FAKE_CRASH=1
grep -q 'no test ran' "$TMP/verdict_crashed.log" && not_ok "verdict crashed" "reported as 'no test ran'"
verdict train_failed 1 'FAIL: .*training GPT fortunes fp16: exit 1' FAKE_TRAIN_FAIL=fp16
verdict drill 1 'FAIL: .*NCCL set-up drill: expected exit 1 with one error line' FAKE_DRILL_TWO_LINES=1
verdict wrong_allreduce 1 'FAIL: .*NCCL all-reduce benchmark on 1 GPU(s): exit 1' FAKE_WRONG=1
verdict zero_hash 1 'FAIL: .*ZeRO stage 1 against stage 0, MLP on 2 GPUs: stage 1 ends with master weights hash 4e7cc4ab3e7635c7, stage 0 with 4e7cc4ab3e7635c6' \
  FAKE_ZERO_HASH_DIFF=1
verdict zero_losses 1 'FAIL: .*ZeRO stage 1 against stage 0, MLP on 4 GPUs: step losses differ by 0.001 relative at step [0-9]*, more than [0-9.e-]*' \
  STANDIN_GPUS=4 FAKE_ZERO_LOSS_OFF=1
# Stage limits scaled to 150 s in all: the kernel micro-benchmarks' is a few seconds.
verdict timed_out 1 'FAIL: .*kernel micro-benchmarks: timed out after [0-9]* s' FAKE_HANG=kernels GPU_CHECK_SECONDS=150
# 28 s in all, less the table's 15 s: the two test runs time out at their 5 s each, then no stage has 5 s left.
verdict out_of_time 1 'FAIL: .*GPU tests np1: timed out after 5 s during test GpuConv.ResNet18MatchesCpu (see .*; GPU tests np2: timed out after 5 s .*; out of time, not started: NCCL set-up drill, training MLP fp32, .*, kernel micro-benchmarks (limits in ' \
  FAKE_HANG=tests GPU_CHECK_SECONDS=28

exit "$FAILED"
