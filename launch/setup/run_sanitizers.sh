#!/usr/bin/env bash
# Sanitizer jobs. Builds (incrementally) ampdist with AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/
# and with ThreadSanitizer in build-tsan/ (only the library, the ampdist program and the two test binaries; -O1
# with line tables, which keeps the two builds to a few minutes each), then runs
#   asan+ubsan unit         the unit tests, leak detection on with no suppressions
#   asan+ubsan mpi np1/np2  the multi-rank tests under mpirun -np 1 and 2; leaks allocated inside OpenMPI and the
#                           libraries under it are suppressed by launch/setup/lsan.supp
#   asan+ubsan train np2    a short run of the ampdist program on synthetic data on 2 ranks, with asynchronous
#                           checkpoints every 10 steps
#   tsan unit               the unit tests, once
#   tsan loader             the Loader tests (the prefetch thread) 200 times over, for more interleavings
#   tsan mpi np1/np2        the multi-rank tests (the communicator's Watchdog thread next to MPI) except Fp32LossReduction (the large-vocabulary fp16 loss), whose
#                           3.5 GB of logits would take over 17 GB under TSan's shadow memory; reports lying wholly
#                           inside OpenMPI (not instrumented) are suppressed by launch/setup/tsan.supp
#   tsan train np2          the ampdist program on 2 ranks: Loader, Watchdog, the asynchronous checkpoint writer
#                           and MPI together
# Any ASan, UBSan, LSan or TSan report ends the process with a non-zero exit code, which fails its job. One line
# per job, "ok - <job> (<s> s)" or "not ok - <job> ..." followed by the end of its log; exits 1 if any job failed.
# Logs: build-asan/sanitize-*.log, build-tsan/sanitize-*.log.
# Environment: SANITIZE_JOBS (build parallelism, default nproc).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
jobs=${SANITIZE_JOBS:-$(nproc)}
targets=(ampdist_unit_tests ampdist_mpi_tests ampdist)  # ampdist_lib is an INTERFACE library: nothing to build

# OpenMPI refuses to run as root without these; several ranks on few cores need oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpiexec=$(command -v mpirun || command -v mpiexec)

# GCC 12's ThreadSanitizer cannot place its shadow memory under the 32 bits of mmap randomisation of recent
# kernels; its processes then run with address randomisation off (inherited by mpirun's ranks).
no_aslr=()
if [ -r /proc/sys/vm/mmap_rnd_bits ] && [ "$(cat /proc/sys/vm/mmap_rnd_bits)" -gt 28 ]; then
  no_aslr=(setarch "$(uname -m)" -R)
fi

failed=0
summary=()
# job NAME LOG COMMAND...: runs COMMAND (a program or a function) with its output in LOG and reports the result.
job() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS rc=0
  "$@" > "$log" 2>&1 || rc=$?
  local dt=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then
    summary+=("ok - $name (${dt} s)")
    echo "ok - $name (${dt} s)"
  else
    failed=1
    summary+=("not ok - $name (exit $rc, ${dt} s, log: $log)")
    echo "not ok - $name (exit $rc, ${dt} s, log: $log)"
    tail -60 "$log" | sed 's/^/    /'
  fi
  return "$rc"
}

build() {  # build DIR SANITIZERS
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DAMPDIST_SANITIZE="$2" \
    -DAMPDIST_BUILD_TESTS=ON -DAMPDIST_BUILD_BENCH=OFF -DAMPDIST_CUDA=OFF &&
    cmake --build "$1" -j "$jobs" --target "${targets[@]}"
}

# launch DIR NP PROGRAM ARGS...: PROGRAM on NP ranks under mpirun, from DIR/tests (where CTest runs the tests), with a
# time limit so that a hang fails the job rather than CI.
launch() {
  local dir=$1 np=$2
  shift 2
  local pre=()
  if [ "$dir" = build-tsan ]; then pre=("${no_aslr[@]}"); fi
  (cd "$dir/tests" && timeout -k 10 600 "${pre[@]}" "$mpiexec" --oversubscribe -np "$np" "$@")
}

# train DIR: 96 steps of a small MLP on synthetic data in FP16 on 2 ranks, with prefetch, accumulation, evaluation
# and a final checkpoint.
train() {
  local run=$root/$1/sanitize-train
  rm -rf "$run" && mkdir -p "$run" && cat > "$run/config.pbtxt" <<'EOF'
name: "sanitizer_smoke"
model { mlp { hidden: [64, 32] } }
data { synthetic { train_samples: 2048 test_samples: 512 features: 32 } global_batch_size: 64 prefetch_steps: 2 }
optimizer { sgd { momentum: 0.9 } lr: 0.05 accumulation_steps: 2 }
precision { dtype: FP16 }
train { epochs: 3 eval_every_steps: 40 }
log { every_steps: 20 }
checkpoint { every_steps: 10 async: true keep_last: 2 }
EOF
  launch "$1" 2 "$root/$1/ampdist" train --config "$run/config.pbtxt" --run-dir "$run/run"
}

mkdir -p build-asan build-tsan

# ---- AddressSanitizer + UndefinedBehaviorSanitizer ----------------------------------------------------------
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
asan="detect_leaks=1:halt_on_error=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
if job "asan+ubsan build" build-asan/sanitize-build.log build build-asan address,undefined; then
  ASAN_OPTIONS=$asan LSAN_OPTIONS="" \
    job "asan+ubsan unit" build-asan/sanitize-unit.log \
    ctest --test-dir build-asan -L unit -j "$jobs" --output-on-failure
  # Full allocation stacks (fast_unwind_on_malloc=0): the fast unwinder stops at OpenMPI's first frame without a
  # frame pointer, before the OpenMPI library that lsan.supp names.
  export ASAN_OPTIONS="$asan:fast_unwind_on_malloc=0"
  export LSAN_OPTIONS="suppressions=$root/launch/setup/lsan.supp:print_suppressions=0"
  for np in 1 2; do
    job "asan+ubsan mpi np$np" "build-asan/sanitize-mpi-np$np.log" launch build-asan "$np" ./ampdist_mpi_tests
  done
  job "asan+ubsan train np2" build-asan/sanitize-train.log train build-asan
  unset ASAN_OPTIONS LSAN_OPTIONS
else
  summary+=("not ok - asan+ubsan tests (not built)")
fi
unset UBSAN_OPTIONS

# ---- ThreadSanitizer ----------------------------------------------------------------------------------------
if job "tsan build" build-tsan/sanitize-build.log build build-tsan thread; then
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$root/launch/setup/tsan.supp"
  job "tsan unit" build-tsan/sanitize-unit.log \
    timeout -k 10 600 "${no_aslr[@]}" build-tsan/tests/ampdist_unit_tests --gtest_brief=1
  job "tsan loader" build-tsan/sanitize-loader.log \
    timeout -k 10 600 "${no_aslr[@]}" build-tsan/tests/ampdist_unit_tests --gtest_filter='Loader.*' \
    --gtest_repeat=200 --gtest_brief=1
  for np in 1 2; do
    job "tsan mpi np$np" "build-tsan/sanitize-mpi-np$np.log" \
      launch build-tsan "$np" ./ampdist_mpi_tests --gtest_filter='-Fp32LossReduction.*'
  done
  job "tsan train np2" build-tsan/sanitize-train.log train build-tsan
  unset TSAN_OPTIONS
else
  summary+=("not ok - tsan tests (not built)")
fi

echo "---- sanitizers ----"
printf '%s\n' "${summary[@]}"
exit "$failed"
