#!/usr/bin/env bash
# Packs a CUDA build of ampdist for a GPU host that has the NVIDIA driver and nothing else: no CUDA toolkit, no
# NCCL, no MPI, no protobuf, no network. It carries the binaries (the CUDA runtime is linked into them statically),
# every shared library they need except the C library and the driver (cuBLAS, cuBLASLt, cuDNN and NCCL included), OpenMPI's
# run-time tree with its mpirun, and the check's data (Fashion-MNIST, the fortunes corpus as token files).
#
#   bash launch/gpu_bundle.sh [--no-archive] [BUILD_DIR] [OUT_DIR]      (defaults: build, BUILD_DIR/gpu-bundle)
#
# Writes OUT_DIR and, unless --no-archive, OUT_DIR.tar.gz (what to carry; launch/gpu_check.sh unpacks it). Then it
# runs its own checks and fails when one fails:
#   - OUT_DIR/selfcheck.sh: every ELF file of the bundle resolves every library it needs inside the bundle or in the
#     system's C library (ldd with the bundle's environment);
#   - launch/check_isa.sh on every ELF file, when that script exists: no instruction beyond the x86-64 + AVX2
#     baseline outside run-time dispatched code (the bundle's MANIFEST says when it was not run).
# The target host needs the same x86-64 glibc line (Debian 12's glibc 2.36 or newer) and a driver that runs the CUDA
# runtime the build used: the MANIFEST's driver_min (R580 for CUDA 13, R525 for CUDA 12), which gpu_check.sh reads.
set -euo pipefail
cd "$(dirname "$0")/.."
archive=1
if [[ ${1:-} == --no-archive ]]; then archive=0; shift; fi
build=${1:-build}
out=${2:-$build/gpu-bundle}
say() { echo "gpu_bundle: $*"; }
for b in ampdist tests/ampdist_gpu_tests; do
  [[ -x $build/$b ]] || { say "$build/$b is missing: build with the CUDA backend first" \
                              "(bash launch/setup/build.sh -DAMPDIST_CUDA=ON)" >&2; exit 2; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
cp "$build/ampdist" "$build/tests/ampdist_gpu_tests" "$out/bin/"
[[ -x $build/bench/ampdist_bench_gpu ]] && cp "$build/bench/ampdist_bench_gpu" "$out/bin/"

# The libraries that stay the host's own: the C library and the dynamic loader (same glibc line), and the driver's
# (libcuda and libnvidia-*: they must match the kernel module; no carried binary names them as NEEDED, the CUDA
# runtime loads libcuda.so.1 at run time).
keep_system='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libutil\.|libresolv|libcuda\.|libnvidia)'

copy_deps() {  # copy_deps FILE...: the non-system libraries FILE needs, recursively (ldd resolves the closure)
  ldd "$@" 2>/dev/null | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $keep_system ]] && continue
    [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name"
  done
}
copy_deps "$out"/bin/*
# cuDNN 9's libcudnn.so.9 is a shim that opens its sub-libraries at run time (dlopen, so ldd does not list them):
# the convolution API's (cnn, ops, graph), its engines and heuristics, from the directory of the libcudnn linked in.
# Not libcudnn_adv (RNN and attention, which ampdist does not call).
if [[ -e $out/lib/libcudnn.so.9 ]]; then
  cudnn_dir=$(dirname "$(ldd "$out"/bin/ampdist | awk '$1 == "libcudnn.so.9" {print $3}' | xargs readlink -f)")
  for lib in cnn ops graph engines_precompiled engines_runtime_compiled heuristic; do
    f=$cudnn_dir/libcudnn_$lib.so.9
    [[ -e $f ]] || { say "cuDNN's $f is missing (the GPU convolutions need it)" >&2; exit 1; }
    cp -L "$f" "$out/lib/"
    copy_deps "$out/lib/libcudnn_$lib.so.9"
  done
fi

# The toolkit the build compiled with (CMake's CUDA compiler), its version, and the oldest driver branch that runs
# its runtime with the bundle's cubins (CUDA's minor version compatibility, per major: R525 for 12.x, R580 for 13.x;
# the toolkits' release notes).
nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
[[ -x $nvcc ]] || nvcc=/usr/local/cuda/bin/nvcc
cuda_version=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
case ${cuda_version%%.*} in
  12) driver_min=525 ;;
  13) driver_min=580 ;;
  *) say "$nvcc: CUDA ${cuda_version:-of unknown version}: no known driver minimum (12.x and 13.x are)" >&2; exit 1 ;;
esac
# NVRTC, which cuDNN's runtime-compiled engines open at run time (dlopen: ldd does not list it), and the builtins
# library that NVRTC itself opens, from the toolkit's library directory.
cuda_libdir=$(readlink -f "$(dirname "$nvcc")/../lib64")
for f in "$cuda_libdir/libnvrtc.so.${cuda_version%%.*}" "$cuda_libdir/libnvrtc-builtins.so.$cuda_version"; do
  [[ -e $f ]] || { say "NVRTC's $f is missing (cuDNN's runtime-compiled engines need it)" >&2; exit 1; }
  cp -L "$f" "$out/lib/"
  copy_deps "$out/lib/$(basename "$f")"
done

# OpenMPI's run-time tree under the same relative paths as Debian's prefix (/usr), so that OPAL_PREFIX=$out finds
# its plugins and help texts, and its launcher for the multi-GPU runs (one node: mpirun starts the ranks itself).
mpi_lib=$(ldconfig -p | awk '/libmpi\.so\.40 / && !f {print $NF; f = 1}')
mpi_libdir=$(dirname "$(readlink -f "$mpi_lib")")
plugin_rel=lib/x86_64-linux-gnu/openmpi/lib/openmpi3
if [[ -d $mpi_libdir/openmpi/lib/openmpi3 ]]; then
  mkdir -p "$out/$plugin_rel"
  # Not the fabric plugins (UCX, OFI, verbs ...), whose libraries are large and useless without their hardware.
  for p in "$mpi_libdir"/openmpi/lib/openmpi3/mca_*.so; do
    case $(basename "$p") in *ucx*|*ofi*|*verbs*|*psm*|*portals*|*cuda*|*lustre*|*gpfs*|*ime*) continue ;; esac
    cp -L "$p" "$out/$plugin_rel/"
  done
  copy_deps "$out/$plugin_rel"/mca_*.so
fi
if [[ -x /usr/bin/orterun ]]; then
  cp -L /usr/bin/orterun "$out/bin/mpirun"
  copy_deps "$out/bin/mpirun"
fi
[[ -d /usr/share/openmpi ]] && mkdir -p "$out/share" && cp -r /usr/share/openmpi "$out/share/"
pmix_dir=$mpi_libdir/pmix2/lib/pmix
if [[ -d $pmix_dir ]]; then
  mkdir -p "$out/pmix"
  cp -L "$pmix_dir"/*.so "$out/pmix/"
  copy_deps "$out/pmix"/*.so
fi

# The check's data: Fashion-MNIST (Debian's dataset-fashion-mnist) and the fortunes corpus as token files.
if [[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  mkdir -p "$out/data/fashion-mnist"
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$out/data/fashion-mnist/"
fi
if [[ -d /usr/share/games/fortunes ]]; then
  "$build/ampdist" prepare-text /usr/share/games/fortunes --out "$out/data/fortunes" >"$out/data/fortunes.txt" 2>&1 ||
    { say "prepare-text of the fortunes corpus failed:"; cat "$out/data/fortunes.txt"; exit 1; }
fi

cat > "$out/env.sh" <<'ENV'
# Sourced by launch/gpu_check.sh: run the bundled binaries with the bundled libraries and OpenMPI tree.
bundle_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$bundle_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$bundle_dir" PATH="$bundle_dir/bin:$PATH"
[[ -d $bundle_dir/pmix ]] && export PMIX_MCA_mca_base_component_path="$bundle_dir/pmix"
# A process started without mpirun stays a singleton (no orted to start); mpirun runs one node's ranks itself.
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ENV

cat > "$out/selfcheck.sh" <<'CHECK'
#!/usr/bin/env bash
# Every ELF file of this bundle must find every library it needs in the bundle, or be one of the host's C library
# (libc, libm, libpthread, libdl, librt, libutil, libresolv, the loader). Prints one line per problem; exit 1 if any.
bundle_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bundle_dir/env.sh"
system='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so)'
bad=0 files=0
while IFS= read -r f; do
  head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
  files=$((files + 1))
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || { [[ $name == /* || $name =~ $system ]] && continue; }
    if [[ $path == "not" ]]; then echo "selfcheck: ${f#$bundle_dir/}: $name not found"; bad=1; continue; fi
    [[ $name =~ $system ]] && continue
    [[ $path == "$bundle_dir"/* ]] || { echo "selfcheck: ${f#$bundle_dir/}: $name resolves outside the bundle ($path)"; bad=1; }
  done < <(ldd "$f" 2>/dev/null)
done < <(find "$bundle_dir/bin" "$bundle_dir/lib" "$bundle_dir/pmix" -type f 2>/dev/null)
(( files > 0 )) || { echo "selfcheck: no ELF files in $bundle_dir"; exit 1; }
(( bad == 0 )) && echo "selfcheck: $files ELF files, every library resolved within the bundle or the C library"
exit $bad
CHECK
chmod +x "$out/selfcheck.sh"

# The instruction-set check, on every ELF file (the binaries, the carried libraries, the MPI plugins).
mapfile -t elves < <(find "$out/bin" "$out/lib" "$out/pmix" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print 2>/dev/null)
if [[ -f launch/check_isa.sh ]]; then
  if isa_out=$(bash launch/check_isa.sh "${elves[@]}" 2>&1); then
    isa="passed on ${#elves[@]} ELF files (launch/check_isa.sh: x86-64 + AVX2 baseline)"
  else
    echo "$isa_out" | sed 's/^/gpu_bundle: isa: /'
    isa="FAILED (launch/check_isa.sh)"
  fi
else
  isa="not run: launch/check_isa.sh is not in this tree"
fi

# The device code the CUDA objects were compiled to, from every library's CUDA flags (one library per folder).
cuda_archs=$(cat "$build"/CMakeFiles/ampdist_*.dir/flags.make 2>/dev/null | grep -o 'code=\[[^]]*\]' |
             sed 's/^code=\[//; s/\]$//' | tr ',' '\n' | sort -u | tr '\n' ' ' | sed 's/ $//' || true)
if [[ -z $cuda_archs ]]; then
  echo "gpu_bundle: $build: no CUDA device code found in CMakeFiles/ampdist_*.dir/flags.make (not a CUDA build?)" >&2
  exit 1
fi
{
  echo "ampdist GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "cuda_runtime: $cuda_version (linked statically)"
  echo "driver_min: $driver_min (the R$driver_min branch or newer runs CUDA ${cuda_version%%.*}.x with these cubins)"
  # The device code the CUDA objects were compiled to: cubins (sm_XY) and PTX (compute_XY, JIT-compiled for newer).
  echo "cuda_architectures: $cuda_archs"
  echo "isa_check: $isa"
  # A build with -march=native (AMPDIST_NATIVE) may use any instruction of this machine's CPU: the host needs them.
  if grep -q '^AMPDIST_NATIVE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    flags=$(awk -F': ' '/^flags/ {print $2; exit}' /proc/cpuinfo)
    echo "cpu_flags_required: $(for f in avx2 fma f16c bmi2 avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 amx_bf16 amx_tile; do
      [[ " $flags " == *" $f "* ]] && printf '%s ' "$f"; done)(built with -march=native)"
  else
    echo "cpu_flags_required: avx2 (portable build)"
  fi
  echo "size: $(du -sh "$out" | awk '{print $1}')"
  (cd "$out" && find . -type f -printf '%s %p\n' | sort -k2)
} > "$out/MANIFEST"

self=$(bash "$out/selfcheck.sh") || { echo "$self" | sed 's/^/gpu_bundle: /'; exit 1; }
say "$self"
say "ISA check: $isa"
say "$out: $(du -sh "$out" | awk '{print $1}')"
[[ $isa == FAILED* ]] && exit 1
if (( archive )); then
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | gzip -1 > "$out.tar.gz"
  say "$out.tar.gz: $(du -sh "$out.tar.gz" | awk '{print $1}')"
fi
