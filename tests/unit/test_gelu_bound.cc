// The GPU tests' GELU bound (tests/gpu/gelu_bound.h) checked on the CPU: any math library whose expf is within its
// documented error (CUDA: 2 ulp, glibc: 1 ulp, of the correctly rounded value) gives GELU results inside the
// bracket the GPU test asserts, on the GPU test's own inputs and on a dense sweep. Also: the formulas' *_from_exp
// forms compute what math::gelu computed before they existed, bit for bit (the CPU's results are unchanged).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/kernels/math.h"
#include "tests/gpu/gelu_bound.h"

namespace ampdist {
namespace {

using testing::Bracket;
using testing::round_to_dtype;
using testing::step_floats;

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The formulas as they were written before the *_from_exp split.
float old_gelu(float x) {
  float u = math::kSqrt2OverPi * (x + math::kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + (1.0f - 2.0f / (expf(2.0f * u) + 1.0f)));
}
float old_gelu_backward(float x, float dy) {
  float x2 = x * x;
  float u = math::kSqrt2OverPi * (x + math::kGeluCoeff * x2 * x);
  float t = 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
  float du = math::kSqrt2OverPi * (1.0f + 3.0f * math::kGeluCoeff * x2);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

// The inputs: the GPU test's (rounded to each dtype, as its tensors are) and a sweep of [-12, 12] in steps of 2^-9.
std::vector<float> inputs(DType t) {
  std::vector<float> v = testing::gelu_test_inputs();
  for (int i = -12 * 512; i <= 12 * 512; ++i) v.push_back(static_cast<float>(i) / 512.0f);
  for (float& x : v) x = round_to_dtype(x, t);
  return v;
}
std::vector<float> grads(size_t n) {
  std::mt19937 g(12);  // the GPU test's dy draw
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The correctly rounded expf of a float argument: exp in double (relative error about 1e-16) rounded to float.
// Double rounding could differ from the true correct rounding only within 1e-16 of a midpoint, where either float
// is within 0.5 ulp + 1e-16 relative: the checks below allow the library under test a whole ulp more than that.
float correctly_rounded_exp(float a) { return static_cast<float>(std::exp(static_cast<double>(a))); }

TEST(GeluBound, TheFromExpFormsComputeTheSameBits) {
  const std::vector<float> xs = inputs(DType::kFloat32), dys = grads(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_TRUE(same_bits(math::gelu(xs[i]), old_gelu(xs[i]))) << xs[i];
    ASSERT_TRUE(same_bits(math::gelu_backward(xs[i], dys[i]), old_gelu_backward(xs[i], dys[i]))) << xs[i];
  }
}

// The premise for the CPU side: this machine's expf is within 1 ulp of the correctly rounded value on every
// argument the tests use.
TEST(GeluBound, ThisMachinesExpfIsWithinOneUlp) {
  for (float x : inputs(DType::kFloat32)) {
    for (float a : {2.0f * math::gelu_arg(x), 2.0f * math::gelu_backward_arg(x)}) {
      const float cr = correctly_rounded_exp(a), got = expf(a);
      if (std::isinf(cr)) continue;
      EXPECT_TRUE(got >= step_floats(cr, -1) && got <= step_floats(cr, 1)) << "expf(" << a << ") = " << got
                                                                           << ", correctly rounded " << cr;
    }
  }
}

// Every expf a conforming GPU library may return (the correctly rounded value +- 2 floats) gives a forward and a
// backward result inside the bracket computed from this machine's expf, in every output dtype.
TEST(GeluBound, EveryConformingGpuExpfStaysInsideTheBracket) {
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> xs = inputs(t), dys = grads(xs.size());
    int64_t checked = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i], dy = round_to_dtype(dys[i], t);
      const Bracket f = testing::gelu_bracket(x, t), b = testing::gelu_backward_bracket(x, dy, t);
      const float ef = correctly_rounded_exp(2.0f * math::gelu_arg(x));
      const float eb = correctly_rounded_exp(2.0f * math::gelu_backward_arg(x));
      for (int k = -2; k <= 2; ++k) {
        const float gf = std::isinf(ef) ? ef : step_floats(ef, k), gb = std::isinf(eb) ? eb : step_floats(eb, k);
        const float yf = round_to_dtype(math::gelu_from_exp(x, gf), t);
        const float yb = round_to_dtype(math::gelu_backward_from_exp(x, dy, gb), t);
        ASSERT_TRUE(f.contains(yf)) << "x=" << x << " k=" << k << ": " << yf << " not in [" << f.lo << ", " << f.hi
                                    << "]";
        ASSERT_TRUE(b.contains(yb)) << "x=" << x << " dy=" << dy << " k=" << k << ": " << yb << " not in [" << b.lo
                                    << ", " << b.hi << "]";
        ++checked;
      }
    }
    EXPECT_EQ(checked, static_cast<int64_t>(xs.size()) * 5);
  }
}

// Why the bound is a bracket and not a fixed number of ulps: a one-ulp change of expf alone moves some of the GPU
// test's own inputs by more than the former 4 FP32 ulps + 1 ulp of the dtype, and all of those lie where 1 + tanh
// loses digits (x in about [-6, -0.5]: 1 + t is below 0.5 while q = 2 / (e + 1) keeps the absolute error of ulp(2)).
TEST(GeluBound, AFixedUlpBoundFailsWhereOnePlusTanhCancels) {
  const std::vector<float> xs = testing::gelu_test_inputs();
  int over = 0;
  for (float x : xs) {
    const float e = testing::gelu_exp(x);
    const float a = math::gelu_from_exp(x, e), b = math::gelu_from_exp(x, step_floats(e, 1));
    const float ulp = std::ldexp(1.0f, std::max(std::ilogb(std::max(std::fabs(a), 1e-38f)), -126) - 23);
    if (std::fabs(a - b) > 5 * ulp) {
      ++over;
      EXPECT_TRUE(x > -6.0f && x < -0.5f) << x;
    }
  }
  EXPECT_GT(over, 10) << "a one-ulp expf change should exceed a 5-ulp bound on many of the 5000 inputs";
  // The bracket is still narrow in absolute terms: the largest width over the inputs is below 1e-6 |x|.
  for (float x : xs) {
    const Bracket f = testing::gelu_bracket(x, DType::kFloat32);
    EXPECT_LE(f.hi - f.lo, 1e-6f * std::fabs(x) + 1e-30f) << x;
  }
}

}  // namespace
}  // namespace ampdist
