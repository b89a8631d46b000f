#!/usr/bin/env bash
# Packs a CUDA build of ampdist for a GPU machine that has the NVIDIA driver and the CUDA toolkit (cudart, cuBLAS,
# NCCL) but no MPI, no protobuf and no network: the binaries, every shared library they need that is not the C
# library or part of CUDA, and OpenMPI's run-time tree (plugins and help files, relocated with OPAL_PREFIX).
#
#   bash launch/gpu_bundle.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, build/gpu-bundle)
#
# Writes OUT_DIR, OUT_DIR.tar.xz (what to carry) and BUILD_DIR/gpu-data (Fashion-MNIST's four files, when installed).
# launch/gpu_check.sh uses OUT_DIR, unpacking OUT_DIR.tar.xz first when only that is there. The target machine must have the same x86-64 glibc line
# (Debian 12's glibc 2.36 or newer).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-$build/gpu-bundle}
for b in ampdist tests/ampdist_gpu_tests; do
  [[ -x $build/$b ]] || { echo "gpu_bundle: $build/$b is missing: build with the CUDA backend first" \
                              "(bash launch/setup/build.sh -DAMPDIST_CUDA=ON)" >&2; exit 2; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build/ampdist" "$build/tests/ampdist_gpu_tests" "$out/bin/"

# Libraries that stay the target's own: the C library and the dynamic loader (same glibc line), and CUDA's, which
# the target's driver and toolkit provide (and which are far too large to carry).
keep_system='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libutil\.|libresolv|libcuda\.|libcudart|libcublas|libcublasLt|libnccl|libnvidia|libnvrtc)'

copy_deps() {  # copy_deps FILE...: the non-system libraries FILE needs, recursively (ldd resolves the closure)
  ldd "$@" 2>/dev/null | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $keep_system ]] && continue
    [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name"
  done
}
copy_deps "$out/bin/ampdist" "$out/bin/ampdist_gpu_tests"

# OpenMPI's run-time tree under the same relative paths as Debian's prefix (/usr), so that OPAL_PREFIX=$out finds
# its plugins and help texts. Plugins whose own libraries are missing are skipped by OpenMPI at run time.
mpi_libdir=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libmpi\.so\.40 / {print $NF; exit}')")")
plugin_rel=lib/x86_64-linux-gnu/openmpi/lib/openmpi3
if [[ -d $mpi_libdir/openmpi/lib/openmpi3 ]]; then
  mkdir -p "$out/$plugin_rel"
  # The plugins a single process needs (singleton start-up, shared memory and TCP transports, PMIx): not the
  # fabric ones (UCX, OFI, verbs), whose libraries are large and useless without their hardware.
  for p in "$mpi_libdir"/openmpi/lib/openmpi3/mca_*.so; do
    case $(basename "$p") in *ucx*|*ofi*|*verbs*|*psm*|*portals*|*cuda*|*lustre*|*gpfs*|*ime*) continue ;; esac
    cp -L "$p" "$out/$plugin_rel/"
  done
  copy_deps "$out/$plugin_rel"/mca_*.so
fi
[[ -d /usr/share/openmpi ]] && mkdir -p "$out/share" && cp -r /usr/share/openmpi "$out/share/"
# PMIx (OpenMPI 4's run-time) looks for its own plugins the same way.
pmix_dir=$mpi_libdir/pmix2/lib/pmix
if [[ -n $pmix_dir && -d $pmix_dir ]]; then
  mkdir -p "$out/pmix"
  cp -L "$pmix_dir"/*.so "$out/pmix/"
  copy_deps "$out/pmix"/*.so
fi

cat > "$out/env.sh" <<'ENV'
# Sourced by launch/gpu_check.sh: run the bundled binaries with the bundled libraries and OpenMPI tree.
bundle_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$bundle_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$bundle_dir"
[[ -d $bundle_dir/pmix ]] && export PMIX_MCA_mca_base_component_path="$bundle_dir/pmix"
# One process, no mpirun: do not start an orted (the singleton stays alone).
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV
du -sh "$out" | awk '{print "gpu_bundle: " $2 ": " $1}'
# A compressed copy for carrying (OpenBLAS alone is 36 MB uncompressed), and the main job's data beside it.
tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
du -sh "$out.tar.xz" | awk '{print "gpu_bundle: " $2 ": " $1}'
if [[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  mkdir -p "$build/gpu-data"
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$build/gpu-data/"
  du -sh "$build/gpu-data" | awk '{print "gpu_bundle: " $2 " (Fashion-MNIST): " $1}'
fi
