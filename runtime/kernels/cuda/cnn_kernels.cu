// CUDA kernels of the convolutional-network ops other than the convolutions themselves (BatchNorm, residual add,
// pooling), launched from cuda_cnn_ops.cc; the orders and what equals the CPU bit for bit are in cuda_cnn_ops.h.
// Per-element arithmetic is kernels/math.h's (nvcc --fmad=false).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/kernels/cuda/cuda_cnn_ops.h"
#include "runtime/kernels/cuda/device_access.cuh"
#include "runtime/kernels/math.h"

namespace ampdist::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
cudaStream_t st(Stream s) { return stream_of(s); }
int grid(int64_t n) { return detail::blocks_for(n, kThreads); }

// Element i of a buffer whose dtype is known only at run time (the branch is uniform across a launch), as FP32.
__device__ __forceinline__ float load(const void* p, int d, int64_t i) {
  if (d == 1) return __half2float(static_cast<const __half*>(p)[i]);
  if (d == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store(void* p, int d, int64_t i, float v) {
  if (d == 1)
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (d == 2)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}
// The gradient that reaches a BatchNorm through the ReLU fused after it (relu == null: none).
__device__ __forceinline__ float grad_in(const void* dy, int dd, const void* relu, int rd, int64_t i) {
  const float g = load(dy, dd, i);
  return relu ? math::relu_backward(load(relu, rd, i), g) : g;
}

// ---- BatchNorm: per-channel double sums, one block of kThreads per channel -----------------------------------------
// Thread t adds the channel's elements t, t + kThreads, ... (element e = image e / hw, offset e % hw) in order; the
// threads' partial sums are then added by a fixed tree. The order depends on (n, hw) alone.
template <typename Term>
__device__ void channel_sums(int64_t n, int64_t c, int64_t hw, Term term, double* out_a, double* out_b) {
  __shared__ double sa[kThreads], sb[kThreads];
  const int64_t ch = blockIdx.x, count = n * hw;
  double a = 0.0, b = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += kThreads) {
    const int64_t i = ((e / hw) * c + ch) * hw + e % hw;
    term(i, ch, a, b);
  }
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      sa[threadIdx.x] += sa[threadIdx.x + half];
      sb[threadIdx.x] += sb[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out_a[ch] = sa[0];
    out_b[ch] = sb[0];
  }
}

__global__ void k_bn_sums(const void* x, int xd, int64_t n, int64_t c, int64_t hw, double* sums) {
  channel_sums(
      n, c, hw,
      [&](int64_t i, int64_t, double& s, double& q) {
        const double v = load(x, xd, i);
        s += v;
        q += v * v;
      },
      sums, sums + c);
}

__global__ void k_bn_apply(const void* x, int xd, int64_t planes, int64_t c, int64_t hw, const float* mean,
                           const float* invstd, const float* gamma, const float* beta, void* y, int yd, bool relu) {
  AMPDIST_GRID_STRIDE(i, planes * hw) {
    const int64_t ch = (i / hw) % c;
    float v = math::batchnorm(load(x, xd, i), mean[ch], math::batchnorm_scale(invstd[ch], gamma[ch]), beta[ch]);
    if (relu) v = math::relu(v);
    store(y, yd, i, v);
  }
}

__global__ void k_bn_backward_sums(const void* x, int xd, const void* dy, int dd, const void* relu, int rd, int64_t n,
                                   int64_t c, int64_t hw, const float* mean, const float* invstd, double* sums) {
  channel_sums(
      n, c, hw,
      [&](int64_t i, int64_t ch, double& s, double& sx) {
        const double g = grad_in(dy, dd, relu, rd, i);
        s += g;
        sx += g * (static_cast<double>(load(x, xd, i)) - mean[ch]) * static_cast<double>(invstd[ch]);
      },
      sums, sums + c);
}

__global__ void k_bn_backward_dx(const void* x, int xd, const void* dy, int dd, const void* relu, int rd,
                                 int64_t planes, int64_t c, int64_t hw, const float* mean, const float* invstd,
                                 const float* gamma, const double* sums, double count, void* dx, int dxd) {
  AMPDIST_GRID_STRIDE(i, planes * hw) {
    const int64_t ch = (i / hw) % c;
    const double is = invstd[ch], k = gamma[ch] * is;
    const double mean_g = count > 0 ? sums[ch] / count : 0.0;
    const double mean_gx = count > 0 ? sums[c + ch] / count : 0.0;
    store(dx, dxd, i,
          static_cast<float>(math::batchnorm_backward(grad_in(dy, dd, relu, rd, i), load(x, xd, i), mean[ch], is, k,
                                                      mean_g, mean_gx)));
  }
}

__global__ void k_bn_statistics(const double* sums, int64_t c, double count, float eps, float momentum, float* mean,
                                float* var, float* invstd, float* rm, float* rv, float* tracked) {
  AMPDIST_GRID_STRIDE(i, c) {
    math::batchnorm_channel_statistics(i, c, sums, count, eps, momentum, mean, var, invstd, rm, rv);
    if (i == 0) tracked[0] += 1.0f;
  }
}

__global__ void k_bn_running_statistics(const float* rm, const float* rv, int64_t c, float eps, float* mean,
                                        float* var, float* invstd) {
  AMPDIST_GRID_STRIDE(i, c) {
    mean[i] = rm[i];
    var[i] = rv[i];
    invstd[i] = math::batchnorm_invstd(static_cast<double>(rv[i]), eps);
  }
}

__global__ void k_bn_param_grads(const double* sums, int64_t c, float* dg, float* db, bool accumulate) {
  AMPDIST_GRID_STRIDE(i, c) {
    const float g = static_cast<float>(sums[c + i]), b = static_cast<float>(sums[i]);
    dg[i] = accumulate ? dg[i] + g : g;
    db[i] = accumulate ? db[i] + b : b;
  }
}

__global__ void k_residual_add(const void* a, int ad, const void* b, int bd, int64_t n, float* y, bool relu) {
  AMPDIST_GRID_STRIDE(i, n) {
    const float v = load(a, ad, i) + load(b, bd, i);
    y[i] = relu ? math::relu(v) : v;
  }
}

__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- pooling: one thread per output (forward) or per input element (backward) ----------------------------------
__global__ void k_maxpool_fwd(const float* x, PoolDims d, float* y, int32_t* argmax) {
  AMPDIST_GRID_STRIDE(o, d.planes * d.oh * d.ow) {
    const int64_t j = o % d.ow, i = (o / d.ow) % d.oh, r = o / (d.oh * d.ow);
    const float* p = x + r * d.h * d.w;
    const int64_t h0 = imax(0, i * d.stride - d.pad), h1 = imin(d.h, i * d.stride - d.pad + d.kernel);
    const int64_t w0 = imax(0, j * d.stride - d.pad), w1 = imin(d.w, j * d.stride - d.pad + d.kernel);
    int64_t at = h0 * d.w + w0;
    float best = p[at];
    for (int64_t hi = h0; hi < h1; ++hi)
      for (int64_t wi = w0; wi < w1; ++wi) {
        const float v = p[hi * d.w + wi];
        if (!(v <= best) && best == best) {  // larger, or the window's first NaN (the CPU's rule)
          best = v;
          at = hi * d.w + wi;
        }
      }
    y[o] = best;
    argmax[o] = static_cast<int32_t>(at);
  }
}

// The outputs of one axis whose windows hold input coordinate `in`: [lo, hi).
__device__ __forceinline__ void covering(int64_t in, int64_t out_size, const PoolDims& d, int64_t& lo, int64_t& hi) {
  const int64_t p = in + d.pad;  // the coordinate in the padded input
  lo = p >= d.kernel ? (p - d.kernel) / d.stride + 1 : 0;
  hi = imin(out_size, p / d.stride + 1);
}

__global__ void k_maxpool_bwd(const float* dy, const int32_t* argmax, PoolDims d, float* dx) {
  AMPDIST_GRID_STRIDE(e, d.planes * d.h * d.w) {
    const int64_t wi = e % d.w, hi = (e / d.w) % d.h, r = e / (d.h * d.w);
    const int32_t here = static_cast<int32_t>(hi * d.w + wi);
    int64_t i0, i1, j0, j1;
    covering(hi, d.oh, d, i0, i1);
    covering(wi, d.ow, d, j0, j1);
    float acc = 0.0f;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t o = (r * d.oh + i) * d.ow + j;
        if (argmax[o] == here) acc += dy[o];
      }
    dx[e] = acc;
  }
}

__global__ void k_avgpool_fwd(const float* x, PoolDims d, float* y) {
  const float inv = 1.0f / static_cast<float>(d.kernel * d.kernel);
  AMPDIST_GRID_STRIDE(o, d.planes * d.oh * d.ow) {
    const int64_t j = o % d.ow, i = (o / d.ow) % d.oh, r = o / (d.oh * d.ow);
    const float* p = x + r * d.h * d.w;
    float acc = 0.0f;
    for (int64_t a = 0; a < d.kernel; ++a) {
      const int64_t hi = i * d.stride - d.pad + a;
      if (hi < 0 || hi >= d.h) continue;
      for (int64_t b = 0; b < d.kernel; ++b) {
        const int64_t wi = j * d.stride - d.pad + b;
        if (wi >= 0 && wi < d.w) acc += p[hi * d.w + wi];
      }
    }
    y[o] = acc * inv;
  }
}

__global__ void k_avgpool_bwd(const float* dy, PoolDims d, float* dx) {
  const float inv = 1.0f / static_cast<float>(d.kernel * d.kernel);
  AMPDIST_GRID_STRIDE(e, d.planes * d.h * d.w) {
    const int64_t wi = e % d.w, hi = (e / d.w) % d.h, r = e / (d.h * d.w);
    int64_t i0, i1, j0, j1;
    covering(hi, d.oh, d, i0, i1);
    covering(wi, d.ow, d, j0, j1);
    float acc = 0.0f;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = j0; j < j1; ++j) acc += dy[(r * d.oh + i) * d.ow + j] * inv;
    dx[e] = acc;
  }
}

__global__ void k_gap_fwd(const float* x, int64_t rows, int64_t hw, float* y) {
  const float inv = 1.0f / static_cast<float>(hw);
  AMPDIST_GRID_STRIDE(r, rows) {
    float acc = 0.0f;
    for (int64_t i = 0; i < hw; ++i) acc += x[r * hw + i];
    y[r] = acc * inv;
  }
}

__global__ void k_gap_bwd(const float* dy, int64_t rows, int64_t hw, float* dx) {
  const float inv = 1.0f / static_cast<float>(hw);
  AMPDIST_GRID_STRIDE(e, rows * hw) { dx[e] = dy[e / hw] * inv; }
}

}  // namespace

void batchnorm_sums(const void* x, int x_dtype, int64_t n, int64_t c, int64_t hw, double* sums, Stream s) {
  if (c == 0) return;
  k_bn_sums<<<static_cast<unsigned>(c), kThreads, 0, st(s)>>>(x, x_dtype, n, c, hw, sums);
  check_launch("batchnorm_sums");
}

void batchnorm_apply(const void* x, int x_dtype, int64_t n, int64_t c, int64_t hw, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, void* y, int y_dtype, bool relu,
                     Stream s) {
  if (n * c * hw == 0) return;
  k_bn_apply<<<grid(n * c * hw), kThreads, 0, st(s)>>>(x, x_dtype, n * c, c, hw, mean, invstd, gamma, beta, y, y_dtype,
                                                       relu);
  check_launch("batchnorm_apply");
}

void batchnorm_backward_sums(const void* x, int x_dtype, const void* dy, int dy_dtype, const void* relu_y,
                             int relu_dtype, int64_t n, int64_t c, int64_t hw, const float* mean, const float* invstd,
                             double* sums, Stream s) {
  if (c == 0) return;
  k_bn_backward_sums<<<static_cast<unsigned>(c), kThreads, 0, st(s)>>>(x, x_dtype, dy, dy_dtype, relu_y, relu_dtype,
                                                                       n, c, hw, mean, invstd, sums);
  check_launch("batchnorm_backward_sums");
}

void batchnorm_backward_dx(const void* x, int x_dtype, const void* dy, int dy_dtype, const void* relu_y,
                           int relu_dtype, int64_t n, int64_t c, int64_t hw, const float* mean, const float* invstd,
                           const float* gamma, const double* sums, double count, void* dx, int dx_dtype, Stream s) {
  if (n * c * hw == 0) return;
  k_bn_backward_dx<<<grid(n * c * hw), kThreads, 0, st(s)>>>(x, x_dtype, dy, dy_dtype, relu_y, relu_dtype, n * c, c,
                                                             hw, mean, invstd, gamma, sums, count, dx, dx_dtype);
  check_launch("batchnorm_backward_dx");
}

void batchnorm_statistics(const double* sums, int64_t c, double count, float eps, float momentum, float* mean,
                          float* var, float* invstd, float* running_mean, float* running_var, float* tracked,
                          Stream s) {
  if (c == 0) return;
  k_bn_statistics<<<grid(c), kThreads, 0, st(s)>>>(sums, c, count, eps, momentum, mean, var, invstd, running_mean,
                                                   running_var, tracked);
  check_launch("batchnorm_statistics");
}

void batchnorm_running_statistics(const float* running_mean, const float* running_var, int64_t c, float eps,
                                  float* mean, float* var, float* invstd, Stream s) {
  if (c == 0) return;
  k_bn_running_statistics<<<grid(c), kThreads, 0, st(s)>>>(running_mean, running_var, c, eps, mean, var, invstd);
  check_launch("batchnorm_running_statistics");
}

void batchnorm_param_grads(const double* sums, int64_t c, float* dgamma, float* dbeta, bool accumulate, Stream s) {
  if (c == 0) return;
  k_bn_param_grads<<<grid(c), kThreads, 0, st(s)>>>(sums, c, dgamma, dbeta, accumulate);
  check_launch("batchnorm_param_grads");
}

void residual_add(const void* a, int a_dtype, const void* b, int b_dtype, int64_t n, float* y, bool relu, Stream s) {
  if (n == 0) return;
  k_residual_add<<<grid(n), kThreads, 0, st(s)>>>(a, a_dtype, b, b_dtype, n, y, relu);
  check_launch("residual_add");
}

void maxpool2d_forward(const float* x, const PoolDims& d, float* y, int32_t* argmax, Stream s) {
  const int64_t n = d.planes * d.oh * d.ow;
  if (n == 0) return;
  k_maxpool_fwd<<<grid(n), kThreads, 0, st(s)>>>(x, d, y, argmax);
  check_launch("maxpool2d_forward");
}

void maxpool2d_backward(const float* dy, const int32_t* argmax, const PoolDims& d, float* dx, Stream s) {
  const int64_t n = d.planes * d.h * d.w;
  if (n == 0) return;
  k_maxpool_bwd<<<grid(n), kThreads, 0, st(s)>>>(dy, argmax, d, dx);
  check_launch("maxpool2d_backward");
}

void avgpool2d_forward(const float* x, const PoolDims& d, float* y, Stream s) {
  const int64_t n = d.planes * d.oh * d.ow;
  if (n == 0) return;
  k_avgpool_fwd<<<grid(n), kThreads, 0, st(s)>>>(x, d, y);
  check_launch("avgpool2d_forward");
}

void avgpool2d_backward(const float* dy, const PoolDims& d, float* dx, Stream s) {
  const int64_t n = d.planes * d.h * d.w;
  if (n == 0) return;
  k_avgpool_bwd<<<grid(n), kThreads, 0, st(s)>>>(dy, d, dx);
  check_launch("avgpool2d_backward");
}

void global_avgpool_forward(const float* x, int64_t rows, int64_t hw, float* y, Stream s) {
  if (rows == 0) return;
  k_gap_fwd<<<grid(rows), kThreads, 0, st(s)>>>(x, rows, hw, y);
  check_launch("global_avgpool_forward");
}

void global_avgpool_backward(const float* dy, int64_t rows, int64_t hw, float* dx, Stream s) {
  if (rows * hw == 0) return;
  k_gap_bwd<<<grid(rows * hw), kThreads, 0, st(s)>>>(dy, rows, hw, dx);
  check_launch("global_avgpool_backward");
}

}  // namespace ampdist::cuda
