#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each for a bounded time.
#
#   bash tests/fuzz/run_fuzz.sh [TARGET...]        # default: fuzz_config fuzz_idx fuzz_checkpoint
#
# For each target: first replays every input in tests/fuzz/regressions/<target>/ (crashes found earlier), then
# fuzzes for FUZZ_SECONDS (default 20) starting from a COPY of tests/fuzz/corpus/<target>/ (the committed corpus
# is never modified; the grown copy is left in build-fuzz/run/<target>/corpus/). A crash, a sanitizer report
# (ASan, UBSan), an exception other than ampdist::Error, a hang (-timeout=10 s per input), a leak or an
# allocation over 2 GiB (-rss_limit_mb=2048, which also bounds single mallocs) fails the run; the script prints
# the input that did it and the command that reproduces it.
#
# Exit status: 0 every target clean; 1 a finding (or a regression input that crashes again); 2 a setup problem
# (clang or libFuzzer missing, the build failed).
#
# Environment: FUZZ_SECONDS (per target, default 20), FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (build
# parallelism, default the core count), FUZZ_CXX / FUZZ_CC (default clang++ / clang). The harnesses also read
# AMPDIST_FUZZ_SCRATCH (set here) and, fuzz_config, AMPDIST_FUZZ_OVERRIDE_ORACLE (see fuzz_config.cc).
# Needs (Debian 12): clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes), plus the main build's
# libraries (libprotobuf-dev protobuf-compiler zlib1g-dev libxxhash-dev libdnnl-dev libeigen3-dev
# librandom123-dev).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
CXX_BIN=${FUZZ_CXX:-clang++}
CC_BIN=${FUZZ_CC:-clang}
case $BUILD in
  /*) ;;
  *) BUILD="$ROOT/$BUILD" ;;
esac
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(fuzz_config fuzz_idx fuzz_checkpoint)

if ! [[ "$FUZZ_SECONDS" =~ ^[0-9]+$ ]] || [ "$FUZZ_SECONDS" -lt 1 ]; then
  echo "run_fuzz: FUZZ_SECONDS must be a whole number of seconds >= 1, got '$FUZZ_SECONDS'" >&2
  exit 2
fi

# Largest input per target: configs are text of a few hundred bytes, a 3-image IDX file is 2.4 KB (8 KB leaves
# room for more or larger images), a manifest or a tiny checkpoint's shard is under 600 bytes.
max_len() {
  case $1 in
    fuzz_config) echo 4096 ;;
    fuzz_idx) echo 8192 ;;
    fuzz_checkpoint) echo 4096 ;;
    *) echo 4096 ;;
  esac
}

missing_toolchain() {
  echo "run_fuzz: $1" >&2
  echo "run_fuzz: the fuzz targets need clang with libFuzzer;" \
    "on Debian 12: apt-get install clang libclang-rt-14-dev" >&2
  exit 2
}

# ---- toolchain ---------------------------------------------------------------------------------------------------
command -v "$CXX_BIN" >/dev/null 2>&1 || missing_toolchain "$CXX_BIN not found"
command -v "$CC_BIN" >/dev/null 2>&1 || missing_toolchain "$CC_BIN not found"
probe_dir=$(mktemp -d "${TMPDIR:-/tmp}/ampdist_fuzz_probe.XXXXXX") || exit 2
cat >"$probe_dir/probe.cc" <<'EOF'
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
EOF
if ! "$CXX_BIN" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cc" -o "$probe_dir/probe" \
  >"$probe_dir/log" 2>&1; then
  sed -e 's/^/    | /' "$probe_dir/log" | head -5 >&2
  rm -rf "$probe_dir"
  missing_toolchain "$CXX_BIN cannot link -fsanitize=fuzzer,address,undefined (libFuzzer runtime missing?)"
fi
rm -rf "$probe_dir"

# Symbolized stack traces when llvm-symbolizer is there (Debian: llvm-14; optional).
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ]; then
  for s in llvm-symbolizer /usr/lib/llvm-14/bin/llvm-symbolizer; do
    if command -v "$s" >/dev/null 2>&1; then
      export ASAN_SYMBOLIZER_PATH
      ASAN_SYMBOLIZER_PATH=$(command -v "$s")
      break
    fi
  done
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

# ---- build (reuses an existing build-fuzz/) ----------------------------------------------------------------------
start=$(date +%s)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "run_fuzz: configuring $BUILD with $CXX_BIN"
  if ! cmake -S tests/fuzz -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX_BIN" \
    -DCMAKE_C_COMPILER="$CC_BIN" >"$BUILD.configure.log" 2>&1; then
    tail -20 "$BUILD.configure.log" >&2
    echo "run_fuzz: configuring the fuzz build failed (log: $BUILD.configure.log)" >&2
    exit 2
  fi
  mv "$BUILD.configure.log" "$BUILD/configure.log"
fi
echo "run_fuzz: building ${TARGETS[*]} in $BUILD (-j$JOBS)"
if ! cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$BUILD/build.log" 2>&1; then
  grep -E "error|Error" "$BUILD/build.log" | head -20 >&2
  echo "run_fuzz: the fuzz build failed (log: $BUILD/build.log)" >&2
  exit 2
fi
echo "run_fuzz: built in $(($(date +%s) - start)) s"

# ---- run ---------------------------------------------------------------------------------------------------------
# The harnesses write the files they hand the readers under a scratch directory of this run, in memory where
# /dev/shm is there; a crashed harness cannot clean up after itself, so the script does.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  scratch=$(mktemp -d /dev/shm/ampdist_fuzz_run.XXXXXX) || exit 2
else
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/ampdist_fuzz_run.XXXXXX") || exit 2
fi
trap 'rm -rf "$scratch"' EXIT
export AMPDIST_FUZZ_SCRATCH=$scratch
FLAGS=(-timeout=10 -rss_limit_mb=2048)
passed=0
failed=0
failures=()

for t in "${TARGETS[@]}"; do
  bin="$BUILD/$t"
  work="$BUILD/run/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  ok=1

  # 1. Earlier crashes: each is run once and must now pass.
  regs=()
  if [ -d "tests/fuzz/regressions/$t" ]; then
    while IFS= read -r -d '' f; do regs+=("$f"); done \
      < <(find "tests/fuzz/regressions/$t" -type f ! -name '*.md' -print0 | sort -z)
  fi
  if [ ${#regs[@]} -gt 0 ]; then
    for f in "${regs[@]}"; do
      if ! "$bin" "${FLAGS[@]}" "$f" >"$work/regression.log" 2>&1; then
        echo "run_fuzz: $t: REGRESSION: $f crashes again" >&2
        grep -E "ERROR|SUMMARY|runtime error|terminate|fuzz_" "$work/regression.log" | head -8 | sed -e 's/^/    | /' >&2
        echo "run_fuzz:   reproduce: $bin $ROOT/$f" >&2
        ok=0
      fi
    done
    echo "run_fuzz: $t: ${#regs[@]} regression input(s) replayed"
  fi

  # 2. Bounded fuzzing from a copy of the seed corpus.
  cp -r "tests/fuzz/corpus/$t/." "$work/corpus/"
  seeds=$(find "$work/corpus" -type f | wc -l)
  # The outer timeout only guards against a wedged process: libFuzzer stops itself after -max_total_time.
  timeout -k 10 $((FUZZ_SECONDS + 120)) "$bin" "${FLAGS[@]}" -max_total_time="$FUZZ_SECONDS" \
    -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" >"$work/fuzz.log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -1)
  cov=$(grep -oE '(INITED|DONE|pulse|NEW|REDUCE) +cov: [0-9]+ ft: [0-9]+' "$work/fuzz.log" | tail -1 | \
    sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+)/\1 edges, \2 features/')
  corpus_after=$(find "$work/corpus" -type f | wc -l)
  artifact=$(find "$work/artifacts" -type f 2>/dev/null | head -1)
  if [ $rc -ne 0 ] || [ -n "$artifact" ]; then
    ok=0
    echo "run_fuzz: $t: FINDING (exit $rc) after ${execs:-?} executions" >&2
    grep -E "ERROR|SUMMARY|runtime error|terminate called|what\(\)|fuzz_[a-z]+:|==[0-9]+==" "$work/fuzz.log" | \
      head -12 | sed -e 's/^/    | /' >&2
    if [ -n "$artifact" ]; then
      echo "run_fuzz:   crash input: $artifact" >&2
      echo "run_fuzz:   reproduce:   $bin $artifact" >&2
      echo "run_fuzz:   keep it:     mkdir -p tests/fuzz/regressions/$t &&" \
        "cp $artifact tests/fuzz/regressions/$t/" >&2
    else
      [ $rc -eq 124 ] && echo "run_fuzz:   the fuzzer did not stop by itself (killed by timeout)" >&2
    fi
    echo "run_fuzz:   full log: $work/fuzz.log" >&2
  else
    echo "run_fuzz: $t: ok: ${execs:-?} executions in ${FUZZ_SECONDS} s, coverage ${cov:-?}," \
      "corpus $seeds -> $corpus_after inputs"
  fi
  if [ $ok -eq 1 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$t")
  fi
done

echo "run_fuzz: total $(($(date +%s) - start)) s"
[ $failed -gt 0 ] && echo "run_fuzz: failed: ${failures[*]}" >&2
echo "fuzz: $passed passed, $failed failed"
[ $failed -eq 0 ]
