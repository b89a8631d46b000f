// Helpers of the GPU tests: skipping without a GPU, and reading tensors of either device on the host.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"
#include "tests/test_tensors.h"

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

// Whether a and b hold the same bits element by element, where any NaN equals any NaN. The one documented
// difference between the backends' element-wise results: arithmetic on a NaN (ReLU's comparison, a conversion)
// keeps the input's payload on x86 (a float quiet NaN is 0x7e00 in fp16 and 0x7fc0 in bf16 on the CPU) and gives
// CUDA's canonical NaN on the GPU (0x7fff in both 16-bit formats, 0x7fffffff in FP32). Every other value, signed
// zeros and infinities included, must match bit for bit.
inline ::testing::AssertionResult same_bits_any_nan(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << "shapes or dtypes differ";
  const std::vector<float> a = floats(got), b = floats(want);
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    // The widened values carry every bit of a 16-bit element, so equal FP32 bits mean equal elements.
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

// Host FP32 tensors of uniform values in [lo, hi): stream `stream` of the synthetic-data RNG under seed 99.
inline const TensorRng random_tensor{99};

// t in dtype d: t itself, or a host copy converted by kernels::cast.
inline Tensor as(const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
  Tensor out = Tensor::empty(t.shape(), d);
  kernels::cast(t, out);
  return out;
}

}  // namespace ampdist::testing
