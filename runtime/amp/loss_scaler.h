// LossScaler: the loss scale S and its update rule.
//
// Dynamic (torch.cuda.amp.GradScaler semantics, with Megatron-LM's hysteresis and minimum):
//   found_inf:  growth_tracker = 0; hysteresis_tracker -= 1;
//               if hysteresis_tracker <= 0: S *= backoff_factor (error if S would fall below min_scale)
//               (the tracker is refilled only by a growth, as in Megatron-LM)
//   clean:      growth_tracker += 1; if growth_tracker == growth_interval: S *= growth_factor, growth_tracker = 0,
//               hysteresis_tracker = hysteresis
// Defaults: S = 65536, x2 after 2000 consecutive clean steps, x0.5 on every overflow, min_scale 1.
// Static: S fixed. None: S = 1 (bf16, fp32). In every mode an overflowing step is skipped and counted.
//
// update() must be called with the flag every rank agreed on (Consensus), so that every rank's scaler takes the
// same path; it never looks at local data.
#pragma once

#include <cstdint>
#include <string>

#include "ampdist/config.pb.h"
#include "runtime/amp/scaler_rule.h"

namespace ampdist {

class LossScaler {
 public:
  enum class Mode { kDynamic, kStatic, kNone };

  static LossScaler dynamic(const DynamicLossScaleConfig& cfg);
  static LossScaler fixed(float scale);  // static loss scale
  static LossScaler none();
  // From precision.loss_scale, defaulting by dtype (dynamic for fp16, none otherwise).
  static LossScaler from_config(const PrecisionConfig& cfg, DTypeName resolved_dtype);

  Mode mode() const { return mode_; }
  // "dynamic loss scale 65536", "static loss scale 128" or "no loss scaling".
  std::string describe() const;
  float scale() const { return state_.scale; }
  float inv_scale() const { return 1.0f / state_.scale; }
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& s) { state_ = s; }
  int64_t updates() const { return updates_; }  // updates so far (one per optimizer step)
  void set_updates(int64_t n) { updates_ = n; }  // the count of updates made by the step state's rule
  // Consecutive skipped steps after which update() throws (0 = never): precision.max_consecutive_skips.
  void set_max_consecutive_skips(int64_t n) { max_consecutive_skips_ = n; }

  // Applies the rule above. Throws ampdist::Error when a backoff would take the scale below min_scale, or when the
  // skipped steps in a row reach the max_consecutive_skips limit; the message says which and what to try.
  void update(bool found_inf);

  // The rule as the plain struct of amp/scaler_rule.h (the same update runs on the device).
  ScalerRule rule() const;
  // Throws the Error update() throws for a ScalerStatus other than kScalerOk (state as left by the update).
  [[noreturn]] void throw_status(int32_t status) const;

 private:
  Mode mode_ = Mode::kNone;
  DynamicLossScaleConfig cfg_;
  LossScalerState state_;
  int64_t updates_ = 0;
  int64_t max_consecutive_skips_ = 0;
};

}  // namespace ampdist
