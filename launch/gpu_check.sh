#!/usr/bin/env bash
# The GPU check: on a machine with one or more NVIDIA GPUs (and no network), run the CUDA backend's tests and train
# the main job for a bounded number of steps in fp32, fp16 and bf16, then print one summary. Bounded to 8 minutes.
#
#   bash launch/gpu_check.sh
#
# Binaries: build/gpu-bundle (made by launch/gpu_bundle.sh on a machine with the full toolchain; carries the
# binaries with their non-CUDA libraries and OpenMPI's run-time tree), else build/ when it was configured with the
# CUDA backend and MPI is installed, else a fresh CUDA build when MPI and protobuf are installed.
# Data: /usr/share/datasets/fashion-mnist, else build/gpu-data (copy the four .gz files there), else the synthetic
# dataset with Fashion-MNIST's shapes (784 features, 10 classes; said in the summary).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deadline=$((SECONDS + 470))
out=${GPU_CHECK_OUT:-$root/build/gpu-check}
mkdir -p "$out"
say() { echo "gpu_check: $*"; }
left() { echo $((deadline - SECONDS)); }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU visible (nvidia-smi -L failed): nothing to check"; exit 2
fi
nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /'

bin=""
if [[ ! -x build/gpu-bundle/bin/ampdist && -f build/gpu-bundle.tar.xz ]]; then
  tar -C build -xJf build/gpu-bundle.tar.xz && say "unpacked build/gpu-bundle.tar.xz"
fi
if [[ -x build/gpu-bundle/bin/ampdist ]]; then
  source build/gpu-bundle/env.sh
  bin=build/gpu-bundle/bin
  for cuda_lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d $cuda_lib ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cuda_lib"
  done
  say "using the carried bundle build/gpu-bundle"
elif [[ -x build/tests/ampdist_gpu_tests ]] && command -v mpirun >/dev/null; then
  bin=build
  say "using build/"
elif command -v mpirun >/dev/null && command -v protoc >/dev/null; then
  say "building with the CUDA backend in build-gpu/"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DAMPDIST_CUDA=ON -DAMPDIST_BUILD_BENCH=OFF >"$out/build.log" 2>&1 &&
    timeout $(($(left) - 240)) cmake --build build-gpu -j "$(nproc)" >>"$out/build.log" 2>&1 ||
    { say "build failed, see $out/build.log"; tail -20 "$out/build.log"; exit 1; }
  bin=build-gpu
else
  say "no carried bundle (build/gpu-bundle) and no MPI/protobuf to build with: run launch/gpu_bundle.sh on a"\
      "build machine and carry build/gpu-bundle"
  exit 2
fi
ampdist=$bin/ampdist
gpu_tests=$bin/ampdist_gpu_tests
[[ -x $gpu_tests ]] || gpu_tests=$bin/tests/ampdist_gpu_tests
missing=$(ldd "$ampdist" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
[[ -z $missing ]] || { say "libraries not found for $ampdist: $missing(is the CUDA toolkit's lib64 present?)"; exit 1; }

# 1. The GPU tests: kernels against the CPU backend, the scenarios on GPU buffers, a short training run.
say "running the GPU tests (one process)"
timeout 240 "$gpu_tests" --gtest_brief=1 >"$out/gpu_tests.log" 2>&1
tests_rc=$?
tests_line=$(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/gpu_tests.log" | tr '\n' ' ')
grep -E 'FAILED|Failure|error' "$out/gpu_tests.log" | head -40
say "GPU tests: exit $tests_rc: $tests_line"

# 2. The main job for a bounded number of steps in each precision.
data_dir=/usr/share/datasets/fashion-mnist
[[ -f $data_dir/train-images-idx3-ubyte.gz ]] || data_dir=$root/build/gpu-data
data_note="Fashion-MNIST"
data_set=(--set "data.idx.dir=$data_dir")
if [[ ! -f $data_dir/train-images-idx3-ubyte.gz ]]; then
  data_note="synthetic data with Fashion-MNIST's shapes (no Fashion-MNIST files here)"
  data_set=(--set "data.synthetic.train_samples=60000" --set "data.synthetic.test_samples=10000"
            --set "data.synthetic.features=784" --set "data.synthetic.classes=10")
fi
steps=${GPU_CHECK_STEPS:-1500}
declare -A sps acc
for p in fp32 fp16 bf16; do
  t=$(( $(left) / 3 ))
  (( t > 20 )) || { say "out of time before $p"; break; }
  log="$out/train_$p.log"
  timeout "$t" "$ampdist" train --config configs/fashion_mnist_mlp.pbtxt --device cuda --precision "$p" \
    "${data_set[@]}" --set "train.steps=$steps" --set "log.every_steps=500" --set "checkpoint.save_final=false" \
    --run-dir "$out/run_$p" >"$log" 2>&1
  rc=$?
  sps[$p]=$(awk '/^samples\/s:/ {print $2}' "$log")
  acc[$p]=$(awk '/^test accuracy:/ {print $3}' "$log")
  say "train $p: exit $rc, $(grep -E '^(samples/s|test accuracy|skipped steps|final loss scale):' "$log" | tr '\n' ' ')"
  (( rc == 0 )) || tail -5 "$log"
done

echo
echo "==== gpu_check summary ===="
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/^/device: /'
echo "GPU tests: exit $tests_rc $tests_line"
echo "main job: $steps steps, global batch 128, $data_note"
for p in fp32 fp16 bf16; do
  printf '  %-5s samples/s %-10s test accuracy %s\n' "$p" "${sps[$p]:-n/a}" "${acc[$p]:-n/a}"
done
echo "logs: $out"
(( tests_rc == 0 )) || exit 1
