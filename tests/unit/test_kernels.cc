// CPU kernels: the GEMM tensor-core contract, activations, softmax cross-entropy, the fused unscale + check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"

namespace ampdist {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, unit roundoff of FP32
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

uint16_t bits16(const Tensor& t, int64_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const char*>(t.data()) + 2 * i, 2);
  return b;
}
uint32_t fbits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// A tensor of `dtype` from float values (each rounded to the dtype).
Tensor make(const Shape& shape, DType dtype, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data());
    for (size_t i = 0; i < v.size(); ++i) p[i] = T(v[i]);
  });
  return t;
}

// Fills `t` with deterministic values in [-1, 1) rounded to its dtype; returns the exact stored values.
std::vector<double> fill_random(Tensor& t, uint32_t stream) {
  const RngStream rng{2024, {stream, 0, 0}, RngPurpose::kSynthetic};
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(2.0f * rng.uniform(i) - 1.0f);
  });
  std::vector<double> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.item(i);
  return out;
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.item(i);
  return v;
}

// ---- GEMM: the tensor-core contract -----------------------------------------------------------------------------

// abs_stats (the numerics report's statistics): the maximum is over the finite elements, as on the GPU; a non-finite
// element only sets the flag. Every dtype, with an underflow count at a threshold that splits the values.
TEST(AbsStats, MaximumIsOverTheFiniteElementsAndTheFlagNamesTheRest) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor f = Tensor::zeros({6}, DType::kFloat32);
    float* p = f.data_as<float>();
    p[0] = -3.0f;
    p[1] = 0.5f;
    p[2] = 1e-4f;  // below the threshold
    p[3] = 0.0f;   // zero is not counted below it
    Tensor x = Tensor::empty({6}, t);
    for (float bad : {inf, -inf, nan}) {
      p[4] = bad;
      p[5] = -bad;
      kernels::cast(f, x);
      const kernels::AbsStats s = kernels::abs_stats(x, 1e-3f);
      EXPECT_EQ(s.max_abs, 3.0f) << bad;
      EXPECT_TRUE(s.nonfinite) << bad;
      EXPECT_EQ(s.below, 1) << bad;
    }
    p[4] = p[5] = 2.0f;
    kernels::cast(f, x);
    const kernels::AbsStats s = kernels::abs_stats(x, 1e-3f);
    EXPECT_EQ(s.max_abs, 3.0f);
    EXPECT_FALSE(s.nonfinite);
  }
}

TEST(Gemm, Fp16AccumulatesInFp32) {
  // 1 + 4 * 2^-12 = 1 + 2^-10 exactly, and that is an fp16 value. An fp16 accumulator would round 1 + 2^-12 back to
  // 1.0 at every step (2^-12 is a quarter of fp16's ulp at 1) and return 1.0.
  const float e = std::ldexp(1.0f, -12);
  Tensor a = make({1, 5}, DType::kFloat16, {1.0f, e, e, e, e});
  Tensor b = make({5, 1}, DType::kFloat16, {1, 1, 1, 1, 1});
  Tensor c = Tensor::empty({1, 1}, DType::kFloat16);
  kernels::gemm(a, false, b, false, c);
  EXPECT_EQ(bits16(c, 0), 0x3C01);  // 1 + 2^-10
  EXPECT_EQ(c.item(0), 1.0f + std::ldexp(1.0f, -10));
  // The same inputs with FP32 output: exact.
  Tensor c32 = Tensor::empty({1, 1}, DType::kFloat32);
  kernels::gemm(a, false, b, false, c32);
  EXPECT_EQ(c32.item(0), 1.0f + std::ldexp(1.0f, -10));
}

TEST(Gemm, Bf16AccumulatesInFp32) {
  // bf16's ulp at 1 is 2^-7: 1 + 4 * 2^-9 = 1 + 2^-7 (bits 0x3F81); a bf16 accumulator would stay at 1.0.
  const float e = std::ldexp(1.0f, -9);
  Tensor a = make({1, 5}, DType::kBFloat16, {1.0f, e, e, e, e});
  Tensor b = make({5, 1}, DType::kBFloat16, {1, 1, 1, 1, 1});
  Tensor c = Tensor::empty({1, 1}, DType::kBFloat16);
  kernels::gemm(a, false, b, false, c);
  EXPECT_EQ(bits16(c, 0), 0x3F81);
}

TEST(Gemm, OutputIsRoundedOnceAfterTheBias) {
  // op(A) op(B) = 1 + 2^-11 (exact in FP32); bias 2^-11. Rounded once: 1 + 2^-10 (0x3C01). Rounding the product
  // first would give 1.0 (a tie, to even), and 1.0 + 2^-11 would round to 1.0 again.
  const float e = std::ldexp(1.0f, -12);
  Tensor a = make({1, 3}, DType::kFloat16, {1.0f, e, e});
  Tensor b = make({3, 1}, DType::kFloat16, {1, 1, 1});
  Tensor bias = make({1}, DType::kFloat16, {std::ldexp(1.0f, -11)});
  Tensor c = Tensor::empty({1, 1}, DType::kFloat16);
  kernels::gemm(a, false, b, false, c);
  EXPECT_EQ(bits16(c, 0), 0x3C00);  // without bias: the tie rounds to even
  kernels::gemm(a, false, b, false, c, 1.0f, 0.0f, &bias);
  EXPECT_EQ(bits16(c, 0), 0x3C01);

  // bf16: product 1 + 2^-8 (a tie -> 1.0 alone), bias 2^-8: once gives 1 + 2^-7.
  const float f = std::ldexp(1.0f, -9);
  Tensor a2 = make({1, 3}, DType::kBFloat16, {1.0f, f, f});
  Tensor b2 = make({3, 1}, DType::kBFloat16, {1, 1, 1});
  Tensor bias2 = make({1}, DType::kBFloat16, {std::ldexp(1.0f, -8)});
  Tensor c2 = Tensor::empty({1, 1}, DType::kBFloat16);
  kernels::gemm(a2, false, b2, false, c2);
  EXPECT_EQ(bits16(c2, 0), 0x3F80);
  kernels::gemm(a2, false, b2, false, c2, 1.0f, 0.0f, &bias2);
  EXPECT_EQ(bits16(c2, 0), 0x3F81);
}

struct GemmCase {
  DType dtype;
  bool ta, tb;
  float alpha, beta;
  bool bias;
};

// Against a double reference. The inputs are exact in FP32; products of fp16/bf16 inputs are exact in FP32
// (11+11 and 8+8 significant bits <= 24), FP32 products round once. FP32 accumulation of K terms, then alpha, beta*C
// and the bias: |error| <= (K + 3) * 2^-24 * (|alpha| sum_k |a_ik||b_kj| + |beta c_ij| + |bias_j|), the standard
// gamma_n bound for recursive summation (Higham, Accuracy and Stability, 3.1); blocked or FMA summation only lowers it.
void check_gemm_against_reference(const GemmCase& gc) {
  const int64_t m = 7, k = 33, n = 5;
  Tensor a = Tensor::empty(gc.ta ? Shape{k, m} : Shape{m, k}, gc.dtype);
  Tensor b = Tensor::empty(gc.tb ? Shape{n, k} : Shape{k, n}, gc.dtype);
  Tensor c = Tensor::empty({m, n}, DType::kFloat32);
  Tensor bias = Tensor::empty({n}, DType::kFloat32);
  const auto va = fill_random(a, 1), vb = fill_random(b, 2), vc = fill_random(c, 3), vbias = fill_random(bias, 4);
  auto A = [&](int64_t i, int64_t kk) { return gc.ta ? va[kk * m + i] : va[i * k + kk]; };
  auto B = [&](int64_t kk, int64_t j) { return gc.tb ? vb[j * k + kk] : vb[kk * n + j]; };
  kernels::gemm(a, gc.ta, b, gc.tb, c, gc.alpha, gc.beta, gc.bias ? &bias : nullptr);
  const std::string what = std::string(dtype_name(gc.dtype)) + " ta=" + std::to_string(gc.ta) +
                           " tb=" + std::to_string(gc.tb) + " beta=" + std::to_string(gc.beta);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        ref += A(i, kk) * B(kk, j);
        mag += std::fabs(A(i, kk) * B(kk, j));
      }
      ref = gc.alpha * ref + gc.beta * vc[i * n + j] + (gc.bias ? vbias[j] : 0.0);
      mag = std::fabs(gc.alpha) * mag + std::fabs(gc.beta * vc[i * n + j]) + (gc.bias ? std::fabs(vbias[j]) : 0.0);
      const double tol = (k + 3) * kU * mag;
      EXPECT_NEAR(c.item(i * n + j), ref, tol) << what << " at (" << i << ", " << j << ")";
    }
  }
}

TEST(Gemm, MatchesDoubleReferenceAllTransposesAndDtypes) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_gemm_against_reference({dt, ta, tb, 1.0f, 0.0f, false});
        check_gemm_against_reference({dt, ta, tb, 1.0f, 1.0f, false});
        check_gemm_against_reference({dt, ta, tb, -0.5f, 1.0f, true});
      }
}

TEST(Gemm, SixteenBitOutputIsTheRoundedFp32Result) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (bool with_bias : {false, true}) {
      Tensor a = Tensor::empty({6, 40}, dt), b = Tensor::empty({40, 9}, dt), bias = Tensor::empty({9}, dt);
      fill_random(a, 11);
      fill_random(b, 12);
      fill_random(bias, 13);
      Tensor c32 = Tensor::empty({6, 9}, DType::kFloat32), c16 = Tensor::empty({6, 9}, dt);
      kernels::gemm(a, false, b, false, c32, 1.0f, 0.0f, with_bias ? &bias : nullptr);
      kernels::gemm(a, false, b, false, c16, 1.0f, 0.0f, with_bias ? &bias : nullptr);
      Tensor expect = Tensor::empty({6, 9}, dt);
      kernels::cast(c32, expect);
      for (int64_t i = 0; i < 54; ++i) EXPECT_EQ(bits16(c16, i), bits16(expect, i)) << dtype_name(dt) << " " << i;
    }
}

TEST(Gemm, KZeroGivesBetaCPlusBias) {
  Tensor a = Tensor::empty({3, 0}, DType::kFloat16);
  Tensor b = Tensor::empty({0, 4}, DType::kFloat16);
  Tensor bias = make({4}, DType::kFloat32, {1.0f, -2.0f, 0.5f, 0.0f});
  std::vector<float> c0(12);
  for (int i = 0; i < 12; ++i) c0[i] = static_cast<float>(i) - 5.0f;
  Tensor c = make({3, 4}, DType::kFloat32, c0);
  kernels::gemm(a, false, b, false, c, 1.0f, 0.5f, &bias);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c.item(i), 0.5f * c0[i] + bias.item(i % 4)) << i;
  c = make({3, 4}, DType::kFloat32, c0);
  kernels::gemm(a, false, b, false, c, 1.0f, 0.5f);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c.item(i), 0.5f * c0[i]) << i;
  // beta = 0 means C is not read (BLAS semantics): NaN in C does not survive.
  std::vector<float> nan12(12, kNaN);
  c = make({3, 4}, DType::kFloat32, nan12);
  kernels::gemm(a, false, b, false, c, 1.0f, 0.0f, &bias);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c.item(i), bias.item(i % 4)) << i;
  // Transposed empty inner dimension, 16-bit output.
  Tensor at = Tensor::empty({0, 3}, DType::kFloat16);
  Tensor c16 = Tensor::empty({3, 4}, DType::kFloat16);
  kernels::gemm(at, true, b, false, c16, 1.0f, 0.0f, &bias);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c16.item(i), bias.item(i % 4)) << i;
}

TEST(Gemm, MismatchesThrow) {
  Tensor a = Tensor::zeros({2, 3}, DType::kFloat32);
  Tensor b_bad = Tensor::zeros({4, 2}, DType::kFloat32);
  Tensor b = Tensor::zeros({3, 2}, DType::kFloat32);
  Tensor c = Tensor::zeros({2, 2}, DType::kFloat32);
  Tensor c_bad = Tensor::zeros({2, 3}, DType::kFloat32);
  EXPECT_THROW(kernels::gemm(a, false, b_bad, false, c), Error);       // K 3 vs 4
  EXPECT_THROW(kernels::gemm(a, false, b, false, c_bad), Error);       // C [2, 3] vs [2, 2]
  EXPECT_THROW(kernels::gemm(a, true, b, false, c), Error);            // op(A) [3, 2] @ [3, 2]
  EXPECT_NO_THROW(kernels::gemm(a, false, b, false, c));
  EXPECT_THROW(kernels::gemm(a, false, b_bad, true, c), Error);       // op(B) = [2, 4]: K 3 vs 2
  Tensor bias_bad = Tensor::zeros({3}, DType::kFloat32);
  EXPECT_THROW(kernels::gemm(a, false, b, false, c, 1.0f, 0.0f, &bias_bad), Error);
  Tensor b16 = Tensor::zeros({3, 2}, DType::kFloat16);
  EXPECT_THROW(kernels::gemm(a, false, b16, false, c), Error);  // A and B dtypes differ
  Tensor a16 = Tensor::zeros({2, 3}, DType::kFloat16);
  Tensor c16 = Tensor::zeros({2, 2}, DType::kFloat16);
  EXPECT_THROW(kernels::gemm(a16, false, b16, false, c16, 1.0f, 1.0f), Error);  // beta != 0 with 16-bit C
  Tensor cbf = Tensor::zeros({2, 2}, DType::kBFloat16);
  EXPECT_THROW(kernels::gemm(a16, false, b16, false, cbf), Error);  // fp16 inputs, bf16 output
  Tensor a3 = Tensor::zeros({2, 3, 1}, DType::kFloat32);
  EXPECT_THROW(kernels::gemm(a3, false, b, false, c), Error);  // not 2-d
}

// ---- activations --------------------------------------------------------------------------------------------------

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Activations, ReluForwardAndBackward) {
  Tensor x = make({6}, DType::kFloat32, {-2.0f, -0.5f, 0.0f, 0.5f, 3.0f, -kInf});
  Tensor y = Tensor::empty({6}, DType::kFloat32);
  kernels::relu_forward(x, y);
  EXPECT_EQ(values(y), (std::vector<float>{0, 0, 0, 0.5f, 3.0f, 0}));
  // fp16 keeps its dtype and is exact.
  Tensor x16 = make({3}, DType::kFloat16, {-1.0f, 2.5f, 65504.0f});
  Tensor y16 = Tensor::empty({3}, DType::kFloat16);
  kernels::relu_forward(x16, y16);
  EXPECT_EQ(values(y16), (std::vector<float>{0, 2.5f, 65504.0f}));
  Tensor wrong = Tensor::empty({3}, DType::kFloat32);
  EXPECT_THROW(kernels::relu_forward(x16, wrong), Error);  // dtypes differ

  Tensor dy = make({6}, DType::kFloat32, {1, 2, 3, 4, 5, 6});
  Tensor dx = Tensor::empty({6}, DType::kFloat32);
  kernels::relu_backward(y, dy, dx);
  EXPECT_EQ(values(dx), (std::vector<float>{0, 0, 0, 4, 5, 0}));
}

TEST(Activations, ReluPropagatesNaN) {
  // torch.relu(nan) is nan: a NaN activation must reach the loss so the non-finite step is visible (bad data on one
  // rank whose only symptom is a NaN loss), not be silently replaced by 0.
  Tensor x = make({2}, DType::kFloat32, {kNaN, 1.0f});
  Tensor y = Tensor::empty({2}, DType::kFloat32);
  kernels::relu_forward(x, y);
  EXPECT_TRUE(std::isnan(y.item(0)));
  EXPECT_EQ(y.item(1), 1.0f);
  Tensor x16 = make({1}, DType::kBFloat16, {kNaN});
  Tensor y16 = Tensor::empty({1}, DType::kBFloat16);
  kernels::relu_forward(x16, y16);
  EXPECT_TRUE(std::isnan(y16.item(0)));
}

TEST(Activations, ReluOfANaNKeepsItsPayloadOnTheCpu) {
  // The one documented bitwise difference between the backends' element-wise results: on the CPU, ReLU of a NaN
  // returns the input's bits (a float quiet NaN converts to 0x7e00 in fp16 and 0x7fc0 in bf16), while CUDA's
  // conversions give the canonical NaN 0x7fff. Backend comparisons (tests/gpu: same_bits_any_nan) take any NaN as
  // equal; this pins the CPU side of that statement.
  for (auto [dtype, bits] :
       {std::pair{DType::kFloat16, uint16_t{0x7e00}}, std::pair{DType::kBFloat16, uint16_t{0x7fc0}}}) {
    Tensor x = make({1}, dtype, {std::numeric_limits<float>::quiet_NaN()});
    Tensor y = Tensor::empty({1}, dtype);
    kernels::relu_forward(x, y);
    uint16_t in = 0, out = 0;
    std::memcpy(&in, x.data(), 2);
    std::memcpy(&out, y.data(), 2);
    EXPECT_EQ(in, bits) << dtype_name(dtype);
    EXPECT_EQ(out, bits) << dtype_name(dtype);
  }
}

TEST(Activations, GeluForwardValues) {
  // Published values of the tanh form (torch.nn.GELU(approximate="tanh")): gelu(1) = 0.8411920, gelu(-1) = -0.1588080.
  Tensor x = make({7}, DType::kFloat32, {1.0f, -1.0f, 0.0f, 2.0f, -3.0f, 0.25f, 6.0f});
  Tensor y = Tensor::empty({7}, DType::kFloat32);
  kernels::gelu_forward(x, y);
  EXPECT_NEAR(y.item(0), 0.8411920, 1e-7);   // 7 printed digits: half a unit in the last place + 1 FP32 ulp
  EXPECT_NEAR(y.item(1), -0.1588080, 1e-7);
  EXPECT_EQ(y.item(2), 0.0f);
  // Against the same formula in double: tanhf is within 2 ulp and the FP32 evaluation adds a few roundings,
  // so 8 * 2^-24 relative to the largest term |x| bounds the error.
  for (int i = 0; i < 7; ++i) {
    const double xi = x.item(i);
    EXPECT_NEAR(y.item(i), gelu_ref(xi), 8 * kU * std::max(1.0, std::fabs(xi))) << "x = " << xi;
  }
  // bf16 keeps its dtype: the FP32 result rounded once.
  Tensor xb = make({1}, DType::kBFloat16, {1.0f});
  Tensor yb = Tensor::empty({1}, DType::kBFloat16);
  kernels::gelu_forward(xb, yb);
  EXPECT_EQ(yb.item(0), static_cast<float>(bfloat16(y.item(0))));
}

TEST(Activations, GeluBackwardMatchesFiniteDifferences) {
  // Central differences of the double formula with h = 1e-5: truncation h^2/6 |gelu'''| < 1e-10, cancellation
  // ~1e-16/1e-5 = 1e-11. The FP32 kernel (tanhf within 2 ulp plus ~8 roundings of O(1) terms, times |x| up to 4)
  // is within 1e-6 absolute of that, with dy = 0.75 (exact).
  std::vector<float> xs;
  for (int i = -32; i <= 32; ++i) xs.push_back(i * 0.125f + 0.0625f);
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor x = make({n}, DType::kFloat32, xs);
  Tensor dy = make({n}, DType::kFloat32, std::vector<float>(n, 0.75f));
  Tensor dx = Tensor::empty({n}, DType::kFloat32);
  kernels::gelu_backward(x, dy, dx);
  const double h = 1e-5;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = xs[i];
    const double fd = (gelu_ref(xi + h) - gelu_ref(xi - h)) / (2 * h);
    EXPECT_NEAR(dx.item(i), 0.75 * fd, 1e-6) << "x = " << xi;
  }
}

// ---- softmax cross-entropy -----------------------------------------------------------------------------------

TEST(SoftmaxCrossEntropy, ZeroLogitsGiveLnClasses) {
  const int64_t b = 6, cls = 10;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Tensor logits = Tensor::zeros({b, cls}, dt);
    const std::vector<int32_t> t = {0, 3, 9, 5, 5, 1};
    Tensor lse;
    const double sum = kernels::softmax_cross_entropy_forward(logits, t, lse);
    EXPECT_NEAR(sum, b * std::log(10.0), 1e-5 * b * std::log(10.0)) << dtype_name(dt);
    ASSERT_EQ(lse.numel(), b);
    EXPECT_EQ(lse.dtype(), DType::kFloat32);
    for (int64_t i = 0; i < b; ++i) EXPECT_NEAR(lse.item(i), std::log(10.0), 2 * kU * std::log(10.0));
    // Gradient: softmax = 1/10 everywhere, minus 1 at the target.
    Tensor d = Tensor::empty({b, cls}, DType::kFloat32);
    kernels::softmax_cross_entropy_backward(logits, t, lse, 1.0f, d);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < cls; ++j)
        EXPECT_NEAR(d.item(i * cls + j), (j == t[i] ? 0.1 - 1.0 : 0.1), 4 * kU) << i << "," << j;
  }
}

// Logits on a grid of 2^-8 in [-2, 2), so that z +- h is exact in FP32 for h = 2^-5.
Tensor grid_logits(int64_t b, int64_t c) {
  const RngStream rng{7, {0, 0, 0}, RngPurpose::kSynthetic};
  std::vector<float> v(b * c);
  for (int64_t i = 0; i < b * c; ++i) v[i] = std::floor((4.0f * rng.uniform(i) - 2.0f) * 256.0f) / 256.0f;
  return make({b, c}, DType::kFloat32, v);
}

TEST(SoftmaxCrossEntropy, BackwardMatchesAnalyticAndFiniteDifferences) {
  const int64_t b = 3, c = 7;
  Tensor z = grid_logits(b, c);
  const std::vector<int32_t> t = {2, 0, 6};
  Tensor lse;
  kernels::softmax_cross_entropy_forward(z, t, lse);
  Tensor d = Tensor::empty({b, c}, DType::kFloat32);
  kernels::softmax_cross_entropy_backward(z, t, lse, 1.0f, d);

  // Analytic, in double: softmax(z_i) - onehot. FP32 exp/log of O(1) values: within 1e-6.
  for (int64_t i = 0; i < b; ++i) {
    double mx = -1e30, s = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, static_cast<double>(z.item(i * c + j)));
    for (int64_t j = 0; j < c; ++j) s += std::exp(z.item(i * c + j) - mx);
    for (int64_t j = 0; j < c; ++j) {
      const double p = std::exp(z.item(i * c + j) - mx) / s;
      EXPECT_NEAR(d.item(i * c + j), p - (j == t[i] ? 1.0 : 0.0), 1e-6) << i << "," << j;
    }
  }

  // Central differences of the kernel's own forward, h = 2^-5. Truncation: h^2/6 * max|d^3 lse/dz^3|
  // (max p(1-p)(1-2p) = 0.0962) = 1.6e-5. Rounding: each forward rounds one FP32 row loss of magnitude < 4
  // (a few ulp, < 1e-6), divided by 2h = 2^-4: < 1.6e-5. Tolerance 5e-5.
  const float h = std::ldexp(1.0f, -5);
  float* pz = z.data_as<float>();
  Tensor scratch;
  for (int64_t k = 0; k < b * c; ++k) {
    const float z0 = pz[k];
    pz[k] = z0 + h;
    const double fp = kernels::softmax_cross_entropy_forward(z, t, scratch);
    pz[k] = z0 - h;
    const double fm = kernels::softmax_cross_entropy_forward(z, t, scratch);
    pz[k] = z0;
    EXPECT_NEAR(d.item(k), (fp - fm) / (2.0 * h), 5e-5) << "logit " << k;
  }
}

TEST(SoftmaxCrossEntropy, GradScaleScalesTheGradient) {
  const int64_t b = 4, c = 5;
  Tensor z = grid_logits(b, c);
  const std::vector<int32_t> t = {4, 0, 1, 1};
  Tensor lse;
  kernels::softmax_cross_entropy_forward(z, t, lse);
  Tensor d1 = Tensor::empty({b, c}, DType::kFloat32), d2 = Tensor::empty({b, c}, DType::kFloat32);
  kernels::softmax_cross_entropy_backward(z, t, lse, 1.0f, d1);
  kernels::softmax_cross_entropy_backward(z, t, lse, 1024.0f, d2);
  // A power-of-two scale is exact in FP32.
  for (int64_t i = 0; i < b * c; ++i) EXPECT_EQ(d2.item(i), 1024.0f * d1.item(i)) << i;
  Tensor d3 = Tensor::empty({b, c}, DType::kFloat32);
  kernels::softmax_cross_entropy_backward(z, t, lse, 0.3f, d3);
  for (int64_t i = 0; i < b * c; ++i) EXPECT_NEAR(d3.item(i), 0.3 * d1.item(i), 2 * kU) << i;
  // fp16 gradient output: the FP32 value rounded once.
  Tensor d16 = Tensor::empty({b, c}, DType::kFloat16);
  kernels::softmax_cross_entropy_backward(z, t, lse, 1024.0f, d16);
  for (int64_t i = 0; i < b * c; ++i) EXPECT_EQ(d16.item(i), static_cast<float>(half(d2.item(i)))) << i;
}

TEST(SoftmaxCrossEntropy, TargetOutOfRangeIsBadInput) {
  Tensor z = Tensor::zeros({3, 10}, DType::kFloat32);
  Tensor lse;
  for (int32_t bad : {10, -1, 1000}) {
    const std::vector<int32_t> t = {0, bad, 1};
    try {
      kernels::softmax_cross_entropy_forward(z, t, lse);
      FAIL() << "target " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
    }
  }
  const std::vector<int32_t> too_few = {0, 1};
  EXPECT_THROW(kernels::softmax_cross_entropy_forward(z, too_few, lse), Error);
}

// Loss reductions in FP32: vocabulary 14749, 20500 targets, fp16 logits, all 0. Every per-sample loss is ln(14749); their sum
// (~196,778) is beyond the fp16 range, so the reduction must be FP32 or wider. ~600 MB of fp16 logits.
TEST(SoftmaxCrossEntropy, LargeSumBeyondFp16Range) {
  const int64_t b = 20500, c = 14749;
  Tensor z = Tensor::zeros({b, c}, DType::kFloat16);
  std::vector<int32_t> t(b);
  for (int64_t i = 0; i < b; ++i) t[i] = static_cast<int32_t>(i % c);
  Tensor lse;
  const double sum = kernels::softmax_cross_entropy_forward(z, t, lse);
  EXPECT_TRUE(std::isfinite(sum));
  EXPECT_GT(sum, 65504.0);
  EXPECT_NEAR(sum / b, 9.598863, 1e-3);
  // Tighter, from kernels.h's promise that rows are summed in double: each row is the FP32 log of an exact integer
  // sum (14749 < 2^24), within 1 ulp of 9.6 (~1e-6). A plain FP32 running sum over 20500 rows would drift by up to
  // 20500 half-ulps of ~2e5 (~8e-3 per sample) and fail this.
  EXPECT_NEAR(sum / b, std::log(14749.0), 1e-5);
}

TEST(Kernels, CountCorrect) {
  Tensor z = make({5, 3}, DType::kFloat32, {1, 5, 2,  3, 0, 0,  0, 0, 9,  2, 2, 1,  -1, -3, -2});
  // argmax per row: 1, 0, 2, 0 (first of a tie), 0.
  EXPECT_EQ(kernels::count_correct(z, std::vector<int32_t>{1, 0, 1, 0, 0}), 4);
  EXPECT_EQ(kernels::count_correct(z, std::vector<int32_t>{0, 1, 0, 1, 1}), 0);
  EXPECT_EQ(kernels::count_correct(z, std::vector<int32_t>{1, 0, 2, 0, 0}), 5);
  Tensor z16 = make({2, 2}, DType::kFloat16, {0.5f, 0.25f, -1.0f, 1.0f});
  EXPECT_EQ(kernels::count_correct(z16, std::vector<int32_t>{0, 1}), 2);
  EXPECT_THROW(kernels::count_correct(z16, std::vector<int32_t>{0, 2}), Error);
}

TEST(Kernels, SumRows) {
  Tensor x = make({3, 2}, DType::kFloat16, {1, 2, 3, 4, 5, 6.5f});
  Tensor out = make({2}, DType::kFloat32, {100, 200});
  kernels::sum_rows(x, out, 0.0f);
  EXPECT_EQ(values(out), (std::vector<float>{9, 12.5f}));
  kernels::sum_rows(x, out, 1.0f);
  EXPECT_EQ(values(out), (std::vector<float>{18, 25}));
  Tensor bad = Tensor::zeros({3}, DType::kFloat32);
  EXPECT_THROW(kernels::sum_rows(x, bad, 0.0f), Error);
}

// ---- unscale + non-finite check -----------------------------------------------------------------------------------

TEST(UnscaleAndCheck, FiniteGradients) {
  Tensor g = make({4}, DType::kFloat32, {1024, 2048, -3072, 4096});
  const auto r = kernels::unscale_and_check(g, 1.0f / 1024.0f);
  EXPECT_FALSE(r.found_inf);
  EXPECT_EQ(r.sum_sq, 30.0);  // 1 + 4 + 9 + 16, exact
  EXPECT_EQ(values(g), (std::vector<float>{1, 2, -3, 4}));

  // Each element multiplied by inv_scale exactly once (one FP32 rounding), for a non-power-of-two factor.
  const std::vector<float> g0 = {0.1f, -7.25f, 3e-30f, 123456.7f, 0.0f};
  Tensor h = make({5}, DType::kFloat32, g0);
  const auto r2 = kernels::unscale_and_check(h, 0.3f);
  EXPECT_FALSE(r2.found_inf);
  double ss = 0;
  for (int i = 0; i < 5; ++i) {
    const float expect = g0[i] * 0.3f;
    EXPECT_EQ(fbits(h.item(i)), fbits(expect)) << i;
    ss += static_cast<double>(expect) * expect;
  }
  EXPECT_DOUBLE_EQ(r2.sum_sq, ss);
}

TEST(UnscaleAndCheck, NonFiniteAnywhereIsFound) {
  const int64_t n = 1001;
  for (float bad : {kInf, -kInf, kNaN}) {
    for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> v(n, 2.0f);
      v[pos] = bad;
      Tensor g = make({n}, DType::kFloat32, v);
      const auto r = kernels::unscale_and_check(g, 0.5f);
      EXPECT_TRUE(r.found_inf) << bad << " at " << pos;
      // The finite elements are still unscaled, and only they enter the sum of squares.
      EXPECT_EQ(g.item(pos == 0 ? 1 : 0), 1.0f);
      EXPECT_EQ(r.sum_sq, static_cast<double>(n - 1));
    }
  }
  // Overflow caused by the unscale itself (inv_scale > 1) is found too.
  Tensor g = make({2}, DType::kFloat32, {3e38f, 1.0f});
  EXPECT_TRUE(kernels::unscale_and_check(g, 2.0f).found_inf);
  Tensor h16 = Tensor::zeros({2}, DType::kFloat16);
  EXPECT_THROW(kernels::unscale_and_check(h16, 1.0f), Error);  // gradients are FP32
}

// A buffer long enough for the vector path (blocks of 16) and with a tail: every element multiplied once, and the
// sum of squares exactly the documented order (lane i % 16 in double, lanes added pairwise), on every build.
TEST(UnscaleAndCheck, LongBufferUsesSixteenLanesInAFixedOrder) {
  const int64_t n = 16 * 62 + 9;
  std::vector<float> g0(n);
  for (int64_t i = 0; i < n; ++i) g0[i] = std::ldexp(static_cast<float>((i * 37) % 101) - 50.0f, -(i % 23)) * 1.1f;
  auto lanes = [&](const std::vector<float>& v, float inv, int64_t skip) {
    double acc[16] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float u = v[i] * inv;
      if (i != skip) acc[i % 16] += static_cast<double>(u) * u;
    }
    for (int step = 1; step < 16; step *= 2)
      for (int l = 0; l + step < 16; l += 2 * step) acc[l] += acc[l + step];
    return acc[0];
  };
  Tensor g = make({n}, DType::kFloat32, g0);
  const auto r = kernels::unscale_and_check(g, 0.3f);
  EXPECT_FALSE(r.found_inf);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(fbits(g.item(i)), fbits(g0[i] * 0.3f)) << i;
  EXPECT_EQ(r.sum_sq, lanes(g0, 0.3f, -1));
  // Against the plain serial sum: n additions of positive terms in double, relative error below n * 2^-53 ~ 1e-13.
  double serial = 0.0;
  for (int64_t i = 0; i < n; ++i) serial += static_cast<double>(g0[i] * 0.3f) * (g0[i] * 0.3f);
  EXPECT_NEAR(r.sum_sq, serial, 1e-13 * serial);

  // One inf inside a vector block and one NaN in the tail: found, and left out of the sum.
  for (int64_t pos : {int64_t{17}, n - 2}) {
    std::vector<float> v = g0;
    v[pos] = pos == 17 ? kInf : kNaN;
    Tensor h = make({n}, DType::kFloat32, v);
    const auto rh = kernels::unscale_and_check(h, 0.3f);
    EXPECT_TRUE(rh.found_inf) << pos;
    EXPECT_EQ(rh.sum_sq, lanes(v, 0.3f, pos)) << pos;
  }
}

TEST(Kernels, ScaleInplace) {
  Tensor g = make({3}, DType::kFloat32, {3, 4, -1});
  kernels::scale_inplace(g, 0.5f);
  EXPECT_EQ(values(g), (std::vector<float>{1.5f, 2, -0.5f}));
}

}  // namespace
}  // namespace ampdist
