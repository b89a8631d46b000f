// The GPU tests' GELU bound (tests/gpu/gelu_bound.h) checked on the CPU: any math library whose expf is within its
// documented error (CUDA: 2 ulp, glibc: 1 ulp, of the correctly rounded value) gives GELU results inside the
// bracket the GPU test asserts, on the GPU test's own inputs and on a dense sweep. Also: the formulas' *_from_exp
// forms compute what math::gelu computed before they existed, bit for bit (the CPU's results are unchanged).
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <Eigen/Core>

#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"
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

// ---- the CPU backend's FP32 GELU kernels: e from Eigen's vectorised exp --------------------------------------------

// Eigen's exp on whole 1024-element blocks, as the kernel calls it (its packet path only).
std::vector<float> eigen_exp(const std::vector<float>& a) {
  std::vector<float> out(a.size());
  Eigen::Array<float, 1024, 1> blk;
  for (size_t k = 0; k < a.size(); k += 1024) {
    const size_t m = std::min<size_t>(1024, a.size() - k);
    blk.setZero();
    for (size_t i = 0; i < m; ++i) blk[static_cast<Eigen::Index>(i)] = a[k + i];
    blk = blk.exp();
    for (size_t i = 0; i < m; ++i) out[k + i] = blk[static_cast<Eigen::Index>(i)];
  }
  return out;
}

// The kernel's premise: on every argument in [-87, 88] Eigen's exp is within 1 ulp of the correctly rounded value,
// glibc's bound. Checked here on every 127th float of that range (17 million arguments; all 2^32 were checked once,
// kernels/cpu/cpu_kernels.cc says the result) and on the arguments of the GELU test inputs.
TEST(GeluBound, EigensExpIsWithinOneUlpOnTheKernelsRange) {
  std::vector<float> args;
  for (uint32_t u = 0; u < 0xff800000u; u += 127) {
    float a;
    std::memcpy(&a, &u, sizeof a);
    for (float s : {a, -a})
      if (s > -87.0f && s < 88.0f) args.push_back(s);
  }
  for (float x : inputs(DType::kFloat32))
    for (float a : {2.0f * math::gelu_arg(x), 2.0f * math::gelu_backward_arg(x)})
      if (a > -87.0f && a < 88.0f) args.push_back(a);
  ASSERT_GT(args.size(), 15000000u);
  const std::vector<float> got = eigen_exp(args);
  int64_t off = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const float cr = correctly_rounded_exp(args[i]);
    if (!(got[i] >= step_floats(cr, -1) && got[i] <= step_floats(cr, 1)) && ++off <= 5)
      ADD_FAILURE() << "exp(" << args[i] << ") = " << got[i] << ", correctly rounded " << cr;
  }
  EXPECT_EQ(off, 0);
}

Tensor fp32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kFloat32);
  std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

// The FP32 kernels' results lie inside the bracket of an exp within 2 ulp of this machine's expf (Eigen's and glibc's
// are each within 1 ulp of the correctly rounded value), so the GPU tests' bracket, 3 ulp around expf, still holds
// for anything the CPU kernels computed; special values give math::gelu's bits; and the bits do not depend on how
// the tensor is split (a view starting 1 to 7 elements later gives the same values for the same elements).
TEST(GeluBound, CpuFp32KernelsStayInsideTheBracketOfAOneUlpExp) {
  std::vector<float> xs = inputs(DType::kFloat32);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1e20f,
                                      -1e20f, 1e-30f, -1e-30f, 30.0f, -30.0f, 3.4e38f, -3.4e38f};
  xs.insert(xs.end(), special.begin(), special.end());
  const std::vector<float> dys = grads(xs.size());
  Tensor x = fp32_tensor(xs), dy = fp32_tensor(dys);
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32), dx = Tensor::empty(x.shape(), DType::kFloat32);
  kernels::gelu_forward(x, y);
  kernels::gelu_backward(x, dy, dx);
  const size_t n_sweep = xs.size() - special.size();
  for (size_t i = 0; i < n_sweep; ++i) {
    const Bracket f = testing::gelu_bracket(xs[i], DType::kFloat32, 2);
    const Bracket b = testing::gelu_backward_bracket(xs[i], dys[i], DType::kFloat32, 2);
    ASSERT_TRUE(f.contains(y.item(i))) << "x=" << xs[i] << ": " << y.item(i) << " not in [" << f.lo << ", " << f.hi
                                       << "]";
    ASSERT_TRUE(b.contains(dx.item(i))) << "x=" << xs[i] << " dy=" << dys[i] << ": " << dx.item(i) << " not in ["
                                        << b.lo << ", " << b.hi << "]";
  }
  for (size_t i = n_sweep; i < xs.size(); ++i) {
    EXPECT_TRUE(same_bits(y.item(i), math::gelu(xs[i])) || (std::isnan(y.item(i)) && std::isnan(math::gelu(xs[i]))))
        << "gelu(" << xs[i] << ") = " << y.item(i) << ", math::gelu " << math::gelu(xs[i]);
    const float want = math::gelu_backward(xs[i], dys[i]);
    EXPECT_TRUE(same_bits(dx.item(i), want) || (std::isnan(dx.item(i)) && std::isnan(want)))
        << "gelu_backward(" << xs[i] << ") = " << dx.item(i) << ", math::gelu_backward " << want;
  }
  for (int64_t shift = 1; shift < 8; ++shift) {
    const int64_t n = x.numel() - shift;
    const Tensor xv = Tensor::view(x.data_as<float>() + shift, {n}, DType::kFloat32);
    const Tensor dv = Tensor::view(dy.data_as<float>() + shift, {n}, DType::kFloat32);
    Tensor yv = Tensor::empty({n}, DType::kFloat32), dxv = Tensor::empty({n}, DType::kFloat32);
    kernels::gelu_forward(xv, yv);
    kernels::gelu_backward(xv, dv, dxv);
    ASSERT_EQ(std::memcmp(yv.data(), y.data_as<float>() + shift, n * sizeof(float)), 0) << "shift " << shift;
    ASSERT_EQ(std::memcmp(dxv.data(), dx.data_as<float>() + shift, n * sizeof(float)), 0) << "shift " << shift;
  }
}

}  // namespace
}  // namespace ampdist
