// The optimizer's per-step scalars, decided once per step where the step state lives and shared by the host and the
// device: the learning-rate schedule, the clip factor, and finish_step, which turns the
// agreed flags and the gradient norm into the gate the fused optimizer ops read (kernels/update_gate.h) and updates
// the loss scaler.
//
// finish_step runs as a direct call on the CPU backend and as a one-thread kernel on the GPU (finish_step(buffer,
// ...) below); LrSchedule and clip_grad_norm (optim/optimizer.h) call the same formulas, so their tests test the
// arithmetic both backends run. Plain structs only: no Eigen, no protobuf, no CUDA headers.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/amp/scaler_rule.h"
#include "runtime/amp/step_state.h"
#include "runtime/core/host_device.h"
#include "runtime/kernels/math.h"
#include "runtime/kernels/update_gate.h"

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

// A step's constants: schedule, clipping, AdamW's betas, the scaler rule.
struct StepConfig {
  float base_lr = 0.0f;
  int64_t warmup = 0, total_steps = 0;
  bool cosine = false;
  float min_lr = 0.0f;
  float clip_max_norm = 0.0f;
  bool adamw = false;
  double beta1 = 0.9, beta2 = 0.999;
  ScalerRule scaler;
};

// After the consensus: the agreed skip flag, clip factor, learning rate, bias corrections and the scaler update,
// identical on every rank because every input is agreed (the flags) or identical (the state, sum_sq: the whole
// reduced gradient, or the sum of the agreed per-slice sums). loss_divisor: the step's global sample count.
AMPDIST_HOST_DEVICE void finish_step(StepState& st, const StepConfig& c, double loss_divisor) {
  st.loss_sum += st.step_loss / loss_divisor;
  StepGate g;
  if (st.status != 0) {  // the run stops at the next read: nothing more may change
    st.gate = g;
    return;
  }
  const bool found_inf = st.agreed_found_inf != 0;
  if (st.disagree) st.status = kStateDisagree;
  if (st.agreed_stop) st.stop = 1;
  st.last_skipped = found_inf ? 1 : 0;
  st.last_scale = st.scaler.scale;
  if (!found_inf && st.status == 0) {
    st.grad_norm = sqrt(st.sum_sq);
    g.apply = 1;
    g.first_step = st.optimizer_steps == 0 ? 1 : 0;
    g.clip_coef = clip_coef(st.grad_norm, c.clip_max_norm);
    g.lr = lr_at(st.optimizer_steps, c.base_lr, c.warmup, c.cosine, c.total_steps, c.min_lr);
    if (c.adamw)
      math::adamw_bias_corrections(c.beta1, c.beta2, st.optimizer_steps + 1, g.bias_correction1,
                                   g.bias_correction2_sqrt);
    ++st.optimizer_steps;
    st.last_lr = g.lr;
  } else {
    st.grad_norm = NAN;
    st.last_lr = 0.0f;
  }
  st.gate = g;
  if (st.status != 0) return;
  ++st.scaler_updates;
  const int32_t code = scaler_update(st.scaler, c.scaler, found_inf);
  if (code != kScalerOk) st.status = code;
}

class StepStateBuffer;
// finish_step where the buffer's state lives: a direct call on the CPU, a one-thread kernel queued on the compute
// stream on the GPU (nothing waits).
void finish_step(StepStateBuffer& state, const StepConfig& cfg, double loss_divisor);

}  // namespace ampdist
