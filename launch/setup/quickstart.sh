#!/usr/bin/env bash
# From a fresh Debian 12 machine to a trained model: installs the packages, builds, and runs the main job,
# Fashion-MNIST on 2 MPI ranks in fp16 with dynamic loss scaling. Pass another precision as $1 (fp32, bf16).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash launch/setup/install_deps.sh
bash launch/setup/build.sh
precision="${1:-fp16}"
root_flags=()
if [ "$(id -u)" -eq 0 ]; then root_flags=(--allow-run-as-root); fi  # mpirun refuses root without it
# Two ranks on the CPU backend (two ranks would need two GPUs): AMPDIST_DEVICE=cuda for a machine that has them.
exec mpirun "${root_flags[@]}" --oversubscribe -np 2 build/ampdist train \
  --config configs/fashion_mnist_mlp.pbtxt --precision "$precision" --device "${AMPDIST_DEVICE:-cpu}"
