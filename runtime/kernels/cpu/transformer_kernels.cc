// CPU backend of kernels/transformer.h (kernels/transformer_dispatch.cc picks it for host tensors): plain loops over kernels/math.h, FP32 arithmetic throughout. Inputs of
// 16-bit dtypes are converted exactly to FP32 scratch buffers owned by the calling thread (sized once, reused), and
// results are rounded once to the output's dtype.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/math.h"
#include "runtime/kernels/transformer.h"
#include "runtime/kernels/transformer_backends.h"
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

// x rounded to `dtype` and back (round to nearest even, Eigen's conversions).
float round_to(float x, DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return static_cast<float>(half(x));
    case DType::kBFloat16: return static_cast<float>(bfloat16(x));
    case DType::kFloat32: break;
  }
  return x;
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
  for (int64_t r = 0; r < n; ++r) {
    const int32_t tok = tokens[static_cast<size_t>(r)];
    const float* a = te + static_cast<int64_t>(tok) * c;
    const float* b = pe + (r % seq_len) * c;
    float* o = y + r * c;
    for (int64_t j = 0; j < c; ++j) o[j] = a[j] + b[j];
  }
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
  for (int64_t r = 0; r < n; ++r) {
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
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * c;
    const float* dyr = gp + r * c;
    const float m = mp[r], rs = rp[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (xr[j] - m) * rs;
      const float g = dyr[j] * gam[j];
      sum_g += g;
      sum_gx += g * xhat;
      dg[j] += dyr[j] * xhat;
      db[j] += dyr[j];
    }
    const float mean_g = sum_g * inv_c, mean_gx = sum_gx * inv_c;
    float* dxr = dxp + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (xr[j] - m) * rs;
      const float d = math::layernorm_backward(dyr[j] * gam[j], xhat, mean_g, mean_gx, rs);
      dxr[j] = accumulate_dx ? dxr[j] + d : d;
    }
  }
}

// ---- attention -------------------------------------------------------------------------------------------------


void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  checks::attention_forward(qkv, s, key_mask, probs, out, Device::kCPU);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  thread_local std::vector<float> qs, os, row, acc, kt, vh, pr;
  const float* q = fp32_of(qkv, qs);
  float* o = fp32_out(out, os);
  float* pp = probs.data_as<float>();
  row.resize(static_cast<size_t>(T));
  pr.resize(static_cast<size_t>(T));
  acc.resize(static_cast<size_t>(hs));
  kt.resize(static_cast<size_t>(hs * T));  // this head's keys transposed, [hs, T]: score loops run along j
  vh.resize(static_cast<size_t>(T * hs));  // this head's values, [T, hs]
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * C;
  float* srow = row.data();
  float* prow = pr.data();
  float* a = acc.data();
  float* K = kt.data();
  float* Vh = vh.data();
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* mask = key_mask.empty() ? nullptr : key_mask.data() + b * T;
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t j = 0; j < T; ++j) {
        const float* kj = q + (b * T + j) * ld + C + h * hs;
        const float* vj = q + (b * T + j) * ld + 2 * C + h * hs;
        for (int64_t e = 0; e < hs; ++e) {
          K[e * T + j] = kj[e];
          Vh[j * hs + e] = vj[e];
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = q + (b * T + i) * ld + h * hs;
        float* p = pp + ((b * H + h) * T + i) * T;
        std::fill(srow, srow + i + 1, 0.0f);
        for (int64_t e = 0; e < hs; ++e) {
          const float qe = qi[e];
          const float* ke = K + e * T;
          for (int64_t j = 0; j <= i; ++j) srow[j] += qe * ke[j];
        }
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          srow[j] *= scale;
          if (!mask || mask[j]) mx = std::max(mx, srow[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < T; ++j) {
          const bool allowed = j <= i && (!mask || mask[j]);
          p[j] = allowed ? math::softmax_exp(srow[j], mx) : 0.0f;
          sum += p[j];
        }
        const float inv = math::softmax_inv_sum(sum);
        for (int64_t j = 0; j < T; ++j) {
          p[j] *= inv;
          prow[j] = round_to(p[j], pv_dtype);
        }
        std::fill(a, a + hs, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float pj = prow[j];
          const float* vj = Vh + j * hs;
          for (int64_t e = 0; e < hs; ++e) a[e] += pj * vj[e];
        }
        float* oi = o + (b * T + i) * C + h * hs;
        for (int64_t e = 0; e < hs; ++e) oi[e] = a[e];
      }
    }
  }
  store(out, o);
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,
                        const Tensor& dout, Tensor& dqkv) {
  checks::attention_backward(qkv, probs, s, dout, dqkv, Device::kCPU);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  thread_local std::vector<float> qs, gs, ds, dp;
  const float* q = fp32_of(qkv, qs);
  const float* g = fp32_of(dout, gs);
  ds.assign(static_cast<size_t>(B * T * 3 * C), 0.0f);  // capacity kept: assign reuses it after the first step
  float* d = ds.data();
  dp.resize(static_cast<size_t>(T));
  const float* pp = probs.data_as<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * C;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const float* p = pp + ((b * H + h) * T + i) * T;
        const float* gi = g + (b * T + i) * C + h * hs;
        const float* qi = q + (b * T + i) * ld + h * hs;
        float* dqi = d + (b * T + i) * ld + h * hs;
        float dot = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          const float* vj = q + (b * T + j) * ld + 2 * C + h * hs;
          float* dvj = d + (b * T + j) * ld + 2 * C + h * hs;
          const float pr = round_to(p[j], pv_dtype);
          float a = 0.0f;
          for (int64_t e = 0; e < hs; ++e) {
            a += gi[e] * vj[e];
            dvj[e] += pr * gi[e];
          }
          dp[j] = a;
          dot += p[j] * a;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const float dsj = math::softmax_backward(p[j], dp[j], dot) * scale;
          if (dsj == 0.0f) continue;  // masked keys (p = 0) add nothing
          const float* kj = q + (b * T + j) * ld + C + h * hs;
          float* dkj = d + (b * T + j) * ld + C + h * hs;
          for (int64_t e = 0; e < hs; ++e) {
            dqi[e] += dsj * kj[e];
            dkj[e] += dsj * qi[e];
          }
        }
      }
    }
  }
  if (dqkv.dtype() == DType::kFloat32) {
    std::memcpy(dqkv.data(), d, dqkv.nbytes());
  } else {
    store(dqkv, d);
  }
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
  for (int64_t r = 0; r < n; ++r) {
    const RngStream rng{key.seed, {key.step, sample_ids[static_cast<size_t>(r / seq_len)], key.site},
                        RngPurpose::kDropout};
    const uint64_t first = static_cast<uint64_t>((r % seq_len) * c);
    for (int64_t j = 0; j < c; ++j) out[r * c + j] = math::dropout(in[r * c + j], rng.uniform(first + j), p, inv_keep);
  }
  store(x, out);
}

// ---- residual --------------------------------------------------------------------------------------------------

void add_inplace(Tensor& x, const Tensor& y) {
  checks::add_inplace(x, y, Device::kCPU);
  thread_local std::vector<float> ys;
  const float* b = fp32_of(y, ys);
  float* a = x.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) a[i] += b[i];
}

}  // namespace ampdist::kernels::cpu
