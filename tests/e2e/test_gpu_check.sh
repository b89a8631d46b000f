#!/usr/bin/env bash
# The GPU check's bundle and its refusal to pass without a GPU, on a machine with no CUDA driver:
#  1. launch/gpu_bundle.sh builds the bundle (without its archive) and its self-check finds every library of every
#     carried ELF file inside the bundle or the C library; bundle/selfcheck.sh alone says the same, and names a
#     carried library that goes missing.
#  2. With a stand-in nvidia-smi on PATH that lists one H200 on a new enough driver (so the check gets past its
#     first look), launch/gpu_check.sh against the bundle exits non-zero and prints exactly one line: that nothing
#     ran on a GPU, and why (the driver's libcuda.so.1 cannot be loaded).
#  3. A stand-in listing a driver older than the R580 branch, and no nvidia-smi at all, are each named in that one
#     line too.
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
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libopenblas.so.0 libmpi.so.40 libprotobuf.so.32; do
  [ -f "$BUNDLE/lib/$lib" ] || not_ok "carried $lib" "missing from $BUNDLE/lib"
done
if readelf -d "$BUNDLE/bin/ampdist" | grep -q 'libcudart'; then
  not_ok "static CUDA runtime" "bin/ampdist needs a shared libcudart"
else
  ok "the CUDA runtime is linked statically"
fi
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
# No nvidia-smi anywhere on PATH: only the directories of the tools the script itself needs.
mkdir -p "$TMP/tools"
for t in bash sed awk grep cut head tail tr find wc mkdir rm cat date timeout sort ldd dirname basename uname; do
  p=$(command -v "$t") && ln -sf "$p" "$TMP/tools/$t"
done
check_once no_smi "$TMP/tools" "nvidia-smi is not on PATH"

exit "$FAILED"
