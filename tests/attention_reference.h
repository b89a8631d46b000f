// Fused causal attention against exact attention: a double-precision reference of the forward and backward of
// kernels/transformer.h's attention and a per-element bound on any FP32-accumulating kernel's error, derived below;
// used by the CPU tests (tests/unit/test_flash_attention.cc) and the GPU tests (tests/gpu/test_gpu_transformer.cc).
//
// The bound. u = 2^-24 (FP32), u_p = the unit roundoff of the dtype p is rounded to for p @ v (0 in FP32), u_w that
// of the working dtype the outputs are rounded to once. An FP32 sum of n terms is within gamma_n = n u / (1 - n u)
// of the exact sum times the sum of the terms' magnitudes (Higham, "Accuracy and Stability of Numerical Algorithms",
// 2nd ed., eq. 3.5). With n = 3T + hs + 16, gamma covers every chain here: a score (hs terms), a row sum and a p @ v
// sum (T terms), the online softmax's rescalings (at most one per key, each a rounded multiply by an exp of relative
// error <= 2u) and the few roundings in between. err(x) is a bound on a kernel's error in x; from the inputs (the
// working-dtype q, k, v and g = dout, as doubles):
//   scores    err(s_ij) = gamma Ms_ij,  Ms_ij = |q_i| . |k_j| / sqrt(hs)
//   p         relative error e_i = 2 max_j err(s_ij) + gamma + 4u   (a score error moves numerator and sum; exp, 1/l)
//   out       err(out_ie) = 1.05 (e_i + u_p + gamma + u_w) Mo_ie,   Mo_ie = sum_j p_ij |v_je|
//   dp        err(dp_ij) = gamma Mdp_ij,  Mdp_ij = |g_i| . |v_j|
//   D         materialised: sum_j p_ij dp_ij, within (e_i + gamma) sum_j p_ij (|dp_ij| + Mdp_ij);
//             fused: g_i . out_i with the kernel's rounded out, within sum_e |g_ie| err(out_ie) + gamma |g_i|.|o_i|;
//             err(D_i) = the sum of both
//   ds        err(ds_ij) = scale (e_i p_ij |dp_ij - D_i| + p_ij (gamma Mdp_ij + err(D_i))) + 2u |ds_ij|
//   dq, dk    1.05 (sum of err(ds) |k| (|q|) + gamma sum |ds| |k| (|q|)) + u_w (|ref| + that)
//   dv        1.05 (max_i e_i + u_p + gamma) sum_i p_ij |g_ie| + u_w (|ref| + that)
// A wrong kernel (a missed rescale, a dropped block, a wrong mask) is off by O(|ref|), far above these bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"
#include "tests/test_tensors.h"

namespace ampdist::attention_reference {

inline double unit_roundoff(DType d) {
  switch (d) {
    case DType::kFloat16: return std::ldexp(1.0, -11);
    case DType::kBFloat16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// A [rows, cols] tensor of dtype d with values U(lo, hi) rounded to d.
inline Tensor random_tensor(int64_t rows, int64_t cols, DType d, uint32_t stream, float lo, float hi) {
  Tensor f = testing::TensorRng{777}({rows, cols}, stream, lo, hi);
  if (d == DType::kFloat32) return f;
  Tensor t = Tensor::empty({rows, cols}, d);
  kernels::cast(f, t);
  return t;
}

struct Case {
  int64_t B, T, H, hs;
  bool masked;  // window 0: key 0 masked (its query 0 has no key at all), and every 7th key
};

// Window 0's key mask of a masked case: key 0 (so its query 0 has no key at all) and every 7th key masked.
inline std::vector<uint8_t> key_mask(const Case& c) {
  std::vector<uint8_t> mask;
  if (!c.masked) return mask;
  mask.assign(static_cast<size_t>(c.B * c.T), 1);
  for (int64_t j = 0; j < c.T; j += 7) mask[static_cast<size_t>(j)] = 0;
  return mask;
}

struct Reference {
  std::vector<double> out, dqkv;            // exact values
  std::vector<double> out_bound, dqkv_bound;  // per-element bound of either kernel's error
};

// The double-precision attention of the working-dtype inputs, and the bounds of the header comment.
inline Reference reference(const Case& c, const Tensor& qkv, const Tensor& dout, const std::vector<uint8_t>& mask,
                    DType pv_dtype, DType working) {
  const int64_t T = c.T, H = c.H, hs = c.hs, C = H * hs, ld = 3 * C;
  const double u = std::ldexp(1.0, -24), up = pv_dtype == DType::kFloat32 ? 0.0 : unit_roundoff(pv_dtype),
               uw = working == DType::kFloat32 ? 0.0 : unit_roundoff(working);
  const double n = 3.0 * T + hs + 16, gamma = n * u / (1 - n * u);
  const double scale = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(hs)));
  Reference r;
  const int64_t N = c.B * T;
  r.out.assign(N * C, 0.0);
  r.out_bound.assign(N * C, 0.0);
  r.dqkv.assign(N * ld, 0.0);
  r.dqkv_bound.assign(N * ld, 0.0);
  auto X = [&](int64_t row, int64_t col) { return static_cast<double>(qkv.item(row * ld + col)); };
  auto G = [&](int64_t row, int64_t col) { return static_cast<double>(dout.item(row * C + col)); };
  std::vector<double> p(T * T), Ms(T * T), dp(T * T), Mdp(T * T), ds(T * T), dds(T * T), e(T), D(T), dD(T);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t r0 = b * T, q0 = h * hs, k0 = C + h * hs, v0 = 2 * C + h * hs;
      auto ok = [&](int64_t i, int64_t j) { return j <= i && (mask.empty() || mask[b * T + j]); };
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY, maxds = 0.0;
        std::vector<double> s(T, 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (!ok(i, j)) continue;
          double dot = 0.0, mag = 0.0;
          for (int64_t f = 0; f < hs; ++f) {
            dot += X(r0 + i, q0 + f) * X(r0 + j, k0 + f);
            mag += std::abs(X(r0 + i, q0 + f) * X(r0 + j, k0 + f));
          }
          s[j] = dot * scale;
          Ms[i * T + j] = mag * scale;
          maxds = std::max(maxds, gamma * Ms[i * T + j]);
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          p[i * T + j] = ok(i, j) ? std::exp(s[j] - mx) : 0.0;
          sum += p[i * T + j];
        }
        for (int64_t j = 0; j < T; ++j) p[i * T + j] = sum > 0 ? p[i * T + j] / sum : 0.0;
        e[i] = 2 * maxds + gamma + 4 * u;
      }
      // out, D and dp
      for (int64_t i = 0; i < T; ++i) {
        double Dm = 0.0, Dmag = 0.0, Df_bound = 0.0, go = 0.0;
        for (int64_t f = 0; f < hs; ++f) {
          double o = 0.0, mo = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            o += p[i * T + j] * X(r0 + j, v0 + f);
            mo += p[i * T + j] * std::abs(X(r0 + j, v0 + f));
          }
          const double bound = 1.05 * (e[i] + up + gamma + uw) * mo;
          r.out[(r0 + i) * C + q0 + f] = o;
          r.out_bound[(r0 + i) * C + q0 + f] = bound;
          Df_bound += std::abs(G(r0 + i, q0 + f)) * bound;
          go += std::abs(G(r0 + i, q0 + f)) * (std::abs(o) + bound);
        }
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0.0, mag = 0.0;
          for (int64_t f = 0; f < hs; ++f) {
            d += G(r0 + i, q0 + f) * X(r0 + j, v0 + f);
            mag += std::abs(G(r0 + i, q0 + f) * X(r0 + j, v0 + f));
          }
          dp[i * T + j] = d;
          Mdp[i * T + j] = mag;
          Dm += p[i * T + j] * d;
          Dmag += p[i * T + j] * (std::abs(d) + mag);
        }
        D[i] = Dm;
        dD[i] = (e[i] + gamma) * Dmag + Df_bound + gamma * go;  // covers either kernel's D
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const double pij = p[i * T + j];
          ds[i * T + j] = pij * (dp[i * T + j] - D[i]) * scale;
          dds[i * T + j] = scale * (e[i] * pij * std::abs(dp[i * T + j] - D[i]) + pij * (gamma * Mdp[i * T + j] + dD[i])) +
                           2 * u * std::abs(ds[i * T + j]);
        }
      const double emax = *std::max_element(e.begin(), e.end());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < hs; ++f) {
          double dq = 0, bq = 0, mq = 0, dk = 0, bk = 0, mk = 0, dv = 0, mv = 0;
          for (int64_t j = 0; j <= t; ++j) {  // query t over keys j
            dq += ds[t * T + j] * X(r0 + j, k0 + f);
            bq += dds[t * T + j] * std::abs(X(r0 + j, k0 + f));
            mq += std::abs(ds[t * T + j] * X(r0 + j, k0 + f));
          }
          for (int64_t i = t; i < T; ++i) {  // key t over queries i
            dk += ds[i * T + t] * X(r0 + i, q0 + f);
            bk += dds[i * T + t] * std::abs(X(r0 + i, q0 + f));
            mk += std::abs(ds[i * T + t] * X(r0 + i, q0 + f));
            dv += p[i * T + t] * G(r0 + i, q0 + f);
            mv += p[i * T + t] * std::abs(G(r0 + i, q0 + f));
          }
          const int64_t row = (r0 + t) * ld;
          const double eq = 1.05 * (bq + gamma * mq), ek = 1.05 * (bk + gamma * mk),
                       ev = 1.05 * (emax + up + gamma) * mv;
          r.dqkv[row + q0 + f] = dq;
          r.dqkv_bound[row + q0 + f] = eq + uw * (std::abs(dq) + eq);
          r.dqkv[row + k0 + f] = dk;
          r.dqkv_bound[row + k0 + f] = ek + uw * (std::abs(dk) + ek);
          r.dqkv[row + v0 + f] = dv;
          r.dqkv_bound[row + v0 + f] = ev + uw * (std::abs(dv) + ev);
        }
    }
  return r;
}

inline void expect_within(const std::string& what, const Tensor& got, const std::vector<double>& want,
                   const std::vector<double>& bound) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  int64_t bad = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::abs(static_cast<double>(got.item(i)) - want[i]);
    worst = std::max(worst, bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0.0));
    if (!(err <= bound[i]) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got.item(i) << ", reference " << want[i] << ", bound "
                    << bound[i];
  }
  EXPECT_EQ(bad, 0) << what << ": elements outside the bound";
  EXPECT_LE(worst, 1.0) << what << ": worst error / bound";
}

}  // namespace ampdist::attention_reference
