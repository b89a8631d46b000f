#!/usr/bin/env bash
# The default build runs on any x86-64 CPU with AVX2: launch/check_isa.sh finds no instruction beyond AVX2 in the
# ampdist program, the example, the libampdist_*.a folder libraries or any shared library they load, outside run-time-dispatched code
# (launch/isa_allowlist.txt). And the check can fail: an object compiled for AVX-512 is reported.
# Usage: test_isa.sh BUILD/ampdist SOURCE_DIR. Skips (77) for an AMPDIST_NATIVE=ON build, which is not portable.
set -euo pipefail
bin=$1
src=$2
build=$(dirname "$bin")
check=$src/launch/check_isa.sh
if grep -q '^AMPDIST_NATIVE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "SKIP: $build is an AMPDIST_NATIVE=ON build (-march=native): not meant to run on other CPUs"
  exit 77
fi
command -v objdump >/dev/null || { echo "SKIP: objdump (binutils) not found"; exit 77; }

targets=("$bin")
for f in "$build/examples/custom_model" "$build"/libampdist_*.a; do [[ -e $f ]] && targets+=("$f"); done
out=$(bash "$check" --deps "${targets[@]}") || { echo "$out"; echo "FAIL: instructions beyond AVX2 outside run-time-dispatched code"; exit 1; }
echo "$out"
grep -q "^ok $bin" <<<"$out" || { echo "FAIL: no verdict for $bin"; exit 1; }
grep -q "^allowed .*libdnnl" <<<"$out" || { echo "FAIL: libdnnl (the GEMM engine) was not among the loaded libraries"; exit 1; }

# The checker must catch what it is for: one AVX-512 loop not on the allowlist.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'void twice(float* a) { for (int i = 0; i < 64; ++i) a[i] *= 2.0f; }\n' >"$tmp/twice.c"
cc -O2 -mavx512f -c "$tmp/twice.c" -o "$tmp/twice.o"
if bash "$check" "$tmp/twice.o" >"$tmp/out.txt"; then
  cat "$tmp/out.txt"; echo "FAIL: an AVX-512 object passed the check"; exit 1
fi
grep -q "twice: .*zmm" "$tmp/out.txt" || { cat "$tmp/out.txt"; echo "FAIL: the AVX-512 function was not named"; exit 1; }
echo "PASS: no instruction beyond AVX2 outside run-time-dispatched code; an AVX-512 object is caught"
