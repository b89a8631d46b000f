// Error bounds of the GPU tests: how far a CUDA result may be from the CPU backend's, derived per formula.
//
// Notation: u = 2^-24 (FP32 unit roundoff), gamma(n) = n u / (1 - n u). The standard results used (Higham, "Accuracy
// and Stability of Numerical Algorithms", 2nd ed.):
//   - a sum of n terms in FP32, in any order (serial, tree, chunked), is within gamma(n - 1) * sum |terms| of the
//     exact sum (3.1, 4.2); two such sums of the same terms differ by at most gamma(n_cpu) + gamma(n_gpu) times it;
//   - tensor cores add the products of an MMA step after aligning them to the largest exponent and may truncate
//     instead of round (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021):
//     we allow them 2 gamma(n), twice the rounding bound;
//   - one correctly rounded operation whose exact inputs differ by d gives results that differ by at most
//     d + ulp(result): the two roundings may fall on either side of a rounding boundary (flip()).
// Library functions (CUDA C++ Programming Guide, "Mathematical Functions", single precision, full range; glibc
// manual, "Errors in Math Functions"): expf is within 2 ulp (CUDA) and 1 ulp (glibc) of the correctly rounded value,
// so within 3 ulp of each other: relative 3 * 2^-23 (kExpRel); logf within 1 ulp on each; division and sqrtf are
// IEEE (nvcc's defaults -prec-div=true -prec-sqrt=true), so the same function of their inputs on both.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/core/dtype.h"

namespace ampdist::testing {

constexpr double kU = 1.0 / (1 << 24);
constexpr double kExpRel = 3.0 / (1 << 23);  // CUDA expf 2 ulp + glibc expf 1 ulp, relative
inline double gamma(double n) { return n * kU / (1.0 - n * kU); }

// x rounded to `t` (round to nearest even) and back; FP32 unchanged.
inline float round_to_dtype(float x, DType t) {
  switch (t) {
    case DType::kFloat16: return static_cast<float>(half(x));
    case DType::kBFloat16: return static_cast<float>(bfloat16(x));
    case DType::kFloat32: break;
  }
  return x;
}

// The spacing of `t` numbers at |v| (FP32's at subnormal magnitudes; fp16's smallest subnormal 2^-24).
inline double ulp_of(DType t, double v) {
  const double a = std::fabs(v);
  const int mant = t == DType::kFloat32 ? 23 : t == DType::kFloat16 ? 10 : 7;
  const int emin = t == DType::kFloat16 ? -14 : -126;
  int e = a > 0 ? std::ilogb(a) : emin;
  e = std::max(e, emin);
  return std::ldexp(1.0, e - mant);
}
inline double ulp32(double v) { return ulp_of(DType::kFloat32, v); }
// The bound after one more rounding of a value of magnitude about |v| whose inputs were within d: d + ulp.
inline double flip(double v, double d, DType t = DType::kFloat32) { return d + ulp_of(t, std::fabs(v) + d); }

}  // namespace ampdist::testing
