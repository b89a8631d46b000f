// Per-element formulas shared by the CPU and CUDA backends.
//
// Every function here is one element's arithmetic in FP32 and nothing else: no loops, no memory layout, no dtype
// conversions. The CPU kernels (kernels/cpu/) call them in loops over host memory; the CUDA kernels call the same
// functions from device code, so the CPU tests check the formulas the GPU runs.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/core/host_device.h"

namespace ampdist::math {

AMPDIST_HOST_DEVICE bool is_finite(float x) { return (x - x) == 0.0f; }  // false for inf and NaN, -ffast-math safe

// NaN propagates (as torch.relu): a NaN activation must reach the loss, not turn into 0.
AMPDIST_HOST_DEVICE float relu(float x) { return x > 0.0f ? x : (x <= 0.0f ? 0.0f : x); }
// Gradient through ReLU given the forward output y (y > 0 exactly where x > 0).
AMPDIST_HOST_DEVICE float relu_backward(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2; torch.nn.GELU(approximate="tanh")):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;
// tanh(u) = 1 - 2 / (exp(2u) + 1): exact at both tails (exp -> 0 gives -1, exp -> inf gives 1) and within a few
// 1e-8 of tanhf in absolute terms, which is all GELU needs. glibc's tanhf (through expm1f) costs about 5x expf and
// was a third of a small GPT's training step on the CPU.
// The formulas take e = expf(2u) as an argument (the *_from_exp forms), so that a test can replay them with the exp
// of another math library (CUDA's expf is within 2 ulp of the correctly rounded value, glibc's within 1: the GPU
// tests' GELU bound, tests/gpu/gelu_bound.h, follows from that). For x in about [-4, -1.5], 1 + t cancels: there a
// one-ulp change of e moves GELU by up to 1 / (2 e) ulps.
AMPDIST_HOST_DEVICE float tanh_from_exp(float e) { return 1.0f - 2.0f / (e + 1.0f); }
AMPDIST_HOST_DEVICE float tanh_exp(float u) { return tanh_from_exp(expf(2.0f * u)); }
// u of the forward and of the backward (the two round x^3 differently; each is kept as it was).
AMPDIST_HOST_DEVICE float gelu_arg(float x) { return kSqrt2OverPi * (x + kGeluCoeff * x * x * x); }
AMPDIST_HOST_DEVICE float gelu_backward_arg(float x) {
  float x2 = x * x;
  return kSqrt2OverPi * (x + kGeluCoeff * x2 * x);
}
AMPDIST_HOST_DEVICE float gelu_from_exp(float x, float e) { return 0.5f * x * (1.0f + tanh_from_exp(e)); }
AMPDIST_HOST_DEVICE float gelu(float x) { return gelu_from_exp(x, expf(2.0f * gelu_arg(x))); }
// d gelu(x)/dx * dy, from the forward input x, with e = expf(2 * gelu_backward_arg(x)).
AMPDIST_HOST_DEVICE float gelu_backward_from_exp(float x, float dy, float e) {
  float x2 = x * x;
  float t = tanh_from_exp(e);
  float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
AMPDIST_HOST_DEVICE float gelu_backward(float x, float dy) {
  return gelu_backward_from_exp(x, dy, expf(2.0f * gelu_backward_arg(x)));
}

// Unscale one gradient element. The caller ORs !is_finite(result) into found_inf.
AMPDIST_HOST_DEVICE float unscale(float g, float inv_scale) { return g * inv_scale; }

// SGD with momentum, dampening, Nesterov and L2 weight decay, element-wise exactly as torch.optim.SGD:
//   g += wd * p;  buf = first ? g : momentum * buf + (1 - dampening) * g;  g = nesterov ? g + momentum * buf : buf;
//   p -= lr * g.  With momentum == 0 the buffer is not used.
AMPDIST_HOST_DEVICE void sgd_update(float& p, float g, float& buf, float lr, float momentum, float dampening,
                                    bool nesterov, float weight_decay, bool first_step) {
  if (weight_decay != 0.0f) g += weight_decay * p;
  if (momentum != 0.0f) {
    buf = first_step ? g : momentum * buf + (1.0f - dampening) * g;
    g = nesterov ? g + momentum * buf : buf;
  }
  p -= lr * g;
}

// AdamW element-wise exactly as torch.optim.AdamW (Loshchilov & Hutter 2019, decoupled weight decay):
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc1 = 1 - b1^t, bc2 = 1 - b2^t for step t >= 1.
// The caller computes 1 - b1, 1 - b2 and the bias corrections in double (PyTorch does so in Python floats).
AMPDIST_HOST_DEVICE void adamw_update(float& p, float g, float& m, float& v, float lr, float beta1,
                                      float one_minus_beta1, float beta2, float one_minus_beta2, float eps,
                                      float weight_decay, float bias_correction1, float bias_correction2_sqrt) {
  p *= 1.0f - lr * weight_decay;
  m = beta1 * m + one_minus_beta1 * g;
  v = beta2 * v + one_minus_beta2 * g * g;
  float denom = sqrtf(v) / bias_correction2_sqrt + eps;
  p -= (lr / bias_correction1) * (m / denom);
}

// AdamW's bias corrections for the t-th update (t = 1, 2, ...): 1 - beta1^t and sqrt(1 - beta2^t), in double and
// rounded once to FP32, as torch.optim.AdamW computes them from Python floats.
AMPDIST_HOST_DEVICE void adamw_bias_corrections(double beta1, double beta2, int64_t t, float& bc1, float& bc2_sqrt) {
  const double td = static_cast<double>(t);
  bc1 = static_cast<float>(1.0 - pow(beta1, td));
  bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, td)));
}

// ---- transformer ops (kernels/transformer.h) ------------------------------------------------------------------

// LayerNorm (Ba et al. 2016) as torch.nn.LayerNorm: biased variance over the row, rstd = 1 / sqrt(var + eps),
// y = (x - mean) * rstd * gamma + beta. Row statistics are FP32 sums over the row, made by the caller.
AMPDIST_HOST_DEVICE float layernorm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }
AMPDIST_HOST_DEVICE float layernorm(float x, float mean, float rstd, float gamma, float beta) {
  return (x - mean) * rstd * gamma + beta;
}
// d/dx of one element, with g = dy * gamma, xhat = (x - mean) * rstd and the row means mean_g = mean_j g_j,
// mean_gx = mean_j g_j xhat_j (the standard derivation, e.g. llm.c's layernorm_backward):
//   dx = rstd * (g - mean_g - xhat * mean_gx).
AMPDIST_HOST_DEVICE float layernorm_backward(float g, float xhat, float mean_g, float mean_gx, float rstd) {
  return rstd * (g - mean_g - xhat * mean_gx);
}

// BatchNorm (Ioffe & Szegedy 2015) in training or evaluation mode, per element of channel c, as
// torch.nn.BatchNorm2d: y = (x - mean) * scale + beta with scale = invstd * gamma formed once per channel in FP32.
AMPDIST_HOST_DEVICE float batchnorm_scale(float invstd, float gamma) { return invstd * gamma; }
AMPDIST_HOST_DEVICE float batchnorm(float x, float mean, float scale, float beta) { return (x - mean) * scale + beta; }
// One channel's training statistics from its sums over `count` values (double): the mean, the biased variance
// (clamped at 0 against cancellation) and 1 / sqrt(var + eps), each rounded once to FP32 (torch.nn.BatchNorm2d).
AMPDIST_HOST_DEVICE double batchnorm_mean(double sum, double count) { return sum / count; }
AMPDIST_HOST_DEVICE double batchnorm_var(double sum_sq, double count, double mean) {
  const double v = sum_sq / count - mean * mean;
  return v > 0.0 ? v : 0.0;
}
AMPDIST_HOST_DEVICE float batchnorm_invstd(double var, float eps) {
  return static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
}
// The running statistics' update (PyTorch): running = (1 - momentum) * running + momentum * batch in FP32, the
// variance unbiased (count / (count - 1)) for running_var.
AMPDIST_HOST_DEVICE float batchnorm_running(float running, float momentum, float batch) {
  return (1.0f - momentum) * running + momentum * batch;
}
AMPDIST_HOST_DEVICE float batchnorm_unbiased(double var, double count) {
  return static_cast<float>(var * count / (count - 1.0));
}
// Channel i of c from sums [2c] (sum, then sum of squares) over `count` values: writes mean[i], var[i], invstd[i]
// and updates running_mean[i] and running_var[i] in place; the one body of both backends' batchnorm_statistics.
AMPDIST_HOST_DEVICE void batchnorm_channel_statistics(int64_t i, int64_t c, const double* sums, double count, float eps,
                                                      float momentum, float* mean, float* var, float* invstd,
                                                      float* running_mean, float* running_var) {
  const double mu = batchnorm_mean(sums[i], count);
  const double sigma2 = batchnorm_var(sums[c + i], count, mu);
  mean[i] = static_cast<float>(mu);
  var[i] = static_cast<float>(sigma2);
  invstd[i] = batchnorm_invstd(sigma2, eps);
  running_mean[i] = batchnorm_running(running_mean[i], momentum, static_cast<float>(mu));
  running_var[i] = batchnorm_running(running_var[i], momentum, batchnorm_unbiased(sigma2, count));
}
// d/dx in double, with g = dy, xhat = (x - mean) * invstd, k = gamma * invstd and the channel means
// mean_g = sum g / count, mean_gx = sum g xhat / count (0 and 0 in evaluation mode, where the statistics are
// constants): dx = k * (g - mean_g - xhat * mean_gx).
AMPDIST_HOST_DEVICE double batchnorm_backward(double g, double x, double mean, double invstd, double k, double mean_g,
                                              double mean_gx) {
  return k * (g - mean_g - (x - mean) * invstd * mean_gx);
}

// Softmax over a row with the row maximum subtracted (no overflow for any finite score). A masked entry is never
// passed here: it contributes probability 0. A row with no unmasked entry has sum 0, and its normaliser is 0, so
// the whole row's probabilities and output are 0 instead of 0/0 = NaN.
AMPDIST_HOST_DEVICE float softmax_exp(float score, float row_max) { return expf(score - row_max); }
AMPDIST_HOST_DEVICE float softmax_inv_sum(float sum) { return sum > 0.0f ? 1.0f / sum : 0.0f; }
// Softmax backward, one element: ds = p * (dp - sum_j p_j dp_j).
AMPDIST_HOST_DEVICE float softmax_backward(float p, float dp, float dot) { return p * (dp - dot); }

// Inverted dropout (Srivastava et al. 2014; torch.nn.Dropout): an element is kept when its uniform draw u in [0, 1)
// is >= p and then scaled by 1 / (1 - p); p = 0 keeps everything unchanged. The same (x -> mask) map is the
// backward (dy -> dx), since the mask is redrawn from the same counter.
AMPDIST_HOST_DEVICE float dropout(float x, float u, float p, float inv_keep) { return u >= p ? x * inv_keep : 0.0f; }

}  // namespace ampdist::math
