// Helpers of the GPU tests: skipping without a GPU, and reading tensors of either device on the host.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"

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

// A host FP32 tensor of uniform values in [lo, hi): stream `stream` of the synthetic-data RNG under seed 99.
inline Tensor random_tensor(const Shape& shape, uint32_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  const RngStream rng{99, {stream, 0, 0}, RngPurpose::kSynthetic};
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = lo + (hi - lo) * rng.uniform(i);
  return t;
}

// t in dtype d: t itself, or a host copy converted by kernels::cast.
inline Tensor as(const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
  Tensor out = Tensor::empty(t.shape(), d);
  kernels::cast(t, out);
  return out;
}

}  // namespace ampdist::testing
