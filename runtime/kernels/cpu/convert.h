// Exact conversions of a run of 16-bit values to FP32 and back, for the CPU kernels that work on FP32 blocks or
// planes of 16-bit tensors and for the GEMMs' widening path. Each loop is written so that the compiler vectorises it
// and gives the bits of the scalar conversion (static_cast through Eigen::half / Eigen::bfloat16) for every value but
// a NaN's payload:
// - bf16 -> FP32 is the 16-bit shift;
// - FP32 -> bf16 is Eigen's round-to-nearest-even (add 0x7fff plus the kept lsb, keep the high half), NaN -> 0x7fc0
//   or 0xffc0 by its sign, as Eigen::bfloat16(float) does (Eigen's packet cast gives other bits for a negative NaN);
// - fp16 -> FP32 is F16C's vcvtph2ps, 8 at a time (part of x86-64-v3, the default build's baseline): exact, as
//   Eigen's scalar conversion, which GCC builds compile as a software routine (Eigen's EIGEN_HAS_FP16_C tests for
//   clang), 13x slower here; a signalling NaN comes back quieted (Eigen keeps it signalling), so NaN stays NaN of
//   the same sign, which is all the numerics rules ask (tests/unit/test_dtype.cc). Without F16C (a build for
//   another baseline), Eigen's conversion;
// - FP32 -> fp16 is Eigen's (round to nearest even, NaN -> 0x7e00 | sign).
// A loop converting one 16-bit value per use does not vectorise: BatchNorm over a bf16 input took 16.5% of a
// ResNet-18 bf16 step that way, and the 100M MLP's bf16 ReLU forward and backward about 28 ms each per step (perf).
// Eigen's packet cast of bf16 to FP32 ran at a quarter of the shift's rate (400K values: 119 us against 27 us on an
// AMD EPYC, x86-64-v3 build), which made a bf16 GEMM on the widening path cost 0.75x of an FP32 one at the main
// job's first layer.
#pragma once

#include <immintrin.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ampdist::kernels::cpu {

// dst[0..n) = src[0..n) as FP32. T: Eigen::half or Eigen::bfloat16.
template <typename T>
void widen_block(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = Eigen::numext::bit_cast<float>(static_cast<uint32_t>(s[i]) << 16);
  } else {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, src + i, 2);
      dst[i] = _cvtsh_ss(bits);
    }
#endif
    Eigen::Map<Eigen::ArrayXf>(dst + i, n - i) =
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(src + i, n - i).template cast<float>();
  }
}

// dst[0..n) = src[0..n) rounded to T (nearest even). T: Eigen::half or Eigen::bfloat16.
template <typename T>
void narrow_block(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = Eigen::numext::bit_cast<uint32_t>(src[i]);
      const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      const uint16_t nan = static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
      d[i] = src[i] != src[i] ? nan : rounded;
    }
  } else {
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(dst, n) = Eigen::Map<const Eigen::ArrayXf>(src, n).template cast<T>();
  }
}

}  // namespace ampdist::kernels::cpu
