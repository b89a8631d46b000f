// How far the CUDA backend's GELU may be from the CPU backend's, derived from the formula (kernels/math.h) and the
// documented accuracy of expf; used by the GPU tests and checked on the CPU by tests/unit/test_gelu_bound.cc.
//
// Both backends evaluate math::gelu_from_exp(x, e) and math::gelu_backward_from_exp(x, dy, e) with the same IEEE
// float operations (no FMA contraction: -ffp-contract=off, nvcc --fmad=false; IEEE division, nvcc's default
// -prec-div=true), so the only difference is e = expf(2u) itself (u is computed alike):
//   - CUDA's expf is within 2 ulp of the correctly rounded result (CUDA C++ Programming Guide, "Mathematical
//     Functions", single precision, full range; the library's own FMAs are explicit, so --fmad=false leaves it as
//     documented);
//   - glibc's expf is within 1 ulp (glibc manual, "Errors in Math Functions"; its expf since 2.28 is about 0.5 ulp).
// So the GPU's e lies within kExpUlps = 3 ulps of the CPU's e. Every operation after it (e + 1, 2 / s, 1 - q, 1 + t,
// the products, the rounding to the output dtype) is a correctly rounded, hence monotone, function of its inputs.
//   Forward: gelu_from_exp is monotone in e, so the GPU's result lies between its values at e - 3 ulp and e + 3 ulp
//   (rounded to the output dtype, also monotone): an exact bracket, no slack.
//   Backward: not monotone in e (through t^2), so the bracket is the minimum and maximum over every float value
//   s = fl(e' + 1) can take for e' within 3 ulp of e (a handful of floats, since s >= 1).
// The cancellation in 1 + t for x in about [-4, -1.5] is why a fixed ulp bound fails there: a one-ulp change of e
// can move one rounding of q = 2 / (e + 1), which is ulp(2) / (2 e) ulps of the result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/kernels/math.h"
#include "tests/gpu/bounds.h"

namespace ampdist::testing {

constexpr int kExpUlps = 3;  // CUDA expf (2 ulp) + glibc expf (1 ulp), both from the correctly rounded value

// The float `steps` representable numbers away from e (negative: below).
inline float step_floats(float e, int steps) {
  const float to = steps < 0 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  for (int i = 0; i < std::abs(steps); ++i) e = std::nextafter(e, to);
  return e;
}

struct Bracket {
  float lo, hi;
  bool contains(float v) const { return v >= lo && v <= hi; }
};

// The CPU's e for the forward and the backward (the arguments differ in how they round x^3).
inline float gelu_exp(float x) { return expf(2.0f * math::gelu_arg(x)); }
inline float gelu_backward_exp(float x) { return expf(2.0f * math::gelu_backward_arg(x)); }

// Where another conforming library's GELU(x), rounded to `out`, lies, given this machine's e = gelu_exp(x).
inline Bracket gelu_bracket(float x, DType out, int ulps = kExpUlps) {
  const float e = gelu_exp(x);
  const float a = round_to_dtype(math::gelu_from_exp(x, step_floats(e, -ulps)), out);
  const float b = round_to_dtype(math::gelu_from_exp(x, step_floats(e, ulps)), out);
  return {std::min(a, b), std::max(a, b)};
}

// The same for the backward, dy given. Its result is not monotone in e (through t^2), so every value the GPU's
// s = e + 1 can take is enumerated: s is a float between fl(e_lo + 1) and fl(e_hi + 1) (rounding is monotone),
// a handful of them since s >= 1; the rest is math::gelu_backward_from_exp's arithmetic after its e + 1.
inline Bracket gelu_backward_bracket(float x, float dy, DType out, int ulps = kExpUlps) {
  const float e = gelu_backward_exp(x);
  const float s0 = step_floats(e, -ulps) + 1.0f, s1 = step_floats(e, ulps) + 1.0f;
  const float x2 = x * x;
  const float du = math::kSqrt2OverPi * (1.0f + 3.0f * math::kGeluCoeff * x2);
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  int n = 0;
  for (float s = s0;; s = std::nextafter(s, std::numeric_limits<float>::infinity())) {
    const float t = 1.0f - 2.0f / s;
    const float v = round_to_dtype(dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du), out);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    if (!(s < s1) || ++n > 4096) break;  // s1 = inf (e overflowed): t = 1 for every s this large
  }
  return {lo, hi};
}

// The GPU test's GELU inputs: N(0, 3^2) from std::mt19937(seed), the same draw as its random_values().
inline std::vector<float> gelu_test_inputs(size_t n = 5000, uint32_t seed = 11, float scale = 3.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

}  // namespace ampdist::testing
