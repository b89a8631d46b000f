#!/usr/bin/env bash
# Builds (incrementally) and runs every test: unit tests, the multi-rank tests under mpirun -np 1, 2 and 4, and the
# end-to-end runs of the ampdist program. Extra arguments go to ctest (e.g. -L mpi, -R e2e_test_resume).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash launch/setup/build.sh > build.log 2>&1 || { tail -50 build.log; echo "build failed (full log: build.log)"; exit 1; }
# OpenMPI refuses to run as root without these; CTest sets them for the MPI tests too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j 2 "$@"
