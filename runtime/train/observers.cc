// The trainer's observers: phase timing, the per-layer numerics report and activation fault drills, on either
// backend (a device tensor's statistics are reduced on the device; the GPU's phases are timed with CUDA events).
#include "runtime/train/trainer.h"

namespace ampdist {

void Trainer::setup_observers() {
  if (cfg_.log().phase_timing()) timer_ = make_phase_timer(device_);
  if (cfg_.precision().numerics_report_every() <= 0 && !faults_.injects_activations()) return;
  auto* seq = dynamic_cast<Sequential*>(model_.get());
  std::vector<std::string> names;
  if (seq)
    for (size_t i = 0; i < seq->size(); ++i) names.push_back(seq->at(i).name());
  else
    names.push_back(model_->name());  // one opaque layer: only its parameters' gradients are observed
  faults_.check_layers(names, seq != nullptr);
  if (cfg_.precision().numerics_report_every() > 0)
    numerics_ = std::make_unique<NumericsMonitor>(names, masters_->working_dtype());
  if (seq) seq->forward_observer = [this](size_t i, Module& m, Tensor& y) { on_layer_output(i, m, y); };
}

void Trainer::on_layer_output(size_t index, Module& layer, Tensor& y) {
  if (!observing_) return;
  if (first_micro_) faults_.activation(layer.name(), y, iteration_);
  if (numerics_) numerics_->on_activation(index, y);
}

}  // namespace ampdist
