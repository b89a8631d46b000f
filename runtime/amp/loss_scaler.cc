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

std::string LossScaler::describe() const {
  std::ostringstream o;
  switch (mode_) {
    case Mode::kDynamic: o << "dynamic loss scale " << state_.scale; break;
    case Mode::kStatic: o << "static loss scale " << state_.scale; break;
    case Mode::kNone: o << "no loss scaling"; break;
  }
  return o.str();
}

ScalerRule LossScaler::rule() const {
  ScalerRule r;
  r.dynamic = mode_ == Mode::kDynamic;
  r.growth_factor = cfg_.growth_factor();
  r.backoff_factor = cfg_.backoff_factor();
  r.min_scale = cfg_.min_scale();
  r.growth_interval = cfg_.growth_interval();
  r.hysteresis = cfg_.hysteresis();
  r.max_consecutive_skips = max_consecutive_skips_;
  return r;
}

void LossScaler::throw_status(int32_t status) const {
  std::ostringstream o;
  if (status == kScalerTooManySkips) {
    o << state_.consecutive_skips << " consecutive steps had non-finite gradients on some rank "
      << "(precision.max_consecutive_skips = " << max_consecutive_skips_ << ", loss scale " << state_.scale
      << "): stopping instead of skipping forever; try a lower optimizer.lr, bf16, precision.fp32_layers for the "
      << "layer that overflows, or check the input data";
  } else {
    o << "loss scale would fall to " << state_.scale * cfg_.backoff_factor() << ", below precision.dynamic.min_scale = "
      << cfg_.min_scale() << ", after " << state_.skipped_steps << " skipped steps: the gradients overflow at every "
      << "scale; try a lower optimizer.lr, bf16, or precision.fp32_layers for the layer that overflows";
  }
  throw Error(o.str()).set_collective();  // the state follows from agreed flags only
}

void LossScaler::update(bool found_inf) {
  ++updates_;
  const int32_t status = scaler_update(state_, rule(), found_inf);
  if (status != kScalerOk) throw_status(status);
}

}  // namespace ampdist
