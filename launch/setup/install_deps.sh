#!/usr/bin/env bash
# Installs the Debian 12 packages that ampdist's build, tests and main job need (only those missing).
# The CUDA toolkit is optional and not installed here.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git python3
  libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler
  libeigen3-dev libopenblas-dev
  zlib1g-dev libxxhash-dev librandom123-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
