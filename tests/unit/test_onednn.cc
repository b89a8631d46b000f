// The CPU backend's engine (kernels/cpu/onednn.h) and its run-time ISA dispatch (kernels/cpu/isa.h): which oneDNN
// implementation a bf16 GEMM runs, determinism for a fixed thread count, and AVX-512 paths that compute bitwise what
// their AVX2 twins compute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <oneapi/dnnl/dnnl.hpp>
#include <Eigen/Core>
#include <string>
#include <vector>

#include "runtime/core/rng.h"
#include "runtime/kernels/cpu/isa.h"
#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/math.h"
#include "runtime/kernels/transformer.h"

namespace ampdist {
namespace {

Tensor random(const Shape& shape, DType dtype, uint32_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor f = Tensor::empty(shape, DType::kFloat32);
  const RngStream rng{77, {stream, 0, 0}, RngPurpose::kSynthetic};
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = lo + (hi - lo) * rng.uniform(i);
  if (dtype == DType::kFloat32) return f;
  Tensor t = Tensor::empty(shape, dtype);
  kernels::cast(f, t);
  return t;
}

std::vector<unsigned char> bytes(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + t.nbytes()};
}

// The CPU's bf16 features as the kernel reports them (/proc/cpuinfo flags), for the skip message.
std::string cpu_bf16_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, out;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    for (const char* flag : {" amx_bf16", " avx512_bf16", " avx512f", " avx2"})
      if ((line + " ").find(std::string(flag) + " ") != std::string::npos) out += flag;
    break;
  }
  return out.empty() ? " (none of amx_bf16, avx512_bf16, avx512f, avx2)" : out;
}

TEST(OneDnn, Bf16GemmRunsOnNativeBf16HardwareWhereTheCpuHasIt) {
  if (!kernels::cpu::onednn::native_bf16())
    GTEST_SKIP() << "this CPU has no AMX-BF16 or AVX512-BF16 (flags:" << cpu_bf16_flags() << "); oneDNN runs bf16 as "
                 << kernels::cpu::onednn::implementation(DType::kBFloat16, DType::kBFloat16);
  // The path kernels::gemm takes, as oneDNN itself reports it while executing (ONEDNN_VERBOSE's exec lines).
  const Tensor a = random({64, 96}, DType::kBFloat16, 1), b = random({80, 96}, DType::kBFloat16, 2);
  Tensor c = Tensor::empty({64, 80}, DType::kBFloat16);
  Tensor g = Tensor::zeros({80, 96}, DType::kFloat32);
  dnnl::set_verbose(1);
  testing::internal::CaptureStdout();
  kernels::gemm(a, false, b, true, c);          // a Linear's forward: x W^T, bf16 out
  kernels::gemm(c, true, a, false, g, 1.0f, 1.0f);  // its weight gradient into an FP32 buffer (beta 1)
  const std::string log = testing::internal::GetCapturedStdout();
  dnnl::set_verbose(0);
  int native = 0;
  size_t pos = 0;
  while ((pos = log.find("exec,cpu,matmul,", pos)) != std::string::npos) {
    const std::string line = log.substr(pos, log.find('\n', pos) - pos);
    EXPECT_NE(line.find("src_bf16"), std::string::npos) << line;  // no conversion to f32 before the engine
    native += line.find("amx_bf16") != std::string::npos || line.find("avx512_core_bf16") != std::string::npos;
    pos += line.size();
  }
  EXPECT_EQ(native, 2) << "expected both GEMMs on an AMX or AVX512-BF16 kernel; oneDNN printed:\n" << log;
  const std::string impl = kernels::cpu::onednn::implementation(DType::kBFloat16, DType::kBFloat16);
  EXPECT_TRUE(impl.find("amx_bf16") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos)
      << impl;
}

// Where oneDNN has no bf16 kernel for the CPU (AVX2; avx512_core has only an emulation), bf16 GEMMs take the
// widening path (onednn::engine_dtype): the operands widened exactly to FP32, the FP32 GEMM, one rounding of the
// output. The contract is bitwise: the result is the FP32 GEMM of the widened operands (and widened bias), rounded
// once to bf16 when the output is bf16, for every transpose, with and without a bias (FP32 or bf16), with beta 0 and
// 1 (an FP32 output accumulated into, as a weight gradient is) and alpha != 1. The test forces the path on any CPU.
TEST(OneDnn, Bf16WideningPathIsTheFp32GemmOfTheWidenedOperandsRoundedOnce) {
  namespace onednn = kernels::cpu::onednn;
  struct Restore {
    ~Restore() { onednn::set_native_bf16_enabled(true); }
  } restore;
  onednn::set_native_bf16_enabled(false);
  EXPECT_EQ(onednn::engine_dtype(DType::kBFloat16), DType::kFloat32);
  EXPECT_NE(onednn::implementation(DType::kBFloat16, DType::kBFloat16).find("conversion of bf16 to f32"),
            std::string::npos);
  const int64_t m = 37, n = 29, k = 53;  // odd sizes: no kernel's block divides them
  const auto widened = [](const Tensor& t) {
    Tensor f = Tensor::empty(t.shape(), DType::kFloat32);
    kernels::cast(t, f);
    return f;
  };
  uint32_t stream = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int bias_kind : {0, 1, 2})  // none, FP32, bf16
        for (DType out : {DType::kBFloat16, DType::kFloat32})
          for (float beta : {0.0f, 1.0f})
            for (float alpha : {1.0f, -0.5f}) {
              if (beta != 0.0f && out != DType::kFloat32) continue;  // beta != 0 needs an FP32 C (kernels.h)
              SCOPED_TRACE(testing::Message() << "ta " << ta << " tb " << tb << " bias " << bias_kind << " out "
                                              << dtype_name(out) << " beta " << beta << " alpha " << alpha);
              const Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, DType::kBFloat16, ++stream, -3.0f, 3.0f);
              const Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, DType::kBFloat16, ++stream, -3.0f, 3.0f);
              const Tensor bias =
                  random({n}, bias_kind == 2 ? DType::kBFloat16 : DType::kFloat32, ++stream, -2.0f, 2.0f);
              const Tensor* pb = bias_kind == 0 ? nullptr : &bias;
              const Tensor c0 = random({m, n}, out, ++stream);
              Tensor c = c0.to(Device::kCPU);
              kernels::gemm(a, ta, b, tb, c, alpha, beta, pb);

              const Tensor fa = widened(a), fb = widened(b), fbias = widened(bias);
              Tensor expect = widened(c0);
              kernels::gemm(fa, ta, fb, tb, expect, alpha, beta, bias_kind == 0 ? nullptr : &fbias);
              if (out == DType::kBFloat16) {
                Tensor rounded = Tensor::empty({m, n}, DType::kBFloat16);
                kernels::cast(expect, rounded);
                expect = std::move(rounded);
              }
              EXPECT_EQ(bytes(c), bytes(expect));
            }
}

TEST(OneDnn, Fp16IsConvertedExactlyAndSaysSo) {
  // oneDNN 2.6 has no fp16 matmul on the CPU; the backend converts fp16 exactly to FP32 (contract tests in
  // test_kernels.cc), and implementation() says which path that is.
  EXPECT_NE(kernels::cpu::onednn::implementation(DType::kFloat16, DType::kFloat16).find("conversion"),
            std::string::npos);
  EXPECT_FALSE(kernels::cpu::onednn::version().empty());
}

TEST(OneDnn, GemmsAreBitwiseRepeatableForAFixedThreadCount) {
  // Every rank must compute the same bits for the same inputs. Shapes of the models' GEMMs, including a long K
  // (a weight gradient over many tokens, which oneDNN may split over threads) and the attention products.
  const kernels::ExecContext two{2, false};
  const kernels::ExecScope scope(two);
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random({512, 384}, dt, 3), w = random({256, 384}, dt, 4), dy = random({512, 256}, dt, 5);
    Tensor y1 = Tensor::empty({512, 256}, dt), y2 = Tensor::empty({512, 256}, dt);
    kernels::gemm(x, false, w, true, y1);
    kernels::gemm(x, false, w, true, y2);
    EXPECT_EQ(bytes(y1), bytes(y2));
    const Tensor a = random({8192, 64}, dt, 6), b = random({8192, 48}, dt, 7);
    Tensor g1 = random({64, 48}, DType::kFloat32, 8), g2 = g1.to(Device::kCPU);
    kernels::gemm(a, true, b, false, g1, 1.0f, 1.0f);
    kernels::gemm(a, true, b, false, g2, 1.0f, 1.0f);
    EXPECT_EQ(bytes(g1), bytes(g2));
    Tensor dx1 = Tensor::empty({512, 384}, dt), dx2 = Tensor::empty({512, 384}, dt);
    kernels::gemm(dy, false, w, false, dx1);
    kernels::gemm(dy, false, w, false, dx2);
    EXPECT_EQ(bytes(dx1), bytes(dx2));

    const kernels::AttentionShape s{3, 32, 4, 16};
    const Tensor qkv = random({96, 192}, dt, 9, -2.0f, 2.0f), dout = random({96, 64}, dt, 10);
    Tensor p1 = Tensor::empty({3, 4, 32, 32}, DType::kFloat32), p2 = p1.to(Device::kCPU);
    Tensor o1 = Tensor::empty({96, 64}, dt), o2 = Tensor::empty({96, 64}, dt);
    kernels::attention_forward(qkv, s, {}, dt, p1, o1);
    kernels::attention_forward(qkv, s, {}, dt, p2, o2);
    EXPECT_EQ(bytes(p1), bytes(p2));
    EXPECT_EQ(bytes(o1), bytes(o2));
    Tensor d1 = Tensor::empty({96, 192}, dt), d2 = Tensor::empty({96, 192}, dt);
    kernels::attention_backward(qkv, p1, s, dt, dout, d1);
    kernels::attention_backward(qkv, p1, s, dt, dout, d2);
    EXPECT_EQ(bytes(d1), bytes(d2));
  }
}

TEST(OneDnn, ExecScopesSetTheTeamAndRestoreTheOuterOne) {
  // A trainer's threads reach the engine inside its scopes only, and scopes nest: leaving one restores the team and
  // the context of the one around it (nothing of a run stays behind as a process-wide setting).
  const int outside = kernels::num_threads();
  EXPECT_EQ(kernels::current_exec_context().threads, 0);
  EXPECT_FALSE(kernels::current_exec_context().allow_tf32);
  const kernels::ExecContext one{1, true}, two{2, false}, keep{0, false};
  {
    const kernels::ExecScope a(one);
    EXPECT_EQ(kernels::num_threads(), 1);
    EXPECT_TRUE(kernels::current_exec_context().allow_tf32);
    {
      const kernels::ExecScope b(two);
#if !defined(AMPDIST_ENGINE_SINGLE_THREAD)
      EXPECT_EQ(kernels::num_threads(), 2);
#endif
      EXPECT_EQ(&kernels::current_exec_context(), &two);
      {
        const kernels::ExecScope c(keep);  // threads 0: the team stays as it is
#if !defined(AMPDIST_ENGINE_SINGLE_THREAD)
        EXPECT_EQ(kernels::num_threads(), 2);
#endif
      }
    }
    EXPECT_EQ(kernels::num_threads(), 1);
    EXPECT_EQ(&kernels::current_exec_context(), &one);
  }
#if defined(AMPDIST_ENGINE_SINGLE_THREAD)
  EXPECT_EQ(kernels::num_threads(), 1);  // this build keeps every thread's team at one, scopes or not
  (void)outside;
#else
  EXPECT_EQ(kernels::num_threads(), outside);
#endif
  EXPECT_EQ(kernels::current_exec_context().threads, 0);
}

TEST(IsaDispatch, Avx512UnscaleIsBitwiseTheAvx2Path) {
  if (!kernels::cpu::isa::avx512()) GTEST_SKIP() << "no AVX-512 on this CPU (or AMPDIST_MAX_CPU_ISA caps it): one path only";
  const int64_t n = 100003;  // not a multiple of 16: the scalar tail runs after either vector loop
  Tensor g0 = random({n}, DType::kFloat32, 11, -1e3f, 1e3f);
  g0.data_as<float>()[777] = std::numeric_limits<float>::infinity();
  for (float inv : {0.25f, 1.0f / 3.0f}) {
    Tensor a = g0.to(Device::kCPU), b = g0.to(Device::kCPU);
    kernels::cpu::isa::set_avx512_enabled(true);
    const kernels::UnscaleResult ra = kernels::unscale_and_check(a, inv);
    kernels::cpu::isa::set_avx512_enabled(false);
    const kernels::UnscaleResult rb = kernels::unscale_and_check(b, inv);
    kernels::cpu::isa::set_avx512_enabled(true);
    EXPECT_EQ(bytes(a), bytes(b));
    EXPECT_EQ(ra.found_inf, rb.found_inf);
    EXPECT_TRUE(ra.found_inf);
    EXPECT_EQ(std::memcmp(&ra.sum_sq, &rb.sum_sq, sizeof(double)), 0) << ra.sum_sq << " vs " << rb.sum_sq;
  }
}

TEST(CpuFastPaths, UnscaleSumDependsOnTheLengthNotTheThreadCount) {
  // Past 2^20 elements the pass runs in chunks of 2^20 on the rank's threads, each chunk in its own 16 lanes, and adds
  // the chunks' lanes in chunk order. 3.5 chunks: one thread and two must give the same bits (sum, flag, buffer), and
  // the sum must be the order the definition names, recomputed here serially in double.
  const int64_t chunk = int64_t{1} << 20, n = 3 * chunk + chunk / 2 + 5;
  const Tensor g0 = random({n}, DType::kFloat32, 21, -3.0f, 3.0f);
  for (float inv : {1.0f, 0.125f}) {
    SCOPED_TRACE(inv);
    Tensor a = g0.to(Device::kCPU), b = g0.to(Device::kCPU);
    const kernels::ExecContext one{1, false}, two{2, false};
    kernels::UnscaleResult ra, rb;
    {
      const kernels::ExecScope scope(one);
      ra = kernels::unscale_and_check(a, inv);
    }
    {
      const kernels::ExecScope scope(two);
      rb = kernels::unscale_and_check(b, inv);
    }
    EXPECT_EQ(bytes(a), bytes(b));
    EXPECT_FALSE(ra.found_inf);
    EXPECT_FALSE(rb.found_inf);
    EXPECT_EQ(std::memcmp(&ra.sum_sq, &rb.sum_sq, sizeof(double)), 0) << ra.sum_sq << " vs " << rb.sum_sq;
    double lanes[16] = {};
    const float* g = g0.data_as<float>();
    for (int64_t c = 0; c * chunk < n; ++c) {
      double part[16] = {};
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
        const float v = math::unscale(g[i], inv);
        part[(i - c * chunk) % 16] += static_cast<double>(v) * v;
      }
      for (int l = 0; l < 16; ++l) lanes[l] += part[l];
    }
    for (int step = 1; step < 16; step *= 2)
      for (int l = 0; l + step < 16; l += 2 * step) lanes[l] += lanes[l + step];
    EXPECT_EQ(std::memcmp(&ra.sum_sq, &lanes[0], sizeof(double)), 0) << ra.sum_sq << " vs " << lanes[0];
  }
  // One non-finite element in the last chunk reaches the flag from whichever thread ran that chunk.
  Tensor c = g0.to(Device::kCPU);
  c.data_as<float>()[n - 3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(kernels::unscale_and_check(c, 1.0f).found_inf);
}

TEST(CpuFastPaths, SixteenBitReluBlocksAreBitwiseThePerElementRounding) {
  // The 16-bit element-wise ops widen blocks of 1024 elements, apply the FP32 function and round the block back.
  // Every fp16 / bf16 bit pattern (NaN and inf included) must come out as rounding math::relu / math::relu_backward
  // of that element once, through the scalar conversion (a NaN's sign and quiet bit included). 66,573 elements:
  // 65 whole blocks and a partial one, over both threads' ranges.
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 65536 + 1037;
    Tensor x = Tensor::empty({n}, dt), dy = Tensor::empty({n}, dt), y = Tensor::empty({n}, dt);
    Tensor dx = Tensor::empty({n}, dt);
    auto* xb = static_cast<uint16_t*>(x.data());
    auto* db = static_cast<uint16_t*>(dy.data());
    for (int64_t i = 0; i < n; ++i) {
      xb[i] = static_cast<uint16_t>(i & 0xFFFF);
      db[i] = static_cast<uint16_t>((i * 40503) & 0xFFFF);
    }
    kernels::relu_forward(x, y);
    kernels::relu_backward(x, dy, dx);
    auto round16 = [&](float v) -> uint16_t {
      if (dt == DType::kBFloat16) return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(v));
      return Eigen::numext::bit_cast<uint16_t>(Eigen::half(v));
    };
    for (int64_t i = 0; i < n; ++i) {
      const float xv = x.item(i), dv = dy.item(i);
      ASSERT_EQ(static_cast<const uint16_t*>(y.data())[i], round16(math::relu(xv))) << "relu, x bits " << xb[i];
      ASSERT_EQ(static_cast<const uint16_t*>(dx.data())[i], round16(math::relu_backward(xv, dv)))
          << "relu', x bits " << xb[i] << ", dy bits " << db[i];
    }
  }
}

TEST(CpuFastPaths, SixteenBitSumRowsIsBitwiseTheSerialColumnSums) {
  // sum_rows widens 16-bit row segments of up to 1024 columns and adds them: each column must still be the FP32 sum
  // of its rows in row order, as a serial loop over the scalar conversions gives (beta 0 and beta 1, bits compared).
  // 3 x 1024 + 77 columns: whole and partial segments, over both threads' column ranges; values over many binades,
  // infinities and NaNs among them.
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t rows = 37, cols = 3 * 1024 + 77;
    Tensor x = Tensor::empty({rows, cols}, dt);
    auto* xb = static_cast<uint16_t*>(x.data());
    for (int64_t i = 0; i < rows * cols; ++i) xb[i] = static_cast<uint16_t>((i * 2654435761u) >> 16);
    Tensor out = Tensor::empty({cols}, DType::kFloat32);
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want(static_cast<size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) {
        float acc = beta == 0.0f ? 0.0f : beta * 0.5f;
        for (int64_t i = 0; i < rows; ++i) acc += x.item(i * cols + j);
        want[static_cast<size_t>(j)] = acc;
      }
      for (int64_t j = 0; j < cols; ++j) out.data_as<float>()[j] = 0.5f;
      kernels::sum_rows(x, out, beta);
      for (int64_t j = 0; j < cols; ++j) {
        const float got = out.item(j), w = want[static_cast<size_t>(j)];
        ASSERT_TRUE(std::memcmp(&got, &w, sizeof got) == 0 || (std::isnan(got) && std::isnan(w)))
            << "column " << j << " beta " << beta << ": " << got << " vs " << w;
      }
    }
  }
}

TEST(CpuFastPaths, SixteenBitGeluTablesAreBitwiseTheFormulas) {
  // Every fp16 / bf16 bit pattern (NaN and inf included) through gelu_forward and gelu_backward against
  // math::gelu / math::gelu_backward evaluated per element and rounded once, as the FP32 path does.
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 65536;
    Tensor x = Tensor::empty({n}, dt), dy = Tensor::empty({n}, dt), y = Tensor::empty({n}, dt);
    Tensor dx = Tensor::empty({n}, dt);
    auto* xb = static_cast<uint16_t*>(x.data());
    auto* db = static_cast<uint16_t*>(dy.data());
    for (int64_t i = 0; i < n; ++i) {
      xb[i] = static_cast<uint16_t>(i);
      db[i] = static_cast<uint16_t>((i * 40503) & 0xFFFF);  // another permutation of all patterns
    }
    kernels::gelu_forward(x, y);
    kernels::gelu_backward(x, dy, dx);
    Tensor one = Tensor::empty({1}, dt);
    for (int64_t i = 0; i < n; ++i) {
      const float xv = x.item(i), dv = dy.item(i);
      Tensor want_y = Tensor::empty({1}, DType::kFloat32), want_dx = Tensor::empty({1}, DType::kFloat32);
      want_y.data_as<float>()[0] = math::gelu(xv);
      want_dx.data_as<float>()[0] = math::gelu_backward(xv, dv);
      kernels::cast(want_y, one);
      const uint16_t wy = *static_cast<const uint16_t*>(one.data());
      kernels::cast(want_dx, one);
      const uint16_t wdx = *static_cast<const uint16_t*>(one.data());
      const uint16_t gy = static_cast<const uint16_t*>(y.data())[i], gdx = static_cast<const uint16_t*>(dx.data())[i];
      if (std::isnan(math::gelu(xv))) {
        EXPECT_TRUE(std::isnan(y.item(i))) << "x bits " << i;
      } else {
        ASSERT_EQ(gy, wy) << "gelu, x bits " << i;
      }
      if (std::isnan(math::gelu_backward(xv, dv))) {
        EXPECT_TRUE(std::isnan(dx.item(i))) << "x bits " << i;
      } else {
        ASSERT_EQ(gdx, wdx) << "gelu', x bits " << i << ", dy bits " << db[i];
      }
    }
  }
}

}  // namespace
}  // namespace ampdist
