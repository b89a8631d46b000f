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

namespace ampdist::kernels::cpu {
namespace {

void require_cpu(const char* op, const Tensor& t) {
  if (t.device() != Device::kCPU)
    throw Error(std::string(op) + ": tensor on " + device_name(t.device()) + ", this build has only the CPU backend");
}

void require_shape(const char* op, const char* what, const Tensor& t, const Shape& want) {
  require_cpu(op, t);
  if (t.shape() != want)
    throw Error(std::string(op) + ": " + what + " is " + shape_str(t.shape()) + ", expected " + shape_str(want));
}

void require_fp32(const char* op, const char* what, const Tensor& t) {
  if (t.dtype() != DType::kFloat32)
    throw Error(std::string(op) + ": " + what + " must be fp32, got " + dtype_name(t.dtype()));
}

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
  const char* op = "embedding_forward";
  require_cpu(op, wte);
  require_cpu(op, wpe);
  require_fp32(op, "wte", wte);
  require_fp32(op, "wpe", wpe);
  if (wte.ndim() != 2 || wpe.ndim() != 2 || wte.dim(1) != wpe.dim(1))
    throw Error(std::string(op) + ": wte " + shape_str(wte.shape()) + " and wpe " + shape_str(wpe.shape()) +
                " must be [V, C] and [T_max, C]");
  const int64_t n = static_cast<int64_t>(tokens.size()), c = wte.dim(1), v = wte.dim(0);
  if (seq_len <= 0 || seq_len > wpe.dim(0) || n % seq_len != 0)
    throw Error(std::string(op) + ": " + std::to_string(n) + " tokens are not windows of " +
                std::to_string(seq_len) + " <= " + std::to_string(wpe.dim(0)) + " positions");
  require_shape(op, "out", out, {n, c});
  require_fp32(op, "out", out);
  const float* te = wte.data_as<float>();
  const float* pe = wpe.data_as<float>();
  float* y = out.data_as<float>();
  for (int64_t r = 0; r < n; ++r) {
    const int32_t tok = tokens[static_cast<size_t>(r)];
    if (tok < 0 || tok >= v)
      throw Error(std::string(op) + ": token " + std::to_string(tok) + " at position " + std::to_string(r) +
                      " is outside the vocabulary [0, " + std::to_string(v) + ")",
                  ErrorKind::kBadInput);
    const float* a = te + static_cast<int64_t>(tok) * c;
    const float* b = pe + (r % seq_len) * c;
    float* o = y + r * c;
    for (int64_t j = 0; j < c; ++j) o[j] = a[j] + b[j];
  }
}

void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,
                        bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe) {
  const char* op = "embedding_backward";
  require_cpu(op, dout);
  require_fp32(op, "dwte", dwte);
  require_fp32(op, "dwpe", dwpe);
  const int64_t n = static_cast<int64_t>(tokens.size()), c = dwte.dim(1);
  require_shape(op, "dout", dout, {n, c});
  if (dwpe.dim(1) != c || seq_len > dwpe.dim(0))
    throw Error(std::string(op) + ": dwpe " + shape_str(dwpe.shape()) + " does not match " + std::to_string(c) +
                " channels and " + std::to_string(seq_len) + " positions");
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
  const char* op = "layernorm_forward";
  require_cpu(op, x);
  if (x.ndim() != 2) throw Error(std::string(op) + ": x is " + shape_str(x.shape()) + ", expected [N, C]");
  const int64_t n = x.dim(0), c = x.dim(1);
  require_shape(op, "gamma", gamma, {c});
  require_shape(op, "beta", beta, {c});
  require_fp32(op, "gamma", gamma);
  require_fp32(op, "beta", beta);
  require_shape(op, "y", y, {n, c});
  require_shape(op, "mean", mean, {n});
  require_shape(op, "rstd", rstd, {n});
  require_fp32(op, "mean", mean);
  require_fp32(op, "rstd", rstd);
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
  const char* op = "layernorm_backward";
  require_cpu(op, x);
  const int64_t n = x.dim(0), c = x.dim(1);
  require_shape(op, "dy", dy, {n, c});
  require_shape(op, "dx", dx, {n, c});
  require_fp32(op, "dx", dx);
  require_shape(op, "dgamma", dgamma, {c});
  require_shape(op, "dbeta", dbeta, {c});
  require_fp32(op, "dgamma", dgamma);
  require_fp32(op, "dbeta", dbeta);
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

namespace {
void check_attention(const char* op, const Tensor& qkv, const AttentionShape& s) {
  require_cpu(op, qkv);
  if (s.batch < 0 || s.seq_len <= 0 || s.n_head <= 0 || s.head_dim <= 0)
    throw Error(std::string(op) + ": bad shape B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq_len) +
                " H=" + std::to_string(s.n_head) + " hs=" + std::to_string(s.head_dim));
  require_shape(op, "qkv", qkv, {s.batch * s.seq_len, 3 * s.channels()});
}
}  // namespace

void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  const char* op = "attention_forward";
  check_attention(op, qkv, s);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  require_shape(op, "probs", probs, {B, H, T, T});
  require_fp32(op, "probs", probs);
  require_shape(op, "out", out, {B * T, C});
  if (!key_mask.empty() && static_cast<int64_t>(key_mask.size()) != B * T)
    throw Error(std::string(op) + ": key_mask has " + std::to_string(key_mask.size()) + " entries, expected " +
                std::to_string(B * T));
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
  const char* op = "attention_backward";
  check_attention(op, qkv, s);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  require_shape(op, "probs", probs, {B, H, T, T});
  require_fp32(op, "probs", probs);
  require_shape(op, "dout", dout, {B * T, C});
  require_shape(op, "dqkv", dqkv, {B * T, 3 * C});
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
  const char* op = "dropout_inplace";
  require_cpu(op, x);
  if (!(p >= 0.0f && p < 1.0f)) throw Error(std::string(op) + ": p must be in [0, 1), got " + std::to_string(p));
  if (p == 0.0f) return;
  if (x.ndim() != 2 || seq_len <= 0 || x.dim(0) != static_cast<int64_t>(sample_ids.size()) * seq_len)
    throw Error(std::string(op) + ": x " + shape_str(x.shape()) + " is not " + std::to_string(sample_ids.size()) +
                " windows of " + std::to_string(seq_len) + " rows");
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
  const char* op = "add_inplace";
  require_cpu(op, x);
  require_cpu(op, y);
  require_fp32(op, "x", x);
  if (x.numel() != y.numel())
    throw Error(std::string(op) + ": element counts differ: " + shape_str(x.shape()) + " vs " + shape_str(y.shape()));
  thread_local std::vector<float> ys;
  const float* b = fp32_of(y, ys);
  float* a = x.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) a[i] += b[i];
}

}  // namespace ampdist::kernels::cpu
