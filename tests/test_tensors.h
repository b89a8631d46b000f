// Test helpers shared by tests/unit and tests/gpu: seeded random tensors, host copies, central differences, the
// parameter fill of the gradient checks, and parameters bound to master weights. Header-only.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/amp/master_weights.h"
#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"

namespace ampdist::testing {

// Uniform draws of the synthetic-data Philox RNG under one seed: draw i of stream s is U(lo, hi) from element i of
// the stream {s, 0, 0}, so a value depends on (seed, stream, index) only. A file declares one generator, e.g.
// `const testing::TensorRng random_tensor{4242};`, and calls it as a function.
struct TensorRng {
  uint64_t seed;

  float uniform(uint32_t stream, int64_t i, float lo, float hi) const {
    const RngStream rng{seed, {stream, 0, 0}, RngPurpose::kSynthetic};
    return lo + (hi - lo) * rng.uniform(static_cast<uint64_t>(i));
  }
  // A host FP32 tensor [shape] whose element i is draw i of `stream`.
  Tensor operator()(const Shape& shape, uint32_t stream, float lo = -1.0f, float hi = 1.0f) const {
    Tensor t = Tensor::empty(shape, DType::kFloat32);
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = uniform(stream, i, lo, hi);
    return t;
  }
  // Every parameter's FP32 master weights: U(lo, hi) from stream 100 + the parameter's index; gains (ParamInit::kOnes,
  // LayerNorm and BatchNorm) 1 + U(-0.2, 0.2).
  void fill(const std::vector<Parameter*>& params, float lo, float hi) const {
    for (Parameter* p : params) {
      float* w = p->master.data_as<float>();
      const uint32_t stream = static_cast<uint32_t>(100 + p->index);
      for (int64_t i = 0; i < p->numel(); ++i)
        w[i] = p->init == ParamInit::kOnes ? 1.0f + uniform(stream, i, -0.2f, 0.2f) : uniform(stream, i, lo, hi);
    }
  }
};

// The elements of t (any dtype, host or device) as floats.
inline std::vector<float> copy_of(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.item(i);
  return v;
}

// sum_i y[i] * w[i] in double (y of any dtype): a loss whose gradient with respect to y is w.
inline double dot(const Tensor& y, const Tensor& w) {
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.item(i)) * w.item(i);
  return s;
}

// Central difference of f at *v, divided by the step actually taken in FP32 ((v + h) - (v - h) as floats).
inline double central(float* v, float h, const std::function<double()>& f) {
  const float v0 = *v, up = v0 + h, down = v0 - h;
  *v = up;
  const double fp = f();
  *v = down;
  const double fm = f();
  *v = v0;
  return (fp - fm) / (static_cast<double>(up) - static_cast<double>(down));
}

// Checks `count` evenly spread elements of `values` (n of them, perturbed in place and restored) against `analytic`:
// |central difference - analytic| <= 2e-3 + 2e-2 |analytic|. The source of the bound: a central difference with step h
// in FP32 has rounding error about 2^-24 |L| / h and truncation error O(h^2 f'''); with |L| <~ 10 and h = 1e-2 both
// are <~ 1e-4, so the bound is ~10x the expected error and far below a wrong term (an error of O(|analytic|)).
inline void check_grad(const std::string& what, float* values, const float* analytic, int64_t n, int64_t count,
                       const std::function<double()>& loss, float h = 1e-2f) {
  const int64_t step = std::max<int64_t>(1, n / count);
  for (int64_t i = 0; i < n; i += step) {
    const double fd = central(values + i, h, loss);
    EXPECT_NEAR(analytic[i], fd, 2e-3 + 2e-2 * std::abs(fd)) << what << "[" << i << "]";
  }
}

// Parameters of the given shapes (named p0, p1, ...), owned here, bound to flat master weights (bind_parameters) on
// the CPU.
struct OwnedParams {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> ptrs;
  std::unique_ptr<MasterWeights> mw;
  explicit OwnedParams(const std::vector<Shape>& shapes, DType working = DType::kFloat32, float bound = 0.5f) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto p = std::make_unique<Parameter>();
      p->name.assign(1, 'p');  // "p0", "p1", ... (built so: GCC 12 warns -Wrestrict on string literal assignments here)
      p->name += std::to_string(i);
      p->shape = shapes[i];
      p->init_bound = bound;
      ptrs.push_back(p.get());
      owned.push_back(std::move(p));
    }
    mw = bind_parameters(ptrs, working, Device::kCPU, 0);
  }
};

}  // namespace ampdist::testing
