// The convolutional layers on the CPU backend: Conv2d (stride, padding, dilation, groups, bias), BatchNorm2d,
// MaxPool2d, AvgPool2d, global average pooling, flatten and the residual BasicBlock, each backward against central
// finite differences in FP32; the forward convolution against a double reference; BatchNorm's running statistics
// (PyTorch's update rule, staged until committed); 16-bit convolutions; ResNet-18's torchvision names.
//
// The finite-difference bound and where it comes from: testing::check_grad (tests/test_tensors.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/core/rng.h"
#include "runtime/kernels/cnn.h"
#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/cnn.h"
#include "runtime/nn/conv.h"
#include "tests/test_tensors.h"

namespace ampdist {
namespace {

using testing::check_grad;
using testing::copy_of;
using testing::dot;
const testing::TensorRng random_tensor{9090};
// Parameters in FP32 master weights set to U(-0.5, 0.5) (BatchNorm gains 1 + U(-0.2, 0.2)), and the buffers bound.
struct Bound {
  std::vector<Parameter*> params;
  std::vector<Buffer*> buffers;
  std::unique_ptr<MasterWeights> mw;
  std::unique_ptr<ModelBuffers> mb;
};
Bound bind(Module& m, DType working = DType::kFloat32) {
  Bound b;
  m.collect_parameters(b.params);
  m.collect_buffers(b.buffers);
  b.mw = bind_parameters(b.params, working, Device::kCPU, 0);
  random_tensor.fill(b.params, -0.5f, 0.5f);
  b.mw->cast_to_working();
  if (!b.buffers.empty()) b.mb = std::make_unique<ModelBuffers>(b.buffers);
  return b;
}
GradContext ctx_for_test() {
  GradContext ctx;
  ctx.accumulate = false;
  ctx.need_input_grad = true;
  return ctx;
}

// Every parameter's gradient and the input's against finite differences of L = sum y * w.
void check_module(Module& m, Bound& b, Tensor& x, uint32_t seed, int64_t count = 12, float h = 1e-2f) {
  const Tensor& y0 = m.forward(x);
  Tensor w = random_tensor(y0.shape(), seed);
  GradContext ctx = ctx_for_test();
  const Tensor& dx = m.backward(w, ctx);
  const std::vector<float> dxa = copy_of(dx);
  std::vector<std::vector<float>> grads;
  for (Parameter* p : b.params) grads.push_back(copy_of(p->grad));
  auto loss = [&] {
    b.mw->cast_to_working();
    return dot(m.forward(x), w);
  };
  check_grad("dx", x.data_as<float>(), dxa.data(), x.numel(), count, loss, h);
  for (size_t i = 0; i < b.params.size(); ++i)
    check_grad(b.params[i]->name, b.params[i]->master.data_as<float>(), grads[i].data(), b.params[i]->numel(), count,
               loss, h);
}

// ---- Conv2d ------------------------------------------------------------------------------------------------------

TEST(Conv2d, ForwardMatchesDoubleReference) {
  const Autocast ac(DType::kFloat32);
  Conv2d conv("conv", {4, 6, 3, 2, 1, 2, 2, true}, ac);  // stride 2, padding 1, dilation 2, groups 2
  Bound b = bind(conv);
  Tensor x = random_tensor({2, 4, 9, 8}, 1);
  const Tensor& y = conv.forward(x);
  // out = (in + 2 pad - dil (k - 1) - 1) / stride + 1: (9 + 2 - 4 - 1) / 2 + 1 = 4, (8 + 2 - 4 - 1) / 2 + 1 = 3.
  ASSERT_EQ(y.shape(), (Shape{2, 6, 4, 3}));
  const float* W = b.params[0]->master.data_as<float>();
  const float* B = b.params[1]->master.data_as<float>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t k = 0; k < 6; ++k)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 3; ++j) {
          const int64_t g = k / 3;
          double ref = B[k], mag = std::fabs(B[k]);
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t a = 0; a < 3; ++a)
              for (int64_t e = 0; e < 3; ++e) {
                const int64_t h = i * 2 - 1 + a * 2, w = j * 2 - 1 + e * 2;
                if (h < 0 || h >= 9 || w < 0 || w >= 8) continue;
                const double t = x.item(((n * 4 + g * 2 + c) * 9 + h) * 8 + w) * W[((k * 2 + c) * 3 + a) * 3 + e];
                ref += t;
                mag += std::fabs(t);
              }
          // FP32 sum of 18 products and a bias: |error| <= (18 + 2) 2^-24 sum |terms| (Higham's gamma_n).
          EXPECT_NEAR(y.item(((n * 6 + k) * 4 + i) * 3 + j), ref, 20 * mag / 16777216.0) << n << k << i << j;
        }
}

TEST(Conv2d, GradientsMatchFiniteDifferencesStridePaddingBias) {
  const Autocast ac(DType::kFloat32);
  Conv2d conv("conv", {3, 4, 3, 2, 1, 1, 1, true}, ac);
  Bound b = bind(conv);
  Tensor x = random_tensor({2, 3, 7, 6}, 2);
  check_module(conv, b, x, 3);
}

TEST(Conv2d, GradientsMatchFiniteDifferencesDilationGroupsNoBias) {
  const Autocast ac(DType::kFloat32);
  Conv2d conv("conv", {4, 6, 3, 1, 2, 2, 2, false}, ac);
  Bound b = bind(conv);
  ASSERT_EQ(b.params.size(), 1u);
  Tensor x = random_tensor({2, 4, 6, 6}, 4);
  check_module(conv, b, x, 5);
}

TEST(Conv2d, AccumulatesWeightGradientOverMicroBatches) {
  const Autocast ac(DType::kFloat32);
  Conv2d conv("conv", {2, 3, 3, 1, 1, 1, 1, true}, ac);
  Bound b = bind(conv);
  Tensor x1 = random_tensor({2, 2, 5, 5}, 6), x2 = random_tensor({3, 2, 5, 5}, 7);
  Tensor w1 = random_tensor({2, 3, 5, 5}, 8), w2 = random_tensor({3, 3, 5, 5}, 9);
  GradContext ctx = ctx_for_test();
  conv.forward(x1);
  conv.backward(w1, ctx);
  const std::vector<float> g1 = copy_of(b.params[0]->grad), gb1 = copy_of(b.params[1]->grad);
  conv.forward(x2);
  conv.backward(w2, ctx);
  const std::vector<float> g2 = copy_of(b.params[0]->grad), gb2 = copy_of(b.params[1]->grad);
  conv.forward(x1);
  conv.backward(w1, ctx);
  ctx.accumulate = true;
  conv.forward(x2);
  conv.backward(w2, ctx);
  // The second micro-batch's gradient is added in FP32: exactly g1 + g2 rounded once per element.
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(b.params[0]->grad.item(static_cast<int64_t>(i)), g1[i] + g2[i]);
  for (size_t i = 0; i < gb1.size(); ++i) EXPECT_EQ(b.params[1]->grad.item(static_cast<int64_t>(i)), gb1[i] + gb2[i]);
}

TEST(Conv2d, Fp16AndBf16MultiplyRoundedInputsAndRoundTheFp32ResultOnce) {
  const kernels::ConvShape shape{2, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1};
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    const Autocast ac(d);
    Conv2d conv("conv", {3, 4, 3, 1, 1, 1, 1, true}, ac);
    Bound b = bind(conv, d);
    Tensor x = random_tensor({2, 3, 5, 5}, 10);
    const Tensor& y = conv.forward(x);
    ASSERT_EQ(y.dtype(), d);
    // The inputs and working weights rounded to d, held exactly in FP32.
    Tensor xl = Tensor::empty(x.shape(), d), x32 = Tensor::empty(x.shape(), DType::kFloat32);
    kernels::cast(x, xl);
    kernels::cast(xl, x32);
    Tensor w32 = Tensor::empty(b.params[0]->shape, DType::kFloat32), b32 = Tensor::empty({4}, DType::kFloat32);
    kernels::cast(b.params[0]->working, w32);
    kernels::cast(b.params[1]->working, b32);
    if (d == DType::kBFloat16 && kernels::cpu::onednn::native_bf16()) {
      // oneDNN's bf16 kernel: exact products, FP32 accumulation in its own order, one rounding to bf16. Against the
      // exact (double) result of the rounded inputs: the FP32 sum of 27 products and a bias is off by at most
      // acc = (27 + 2) 2^-24 sum |terms| (Higham's gamma_n), and its one rounding adds at most half a bf16 ulp
      // (8 significant bits) of the accumulator. An intermediate rounding to bf16 would add errors near
      // 2^-9 sum |terms|, far above acc.
      const float* X = x32.data_as<float>();
      const float* W = w32.data_as<float>();
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t k = 0; k < 4; ++k)
          for (int64_t i = 0; i < 5; ++i)
            for (int64_t j = 0; j < 5; ++j) {
              double ref = b32.item(k), mag = std::fabs(ref);
              for (int64_t c = 0; c < 3; ++c)
                for (int64_t a = 0; a < 3; ++a)
                  for (int64_t e = 0; e < 3; ++e) {
                    const int64_t h = i - 1 + a, w = j - 1 + e;
                    if (h < 0 || h >= 5 || w < 0 || w >= 5) continue;
                    const double t = static_cast<double>(X[((n * 3 + c) * 5 + h) * 5 + w]) * W[((k * 3 + c) * 3 + a) * 3 + e];
                    ref += t;
                    mag += std::fabs(t);
                  }
              const double got = y.item(((n * 4 + k) * 5 + i) * 5 + j);
              const double acc = 29 * mag / 16777216.0;
              const double half_ulp = std::ldexp(1.0, std::ilogb(std::fabs(ref) + acc) - 8);
              EXPECT_NEAR(got, ref, half_ulp + acc) << n << k << i << j;
            }
      continue;
    }
    // Elsewhere (fp16 always): an FP32 convolution of the widened values and one rounding to d, bitwise.
    Tensor y32 = Tensor::empty({2, 4, 5, 5}, DType::kFloat32), yl = Tensor::empty({2, 4, 5, 5}, d);
    kernels::conv2d_forward(shape, x32, w32, &b32, y32);
    kernels::cast(y32, yl);
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.item(i), yl.item(i)) << dtype_name(d) << " " << i;
  }
}

// A bf16 convolution runs on oneDNN's bf16 kernels where the CPU has bf16 hardware, forward and both backwards
// (not on FP32 after a conversion, nor on oneDNN's reference loops), in the blocked layouts those kernels need.
TEST(Conv2d, Bf16TakesOneDnnNativeKernelsWhereTheCpuHasThem) {
  if (!kernels::cpu::onednn::native_bf16())
    GTEST_SKIP() << "this CPU has neither AVX512-BF16 nor AMX (oneDNN has no native bf16 matmul for it): bf16 "
                    "convolutions run as FP32 on the exactly widened values";
  // A ResNet-18 layer1 convolution: 64 -> 64 channels, 3x3, 56x56.
  const kernels::ConvShape s{2, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1};
  const std::string impl = kernels::conv2d_implementation(s, DType::kBFloat16);
  EXPECT_NE(impl.find("bf16"), std::string::npos) << impl;
  EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
  // The three passes agree with an FP32 convolution of the same (bf16) values to FP32-accumulation accuracy.
  Tensor x = random_tensor({2, 64, 56, 56}, 20), w = random_tensor({64, 64, 3, 3}, 21, -0.1f, 0.1f);
  Tensor dy = random_tensor({2, 64, 56, 56}, 22);
  Tensor xl = Tensor::empty(x.shape(), DType::kBFloat16), wl = Tensor::empty(w.shape(), DType::kBFloat16),
         dyl = Tensor::empty(dy.shape(), DType::kBFloat16);
  kernels::cast(x, xl);
  kernels::cast(w, wl);
  kernels::cast(dy, dyl);
  kernels::cast(xl, x);
  kernels::cast(wl, w);
  kernels::cast(dyl, dy);
  Tensor y16 = Tensor::empty(dy.shape(), DType::kFloat32), y32 = Tensor::empty(dy.shape(), DType::kFloat32);
  Tensor dx16 = Tensor::empty(x.shape(), DType::kFloat32), dx32 = Tensor::empty(x.shape(), DType::kFloat32);
  Tensor dw16 = Tensor::empty(w.shape(), DType::kFloat32), dw32 = Tensor::empty(w.shape(), DType::kFloat32);
  kernels::conv2d_forward(s, xl, wl, nullptr, y16);
  kernels::conv2d_forward(s, x, w, nullptr, y32);
  kernels::conv2d_backward_data(s, dyl, wl, dx16);
  kernels::conv2d_backward_data(s, dy, w, dx32);
  kernels::conv2d_backward_weights(s, xl, dyl, dw16, nullptr, false);
  kernels::conv2d_backward_weights(s, x, dy, dw32, nullptr, false);
  // Two FP32 sums of the same exact products in different orders differ by at most 2 gamma_K sum |terms|, with
  // K = 576 (y, dx) or 2 * 56 * 56 = 6272 (dw) and sum |terms| <= K * max|x| * max|w| (|x|, |dy| <= 1, |w| <= 0.1).
  auto max_diff = [](const Tensor& a, const Tensor& b) {
    double m = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(a.item(i)) - b.item(i)));
    return m;
  };
  EXPECT_LE(max_diff(y16, y32), 2.0 * 578 * 576 * 0.1 / 16777216.0);
  EXPECT_LE(max_diff(dx16, dx32), 2.0 * 578 * 576 * 0.1 / 16777216.0);
  EXPECT_LE(max_diff(dw16, dw32), 2.0 * 6274 * 6272 * 1.0 / 16777216.0);
}

// ---- BatchNorm2d -------------------------------------------------------------------------------------------------

TEST(BatchNorm2d, TrainingGradientsMatchFiniteDifferences) {
  BatchNorm2d bn("bn", 3);
  Bound b = bind(bn);
  Tensor x = random_tensor({4, 3, 3, 2}, 11, -1.0f, 2.0f);
  check_module(bn, b, x, 12);
}

TEST(BatchNorm2d, EvaluationGradientsMatchFiniteDifferences) {
  BatchNorm2d bn("bn", 3);
  Bound b = bind(bn);
  float* rm = bn.running_mean().value.data_as<float>();
  float* rv = bn.running_var().value.data_as<float>();
  for (int c = 0; c < 3; ++c) {
    rm[c] = 0.1f * c;
    rv[c] = 0.5f + c;
  }
  bn.set_mode(false, 0);
  Tensor x = random_tensor({2, 3, 2, 2}, 13);
  check_module(bn, b, x, 14);
}

TEST(BatchNorm2d, RunningStatisticsFollowPyTorchAndStayStagedUntilCommitted) {
  BatchNorm2d bn("bn", 2);
  Bound b = bind(bn);
  Tensor x = random_tensor({3, 2, 2, 2}, 15, -2.0f, 3.0f);
  b.mb->begin_step();
  const Tensor& y = bn.forward(x);
  for (int64_t c = 0; c < 2; ++c) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < 4; ++i) s += x.item((n * 2 + c) * 4 + i);
    const double mean = s / 12;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < 4; ++i) q += std::pow(x.item((n * 2 + c) * 4 + i) - mean, 2);
    // torch: running_mean = 0.9 * 0 + 0.1 * mean; running_var = 0.9 * 1 + 0.1 * unbiased variance. Each is a few
    // FP32 roundings of O(1) values: 1e-6 absolute is ~10 ulps.
    EXPECT_NEAR(bn.running_mean().staged.item(c), 0.1 * mean, 1e-6);
    EXPECT_NEAR(bn.running_var().staged.item(c), 0.9 + 0.1 * q / 11, 1e-6);
    EXPECT_NEAR(bn.batch_var().item(c), q / 12, 1e-6);
    // Normalised output: (x - mean) / sqrt(var + eps) * gamma + beta.
    const double g = b.params[0]->master.item(c), be = b.params[1]->master.item(c);
    EXPECT_NEAR(y.item(c * 4), (x.item(c * 4) - mean) / std::sqrt(q / 12 + 1e-5) * g + be, 1e-5);
    // Not committed: evaluation still reads the initial statistics.
    EXPECT_EQ(bn.running_mean().value.item(c), 0.0f);
    EXPECT_EQ(bn.running_var().value.item(c), 1.0f);
  }
  EXPECT_EQ(bn.num_batches_tracked().staged.item(0), 1.0f);
  EXPECT_EQ(bn.num_batches_tracked().value.item(0), 0.0f);
  b.mb->commit();
  EXPECT_EQ(bn.num_batches_tracked().value.item(0), 1.0f);
  EXPECT_EQ(bn.running_mean().value.item(1), bn.running_mean().staged.item(1));
}

TEST(BatchNorm2d, OneValuePerChannelIsRefusedInTraining) {
  BatchNorm2d bn("bn", 2);
  Bound b = bind(bn);
  Tensor x = random_tensor({1, 2, 1, 1}, 16);
  EXPECT_THROW(bn.forward(x), Error);
}

// Bitwise equality of two tensors of one dtype, naming the first differing element.
void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const size_t es = a.nbytes() / static_cast<size_t>(std::max<int64_t>(a.numel(), 1));
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_EQ(std::memcmp(static_cast<const char*>(a.data()) + i * es, static_cast<const char*>(b.data()) + i * es, es),
              0)
        << what << "[" << i << "]: " << a.item(i) << " vs " << b.item(i);
}
Tensor cast_to(const Tensor& t, DType d) {
  Tensor out = Tensor::empty(t.shape(), d);
  kernels::cast(t, out);
  return out;
}

// A 16-bit input's gradient is the FP32 gradient of the same values, rounded once: BatchNorm's dx for a bf16 or fp16
// x is bitwise the cast of its dx for that x widened to FP32 (the statistics and every sum are those of the same
// values, so only the final rounding can differ, and it must not).
TEST(BatchNorm2d, GradientOfA16BitInputIsTheFp32GradientRoundedOnce) {
  for (DType d : {DType::kBFloat16, DType::kFloat16}) {
    BatchNorm2d bn16("bn", 3), bn32("bn", 3);
    Bound b16 = bind(bn16), b32 = bind(bn32);
    const Tensor x16 = cast_to(random_tensor({4, 3, 5, 3}, 31, -1.0f, 2.0f), d);
    Tensor x32 = cast_to(x16, DType::kFloat32);
    const Tensor dy = random_tensor({4, 3, 5, 3}, 32);
    expect_bitwise(bn16.forward(x16), bn32.forward(x32), "y");
    GradContext c16 = ctx_for_test(), c32 = ctx_for_test();
    const Tensor& dx16 = bn16.backward(dy, c16);
    ASSERT_EQ(dx16.dtype(), d);
    expect_bitwise(dx16, cast_to(bn32.backward(dy, c32), d), "dx");
    expect_bitwise(b16.params[0]->grad, b32.params[0]->grad, "dgamma");
    expect_bitwise(b16.params[1]->grad, b32.params[1]->grad, "dbeta");
  }
}

// BatchNorm with the ReLU after it fused (BatchNorm2d::fuse_relu, as in a ResNet block's bn1 -> relu -> conv2) is
// bitwise the separate ops: FP32 BatchNorm, ReLU, one cast to the output dtype; backward, ReLU's gradient from that
// output (dy where it is > 0), then BatchNorm's backward. About a third of the inputs are below the batch mean, so
// both sides of the ReLU are exercised.
TEST(BatchNorm2d, FusedReluIsBitwiseTheSeparateOps) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    BatchNorm2d fused("bn", 3), plain("bn", 3);
    fused.fuse_relu(d);
    Bound bf = bind(fused), bp = bind(plain);
    const Tensor x = cast_to(random_tensor({4, 3, 6, 5}, 33, -1.0f, 2.0f), d);  // a conv's output in d
    const Tensor dy = cast_to(random_tensor({4, 3, 6, 5}, 34), d);             // the next conv's dx in d
    const Tensor& y = fused.forward(x);
    ASSERT_EQ(y.dtype(), d);
    Tensor relu32 = Tensor::empty(x.shape(), DType::kFloat32);
    kernels::relu_forward(plain.forward(x), relu32);
    expect_bitwise(y, cast_to(relu32, d), "y");
    Tensor dy_relu = Tensor::empty(x.shape(), DType::kFloat32);
    kernels::relu_backward(cast_to(y, DType::kFloat32), cast_to(dy, DType::kFloat32), dy_relu);
    GradContext cf = ctx_for_test(), cp = ctx_for_test();
    const Tensor& dx = fused.backward(dy, cf);
    ASSERT_EQ(dx.dtype(), d);
    expect_bitwise(dx, plain.backward(dy_relu, cp), "dx");
    expect_bitwise(bf.params[0]->grad, bp.params[0]->grad, "dgamma");
    expect_bitwise(bf.params[1]->grad, bp.params[1]->grad, "dbeta");
  }
}

// The residual add: FP32 sums of FP32 or 16-bit operands, ReLU with NaN kept (a NaN must reach the loss).
TEST(ResidualAdd, AddsInFp32AndKeepsNaNThroughTheRelu) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = Tensor::empty({1, 1, 1, 6}, DType::kFloat32);
  const float av[] = {1.5f, -2.0f, nan, 0.25f, -0.0f, 3.0f};
  for (int i = 0; i < 6; ++i) a.data_as<float>()[i] = av[i];
  Tensor b32 = Tensor::empty({1, 1, 1, 6}, DType::kFloat32);
  const float bv[] = {0.5f, 1.0f, 1.0f, -0.5f, 0.0f, 1.0f / 3.0f};
  for (int i = 0; i < 6; ++i) b32.data_as<float>()[i] = bv[i];
  const Tensor b16 = cast_to(b32, DType::kBFloat16);
  Tensor y = Tensor::empty({1, 1, 1, 6}, DType::kFloat32);
  for (bool relu : {false, true}) {
    kernels::residual_add(a, b16, y, relu);
    for (int i = 0; i < 6; ++i) {
      const float want = av[i] + b16.item(i);  // bf16 widens exactly; one FP32 add
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(y.item(i))) << i;
      } else {
        EXPECT_EQ(y.item(i), relu ? std::max(want, 0.0f) : want) << i;
      }
    }
  }
  Tensor wrong = Tensor::empty({1, 1, 1, 5}, DType::kFloat32);
  EXPECT_THROW(kernels::residual_add(a, wrong, y, false), Error);
}

// ---- pooling, flatten, residual ------------------------------------------------------------------------------------

// Distinct values 0.05 apart, so that no step of +-h = 1e-2 changes which element is a window's maximum.
Tensor spread_tensor(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = 0.05f * static_cast<float>((i * 7919) % n) - 1.0f;
  return t;
}

TEST(Pool2d, MaxPoolGradientMatchesFiniteDifferences) {
  Pool2d pool("pool", Pool2d::Kind::kMax, 3, 2, 1);
  Bound b = bind(pool);
  Tensor x = spread_tensor({2, 2, 7, 6});
  const Tensor& y = pool.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 4, 3}));
  check_module(pool, b, x, 17, 40);
}

TEST(Pool2d, AvgPoolGradientMatchesFiniteDifferences) {
  Pool2d pool("pool", Pool2d::Kind::kAvg, 2, 2, 0);
  Bound b = bind(pool);
  Tensor x = random_tensor({2, 3, 6, 5}, 18);
  ASSERT_EQ(pool.forward(x).shape(), (Shape{2, 3, 3, 2}));
  check_module(pool, b, x, 19, 40);
}

TEST(Pool2d, MaxPoolKeepsNaN) {
  Pool2d pool("pool", Pool2d::Kind::kMax, 2, 2, 0);
  Tensor x = spread_tensor({1, 1, 2, 2});
  x.data_as<float>()[1] = std::nanf("");
  EXPECT_TRUE(std::isnan(pool.forward(x).item(0)));
}

// Every window's maximum and where it is, against a plain scan of the window in row-major order (the first of equal
// maxima, the first NaN), on images wide enough for the kernel's blocks of interior outputs and their edges, with
// ties (values on a coarse grid) and NaNs, for the ResNet stem's 3/2/1 window and a 2/2/0 one.
TEST(Pool2d, MaxPoolMatchesAPlainScanWithTiesAndNaNs) {
  for (const auto& [k, st, pad] : {std::tuple<int64_t, int64_t, int64_t>{3, 2, 1}, {2, 2, 0}, {3, 1, 1}}) {
    kernels::PoolShape s;
    s.n = 2, s.c = 3, s.h = 13, s.w = 41, s.kernel = k, s.stride = st, s.pad = pad;
    Tensor x = random_tensor({2, 3, 13, 41}, 40);
    float* px = x.data_as<float>();
    for (int64_t i = 0; i < x.numel(); ++i) px[i] = std::round(px[i] * 4.0f) / 4.0f;  // ties
    for (int64_t i = 5; i < x.numel(); i += 97) px[i] = std::nanf("");
    Tensor y = Tensor::empty({2, 3, s.out_h(), s.out_w()}, DType::kFloat32);
    std::vector<int32_t> arg(static_cast<size_t>(y.numel()));
    kernels::maxpool2d_forward(s, x, y, arg);
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t i = 0; i < s.out_h(); ++i)
        for (int64_t j = 0; j < s.out_w(); ++j) {
          float best = 0.0f;
          int64_t at = -1;
          for (int64_t a = 0; a < k; ++a)
            for (int64_t b = 0; b < k; ++b) {
              const int64_t hi = i * st - pad + a, wi = j * st - pad + b;
              if (hi < 0 || hi >= s.h || wi < 0 || wi >= s.w) continue;
              const float v = px[r * s.h * s.w + hi * s.w + wi];
              if (at < 0 || (!std::isnan(best) && (v > best || std::isnan(v)))) best = v, at = hi * s.w + wi;
            }
          const int64_t o = (r * s.out_h() + i) * s.out_w() + j;
          ASSERT_EQ(arg[static_cast<size_t>(o)], at) << k << st << pad << " " << r << " " << i << " " << j;
          if (std::isnan(best))
            ASSERT_TRUE(std::isnan(y.item(o)));
          else
            ASSERT_EQ(y.item(o), best);
        }
  }
}

TEST(BasicBlock, GradientsMatchFiniteDifferencesWithDownsampleAndGlobalPool) {
  const Autocast ac(DType::kFloat32);
  Sequential m("m");
  m.add(std::make_unique<BasicBlock>("layer2.0", 3, 4, 2, ac, BatchNorm2d::AllReduce{}, 0.0f));
  m.add(std::make_unique<BasicBlock>("layer2.1", 4, 4, 1, ac, BatchNorm2d::AllReduce{}, 0.0f));
  m.add(std::make_unique<GlobalAvgPool2d>("avgpool"));
  m.add(std::make_unique<Flatten>("flatten"));
  Bound b = bind(m);
  ASSERT_EQ(b.params.size(), 15u);  // 9 with the downsample (conv1, bn1 x2, conv2, bn2 x2, ds.0, ds.1 x2), then 6
  Tensor x = random_tensor({3, 3, 6, 6}, 20);
  ASSERT_EQ(m.forward(x).shape(), (Shape{3, 4}));
  // h = 1e-3: two ReLUs per block put kinks within reach of a step of 1e-2 (a pre-activation crossing zero makes the
  // difference quotient wrong by O(1)); rounding error is then ~2^-24 |L| / h <~ 1e-4, inside the tolerance.
  check_module(m, b, x, 21, 8, 1e-3f);
}

// ---- ResNet-18 layout --------------------------------------------------------------------------------------------

TEST(Resnet, Resnet18HasTorchvisionNamesAndCounts) {
  const Autocast ac(DType::kFloat32);
  ResnetConfig cfg;
  cfg.set_depth(18);
  cfg.set_stem(IMAGENET);
  auto model = build_resnet(cfg, {3, 224, 224}, 10, ac);
  std::vector<Parameter*> params;
  std::vector<Buffer*> buffers;
  model->collect_parameters(params);
  model->collect_buffers(buffers);
  // torchvision resnet18(num_classes=10).state_dict(): 62 parameters and 60 buffers (20 BatchNorms x 3);
  // 11,181,642 parameters (11,689,512 with 1000 classes, less 513 * 990).
  EXPECT_EQ(params.size(), 62u);
  EXPECT_EQ(buffers.size(), 60u);
  int64_t n = 0;
  for (Parameter* p : params) n += p->numel();
  EXPECT_EQ(n, 11181642);
  std::set<std::string> names;
  for (Parameter* p : params) names.insert(p->name);
  for (Buffer* bf : buffers) names.insert(bf->name);
  for (const char* expect : {"conv1.weight", "bn1.weight", "bn1.running_mean", "layer1.0.conv1.weight",
                             "layer1.1.bn2.num_batches_tracked", "layer2.0.downsample.0.weight",
                             "layer2.0.downsample.1.running_var", "layer4.1.conv2.weight", "fc.weight", "fc.bias"})
    EXPECT_TRUE(names.count(expect)) << expect;
  EXPECT_EQ(params[0]->shape, (Shape{64, 3, 7, 7}));
  cfg.set_stem(SMALL);
  auto small = build_resnet(cfg, {1, 28, 28}, 10, ac);
  std::vector<Parameter*> sp;
  small->collect_parameters(sp);
  EXPECT_EQ(sp[0]->shape, (Shape{64, 1, 3, 3}));
}

}  // namespace
}  // namespace ampdist
