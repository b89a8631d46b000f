// Counter-based random numbers: Philox4x32-10 from Random123 (Salmon et al., SC'11), the generator cuRAND and
// PyTorch's CUDA RNG use. A draw is a pure function of (seed, stream coordinates, counter): there is no generator
// state to save, and CPU and GPU produce the same stream.
//
// Streams are named by four 32-bit coordinates, by convention (purpose, step or epoch, rank, layer); the 64-bit seed
// is the key. Within a stream, draw i is word i%4 of block i/4.
#pragma once

#include <Random123/philox.h>

#include <array>
#include <cstdint>

#include "runtime/core/host_device.h"

namespace ampdist {

// What a stream is for; the first stream coordinate, so that purposes never share numbers.
enum class RngPurpose : uint32_t { kInit = 1, kShuffle = 2, kSynthetic = 3, kDropout = 4, kSampling = 5 };

struct RngStream {
  uint64_t seed;
  std::array<uint32_t, 3> coords;  // e.g. {step or epoch, rank, layer}
  RngPurpose purpose;

  // Four 32-bit words of block `block`.
  AMPDIST_HOST_DEVICE std::array<uint32_t, 4> block4(uint32_t block) const {
    r123::Philox4x32 gen;
    r123::Philox4x32::key_type key = {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
    // 8 bits of purpose and 24 bits of the third coordinate (layers < 2^24) share one counter word.
    r123::Philox4x32::ctr_type ctr = {{block, (static_cast<uint32_t>(purpose) << 24) | (coords[2] & 0xFFFFFFu),
                                       coords[0], coords[1]}};
    auto r = gen(ctr, key);
    return {r[0], r[1], r[2], r[3]};
  }
  // Draw i as 32 random bits.
  AMPDIST_HOST_DEVICE uint32_t bits(uint64_t i) const { return block4(static_cast<uint32_t>(i >> 2))[i & 3]; }
  // Draw i as a float uniform in [0, 1): the top 24 bits scaled by 2^-24, exact in FP32.
  AMPDIST_HOST_DEVICE float uniform(uint64_t i) const { return (bits(i) >> 8) * (1.0f / 16777216.0f); }
};

}  // namespace ampdist
