// Exact conversions of a run of 16-bit values to FP32 and back, for the CPU kernels that work on FP32 blocks or
// planes of 16-bit tensors. Each loop is written so that the compiler vectorises it and gives the bits of the scalar
// conversion (static_cast through Eigen::half / Eigen::bfloat16):
// - bf16 -> FP32 is the 16-bit shift;
// - FP32 -> bf16 is Eigen's round-to-nearest-even (add 0x7fff plus the kept lsb, keep the high half), NaN -> 0x7fc0
//   or 0xffc0 by its sign, as Eigen::bfloat16(float) does (Eigen's packet cast gives other bits for a negative NaN);
// - fp16 goes through Eigen's F16C packets, the instructions its scalar conversion uses, both ways.
// A loop converting one 16-bit value per use does not vectorise: BatchNorm over a bf16 input took 16.5% of a
// ResNet-18 bf16 step that way, and the 100M MLP's bf16 ReLU forward and backward about 28 ms each per step (perf).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <type_traits>

namespace ampdist::kernels::cpu {

// dst[0..n) = src[0..n) as FP32. T: Eigen::half or Eigen::bfloat16.
template <typename T>
void widen_block(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = Eigen::numext::bit_cast<float>(static_cast<uint32_t>(s[i]) << 16);
  } else {
    Eigen::Map<Eigen::ArrayXf>(dst, n) = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(src, n).template cast<float>();
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
