// The transformer ops (kernels/transformer.h) and the whole GPT model on the GPU against the CPU backend. Each test
// skips, saying why, without a GPU.
//
// Tolerances (tests/gpu/bounds.h for the notation and sources):
// - embedding (forward and backward), dropout and the residual add keep the CPU loops' order: bitwise equal.
// - LayerNorm: warp sums instead of the CPU's serial sums; per-element bounds derived in layernorm_bounds() below.
//   The backward is given the CPU's row statistics, so it differs only in its two row sums and the column sums.
// - attention: cuBLAS GEMMs (any order, tensor cores for 16-bit inputs) and a warp softmax; per-element bounds
//   derived in attention_bounds() below; the backward is given the CPU's probabilities.
// - fused attention: against the double-precision attention within the bound of tests/attention_reference.h (the one
//   the CPU's fused and materialised kernels are held to), and its CPU oracle; no [B, H, T, T] buffer exists.
// - the whole model composes all of these with the Linear GEMMs over two layers; its tolerance (loss 1e-5 relative,
//   gradients 1e-4 + 1e-3 relative) is an end-to-end check with a wide margin, not a derived bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/device.h"
#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"
#include "runtime/nn/gpt.h"
#include "tests/attention_reference.h"
#include "tests/gpu/bounds.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/op_coverage.h"

namespace ampdist {
namespace {

using testing::as;
using testing::floats;
using testing::random_tensor;

void expect_bitwise(const Tensor& got, const Tensor& want, const char* what) {
  const std::vector<float> a = floats(got), b = floats(want);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
}

AMPDIST_GPU_TEST_COVERS(GpuTransformer, EmbeddingDropoutAndAddAreBitwiseEqual,
                        "embedding_forward", "embedding_backward", "dropout_inplace", "add_inplace");
TEST(GpuTransformer, EmbeddingDropoutAndAddAreBitwiseEqual) {
  REQUIRE_GPU();
  const int64_t V = 50, Tmax = 16, T = 12, B = 3, C = 40, N = B * T;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 17 + 3) % V);
  tokens[5] = tokens[9];  // a repeated token: its gradient rows add up
  const Tensor wte = random_tensor({V, C}, 1), wpe = random_tensor({Tmax, C}, 2);
  Tensor out = Tensor::empty({N, C}, DType::kFloat32), out_d = Tensor::empty({N, C}, DType::kFloat32, Device::kCUDA);
  kernels::embedding_forward(tokens, T, wte, wpe, out);
  kernels::embedding_forward(tokens, T, wte.to(Device::kCUDA), wpe.to(Device::kCUDA), out_d);
  expect_bitwise(out_d, out, "embedding");
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor dout = as(random_tensor({N, C}, 3), dt);
    Tensor dwte = random_tensor({V, C}, 4), dwpe = random_tensor({Tmax, C}, 5);
    Tensor dwte_d = dwte.to(Device::kCUDA), dwpe_d = dwpe.to(Device::kCUDA);
    kernels::embedding_backward(tokens, T, dout, dwte, false, dwpe, true);
    kernels::embedding_backward(tokens, T, dout.to(Device::kCUDA), dwte_d, false, dwpe_d, true);
    expect_bitwise(dwte_d, dwte, "dwte");
    expect_bitwise(dwpe_d, dwpe, "dwpe");

    Tensor h = as(random_tensor({N, C}, 13), dt);
    Tensor h_d = h.to(Device::kCUDA);
    const std::vector<uint32_t> ids = {7, 123456, 42};
    const kernels::DropoutKey key{2024, 17, 3};
    kernels::dropout_inplace(h, 0.25f, key, ids, T);
    kernels::dropout_inplace(h_d, 0.25f, key, ids, T);
    expect_bitwise(h_d, h, "dropout");
    Tensor r = random_tensor({N, C}, 14);
    Tensor r_d = r.to(Device::kCUDA);
    kernels::add_inplace(r, h);
    kernels::add_inplace(r_d, h_d);
    expect_bitwise(r_d, r, "add_inplace");
  }
}


// ---- LayerNorm ---------------------------------------------------------------------------------------------------

// Bounds on |GPU - CPU| per element of LayerNorm, from the CPU's inputs and results (double arithmetic):
//   mean: s = sum x over c terms in two orders: 2 gamma(c) sum |x|; m = s / c rounded: flip.
//   d_j = x_j - m: |dm| + ulp (flip); v = sum d_j^2: each square moves by 2 |d| |dd| + |dd|^2 + ulp, the sum by
//   2 gamma(c) sum d^2 more; var = v / c, var + eps, sqrtf, 1 / . : each a rounding (flip), sqrt halving the
//   relative change and the reciprocal keeping it.
//   y_j = ((d_j rstd) gamma_j) + beta_j: products and the sum each a flip, then one ulp of y's dtype.
struct LnBounds {
  std::vector<double> mean, rstd, y;
};
LnBounds layernorm_bounds(const std::vector<float>& x, int64_t n, int64_t c, const std::vector<float>& gamma,
                          const std::vector<float>& beta, const std::vector<float>& mean, const std::vector<float>& rstd, float eps, DType yt) {
  using testing::flip;
  LnBounds b;
  b.mean.resize(n);
  b.rstd.resize(n);
  b.y.resize(n * c);
  const double g2 = 2 * testing::gamma(static_cast<double>(c));
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.data() + r * c;
    const double m = mean[r], rs = rstd[r];
    double sum_abs = 0.0;
    for (int64_t j = 0; j < c; ++j) sum_abs += std::fabs(xr[j]);
    const double dm = flip(m, g2 * sum_abs / c);
    double dv = 0.0, v = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double d = xr[j] - m, dd = flip(d, dm);
      v += d * d;
      dv += flip(d * d, 2 * std::fabs(d) * dd + dd * dd);
    }
    dv += g2 * v;
    const double var = v / c, a = var + eps;
    const double da = flip(a, flip(var, dv / c));
    const double sq = std::sqrt(a), dsq = flip(sq, 1.01 * da / (2 * std::sqrt(std::max(a - da, 1e-300))));
    const double drs = flip(rs, 1.01 * dsq / ((sq - dsq) * (sq - dsq)));
    b.mean[r] = dm;
    b.rstd[r] = drs;
    for (int64_t j = 0; j < c; ++j) {
      const double d = xr[j] - m, dd = flip(d, dm);
      const double p = d * rs, dp = flip(p, dd * rs + std::fabs(d) * drs + dd * drs);
      const double pg = p * gamma[j], dpg = flip(pg, dp * std::fabs(gamma[j]));
      const double y = pg + beta[j];
      b.y[r * c + j] = flip(y, flip(y, dpg), yt);  // + beta (FP32 flip), then the dtype's rounding
    }
  }
  return b;
}

void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& tol,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol[i])
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
}

AMPDIST_GPU_TEST_COVERS(GpuTransformer, LayerNormIsWithinItsDerivedBoundsAndDeterministic,
                        "layernorm_forward", "layernorm_backward");
TEST(GpuTransformer, LayerNormIsWithinItsDerivedBoundsAndDeterministic) {
  REQUIRE_GPU();
  const int64_t N = 70, C = 200;  // C not a multiple of 32: lanes with fewer elements
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = as(random_tensor({N, C}, 6, -3.0f, 5.0f), dt);
    const Tensor gamma = random_tensor({C}, 7), beta = random_tensor({C}, 8);
    Tensor y = Tensor::empty({N, C}, dt), mean = Tensor::empty({N}, DType::kFloat32), rstd = mean.to(Device::kCPU);
    Tensor y_d = Tensor::empty({N, C}, dt, Device::kCUDA), mean_d = Tensor::empty({N}, DType::kFloat32, Device::kCUDA),
           rstd_d = Tensor::empty({N}, DType::kFloat32, Device::kCUDA);
    const Tensor x_d = x.to(Device::kCUDA), gamma_d = gamma.to(Device::kCUDA), beta_d = beta.to(Device::kCUDA);
    kernels::layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
    kernels::layernorm_forward(x_d, gamma_d, beta_d, 1e-5f, y_d, mean_d, rstd_d);
    const LnBounds lb = layernorm_bounds(floats(x), N, C, floats(gamma), floats(beta), floats(mean), floats(rstd), 1e-5f, dt);
    expect_within(floats(mean_d), floats(mean), lb.mean, "layernorm mean");
    expect_within(floats(rstd_d), floats(rstd), lb.rstd, "layernorm rstd");
    expect_within(floats(y_d), floats(y), lb.y, "layernorm y");
    Tensor y_d2 = Tensor::empty({N, C}, dt, Device::kCUDA);
    kernels::layernorm_forward(x_d, gamma_d, beta_d, 1e-5f, y_d2, mean_d, rstd_d);
    expect_bitwise(y_d2, y_d, "layernorm y, second run");

    // Backward from the CPU's statistics: xhat_j and g_j = dy_j gamma_j are the same bits on both; the row sums
    // sum g and sum g xhat move by 2 gamma(c) sum |.|; mean_g, mean_gx by that / c and a flip; then
    // dx = rstd (g - mean_g - xhat mean_gx): three flips and the product's, and the accumulation's flip.
    // dgamma, dbeta: column sums of n + 1 terms (with the old value) in two orders: 2 gamma(n + 1) sum |.|.
    const Tensor dy = as(random_tensor({N, C}, 9), dt);
    Tensor dx = random_tensor({N, C}, 10), dg = random_tensor({C}, 11), db = random_tensor({C}, 12);
    const std::vector<float> dx0 = floats(dx), dg0 = floats(dg), db0 = floats(db);
    Tensor dx_d = dx.to(Device::kCUDA), dg_d = dg.to(Device::kCUDA), db_d = db.to(Device::kCUDA);
    kernels::layernorm_backward(x, gamma, mean, rstd, dy, dx, true, dg, db, true);
    kernels::layernorm_backward(x_d, gamma_d, mean.to(Device::kCUDA), rstd.to(Device::kCUDA), dy.to(Device::kCUDA),
                                dx_d, true, dg_d, db_d, true);
    const std::vector<float> fx = floats(x), fdy = floats(dy), fg = floats(gamma), fm = floats(mean),
                             fr = floats(rstd), want_dx = floats(dx);
    std::vector<double> tdx(N * C), tdg(C), tdb(C);
    const double g2c = 2 * testing::gamma(static_cast<double>(C)), g2n = 2 * testing::gamma(static_cast<double>(N + 1));
    for (int64_t j = 0; j < C; ++j) {
      tdg[j] = std::fabs(dg0[j]);
      tdb[j] = std::fabs(db0[j]);
    }
    for (int64_t r = 0; r < N; ++r) {
      double sg = 0, sgx = 0, mg = 0, mgx = 0;
      for (int64_t j = 0; j < C; ++j) {
        const float xhat = (fx[r * C + j] - fm[r]) * fr[r], g = fdy[r * C + j] * fg[j];
        sg += std::fabs(g);
        sgx += std::fabs(g * xhat);
        mg += g;
        mgx += static_cast<double>(g) * xhat;
        tdg[j] += std::fabs(static_cast<double>(fdy[r * C + j]) * xhat);
        tdb[j] += std::fabs(fdy[r * C + j]);
      }
      mg /= C;
      mgx /= C;
      const double dmg = testing::flip(mg, g2c * sg / C), dmgx = testing::flip(mgx, g2c * sgx / C);
      for (int64_t j = 0; j < C; ++j) {
        const double xhat = (fx[r * C + j] - fm[r]) * fr[r], g = static_cast<double>(fdy[r * C + j]) * fg[j];
        const double t1 = testing::flip(g - mg, dmg), t2 = testing::flip(xhat * mgx, std::fabs(xhat) * dmgx);
        const double d = fr[r] * (g - mg - xhat * mgx);
        const double dd = testing::flip(d, fr[r] * testing::flip(g - mg - xhat * mgx, t1 + t2));
        tdx[r * C + j] = testing::flip(want_dx[r * C + j], dd);
      }
    }
    for (int64_t j = 0; j < C; ++j) {
      tdg[j] *= g2n;
      tdb[j] *= g2n;
    }
    expect_within(floats(dx_d), want_dx, tdx, "layernorm dx");
    expect_within(floats(dg_d), floats(dg), tdg, "layernorm dgamma");
    expect_within(floats(db_d), floats(db), tdb, "layernorm dbeta");
  }
}

// ---- attention ---------------------------------------------------------------------------------------------------
// Bounds on |GPU - CPU| per element of attention, from the CPU's inputs and results (double arithmetic). q, k, v,
// g are the exact values of the 16-bit (or FP32) inputs; A_ij = sum_e |q_ie k_je|.
//   score s_ij = q_i . k_j / sqrt(hs): hs products summed by the CPU in order (gamma(hs)) and by cuBLAS in any
//     order (2 gamma(hs), tensor cores), then the CPU's extra rounding of the scaling: scale 3 gamma(hs) A + 2 ulp.
//   max m_i moves by at most the largest of its row's score bounds; e = expf(s - m) by
//     1.01 |d(s - m)| + kExpRel relative; the row sum by the largest of those + 2 gamma(T) (two orders); p = e / sum
//     (the CPU and the GPU both multiply by the reciprocal: two roundings) by the sum of those + 4 u relative.
//   round(p) to pv_dtype: + one ulp of pv_dtype (flip); out_ie = sum_j pr_ij v_je: sum_j |d pr| |v| + 3 gamma(T)
//     sum_j pr |v|, then one ulp of out's dtype.
// The backward is given the CPU's probabilities (so p and round(p) are the same bits):
//   dv_je = sum_i pr_ij g_ie: 3 gamma(T) sum |pr g|; dp_ij = g_i . v_j: 3 gamma(hs) sum_e |g v| (eps_dp);
//   dot_i = sum_j p dp: sum_j (p eps_dp + ulp(p dp)) + 2 gamma(T) sum_j p |dp|;
//   ds_ij = p (dp - dot) scale: scale (p (eps_dp + d dot + ulp(dp - dot)) + ulp(p (dp - dot))) + ulp(ds);
//   dq_ie = sum_j ds_ij k_je, dk_je = sum_i ds_ij q_ie: sum |d ds| |k| + 3 gamma(T) sum |ds k|; then the dtype's ulp.
struct AttnInputs {
  std::vector<float> qkv, g;
  int64_t B, T, H, hs;
  const uint8_t* mask;
  float q(int64_t b, int64_t t, int64_t h, int64_t e, int part) const {
    return qkv[(b * T + t) * 3 * H * hs + part * H * hs + h * hs + e];
  }
  bool allowed(int64_t b, int64_t i, int64_t j) const { return j <= i && (!mask || mask[b * T + j]); }
};

std::vector<double> attention_out_bounds(const AttnInputs& in, const std::vector<float>& probs,
                                         const std::vector<float>& out, DType pv, DType out_t,
                                         std::vector<double>* probs_tol) {
  using testing::flip;
  const int64_t B = in.B, T = in.T, H = in.H, hs = in.hs, C = H * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs)), u = testing::kU;
  std::vector<double> tol(B * T * C, 0.0);
  std::vector<double> ds(T), dpr(T);
  probs_tol->assign(probs.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double dm = 0.0, m = -INFINITY;
        std::vector<double> sv(T);
        for (int64_t j = 0; j < T; ++j) {
          double a = 0.0, sc = 0.0;
          for (int64_t e = 0; e < hs; ++e) {
            a += std::fabs(static_cast<double>(in.q(b, i, h, e, 0)) * in.q(b, j, h, e, 1));
            sc += static_cast<double>(in.q(b, i, h, e, 0)) * in.q(b, j, h, e, 1);
          }
          sv[j] = sc * scale;
          ds[j] = scale * 3 * testing::gamma(hs) * a + 2 * testing::ulp32(sv[j]);
          if (in.allowed(b, i, j)) {
            dm = std::max(dm, ds[j]);
            m = std::max(m, sv[j]);
          }
        }
        const float* p = probs.data() + ((b * H + h) * T + i) * T;
        // exp's argument s - m moves by both scores' bounds and its own rounding
        auto rho = [&](int64_t j) { return 1.01 * testing::flip(sv[j] - m, ds[j] + dm) + testing::kExpRel; };
        double rho_max = 0.0;
        for (int64_t j = 0; j < T; ++j)
          if (in.allowed(b, i, j)) rho_max = std::max(rho_max, rho(j));
        const double rho_sum = rho_max + 2 * testing::gamma(T);
        for (int64_t j = 0; j < T; ++j) {
          const double dp = in.allowed(b, i, j) ? p[j] * 1.01 * (rho(j) + rho_sum + 4 * u) : 0.0;
          dpr[j] = in.allowed(b, i, j) ? flip(p[j], dp, pv) : 0.0;
          (*probs_tol)[((b * H + h) * T + i) * T + j] = in.allowed(b, i, j) ? flip(p[j], dp) : 0.0;
        }
        for (int64_t e = 0; e < hs; ++e) {
          double t = 0.0, mag = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            const double v = std::fabs(in.q(b, j, h, e, 2));
            t += dpr[j] * v;
            mag += std::fabs(p[j]) * v;
          }
          const int64_t o = (b * T + i) * C + h * hs + e;
          tol[o] = flip(out[o], t + 3 * testing::gamma(T) * mag * 1.01, out_t);
        }
      }
  return tol;
}

std::vector<double> attention_grad_bounds(const AttnInputs& in, const std::vector<float>& probs,
                                          const std::vector<float>& dqkv, DType pv, DType out_t) {
  using testing::flip;
  const int64_t B = in.B, T = in.T, H = in.H, hs = in.hs, C = H * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  auto round_pv = [&](float x) { return static_cast<double>(testing::round_to_dtype(x, pv)); };
  std::vector<double> tol(B * T * 3 * C, 0.0);
  std::vector<double> dsv(T * T), dsd(T * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const float* p = probs.data() + ((b * H + h) * T + i) * T;
        std::vector<double> dp(T), edp(T);
        double dot = 0.0, ddot = 0.0, mag = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          double a = 0.0, sa = 0.0;
          for (int64_t e = 0; e < hs; ++e) {
            const double gv = static_cast<double>(in.g[(b * T + i) * C + h * hs + e]) * in.q(b, j, h, e, 2);
            a += gv;
            sa += std::fabs(gv);
          }
          dp[j] = a;
          edp[j] = 3 * testing::gamma(hs) * sa;
          dot += p[j] * a;
          ddot += p[j] * edp[j] + testing::ulp32(p[j] * a);
          mag += p[j] * std::fabs(a);
        }
        ddot += 2 * testing::gamma(T) * mag;
        for (int64_t j = 0; j < T; ++j) {
          const double x = dp[j] - dot, v = p[j] * x;
          dsv[i * T + j] = v * scale;
          dsd[i * T + j] = p[j] == 0.0f ? 0.0
                                         : flip(v * scale, scale * flip(v, p[j] * flip(x, edp[j] + ddot)));
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < hs; ++e) {
          double tq = 0, mq = 0, tk = 0, mk = 0, mv = 0;
          for (int64_t j = 0; j < T; ++j) {  // dq_t = sum_j ds_tj k_j
            tq += dsd[t * T + j] * std::fabs(in.q(b, j, h, e, 1));
            mq += std::fabs(dsv[t * T + j] * in.q(b, j, h, e, 1));
          }
          for (int64_t i = 0; i < T; ++i) {  // dk_t = sum_i ds_it q_i, dv_t = sum_i pr_it g_i
            tk += dsd[i * T + t] * std::fabs(in.q(b, i, h, e, 0));
            mk += std::fabs(dsv[i * T + t] * in.q(b, i, h, e, 0));
            mv += std::fabs(round_pv(probs[((b * H + h) * T + i) * T + t]) * in.g[(b * T + i) * C + h * hs + e]);
          }
          const int64_t row = (b * T + t) * 3 * C + h * hs + e;
          const double g3 = 3 * testing::gamma(T) * 1.01;
          tol[row] = flip(dqkv[row], tq + g3 * mq, out_t);
          tol[row + C] = flip(dqkv[row + C], tk + g3 * mk, out_t);
          tol[row + 2 * C] = flip(dqkv[row + 2 * C], g3 * mv, out_t);
        }
    }
  return tol;
}

AMPDIST_GPU_TEST_COVERS(GpuTransformer, AttentionMatchesTheCpuIncludingFullyMaskedRows,
                        "attention_forward", "attention_backward");
TEST(GpuTransformer, AttentionMatchesTheCpuIncludingFullyMaskedRows) {
  REQUIRE_GPU();
  const kernels::AttentionShape s{2, 9, 3, 8};
  const int64_t N = s.batch * s.seq_len, C = s.channels();
  std::vector<uint8_t> mask(N, 1);
  mask[0] = 0;  // window 0, key 0 masked: query 0 of window 0 has no allowed key (a fully masked row)
  mask[9 + 4] = 0;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor qkv = as(random_tensor({N, 3 * C}, 21, -2.0f, 2.0f), dt);
    const Tensor qkv_d = qkv.to(Device::kCUDA);
    Tensor probs = Tensor::empty({s.batch, s.n_head, s.seq_len, s.seq_len}, DType::kFloat32);
    Tensor probs_d = Tensor::empty(probs.shape(), DType::kFloat32, Device::kCUDA);
    Tensor out = Tensor::empty({N, C}, dt), out_d = Tensor::empty({N, C}, dt, Device::kCUDA);
    kernels::attention_forward(qkv, s, mask, dt, probs, out);
    kernels::attention_forward(qkv_d, s, mask, dt, probs_d, out_d);
    const AttnInputs in{floats(qkv), {}, s.batch, s.seq_len, s.n_head, s.head_dim, mask.data()};
    const std::vector<float> fp = floats(probs), fout = floats(out);
    std::vector<double> ptol;
    const std::vector<double> otol = attention_out_bounds(in, fp, fout, dt, dt, &ptol);
    expect_within(floats(probs_d), fp, ptol, "probs");
    expect_within(floats(out_d), fout, otol, "out");
    const std::vector<float> o = floats(out_d);
    for (int64_t e = 0; e < C; ++e) EXPECT_EQ(o[e], 0.0f) << "fully masked row, column " << e;
    const std::vector<float> pd = floats(probs_d);
    for (int64_t e = 0; e < s.seq_len; ++e) EXPECT_EQ(pd[e], 0.0f) << "fully masked row, key " << e;
    const Tensor dout = as(random_tensor({N, C}, 22), dt);
    Tensor dqkv = Tensor::empty({N, 3 * C}, dt), dqkv_d = Tensor::empty({N, 3 * C}, dt, Device::kCUDA);
    kernels::attention_backward(qkv, probs, s, dt, dout, dqkv);
    kernels::attention_backward(qkv_d, probs.to(Device::kCUDA), s, dt, dout.to(Device::kCUDA), dqkv_d);
    AttnInputs gin = in;
    gin.g = floats(dout);
    const std::vector<float> fd = floats(dqkv);
    expect_within(floats(dqkv_d), fd, attention_grad_bounds(gin, fp, fd, dt, dt), "dqkv");
    for (float v : floats(dqkv_d)) ASSERT_TRUE(std::isfinite(v));
  }
}

AMPDIST_GPU_TEST_COVERS(GpuTransformer, FusedAttentionIsWithinTheDerivedBoundOfTheExactAttentionAsIsTheCpu,
                        "flash_attention_forward", "flash_attention_backward");
TEST(GpuTransformer, FusedAttentionIsWithinTheDerivedBoundOfTheExactAttentionAsIsTheCpu) {
  REQUIRE_GPU();
  namespace ref = attention_reference;
  // T = 300: query blocks of 64 (the last partial) and key tiles of 32; a fully masked query; head sizes 32 and 64.
  for (const ref::Case& c : {ref::Case{2, 300, 3, 32, true}, ref::Case{1, 65, 2, 64, false}})
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(c.T) + " hs=" + std::to_string(c.hs));
      const kernels::AttentionShape s{c.B, c.T, c.H, c.hs};
      const int64_t N = c.B * c.T, C = c.H * c.hs;
      const Tensor qkv = ref::random_tensor(N, 3 * C, dt, 1, -1.5f, 1.5f);
      const Tensor dout = ref::random_tensor(N, C, dt, 2, -1.0f, 1.0f);
      const std::vector<uint8_t> mask = ref::key_mask(c);
      const ref::Reference r = ref::reference(c, qkv, dout, mask, dt, dt);
      Tensor out_d = Tensor::empty({N, C}, dt, Device::kCUDA);
      Tensor stats_d = Tensor::empty({c.B, c.H, c.T, 2}, DType::kFloat32, Device::kCUDA);
      kernels::flash_attention_forward(qkv.to(Device::kCUDA), s, mask, dt, stats_d, out_d);
      ref::expect_within("GPU fused out", out_d.to(Device::kCPU), r.out, r.out_bound);
      Tensor dqkv_d = Tensor::empty({N, 3 * C}, dt, Device::kCUDA);
      kernels::flash_attention_backward(qkv.to(Device::kCUDA), out_d, stats_d, s, mask, dt, dout.to(Device::kCUDA),
                                        dqkv_d);
      ref::expect_within("GPU fused dqkv", dqkv_d.to(Device::kCPU), r.dqkv, r.dqkv_bound);
      // The CPU oracle: its fused kernel is held to the same bound, so the two differ by at most twice it.
      Tensor out = Tensor::empty({N, C}, dt), stats = Tensor::empty({c.B, c.H, c.T, 2}, DType::kFloat32);
      kernels::flash_attention_forward(qkv, s, mask, dt, stats, out);
      const std::vector<float> go = floats(out_d), co = floats(out);
      for (size_t i = 0; i < co.size(); ++i) ASSERT_LE(std::fabs(go[i] - co[i]), 2 * r.out_bound[i]) << "out " << i;
      if (c.masked) {
        for (int64_t e = 0; e < c.hs; ++e) EXPECT_EQ(go[static_cast<size_t>(e)], 0.0f) << "query 0 has no key";
      }
    }
}

// ---- the whole model: loss and every parameter's gradient, CPU against GPU ---------------------------------------

GptConfig small_config() {
  GptConfig c;
  c.set_n_layer(2);
  c.set_n_head(2);
  c.set_n_embd(16);
  c.set_seq_len(8);
  c.set_vocab_size(32);
  c.set_dropout(0.1f);
  c.set_tie_embeddings(true);
  return c;
}

Tensor windows(const GptConfig& c, int64_t B) {
  const int64_t T = c.seq_len();
  Tensor x = Tensor::empty({B, T + 1 + kGptIndexColumns}, DType::kFloat32);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t <= T; ++t)
      x.data_as<float>()[b * x.dim(1) + t] = static_cast<float>((b * 11 + t * t * 5 + 3) % c.vocab_size());
    x.data_as<float>()[b * x.dim(1) + T + 1] = static_cast<float>(b + 3);
    x.data_as<float>()[b * x.dim(1) + T + 2] = 0.0f;
  }
  return x;
}

struct ModelRun {
  double loss = 0.0;
  std::vector<float> grads;
};

ModelRun run_model(Device device, GptRecompute recompute, int head_chunk_rows) {
  GptConfig cfg = small_config();
  cfg.set_recompute(recompute);
  cfg.set_head_chunk_rows(head_chunk_rows);
  GptModel model(cfg, Autocast(DType::kFloat32), 5);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  auto masters = bind_parameters(params, DType::kFloat32, device, 11);
  MasterWeights& mw = *masters;
  model.set_mode(true, 3);
  LanguageModelLoss crit(model);
  const Tensor x = windows(cfg, 4);  // token ids stay on the host on either device
  ModelRun r;
  r.loss = crit.forward(model.forward(x), {});
  GradContext ctx;
  ctx.need_input_grad = false;
  model.backward(crit.backward(1.0f), ctx);
  r.grads = floats(mw.grads());
  return r;
}

// The defaults, and recompute BLOCK with the head and the loss by chunks of 12 of the 32 rows (the last of 8):
// on the GPU each chunk's logits are computed in the loss's forward and again in the backward.
TEST(GpuTransformer, GptLossAndGradientsMatchTheCpu) {
  REQUIRE_GPU();
  for (const auto& [recompute, rows] : {std::pair{POINTWISE, 0}, std::pair{BLOCK, 12}}) {
    SCOPED_TRACE(GptRecompute_Name(recompute) + " head_chunk_rows " + std::to_string(rows));
    const ModelRun cpu = run_model(Device::kCPU, recompute, rows);
    const ModelRun gpu = run_model(Device::kCUDA, recompute, rows);
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::fabs(cpu.loss));
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i)
      ASSERT_NEAR(gpu.grads[i], cpu.grads[i], 1e-4 + 1e-3 * std::fabs(cpu.grads[i])) << "gradient element " << i;
  }
}

}  // namespace
}  // namespace ampdist
