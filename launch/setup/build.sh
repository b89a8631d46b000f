#!/usr/bin/env bash
# Configures and builds ampdist (library, program, tests, example, benchmarks) in build/.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
cmake --build build -j "$(nproc)"
