// The CPU backend's GEMM engine: oneDNN matmul primitives (Intel's oneAPI Deep Neural Network Library, the CPU
// library behind PyTorch). oneDNN chooses its kernels at run time from the CPU's features (brgemm on AMX or
// AVX512-BF16 for bf16, AVX-512 / AVX2 for f32), so a binary built anywhere runs natively everywhere.
//
// Numerics (the tensor-core contract of DESIGN.md): bf16 inputs go to oneDNN's matmul as they are; oneDNN multiplies
// bf16 exactly and accumulates in FP32 (AMX TDPBF16PS, AVX512 VDPBF16PS), adds the bias in FP32 and rounds the FP32
// result once (round to nearest even) into a bf16 output. fp16 inputs, which oneDNN 2.6 has no matmul for on
// the CPU, and bf16 inputs on a CPU without bf16 hardware (engine_dtype below), are converted exactly to FP32
// (every fp16 and bf16 value is an FP32 value), multiplied as FP32 (sgemm below) and, for a 16-bit output, rounded
// once by us. beta != 0 is oneDNN's sum post-op on an FP32 output, or sgemm's beta:
// C = alpha (A B) + beta C with one FP32 rounding (the weight gradient accumulated into the FP32 gradient buffer).
//
// Determinism: oneDNN 2.6 has no "deterministic" attribute (it arrived in 3.x, for GPU atomics), and needs none on
// the CPU: brgemm matmul splits K over threads only by a fixed partition of its thread ids and reduces the partial
// sums in thread order (dnnl_sgemm's K partition likewise), so for a given shape and thread count every run, rank and
// host computes bitwise the same result. Different thread counts may round differently (tests/unit/test_onednn.cc checks both facts).
//
// Primitives are cached by shape, dtypes, strides and attributes, per thread; the scratchpad is ours (one buffer
// per thread, grown to the largest need), so a steady-state step allocates nothing here.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/dtype.h"

namespace ampdist::kernels::cpu::onednn {

// One (batched) matmul: for every batch index b, C_b[M, N] = alpha * A_b[M, K] B_b[K, N] (+ bias[N]) + beta * C_b.
// Strides are in elements, for the logical dims {batch, row, column} of A [M, K], B [K, N] and C [M, N]: a
// transposed operand is a swapped pair of strides. a and b have one dtype (fp32, fp16, bf16); c is FP32 or that
// dtype; beta != 0 needs an FP32 c; bias (N values of bias_dtype, or null) is broadcast over rows and batches.
struct Matmul {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType ab_dtype = DType::kFloat32, c_dtype = DType::kFloat32, bias_dtype = DType::kFloat32;
  int64_t a_stride[3] = {0, 0, 1}, b_stride[3] = {0, 0, 1}, c_stride[3] = {0, 0, 1};
  float alpha = 1.0f, beta = 0.0f;
};
void matmul(const Matmul& mm, const void* a, const void* b, void* c, const void* bias = nullptr);

// C[M, N] = alpha * op(A) op(B) + beta * C, FP32, row-major (ld* = row lengths as stored): oneDNN's BLAS-like
// dnnl_sgemm (its jit GEMM, which packs both operands). It runs every transpose at the same rate, where oneDNN
// 2.6's f32 brgemm matmul runs a non-transposed B or a transposed A at a third of its rate (4096 x 768 x 3072 on one
// AVX-512 core: 157 GFLOP/s for x W^T, 61 for dy W, 50 for dy^T x; dnnl_sgemm 185, 189, 164), so FP32 GEMMs (and
// converted fp16 ones) take this path and bf16 takes matmul, whose AMX kernels run every layout at full rate.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The dtype in which the CPU backend multiplies operands of dtype `operands` (GEMMs, attention's products,
// convolutions): bf16 where oneDNN runs bf16 on bf16 hardware for this CPU (native_bf16()), else FP32 after an exact
// widening (fp16 always: oneDNN 2.6 has no fp16 matmul or convolution on the CPU; bf16 on CPUs below AVX512-BF16,
// where oneDNN has no bf16 kernel at all (AVX2) or only an emulation (avx512_core)). Either way the contract holds:
// exact products, FP32 accumulation, one rounding of the output. Decided once per process from the implementation
// oneDNN itself offers (under AMPDIST_MAX_CPU_ISA, isa.h), never from a list of CPU models.
DType engine_dtype(DType operands);
// The oneDNN implementation that runs a 2-d GEMM of these dtypes (M = N = K = 256, no transposes): oneDNN's
// impl_info_str where bf16 runs natively ("brg:avx512_core_amx_bf16", "brg:avx512_core_bf16"), "dnnl_sgemm (jit)"
// for fp32, and "dnnl_sgemm (jit) after an exact conversion of <dtype> to f32" for a widened dtype.
std::string implementation(DType ab_dtype, DType c_dtype);
// True when bf16 GEMMs run on bf16 hardware (an AMX or AVX512-BF16 kernel of oneDNN's), not on an emulation or a
// widening; false also where oneDNN has no bf16 matmul at all.
bool native_bf16();
// Tests: false sends bf16 down the widening path on any CPU; true restores the native path where there is one.
void set_native_bf16_enabled(bool enabled);
// oneDNN's version, e.g. "2.6.3".
std::string version();

}  // namespace ampdist::kernels::cpu::onednn
