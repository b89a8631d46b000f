// CPU backend of kernels.h: oneDNN for GEMMs (cpu/onednn.h), loops over kernels/math.h for everything element-wise.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/kernels/checks.h"
#include "runtime/kernels/cpu/convert.h"
#include "runtime/kernels/cpu/isa.h"
#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/cpu/parallel.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/math.h"

namespace ampdist::kernels::cpu {
namespace {

void require_cpu(const char* op, const Tensor& t) {
  if (t.device() != Device::kCPU) throw Error(std::string(op) + ": tensor on " + device_name(t.device()) +
                                              ", this build has only the CPU backend");
}

void require_numel(const char* op, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel())
    throw Error(std::string(op) + ": element counts differ: " + shape_str(a.shape()) + " vs " + shape_str(b.shape()));
}

template <typename T> inline float to_f(T x) { return static_cast<float>(x); }
template <typename T> inline T from_f(float x) { return static_cast<T>(x); }

// dst[0..n) = src[0..n) converted: 16-bit to FP32 and FP32 to bf16 through convert.h's vectorised loops, the rest
// through Eigen's casts. Split over the rank's threads (parallel.h) for large buffers: each element's conversion is
// the same.
template <typename S, typename D>
void convert_run(const S* src, D* dst, int64_t n) {
  if constexpr (std::is_same_v<D, float> && !std::is_same_v<S, float>) {
    widen_block(src, dst, n);
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bfloat16>) {
    narrow_block(src, dst, n);
  } else {
    Eigen::Map<Eigen::Array<D, Eigen::Dynamic, 1>>(dst, n) =
        Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(src, n).template cast<D>();
  }
}
template <typename S, typename D>
void convert(const S* src, D* dst, int64_t n) {
  parallel_ranges(n, int64_t{1} << 16, [&](int64_t b, int64_t e) { convert_run(src + b, dst + b, e - b); });
}

// The FP32 operands of one widened GEMM, in one buffer per thread: A, B, C (for a 16-bit output) and the bias, each
// present only when it needs widening. One buffer sized for the largest call holds less than a buffer per operand
// sized for that operand's largest call (the GPT-2-small-shaped model's bf16 step on the widening path: 72 MiB
// against 150 MiB, which is a tenth of its peak memory); it grows to the largest request and is then reused.
class WideningArena {
 public:
  // Reserves room for the FP32 copies of these tensors (null ones and FP32 ones take none).
  void reserve(std::initializer_list<const Tensor*> tensors) {
    size_t need = 0;
    for (const Tensor* t : tensors)
      if (t != nullptr && t->dtype() != DType::kFloat32) need += static_cast<size_t>(t->numel());
    if (buf_.size() < need) buf_.resize(need);
    used_ = 0;
  }
  // An FP32 region of n floats from the reserved room.
  float* take(int64_t n) {
    float* p = buf_.data() + used_;
    used_ += static_cast<size_t>(n);
    return p;
  }
  // t's data as FP32: t itself when it already is, else its exact widening into the next region.
  const float* widen(const Tensor& t) {
    if (t.dtype() == DType::kFloat32) return t.data_as<float>();
    float* out = take(t.numel());
    dispatch_dtype(t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      convert(static_cast<const T*>(t.data()), out, t.numel());
    });
    return out;
  }

 private:
  std::vector<float> buf_;
  size_t used_ = 0;
};

}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  require_cpu("cast", src);
  require_cpu("cast", dst);
  require_numel("cast", src, dst);
  if (src.dtype() == dst.dtype()) {
    if (src.data() != dst.data()) std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  dispatch_dtype(src.dtype(), [&](auto stag) {
    using S = decltype(stag);
    dispatch_dtype(dst.dtype(), [&](auto dtag) {
      using D = decltype(dtag);
      if constexpr (std::is_same_v<S, D>) {
        std::memcpy(dst.data(), src.data(), src.nbytes());
      } else if constexpr (std::is_same_v<S, float> || std::is_same_v<D, float>) {
        convert(static_cast<const S*>(src.data()), static_cast<D*>(dst.data()), src.numel());
      } else {  // fp16 <-> bf16: through FP32, exactly what a float round trip does
        const S* s = static_cast<const S*>(src.data());
        D* d = static_cast<D*>(dst.data());
        for (int64_t i = 0, n = src.numel(); i < n; ++i) d[i] = from_f<D>(to_f(s[i]));
      }
    });
  });
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
          const Tensor* bias) {
  require_cpu("gemm", a);
  require_cpu("gemm", b);
  require_cpu("gemm", c);
  const GemmShape shape = check_gemm(a, trans_a, b, trans_b, c, beta, bias);
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  if (m == 0 || n == 0) return;
  thread_local WideningArena arena;

  if (onednn::engine_dtype(a.dtype()) == DType::kBFloat16 && k > 0) {
    // oneDNN's bf16 matmul: exact products, FP32 accumulation, the bias added in FP32 and one rounding into C.
    // It scales the bias with alpha, so with alpha != 1 the bias is added to an FP32 result here instead.
    const bool bias_in_engine = bias && alpha == 1.0f && bias->dtype() != DType::kFloat16;
    const bool fp32_first = bias && !bias_in_engine && c.dtype() != DType::kFloat32;
    onednn::Matmul mm;
    mm.m = m;
    mm.n = n;
    mm.k = k;
    mm.ab_dtype = DType::kBFloat16;
    mm.c_dtype = fp32_first ? DType::kFloat32 : c.dtype();
    mm.bias_dtype = bias_in_engine ? bias->dtype() : DType::kFloat32;
    mm.a_stride[1] = trans_a ? 1 : a.dim(1);
    mm.a_stride[2] = trans_a ? a.dim(1) : 1;
    mm.b_stride[1] = trans_b ? 1 : b.dim(1);
    mm.b_stride[2] = trans_b ? b.dim(1) : 1;
    mm.c_stride[1] = n;
    mm.c_stride[2] = 1;
    mm.alpha = alpha;
    mm.beta = beta;
    arena.reserve({fp32_first ? &c : nullptr, bias && !bias_in_engine ? bias : nullptr});
    float* fc = fp32_first ? arena.take(c.numel()) : nullptr;
    onednn::matmul(mm, a.data(), b.data(), fp32_first ? static_cast<void*>(fc) : c.data(),
                   bias_in_engine ? bias->data() : nullptr);
    if (bias && !bias_in_engine) {
      const float* fbias = arena.widen(*bias);
      float* out = fp32_first ? fc : c.data_as<float>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) out[i * n + j] += fbias[j];
      if (fp32_first) convert(fc, static_cast<bfloat16*>(c.data()), m * n);
    }
    return;
  }

  // FP32 (fp16, and bf16 without bf16 hardware, converted exactly): oneDNN's sgemm. The bias is written into C
  // first and sgemm adds the product to it (beta 1), so acc + bias is rounded once inside the kernel.
  arena.reserve({&a, &b, &c, bias});
  const float* fa = arena.widen(a);
  const float* fb = arena.widen(b);
  float* fc = c.dtype() == DType::kFloat32 ? c.data_as<float>() : arena.take(c.numel());
  float beta_eff = beta;
  if (bias) {
    const float* fbias = arena.widen(*bias);
    // Rows over the threads (each row's values are the same whoever writes them): serial, this broadcast was 3% of
    // the fortunes GPT's FP32 step with the second thread idle (perf).
    parallel_ranges(m, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        float* row = fc + i * n;
        if (beta == 0.0f) {
          std::memcpy(row, fbias, static_cast<size_t>(n) * sizeof(float));
        } else {
          for (int64_t j = 0; j < n; ++j) row[j] = beta * row[j] + fbias[j];
        }
      }
    });
    beta_eff = 1.0f;
  }
  if (k == 0) {
    if (!bias)
      for (int64_t i = 0; i < m * n; ++i) fc[i] = beta == 0.0f ? 0.0f : beta * fc[i];
  } else {
    onednn::sgemm(trans_a, trans_b, m, n, k, alpha, fa, a.dim(1), fb, b.dim(1), beta_eff, fc, n);
  }
  if (c.dtype() != DType::kFloat32) {
    dispatch_dtype(c.dtype(), [&](auto tag) {
      using T = decltype(tag);
      convert(fc, static_cast<T*>(c.data()), m * n);
    });
  }
}

namespace {
// 16-bit element-wise ops (and sum_rows' 16-bit rows) run on blocks of kBlock elements: widen the block to FP32
// (convert.h), apply the FP32 function, round the block back, with the bits of the per-element conversions.
constexpr int64_t kBlock = 1024;
}  // namespace

void sum_rows(const Tensor& x, Tensor& out, float beta) {
  require_cpu("sum_rows", x);
  if (x.ndim() != 2 || out.numel() != x.dim(1))
    throw Error("sum_rows: x " + shape_str(x.shape()) + " and out " + shape_str(out.shape()) + " do not match");
  float* o = out.data_as<float>();
  const int64_t rows = x.dim(0), cols = x.dim(1);
  for (int64_t j = 0; j < cols; ++j) o[j] = beta == 0.0f ? 0.0f : beta * o[j];
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data());
    // Column blocks over the threads; each column still sums its rows in order (bitwise the serial result).
    parallel_ranges(cols, 256, [&](int64_t jb, int64_t je) {
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = jb; j < je; ++j) o[j] += p[i * cols + j];
      } else {
        // A 16-bit row segment widened as a block (convert.h), then added: both loops vectorise, where one
        // conversion per element did not (3.4% of the GPT-2-small-shaped model's bf16 step, its bias gradients).
        alignas(64) float row[kBlock];
        for (int64_t j0 = jb; j0 < je; j0 += kBlock) {
          const int64_t w = std::min(kBlock, je - j0);
          for (int64_t i = 0; i < rows; ++i) {
            widen_block(p + i * cols + j0, row, w);
            float* oj = o + j0;
            for (int64_t j = 0; j < w; ++j) oj[j] += row[j];
          }
        }
      }
    });
  });
}

namespace {
template <typename F>
void unary(const char* op, const Tensor& x, Tensor& y, F f) {
  require_cpu(op, x);
  require_numel(op, x, y);
  if (x.dtype() != y.dtype()) throw Error(std::string(op) + ": input and output dtypes differ");
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    parallel_ranges(x.numel(), 8192, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t i = b; i < e; ++i) py[i] = f(px[i]);
      } else {
        alignas(64) float xf[kBlock];
        for (int64_t k = b; k < e; k += kBlock) {
          const int64_t m = std::min(kBlock, e - k);
          widen_block(px + k, xf, m);
          for (int64_t i = 0; i < m; ++i) xf[i] = f(xf[i]);
          narrow_block(xf, py + k, m);
        }
      }
    });
  });
}
template <typename F>
void binary(const char* op, const Tensor& x, const Tensor& dy, Tensor& dx, F f) {
  require_cpu(op, x);
  require_numel(op, x, dy);
  require_numel(op, x, dx);
  if (x.dtype() != dy.dtype() || x.dtype() != dx.dtype()) throw Error(std::string(op) + ": dtypes differ");
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data());
    const T* pdy = static_cast<const T*>(dy.data());
    T* pdx = static_cast<T*>(dx.data());
    parallel_ranges(x.numel(), 8192, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t i = b; i < e; ++i) pdx[i] = f(px[i], pdy[i]);
      } else {
        alignas(64) float xf[kBlock], df[kBlock];
        for (int64_t k = b; k < e; k += kBlock) {
          const int64_t m = std::min(kBlock, e - k);
          widen_block(px + k, xf, m);
          widen_block(pdy + k, df, m);
          for (int64_t i = 0; i < m; ++i) xf[i] = f(xf[i], df[i]);
          narrow_block(xf, pdx + k, m);
        }
      }
    });
  });
}
}  // namespace

void relu_forward(const Tensor& x, Tensor& y) { unary("relu", x, y, [](float v) { return math::relu(v); }); }
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  binary("relu_backward", y, dy, dx, [](float v, float d) { return math::relu_backward(v, d); });
}
namespace {
// GELU of a 16-bit input has 65536 possible inputs: tables of math::gelu rounded to T, and of math::gelu_backward's
// factor D(x) (gelu_backward(x, dy) = dy * D(x), the formula's last operation), computed once from the formulas,
// give bitwise the same results as evaluating them per element, without an expf per element.
template <typename T>
struct GeluTables {
  std::vector<T> y;
  std::vector<float> d;
  GeluTables() : y(65536), d(65536) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const float x = to_f(Eigen::numext::bit_cast<T>(static_cast<uint16_t>(b)));
      y[b] = from_f<T>(math::gelu(x));
      d[b] = math::gelu_backward(x, 1.0f);
    }
  }
  static const GeluTables& get() {
    static const GeluTables t;
    return t;
  }
};
template <typename T>
uint16_t bits_of(T v) {
  return Eigen::numext::bit_cast<uint16_t>(v);
}

// FP32 GELU in blocks of kBlock elements: the argument 2u of each element (math.h's gelu_arg / gelu_backward_arg), e
// = exp(2u) for the whole block through Eigen's vectorised exp, then math.h's *_from_exp formula. glibc's expf, one
// call per element, kept the loop scalar and was about a quarter of the fortunes GPT's FP32 step (perf). Eigen's exp
// (AVX2 packets in this build) is within 1 ulp of the correctly rounded value for every argument in [-87, 88] (all
// 2^32 floats checked against exp in double rounded to float: never more than 1 ulp, 3.5% not correctly rounded),
// the bound glibc's expf has and that the GPU tests' GELU bracket assumes (tests/gpu/gelu_bound.h). Outside that
// range e + 1 rounds to 1 (2u < -16.6) or 2 / (e + 1) to 0 (2u > 88), so that e's error cannot reach the result.
// The exp always runs on a whole fixed-size block (padding past the end), because Eigen's scalar tail would call
// std::exp: the bits then do not depend on where a thread's range starts or ends.
template <bool kBackward>
void gelu_fp32(const float* x, const float* dy, float* out, int64_t n) {
  parallel_ranges(n, 8192, [&](int64_t b, int64_t e) {
    Eigen::Array<float, kBlock, 1> arg;
    for (int64_t k = b; k < e; k += kBlock) {
      const int64_t m = std::min(kBlock, e - k);
      const float* px = x + k;
      for (int64_t i = 0; i < m; ++i) arg[i] = 2.0f * (kBackward ? math::gelu_backward_arg(px[i]) : math::gelu_arg(px[i]));
      for (int64_t i = m; i < kBlock; ++i) arg[i] = 0.0f;
      arg = arg.exp();
      float* po = out + k;
      if constexpr (kBackward) {
        const float* pd = dy + k;
        for (int64_t i = 0; i < m; ++i) po[i] = math::gelu_backward_from_exp(px[i], pd[i], arg[i]);
      } else {
        for (int64_t i = 0; i < m; ++i) po[i] = math::gelu_from_exp(px[i], arg[i]);
      }
    }
  });
}
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  if (x.dtype() == y.dtype() && x.numel() == y.numel() && x.device() == Device::kCPU && y.device() == Device::kCPU) {
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>) {
        gelu_fp32<false>(x.data_as<float>(), nullptr, y.data_as<float>(), x.numel());
      } else {
        const T* px = static_cast<const T*>(x.data());
        T* py = static_cast<T*>(y.data());
        const T* table = GeluTables<T>::get().y.data();
        parallel_ranges(x.numel(), 8192, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) py[i] = table[bits_of(px[i])];
        });
      }
    });
    return;
  }
  unary("gelu", x, y, [](float v) { return math::gelu(v); });  // throws the mismatch
}
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (x.dtype() == dy.dtype() && x.dtype() == dx.dtype() && x.numel() == dy.numel() && x.numel() == dx.numel() &&
      x.device() == Device::kCPU && dy.device() == Device::kCPU && dx.device() == Device::kCPU) {
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>) {
        gelu_fp32<true>(x.data_as<float>(), dy.data_as<float>(), dx.data_as<float>(), x.numel());
      } else {
        const T* px = static_cast<const T*>(x.data());
        const T* pdy = static_cast<const T*>(dy.data());
        T* pdx = static_cast<T*>(dx.data());
        const float* table = GeluTables<T>::get().d.data();
        parallel_ranges(x.numel(), 8192, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) pdx[i] = from_f<T>(to_f(pdy[i]) * table[bits_of(px[i])]);
        });
      }
    });
    return;
  }
  binary("gelu_backward", x, dy, dx, [](float v, float d) { return math::gelu_backward(v, d); });  // throws
}

namespace {
void check_ce(const char* op, const Tensor& logits, std::span<const int32_t> targets) {
  require_cpu(op, logits);
  if (logits.ndim() != 2 || static_cast<int64_t>(targets.size()) != logits.dim(0))
    throw Error(std::string(op) + ": logits " + shape_str(logits.shape()) + " and " +
                std::to_string(targets.size()) + " targets do not match");
  const int64_t classes = logits.dim(1);
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i] < 0 || targets[i] >= classes)
      throw Error(std::string(op) + ": target " + std::to_string(targets[i]) + " of row " + std::to_string(i) +
                      " is outside [0, " + std::to_string(classes) + ")",
                  ErrorKind::kBadInput);
}
}  // namespace

double softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& lse) {
  check_ce("softmax_cross_entropy", logits, targets);
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  lse.ensure({rows}, DType::kFloat32);
  float* plse = lse.data_as<float>();
  double total = 0.0;
  dispatch_dtype(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* z = static_cast<const T*>(logits.data());
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = z + i * cols;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, to_f(row[j]));
      float s = 0.0f;
      for (int64_t j = 0; j < cols; ++j) s += std::exp(to_f(row[j]) - mx);
      // A row holding NaN or inf gives a non-finite loss here, and the step is skipped by the consensus.
      float l = mx + std::log(s);
      plse[i] = l;
      total += static_cast<double>(l - to_f(row[targets[i]]));
    }
  });
  return total;
}

void softmax_cross_entropy_backward(const Tensor& logits, std::span<const int32_t> targets, const Tensor& lse,
                                    float grad_scale, Tensor& dlogits) {
  check_ce("softmax_cross_entropy_backward", logits, targets);
  require_numel("softmax_cross_entropy_backward", logits, dlogits);
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  const float* plse = lse.data_as<float>();
  dispatch_dtype(logits.dtype(), [&](auto in_tag) {
    using T = decltype(in_tag);
    dispatch_dtype(dlogits.dtype(), [&](auto out_tag) {
      using D = decltype(out_tag);
      const T* z = static_cast<const T*>(logits.data());
      D* dz = static_cast<D*>(dlogits.data());
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          float p = std::exp(to_f(z[i * cols + j]) - plse[i]);
          float onehot = j == targets[i] ? 1.0f : 0.0f;
          dz[i * cols + j] = from_f<D>(grad_scale * (p - onehot));
        }
      }
    });
  });
}

int64_t count_correct(const Tensor& logits, std::span<const int32_t> targets) {
  check_ce("count_correct", logits, targets);
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  int64_t correct = 0;
  dispatch_dtype(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* z = static_cast<const T*>(logits.data());
    for (int64_t i = 0; i < rows; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < cols; ++j)
        if (to_f(z[i * cols + j]) > to_f(z[i * cols + best])) best = j;
      correct += best == targets[i];
    }
  });
  return correct;
}

namespace avx512 {
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized misreads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// unscale_and_check's vector loop on AVX-512: the same 16 lanes (lane = index % 16, lanes 0-7 in the first double
// register, 8-15 in the second), the same float multiply, finiteness test and double multiply-then-add per lane as
// the AVX2 loop, so acc[] is bitwise what that loop leaves. Returns the number of elements done (a multiple of 16).
__attribute__((target("avx512f,avx512dq"))) int64_t unscale_lanes(float* g, int64_t n, float inv_scale,
                                                                   double* acc, int* bad, bool store) {
  const __m512 vinv = _mm512_set1_ps(inv_scale), zero = _mm512_setzero_ps();
  __m512d lo_acc = _mm512_loadu_pd(acc), hi_acc = _mm512_loadu_pd(acc + 8);
  __mmask16 badm = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(g + i), vinv);
    if (store) _mm512_storeu_ps(g + i, v);
    const __m512 d = _mm512_sub_ps(v, v);  // math::is_finite
    const __mmask16 finite = _mm512_cmp_ps_mask(d, zero, _CMP_EQ_OQ);
    badm |= _mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ);
    const __m512 vf = _mm512_maskz_mov_ps(finite, v);  // non-finite elements add 0
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(vf));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(vf, 1));
    lo_acc = _mm512_add_pd(lo_acc, _mm512_mul_pd(lo, lo));
    hi_acc = _mm512_add_pd(hi_acc, _mm512_mul_pd(hi, hi));
  }
  _mm512_storeu_pd(acc, lo_acc);
  _mm512_storeu_pd(acc + 8, hi_acc);
  *bad |= badm != 0;
  return i;
}
#pragma GCC diagnostic pop
}  // namespace avx512

namespace {
constexpr int kUnscaleLanes = 16;
// One chunk of unscale_and_check: g[0..n) *= inv_scale (when store), *bad |= any non-finite, acc[lane] += v * v of
// the finite elements, lane = index % 16 counted from the chunk's start.
void unscale_chunk(float* g, int64_t n, float inv_scale, bool store, double* acc, int* bad) {
  int64_t i = 0;
  if (isa::avx512()) i = avx512::unscale_lanes(g, n, inv_scale, acc, bad, store);
#if defined(__AVX__)
  else {
    const __m256 vinv = _mm256_set1_ps(inv_scale), zero = _mm256_setzero_ps();
    __m256d a[4] = {_mm256_load_pd(acc), _mm256_load_pd(acc + 4), _mm256_load_pd(acc + 8), _mm256_load_pd(acc + 12)};
    __m256 badv = zero;
    for (; i + kUnscaleLanes <= n; i += kUnscaleLanes) {
      for (int h = 0; h < 2; ++h) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(g + i + 8 * h), vinv);
        if (store) _mm256_storeu_ps(g + i + 8 * h, v);
        const __m256 d = _mm256_sub_ps(v, v);  // math::is_finite: v - v is 0 for finite v, NaN for inf and NaN
        const __m256 finite = _mm256_cmp_ps(d, zero, _CMP_EQ_OQ);
        badv = _mm256_or_ps(badv, _mm256_cmp_ps(d, zero, _CMP_NEQ_UQ));
        const __m256 vf = _mm256_and_ps(v, finite);  // non-finite elements add 0
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(vf));
        const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(vf, 1));
        a[2 * h] = _mm256_add_pd(a[2 * h], _mm256_mul_pd(lo, lo));
        a[2 * h + 1] = _mm256_add_pd(a[2 * h + 1], _mm256_mul_pd(hi, hi));
      }
    }
    for (int k = 0; k < 4; ++k) _mm256_store_pd(acc + 4 * k, a[k]);
    *bad |= _mm256_movemask_ps(badv) != 0;
  }
#endif
  for (; i < n; ++i) {
    const float v = math::unscale(g[i], inv_scale);
    if (store) g[i] = v;
    const bool finite = math::is_finite(v);
    *bad |= !finite;
    acc[i % kUnscaleLanes] += finite ? static_cast<double>(v) * v : 0.0;
  }
}
}  // namespace

UnscaleResult unscale_and_check(Tensor& grads, float inv_scale) {
  require_cpu("unscale_and_check", grads);
  float* g = grads.data_as<float>();
  const int64_t n = grads.numel();
  // Sixteen independent partial sums (lane = index % 16), added in a fixed order at the end. One serial chain of
  // double additions holds the pass to one element per add latency (about 4 cycles), several times below memory
  // bandwidth, and strict FP semantics (no -ffast-math) forbid the compiler from splitting it. The AVX-512 path
  // (chosen at run time), the AVX path and the portable loop use the same lanes, the same operations (multiply,
  // then add: no FMA) and the same final order, so the sum is bitwise the same on every build, run and rank.
  // A buffer of more than kChunk elements is cut into chunks of kChunk (the last shorter), summed each in its own 16
  // lanes on the rank's threads; the chunks' lanes are then added lane by lane in chunk order. The order depends on n
  // only, never on the thread count. One thread read the 100M MLP's 400 MB in about 57 ms per step (7 GB/s).
  constexpr int64_t kChunk = int64_t{1} << 20;
  // At a scale of 1 (fp32, bf16, and fp16 whenever the scale is 1) g * 1 is g for every finite float (no flush to
  // zero here) and every NaN stays a NaN, which skips the step: the pass only reads, half the memory traffic.
  const bool store = inv_scale != 1.0f;
  alignas(32) double acc[kUnscaleLanes] = {};
  int bad = 0;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    unscale_chunk(g, n, inv_scale, store, acc, &bad);
  } else {
    struct alignas(64) Part {
      double acc[kUnscaleLanes] = {};
      int bad = 0;
    };
    std::vector<Part> parts(static_cast<size_t>(chunks));
    parallel_ranges(chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c)
        unscale_chunk(g + c * kChunk, std::min(kChunk, n - c * kChunk), inv_scale, store, parts[c].acc, &parts[c].bad);
    });
    for (const Part& p : parts) {
      for (int l = 0; l < kUnscaleLanes; ++l) acc[l] += p.acc[l];
      bad |= p.bad;
    }
  }
  for (int step = 1; step < kUnscaleLanes; step *= 2)  // pairwise: (0+1), (2+3), ..., then ((0+1)+(2+3)), ...
    for (int l = 0; l + step < kUnscaleLanes; l += 2 * step) acc[l] += acc[l + step];
  UnscaleResult r;
  r.found_inf = bad != 0;
  r.sum_sq = acc[0];
  return r;
}

void unscale_and_check(Tensor& grads, const float* inv_scale, float* found_inf, double* sum_sq) {
  const UnscaleResult u = unscale_and_check(grads, *inv_scale);
  if (u.found_inf) *found_inf = 1.0f;
  *sum_sq += u.sum_sq;
}

void check_nonfinite(const Tensor& x, float* bad) {
  require_cpu("check_nonfinite", x);
  const float* p = x.data_as<float>();
  bool b = false;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) b |= !math::is_finite(p[i]);
  if (b) *bad = 1.0f;
}

void copy_unless(Tensor& dst, const Tensor& src, const int32_t* flag) {
  require_cpu("copy_unless", dst);
  require_cpu("copy_unless", src);
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype())
    throw Error("copy_unless: " + shape_str(src.shape()) + " " + dtype_name(src.dtype()) + " into " +
                shape_str(dst.shape()) + " " + dtype_name(dst.dtype()));
  if (*flag == 0 && dst.nbytes() > 0) std::memcpy(dst.data(), src.data(), dst.nbytes());
}

void zero_if(Tensor& x, const float* flag) {
  require_cpu("zero_if", x);
  if (*flag > 0.0f) std::memset(x.data(), 0, x.nbytes());
}

AbsStats abs_stats(const Tensor& x, float threshold) {
  require_cpu("abs_stats", x);
  AbsStats s;
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data_as<T>();
    float m = 0.0f;
    bool bad = false;
    int64_t below = 0;
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const float v = std::fabs(static_cast<float>(p[i]));
      const bool finite = v <= std::numeric_limits<float>::max();  // false for inf and NaN
      bad |= !finite;
      m = finite && v > m ? v : m;  // the maximum over the finite elements (kernels.h), as the CUDA kernel
      below += (v != 0.0f && v <= threshold) ? 1 : 0;
    }
    s.max_abs = m;
    s.nonfinite = bad;
    s.below = below;
  });
  return s;
}

double sum_squares(const Tensor& x) {
  require_cpu("sum_squares", x);
  const float* p = x.data_as<float>();
  double s = 0.0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

void sum_squares(const Tensor& x, double* out) { *out = sum_squares(x); }

void scale_inplace(Tensor& x, float factor) {
  require_cpu("scale_inplace", x);
  float* p = x.data_as<float>();
  parallel_ranges(x.numel(), int64_t{1} << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] *= factor;
  });
}

namespace {
// Runs update(b, e), which updates the FP32 params w[b..e), over [0, n) split over the threads. With a working copy
// each thread's range goes in blocks of 4096 elements (16 KiB of FP32, in L1 cache) and each block is rounded into
// the working copy right after its update (the conversion cast() uses), so the copy costs one 2-byte write an
// element instead of a second pass over the master weights.
template <typename F>
void update_and_round(float* w, int64_t n, Tensor* working, F update) {
  if (!working) {
    parallel_ranges(n, int64_t{1} << 16, update);
    return;
  }
  dispatch_dtype(working->dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      T* out = static_cast<T*>(working->data());
      parallel_ranges(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
        constexpr int64_t kBlock = 4096;
        for (int64_t s = b; s < e; s += kBlock) {
          const int64_t t = std::min(e, s + kBlock);
          update(s, t);
          convert_run(w + s, out + s, t - s);
        }
      });
    }
  });
}
}  // namespace

void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdParams& args, const StepGate* gate,
              Tensor* working) {
  require_cpu("sgd_step", params);
  require_numel("sgd_step", params, grads);
  if (working) require_cpu("sgd_step", *working);
  if (gate && !gate->apply) return;
  SgdParams p = args;
  if (gate) {
    p.lr = gate->lr;
    p.first_step = gate->first_step != 0;
  }
  // Each gradient element is read as g * clip (x * 1 is x for every float, NaN included: no clipping is exact), the
  // product the CUDA kernels form too; the gradient buffer itself is not changed.
  const float clip = gate ? gate->clip_coef : 1.0f;
  float* w = params.data_as<float>();
  const float* g = grads.data_as<float>();
  const int64_t n = params.numel();
  if (p.momentum == 0.0f) {
    const float lr = p.lr, dampening = p.dampening, wd = p.weight_decay;
    const bool first = p.first_step;
    update_and_round(w, n, working, [=](int64_t b, int64_t e) {
      float unused = 0.0f;
      for (int64_t i = b; i < e; ++i)
        math::sgd_update(w[i], g[i] * clip, unused, lr, 0.0f, dampening, false, wd, first);
    });
    return;
  }
  require_numel("sgd_step", params, momentum_buf);
  float* buf = momentum_buf.data_as<float>();
  // The flags as compile-time constants, the scalars copied into the loop's own closure and the buffers as
  // non-aliasing pointers declared in the loop's scope: the loop then vectorises (the same math::sgd_update, element
  // by element, so the results are unchanged; CMakeLists.txt says which compile options it also needs). It ran
  // scalar before (vmovss, per-element reloads of lr and momentum: perf annotate), about 190 ms a step for the 100M
  // MLP's SGD with Nesterov momentum.
  auto run = [&](auto nesterov, auto first, auto decay) {
    constexpr bool kNesterov = decltype(nesterov)::value, kFirst = decltype(first)::value;
    const float lr = p.lr, momentum = p.momentum, dampening = p.dampening;
    const float wd = decltype(decay)::value ? p.weight_decay : 0.0f;
    update_and_round(w, n, working, [=](int64_t b, int64_t e) {
      float* __restrict pw = w;
      const float* __restrict pg = g;
      float* __restrict pb = buf;
      for (int64_t i = b; i < e; ++i)
        math::sgd_update(pw[i], pg[i] * clip, pb[i], lr, momentum, dampening, kNesterov, wd, kFirst);
    });
  };
  using T = std::true_type;
  using F = std::false_type;
  const bool decay = p.weight_decay != 0.0f;
  if (p.nesterov) {
    if (p.first_step) decay ? run(T{}, T{}, T{}) : run(T{}, T{}, F{});
    else decay ? run(T{}, F{}, T{}) : run(T{}, F{}, F{});
  } else {
    if (p.first_step) decay ? run(F{}, T{}, T{}) : run(F{}, T{}, F{});
    else decay ? run(F{}, F{}, T{}) : run(F{}, F{}, F{});
  }
}

void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const AdamWParams& p,
                const StepGate* gate, Tensor* working) {
  require_cpu("adamw_step", params);
  require_numel("adamw_step", params, grads);
  require_numel("adamw_step", params, m);
  require_numel("adamw_step", params, v);
  if (working) require_cpu("adamw_step", *working);
  if (gate && !gate->apply) return;
  float bc1, bc2_sqrt, lr = p.lr;
  if (gate) {
    bc1 = gate->bias_correction1;
    bc2_sqrt = gate->bias_correction2_sqrt;
    lr = gate->lr;
  } else {
    math::adamw_bias_corrections(p.beta1, p.beta2, p.step, bc1, bc2_sqrt);
  }
  const float clip = gate ? gate->clip_coef : 1.0f;  // as in sgd_step
  const float b1 = static_cast<float>(p.beta1), omb1 = static_cast<float>(1.0 - p.beta1);
  const float b2 = static_cast<float>(p.beta2), omb2 = static_cast<float>(1.0 - p.beta2);
  const float eps = static_cast<float>(p.eps);
  float* w = params.data_as<float>();
  const float* g = grads.data_as<float>();
  float* pm = m.data_as<float>();
  float* pv = v.data_as<float>();
  const float wd = p.weight_decay;
  // By value and restrict, as in sgd_step, so that the loop vectorises (vsqrtps and vdivps round as the scalar
  // instructions do: the same bits).
  update_and_round(w, params.numel(), working, [=](int64_t b, int64_t e) {
    float* __restrict pw = w;
    const float* __restrict pg = g;
    float* __restrict pmm = pm;
    float* __restrict pvv = pv;
    for (int64_t i = b; i < e; ++i)
      math::adamw_update(pw[i], pg[i] * clip, pmm[i], pvv[i], lr, b1, omb1, b2, omb2, eps, wd, bc1, bc2_sqrt);
  });
}

}  // namespace ampdist::kernels::cpu

