// Per-step scalar formulas of the optimizer, shared by the host and the device: the learning-rate schedule, the
// clip factor and AdamW's bias corrections, and the gate the fused optimizer kernels read.
//
// amp/step_state.h's finish_step computes a step's gate from these on either backend (a direct call on the CPU, a
// one-thread kernel on the GPU); optim/'s host-side classes (LrSchedule, clip_grad_norm) call the same functions, so
// their tests test the arithmetic both backends run. Plain structs only: no Eigen, no protobuf, no CUDA headers.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/core/host_device.h"

namespace ampdist {

// Learning rate of the n-th applied update (n = 0, 1, ...): linear warmup base * (n+1) / warmup for n < warmup, then
// constant, or a cosine from base to min_lr over the updates up to total (SGDR's cosine, Loshchilov & Hutter 2017, in
// nanoGPT's form). The cosine factor in double; base - min_lr in float.
AMPDIST_HOST_DEVICE float lr_at(int64_t n, float base, int64_t warmup, bool cosine, int64_t total, float min_lr) {
  if (n < warmup) return base * static_cast<float>(n + 1) / static_cast<float>(warmup);
  if (!cosine || total <= warmup) return base;
  double progress = static_cast<double>(n - warmup) / static_cast<double>(total - warmup);
  if (progress > 1.0) progress = 1.0;
  const double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
  return static_cast<float>(min_lr + coeff * (base - min_lr));
}

// Global-norm clipping factor (torch.nn.utils.clip_grad_norm_): max_norm / (norm + 1e-6) when that is < 1, else 1
// (also 1 when clipping is off, max_norm <= 0).
AMPDIST_HOST_DEVICE float clip_coef(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
  return coef >= 1.0 ? 1.0f : static_cast<float>(coef);
}

// What the fused optimizer kernels read for one step, on the device of the buffers they update (host memory on the
// CPU backend, device memory on the GPU): whether to update at all, and the step's scalars.
struct StepGate {
  int32_t apply = 0;       // 1: update; 0: the step is skipped (nothing changes: weights, moments, decay)
  int32_t first_step = 0;  // SGD: the momentum buffer starts from this gradient
  float lr = 0.0f;
  float clip_coef = 1.0f;  // every gradient element is multiplied by it first (1: no clipping)
  float bias_correction1 = 1.0f, bias_correction2_sqrt = 1.0f;  // AdamW, for this update's t
};

// AdamW's bias corrections for the t-th update (t = 1, 2, ...): 1 - beta1^t and sqrt(1 - beta2^t), in double and
// rounded once to FP32, as torch.optim.AdamW computes them from Python floats.
AMPDIST_HOST_DEVICE void adamw_bias_corrections(double beta1, double beta2, int64_t t, float& bc1, float& bc2_sqrt) {
  const double td = static_cast<double>(t);
  bc1 = static_cast<float>(1.0 - pow(beta1, td));
  bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, td)));
}

}  // namespace ampdist
