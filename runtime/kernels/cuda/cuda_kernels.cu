// CUDA kernels of the backend (launchers declared in cuda_ops.h). Element-wise arithmetic is kernels/math.h's and
// the gate they read is kernels/update_gate.h's, decided by the function the CPU backend runs (optim/step_gate.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "runtime/kernels/cuda/cuda_ops.h"
#include "runtime/kernels/cuda/device_access.cuh"
#include "runtime/kernels/math.h"
#include "runtime/kernels/update_gate.h"

namespace ampdist::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
// Reductions use this many blocks whatever the device, so their summation order (and result bits) is the same on
// every GPU model and every rank.
constexpr int kReduceBlocks = 256;
cudaStream_t st(Stream s) { return stream_of(s); }
int blocks_for(int64_t n) { return detail::blocks_for(n, kThreads); }
#define GRID_STRIDE(i, n) AMPDIST_GRID_STRIDE(i, n)

// ---- casts, bias, rows ---------------------------------------------------------------------------------------------
template <typename S, typename D> __global__ void k_cast(const S* src, D* dst, int64_t n) {
  GRID_STRIDE(i, n) stf<D>(dst, i, ld<S>(src, i));
}

template <typename B, typename D>
__global__ void k_add_bias_cast(const float* c32, const B* bias, D* c, int64_t m, int64_t n) {
  GRID_STRIDE(i, m * n) {
    float v = c32[i];
    if (bias) v += ld<B>(bias, i % n);
    stf<D>(c, i, v);
  }
}

// sum_rows as two fixed-order stages (detail::column_sums): out[j] = beta * out[j] + (the column's sum).
template <typename T> struct SumRowsTerm {
  const T* x;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t j, float* v) const { v[0] = ld<T>(x, r * cols + j); }
};
struct SumRowsFinish {
  float* out;
  float beta;
  __device__ void operator()(int64_t j, const float* t) const {
    out[j] = (beta == 0.0f ? 0.0f : beta * out[j]) + t[0];
  }
};

// ---- activations ---------------------------------------------------------------------------------------------
template <typename T> __global__ void k_relu(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) stf<T>(y, i, math::relu(ld<T>(x, i)));
}
template <typename T> __global__ void k_relu_bwd(const T* y, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) stf<T>(dx, i, math::relu_backward(ld<T>(y, i), ld<T>(dy, i)));
}
template <typename T> __global__ void k_gelu(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) stf<T>(y, i, math::gelu(ld<T>(x, i)));
}
template <typename T> __global__ void k_gelu_bwd(const T* x, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) stf<T>(dx, i, math::gelu_backward(ld<T>(x, i), ld<T>(dy, i)));
}

// ---- block reductions ----------------------------------------------------------------------------------------------
template <typename V, typename Op> __device__ V block_reduce(V v, Op op, V* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  V r = shared[0];
  __syncthreads();
  return r;
}
struct SumF { __device__ float operator()(float a, float b) const { return a + b; } };
struct SumD { __device__ double operator()(double a, double b) const { return a + b; } };

// ---- softmax cross-entropy (one block per row, FP32) ----------------------------------------------------------------
template <typename T>
__global__ void k_xent_fwd(const T* z, const int32_t* t, int64_t rows, int64_t cols, float* lse, float* row_loss,
                           int32_t* bad_row) {
  __shared__ float sh[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = z + r * cols;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float v = ld<T>(row, j);
      // NaN must win, as std::max in the CPU loop keeps a NaN that arrives first; either way the row is non-finite.
      mx = (v > mx || v != v) ? v : mx;
    }
    mx = block_reduce(mx, [](float a, float b) { return (b > a || b != b) ? b : a; }, sh);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(ld<T>(row, j) - mx);
    s = block_reduce(s, SumF{}, sh);
    if (threadIdx.x == 0) {
      const float l = mx + logf(s);
      lse[r] = l;
      const int32_t target = t[r];
      if (target < 0 || target >= cols) {
        if (bad_row) atomicCAS(bad_row, -1, static_cast<int32_t>(r));
        row_loss[r] = NAN;
      } else {
        row_loss[r] = l - ld<T>(row, target);
      }
    }
  }
}

template <typename T, typename D>
__global__ void k_xent_bwd(const T* z, const int32_t* t, const float* lse, int64_t rows, int64_t cols, float scale,
                           const float* scale_dev, double divisor, float row_divisor, D* dz) {
  // The trainer's grad_scale = float(S / global samples), computed as the host does, from the device's S; then the
  // criterion's own division in FP32, as its CPU path does.
  if (scale_dev) scale = static_cast<float>(static_cast<double>(*scale_dev) / divisor);
  scale = scale / row_divisor;
  GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, j = i % cols;
    const float p = expf(ld<T>(z, i) - lse[r]);
    const float onehot = j == t[r] ? 1.0f : 0.0f;
    stf<D>(dz, i, scale * (p - onehot));
  }
}

template <typename T>
__global__ void k_argmax_hits(const T* z, const int32_t* t, int64_t rows, int64_t cols, float* hit) {
  GRID_STRIDE(r, rows) {
    const T* row = z + r * cols;
    int64_t best = 0;
    for (int64_t j = 1; j < cols; ++j)
      if (ld<T>(row, j) > ld<T>(row, best)) best = j;
    hit[r] = best == t[r] ? 1.0f : 0.0f;
  }
}

// ---- deterministic sums over flat FP32 buffers ----------------------------------------------------------------------
// Pass 1: kReduceBlocks partial sums (fixed grid, grid-stride, fixed tree); pass 2: one block sums the partials.
// One scratch of kReduceBlocks partial sums per device (the current one's; launches on a device's compute stream
// never overlap).
double* partials() {
  static double* table[64] = {};
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= 64) throw std::runtime_error("cudaGetDevice failed");
  if (!table[d] && cudaMalloc(&table[d], kReduceBlocks * sizeof(double)) != cudaSuccess)
    throw std::runtime_error("cudaMalloc of the reduction scratch failed");
  return table[d];
}

enum class SumKind { kPlain, kSquares };
template <SumKind K> __global__ void k_sum_pass1(const float* x, int64_t n, double* part) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  GRID_STRIDE(i, n) {
    const double v = x[i];
    acc += K == SumKind::kSquares ? v * v : v;
  }
  acc = block_reduce(acc, SumD{}, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void k_unscale_pass1(float* g, int64_t n, float inv_scale, const float* inv_scale_dev, float* found_inf,
                                double* part) {
  __shared__ double sh[kThreads];
  const float inv = inv_scale_dev ? *inv_scale_dev : inv_scale;
  double acc = 0.0;
  bool bad = false;
  GRID_STRIDE(i, n) {
    const float v = math::unscale(g[i], inv);
    g[i] = v;
    const bool finite = math::is_finite(v);
    bad |= !finite;
    acc += finite ? static_cast<double>(v) * v : 0.0;
  }
  if (bad) *found_inf = 1.0f;  // benign race: every writer stores the same value
  acc = block_reduce(acc, SumD{}, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void k_sum_pass2(const double* part, int nparts, double* out, bool add, double divisor = 1.0) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += part[i];
  acc = block_reduce(acc, SumD{}, sh);
  if (threadIdx.x == 0) *out = add ? *out + acc / divisor : acc / divisor;
}

__global__ void k_scale(float* x, int64_t n, float f) {
  GRID_STRIDE(i, n) x[i] *= f;
}

// ---- optimizers --------------------------------------------------------------------------------------------------
// With W a 16-bit type, working[i] = params[i] rounded to W after the update (k_cast's rounding); W = float: none.
template <typename W>
__global__ void k_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening,
                      float wd, bool nesterov, bool first, const StepGate* gate, W* working) {
  float coef = 1.0f;
  if (gate) {
    if (!gate->apply) return;
    lr = gate->lr;
    first = gate->first_step != 0;
    coef = gate->clip_coef;
  }
  GRID_STRIDE(i, n) {
    const float gi = coef == 1.0f ? g[i] : g[i] * coef;
    float unused = 0.0f;
    math::sgd_update(p[i], gi, buf ? buf[i] : unused, lr, buf ? momentum : 0.0f, dampening, nesterov, wd, first);
    if constexpr (!std::is_same_v<W, float>) stf<W>(working, i, p[i]);
  }
}

template <typename W>
__global__ void k_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float omb1,
                        float b2, float omb2, float eps, float wd, float bc1, float bc2s, const StepGate* gate,
                        W* working) {
  float coef = 1.0f;
  if (gate) {
    if (!gate->apply) return;
    lr = gate->lr;
    bc1 = gate->bias_correction1;
    bc2s = gate->bias_correction2_sqrt;
    coef = gate->clip_coef;
  }
  GRID_STRIDE(i, n) {
    const float gi = coef == 1.0f ? g[i] : g[i] * coef;
    math::adamw_update(p[i], gi, m[i], v[i], lr, b1, omb1, b2, omb2, eps, wd, bc1, bc2s);
    if constexpr (!std::is_same_v<W, float>) stf<W>(working, i, p[i]);
  }
}

// ---- checks of the step and of the numerics report -----------------------------------------------------------------
__global__ void k_check_nonfinite(const float* x, int64_t n, float* bad) {
  bool b = false;
  GRID_STRIDE(i, n) b |= !math::is_finite(x[i]);
  if (b) *bad = 1.0f;  // benign race: every writer stores the same value
}
__global__ void k_copy_unless(unsigned char* dst, const unsigned char* src, int64_t bytes, const int32_t* flag) {
  if (*flag != 0) return;
  GRID_STRIDE(i, bytes) dst[i] = src[i];
}
__global__ void k_zero_if(float* x, int64_t n, const float* flag) {
  if (!(*flag > 0.0f)) return;
  GRID_STRIDE(i, n) x[i] = 0.0f;
}
// out: [max |x| of the finite elements as uint32 bits, any non-finite (0/1), count of 0 < |x| <= threshold]. Max and
// counts do not depend on the order of the atomics, so the result is deterministic. |x| >= 0 orders as its bits.
template <typename T>
__global__ void k_abs_stats(const T* x, int64_t n, float threshold, unsigned int* max_bits, unsigned int* bad,
                            unsigned long long* below) {
  float m = 0.0f;
  bool b = false;
  unsigned long long c = 0;
  GRID_STRIDE(i, n) {
    const float v = fabsf(ld(x, i));
    if (!(v <= FLT_MAX)) b = true;
    else m = v > m ? v : m;
    c += (v != 0.0f && v <= threshold) ? 1ull : 0ull;
  }
  atomicMax(max_bits, __float_as_uint(m));
  if (b) atomicOr(bad, 1u);
  if (c) atomicAdd(below, c);
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------------------------------
void cast(const void* src, int sd, void* dst, int dd, int64_t n, Stream s) {
  if (n == 0) return;
  by_dtype(sd, [&](auto S) {
    by_dtype(dd, [&](auto D) {
      using TS = decltype(S);
      using TD = decltype(D);
      k_cast<TS, TD><<<blocks_for(n), kThreads, 0, st(s)>>>(static_cast<const TS*>(src), static_cast<TD*>(dst), n);
    });
  });
  check_launch("cast");
}

void add_bias_cast(const float* c32, const void* bias, int bd, void* c, int cd, int64_t m, int64_t n, Stream s) {
  if (m * n == 0) return;
  by_dtype(bd, [&](auto B) {
    by_dtype(cd, [&](auto D) {
      using TB = decltype(B);
      using TD = decltype(D);
      k_add_bias_cast<TB, TD><<<blocks_for(m * n), kThreads, 0, st(s)>>>(c32, static_cast<const TB*>(bias),
                                                                          static_cast<TD*>(c), m, n);
    });
  });
  check_launch("add_bias_cast");
}

void sum_rows(const void* x, int xd, int64_t rows, int64_t cols, float* out, float beta, Stream s) {
  if (cols == 0) return;
  by_dtype(xd, [&](auto T) {
    using TT = decltype(T);
    column_sums<1>(rows, cols, SumRowsTerm<TT>{static_cast<const TT*>(x), cols}, SumRowsFinish{out, beta}, st(s));
  });
  check_launch("sum_rows");
}

#define ELEMENTWISE_LAUNCH(name, kernel, ...)                                              \
  if (n == 0) return;                                                                      \
  by_dtype(d, [&](auto T) {                                                                \
    using TT = decltype(T);                                                                \
    kernel<TT><<<blocks_for(n), kThreads, 0, st(s)>>>(__VA_ARGS__);                        \
  });                                                                                      \
  check_launch(name);

void relu_forward(const void* x, void* y, int d, int64_t n, Stream s) {
  ELEMENTWISE_LAUNCH("relu_forward", k_relu, static_cast<const TT*>(x), static_cast<TT*>(y), n)
}
void relu_backward(const void* y, const void* dy, void* dx, int d, int64_t n, Stream s) {
  ELEMENTWISE_LAUNCH("relu_backward", k_relu_bwd, static_cast<const TT*>(y), static_cast<const TT*>(dy),
                     static_cast<TT*>(dx), n)
}
void gelu_forward(const void* x, void* y, int d, int64_t n, Stream s) {
  ELEMENTWISE_LAUNCH("gelu_forward", k_gelu, static_cast<const TT*>(x), static_cast<TT*>(y), n)
}
void gelu_backward(const void* x, const void* dy, void* dx, int d, int64_t n, Stream s) {
  ELEMENTWISE_LAUNCH("gelu_backward", k_gelu_bwd, static_cast<const TT*>(x), static_cast<const TT*>(dy),
                     static_cast<TT*>(dx), n)
}

void softmax_xent_forward(const void* logits, int d, const int32_t* targets, int64_t rows, int64_t classes,
                          float* lse, float* row_loss, int32_t* bad_row, Stream s) {
  if (rows == 0) return;
  const int grid = static_cast<int>(rows < 65535 ? rows : 65535);
  by_dtype(d, [&](auto T) {
    using TT = decltype(T);
    k_xent_fwd<TT><<<grid, kThreads, 0, st(s)>>>(static_cast<const TT*>(logits), targets, rows, classes, lse,
                                                 row_loss, bad_row);
  });
  check_launch("softmax_cross_entropy_forward");
}

void softmax_xent_backward(const void* logits, int d, const int32_t* targets, const float* lse, int64_t rows,
                           int64_t classes, float grad_scale, const float* scale_dev, double divisor,
                           float row_divisor, void* dlogits, int dd, Stream s) {
  if (rows * classes == 0) return;
  by_dtype(d, [&](auto T) {
    by_dtype(dd, [&](auto D) {
      using TT = decltype(T);
      using TD = decltype(D);
      k_xent_bwd<TT, TD><<<blocks_for(rows * classes), kThreads, 0, st(s)>>>(
          static_cast<const TT*>(logits), targets, lse, rows, classes, grad_scale, scale_dev, divisor, row_divisor,
          static_cast<TD*>(dlogits));
    });
  });
  check_launch("softmax_cross_entropy_backward");
}

void argmax_hits(const void* logits, int d, const int32_t* targets, int64_t rows, int64_t classes, float* row_hit,
                 Stream s) {
  if (rows == 0) return;
  by_dtype(d, [&](auto T) {
    using TT = decltype(T);
    k_argmax_hits<TT><<<blocks_for(rows), kThreads, 0, st(s)>>>(static_cast<const TT*>(logits), targets, rows,
                                                                 classes, row_hit);
  });
  check_launch("count_correct");
}

void sum_f32(const float* x, int64_t n, double* out, bool add, Stream s, double divisor) {
  k_sum_pass1<SumKind::kPlain><<<kReduceBlocks, kThreads, 0, st(s)>>>(x, n, partials());
  k_sum_pass2<<<1, kThreads, 0, st(s)>>>(partials(), kReduceBlocks, out, add, divisor);
  check_launch("sum");
}

void sum_squares(const float* x, int64_t n, double* out, Stream s) {
  k_sum_pass1<SumKind::kSquares><<<kReduceBlocks, kThreads, 0, st(s)>>>(x, n, partials());
  k_sum_pass2<<<1, kThreads, 0, st(s)>>>(partials(), kReduceBlocks, out, false);
  check_launch("sum_squares");
}

void unscale_and_check(float* g, int64_t n, float inv_scale, const float* inv_scale_dev, float* found_inf,
                       double* sum_sq, Stream s) {
  k_unscale_pass1<<<kReduceBlocks, kThreads, 0, st(s)>>>(g, n, inv_scale, inv_scale_dev, found_inf, partials());
  k_sum_pass2<<<1, kThreads, 0, st(s)>>>(partials(), kReduceBlocks, sum_sq, true);
  check_launch("unscale_and_check");
}

void scale_inplace(float* x, int64_t n, float factor, Stream s) {
  if (n == 0) return;
  k_scale<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n, factor);
  check_launch("scale_inplace");
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening,
              float weight_decay, bool nesterov, bool first_step, const StepGate* gate, void* working,
              int working_dtype, Stream s) {
  if (n == 0) return;
  by_dtype(working ? working_dtype : 0, [&](auto W) {
    using TW = decltype(W);
    k_sgd<TW><<<blocks_for(n), kThreads, 0, st(s)>>>(p, g, buf, n, lr, momentum, dampening, weight_decay, nesterov,
                                                     first_step, gate, static_cast<TW*>(working));
  });
  check_launch("sgd_step");
}

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float one_minus_beta1,
                float beta2, float one_minus_beta2, float eps, float weight_decay, float bias_correction1,
                float bias_correction2_sqrt, const StepGate* gate, void* working, int working_dtype, Stream s) {
  if (n == 0) return;
  by_dtype(working ? working_dtype : 0, [&](auto W) {
    using TW = decltype(W);
    k_adamw<TW><<<blocks_for(n), kThreads, 0, st(s)>>>(p, g, m, v, n, lr, beta1, one_minus_beta1, beta2,
                                                       one_minus_beta2, eps, weight_decay, bias_correction1,
                                                       bias_correction2_sqrt, gate, static_cast<TW*>(working));
  });
  check_launch("adamw_step");
}

void check_nonfinite(const float* x, int64_t n, float* bad, Stream s) {
  if (n == 0) return;
  k_check_nonfinite<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n, bad);
  check_launch("check_nonfinite");
}

void copy_unless(void* dst, const void* src, int64_t bytes, const int32_t* flag, Stream s) {
  if (bytes == 0) return;
  k_copy_unless<<<blocks_for(bytes), kThreads, 0, st(s)>>>(static_cast<unsigned char*>(dst),
                                                           static_cast<const unsigned char*>(src), bytes, flag);
  check_launch("copy_unless");
}

void zero_if(float* x, int64_t n, const float* flag, Stream s) {
  if (n == 0) return;
  k_zero_if<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n, flag);
  check_launch("zero_if");
}

void abs_stats(const void* x, int d, int64_t n, float threshold, unsigned int* out, Stream s) {
  if (n == 0) return;
  by_dtype(d, [&](auto T) {
    using TT = decltype(T);
    k_abs_stats<TT><<<blocks_for(n), kThreads, 0, st(s)>>>(static_cast<const TT*>(x), n, threshold, out, out + 1,
                                                           reinterpret_cast<unsigned long long*>(out + 2));
  });
  check_launch("abs_stats");
}

}  // namespace ampdist::cuda
