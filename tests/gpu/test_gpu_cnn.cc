// The convolutional-network ops (kernels/cnn.h) and a whole ResNet on the GPU against the CPU backend. Each test
// skips, saying why, without a GPU.
//
// Tolerances (tests/gpu/bounds.h for the notation and sources):
// - convolutions: both backends form each output as a sum of K exact products in FP32 (oneDNN on the CPU; cuDNN's
//   direct and implicit-GEMM algorithms on the GPU, tensor cores for 16-bit and widened operands), in different
//   orders. With A the same sum of |products| (the convolution of |x| and |w|, computed on the CPU), the two FP32
//   results differ by at most (gamma(K) + 2 gamma(K)) A (the CPU's rounding bound, and twice it for tensor cores),
//   plus one rounding flip when the output is 16-bit. K is C/groups * kh * kw (forward), K/groups * kh * kw
//   (backward data; strided convolutions touch fewer terms, so the bound holds) and N * OH * OW (weight gradient).
// - BatchNorm's sums are double sums of FP32 values: gamma_double(n) * sum |terms| with u = 2^-53, times two.
//   Given the same statistics, the normalisation, its ReLU and the backward's dx are element-wise in both: bitwise.
// - pooling, global average pooling and the residual add run the CPU loops' order: bitwise.
// - the whole ResNet composes all of these over several layers; its tolerance (loss 1e-5 relative, gradients
//   1e-4 + 1e-3 relative, as the GPT's end-to-end test) is an end-to-end check with a wide margin, not a bound.
#include <gtest/gtest.h>
#include <google/protobuf/text_format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/device.h"
#include "runtime/core/rng.h"
#include "runtime/kernels/cnn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/cnn.h"
#include "runtime/nn/conv.h"
#include "tests/gpu/bounds.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/op_coverage.h"

namespace ampdist {
namespace {

using testing::as;
using testing::floats;
using testing::gamma;
using testing::random_tensor;

// |t| in FP32 on the host (of a 16-bit tensor: of its exact values).
Tensor abs_of(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::kFloat32);
  const std::vector<float> v = floats(t);
  for (int64_t i = 0; i < t.numel(); ++i) out.data_as<float>()[i] = std::fabs(v[static_cast<size_t>(i)]);
  return out;
}
Tensor gpu(const Tensor& t) { return t.to(Device::kCUDA); }

// |got - want| <= (3 gamma(K)) * bound[i], plus a rounding flip in `out` (the output dtype).
void expect_within_sum_bound(const Tensor& got, const Tensor& want, const Tensor& abs_sums, double k, DType out,
                             const char* what) {
  const std::vector<float> a = floats(got), b = floats(want), s = floats(abs_sums);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    // A itself is an FP32 sum of K terms, at most gamma(K) below the exact sum of |products|.
    double d = 3.0 * gamma(k) * s[i] / (1.0 - gamma(k));
    if (out != DType::kFloat32) d = testing::flip(b[i], d, out);
    ASSERT_LE(std::fabs(static_cast<double>(a[i]) - b[i]), d) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

struct ConvCase {
  kernels::ConvShape s;
  bool bias;
};

AMPDIST_GPU_TEST_COVERS(GpuCnn, ConvolutionsMatchTheCpuWithinTheSumBound,
                        "conv2d_forward", "conv2d_backward_data", "conv2d_backward_weights");
TEST(GpuCnn, ConvolutionsMatchTheCpuWithinTheSumBound) {
  REQUIRE_GPU();
  if (!kernels::gpu_convolutions()) GTEST_SKIP() << "this build has no cuDNN";
  const std::vector<ConvCase> cases = {
      {{2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1}, false},  // a ResNet 3x3 conv
      {{2, 8, 9, 9, 16, 1, 1, 2, 0, 1, 1}, false},  // a downsample 1x1, stride 2
      {{3, 4, 12, 10, 6, 3, 3, 2, 2, 2, 2}, true},  // groups, dilation, padding, bias
  };
  for (const ConvCase& c : cases) {
    const kernels::ConvShape& s = c.s;
    const Shape xs{s.n, s.c, s.h, s.w}, ws{s.k, s.c / s.groups, s.kh, s.kw}, ys{s.n, s.k, s.out_h(), s.out_w()};
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " k=" + std::to_string(s.kh) + " groups=" + std::to_string(s.groups));
      const Tensor x = as(random_tensor(xs, 1), dt), w = as(random_tensor(ws, 2), dt), dy = as(random_tensor(ys, 3), dt);
      const Tensor bias = random_tensor({s.k}, 4);
      const Tensor* b = c.bias ? &bias : nullptr;
      const Tensor gb = gpu(bias);
      // Forward, into the operands' dtype and into FP32.
      for (DType out : {dt, DType::kFloat32}) {
        Tensor y = Tensor::empty(ys, out), y_d = Tensor::empty(ys, out, Device::kCUDA);
        kernels::conv2d_forward(s, x, w, b, y);
        kernels::conv2d_forward(s, gpu(x), gpu(w), c.bias ? &gb : nullptr, y_d);
        Tensor a = Tensor::empty(ys, DType::kFloat32);
        kernels::conv2d_forward(s, abs_of(x), abs_of(w), nullptr, a);
        if (c.bias)
          for (int64_t i = 0; i < a.numel(); ++i)
            a.data_as<float>()[i] += std::fabs(bias.data_as<float>()[(i / (s.out_h() * s.out_w())) % s.k]);
        expect_within_sum_bound(y_d, y, a, static_cast<double>(s.c / s.groups * s.kh * s.kw) + 1, out, "conv y");
      }
      // Backward data, into the operands' dtype and into FP32.
      Tensor adx = Tensor::empty(xs, DType::kFloat32);
      kernels::conv2d_backward_data(s, abs_of(dy), abs_of(w), adx);
      for (DType out : {dt, DType::kFloat32}) {
        Tensor dx = Tensor::empty(xs, out), dx_d = Tensor::empty(xs, out, Device::kCUDA);
        kernels::conv2d_backward_data(s, dy, w, dx);
        kernels::conv2d_backward_data(s, gpu(dy), gpu(w), dx_d);
        expect_within_sum_bound(dx_d, dx, adx, static_cast<double>(s.k / s.groups * s.kh * s.kw), out, "conv dx");
      }
      // Weight gradient, written (the first micro-batch) and added to an existing value (a later one).
      const Tensor dw0 = random_tensor(ws, 5), db0 = random_tensor({s.k}, 6);
      Tensor adw = Tensor::empty(ws, DType::kFloat32), adb = Tensor::empty({s.k}, DType::kFloat32);
      kernels::conv2d_backward_weights(s, abs_of(x), abs_of(dy), adw, &adb, false);
      const double kw = static_cast<double>(s.n * s.out_h() * s.out_w()) + 1;
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(accumulate ? "accumulate" : "write");
        Tensor dw = dw0.to(Device::kCPU), db = db0.to(Device::kCPU), dw_d = gpu(dw0), db_d = gpu(db0);
        kernels::conv2d_backward_weights(s, x, dy, dw, c.bias ? &db : nullptr, accumulate);
        kernels::conv2d_backward_weights(s, gpu(x), gpu(dy), dw_d, c.bias ? &db_d : nullptr, accumulate);
        Tensor bw = adw.to(Device::kCPU), bb = adb.to(Device::kCPU);
        if (accumulate) {
          for (int64_t i = 0; i < bw.numel(); ++i) bw.data_as<float>()[i] += std::fabs(dw0.data_as<float>()[i]);
          for (int64_t i = 0; i < bb.numel(); ++i) bb.data_as<float>()[i] += std::fabs(db0.data_as<float>()[i]);
        }
        expect_within_sum_bound(dw_d, dw, bw, kw, DType::kFloat32, "conv dw");
        if (c.bias) expect_within_sum_bound(db_d, db, bb, kw, DType::kFloat32, "conv dbias");
      }
    }
  }
}

AMPDIST_GPU_TEST_COVERS(GpuCnn, BatchNormSumsAreWithinTheDoubleBoundAndTheRestIsBitwise,
                        "batchnorm_sums", "batchnorm_apply", "batchnorm_backward_sums", "batchnorm_backward_dx");
TEST(GpuCnn, BatchNormSumsAreWithinTheDoubleBoundAndTheRestIsBitwise) {
  REQUIRE_GPU();
  const int64_t N = 3, C = 5, H = 7, W = 6;
  const Shape xs{N, C, H, W};
  const double count = static_cast<double>(N * H * W);
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = as(random_tensor(xs, 11, -2.0f, 3.0f), dt), dy = as(random_tensor(xs, 12), dt);
    std::vector<double> s_cpu(2 * C), s_gpu(2 * C);
    kernels::batchnorm_sums(x, s_cpu);
    kernels::batchnorm_sums(gpu(x), s_gpu);
    const double ud = std::ldexp(1.0, -53), g = count * ud / (1 - count * ud);
    for (int64_t c = 0; c < C; ++c) {
      // |sum x| <= sum |x| <= 3 * count, sum x^2 <= 9 * count: the bound on sum |terms|.
      EXPECT_NEAR(s_gpu[c], s_cpu[c], 2 * g * 3 * count);
      EXPECT_NEAR(s_gpu[C + c], s_cpu[C + c], 2 * g * 9 * count);
    }
    // The statistics as the layer forms them, from the CPU's sums, so both backends normalise with the same values.
    Tensor mean = Tensor::empty({C}, DType::kFloat32), invstd = Tensor::empty({C}, DType::kFloat32);
    for (int64_t c = 0; c < C; ++c) {
      const double m = s_cpu[c] / count, v = std::max(0.0, s_cpu[C + c] / count - m * m);
      mean.data_as<float>()[c] = static_cast<float>(m);
      invstd.data_as<float>()[c] = static_cast<float>(1.0 / std::sqrt(v + 1e-5));
    }
    const Tensor gamma_t = random_tensor({C}, 13, 0.5f, 1.5f), beta = random_tensor({C}, 14);
    for (bool relu : {false, true}) {
      SCOPED_TRACE(relu ? "with ReLU" : "without ReLU");
      Tensor y = Tensor::empty(xs, dt), y_d = Tensor::empty(xs, dt, Device::kCUDA);
      kernels::batchnorm_apply(x, mean, invstd, gamma_t, beta, y, relu);
      kernels::batchnorm_apply(gpu(x), gpu(mean), gpu(invstd), gpu(gamma_t), gpu(beta), y_d, relu);
      EXPECT_TRUE(testing::same_bits_any_nan(y_d, y)) << "batchnorm y";
      const Tensor* ry = relu ? &y : nullptr;
      const Tensor ry_d = gpu(y);
      std::vector<double> b_cpu(2 * C), b_gpu(2 * C);
      kernels::batchnorm_backward_sums(x, dy, mean, invstd, b_cpu, ry);
      kernels::batchnorm_backward_sums(gpu(x), gpu(dy), gpu(mean), gpu(invstd), b_gpu, relu ? &ry_d : nullptr);
      for (int64_t c = 0; c < 2 * C; ++c) {
        // |dy| <= 1 and |xhat| is at most sqrt(count) (a standardised value): the sums of |terms|.
        const double bound = c < C ? count : count * std::sqrt(count);
        EXPECT_NEAR(b_gpu[c], b_cpu[c], 2 * g * bound * 1.01) << c;
      }
      for (double n : {count, 0.0}) {  // training, evaluation
        Tensor dx = Tensor::empty(xs, dt), dx_d = Tensor::empty(xs, dt, Device::kCUDA);
        kernels::batchnorm_backward_dx(x, dy, mean, invstd, gamma_t, b_cpu, n, dx, ry);
        kernels::batchnorm_backward_dx(gpu(x), gpu(dy), gpu(mean), gpu(invstd), gpu(gamma_t), b_cpu, n, dx_d,
                                       relu ? &ry_d : nullptr);
        EXPECT_TRUE(testing::same_bits_any_nan(dx_d, dx)) << "batchnorm dx";
      }
    }
  }
}

AMPDIST_GPU_TEST_COVERS(GpuCnn, PoolingAndResidualAddAreBitwiseEqual,
                        "maxpool2d_forward", "maxpool2d_backward", "avgpool2d_forward", "avgpool2d_backward",
                        "global_avgpool2d_forward", "global_avgpool2d_backward", "residual_add");
TEST(GpuCnn, PoolingAndResidualAddAreBitwiseEqual) {
  REQUIRE_GPU();
  // A 3x3 window with stride 2 and padding 1 (the ImageNet stem's max-pool: windows overlap), ties and a NaN. 23
  // columns give 12 outputs a row, so the CPU's eight-at-a-time interior path runs as well as its one-at-a-time one.
  kernels::PoolShape s;
  s.n = 2;
  s.c = 3;
  s.h = 11;
  s.w = 23;
  s.kernel = 3;
  s.stride = 2;
  s.pad = 1;
  Tensor x = random_tensor({s.n, s.c, s.h, s.w}, 21);
  // Ties: the first two rows of the first plane hold 2.0 (above every random value) in their first 12 columns.
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 12; ++j) x.data_as<float>()[r * s.w + j] = 2.0f;
  x.data_as<float>()[100] = std::nanf("");
  const Shape ys{s.n, s.c, s.out_h(), s.out_w()};
  Tensor y = Tensor::empty(ys, DType::kFloat32), y_d = Tensor::empty(ys, DType::kFloat32, Device::kCUDA);
  std::vector<int32_t> am(static_cast<size_t>(y.numel()));
  Tensor am_d = Tensor::empty({y.numel()}, DType::kFloat32, Device::kCUDA);
  const std::span<int32_t> am_span(static_cast<int32_t*>(am_d.data()), static_cast<size_t>(y.numel()));
  kernels::maxpool2d_forward(s, x, y, am);
  kernels::maxpool2d_forward(s, gpu(x), y_d, am_span);
  EXPECT_TRUE(testing::same_bits_any_nan(y_d, y)) << "maxpool y";
  std::vector<int32_t> am_back(am.size());
  device::copy(am_back.data(), Device::kCPU, am_d.data(), Device::kCUDA, am.size() * sizeof(int32_t));
  EXPECT_EQ(am_back, am);
  const Tensor dy = random_tensor(ys, 22);
  Tensor dx = Tensor::empty(x.shape(), DType::kFloat32), dx_d = Tensor::empty(x.shape(), DType::kFloat32, Device::kCUDA);
  kernels::maxpool2d_backward(s, dy, am, dx);
  kernels::maxpool2d_backward(s, gpu(dy), am_span, dx_d);
  EXPECT_TRUE(testing::same_bits_any_nan(dx_d, dx)) << "maxpool dx";
  kernels::avgpool2d_forward(s, x, y);
  kernels::avgpool2d_forward(s, gpu(x), y_d);
  EXPECT_TRUE(testing::same_bits_any_nan(y_d, y)) << "avgpool y";
  kernels::avgpool2d_backward(s, dy, dx);
  kernels::avgpool2d_backward(s, gpu(dy), dx_d);
  EXPECT_TRUE(testing::same_bits_any_nan(dx_d, dx)) << "avgpool dx";

  Tensor g = Tensor::empty({s.n, s.c, 1, 1}, DType::kFloat32), g_d = Tensor::empty({s.n, s.c, 1, 1}, DType::kFloat32, Device::kCUDA);
  kernels::global_avgpool2d_forward(x, g);
  kernels::global_avgpool2d_forward(gpu(x), g_d);
  EXPECT_TRUE(testing::same_bits_any_nan(g_d, g)) << "global average pool y";
  const Tensor dg = random_tensor({s.n, s.c, 1, 1}, 23);
  kernels::global_avgpool2d_backward(dg, dx);
  kernels::global_avgpool2d_backward(gpu(dg), dx_d);
  EXPECT_TRUE(testing::same_bits_any_nan(dx_d, dx)) << "global average pool dx";

  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (bool relu : {false, true}) {
      const Tensor a = as(random_tensor(x.shape(), 24), dt), b = random_tensor(x.shape(), 25);
      Tensor r = Tensor::empty(x.shape(), DType::kFloat32), r_d = Tensor::empty(x.shape(), DType::kFloat32, Device::kCUDA);
      kernels::residual_add(a, b, r, relu);
      kernels::residual_add(gpu(a), gpu(b), r_d, relu);
      EXPECT_TRUE(testing::same_bits_any_nan(r_d, r)) << "residual add";
    }
}

struct ModelRun {
  double loss = 0.0;
  std::vector<float> grads, buffers;
};

// A ResNet-18 with the small-image stem, 8 channels wide, on a batch of 4 one-channel 16x16 images: one training
// forward and backward, FP32.
ModelRun run_resnet(Device device) {
  ResnetConfig cfg;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString("depth: 18 stem: SMALL width: 8", &cfg));
  auto model = build_resnet(cfg, {1, 16, 16}, 10, Autocast(DType::kFloat32));
  std::vector<Parameter*> params;
  model->collect_parameters(params);
  std::vector<Buffer*> buffers;
  model->collect_buffers(buffers);
  auto masters = bind_parameters(params, DType::kFloat32, device, 17);
  model->set_mode(true, 1);
  const Tensor x = random_tensor({4, 256}, 31, 0.0f, 1.0f);
  const std::vector<int32_t> labels = {3, 1, 4, 1};
  SoftmaxCrossEntropy crit;
  ModelRun r;
  r.loss = crit.forward(model->forward(device == Device::kCPU ? x : gpu(x)), labels);
  GradContext ctx;
  ctx.need_input_grad = false;
  model->backward(crit.backward(1.0f), ctx);
  r.grads = floats(masters->grads());
  for (Buffer* b : buffers) {
    const std::vector<float> v = floats(b->staged);
    r.buffers.insert(r.buffers.end(), v.begin(), v.end());
  }
  return r;
}

AMPDIST_GPU_TEST_COVERS(GpuCnn, ResnetLossGradientsAndRunningStatisticsMatchTheCpu,
                        "batchnorm_sums_to", "batchnorm_statistics", "batchnorm_backward_sums_to",
                        "batchnorm_param_grads", "batchnorm_backward_dx_from");
TEST(GpuCnn, ResnetLossGradientsAndRunningStatisticsMatchTheCpu) {
  REQUIRE_GPU();
  if (!kernels::gpu_convolutions()) GTEST_SKIP() << "this build has no cuDNN";
  const ModelRun cpu = run_resnet(Device::kCPU);
  const ModelRun gpu_run = run_resnet(Device::kCUDA);
  EXPECT_NEAR(gpu_run.loss, cpu.loss, 1e-5 * std::fabs(cpu.loss));
  ASSERT_EQ(gpu_run.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    ASSERT_NEAR(gpu_run.grads[i], cpu.grads[i], 1e-4 + 1e-3 * std::fabs(cpu.grads[i])) << "gradient element " << i;
  ASSERT_EQ(gpu_run.buffers.size(), cpu.buffers.size());
  for (size_t i = 0; i < cpu.buffers.size(); ++i)
    ASSERT_NEAR(gpu_run.buffers[i], cpu.buffers[i], 1e-5 + 1e-4 * std::fabs(cpu.buffers[i])) << "buffer element " << i;
}

}  // namespace
}  // namespace ampdist
