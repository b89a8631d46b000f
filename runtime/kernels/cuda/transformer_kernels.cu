// CUDA kernels of the transformer ops (kernels/transformer.h), launched from cuda_transformer_ops.cc.
//
// Correctness first: every kernel keeps the CPU backend's summation order (one thread owns each output and sums in
// the CPU loop's order), so with kernels/math.h's formulas and nvcc --fmad=false the results equal the CPU's bit for
// bit except where expf is involved (softmax), where CUDA's expf may differ from glibc's by 2 ulp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime/core/rng.h"
#include "runtime/kernels/cuda/cuda_transformer_ops.h"
#include "runtime/kernels/cuda/device_access.cuh"
#include "runtime/kernels/math.h"

namespace ampdist::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 128;
cudaStream_t st(Stream s) { return stream_of(s); }
int blocks_for(int64_t n) { return detail::blocks_for(n, kThreads); }
#define GRID_STRIDE(i, n) AMPDIST_GRID_STRIDE(i, n)

// x rounded to dtype code d and back.
__device__ __forceinline__ float round_to(float x, int d) {
  if (d == 1) return __half2float(__float2half_rn(x));
  if (d == 2) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}

// ---- embedding ---------------------------------------------------------------------------------------------------
__global__ void k_embed_fwd(const int32_t* tok, int64_t n, int64_t T, int64_t C, const float* wte, const float* wpe,
                            float* out) {
  GRID_STRIDE(i, n * C) {
    const int64_t r = i / C, j = i % C;
    out[i] = wte[static_cast<int64_t>(tok[r]) * C + j] + wpe[(r % T) * C + j];
  }
}
// One thread per column: rows in order, as the CPU loop (no two threads touch one element).
template <typename G>
__global__ void k_embed_bwd(const int32_t* tok, int64_t n, int64_t T, int64_t C, const G* g, float* dte, float* dpe) {
  GRID_STRIDE(j, C) {
    for (int64_t r = 0; r < n; ++r) {
      const float v = ld<G>(g, r * C + j);
      dte[static_cast<int64_t>(tok[r]) * C + j] += v;
      dpe[(r % T) * C + j] += v;
    }
  }
}

// ---- LayerNorm (one thread per row; the CPU's loops) -----------------------------------------------------------------
template <typename X, typename Y>
__global__ void k_ln_fwd(const X* x, int64_t n, int64_t c, const float* gamma, const float* beta, float eps, Y* y,
                         float* mean, float* rstd) {
  const float inv_c = 1.0f / static_cast<float>(c);
  GRID_STRIDE(r, n) {
    const X* xr = x + r * c;
    float s = 0.0f;
    for (int64_t j = 0; j < c; ++j) s += ld<X>(xr, j);
    const float m = s * inv_c;
    float v = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      const float d = ld<X>(xr, j) - m;
      v += d * d;
    }
    const float rs = math::layernorm_rstd(v * inv_c, eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t j = 0; j < c; ++j) stf<Y>(y, r * c + j, math::layernorm(ld<X>(xr, j), m, rs, gamma[j], beta[j]));
  }
}
template <typename X, typename G>
__global__ void k_ln_bwd_dx(const X* x, const G* dy, int64_t n, int64_t c, const float* gamma, const float* mean,
                            const float* rstd, float* dx, bool accumulate) {
  const float inv_c = 1.0f / static_cast<float>(c);
  GRID_STRIDE(r, n) {
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (ld<X>(x, r * c + j) - m) * rs;
      const float g = ld<G>(dy, r * c + j) * gamma[j];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float mean_g = sum_g * inv_c, mean_gx = sum_gx * inv_c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (ld<X>(x, r * c + j) - m) * rs;
      const float d = math::layernorm_backward(ld<G>(dy, r * c + j) * gamma[j], xhat, mean_g, mean_gx, rs);
      dx[r * c + j] = accumulate ? dx[r * c + j] + d : d;
    }
  }
}
template <typename X, typename G>
__global__ void k_ln_bwd_params(const X* x, const G* dy, int64_t n, int64_t c, const float* mean, const float* rstd,
                                float* dgamma, float* dbeta, bool accumulate) {
  GRID_STRIDE(j, c) {
    float dg = accumulate ? dgamma[j] : 0.0f, db = accumulate ? dbeta[j] : 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      const float xhat = (ld<X>(x, r * c + j) - mean[r]) * rstd[r];
      const float g = ld<G>(dy, r * c + j);
      dg += g * xhat;
      db += g;
    }
    dgamma[j] = dg;
    dbeta[j] = db;
  }
}

// ---- attention ---------------------------------------------------------------------------------------------------
// One thread per (b, h, i): scores into the probs row (FP32), softmax, then out accumulated in the FP32 scratch o.
template <typename Q>
__global__ void k_attn_fwd(const Q* qkv, int64_t B, int64_t T, int64_t H, int64_t hs, const uint8_t* mask,
                           int pv_dtype, float* probs, float* o) {
  const int64_t C = H * hs, ld3 = 3 * C;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  GRID_STRIDE(idx, B * H * T) {
    const int64_t i = idx % T, h = (idx / T) % H, b = idx / (T * H);
    const uint8_t* mk = mask ? mask + b * T : nullptr;
    float* p = probs + ((b * H + h) * T + i) * T;
    const int64_t qrow = (b * T + i) * ld3 + h * hs;
    for (int64_t j = 0; j <= i; ++j) p[j] = 0.0f;
    for (int64_t e = 0; e < hs; ++e) {
      const float qe = ld<Q>(qkv, qrow + e);
      for (int64_t j = 0; j <= i; ++j) p[j] += qe * ld<Q>(qkv, (b * T + j) * ld3 + C + h * hs + e);
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      p[j] *= scale;
      if (!mk || mk[j]) mx = fmaxf(mx, p[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < T; ++j) {
      const bool allowed = j <= i && (!mk || mk[j]);
      p[j] = allowed ? math::softmax_exp(p[j], mx) : 0.0f;
      sum += p[j];
    }
    const float inv = math::softmax_inv_sum(sum);
    for (int64_t j = 0; j < T; ++j) p[j] *= inv;
    float* oi = o + (b * T + i) * C + h * hs;
    for (int64_t e = 0; e < hs; ++e) oi[e] = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      const float pj = round_to(p[j], pv_dtype);
      const int64_t vrow = (b * T + j) * ld3 + 2 * C + h * hs;
      for (int64_t e = 0; e < hs; ++e) oi[e] += pj * ld<Q>(qkv, vrow + e);
    }
  }
}

// dot[b, h, i] = sum_{j <= i} p[i, j] (g_i . v_j), the softmax backward's row term.
template <typename Q, typename G>
__global__ void k_attn_bwd_dot(const Q* qkv, const float* probs, const G* g, int64_t B, int64_t T, int64_t H,
                               int64_t hs, float* dot) {
  const int64_t C = H * hs, ld3 = 3 * C;
  GRID_STRIDE(idx, B * H * T) {
    const int64_t i = idx % T, h = (idx / T) % H, b = idx / (T * H);
    const float* p = probs + ((b * H + h) * T + i) * T;
    float d = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      float a = 0.0f;
      for (int64_t e = 0; e < hs; ++e)
        a += ld<G>(g, (b * T + i) * C + h * hs + e) * ld<Q>(qkv, (b * T + j) * ld3 + 2 * C + h * hs + e);
      d += p[j] * a;
    }
    dot[idx] = d;
  }
}

// ds[i, j] = softmax_backward(p, g_i . v_j, dot_i) * scale, recomputed where needed.
template <typename Q, typename G>
__device__ float attn_ds(const Q* qkv, const float* probs, const G* g, const float* dot, int64_t b, int64_t h,
                         int64_t i, int64_t j, int64_t T, int64_t H, int64_t hs, float scale) {
  const int64_t C = H * hs, ld3 = 3 * C;
  float a = 0.0f;
  for (int64_t e = 0; e < hs; ++e)
    a += ld<G>(g, (b * T + i) * C + h * hs + e) * ld<Q>(qkv, (b * T + j) * ld3 + 2 * C + h * hs + e);
  const float p = probs[((b * H + h) * T + i) * T + j];
  return math::softmax_backward(p, a, dot[(b * H + h) * T + i]) * scale;
}

// dq_i: one thread per (b, h, i), keys in order.
template <typename Q, typename G>
__global__ void k_attn_bwd_dq(const Q* qkv, const float* probs, const G* g, const float* dot, int64_t B, int64_t T,
                              int64_t H, int64_t hs, float* d) {
  const int64_t C = H * hs, ld3 = 3 * C;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  GRID_STRIDE(idx, B * H * T) {
    const int64_t i = idx % T, h = (idx / T) % H, b = idx / (T * H);
    float* dqi = d + (b * T + i) * ld3 + h * hs;
    for (int64_t j = 0; j <= i; ++j) {
      const float ds = attn_ds(qkv, probs, g, dot, b, h, i, j, T, H, hs, scale);
      if (ds == 0.0f) continue;
      for (int64_t e = 0; e < hs; ++e) dqi[e] += ds * ld<Q>(qkv, (b * T + j) * ld3 + C + h * hs + e);
    }
  }
}

// dk_j and dv_j: one thread per (b, h, j), queries in order (the CPU's outer loop).
template <typename Q, typename G>
__global__ void k_attn_bwd_dkv(const Q* qkv, const float* probs, const G* g, const float* dot, int64_t B, int64_t T,
                               int64_t H, int64_t hs, int pv_dtype, float* d) {
  const int64_t C = H * hs, ld3 = 3 * C;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  GRID_STRIDE(idx, B * H * T) {
    const int64_t j = idx % T, h = (idx / T) % H, b = idx / (T * H);
    float* dkj = d + (b * T + j) * ld3 + C + h * hs;
    float* dvj = d + (b * T + j) * ld3 + 2 * C + h * hs;
    for (int64_t i = j; i < T; ++i) {
      const float pr = round_to(probs[((b * H + h) * T + i) * T + j], pv_dtype);
      for (int64_t e = 0; e < hs; ++e) dvj[e] += pr * ld<G>(g, (b * T + i) * C + h * hs + e);
      const float ds = attn_ds(qkv, probs, g, dot, b, h, i, j, T, H, hs, scale);
      if (ds == 0.0f) continue;
      for (int64_t e = 0; e < hs; ++e) dkj[e] += ds * ld<Q>(qkv, (b * T + i) * ld3 + h * hs + e);
    }
  }
}

// ---- dropout, residual ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void k_dropout(T* x, int64_t n, int64_t c, int64_t seq_len, float p, float inv_keep, uint64_t seed,
                          uint32_t step, uint32_t site, const uint32_t* sample_ids) {
  GRID_STRIDE(i, n * c) {
    const int64_t r = i / c, j = i % c;
    const RngStream rng{seed, {step, sample_ids[r / seq_len], site}, RngPurpose::kDropout};
    const uint64_t draw = static_cast<uint64_t>((r % seq_len) * c + j);
    stf<T>(x, i, math::dropout(ld<T>(x, i), rng.uniform(draw), p, inv_keep));
  }
}
template <typename Y> __global__ void k_add(float* x, const Y* y, int64_t n) {
  GRID_STRIDE(i, n) x[i] += ld<Y>(y, i);
}

}  // namespace

void embedding_forward(const int32_t* tokens, int64_t n, int64_t seq_len, int64_t c, const float* wte,
                       const float* wpe, float* out, Stream s) {
  if (n * c == 0) return;
  k_embed_fwd<<<blocks_for(n * c), kThreads, 0, st(s)>>>(tokens, n, seq_len, c, wte, wpe, out);
  check_launch("embedding_forward");
}

void embedding_backward(const int32_t* tokens, int64_t n, int64_t seq_len, int64_t c, const void* dout, int dd,
                        float* dwte, float* dwpe, Stream s) {
  if (n * c == 0) return;
  by_dtype(dd, [&](auto G) {
    using TG = decltype(G);
    k_embed_bwd<TG><<<blocks_for(c), kThreads, 0, st(s)>>>(tokens, n, seq_len, c, static_cast<const TG*>(dout), dwte,
                                                           dwpe);
  });
  check_launch("embedding_backward");
}

void layernorm_forward(const void* x, int xd, int64_t n, int64_t c, const float* gamma, const float* beta, float eps,
                       void* y, int yd, float* mean, float* rstd, Stream s) {
  if (n == 0) return;
  by_dtype(xd, [&](auto X) {
    by_dtype(yd, [&](auto Y) {
      using TX = decltype(X);
      using TY = decltype(Y);
      k_ln_fwd<TX, TY><<<blocks_for(n), kThreads, 0, st(s)>>>(static_cast<const TX*>(x), n, c, gamma, beta, eps,
                                                               static_cast<TY*>(y), mean, rstd);
    });
  });
  check_launch("layernorm_forward");
}

void layernorm_backward(const void* x, int xd, const void* dy, int gd, int64_t n, int64_t c, const float* gamma,
                        const float* mean, const float* rstd, float* dx, bool accumulate_dx, float* dgamma,
                        float* dbeta, bool accumulate_params, Stream s) {
  if (n == 0) return;
  by_dtype(xd, [&](auto X) {
    by_dtype(gd, [&](auto G) {
      using TX = decltype(X);
      using TG = decltype(G);
      k_ln_bwd_dx<TX, TG><<<blocks_for(n), kThreads, 0, st(s)>>>(static_cast<const TX*>(x), static_cast<const TG*>(dy),
                                                                  n, c, gamma, mean, rstd, dx, accumulate_dx);
      k_ln_bwd_params<TX, TG><<<blocks_for(c), kThreads, 0, st(s)>>>(
          static_cast<const TX*>(x), static_cast<const TG*>(dy), n, c, mean, rstd, dgamma, dbeta, accumulate_params);
    });
  });
  check_launch("layernorm_backward");
}

void attention_forward(const void* qkv, int qd, int64_t B, int64_t T, int64_t H, int64_t hs, const uint8_t* mask,
                       int pv_dtype, float* probs, float* o32, Stream s) {
  if (B * H * T == 0) return;
  by_dtype(qd, [&](auto Q) {
    using TQ = decltype(Q);
    k_attn_fwd<TQ><<<blocks_for(B * H * T), kThreads, 0, st(s)>>>(static_cast<const TQ*>(qkv), B, T, H, hs, mask,
                                                                   pv_dtype, probs, o32);
  });
  check_launch("attention_forward");
}

void attention_backward(const void* qkv, int qd, const float* probs, const void* dout, int gd, int64_t B, int64_t T,
                        int64_t H, int64_t hs, int pv_dtype, float* dot, float* d32, Stream s) {
  if (B * H * T == 0) return;
  const int grid = blocks_for(B * H * T);
  by_dtype(qd, [&](auto Q) {
    by_dtype(gd, [&](auto G) {
      using TQ = decltype(Q);
      using TG = decltype(G);
      const TQ* q = static_cast<const TQ*>(qkv);
      const TG* g = static_cast<const TG*>(dout);
      k_attn_bwd_dot<TQ, TG><<<grid, kThreads, 0, st(s)>>>(q, probs, g, B, T, H, hs, dot);
      k_attn_bwd_dq<TQ, TG><<<grid, kThreads, 0, st(s)>>>(q, probs, g, dot, B, T, H, hs, d32);
      k_attn_bwd_dkv<TQ, TG><<<grid, kThreads, 0, st(s)>>>(q, probs, g, dot, B, T, H, hs, pv_dtype, d32);
    });
  });
  check_launch("attention_backward");
}

void dropout_inplace(void* x, int xd, int64_t n, int64_t c, int64_t seq_len, float p, uint64_t seed, uint32_t step,
                     uint32_t site, const uint32_t* sample_ids, Stream s) {
  if (n * c == 0) return;
  const float inv_keep = 1.0f / (1.0f - p);
  by_dtype(xd, [&](auto T) {
    using TT = decltype(T);
    k_dropout<TT><<<blocks_for(n * c), kThreads, 0, st(s)>>>(static_cast<TT*>(x), n, c, seq_len, p, inv_keep, seed,
                                                             step, site, sample_ids);
  });
  check_launch("dropout_inplace");
}

void add_inplace(float* x, const void* y, int yd, int64_t n, Stream s) {
  if (n == 0) return;
  by_dtype(yd, [&](auto Y) {
    using TY = decltype(Y);
    k_add<TY><<<blocks_for(n), kThreads, 0, st(s)>>>(x, static_cast<const TY*>(y), n);
  });
  check_launch("add_inplace");
}

}  // namespace ampdist::cuda
