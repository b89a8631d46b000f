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
#  4. The verdict after the preflight, with stand-in programs in a bundle of the same layout (a driver that loads,
#     tests, training runs and benchmarks that print what the real ones print): all passing gives exit 0, a PASS
#     line and the table (samples/s per precision, MFU for the GPT rows, NCCL bandwidth for 1 and 2 GPUs); one
#     skipped GPU test, one failed training run, a drill that does not end in one line, or wrong all-reduce results
#     each give exit 1 and one FAIL line naming it.
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
cat > "$FAKE/bin/mpirun" << 'SH'
#!/usr/bin/env bash
while [[ $1 == -* ]]; do case $1 in -np) shift 2 ;; *) shift ;; esac; done
exec "$@"
SH
cat > "$FAKE/bin/ampdist_gpu_tests" << 'SH'
#!/usr/bin/env bash
echo "[==========] 30 tests from 8 test suites ran. (900 ms total)"
echo "[  PASSED  ] $((30 - ${FAKE_SKIP:-0})) tests."
if [[ ${FAKE_SKIP:-0} != 0 ]]; then
  echo "[  SKIPPED ] 1 test, listed below:"
  echo "[  SKIPPED ] GpuKernels.CastsEqualTheCpuBitForBit"
fi
SH
cat > "$FAKE/bin/ampdist" << 'SH'
#!/usr/bin/env bash
case $1 in
  env) echo "  CUDA driver:   13.0 (libcuda.so.1)" ;;
  train)
    if [[ -n ${AMPDIST_FAULT:-} ]]; then
      echo "ampdist: error: [rank 1] ncclCommInitRankConfig: injected failure"
      [[ -n ${FAKE_DRILL_TWO_LINES:-} ]] && echo "ampdist: error: [rank 0] a second line"
      exit 1
    fi
    p=""; for a in "$@"; do [[ $prev == --precision ]] && p=$a; prev=$a; done
    [[ $p == "${FAKE_TRAIN_FAIL:-none}" ]] && { echo "ampdist: error: CUDA kernel gemm: out of memory"; exit 1; }
    echo "ampdist train: fake | world size 1 (single process) | CUDA backend, NVIDIA H200 (sm_90) on rank 0 | $p"
    echo "samples/s: 1000.0 (30 steps in 0.2 s of training)" ;;
esac
SH
cat > "$FAKE/bin/ampdist_bench_gpu" << 'SH'
#!/usr/bin/env bash
if [[ $1 == allreduce ]]; then
  echo "allreduce max: 350.00 GB/s algbw 350.00 GB/s busbw at 1073741824 bytes on 2 ranks"
  [[ -n ${FAKE_WRONG:-} ]] && { echo "allreduce WRONG RESULT: some element differs from the exact sum"; exit 1; }
else
  echo "kernel gemm bf16 [8192x768]x[768x3072]   100.0 us  387.0 TFLOP/s  39.1% of dense BF16 989 TFLOP/s"
fi
exit 0
SH
chmod +x "$FAKE"/bin/*
verdict() {  # verdict NAME WANT_RC WANT_LINE [ENV...]
  local name=$1 want_rc=$2 want=$3
  shift 3
  env STANDIN_GPUS=2 "$@" PATH="$TMP/smi:$PATH" GPU_CHECK_OUT="$TMP/verdict_$name" GPU_CHECK_GPT2_STEPS=3 \
    timeout 120 bash "$SRC/launch/gpu_check.sh" "$FAKE" > "$TMP/verdict_$name.log" 2>&1
  local rc=$? verdicts
  verdicts=$(grep -c '^gpu_check: \(PASS\|FAIL\)' "$TMP/verdict_$name.log")
  if [ "$rc" -eq "$want_rc" ] && [ "$verdicts" -eq 1 ] && grep -q "$want" "$TMP/verdict_$name.log"; then
    ok "verdict $name: exit $rc, $(grep '^gpu_check: \(PASS\|FAIL\)' "$TMP/verdict_$name.log" | cut -c1-120)"
  else
    not_ok "verdict $name" "exit $rc (want $want_rc), $verdicts verdict lines, wanted '$want'"
    show "$TMP/verdict_$name.log"
  fi
}
verdict all_pass 0 '^gpu_check: PASS'
grep -q '^GPT-2 124M shape *bf16 *1000.0 *[0-9.]*% *exit 0$' "$TMP/verdict_all_pass.log" &&
  grep -q '^MLP *fp32 *1000.0 *- *exit 0$' "$TMP/verdict_all_pass.log" &&
  grep -q '^NCCL all-reduce 2 GPUs *350.00 GB/s algbw, 350.00 GB/s busbw' "$TMP/verdict_all_pass.log" &&
  grep -q '^GPU tests (2 ranks) *30 passed, 0 failed, 0 skipped' "$TMP/verdict_all_pass.log" &&
  ok "the table has samples/s, MFU for the GPT rows, NCCL bandwidth and both test runs" ||
  { not_ok "the table" "rows missing"; show "$TMP/verdict_all_pass.log"; }
verdict skipped 1 'FAIL: .*GPU tests np1: 1 skipped (first: GpuKernels.CastsEqualTheCpuBitForBit)' FAKE_SKIP=1
verdict train_failed 1 'FAIL: .*training GPT fortunes fp16: exit 1' FAKE_TRAIN_FAIL=fp16
verdict drill 1 'FAIL: .*NCCL set-up drill: expected exit 1 with one error line' FAKE_DRILL_TWO_LINES=1
verdict wrong_allreduce 1 'FAIL: .*NCCL all-reduce benchmark on 1 GPU(s): exit 1' FAKE_WRONG=1

exit "$FAILED"
