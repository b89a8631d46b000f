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
  LossScaler s;
  switch (cfg.loss_scale_case()) {
    case PrecisionConfig::kDynamic: s = dynamic(cfg.dynamic()); break;
    case PrecisionConfig::kStaticScale: s = fixed(cfg.static_scale().scale()); break;
    case PrecisionConfig::kNone: s = none(); break;
    case PrecisionConfig::LOSS_SCALE_NOT_SET: s = resolved_dtype == FP16 ? dynamic(DynamicLossScaleConfig()) : none();
  }
  s.set_max_consecutive_skips(cfg.max_consecutive_skips());
  return s;
}

void LossScaler::update(bool found_inf) {
  ++updates_;
  if (found_inf) {
    ++state_.skipped_steps;
    if (++state_.consecutive_skips >= max_consecutive_skips_ && max_consecutive_skips_ > 0) {
      std::ostringstream o;
      o << state_.consecutive_skips << " consecutive steps had non-finite gradients on some rank "
        << "(precision.max_consecutive_skips = " << max_consecutive_skips_ << ", loss scale " << state_.scale
        << "): stopping instead of skipping forever; try a lower optimizer.lr, bf16, precision.fp32_layers for the "
        << "layer that overflows, or check the input data";
      throw Error(o.str());
    }
  } else {
    state_.consecutive_skips = 0;
  }
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
