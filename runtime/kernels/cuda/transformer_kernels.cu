// CUDA kernels of the transformer ops (kernels/transformer.h), launched from cuda_transformer_ops.cc.
//
// Per-element arithmetic is kernels/math.h's (nvcc --fmad=false). Embedding (forward and backward), dropout and the
// residual add keep the CPU loops' order and equal the CPU's results bit for bit; LayerNorm's row statistics are warp
// sums, its parameter gradients two-stage column sums, and attention's products cuBLAS GEMMs around a warp-per-row
// softmax: deterministic (fixed order for a shape), within the bounds tests/gpu derives of the CPU's results.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "runtime/core/rng.h"
#include "runtime/kernels/cuda/cuda_transformer_ops.h"
#include "runtime/kernels/cuda/device_access.cuh"
#include "runtime/kernels/math.h"

namespace ampdist::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
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
// dwte: one block per (distinct token, 256 columns); the token's rows (host-sorted, in increasing order) are added
// to the old value in that order, exactly the CPU loop's additions: deterministic and bitwise equal to the CPU.
template <typename G>
__global__ void k_embed_bwd_te(const int32_t* uniq, const int32_t* begin, const int32_t* rows, int64_t C, const G* g,
                               float* dte) {
  const int64_t u = blockIdx.x;
  const int64_t j = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= C) return;
  float* d = dte + static_cast<int64_t>(uniq[u]) * C + j;
  float acc = *d;
  for (int32_t q = begin[u]; q < begin[u + 1]; ++q) acc += ld<G>(g, static_cast<int64_t>(rows[q]) * C + j);
  *d = acc;
}
// dwpe: one thread per (position, column); rows p, p + T, ... in order, as the CPU.
template <typename G>
__global__ void k_embed_bwd_pe(int64_t n, int64_t T, int64_t C, const G* g, float* dpe) {
  GRID_STRIDE(i, T * C) {
    const int64_t p = i / C, j = i % C;
    float acc = dpe[i];
    for (int64_t r = p; r < n; r += T) acc += ld<G>(g, r * C + j);
    dpe[i] = acc;
  }
}

// ---- LayerNorm: one warp per row (row statistics by warp_sum; deterministic, not the CPU's serial order) ------------
template <typename X, typename Y>
__global__ void k_ln_fwd(const X* x, int64_t n, int64_t c, const float* gamma, const float* beta, float eps, Y* y,
                         float* mean, float* rstd) {
  const int lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x / 32, warps = per_block * gridDim.x;
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = blockIdx.x * per_block + threadIdx.x / 32; r < n; r += warps) {
    const X* xr = x + r * c;
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += 32) s += ld<X>(xr, j);
    const float m = warp_sum(s) * inv_c;
    float v = 0.0f;  // two passes: no cancellation from E[x^2] - E[x]^2
    for (int64_t j = lane; j < c; j += 32) {
      const float d = ld<X>(xr, j) - m;
      v += d * d;
    }
    const float rs = math::layernorm_rstd(warp_sum(v) * inv_c, eps);
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    for (int64_t j = lane; j < c; j += 32) stf<Y>(y, r * c + j, math::layernorm(ld<X>(xr, j), m, rs, gamma[j], beta[j]));
  }
}
template <typename X, typename G>
__global__ void k_ln_bwd_dx(const X* x, const G* dy, int64_t n, int64_t c, const float* gamma, const float* mean,
                            const float* rstd, float* dx, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x / 32, warps = per_block * gridDim.x;
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = blockIdx.x * per_block + threadIdx.x / 32; r < n; r += warps) {
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t j = lane; j < c; j += 32) {
      const float xhat = (ld<X>(x, r * c + j) - m) * rs;
      const float g = ld<G>(dy, r * c + j) * gamma[j];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float mean_g = warp_sum(sum_g) * inv_c, mean_gx = warp_sum(sum_gx) * inv_c;
    for (int64_t j = lane; j < c; j += 32) {
      const float xhat = (ld<X>(x, r * c + j) - m) * rs;
      const float d = math::layernorm_backward(ld<G>(dy, r * c + j) * gamma[j], xhat, mean_g, mean_gx, rs);
      dx[r * c + j] = accumulate ? dx[r * c + j] + d : d;
    }
  }
}
// dgamma, dbeta: column sums of dy * xhat and dy (detail::column_sums, two fixed-order stages).
template <typename X, typename G> struct LnParamTerm {
  const X* x;
  const G* dy;
  const float *mean, *rstd;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t j, float* v) const {
    const float xhat = (ld<X>(x, r * c + j) - mean[r]) * rstd[r];
    const float g = ld<G>(dy, r * c + j);
    v[0] = g * xhat;
    v[1] = g;
  }
};
struct LnParamFinish {
  float *dgamma, *dbeta;
  bool accumulate;
  __device__ void operator()(int64_t j, const float* t) const {
    dgamma[j] = (accumulate ? dgamma[j] : 0.0f) + t[0];
    dbeta[j] = (accumulate ? dbeta[j] : 0.0f) + t[1];
  }
};

// ---- attention: the softmax between the cuBLAS GEMMs (cuda_transformer_ops.cc), one warp per row -----------------
// Row (b, h, i) of p holds the scaled scores q_i . k_j / sqrt(hs) for every key j; keys j > i and masked keys get
// probability 0 (a row with none allowed is all 0). p becomes the FP32 probabilities; pr (optional) receives them
// rounded to pv_dtype, stored as PR (the operand of p @ v).
template <typename PR>
__global__ void k_attn_softmax_fwd(float* p, int64_t rows, int64_t T, int64_t H, const uint8_t* mask, int pv_dtype,
                                   PR* pr) {
  const int lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x / 32, warps = per_block * gridDim.x;
  for (int64_t row = blockIdx.x * per_block + threadIdx.x / 32; row < rows; row += warps) {
    const int64_t i = row % T, b = row / (T * H);
    const uint8_t* mk = mask ? mask + b * T : nullptr;
    float* pi = p + row * T;
    float mx = -INFINITY;
    for (int64_t j = lane; j <= i; j += 32)
      if (!mk || mk[j]) mx = fmaxf(mx, pi[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t j = lane; j < T; j += 32) {
      const bool allowed = j <= i && (!mk || mk[j]);
      const float e = allowed ? math::softmax_exp(pi[j], mx) : 0.0f;
      pi[j] = e;
      sum += e;
    }
    const float inv = math::softmax_inv_sum(warp_sum(sum));
    for (int64_t j = lane; j < T; j += 32) {
      const float v = pi[j] * inv;
      pi[j] = v;
      if (pr) stf<PR>(pr, row * T + j, round_to(v, pv_dtype));
    }
  }
}
// ds = p * (dp - sum_j p_j dp_j) * scale in place of dp (FP32), one warp per row.
__global__ void k_attn_softmax_bwd(const float* p, float* dp, int64_t rows, int64_t T, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t per_block = blockDim.x / 32, warps = per_block * gridDim.x;
  for (int64_t row = blockIdx.x * per_block + threadIdx.x / 32; row < rows; row += warps) {
    const float* pi = p + row * T;
    float* di = dp + row * T;
    float dot = 0.0f;
    for (int64_t j = lane; j < T; j += 32) dot += pi[j] * di[j];
    dot = warp_sum(dot);
    for (int64_t j = lane; j < T; j += 32) di[j] = math::softmax_backward(pi[j], di[j], dot) * scale;
  }
}
// dst = src rounded to pv_dtype, stored as D.
template <typename D> __global__ void k_round_probs(const float* src, int64_t n, int pv_dtype, D* dst) {
  GRID_STRIDE(i, n) stf<D>(dst, i, round_to(src[i], pv_dtype));
}

// Blocks of kThreads for one warp per row.
int warp_blocks(int64_t rows) { return detail::blocks_for(rows * 32, kThreads); }

// ---- fused causal attention (FlashAttention-2's scheme, Dao 2023) on CUDA cores ------------------------------------
// One thread per query row (forward, dq) or key row (dk, dv), kFlashRows rows per block, the other side's rows staged
// through shared memory kFlashTile at a time; every product is an FP32 sum in a fixed order, so the results are
// deterministic. The state kept between forward and backward is stats [B, H, T, 2] (row max, 1 / row sum); nothing
// of size T x T exists. dq is a kernel of its own (no atomics): each thread sums its row's ds k over the keys.
constexpr int kFlashRows = 64, kFlashTile = 32;
static_assert(kFlashKeyBlock % kFlashTile == 0, "a key block is whole tiles");

// The block's threads stage keys and values j0 .. j0 + kFlashTile of head h (0 past T) into shared memory, as FP32.
template <int HS, typename Q>
__device__ void load_kv_tile(const Q* base, int64_t j0, int64_t T, int64_t C, int64_t h, float (*ks)[HS],
                             float (*vs)[HS]) {
  const int64_t ld3 = 3 * C;
  for (int x = threadIdx.x; x < kFlashTile * HS; x += blockDim.x) {
    const int jj = x / HS, e = x % HS;
    const int64_t j = j0 + jj;
    ks[jj][e] = j < T ? ld<Q>(base, j * ld3 + C + h * HS + e) : 0.0f;
    vs[jj][e] = j < T ? ld<Q>(base, j * ld3 + 2 * C + h * HS + e) : 0.0f;
  }
}

template <int HS, typename Q, typename O>
__global__ void k_flash_fwd(const Q* qkv, int64_t T, int64_t H, const uint8_t* mask, int pv_dtype, float scale, O* out,
                            float* stats) {
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = int64_t(blockIdx.x) * kFlashRows, i = i0 + threadIdx.x;
  const int64_t C = H * HS, ld3 = 3 * C;
  const Q* base = qkv + b * T * ld3;
  const uint8_t* mk = mask ? mask + b * T : nullptr;
  __shared__ float ks[kFlashTile][HS], vs[kFlashTile][HS];
  const bool row = i < T;
  float q[HS], acc[HS];
#pragma unroll
  for (int e = 0; e < HS; ++e) {
    q[e] = row ? ld<Q>(base, i * ld3 + h * HS + e) : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t keys = min(T, i0 + kFlashRows);  // keys after the block's last query are never read
  // The CPU kernel's key blocks (kFlashKeyBlock keys from 0; query blocks of kFlashRows = its kFlashQueryBlock): the
  // running maximum moves once per key block, to the block's maximum, so p = exp(s - m) is rounded to the p @ v
  // dtype exactly as on the CPU and in the KV-cache decode. Two passes over each block's tiles: its maximum, then
  // the sums (the scores computed twice).
  // Key j of the key block ending at jend may be attended by query i (causal, and the key mask); the scaled score of
  // query i with row jj of the key tile. The same in the maximum pass and the accumulation pass.
  auto allowed = [&](int64_t j, int64_t jend) { return j < jend && j <= i && !(mk && !mk[j]); };
  auto score = [&](int jj) {
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < HS; ++e) s += q[e] * ks[jj][e];
    return s * scale;
  };
  for (int64_t jb = 0; jb < keys; jb += kFlashKeyBlock) {
    const int64_t jend = min(keys, jb + kFlashKeyBlock);
    float bmax = -INFINITY;
    for (int64_t j0 = jb; j0 < jend; j0 += kFlashTile) {
      __syncthreads();
      load_kv_tile<HS>(base, j0, T, C, h, ks, vs);
      __syncthreads();
      if (!row) continue;
      for (int jj = 0; jj < kFlashTile; ++jj)
        if (allowed(j0 + jj, jend)) bmax = fmaxf(bmax, score(jj));
    }
    const float m_new = fmaxf(m, bmax);
    const bool any = m_new != -INFINITY;  // no allowed key so far: nothing to add (no barrier is skipped)
    if (any && m_new != m) {  // rescale what was accumulated under the old maximum (nothing before the first key)
      const float alpha = m == -INFINITY ? 0.0f : math::softmax_exp(m, m_new);
      l *= alpha;
#pragma unroll
      for (int e = 0; e < HS; ++e) acc[e] *= alpha;
      m = m_new;
    }
    for (int64_t j0 = jb; j0 < jend; j0 += kFlashTile) {
      __syncthreads();
      load_kv_tile<HS>(base, j0, T, C, h, ks, vs);
      __syncthreads();
      if (!row || !any) continue;
      for (int jj = 0; jj < kFlashTile; ++jj) {
        if (!allowed(j0 + jj, jend)) continue;
        const float p = math::softmax_exp(score(jj), m);
        l += p;
        const float pr = round_to(p, pv_dtype);
#pragma unroll
        for (int e = 0; e < HS; ++e) acc[e] += pr * vs[jj][e];
      }
    }
  }
  if (!row) return;
  const float inv = math::softmax_inv_sum(l);
#pragma unroll
  for (int e = 0; e < HS; ++e) stf<O>(out, (b * T + i) * C + h * HS + e, acc[e] * inv);
  float* sr = stats + ((b * H + h) * T + i) * 2;
  sr[0] = inv > 0.0f ? m : 0.0f;
  sr[1] = inv;
}

// D[b, h, i] = dout_i . out_i over head h's columns, FP32.
template <typename G, typename O>
__global__ void k_flash_bwd_d(const G* dout, const O* out, int64_t T, int64_t H, int64_t hs, int64_t rows, float* D) {
  GRID_STRIDE(x, rows * H) {
    const int64_t r = x / H, h = x % H, C = H * hs;
    float d = 0.0f;
    for (int64_t e = 0; e < hs; ++e) d += ld<G>(dout, r * C + h * hs + e) * ld<O>(out, r * C + h * hs + e);
    D[((r / T) * H + h) * T + r % T] = d;
  }
}

// p of query i and key j recomputed as the forward left it: exp(s - m_i) / l_i.
__device__ __forceinline__ float flash_p(float s, const float* st) { return math::softmax_exp(s, st[0]) * st[1]; }

// dk, dv of one key row per thread: dv = sum_i round(p_ij) g_i, dk = sum_i ds_ij q_i, over queries i >= j.
template <int HS, typename Q, typename G>
__global__ void k_flash_bwd_dkdv(const Q* qkv, const G* dout, const float* stats, const float* D, int64_t T, int64_t H,
                                 const uint8_t* mask, int pv_dtype, float scale, float* dqkv) {
  const int64_t b = blockIdx.z, h = blockIdx.y, j0 = int64_t(blockIdx.x) * kFlashRows, j = j0 + threadIdx.x;
  const int64_t C = H * HS, ld3 = 3 * C;
  const Q* base = qkv + b * T * ld3;
  const G* gb = dout + b * T * C;
  const float* stb = stats + (b * H + h) * T * 2;
  const float* Db = D + (b * H + h) * T;
  __shared__ float qs[kFlashTile][HS], gs[kFlashTile][HS], sts[kFlashTile][2], ds_[kFlashTile];
  const bool key = j < T && (!mask || mask[b * T + j]);
  float k[HS], v[HS], dk[HS], dv[HS];
#pragma unroll
  for (int e = 0; e < HS; ++e) {
    k[e] = j < T ? ld<Q>(base, j * ld3 + C + h * HS + e) : 0.0f;
    v[e] = j < T ? ld<Q>(base, j * ld3 + 2 * C + h * HS + e) : 0.0f;
    dk[e] = dv[e] = 0.0f;
  }
  for (int64_t i0 = j0; i0 < T; i0 += kFlashTile) {
    __syncthreads();
    for (int x = threadIdx.x; x < kFlashTile * HS; x += blockDim.x) {
      const int ii = x / HS, e = x % HS;
      const int64_t i = i0 + ii;
      qs[ii][e] = i < T ? ld<Q>(base, i * ld3 + h * HS + e) : 0.0f;
      gs[ii][e] = i < T ? ld<G>(gb, i * C + h * HS + e) : 0.0f;
    }
    for (int ii = threadIdx.x; ii < kFlashTile; ii += blockDim.x) {
      const int64_t i = i0 + ii;
      sts[ii][0] = i < T ? stb[i * 2] : 0.0f;
      sts[ii][1] = i < T ? stb[i * 2 + 1] : 0.0f;
      ds_[ii] = i < T ? Db[i] : 0.0f;
    }
    __syncthreads();
    if (!key) continue;
    for (int ii = 0; ii < kFlashTile; ++ii) {
      const int64_t i = i0 + ii;
      if (i >= T || i < j || sts[ii][1] == 0.0f) continue;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int e = 0; e < HS; ++e) {
        s += qs[ii][e] * k[e];
        dp += gs[ii][e] * v[e];
      }
      const float p = flash_p(s * scale, sts[ii]);
      const float pr = round_to(p, pv_dtype);
      const float ds = math::softmax_backward(p, dp, ds_[ii]) * scale;
#pragma unroll
      for (int e = 0; e < HS; ++e) {
        dv[e] += pr * gs[ii][e];
        dk[e] += ds * qs[ii][e];
      }
    }
  }
  if (j >= T) return;
#pragma unroll
  for (int e = 0; e < HS; ++e) {
    dqkv[(b * T + j) * ld3 + C + h * HS + e] = dk[e];
    dqkv[(b * T + j) * ld3 + 2 * C + h * HS + e] = dv[e];
  }
}

// dq of one query row per thread: dq = sum_j ds_ij k_j over the allowed keys j <= i.
template <int HS, typename Q, typename G>
__global__ void k_flash_bwd_dq(const Q* qkv, const G* dout, const float* stats, const float* D, int64_t T, int64_t H,
                               const uint8_t* mask, float scale, float* dqkv) {
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = int64_t(blockIdx.x) * kFlashRows, i = i0 + threadIdx.x;
  const int64_t C = H * HS, ld3 = 3 * C;
  const Q* base = qkv + b * T * ld3;
  const uint8_t* mk = mask ? mask + b * T : nullptr;
  __shared__ float ks[kFlashTile][HS], vs[kFlashTile][HS];
  const bool row = i < T;
  float st[2] = {0.0f, 0.0f}, Di = 0.0f, q[HS], g[HS], dq[HS];
  if (row) {
    st[0] = stats[((b * H + h) * T + i) * 2];
    st[1] = stats[((b * H + h) * T + i) * 2 + 1];
    Di = D[(b * H + h) * T + i];
  }
#pragma unroll
  for (int e = 0; e < HS; ++e) {
    q[e] = row ? ld<Q>(base, i * ld3 + h * HS + e) : 0.0f;
    g[e] = row ? ld<G>(dout, (b * T + i) * C + h * HS + e) : 0.0f;
    dq[e] = 0.0f;
  }
  const int64_t keys = min(T, i0 + kFlashRows);
  for (int64_t j0 = 0; j0 < keys; j0 += kFlashTile) {
    __syncthreads();
    load_kv_tile<HS>(base, j0, T, C, h, ks, vs);
    __syncthreads();
    if (!row || st[1] == 0.0f) continue;
    for (int jj = 0; jj < kFlashTile; ++jj) {
      const int64_t j = j0 + jj;
      if (j > i || (mk && !mk[j])) continue;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int e = 0; e < HS; ++e) {
        s += q[e] * ks[jj][e];
        dp += g[e] * vs[jj][e];
      }
      const float ds = math::softmax_backward(flash_p(s * scale, st), dp, Di) * scale;
#pragma unroll
      for (int e = 0; e < HS; ++e) dq[e] += ds * ks[jj][e];
    }
  }
  if (!row) return;
#pragma unroll
  for (int e = 0; e < HS; ++e) dqkv[(b * T + i) * ld3 + h * HS + e] = dq[e];
}

// Calls f(std::integral_constant<int, HS>) for the head sizes the fused kernels are built for.
template <typename F> void by_head_size(int64_t hs, F&& f) {
  switch (hs) {
    case 8: f(std::integral_constant<int, 8>{}); return;
    case 16: f(std::integral_constant<int, 16>{}); return;
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    default:
      throw std::runtime_error("fused attention on the GPU is built for head sizes 8, 16, 32, 64 and 128, not " +
                               std::to_string(hs) + " (model.gpt.attention: MATERIALIZED runs any head size)");
  }
}

dim3 flash_grid(int64_t B, int64_t T, int64_t H) {
  return dim3(static_cast<unsigned>((T + kFlashRows - 1) / kFlashRows), static_cast<unsigned>(H),
              static_cast<unsigned>(B));
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

void embedding_backward(const int32_t* uniq, const int32_t* begin, const int32_t* rows, int64_t distinct, int64_t n,
                        int64_t seq_len, int64_t c, const void* dout, int dd, float* dwte, float* dwpe, Stream s) {
  if (n * c == 0) return;
  by_dtype(dd, [&](auto G) {
    using TG = decltype(G);
    const TG* g = static_cast<const TG*>(dout);
    if (distinct > 0) {
      const dim3 grid(static_cast<unsigned>(distinct), static_cast<unsigned>((c + 255) / 256));
      k_embed_bwd_te<TG><<<grid, 256, 0, st(s)>>>(uniq, begin, rows, c, g, dwte);
    }
    k_embed_bwd_pe<TG><<<blocks_for(seq_len * c), kThreads, 0, st(s)>>>(n, seq_len, c, g, dwpe);
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
      k_ln_fwd<TX, TY><<<warp_blocks(n), kThreads, 0, st(s)>>>(static_cast<const TX*>(x), n, c, gamma, beta, eps,
                                                                static_cast<TY*>(y), mean, rstd);
    });
  });
  check_launch("layernorm_forward");
}

void layernorm_backward(const void* x, int xd, const void* dy, int gd, int64_t n, int64_t c, const float* gamma,
                        const float* mean, const float* rstd, float* dx, bool accumulate_dx, float* dgamma,
                        float* dbeta, bool accumulate_params, Stream s) {
  by_dtype(xd, [&](auto X) {
    by_dtype(gd, [&](auto G) {
      using TX = decltype(X);
      using TG = decltype(G);
      const TX* xp = static_cast<const TX*>(x);
      const TG* g = static_cast<const TG*>(dy);
      if (n > 0)
        k_ln_bwd_dx<TX, TG><<<warp_blocks(n), kThreads, 0, st(s)>>>(xp, g, n, c, gamma, mean, rstd, dx, accumulate_dx);
      column_sums<2>(n, c, LnParamTerm<TX, TG>{xp, g, mean, rstd, c}, LnParamFinish{dgamma, dbeta, accumulate_params},
                     st(s));
    });
  });
  check_launch("layernorm_backward");
}

void attention_softmax_forward(float* probs, int64_t B, int64_t T, int64_t H, const uint8_t* key_mask, int pv_dtype,
                               void* pr, int pr_dtype, Stream s) {
  const int64_t rows = B * H * T;
  if (rows == 0) return;
  by_dtype(pr_dtype, [&](auto P) {
    using TP = decltype(P);
    k_attn_softmax_fwd<TP><<<warp_blocks(rows), kThreads, 0, st(s)>>>(probs, rows, T, H, key_mask, pv_dtype,
                                                                       static_cast<TP*>(pr));
  });
  check_launch("attention softmax");
}

void attention_softmax_backward(const float* probs, float* dp, int64_t rows, int64_t T, float scale, Stream s) {
  if (rows == 0) return;
  k_attn_softmax_bwd<<<warp_blocks(rows), kThreads, 0, st(s)>>>(probs, dp, rows, T, scale);
  check_launch("attention softmax backward");
}

bool flash_attention_head_size_supported(int64_t hs) {
  return hs == 8 || hs == 16 || hs == 32 || hs == 64 || hs == 128;
}

void flash_attention_forward(const void* qkv, int qkv_dtype, int64_t B, int64_t T, int64_t H, int64_t hs,
                             const uint8_t* key_mask, int pv_dtype, void* out, int out_dtype, float* stats, Stream s) {
  if (B * T * H == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  by_head_size(hs, [&](auto HSc) {
    by_dtype(qkv_dtype, [&](auto Qt) {
      by_dtype(out_dtype, [&](auto Ot) {
        using TQ = decltype(Qt);
        using TO = decltype(Ot);
        k_flash_fwd<decltype(HSc)::value, TQ, TO><<<flash_grid(B, T, H), kFlashRows, 0, st(s)>>>(
            static_cast<const TQ*>(qkv), T, H, key_mask, pv_dtype, scale, static_cast<TO*>(out), stats);
      });
    });
  });
  check_launch("flash attention forward");
}

void flash_attention_backward(const void* qkv, int qkv_dtype, const void* out, int out_dtype, const float* stats,
                              const void* dout, int dout_dtype, int64_t B, int64_t T, int64_t H, int64_t hs,
                              const uint8_t* key_mask, int pv_dtype, float* D, float* dqkv, Stream s) {
  if (B * T * H == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  by_head_size(hs, [&](auto HSc) {
    by_dtype(dout_dtype, [&](auto Gt) {
      using TG = decltype(Gt);
      const TG* g = static_cast<const TG*>(dout);
      by_dtype(out_dtype, [&](auto Ot) {
        using TO = decltype(Ot);
        k_flash_bwd_d<TG, TO><<<blocks_for(B * T * H), kThreads, 0, st(s)>>>(g, static_cast<const TO*>(out), T, H, hs,
                                                                            B * T, D);
      });
      by_dtype(qkv_dtype, [&](auto Qt) {
        using TQ = decltype(Qt);
        const TQ* q = static_cast<const TQ*>(qkv);
        constexpr int HS = decltype(HSc)::value;
        k_flash_bwd_dkdv<HS, TQ, TG><<<flash_grid(B, T, H), kFlashRows, 0, st(s)>>>(q, g, stats, D, T, H, key_mask,
                                                                                    pv_dtype, scale, dqkv);
        k_flash_bwd_dq<HS, TQ, TG><<<flash_grid(B, T, H), kFlashRows, 0, st(s)>>>(q, g, stats, D, T, H, key_mask,
                                                                                  scale, dqkv);
      });
    });
  });
  check_launch("flash attention backward");
}

void round_probs(const float* src, int64_t n, int pv_dtype, void* dst, int dst_dtype, Stream s) {
  if (n == 0) return;
  by_dtype(dst_dtype, [&](auto D) {
    using TD = decltype(D);
    k_round_probs<TD><<<blocks_for(n), kThreads, 0, st(s)>>>(src, n, pv_dtype, static_cast<TD*>(dst));
  });
  check_launch("round_probs");
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
