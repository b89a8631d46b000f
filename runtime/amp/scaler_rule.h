// The loss-scale rule as plain host/device code: LossScaler (the host's view), the CPU step and the GPU's
// one-thread step kernel all run this one function (finish_step in optim/step_gate.h).
#pragma once

#include <cstdint>

#include "runtime/core/host_device.h"

namespace ampdist {

// The loss scaler's state: one struct for the host's LossScaler, the step state (StepState::scaler, on the step's
// device) and the manifest's fields.
struct LossScalerState {
  float scale = 1.0f;
  int32_t hysteresis_tracker = 1;  // overflows left before the next backoff
  int64_t growth_tracker = 0;      // consecutive clean steps since the last growth or overflow
  int64_t skipped_steps = 0;       // overflowing steps so far
  int64_t consecutive_skips = 0;   // overflowing steps since the last clean one
  bool operator==(const LossScalerState&) const = default;
};
// The rule's parameters.
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
AMPDIST_HOST_DEVICE int32_t scaler_update(LossScalerState& s, const ScalerRule& r, bool found_inf) {
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

}  // namespace ampdist
