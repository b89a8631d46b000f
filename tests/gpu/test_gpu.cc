// The CUDA backend against the CPU backend on the same inputs, the acceptance scenarios on GPU buffers, and short
// training runs. Every test skips, saying why, when no GPU is visible. Runs under mpirun (tests/CMakeLists.txt:
// gpu_np1, gpu_np2); tests that need one GPU per rank skip when a node has fewer.
//
// Tolerances:
// - casts, ReLU, unscale + check, SGD and AdamW updates, argmax: exact. Both backends run kernels/math.h's
//   formulas with the same roundings (no FMA contraction on either side: -ffp-contract=off, nvcc --fmad=false;
//   IEEE division and square root on the device, nvcc's default).
// - GELU: the only difference is expf (CUDA: within 2 ulp, glibc: within 1 ulp of the correctly rounded value);
//   the result must lie in the exact bracket of tests/gpu/gelu_bound.h (the formula replayed with e +- 3 ulp),
//   which the CPU unit test tests/unit/test_gelu_bound.cc checks by perturbing expf. A fixed ulp bound is wrong
//   here: 1 + tanh cancels for x in about [-4, -1.5].
// - GEMM: both accumulate in FP32 in different orders; |difference| <= 3 K u sum_k |a_ik b_kj| (u = 2^-24: the
//   CPU's gamma(K) plus twice that for tensor cores, which may truncate: tests/gpu/bounds.h) plus 1 ulp of the
//   output dtype.
// - sum_rows (two-stage column sums), softmax cross-entropy: derived beside each test from tests/gpu/bounds.h.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/ampdist.h"
#include "runtime/amp/step_state_buffer.h"
#include "runtime/checkpoint/async_checkpoint.h"
#include "runtime/dist/cuda/consensus_kernels.h"
#include "tests/gpu/bounds.h"
#include "tests/gpu/gelu_bound.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/op_coverage.h"
#include "runtime/core/device.h"
#include "runtime/kernels/cnn.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/optim/step_gate.h"
#include "tests/mpi/test_util.h"

#ifdef AMPDIST_HAVE_CUDA
#include "comm/nccl_communicator.h"
#endif

namespace ampdist {
namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int my_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// NCCL needs a distinct GPU per rank of a communicator.
#define REQUIRE_GPU_PER_RANK()                                                                                \
  do {                                                                                                        \
    REQUIRE_GPU();                                                                                            \
    if (device::device_count() < world_size())                                                                \
      GTEST_SKIP() << world_size() << " ranks need as many GPUs on this node, " << device::device_count()   \
                   << " visible";                                                                             \
  } while (0)

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

float ulp(DType t, float v) {
  const float a = std::fabs(v);
  const int mant = t == DType::kFloat32 ? 23 : t == DType::kFloat16 ? 10 : 7;
  const float min_normal = t == DType::kFloat16 ? 6.103515625e-05f : std::numeric_limits<float>::min();
  return std::ldexp(1.0f, std::max(std::ilogb(std::max(a, min_normal)), std::ilogb(min_normal)) - mant);
}

// Host tensor of `n` values in dtype, from floats.
Tensor host_tensor(const std::vector<float>& v, DType t, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  Tensor f = Tensor::empty(shape, DType::kFloat32);
  std::memcpy(f.data(), v.data(), v.size() * sizeof(float));
  if (t == DType::kFloat32) return f;
  Tensor out = Tensor::empty(shape, t);
  kernels::cast(f, out);
  return out;
}

using testing::floats;

using testing::bytes;

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// ---- kernels --------------------------------------------------------------------------------------------------

AMPDIST_GPU_TEST_COVERS(GpuKernels, CastsEqualTheCpuBitForBit, "cast");
TEST(GpuKernels, CastsEqualTheCpuBitForBit) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 5.96e-8f, 1e-40f,
                          3.0e38f, inf, -inf, 1.0009765625f, 1.00048828125f, 0.333333343f};
  for (float x : random_values(4093, 7, 100.0f)) v.push_back(x);
  for (DType s : kDTypes) {
    for (DType d : kDTypes) {
      SCOPED_TRACE(std::string(dtype_name(s)) + " -> " + dtype_name(d));
      const Tensor src = host_tensor(v, s);
      Tensor want = Tensor::empty(src.shape(), d);
      kernels::cast(src, want);
      const Tensor src_dev = src.to(Device::kCUDA);
      Tensor got = Tensor::empty(src.shape(), d, Device::kCUDA);
      kernels::cast(src_dev, got);
      EXPECT_EQ(bytes(got), bytes(want));
    }
  }
  // NaN stays NaN (payload bits may differ between libraries).
  const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  for (DType d : kDTypes) {
    Tensor got = Tensor::empty({1}, d, Device::kCUDA);
    kernels::cast(host_tensor(nan, DType::kFloat32).to(Device::kCUDA), got);
    EXPECT_TRUE(std::isnan(got.item(0))) << dtype_name(d);
  }
}

AMPDIST_GPU_TEST_COVERS(GpuKernels, ActivationsMatchTheCpu,
                        "relu_forward", "relu_backward", "gelu_forward", "gelu_backward");
TEST(GpuKernels, ActivationsMatchTheCpu) {
  REQUIRE_GPU();
  std::vector<float> v = random_values(5000, 11, 3.0f);
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> dyv = random_values(v.size(), 12);
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = host_tensor(v, t), dy = host_tensor(dyv, t);
    const Tensor xd = x.to(Device::kCUDA), dyd = dy.to(Device::kCUDA);
    Tensor y = Tensor::empty(x.shape(), t), yd = Tensor::empty(x.shape(), t, Device::kCUDA);
    Tensor dx = Tensor::empty(x.shape(), t), dxd = Tensor::empty(x.shape(), t, Device::kCUDA);
    kernels::relu_forward(x, y);
    kernels::relu_forward(xd, yd);
    // The last input is a NaN: any NaN equals any NaN (testing::same_bits_any_nan says why), the rest bit for bit.
    EXPECT_TRUE(testing::same_bits_any_nan(yd, y));
    kernels::relu_backward(y, dy, dx);
    kernels::relu_backward(yd, dyd, dxd);
    EXPECT_TRUE(testing::same_bits_any_nan(dxd, dx));
    kernels::gelu_forward(x, y);
    kernels::gelu_forward(xd, yd);
    kernels::gelu_backward(x, dy, dx);
    kernels::gelu_backward(xd, dyd, dxd);
    const std::vector<float> a = floats(y), b = floats(yd), c = floats(dx), d = floats(dxd);
    const std::vector<float> xs = floats(x), dys = floats(dy);  // the inputs as the kernels saw them (rounded)
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i])) {
        EXPECT_TRUE(std::isnan(b[i]));
        EXPECT_TRUE(std::isnan(d[i]));
        continue;
      }
      // The exact bracket of tests/gpu/gelu_bound.h: every result a GPU expf within 2 ulp can give.
      const testing::Bracket f = testing::gelu_bracket(xs[i], t);
      EXPECT_TRUE(f.contains(b[i])) << "gelu x=" << xs[i] << ": " << b[i] << " not in [" << f.lo << ", " << f.hi
                                    << "], cpu " << a[i];
      const testing::Bracket g = testing::gelu_backward_bracket(xs[i], dys[i], t);
      EXPECT_TRUE(g.contains(d[i])) << "gelu' x=" << xs[i] << " dy=" << dys[i] << ": " << d[i] << " not in ["
                                    << g.lo << ", " << g.hi << "], cpu " << c[i];
    }
  }
}

AMPDIST_GPU_TEST_COVERS(GpuKernels, GemmMatchesTheCpuWithinTheSummationBound, "gemm");
TEST(GpuKernels, GemmMatchesTheCpuWithinTheSummationBound) {
  REQUIRE_GPU();
  const int64_t m = 37, k = 70, n = 29;
  for (DType t : kDTypes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (bool with_bias : {false, true}) {
          for (DType out_t : {DType::kFloat32, t}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                         " bias=" + std::to_string(with_bias) + " out=" + dtype_name(out_t));
            const Shape sa = ta ? Shape{k, m} : Shape{m, k};
            const Shape sb = tb ? Shape{n, k} : Shape{k, n};
            const Tensor a = host_tensor(random_values(m * k, 21), t, sa);
            const Tensor b = host_tensor(random_values(k * n, 22), t, sb);
            const Tensor bias = host_tensor(random_values(n, 23), t, {n});
            Tensor c = Tensor::zeros({m, n}, out_t);
            kernels::gemm(a, ta, b, tb, c, 1.0f, 0.0f, with_bias ? &bias : nullptr);
            const Tensor bias_d = bias.to(Device::kCUDA);
            Tensor cd = Tensor::zeros({m, n}, out_t, Device::kCUDA);
            kernels::gemm(a.to(Device::kCUDA), ta, b.to(Device::kCUDA), tb, cd, 1.0f, 0.0f,
                          with_bias ? &bias_d : nullptr);
            const std::vector<float> fa = floats(a), fb = floats(b), want = floats(c), got = floats(cd);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double mag = 0.0;
                for (int64_t q = 0; q < k; ++q) {
                  const float av = ta ? fa[q * m + i] : fa[i * k + q];
                  const float bv = tb ? fb[j * k + q] : fb[q * n + j];
                  mag += std::fabs(static_cast<double>(av) * bv);
                }
                const float w = want[i * n + j];
                const double tol = 3.0 * k * std::ldexp(1.0, -24) * mag + ulp(out_t, w);
                EXPECT_LE(std::fabs(got[i * n + j] - w), tol) << "C[" << i << ", " << j << "]";
              }
            }
          }
        }
      }
    }
  }
}

AMPDIST_GPU_TEST_COVERS(GpuKernels, WeightGradientAccumulatesIntoFp32AndSumRowsIsWithinTheSummationBound,
                        "gemm", "sum_rows");
TEST(GpuKernels, WeightGradientAccumulatesIntoFp32AndSumRowsIsWithinTheSummationBound) {
  REQUIRE_GPU();
  const Tensor dy = host_tensor(random_values(64 * 10, 31), DType::kFloat16, {64, 10});
  const Tensor x = host_tensor(random_values(64 * 20, 32), DType::kFloat16, {64, 20});
  Tensor gw = host_tensor(random_values(200, 33), DType::kFloat32, {10, 20});
  Tensor gw_d = gw.to(Device::kCUDA);
  kernels::gemm(dy, true, x, false, gw, 1.0f, 1.0f);  // beta = 1: accumulate (micro-batches)
  kernels::gemm(dy.to(Device::kCUDA), true, x.to(Device::kCUDA), false, gw_d, 1.0f, 1.0f);
  const std::vector<float> w = floats(gw), g = floats(gw_d);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g[i], w[i], 64 * 2 * std::ldexp(1.0, -24) * 64 + 1e-5);
  // sum_rows: out = beta out + the column's sum. The CPU adds the rows in order, the GPU in two fixed-order stages
  // (tests/gpu/bounds.h): both are rows + 1 additions of the same terms, so they differ by at most
  // 2 gamma(rows + 1) (|beta out| + sum |x|). The GPU's order is fixed: two runs give the same bits.
  const int64_t rows = 300, cols = 17;
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor xs = host_tensor(random_values(rows * cols, 34), t, {rows, cols});
    const Tensor out0 = host_tensor(random_values(cols, 35), DType::kFloat32);
    Tensor out = out0.to(Device::kCPU), out_d = out0.to(Device::kCUDA), out_d2 = out0.to(Device::kCUDA);
    kernels::sum_rows(xs, out, 0.5f);
    const Tensor xs_d = xs.to(Device::kCUDA);
    kernels::sum_rows(xs_d, out_d, 0.5f);
    kernels::sum_rows(xs_d, out_d2, 0.5f);
    EXPECT_EQ(bytes(out_d), bytes(out_d2)) << "deterministic";
    const std::vector<float> fx = floats(xs), o0 = floats(out0), want = floats(out), got = floats(out_d);
    for (int64_t j = 0; j < cols; ++j) {
      double mag = std::fabs(0.5 * o0[j]);
      for (int64_t i = 0; i < rows; ++i) mag += std::fabs(fx[i * cols + j]);
      EXPECT_LE(std::fabs(got[j] - want[j]), 2 * testing::gamma(rows + 1) * mag) << "column " << j;
    }
  }
}

// The GEMM contract with a 16-bit output: FP32 accumulation and one rounding, which cuBLAS keeps for split-K only
// with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (set on the handle). With K = 65536 (a shape where split-K
// pays), a = 1 and b = +1 for the first half of K, -1 for the second, and b_0 = 3, every partial sum is an integer
// below 2^24, so FP32 accumulation in any order gives exactly 2; a reduction of fp16 partial sums would round
// 32770 to 32768 (fp16's spacing there is 32) and return 0, a bf16 one worse.
TEST(GpuKernels, SixteenBitOutputGemmAccumulatesInFp32WhenSplittingK) {
  REQUIRE_GPU();
  const int64_t m = 16, n = 16, k = 65536;
  std::vector<float> av(m * k, 1.0f), bv(k * n);
  for (int64_t q = 0; q < k; ++q)
    for (int64_t j = 0; j < n; ++j) bv[q * n + j] = q == 0 ? 3.0f : q < k / 2 ? 1.0f : -1.0f;
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor a = host_tensor(av, t, {m, k}).to(Device::kCUDA), b = host_tensor(bv, t, {k, n}).to(Device::kCUDA);
    Tensor c = Tensor::zeros({m, n}, t, Device::kCUDA);
    kernels::gemm(a, false, b, false, c, 1.0f, 0.0f);
    for (float v : floats(c)) ASSERT_EQ(v, 2.0f);
  }
}

// Softmax cross-entropy. Row max and z - max are the same bits on both (max is exact); then e_j = expf(z_j - max)
// differs by kExpRel relative, and s = sum_j e_j (positive terms: the CPU in order, the GPU in 256 strided lanes of
// ceil(n / 256) terms and an 8-level tree) by gamma(n) + gamma(n / 256 + 9) relative more; lse = max + logf(s):
//   |d lse| <= 1.01 (kExpRel + gamma(n) + gamma(n / 256 + 9)) + 2 ulp(log s) (logf: 1 ulp each) + ulp(lse).
// The loss is the double sum of lse - z_t over rows: within the sum of the rows' |d lse| + ulp(row loss).
// dz = scale (expf(z - lse) - onehot), rounded once to the dtype: the argument moves by |d lse| + ulp(z - lse),
// so p = expf(.) moves by p (1.01 |d arg| + kExpRel) + ulp(p), then + ulp(p - onehot), times scale + ulp(dz), and
// one ulp of the output dtype for its rounding.
AMPDIST_GPU_TEST_COVERS(GpuKernels, SoftmaxCrossEntropyMatchesTheCpu,
                        "softmax_cross_entropy_forward", "softmax_cross_entropy_backward", "count_correct");
TEST(GpuKernels, SoftmaxCrossEntropyMatchesTheCpu) {
  REQUIRE_GPU();
  const int64_t rows = 300, classes = 1000;
  std::vector<int32_t> targets(rows);
  for (int64_t i = 0; i < rows; ++i) targets[i] = static_cast<int32_t>((i * 7919) % classes);
  const double rel_s = 1.01 * (testing::kExpRel + testing::gamma(classes) + testing::gamma(classes / 256 + 9));
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor z = host_tensor(random_values(rows * classes, 41, 4.0f), t, {rows, classes});
    const Tensor zd = z.to(Device::kCUDA);
    Tensor lse, lse_d;
    const double l = kernels::softmax_cross_entropy_forward(z, targets, lse);
    const double ld = kernels::softmax_cross_entropy_forward(zd, targets, lse_d);
    const std::vector<float> fz = floats(z), a = floats(lse), b = floats(lse_d);
    std::vector<double> dlse(rows);
    double loss_tol = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < classes; ++j) mx = std::max<double>(mx, fz[i * classes + j]);
      const double log_s = a[i] - mx;
      dlse[i] = rel_s + 2 * testing::ulp32(log_s) + testing::ulp32(a[i]);
      EXPECT_LE(std::fabs(b[i] - a[i]), dlse[i]) << "lse row " << i;
      loss_tol += testing::flip(a[i] - fz[i * classes + targets[i]], dlse[i]);
    }
    EXPECT_LE(std::fabs(ld - l), loss_tol);
    const float scale = 1024.0f;
    Tensor dz = Tensor::empty(z.shape(), t), dz_d = Tensor::empty(z.shape(), t, Device::kCUDA);
    kernels::softmax_cross_entropy_backward(z, targets, lse, scale, dz);
    kernels::softmax_cross_entropy_backward(zd, targets, lse_d, scale, dz_d);
    const std::vector<float> c = floats(dz), d = floats(dz_d);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < classes; ++j) {
        const size_t q = static_cast<size_t>(i * classes + j);
        const double arg = fz[q] - a[i], p = std::exp(arg), onehot = j == targets[i] ? 1.0 : 0.0;
        const double dp = testing::flip(p, p * (1.01 * testing::flip(arg, dlse[i]) + testing::kExpRel));
        const double tol = testing::flip(c[q], scale * testing::flip(p - onehot, dp));
        ASSERT_LE(std::fabs(d[q] - c[q]), tol + testing::ulp_of(t, c[q])) << "dz[" << i << ", " << j << "]";
      }
    }
    EXPECT_EQ(kernels::count_correct(zd, targets), kernels::count_correct(z, targets));
  }
  // Out-of-range targets are rejected before any kernel runs, naming the row.
  Tensor lse;
  std::vector<int32_t> bad(rows, 0);
  bad[17] = static_cast<int32_t>(classes);
  const Tensor zd = host_tensor(random_values(rows * classes, 42), DType::kFloat32, {rows, classes}).to(Device::kCUDA);
  try {
    kernels::softmax_cross_entropy_forward(zd, bad, lse);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 17"), std::string::npos) << e.what();
  }
}

AMPDIST_GPU_TEST_COVERS(GpuKernels, UnscaleCheckAndOptimizersAreExact, "unscale_and_check", "sgd_step", "adamw_step");
TEST(GpuKernels, UnscaleCheckAndOptimizersAreExact) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  std::vector<float> g = random_values(n, 51, 1000.0f);
  for (bool inject : {false, true}) {
    SCOPED_TRACE(inject ? "with inf" : "finite");
    std::vector<float> gv = g;
    if (inject) gv[n - 5] = std::numeric_limits<float>::infinity();
    Tensor h = host_tensor(gv, DType::kFloat32);
    Tensor d = h.to(Device::kCUDA);
    const kernels::UnscaleResult a = kernels::unscale_and_check(h, 1.0f / 65536.0f);
    const kernels::UnscaleResult b = kernels::unscale_and_check(d, 1.0f / 65536.0f);
    EXPECT_EQ(a.found_inf, inject);
    EXPECT_EQ(b.found_inf, a.found_inf);
    // Double sums of n = 1e5 positive terms in two orders: the worst case is 2 gamma_double(n) = 2.2e-11 relative,
    // but rounding errors of a sum are independent enough that lambda sqrt(n) u_double bounds them with
    // probability >= 1 - 2 exp(-lambda^2 / 2) (Higham & Mary, "A new approach to probabilistic rounding error
    // analysis", SISC 2019): lambda = 10 gives 3.5e-13 per sum, 7e-13 for the two, inside 1e-12.
    EXPECT_NEAR(b.sum_sq, a.sum_sq, 1e-12 * a.sum_sq);
    EXPECT_EQ(bytes(d), bytes(h));
  }
  const Tensor grads = host_tensor(random_values(n, 52), DType::kFloat32);
  const Tensor grads_d = grads.to(Device::kCUDA);
  {
    Tensor p = host_tensor(random_values(n, 53), DType::kFloat32), buf = Tensor::zeros({n}, DType::kFloat32);
    Tensor pd = p.to(Device::kCUDA), bufd = buf.to(Device::kCUDA);
    for (int step = 0; step < 3; ++step) {
      const kernels::SgdParams sp{0.05f, 0.9f, 0.0f, 1e-4f, true, step == 0};
      kernels::sgd_step(p, grads, buf, sp);
      kernels::sgd_step(pd, grads_d, bufd, sp);
    }
    EXPECT_EQ(bytes(pd), bytes(p));
    EXPECT_EQ(bytes(bufd), bytes(buf));
  }
  {
    Tensor p = host_tensor(random_values(n, 54), DType::kFloat32);
    Tensor m = Tensor::zeros({n}, DType::kFloat32), v = Tensor::zeros({n}, DType::kFloat32);
    Tensor pd = p.to(Device::kCUDA), md = m.to(Device::kCUDA), vd = v.to(Device::kCUDA);
    for (int64_t step = 1; step <= 3; ++step) {
      const kernels::AdamWParams ap{1e-3f, 0.9, 0.999, 1e-8, 0.1f, step};
      kernels::adamw_step(p, grads, m, v, ap);
      kernels::adamw_step(pd, grads_d, md, vd, ap);
    }
    EXPECT_EQ(bytes(pd), bytes(p));
    EXPECT_EQ(bytes(md), bytes(m));
    EXPECT_EQ(bytes(vd), bytes(v));
  }
}

// The step's flag and norm ops, the numerics report's statistics, clipping and BatchNorm's evaluation statistics:
// each on the same inputs on both backends. Exact except the double sums of squares (two summation orders).
AMPDIST_GPU_TEST_COVERS(GpuKernels, FlagNormAndStatisticOpsMatchTheCpu, "unscale_and_check_to_state",
                        "check_nonfinite", "zero_if", "copy_unless", "abs_stats", "sum_squares", "sum_squares_to",
                        "scale_inplace", "batchnorm_running_statistics");
TEST(GpuKernels, FlagNormAndStatisticOpsMatchTheCpu) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  const float inf = std::numeric_limits<float>::infinity();
  // A scalar of the step state on either device: a float, an int32 flag, or a double, in a 2-word FP32 tensor.
  const auto scalar = [](Device d) { return Tensor::zeros({2}, DType::kFloat32, d); };
  const auto read_float = [](const Tensor& t) { return t.to(Device::kCPU).item(0); };
  const auto read_double = [](const Tensor& t) {
    double v;
    std::memcpy(&v, t.to(Device::kCPU).data(), sizeof v);
    return v;
  };
  for (bool inject : {false, true}) {
    SCOPED_TRACE(inject ? "with inf" : "finite");
    std::vector<float> v = random_values(n, 71, 1000.0f);
    if (inject) v[n / 3] = inf;
    // unscale_and_check into the step state's fields: the factor and the flag where the tensor lives.
    Tensor h = host_tensor(v, DType::kFloat32), d = h.to(Device::kCUDA);
    Tensor inv_h = scalar(Device::kCPU), flag_h = scalar(Device::kCPU), sum_h = scalar(Device::kCPU);
    static_cast<float*>(inv_h.data())[0] = 1.0f / 1024.0f;
    Tensor inv_d = inv_h.to(Device::kCUDA), flag_d = scalar(Device::kCUDA), sum_d = scalar(Device::kCUDA);
    kernels::unscale_and_check(h, static_cast<const float*>(inv_h.data()), static_cast<float*>(flag_h.data()),
                               static_cast<double*>(sum_h.data()));
    kernels::unscale_and_check(d, static_cast<const float*>(inv_d.data()), static_cast<float*>(flag_d.data()),
                               static_cast<double*>(sum_d.data()));
    EXPECT_EQ(bytes(d), bytes(h));
    EXPECT_EQ(read_float(flag_d), read_float(flag_h));
    EXPECT_EQ(read_float(flag_h), inject ? 1.0f : 0.0f);
    // Double sums of 1e5 terms in two orders: within 1e-12 relative (the bound of UnscaleCheckAndOptimizersAreExact).
    EXPECT_NEAR(read_double(sum_d), read_double(sum_h), 1e-12 * read_double(sum_h));
    // check_nonfinite, then zero_if on the flag it wrote.
    Tensor bad_h = scalar(Device::kCPU), bad_d = scalar(Device::kCUDA);
    kernels::check_nonfinite(h, static_cast<float*>(bad_h.data()));
    kernels::check_nonfinite(d, static_cast<float*>(bad_d.data()));
    EXPECT_EQ(read_float(bad_d), read_float(bad_h));
    EXPECT_EQ(read_float(bad_h), inject ? 1.0f : 0.0f);
    kernels::zero_if(h, static_cast<const float*>(bad_h.data()));
    kernels::zero_if(d, static_cast<const float*>(bad_d.data()));
    EXPECT_EQ(bytes(d), bytes(h));
    EXPECT_EQ(h.item(0) == 0.0f && h.item(n - 1) == 0.0f, inject);
  }
  // copy_unless on an int32 flag: copies when the flag is 0, leaves dst when it is not.
  for (int32_t skip : {0, 1}) {
    SCOPED_TRACE(skip ? "flag set" : "flag clear");
    const Tensor src = host_tensor(random_values(1000, 72), DType::kFloat32);
    Tensor dst_h = host_tensor(random_values(1000, 73), DType::kFloat32), dst_d = dst_h.to(Device::kCUDA);
    const Tensor before = dst_h.to(Device::kCPU);
    Tensor f_h = scalar(Device::kCPU);
    std::memcpy(f_h.data(), &skip, sizeof skip);
    const Tensor f_d = f_h.to(Device::kCUDA);
    kernels::copy_unless(dst_h, src, static_cast<const int32_t*>(f_h.data()));
    kernels::copy_unless(dst_d, src.to(Device::kCUDA), static_cast<const int32_t*>(f_d.data()));
    EXPECT_EQ(bytes(dst_d), bytes(dst_h));
    EXPECT_EQ(bytes(dst_h), skip ? bytes(before) : bytes(src));
  }
  // abs_stats in every dtype, with an underflow threshold that splits the values: max, flag and count are exact.
  for (DType t : kDTypes) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<float> v = random_values(n, 74, 1.0f);
    v[17] = 0.0f;
    v[18] = -inf;
    const Tensor x = host_tensor(v, t);
    const kernels::AbsStats a = kernels::abs_stats(x, 1e-3f), b = kernels::abs_stats(x.to(Device::kCUDA), 1e-3f);
    EXPECT_EQ(b.max_abs, a.max_abs);
    EXPECT_EQ(b.nonfinite, a.nonfinite);
    EXPECT_TRUE(a.nonfinite);
    EXPECT_EQ(b.below, a.below);
    EXPECT_GT(a.below, 0);
  }
  // sum_squares to the host and to device memory; scale_inplace (clipping's multiply) bit for bit.
  {
    const Tensor x = host_tensor(random_values(n, 75, 3.0f), DType::kFloat32);
    const Tensor xd = x.to(Device::kCUDA);
    const double want = kernels::sum_squares(x);
    EXPECT_NEAR(kernels::sum_squares(xd), want, 1e-12 * want);
    Tensor out_h = scalar(Device::kCPU), out_d = scalar(Device::kCUDA);
    kernels::sum_squares(x, static_cast<double*>(out_h.data()));
    kernels::sum_squares(xd, static_cast<double*>(out_d.data()));
    EXPECT_EQ(read_double(out_h), want);
    EXPECT_NEAR(read_double(out_d), want, 1e-12 * want);
    Tensor s_h = x.to(Device::kCPU), s_d = x.to(Device::kCUDA);
    kernels::scale_inplace(s_h, 0.3779f);
    kernels::scale_inplace(s_d, 0.3779f);
    EXPECT_EQ(bytes(s_d), bytes(s_h));
  }
  // BatchNorm's evaluation statistics from running ones: mean and var copied, invstd in double rounded once.
  {
    const int64_t c = 37;
    std::vector<float> rv = random_values(c, 76, 2.0f);
    for (float& x : rv) x = std::fabs(x);
    rv[3] = 0.0f;
    const Tensor rm_h = host_tensor(random_values(c, 77), DType::kFloat32), rv_h = host_tensor(rv, DType::kFloat32);
    Tensor m_h = Tensor::empty({c}, DType::kFloat32), v_h = Tensor::empty({c}, DType::kFloat32),
           i_h = Tensor::empty({c}, DType::kFloat32);
    Tensor m_d = Tensor::empty({c}, DType::kFloat32, Device::kCUDA),
           v_d = Tensor::empty({c}, DType::kFloat32, Device::kCUDA),
           i_d = Tensor::empty({c}, DType::kFloat32, Device::kCUDA);
    kernels::batchnorm_running_statistics(rm_h, rv_h, 1e-5f, m_h, v_h, i_h);
    kernels::batchnorm_running_statistics(rm_h.to(Device::kCUDA), rv_h.to(Device::kCUDA), 1e-5f, m_d, v_d, i_d);
    EXPECT_EQ(bytes(m_d), bytes(m_h));
    EXPECT_EQ(bytes(v_d), bytes(v_h));
    EXPECT_EQ(bytes(i_d), bytes(i_h));
  }
}

TEST(GpuKernels, DeviceStepKernelsEqualTheHostFormulas) {
  REQUIRE_GPU();
  StepConfig c;
  c.base_lr = 0.01f;
  c.warmup = 3;
  c.cosine = true;
  c.total_steps = 20;
  c.min_lr = 0.001f;
  c.clip_max_norm = 0.5f;
  c.adamw = true;
  c.scaler.dynamic = true;
  c.scaler.growth_interval = 2;
  StepState host;
  host.scaler.scale = 65536.0f;
  StepStateBuffer buf(Device::kCUDA);
  buf.write(host);
  StepState* dev = buf.get();
  const ConsensusFields dev_fields{&dev->found_inf,        &dev->scaler.scale, &dev->scaler.growth_tracker,
                                   &dev->agreed_found_inf, &dev->agreed_stop,  &dev->disagree};
  Tensor payload = Tensor::zeros({kConsensusWords}, DType::kFloat32, Device::kCUDA);
  Tensor g = host_tensor(random_values(1000, 61, 100.0f), DType::kFloat32).to(Device::kCUDA);
  const bool flags[] = {false, false, true, false, false, false};
  for (int it = 0; it < 6; ++it) {
    buf.begin_step();
    Tensor gi = g.to(Device::kCUDA);
    if (flags[it]) {
      const float inf = std::numeric_limits<float>::infinity();
      device::copy(gi.data(), Device::kCUDA, &inf, Device::kCPU, sizeof inf);
    }
    kernels::unscale_and_check(gi, &dev->inv_scale, &dev->found_inf, &dev->sum_sq);
    // The consensus of one rank (the all-reduce is the identity): its fill and decode kernels.
    cuda::launch_consensus_fill(static_cast<float*>(payload.data()), dev_fields, false, device::compute_stream());
    cuda::launch_consensus_decode(static_cast<const float*>(payload.data()), dev_fields, device::compute_stream());
    finish_step(buf, c, 8.0);
    // The host replays the same step from the device's own sums.
    const StepState d = buf.read();
    host.found_inf = flags[it] ? 1.0f : 0.0f;
    host.sum_sq = d.sum_sq;
    host.step_loss = 0.0;
    const ConsensusFields host_fields{&host.found_inf,        &host.scaler.scale, &host.scaler.growth_tracker,
                                      &host.agreed_found_inf, &host.agreed_stop,  &host.disagree};
    float v[kConsensusWords];
    consensus_fill(v, host_fields, false);
    consensus_decode(v, host_fields);
    finish_step(host, c, 8.0);
    EXPECT_EQ(d.last_skipped, host.last_skipped) << it;
    EXPECT_EQ(d.gate.apply, host.gate.apply) << it;
    EXPECT_EQ(d.gate.lr, host.gate.lr) << it;
    EXPECT_EQ(d.gate.clip_coef, host.gate.clip_coef) << it;
    EXPECT_EQ(d.gate.bias_correction1, host.gate.bias_correction1) << it;
    EXPECT_EQ(d.gate.bias_correction2_sqrt, host.gate.bias_correction2_sqrt) << it;
    EXPECT_EQ(d.scaler.scale, host.scaler.scale) << it;
    EXPECT_EQ(d.scaler.growth_tracker, host.scaler.growth_tracker) << it;
    EXPECT_EQ(d.optimizer_steps, host.optimizer_steps) << it;
  }
}

#ifdef AMPDIST_HAVE_CUDA

// ---- trainer on the GPU: the acceptance scenarios ------------------------------------------------------------------

// A process-wide NCCL communicator on this rank's GPU (bound by the test main before any test ran), made by the
// first test that needs it and destroyed when the tests end (the environment's TearDown, inside RUN_ALL_TESTS and
// before MPI_Finalize, on every rank alike): its destructor stops the monitor thread and tears NCCL down, so no
// NCCL thread is left to end a process whose tests all passed.
class NcclEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { comm.reset(); }
  std::unique_ptr<NcclCommunicator> comm;
};
NcclEnvironment* const nccl_environment =
    static_cast<NcclEnvironment*>(::testing::AddGlobalTestEnvironment(new NcclEnvironment));
NcclCommunicator& nccl() {
  if (!nccl_environment->comm) nccl_environment->comm = std::make_unique<NcclCommunicator>(MPI_COMM_WORLD, 60.0);
  return *nccl_environment->comm;
}

// ---- NCCL set-up that cannot hang ----------------------------------------------------------------------------------

// One rank fails before joining (the fault hook): every rank throws, long before the deadline, the failing rank
// first-hand and the others as secondary errors (so the program prints the failing rank's line only).
TEST(GpuTwoRanks, AnInjectedJoinFailureOnOneRankEndsEveryRankWithinTheDeadline) {
  REQUIRE_GPU_PER_RANK();
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const double deadline_s = 30.0;
  const int bad = world_size() - 1;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    NcclCommunicator c(MPI_COMM_WORLD, deadline_s, {NcclSetupFault::Stage::kInit, bad});
    FAIL() << "the communicator was created";
  } catch (const Error& e) {
    const int rank = my_rank();
    EXPECT_EQ(e.secondary(), rank != bad) << e.what();
    EXPECT_NE(std::string(e.what()).find(rank == bad ? "injected failure" : "rank " + std::to_string(bad)),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), deadline_s);
}

// Rank 0's ncclGetUniqueId fails (injected): the status word takes its message to every rank.
TEST(GpuNccl, AFailedUniqueIdReachesEveryRank) {
  REQUIRE_GPU();
  try {
    NcclCommunicator c(MPI_COMM_WORLD, 30.0, {NcclSetupFault::Stage::kUniqueId, 0});
    FAIL() << "the communicator was created";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ncclGetUniqueId: injected failure"), std::string::npos) << e.what();
    EXPECT_EQ(e.secondary(), my_rank() != 0);
  }
}

using testing::batch;
using testing::linear_trainer;
RunConfig cfg_of(const std::string& text) { return testing::config(text); }

TEST(GpuScenarios, ClipAfterOneUnscaleNormIsFiveAndTheClippedStepIsPointSixPointEight) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  auto t = linear_trainer(cfg_of(R"(
      optimizer { sgd {} lr: 1.0 clip_grad_norm: 1.0 }
      log { every_steps: 1 }
      precision { dtype: FP16 static_scale { scale: 1024 } })"), comm, 2, 1);
  EXPECT_EQ(t->device(), Device::kCUDA);
  const std::vector<float> w0 = floats(t->masters().master());
  const StepResult r = t->step(std::vector<MicroBatch>{batch({{3, 4}, {3, 4}, {3, 4}, {3, 4}}, 2)},
                               4 * comm.world_size());
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.scale, 1024.0f);
  EXPECT_EQ(r.grad_norm, 5.0);  // every product and sum is exact (small integers times powers of two)
  const std::vector<float> w1 = floats(t->masters().master());
  EXPECT_NEAR(w1[0] - w0[0], -0.6f, 1e-6);
  EXPECT_NEAR(w1[1] - w0[1], -0.8f, 1e-6);
}

TEST(GpuScenarios, SkippedStepsChangeNothingAndWarmupCountsAppliedUpdates) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  RunConfig cfg = cfg_of(R"(
      optimizer { sgd { momentum: 0.9 } lr: 1.0 schedule { kind: CONSTANT warmup_steps: 100 } }
      log { every_steps: 1 }
      precision { dtype: FP16 })");
  for (int step : {2, 3}) {
    // Only one rank holds the bad element.
    testing::inject_nonfinite(cfg, step, step == 2 ? 0 : comm.world_size() - 1, step == 2 ? POS_INF : QNAN);
  }
  auto t = linear_trainer(cfg, comm, 2, 1);
  const float expected_lr[] = {0.01f, 0.0f, 0.0f, 0.02f, 0.03f};
  const float expected_scale[] = {65536.0f, 65536.0f, 32768.0f, 16384.0f, 16384.0f};
  std::vector<uint8_t> before;
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i + 1));
    if (i == 1) before = bytes(t->masters().master());
    const std::vector<MicroBatch> mb = {batch({{0.5f, 0.25f}, {0.5f, 0.25f}, {0.5f, 0.25f}, {0.5f, 0.25f}}, 2)};
    const StepResult r = t->step(mb, 4 * comm.world_size());
    EXPECT_EQ(r.skipped, i == 1 || i == 2);
    EXPECT_FLOAT_EQ(r.lr, expected_lr[i]);
    EXPECT_EQ(r.scale, expected_scale[i]);
    if (i == 2) {
      EXPECT_EQ(bytes(t->masters().master()), before);  // master unchanged over both skipped steps
    }
  }
  EXPECT_EQ(t->optimizer_steps(), 3);
  EXPECT_EQ(t->scaler().state().skipped_steps, 2);
  const std::vector<uint64_t> h = comm.allgather_u64(t->masters().hash(), "hash");
  for (uint64_t x : h) EXPECT_EQ(x, h[0]);
}

TEST(GpuScenarios, ASkippedStepLeavesAdamWAlone) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  RunConfig cfg = cfg_of(R"(
      optimizer { adamw { beta1: 0.9 beta2: 0.999 eps: 1e-8 } lr: 0.001 weight_decay: 0.1 }
      log { every_steps: 1 }
      precision { dtype: FP32 })");
  testing::inject_nonfinite(cfg, 1, 0);
  auto t = linear_trainer(cfg, comm, 1, 1);
  // p0 = 1, gradient 1 per step (x = 1, one sample per rank, mean over ranks).
  const float one = 1.0f;
  device::copy(t->masters().master().data(), Device::kCUDA, &one, Device::kCPU, sizeof one);
  const std::vector<MicroBatch> mb = {batch({{1.0f}}, 1)};
  EXPECT_TRUE(t->step(mb, comm.world_size()).skipped);
  EXPECT_EQ(floats(t->masters().master())[0], 1.0f);
  t->step(mb, comm.world_size());
  t->step(mb, comm.world_size());
  // The CPU reference of two AdamW steps from p = 1 with g = 1 (kernels::adamw_step, bitwise equal on the GPU).
  Tensor p = host_tensor({1.0f}, DType::kFloat32), g = host_tensor({1.0f}, DType::kFloat32);
  Tensor m = Tensor::zeros({1}, DType::kFloat32), v = Tensor::zeros({1}, DType::kFloat32);
  for (int64_t s = 1; s <= 2; ++s) kernels::adamw_step(p, g, m, v, {1e-3f, 0.9, 0.999, 1e-8, 0.1f, s});
  EXPECT_EQ(floats(t->masters().master())[0], p.item(0));
  EXPECT_EQ(t->optimizer_steps(), 2);
}

// ---- a short training run on the GPU against the CPU backend -------------------------------------------------------

// The synthetic MLP job of the GPU's training tests: `train_samples` and `test_samples` of 32 features, 4 classes,
// batches of 64, SGD with momentum, `steps` steps from `seed`, and `extra` text.
std::string mlp_job(int train_samples, int test_samples, int steps, int seed, const std::string& extra) {
  return "model { mlp { hidden: [64, 32] } } data { synthetic { train_samples: " + std::to_string(train_samples) +
         " test_samples: " + std::to_string(test_samples) +
         " features: 32 classes: 4 } global_batch_size: 64 } optimizer { sgd { momentum: 0.9 } lr: 0.05 } train { "
         "steps: " + std::to_string(steps) + " seed: " + std::to_string(seed) + " } " + extra;
}

std::string synthetic_job(const std::string& dtype) {
  return mlp_job(2048, 512, 96, 7, "log { every_steps: 32 } precision { dtype: " + dtype + " }");
}

AMPDIST_GPU_TEST_COVERS(GpuTraining, MlpTrainsInEveryPrecisionAndFp32TracksTheCpu,
                        "softmax_cross_entropy_forward_to", "softmax_cross_entropy_backward_from");
TEST(GpuTraining, MlpTrainsInEveryPrecisionAndFp32TracksTheCpu) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  MpiCommunicator cpu_comm(MPI_COMM_WORLD, 60.0);
  double cpu_loss = 0.0;
  {
    auto t = make_trainer(cfg_of(synthetic_job("FP32")), cpu_comm);
    for (int i = 0; i < 96; ++i) {
      const StepResult r = t->step();
      if (i >= 64) cpu_loss += r.loss;
    }
  }
  for (const char* dtype : {"FP32", "FP16", "BF16"}) {
    SCOPED_TRACE(dtype);
    auto t = make_trainer(cfg_of(synthetic_job(dtype)), comm);
    ASSERT_EQ(t->device(), Device::kCUDA);
    t->set_state_reads(StateReads::kDueSteps);  // as the training loop: reads at the log steps (32, 64, 96)
    double first = 0.0, last = 0.0;
    for (int i = 0; i < 96; ++i) {
      const StepResult r = t->step();
      if (i == 31) first = r.loss;  // the first read: the sum over steps 1..32 of each step's share
      if (i == 95) last = r.loss;   // steps 65..96
    }
    double sums[2] = {first, last};
    comm.allreduce_f64(sums, ReduceOp::kSum, "loss");
    EXPECT_LT(sums[1], sums[0]) << "the loss must fall";
    EXPECT_TRUE(std::isfinite(sums[1]));
    const EvalResult e = t->evaluate();
    EXPECT_GT(e.accuracy(), 0.5) << "4 classes: chance is 0.25";
    if (std::string(dtype) == "FP32") {
      double c[1] = {cpu_loss};
      cpu_comm.allreduce_f64(c, ReduceOp::kSum, "cpu loss");
      // Same data, init and order; only the GEMMs' summation order differs (see the GEMM bound above): over 96
      // steps the mean loss of the last 32 steps agrees to 1% (measured drift is far smaller).
      EXPECT_NEAR(sums[1], c[0], 0.01 * c[0]);
    }
    const std::vector<uint64_t> h = comm.allgather_u64(t->masters().hash(), "hash");
    for (uint64_t x : h) EXPECT_EQ(x, h[0]) << "master weights differ across ranks";
  }
}

// ---- an asynchronous checkpoint from device state --------------------------------------------------------------

// AsyncCheckpointer copies only this rank's shard of the device buffers to page-locked staging and writes it on a
// thread; the files must be those of a blocking save of the same state (the manifest aside: it holds the path-free
// state, so it is compared whole too), and the checkpoint must load back bit for bit.
TEST(GpuCheckpoint, AnAsyncSaveFromDeviceBuffersWritesTheBlockingSavesBytes) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  testing::SharedTempDir a(comm), b(comm);
  auto t = make_trainer(cfg_of(synthetic_job("BF16")), comm);
  t->set_run_id("0123456789abcdef");
  for (int i = 0; i < 5; ++i) t->step();
  const std::string blocking = save_checkpoint(comm, t->checkpoint_state(), a.path(), 0);
  AsyncCheckpointer async(comm, b.path(), 0, nullptr);
  async.start(t->checkpoint_state(/*device_buffers=*/true));
  ASSERT_TRUE(async.in_flight());
  const std::optional<AsyncCheckpointer::Published> p = async.drain();
  ASSERT_TRUE(p.has_value());
  if (comm.rank() == 0) {
    for (const auto& e : std::filesystem::directory_iterator(blocking)) {
      const std::string name = e.path().filename().string();
      std::ifstream x(e.path(), std::ios::binary), y(p->path + "/" + name, std::ios::binary);
      const std::string bx((std::istreambuf_iterator<char>(x)), std::istreambuf_iterator<char>());
      const std::string by((std::istreambuf_iterator<char>(y)), std::istreambuf_iterator<char>());
      EXPECT_EQ(bx, by) << name << " differs between the blocking and the asynchronous save";
    }
  }
  const uint64_t before = t->masters().hash();
  auto r = make_trainer(cfg_of(synthetic_job("BF16")), comm);
  CheckpointState into = r->checkpoint_state();
  r->restore(load_checkpoint(comm, p->path, into));
  EXPECT_EQ(r->masters().hash(), before);
}

// ---- the step's modes and observers on the GPU against the CPU backend -------------------------------------------

// A shorter job of the same model for the step's modes: `extra` adds precision, fault and log settings.
std::string observed_job(const std::string& extra) { return mlp_job(512, 64, 6, 3, extra); }

AMPDIST_GPU_TEST_COVERS(GpuObservers, DropRankDropsTheSameRanksAndSamplesAsTheCpu, "check_nonfinite", "zero_if");
TEST(GpuObservers, DropRankDropsTheSameRanksAndSamplesAsTheCpu) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  MpiCommunicator cpu_comm(MPI_COMM_WORLD, 60.0);
  const int last = comm.world_size() - 1;
  const std::string cfg = observed_job(R"(
      precision { dtype: FP32 on_nonfinite: DROP_RANK }
      fault { inject_nonfinite { step: 3 rank: )" + std::to_string(last) + R"( element: 5 target: INPUT value: QNAN } })");
  auto cpu = make_trainer(cfg_of(cfg), cpu_comm);
  auto gpu = make_trainer(cfg_of(cfg), comm);
  ASSERT_EQ(gpu->device(), Device::kCUDA);
  for (int step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepResult a = cpu->step(), b = gpu->step();
    EXPECT_EQ(b.dropped_ranks, a.dropped_ranks);
    EXPECT_EQ(b.dropped_samples, a.dropped_samples);
    EXPECT_EQ(b.skipped, a.skipped);  // one rank: dropping it leaves no sample, and the step is skipped
    if (step == 3) {
      EXPECT_EQ(a.dropped_ranks, 1);
      EXPECT_EQ(a.dropped_samples, 64 / comm.world_size());
    }
  }
  // FP32 everywhere; the GEMMs' summation order differs (the GEMM bound above): after 6 SGD steps the weights agree
  // to a relative 1e-4 (lr 0.05 times gradients of order 1 times a few ulps of drift per step).
  const std::vector<float> w_cpu = floats(cpu->masters().master()), w_gpu = floats(gpu->masters().master());
  ASSERT_EQ(w_cpu.size(), w_gpu.size());
  for (size_t i = 0; i < w_cpu.size(); ++i) EXPECT_NEAR(w_gpu[i], w_cpu[i], 1e-4f * (1.0f + std::fabs(w_cpu[i]))) << i;
}

TEST(GpuObservers, NumericsReportNamesTheSameLayerAsTheCpu) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  MpiCommunicator cpu_comm(MPI_COMM_WORLD, 60.0);
  const std::string cfg = observed_job(R"(
      precision { dtype: FP16 numerics_report_every: 2 }
      fault { inject_nonfinite { step: 3 rank: 0 element: 7 target: ACTIVATION layer: "fc2" value: POS_INF } })");
  auto cpu = make_trainer(cfg_of(cfg), cpu_comm);
  auto gpu = make_trainer(cfg_of(cfg), comm);
  for (int step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepResult a = cpu->step(), b = gpu->step();
    ASSERT_EQ(static_cast<bool>(a.numerics), static_cast<bool>(b.numerics));
    if (!a.numerics) continue;
    EXPECT_EQ(b.numerics->first_nonfinite_layer, a.numerics->first_nonfinite_layer);
    EXPECT_EQ(b.numerics->first_nonfinite_pass, a.numerics->first_nonfinite_pass);
    ASSERT_EQ(b.numerics->layers.size(), a.numerics->layers.size());
    for (size_t l = 0; l < a.numerics->layers.size(); ++l) {
      const LayerNumerics &x = a.numerics->layers[l], &y = b.numerics->layers[l];
      EXPECT_EQ(y.name, x.name);
      EXPECT_EQ(y.grad_elements, x.grad_elements);
      EXPECT_EQ(std::isinf(y.act_max), std::isinf(x.act_max)) << x.name;
      // fp16 activations: the two backends' GEMMs round slightly different FP32 sums, so maxima agree to a few
      // fp16 ulps (2^-10 relative each); 1% covers them and the drift of a few SGD steps.
      if (std::isfinite(x.act_max)) {
        EXPECT_NEAR(y.act_max, x.act_max, 0.01 * x.act_max + 1e-6) << x.name;
      }
    }
  }
  EXPECT_EQ(cpu->scaler().state().skipped_steps, 1);
  EXPECT_EQ(gpu->scaler().state().skipped_steps, 1);
}

TEST(GpuObservers, PhaseTimingWithCudaEventsCoversTheDevicePhases) {
  REQUIRE_GPU_PER_RANK();
  NcclCommunicator& comm = nccl();
  auto t = make_trainer(cfg_of(observed_job("precision { dtype: BF16 } log { phase_timing: true }")), comm);
  ASSERT_NE(t->phase_timer(), nullptr);
  EXPECT_NE(dynamic_cast<CudaEventPhaseTimer*>(t->phase_timer()), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) t->step();
  t->read_now();  // the last step is done
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const PhaseTimes pt = t->phase_timer()->collect();
  EXPECT_EQ(pt.steps, 6);
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kUnscaleConsensus, Phase::kOptimizer})
    EXPECT_GT(pt[p], 0.0) << phase_name(p);
  // GPU time inside the steps cannot exceed the wall time of the steps (each phase is timed once, without overlap).
  EXPECT_LE(pt.total(), wall * 1.05 + 1e-3);
}

#endif  // AMPDIST_HAVE_CUDA

}  // namespace
}  // namespace ampdist
