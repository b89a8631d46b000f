// Helpers of the GPU tests: skipping without a GPU, and reading tensors of either device on the host.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/tensor.h"

// Skips the test, saying why, when no GPU is visible (or the build has no CUDA backend).
#define REQUIRE_GPU()                                                                                       \
  do {                                                                                                      \
    if (::ampdist::device::device_count() == 0)                                                             \
      GTEST_SKIP() << "no GPU: " << ::ampdist::device::unavailable_reason();                               \
  } while (0)

namespace ampdist::testing {

// Every element as float, from a host or device tensor of any dtype.
inline std::vector<float> floats(const Tensor& t) {
  const Tensor h = t.device() == Device::kCPU ? t : t.to(Device::kCPU);
  std::vector<float> v(h.numel());
  for (int64_t i = 0; i < h.numel(); ++i) v[i] = h.item(i);
  return v;
}

}  // namespace ampdist::testing
