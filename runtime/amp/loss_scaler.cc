#include "runtime/amp/loss_scaler.h"

#include <sstream>

#include "runtime/core/error.h"

namespace ampdist {

LossScaler LossScaler::dynamic(const DynamicLossScaleConfig& cfg) {
  LossScaler s;
  s.mode_ = Mode::kDynamic;
  s.cfg_ = cfg;
  s.state_.scale = cfg.init_scale();
  s.state_.hysteresis_tracker = cfg.hysteresis();
  return s;
}

LossScaler LossScaler::fixed(float scale) {
  LossScaler s;
  s.mode_ = Mode::kStatic;
  s.state_.scale = scale;
  return s;
}

LossScaler LossScaler::none() { return LossScaler(); }

LossScaler LossScaler::from_config(const PrecisionConfig& cfg, DTypeName resolved_dtype) {
  switch (cfg.loss_scale_case()) {
    case PrecisionConfig::kDynamic: return dynamic(cfg.dynamic());
    case PrecisionConfig::kStaticScale: return fixed(cfg.static_scale().scale());
    case PrecisionConfig::kNone: return none();
    case PrecisionConfig::LOSS_SCALE_NOT_SET: break;
  }
  return resolved_dtype == FP16 ? dynamic(DynamicLossScaleConfig()) : none();
}

void LossScaler::update(bool found_inf) {
  ++updates_;
  if (found_inf) ++state_.skipped_steps;
  if (mode_ != Mode::kDynamic) return;
  if (found_inf) {
    state_.growth_tracker = 0;
    if (--state_.hysteresis_tracker <= 0) {
      const float next = state_.scale * cfg_.backoff_factor();
      if (next < cfg_.min_scale()) {
        std::ostringstream o;
        o << "loss scale would fall to " << next << ", below precision.dynamic.min_scale = " << cfg_.min_scale()
          << ", after " << state_.skipped_steps << " skipped steps: the gradients overflow at every scale; try a "
          << "lower optimizer.lr, bf16, or precision.fp32_layers for the layer that overflows";
        throw Error(o.str());
      }
      state_.scale = next;
    }
    return;
  }
  if (++state_.growth_tracker == cfg_.growth_interval()) {
    state_.scale *= cfg_.growth_factor();
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = cfg_.hysteresis();
  }
}

}  // namespace ampdist
