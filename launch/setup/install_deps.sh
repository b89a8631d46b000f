#!/usr/bin/env bash
# Installs the Debian 12 packages that ampdist's build, tests and main job need (only those missing), and the Python
# packages of the checkpoint tests (safetensors, which bookworm does not package) in a virtual environment,
# build/pyenv, on top of Debian's python3 and numpy. The CUDA toolkit is optional and not installed here.
set -euo pipefail
cd "$(dirname "$0")/../.."
cd "$(dirname "$0")/../.."

packages=(
  build-essential cmake pkg-config git python3 procps
  clang libclang-rt-14-dev
  libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler
  libeigen3-dev libdnnl-dev  # Eigen's half/bfloat16; oneDNN, the CPU backend's GEMM engine
  ocl-icd-opencl-dev  # oneDNN's CMake package (dnnl-config.cmake) requires OpenCL: Debian builds it with the OpenCL GPU runtime
  zlib1g-dev libxxhash-dev librandom123-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libutfcpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-numpy python3-venv python3-pip
  dataset-fashion-mnist
  iproute2 docker-compose  # tests: network namespaces (ip netns), validating docker-compose.yml
  libboost-dev chromium  # the CRC-32C of TensorBoard event files (Boost.CRC); the report's screenshot test
  python3-torch  # bench/torch_mlp.py, the PyTorch reference of bench/run_all.sh
  python3-torchvision  # tests/e2e/test_cnn.sh loads the ResNet-18 export into torchvision.models.resnet18 (0.14, matching torch 1.13)
  fortunes  # the GPT model's text corpus (/usr/share/games/fortunes)
  qemu-user  # tests/e2e/test_cpu_classes.sh: short trainings on an emulated AVX2-only CPU (qemu-x86_64 -cpu Haswell)
  slurmctld slurmd slurm-client munge libpmix-dev  # tests/e2e/test_slurm_cluster.sh: a real two-node SLURM (pmix)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Python for tests/e2e/check_safetensors.py: Debian's interpreter (not one earlier on PATH) and numpy, plus
# safetensors from PyPI in build/pyenv. The checkpoint tests use build/pyenv/bin/python3. tensorboard (PyPI) is
# there for tests/e2e/check_tfevents.py, which reads ampdist's event files with TensorBoard's own reader.
# transformers (PyPI) is there for tests/e2e/test_hf_gpt2.sh, the Hugging Face round trip: 4.36.2 is the pinned
# release, one whose PyTorch requirement (torch >= 1.10, != 1.12.0) Debian's python3-torch 1.13 meets and whose
# save_pretrained writes safetensors by default.
pyenv=build/pyenv
check='import safetensors.numpy, numpy, tensorboard, transformers'
if [ -x "$pyenv/bin/python3" ] && "$pyenv/bin/python3" -c "$check" 2>/dev/null; then
  echo "install_deps: $pyenv has safetensors, numpy, tensorboard and transformers"
  exit 0
fi
if [ ! -x "$pyenv/bin/python3" ]; then /usr/bin/python3 -m venv --system-site-packages "$pyenv"; fi
"$pyenv/bin/python3" -m pip install -q --disable-pip-version-check 'safetensors>=0.4,<1' 'tensorboard>=2.14,<3' \
  'transformers==4.36.2'
"$pyenv/bin/python3" -c "$check"
echo "install_deps: $pyenv has safetensors, numpy, tensorboard and transformers"
