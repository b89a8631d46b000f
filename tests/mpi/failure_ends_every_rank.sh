#!/usr/bin/env bash
# A test that fails on one rank of the mpi suite ends every rank within seconds, non-zero, and the output names the
# test and the rank (tests/mpi/mpi_main.cc): rank 1 or 0 of 2 (and rank 2 of 4) fails MpiSuite.FailsOnPurposeOnOneRank,
# by an assertion and by an exception, while the other ranks wait in MPI_Barrier for it.
# Usage: failure_ends_every_rank.sh MPIEXEC ampdist_mpi_tests
set -u
mpiexec=$1
bin=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for case in "2 1 assert" "2 0 assert" "2 1 throw" "4 2 throw"; do
  read -r np rank by <<<"$case"
  start=$(date +%s)
  AMPDIST_TEST_FAIL_ON_RANK=$rank AMPDIST_TEST_FAIL_BY=$by timeout -k 5 60 \
    "$mpiexec" --oversubscribe -np "$np" "$bin" --gtest_filter=MpiSuite.FailsOnPurposeOnOneRank >"$out" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  what="np $np, rank $rank fails by $by"
  if [ "$rc" -eq 0 ]; then
    echo "not ok - $what: exit 0"; failed=1
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "not ok - $what: still running after 60 s (the other ranks hang)"; failed=1
  elif [ "$secs" -gt 30 ]; then
    echo "not ok - $what: ended after $secs s (more than 30)"; failed=1
  elif ! grep -q "\[rank $rank\] test MpiSuite.FailsOnPurposeOnOneRank failed" "$out"; then
    echo "not ok - $what: no line names the test and rank $rank"; failed=1
  else
    echo "ok - $what: exit $rc after $secs s"
  fi
  [ "$failed" -eq 0 ] || sed -e 's/^/    | /' "$out" | head -30
done
exit "$failed"
