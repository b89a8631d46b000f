// Per-step scalar formulas shared by the CPU backend and the device-resident step of the CUDA backend.
//
// The CPU classes (LossScaler, LrSchedule, clip_grad_norm) call these on the host; the CUDA backend runs the very
// same functions in a one-thread kernel after the consensus all-reduce, so that a skipped step, the loss-scale
// update, the schedule and the clip factor never need a host round-trip. The CPU tests of those classes therefore
// test the arithmetic the GPU runs. Plain structs only: no Eigen, no protobuf, no CUDA headers.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/math.h"

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

// Loss-scaler state (LossScalerState's fields) and rule parameters.
struct ScalerScalars {
  float scale = 1.0f;
  int32_t hysteresis_tracker = 1;
  int64_t growth_tracker = 0;
  int64_t skipped_steps = 0;
  int64_t consecutive_skips = 0;
};
struct ScalerRule {
  bool dynamic = false;
  float growth_factor = 2.0f, backoff_factor = 0.5f, min_scale = 1.0f;
  int64_t growth_interval = 2000;
  int32_t hysteresis = 1;
  int64_t max_consecutive_skips = 0;  // 0 = never stop
};
enum ScalerStatus : int32_t { kScalerOk = 0, kScalerBelowMinScale = 1, kScalerTooManySkips = 2 };

// A loss scale the step's arithmetic can honour: a finite, normal, positive FP32 number. Then 1/S is finite too
// (1/FLT_MIN = 2^126 < FLT_MAX), so unscaling never multiplies by inf, and a backoff that would leave this range is
// caught by min_scale (itself in this range), never stored.
AMPDIST_HOST_DEVICE bool is_valid_loss_scale(float s) {
  return s >= 1.17549435e-38f && s <= 3.40282347e+38f;  // [FLT_MIN, FLT_MAX]; false for NaN
}

// One update of the loss scaler with the agreed found_inf (GradScaler's rule, with Megatron-LM's hysteresis and
// minimum; see runtime/amp/loss_scaler.h). Returns kScalerOk, or why the run must stop: then the state holds the
// counters of this step and the scale it had (nothing below min_scale is ever stored).
AMPDIST_HOST_DEVICE int32_t scaler_update(ScalerScalars& s, const ScalerRule& r, bool found_inf) {
  if (found_inf) {
    ++s.skipped_steps;
    if (++s.consecutive_skips >= r.max_consecutive_skips && r.max_consecutive_skips > 0) return kScalerTooManySkips;
  } else {
    s.consecutive_skips = 0;
  }
  if (!r.dynamic) return kScalerOk;
  if (found_inf) {
    s.growth_tracker = 0;
    if (--s.hysteresis_tracker <= 0) {
      // Below min_scale (a normal float, so no subnormal is ever stored), or no lower at all: a backoff factor just
      // under 1 at the bottom of the normal range rounds back to the same scale, which would skip forever.
      const float next = s.scale * r.backoff_factor;
      if (!(next >= r.min_scale) || !(next < s.scale)) return kScalerBelowMinScale;
      s.scale = next;
    }
    return kScalerOk;
  }
  if (++s.growth_tracker == r.growth_interval) {
    // GradScaler keeps the old scale when the grown one is not finite (torch's _amp_update_scale_): the scale stays
    // a finite, normal float whatever the growth factor and the number of growth intervals.
    const float next = s.scale * r.growth_factor;
    if (is_valid_loss_scale(next)) s.scale = next;
    s.growth_tracker = 0;
    s.hysteresis_tracker = r.hysteresis;
  }
  return kScalerOk;
}

// ---- the device-resident step ----------------------------------------------------------------------------------

// What the fused optimizer kernels read on the device for the current step.
struct StepGate {
  int32_t apply = 0;       // 1: update; 0: the step is skipped (nothing changes)
  int32_t first_step = 0;  // SGD: momentum buffer starts from this gradient
  float lr = 0.0f;
  float clip_coef = 1.0f;
  float bias_correction1 = 1.0f, bias_correction2_sqrt = 1.0f;  // AdamW
};

// Everything the training step keeps on the device between host reads (one allocation per trainer).
struct DeviceTrainState {
  ScalerScalars scaler;
  int64_t optimizer_steps = 0;    // applied updates (AdamW's t before this step)
  int32_t status = 0;             // ScalerStatus, or kStateDisagree when ranks' scaler states differ
  int32_t stop = 0;               // sticky: some rank asked to stop
  float found_inf = 0.0f;         // this rank, this step (the unscale kernel ORs into it)
  int32_t last_skipped = 0;       // the agreed flag of the last step
  double sum_sq = 0.0;            // this rank's sum of squares of the unscaled gradient
  // MAX all-reduce payload [found_inf, S, -S, growth, -growth, stop] (see Consensus), FP32: the scale is a power of
  // two times init_scale and the tracker an integer below 2^24, both exact.
  float consensus[6] = {0, 0, 0, 0, 0, 0};
  StepGate gate;
  double grad_norm = 0.0;         // last applied step's global norm before clipping (NaN when skipped)
  float last_lr = 0.0f;
  float last_scale = 1.0f;        // the scale the last step ran with
  double step_loss = 0.0;         // this step's criterion loss sum (this rank)
  double loss_sum = 0.0;          // sum over steps since the host last read it of step_loss / step's global samples
};
constexpr int32_t kStateDisagree = 3;

// The step's constants: schedule, clipping, AdamW's betas, the scaler rule.
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

// The one-thread part of the device step after the consensus all-reduce (also run on the host in tests).
// loss_divisor: the step's global sample count (each rank's share of the step's mean loss is step_loss / it).
AMPDIST_HOST_DEVICE void finish_step(DeviceTrainState& st, const StepConfig& c, double loss_divisor) {
  st.loss_sum += st.step_loss / loss_divisor;
  const bool found_inf = st.consensus[0] > 0.0f;
  if (st.consensus[1] != -st.consensus[2] || st.consensus[3] != -st.consensus[4]) st.status = kStateDisagree;
  if (st.consensus[5] > 0.0f) st.stop = 1;
  st.last_skipped = found_inf ? 1 : 0;
  st.last_scale = st.scaler.scale;
  StepGate g;
  if (!found_inf) {
    st.grad_norm = sqrt(st.sum_sq);
    g.apply = 1;
    g.first_step = st.optimizer_steps == 0 ? 1 : 0;
    g.clip_coef = clip_coef(st.grad_norm, c.clip_max_norm);
    g.lr = lr_at(st.optimizer_steps, c.base_lr, c.warmup, c.cosine, c.total_steps, c.min_lr);
    if (c.adamw) {
      const double t = static_cast<double>(st.optimizer_steps + 1);
      g.bias_correction1 = static_cast<float>(1.0 - pow(c.beta1, t));
      g.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(c.beta2, t)));
    }
    ++st.optimizer_steps;
    st.last_lr = g.lr;
  } else {
    st.grad_norm = NAN;
    st.last_lr = 0.0f;
  }
  st.gate = g;
  const int32_t code = scaler_update(st.scaler, c.scaler, found_inf);
  if (code != kScalerOk && st.status == 0) st.status = code;
}

}  // namespace ampdist
