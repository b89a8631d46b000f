// CPU backend of kernels/transformer.h (kernels/dispatch.cc picks it for host tensors): attention's
// products on oneDNN (batched matmuls), loops over kernels/math.h for the rest, FP32 arithmetic throughout. Inputs of
// 16-bit dtypes are converted exactly to FP32 scratch buffers owned by the calling thread (sized once, reused), and
// results are rounded once to the output's dtype.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/core/rng.h"
#include "runtime/kernels/cpu/convert.h"
#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/cpu/parallel.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/math.h"
#include "runtime/kernels/transformer.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/transformer_checks.h"

namespace ampdist::kernels::cpu {
namespace {

// t as FP32: its own data, or an exact conversion into `scratch` (grown once to the largest request).
const float* fp32_of(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::kFloat32) return t.data_as<float>();
  scratch.resize(std::max<size_t>(scratch.size(), static_cast<size_t>(t.numel())));
  Tensor v = Tensor::view(scratch.data(), t.shape(), DType::kFloat32);
  cast(t, v);
  return scratch.data();
}

// A FP32 buffer to write t's values into: t's own data when FP32, else `scratch`; store() rounds it into t.
float* fp32_out(Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::kFloat32) return t.data_as<float>();
  scratch.resize(std::max<size_t>(scratch.size(), static_cast<size_t>(t.numel())));
  return scratch.data();
}
void store(Tensor& t, const float* buf) {
  if (t.dtype() == DType::kFloat32) return;
  const Tensor v = Tensor::view(const_cast<float*>(buf), t.shape(), DType::kFloat32);
  cast(v, t);
}

}  // namespace

// ---- embedding -------------------------------------------------------------------------------------------------

void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       Tensor& out) {
  checks::embedding_forward(tokens, seq_len, wte, wpe, out, Device::kCPU);  // tokens included
  const int64_t n = static_cast<int64_t>(tokens.size()), c = wte.dim(1);
  const float* te = wte.data_as<float>();
  const float* pe = wpe.data_as<float>();
  float* y = out.data_as<float>();
  parallel_ranges(n, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t tok = tokens[static_cast<size_t>(r)];
      const float* a = te + static_cast<int64_t>(tok) * c;
      const float* b = pe + (r % seq_len) * c;
      float* o = y + r * c;
      for (int64_t j = 0; j < c; ++j) o[j] = a[j] + b[j];
    }
  });
}

void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,
                        bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe) {
  checks::embedding_backward(tokens, seq_len, dout, dwte, dwpe, Device::kCPU);
  const int64_t n = static_cast<int64_t>(tokens.size()), c = dwte.dim(1);
  thread_local std::vector<float> scratch;
  const float* g = fp32_of(dout, scratch);
  float* dte = dwte.data_as<float>();
  float* dpe = dwpe.data_as<float>();
  if (overwrite_wte) std::memset(dte, 0, dwte.nbytes());
  if (overwrite_wpe) std::memset(dpe, 0, dwpe.nbytes());
  const int64_t v = dwte.dim(0);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t tok = tokens[static_cast<size_t>(r)];
    AMPDIST_CHECK(tok >= 0 && tok < v, "token " + std::to_string(tok) + " checked by the forward");
    const float* gr = g + r * c;
    float* a = dte + static_cast<int64_t>(tok) * c;
    float* b = dpe + (r % seq_len) * c;
    for (int64_t j = 0; j < c; ++j) {
      a[j] += gr[j];
      b[j] += gr[j];
    }
  }
}

// ---- LayerNorm -------------------------------------------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  checks::layernorm_forward(x, gamma, beta, y, mean, rstd, Device::kCPU);
  const int64_t n = x.dim(0), c = x.dim(1);
  thread_local std::vector<float> xs, ys;
  const float* xp = fp32_of(x, xs);
  float* yp = fp32_out(y, ys);
  const float* gp = gamma.data_as<float>();
  const float* bp = beta.data_as<float>();
  float* mp = mean.data_as<float>();
  float* rp = rstd.data_as<float>();
  const float inv_c = 1.0f / static_cast<float>(c);
  // Rows over the threads; each row's sums run in column order as before (bitwise the serial result).
  parallel_ranges(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * c;
      float s = 0.0f;
      for (int64_t j = 0; j < c; ++j) s += xr[j];
      const float m = s * inv_c;
      float v = 0.0f;  // two passes: no cancellation from E[x^2] - E[x]^2
      for (int64_t j = 0; j < c; ++j) v += (xr[j] - m) * (xr[j] - m);
      const float rs = math::layernorm_rstd(v * inv_c, eps);
      mp[r] = m;
      rp[r] = rs;
      float* yr = yp + r * c;
      for (int64_t j = 0; j < c; ++j) yr[j] = math::layernorm(xr[j], m, rs, gp[j], bp[j]);
    }
  });
  store(y, yp);
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dgamma, Tensor& dbeta,
                        bool accumulate_params) {
  checks::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, Device::kCPU);
  const int64_t n = x.dim(0), c = x.dim(1);
  thread_local std::vector<float> xs, dys;
  const float* xp = fp32_of(x, xs);
  const float* gp = fp32_of(dy, dys);
  const float* gam = gamma.data_as<float>();
  const float* mp = mean.data_as<float>();
  const float* rp = rstd.data_as<float>();
  float* dxp = dx.data_as<float>();
  float* dg = dgamma.data_as<float>();
  float* db = dbeta.data_as<float>();
  if (!accumulate_params) {
    std::fill(dg, dg + c, 0.0f);
    std::fill(db, db + c, 0.0f);
  }
  const float inv_c = 1.0f / static_cast<float>(c);
  // dx: rows over the threads, each row's two sums in column order as before.
  parallel_ranges(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * c;
      const float* dyr = gp + r * c;
      const float m = mp[r], rs = rp[r];
      float sum_g = 0.0f, sum_gx = 0.0f;
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xr[j] - m) * rs;
        const float g = dyr[j] * gam[j];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const float mean_g = sum_g * inv_c, mean_gx = sum_gx * inv_c;
      float* dxr = dxp + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xr[j] - m) * rs;
        const float d = math::layernorm_backward(dyr[j] * gam[j], xhat, mean_g, mean_gx, rs);
        dxr[j] = accumulate_dx ? dxr[j] + d : d;
      }
    }
  });
  // dgamma, dbeta: column blocks over the threads, each column summed over the rows in row order.
  parallel_ranges(c, 64, [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = xp + r * c;
      const float* dyr = gp + r * c;
      const float m = mp[r], rs = rp[r];
      for (int64_t j = j0; j < j1; ++j) {
        const float xhat = (xr[j] - m) * rs;
        dg[j] += dyr[j] * xhat;
        db[j] += dyr[j];
      }
    }
  });
}

// ---- attention -------------------------------------------------------------------------------------------------
//
// One window at a time: its heads are repacked into contiguous [H, T, hs] blocks (oneDNN's brgemm takes those; the
// strided columns of qkv would send it to a slower kernel), then q k^T, p v and the four backward products are
// batched matmuls over the H heads. Operands are bf16 where both are bf16 and the CPU has bf16 kernels (native,
// FP32 accumulation: onednn::engine_dtype), else FP32 (converted exactly). Scores, softmax, probabilities and their
// gradient stay FP32; the full T x T products are computed and the causal and key masks are applied in the softmax
// (masked probabilities are exact zeros, so they add nothing to p v or to the gradients).

namespace {

// The engine dtype of a product of two operands held in dtypes x and y.
DType engine_dtype(DType x, DType y) { return x == y ? onednn::engine_dtype(x) : DType::kFloat32; }

// A buffer of n elements of dtype d, grown once to the largest request.
struct Scratch {
  std::vector<float> buf;
  void* get(int64_t n, DType d) {
    const size_t words = (static_cast<size_t>(n) * dtype_size(d) + 3) / 4;
    if (buf.size() < words) buf.resize(words);
    return buf.data();
  }
};

// dst[h, t, e] = src[t * ld + col + h * hs + e] for one window's T rows, converted from src_dtype to dst_dtype
// (exact: the pairs used are equal dtypes, or 16-bit to FP32).
void gather_heads(const void* src, DType src_dtype, int64_t ld, int64_t col, int64_t T, int64_t H, int64_t hs,
                  void* dst, DType dst_dtype) {
  dispatch_dtype(src_dtype, [&](auto stag) {
    using S = decltype(stag);
    dispatch_dtype(dst_dtype, [&](auto dtag) {
      using D = decltype(dtag);
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const S* row = s + t * ld + col + h * hs;
          D* out = d + (h * T + t) * hs;
          if constexpr (std::is_same_v<S, D>) {
            std::memcpy(out, row, static_cast<size_t>(hs) * sizeof(S));
          } else if constexpr (std::is_same_v<D, float>) {
            widen_block(row, out, hs);  // vectorised (convert.h): a cast per element was 2.5% of a widened bf16 step
          } else {
            for (int64_t e = 0; e < hs; ++e) out[e] = static_cast<D>(static_cast<float>(row[e]));
          }
        }
    });
  });
}

// The inverse: dst[t * ld + col + h * hs + e] = src[h, t, e], FP32 or dst's dtype, rounded once to dst_dtype.
void scatter_heads(const void* src, DType src_dtype, int64_t T, int64_t H, int64_t hs, void* dst, DType dst_dtype,
                   int64_t ld, int64_t col) {
  dispatch_dtype(src_dtype, [&](auto stag) {
    using S = decltype(stag);
    dispatch_dtype(dst_dtype, [&](auto dtag) {
      using D = decltype(dtag);
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const S* in = s + (h * T + t) * hs;
          D* row = d + t * ld + col + h * hs;
          if constexpr (std::is_same_v<S, D>) {
            std::memcpy(row, in, static_cast<size_t>(hs) * sizeof(S));
          } else {
            for (int64_t e = 0; e < hs; ++e) row[e] = static_cast<D>(static_cast<float>(in[e]));
          }
        }
    });
  });
}

// c[h] = alpha * op(a[h]) op(b[h]) for h < H, contiguous blocks: a [H, m, k] ([H, k, m] when ta), b [H, k, n]
// ([H, n, k] when tb), c [H, m, n].
void batched_matmul(int64_t H, int64_t m, int64_t n, int64_t k, DType ab, const void* a, bool ta, const void* b,
                    bool tb, DType c_dtype, void* c, float alpha = 1.0f) {
  onednn::Matmul mm;
  mm.batch = H;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.ab_dtype = ab;
  mm.c_dtype = c_dtype;
  mm.a_stride[0] = m * k;
  mm.a_stride[1] = ta ? 1 : k;
  mm.a_stride[2] = ta ? m : 1;
  mm.b_stride[0] = k * n;
  mm.b_stride[1] = tb ? 1 : n;
  mm.b_stride[2] = tb ? k : 1;
  mm.c_stride[0] = m * n;
  mm.c_stride[1] = n;
  mm.c_stride[2] = 1;
  mm.alpha = alpha;
  onednn::matmul(mm, a, b, c);
}

// p[0..T) rounded to `dtype` (round to nearest even) into out, which holds `engine` values (bf16 or FP32).
void round_row(const float* p, int64_t T, DType dtype, void* out, DType engine) {
  if (engine == DType::kBFloat16) {  // Eigen's vectorised conversion: the same rounding as bfloat16(x)
    Eigen::Map<Eigen::Array<bfloat16, Eigen::Dynamic, 1>>(static_cast<bfloat16*>(out), T) =
        Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, 1>>(p, T).cast<bfloat16>();
  } else if (dtype == DType::kFloat32) {
    std::memcpy(out, p, static_cast<size_t>(T) * sizeof(float));
  } else {
    // Rounded to dtype and widened back in blocks (convert.h's loops: the bits of float(T(x))), which vectorise.
    float* o = static_cast<float*>(out);
    dispatch_dtype(dtype, [&](auto tag) {
      using T16 = decltype(tag);
      if constexpr (!std::is_same_v<T16, float>) {
        T16 block[256];
        for (int64_t j0 = 0; j0 < T; j0 += 256) {
          const int64_t w = std::min<int64_t>(256, T - j0);
          narrow_block(p + j0, block, w);
          widen_block(block, o + j0, w);
        }
      }
    });
  }
}

const char* bytes_at(const Tensor& t, int64_t element) {
  return static_cast<const char*>(t.data()) + element * static_cast<int64_t>(dtype_size(t.dtype()));
}
char* bytes_at(Tensor& t, int64_t element) {
  return static_cast<char*>(t.data()) + element * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  checks::attention_forward(qkv, s, key_mask, probs, out, Device::kCPU);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  const DType dq = qkv.dtype();
  const DType g_qk = engine_dtype(dq, dq), g_pv = engine_dtype(pv_dtype, dq);
  // p v writes straight into a bf16 output; otherwise FP32, rounded once when scattered into out.
  const DType o_dtype = g_pv == DType::kBFloat16 && out.dtype() == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * C;
  float* pp = probs.data_as<float>();
  const size_t pr_es = dtype_size(g_pv);
  // Windows over the threads (each with its own scratch; oneDNN then runs each product on its calling thread),
  // or, for a single window, one window with oneDNN's threads.
  parallel_ranges(B, 1, [&](int64_t b0, int64_t b1) {
    thread_local Scratch sq, sk, sv, ss, sp, so;
    void* qh = sq.get(H * T * hs, g_qk);
    void* kh = sk.get(H * T * hs, g_qk);
    void* vh = sv.get(H * T * hs, g_pv);
    float* scores = static_cast<float*>(ss.get(H * T * T, DType::kFloat32));
    // FP32 p v reads the saved FP32 probabilities themselves (round_row would copy them unchanged).
    const bool probs_direct = pv_dtype == DType::kFloat32 && g_pv == DType::kFloat32;
    void* pr = probs_direct ? nullptr : sp.get(H * T * T, g_pv);
    void* oh = so.get(H * T * hs, o_dtype);
    for (int64_t b = b0; b < b1; ++b) {
      const char* slab = bytes_at(qkv, b * T * ld);
      gather_heads(slab, dq, ld, 0, T, H, hs, qh, g_qk);
      gather_heads(slab, dq, ld, C, T, H, hs, kh, g_qk);
      gather_heads(slab, dq, ld, 2 * C, T, H, hs, vh, g_pv);
      batched_matmul(H, T, T, hs, g_qk, qh, false, kh, true, DType::kFloat32, scores, scale);
      const uint8_t* mask = key_mask.empty() ? nullptr : key_mask.data() + b * T;
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          const float* srow = scores + (h * T + i) * T;
          float* p = pp + ((b * H + h) * T + i) * T;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= i; ++j)
            if (!mask || mask[j]) mx = std::max(mx, srow[j]);
          float sum = 0.0f;
          for (int64_t j = 0; j < T; ++j) {
            const bool allowed = j <= i && (!mask || mask[j]);
            p[j] = allowed ? math::softmax_exp(srow[j], mx) : 0.0f;
            sum += p[j];
          }
          const float inv = math::softmax_inv_sum(sum);
          for (int64_t j = 0; j < T; ++j) p[j] *= inv;
          if (!probs_direct) round_row(p, T, pv_dtype, static_cast<char*>(pr) + (h * T + i) * T * pr_es, g_pv);
        }
      }
      batched_matmul(H, T, hs, T, g_pv, probs_direct ? pp + b * H * T * T : pr, false, vh, false, o_dtype, oh);
      scatter_heads(oh, o_dtype, T, H, hs, bytes_at(out, b * T * C), out.dtype(), C, 0);
    }
  });
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,
                        const Tensor& dout, Tensor& dqkv) {
  checks::attention_backward(qkv, probs, s, dout, dqkv, Device::kCPU);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  const DType dq = qkv.dtype(), dg = dout.dtype();
  const DType g_dv = engine_dtype(pv_dtype, dg), g_dp = engine_dtype(dg, dq);
  const float* pp = probs.data_as<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * C;
  const size_t pr_es = dtype_size(g_dv);
  parallel_ranges(B, 1, [&](int64_t b0, int64_t b1) {  // as the forward: windows over the threads
    thread_local Scratch s_g1, s_g2, s_v, s_q, s_k, s_pr, s_dp, s_ds, s_dq, s_dk, s_dv;
    void* g1 = s_g1.get(H * T * hs, g_dv);                      // dout's heads for dv = p^T g
    void* g2 = g_dp == g_dv ? g1 : s_g2.get(H * T * hs, g_dp);  // ... for dp = g v^T
    void* vh = s_v.get(H * T * hs, g_dp);
    float* qh = static_cast<float*>(s_q.get(H * T * hs, DType::kFloat32));
    float* kh = static_cast<float*>(s_k.get(H * T * hs, DType::kFloat32));
    const bool probs_direct = pv_dtype == DType::kFloat32 && g_dv == DType::kFloat32;  // as in the forward
    void* pr = probs_direct ? nullptr : s_pr.get(H * T * T, g_dv);
    float* dp = static_cast<float*>(s_dp.get(H * T * T, DType::kFloat32));
    float* ds = static_cast<float*>(s_ds.get(H * T * T, DType::kFloat32));
    float* dqh = static_cast<float*>(s_dq.get(H * T * hs, DType::kFloat32));
    float* dkh = static_cast<float*>(s_dk.get(H * T * hs, DType::kFloat32));
    float* dvh = static_cast<float*>(s_dv.get(H * T * hs, DType::kFloat32));
    for (int64_t b = b0; b < b1; ++b) {
      const char* slab = bytes_at(qkv, b * T * ld);
      const char* gslab = bytes_at(dout, b * T * C);
      gather_heads(gslab, dg, C, 0, T, H, hs, g1, g_dv);
      if (g2 != g1) gather_heads(gslab, dg, C, 0, T, H, hs, g2, g_dp);
      gather_heads(slab, dq, ld, 2 * C, T, H, hs, vh, g_dp);
      gather_heads(slab, dq, ld, 0, T, H, hs, qh, DType::kFloat32);
      gather_heads(slab, dq, ld, C, T, H, hs, kh, DType::kFloat32);
      const float* pb = pp + b * H * T * T;
      if (!probs_direct)
        for (int64_t r = 0; r < H * T; ++r)
          round_row(pb + r * T, T, pv_dtype, static_cast<char*>(pr) + r * T * pr_es, g_dv);
      batched_matmul(H, T, hs, T, g_dv, probs_direct ? pb : pr, true, g1, false, DType::kFloat32, dvh);  // dv = p^T g
      batched_matmul(H, T, T, hs, g_dp, g2, false, vh, true, DType::kFloat32, dp);    // dp = g v^T
      for (int64_t r = 0; r < H * T; ++r) {
        const int64_t i = r % T;
        const float* p = pb + r * T;
        const float* dpr = dp + r * T;
        float* dsr = ds + r * T;
        float dot = 0.0f;
        for (int64_t j = 0; j <= i; ++j) dot += p[j] * dpr[j];
        for (int64_t j = 0; j <= i; ++j) dsr[j] = math::softmax_backward(p[j], dpr[j], dot) * scale;
        for (int64_t j = i + 1; j < T; ++j) dsr[j] = 0.0f;
      }
      batched_matmul(H, T, hs, T, DType::kFloat32, ds, false, kh, false, DType::kFloat32, dqh);  // dq = ds k
      batched_matmul(H, T, hs, T, DType::kFloat32, ds, true, qh, false, DType::kFloat32, dkh);   // dk = ds^T q
      char* dslab = bytes_at(dqkv, b * T * ld);
      scatter_heads(dqh, DType::kFloat32, T, H, hs, dslab, dqkv.dtype(), ld, 0);
      scatter_heads(dkh, DType::kFloat32, T, H, hs, dslab, dqkv.dtype(), ld, C);
      scatter_heads(dvh, DType::kFloat32, T, H, hs, dslab, dqkv.dtype(), ld, 2 * C);
    }
  });
}

// ---- fused causal attention (FlashAttention-2) ------------------------------------------------------------------
//
// Threads over the B x H (window, head) pairs, each with its own scratch: the pair's q, k, v repacked into
// contiguous [T, hs] blocks (as above), one [kFlashQueryBlock, kFlashKeyBlock] score tile and its FP32 accumulators.
// The block GEMMs run on the calling thread: oneDNN's sgemm for FP32 operands, its matmul for native bf16 (FP32
// output, sum post-op for the accumulating products).

namespace {

// C[m, n] (FP32, row-major, ldc) = alpha op(A) op(B) + beta C, A and B of dtype ab (FP32, or bf16 where native), each
// row-major with its row length lda / ldb as stored.
void block_gemm(DType ab, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                const void* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (ab == DType::kFloat32)
    return onednn::sgemm(ta, tb, m, n, k, alpha, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb,
                         beta, c, ldc);
  onednn::Matmul mm;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.ab_dtype = ab;
  mm.c_dtype = DType::kFloat32;
  mm.a_stride[1] = ta ? 1 : lda;
  mm.a_stride[2] = ta ? lda : 1;
  mm.b_stride[1] = tb ? 1 : ldb;
  mm.b_stride[2] = tb ? ldb : 1;
  mm.c_stride[1] = ldc;
  mm.c_stride[2] = 1;
  mm.alpha = alpha;
  mm.beta = beta;
  onednn::matmul(mm, a, b, c);
}

// Element offset of row r of a [T, hs] head block of dtype d, as bytes.
const char* row_at(const void* base, DType d, int64_t r, int64_t hs) {
  return static_cast<const char*>(base) + r * hs * static_cast<int64_t>(dtype_size(d));
}

// Whether query i may attend key j (causal, and the window's key mask).
bool allowed(int64_t i, int64_t j, const uint8_t* mask) { return j <= i && (!mask || mask[j]); }

// The forward's score tile: s[r, c] = scale * q_{i0 + r} . k_{j0 + c}, FP32, rows i0 .. i1, keys j0 .. j0 + n.
// The backward calls it with the same arguments, so it recomputes the forward's scores bit for bit.
void score_tile(DType g_qk, const void* qh, const void* kh, int64_t i0, int64_t i1, int64_t j0, int64_t n, int64_t hs,
                float scale, float* tile) {
  block_gemm(g_qk, false, true, i1 - i0, n, hs, scale, row_at(qh, g_qk, i0, hs), hs, row_at(kh, g_qk, j0, hs), hs, 0.0f,
             tile, n);
}

// out[b*T + i, h*hs ..] (dtype of dst) = src[i, 0 .. hs) for rows i0 .. i1 of one head, rounded once.
void store_head_rows(const float* src, int64_t rows, int64_t hs, void* dst, DType dst_dtype, int64_t ld) {
  dispatch_dtype(dst_dtype, [&](auto tag) {
    using D = decltype(tag);
    for (int64_t r = 0; r < rows; ++r) {
      D* o = static_cast<D*>(dst) + r * ld;
      if constexpr (std::is_same_v<D, float>) {
        std::memcpy(o, src + r * hs, static_cast<size_t>(hs) * sizeof(float));
      } else {
        narrow_block(src + r * hs, o, hs);
      }
    }
  });
}

}  // namespace

void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                             DType pv_dtype, Tensor& stats, Tensor& out) {
  checks::flash_attention_forward(qkv, s, key_mask, stats, out, Device::kCPU);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  const DType dq = qkv.dtype();
  const DType g_qk = engine_dtype(dq, dq), g_pv = engine_dtype(pv_dtype, dq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * C, QB = kFlashQueryBlock, KB = kFlashKeyBlock;
  float* st = stats.data_as<float>();
  parallel_ranges(B * H, 1, [&](int64_t p0, int64_t p1) {
    thread_local Scratch sq, sk, sv, ss, sp, sa;
    void* qh = sq.get(T * hs, g_qk);
    void* kh = sk.get(T * hs, g_qk);
    void* vh = sv.get(T * hs, g_pv);
    float* tile = static_cast<float*>(ss.get(QB * KB, DType::kFloat32));
    const bool p_direct = pv_dtype == DType::kFloat32 && g_pv == DType::kFloat32;  // round_row would copy p
    void* pr = p_direct ? nullptr : sp.get(QB * KB, g_pv);  // the rounded p of the tile, the p @ v operand
    float* acc = static_cast<float*>(sa.get(QB * hs + 2 * QB, DType::kFloat32));
    float* m = acc + QB * hs;  // running row maximum
    float* l = m + QB;         // running row sum of exp(s - m)
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t b = pair / H, h = pair % H;
      const char* slab = bytes_at(qkv, b * T * ld);
      gather_heads(slab, dq, ld, h * hs, T, 1, hs, qh, g_qk);
      gather_heads(slab, dq, ld, C + h * hs, T, 1, hs, kh, g_qk);
      gather_heads(slab, dq, ld, 2 * C + h * hs, T, 1, hs, vh, g_pv);
      const uint8_t* mask = key_mask.empty() ? nullptr : key_mask.data() + b * T;
      for (int64_t i0 = 0; i0 < T; i0 += QB) {
        const int64_t i1 = std::min(T, i0 + QB), rows = i1 - i0;
        std::fill_n(acc, rows * hs, 0.0f);
        std::fill_n(m, rows, -std::numeric_limits<float>::infinity());
        std::fill_n(l, rows, 0.0f);
        for (int64_t j0 = 0; j0 < i1; j0 += KB) {  // keys after the block's last query are never computed
          const int64_t n = std::min(KB, i1 - j0);
          score_tile(g_qk, qh, kh, i0, i1, j0, n, hs, scale, tile);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            float* srow = tile + r * n;
            float bmax = -std::numeric_limits<float>::infinity();
            for (int64_t c = 0; c < n; ++c)
              if (allowed(i, j0 + c, mask)) bmax = std::max(bmax, srow[c]);
            const float m_new = std::max(m[r], bmax);
            float sum = 0.0f;
            if (m_new == -std::numeric_limits<float>::infinity()) {  // no allowed key yet: nothing to add
              std::fill_n(srow, n, 0.0f);
            } else {
              for (int64_t c = 0; c < n; ++c) {
                srow[c] = allowed(i, j0 + c, mask) ? math::softmax_exp(srow[c], m_new) : 0.0f;
                sum += srow[c];
              }
              if (m_new != m[r]) {  // rescale what was accumulated under the old maximum (0 before any key)
                const float alpha = m[r] == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                                      : math::softmax_exp(m[r], m_new);
                l[r] *= alpha;
                for (int64_t e = 0; e < hs; ++e) acc[r * hs + e] *= alpha;
                m[r] = m_new;
              }
            }
            l[r] += sum;
            if (!p_direct) round_row(srow, n, pv_dtype, static_cast<char*>(pr) + r * n * dtype_size(g_pv), g_pv);
          }
          block_gemm(g_pv, false, false, rows, hs, n, 1.0f, p_direct ? tile : pr, n, row_at(vh, g_pv, j0, hs), hs, 1.0f, acc, hs);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float inv = math::softmax_inv_sum(l[r]);
          for (int64_t e = 0; e < hs; ++e) acc[r * hs + e] *= inv;
          float* sr = st + ((b * H + h) * T + i0 + r) * 2;
          sr[0] = inv > 0.0f ? m[r] : 0.0f;
          sr[1] = inv;
        }
        store_head_rows(acc, rows, hs, bytes_at(out, (b * T + i0) * C + h * hs), out.dtype(), C);
      }
    }
  });
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,
                              std::span<const uint8_t> key_mask, DType pv_dtype, const Tensor& dout, Tensor& dqkv) {
  checks::flash_attention_backward(qkv, out, stats, s, key_mask, dout, dqkv, Device::kCPU);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  const DType dq = qkv.dtype(), dg = dout.dtype();
  const DType g_qk = engine_dtype(dq, dq), g_dv = engine_dtype(pv_dtype, dg), g_dp = engine_dtype(dg, dq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * C, QB = kFlashQueryBlock, KB = kFlashKeyBlock;
  const float* st = stats.data_as<float>();
  parallel_ranges(B * H, 1, [&](int64_t p0, int64_t p1) {
    thread_local Scratch s_qe, s_ke, s_q, s_k, s_v, s_g1, s_g2, s_g32, s_o, s_tile, s_pr, s_dp, s_acc;
    void* qe = s_qe.get(T * hs, g_qk);  // q, k as the forward's score GEMM read them
    void* ke = s_ke.get(T * hs, g_qk);
    float* q32 = g_qk == DType::kFloat32 ? static_cast<float*>(qe) : static_cast<float*>(s_q.get(T * hs, DType::kFloat32));
    float* k32 = g_qk == DType::kFloat32 ? static_cast<float*>(ke) : static_cast<float*>(s_k.get(T * hs, DType::kFloat32));
    void* vh = s_v.get(T * hs, g_dp);
    void* g1 = s_g1.get(T * hs, g_dv);                          // dout's head for dv = p^T g
    void* g2 = g_dp == g_dv ? g1 : s_g2.get(T * hs, g_dp);      // ... for dp = g v^T
    float* o32 = static_cast<float*>(s_o.get(T * hs, DType::kFloat32));
    float* tile = static_cast<float*>(s_tile.get(QB * KB, DType::kFloat32));
    void* pr = s_pr.get(QB * KB, g_dv);
    float* dp = static_cast<float*>(s_dp.get(QB * KB, DType::kFloat32));
    float* dqh = static_cast<float*>(s_acc.get(3 * T * hs + T, DType::kFloat32));
    float* dkh = dqh + T * hs;
    float* dvh = dkh + T * hs;
    float* D = dvh + T * hs;
    const bool p_direct = pv_dtype == DType::kFloat32 && g_dv == DType::kFloat32;  // round_row would copy p
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t b = pair / H, h = pair % H;
      const char* slab = bytes_at(qkv, b * T * ld);
      const char* gslab = bytes_at(dout, b * T * C);
      gather_heads(slab, dq, ld, h * hs, T, 1, hs, qe, g_qk);
      gather_heads(slab, dq, ld, C + h * hs, T, 1, hs, ke, g_qk);
      if (q32 != qe) {
        gather_heads(slab, dq, ld, h * hs, T, 1, hs, q32, DType::kFloat32);
        gather_heads(slab, dq, ld, C + h * hs, T, 1, hs, k32, DType::kFloat32);
      }
      gather_heads(slab, dq, ld, 2 * C + h * hs, T, 1, hs, vh, g_dp);
      gather_heads(gslab, dg, C, h * hs, T, 1, hs, g1, g_dv);
      if (g2 != g1) gather_heads(gslab, dg, C, h * hs, T, 1, hs, g2, g_dp);
      gather_heads(bytes_at(out, b * T * C), out.dtype(), C, h * hs, T, 1, hs, o32, DType::kFloat32);
      // D_i = dout_i . out_i in FP32, from an exact FP32 copy of dout's head (one of the gathers above when FP32).
      const float* g32 = g_dv == DType::kFloat32 ? static_cast<const float*>(g1)
                         : g_dp == DType::kFloat32 ? static_cast<const float*>(g2)
                                                   : static_cast<const float*>(s_g32.get(T * hs, DType::kFloat32));
      if (g_dv != DType::kFloat32 && g_dp != DType::kFloat32)
        gather_heads(gslab, dg, C, h * hs, T, 1, hs, const_cast<float*>(g32), DType::kFloat32);
      for (int64_t i = 0; i < T; ++i) {
        float d = 0.0f;
        for (int64_t e = 0; e < hs; ++e) d += g32[i * hs + e] * o32[i * hs + e];
        D[i] = d;
      }
      std::fill_n(dqh, 3 * T * hs, 0.0f);
      const uint8_t* mask = key_mask.empty() ? nullptr : key_mask.data() + b * T;
      const float* stp = st + (b * H + h) * T * 2;
      for (int64_t i0 = 0; i0 < T; i0 += QB) {
        const int64_t i1 = std::min(T, i0 + QB), rows = i1 - i0;
        for (int64_t j0 = 0; j0 < i1; j0 += KB) {
          const int64_t n = std::min(KB, i1 - j0);
          score_tile(g_qk, qe, ke, i0, i1, j0, n, hs, scale, tile);
          for (int64_t r = 0; r < rows; ++r) {  // p = exp(s - m) / l, exactly as the forward's final p
            const int64_t i = i0 + r;
            const float mr = stp[i * 2], inv = stp[i * 2 + 1];
            float* prow = tile + r * n;
            for (int64_t c = 0; c < n; ++c)
              prow[c] = inv > 0.0f && allowed(i, j0 + c, mask) ? math::softmax_exp(prow[c], mr) * inv : 0.0f;
            if (!p_direct) round_row(prow, n, pv_dtype, static_cast<char*>(pr) + r * n * dtype_size(g_dv), g_dv);
          }
          // dv[j0 ..] += round(p)^T g;  dp = g v^T
          block_gemm(g_dv, true, false, n, hs, rows, 1.0f, p_direct ? tile : pr, n, row_at(g1, g_dv, i0, hs), hs, 1.0f,
                     dvh + j0 * hs, hs);
          block_gemm(g_dp, false, true, rows, n, hs, 1.0f, row_at(g2, g_dp, i0, hs), hs, row_at(vh, g_dp, j0, hs), hs,
                     0.0f, dp, n);
          for (int64_t r = 0; r < rows; ++r) {
            const float* prow = tile + r * n;
            float* dsr = dp + r * n;
            for (int64_t c = 0; c < n; ++c) dsr[c] = math::softmax_backward(prow[c], dsr[c], D[i0 + r]) * scale;
          }
          // dq[i0 ..] += ds k;  dk[j0 ..] += ds^T q  (FP32)
          block_gemm(DType::kFloat32, false, false, rows, hs, n, 1.0f, dp, n, k32 + j0 * hs, hs, 1.0f, dqh + i0 * hs, hs);
          block_gemm(DType::kFloat32, true, false, n, hs, rows, 1.0f, dp, n, q32 + i0 * hs, hs, 1.0f, dkh + j0 * hs, hs);
        }
      }
      char* dslab = bytes_at(dqkv, b * T * ld);
      store_head_rows(dqh, T, hs, dslab + h * hs * dtype_size(dqkv.dtype()), dqkv.dtype(), ld);
      store_head_rows(dkh, T, hs, dslab + (C + h * hs) * dtype_size(dqkv.dtype()), dqkv.dtype(), ld);
      store_head_rows(dvh, T, hs, dslab + (2 * C + h * hs) * dtype_size(dqkv.dtype()), dqkv.dtype(), ld);
    }
  });
}

// ---- dropout ---------------------------------------------------------------------------------------------------

void dropout_inplace(Tensor& x, float p, const DropoutKey& key, std::span<const uint32_t> sample_ids,
                     int64_t seq_len) {
  if (!checks::dropout(x, p, sample_ids, seq_len, Device::kCPU)) return;
  const int64_t n = x.dim(0), c = x.dim(1);
  const float inv_keep = 1.0f / (1.0f - p);
  thread_local std::vector<float> xs;
  const float* in = fp32_of(x, xs);
  float* out = fp32_out(x, xs);  // in place: the same buffer
  parallel_ranges(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const RngStream rng{key.seed, {key.step, sample_ids[static_cast<size_t>(r / seq_len)], key.site},
                          RngPurpose::kDropout};
      const uint64_t first = static_cast<uint64_t>((r % seq_len) * c);
      for (int64_t j = 0; j < c; ++j)
        out[r * c + j] = math::dropout(in[r * c + j], rng.uniform(first + j), p, inv_keep);
    }
  });
  store(x, out);
}

// ---- residual --------------------------------------------------------------------------------------------------

void add_inplace(Tensor& x, const Tensor& y) {
  checks::add_inplace(x, y, Device::kCPU);
  thread_local std::vector<float> ys;
  const float* b = fp32_of(y, ys);
  float* a = x.data_as<float>();
  parallel_ranges(x.numel(), int64_t{1} << 15, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) a[i] += b[i];
  });
}

}  // namespace ampdist::kernels::cpu
