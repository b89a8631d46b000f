// The step's observers (train/step_observer.h): phase timing, fault drills and the per-layer numerics report, on
// either backend (a device tensor's statistics are reduced on the device; the GPU's phases are timed with CUDA
// events).
#include "runtime/kernels/kernels.h"
#include "runtime/train/trainer.h"

namespace ampdist {
namespace {

class PhaseTiming : public StepObserver {
 public:
  explicit PhaseTiming(std::unique_ptr<PhaseTimer> timer) : timer_(std::move(timer)) {}
  PhaseTimer* timer() { return timer_.get(); }
  void phase_begin(Phase p) override { timer_->begin(p); }
  void phase_end(Phase p) override { timer_->end(p); }
  void end_step(StepEnd&) override { timer_->end_step(); }

 private:
  std::unique_ptr<PhaseTimer> timer_;
};

// fault { ... }: kill and stall at the start of an iteration, values injected into the input, a layer's output in
// the first micro-batch, or a parameter's final gradient.
class FaultDrills : public StepObserver {
 public:
  FaultDrills(const FaultConfig& cfg, int rank) : hook_(cfg, rank) {}
  FaultHook& hook() { return hook_; }
  void begin_step(int64_t iteration) override { hook_.before_step(iteration); }
  const Tensor& input(const Tensor& x, int64_t iteration) override { return hook_.input(x, iteration); }
  void layer_output(size_t, Module& layer, Tensor& y, size_t micro, int64_t iteration) override {
    if (micro == 0) hook_.activation(layer.name(), y, iteration);
  }
  void gradient(Parameter& p, int64_t iteration) override { hook_.gradient(p, iteration); }

 private:
  FaultHook hook_;
};

// precision.numerics_report_every: per-layer statistics of every micro-batch's activations and the final gradients,
// reduced over ranks into a report every that many steps and at the first skipped step. The flag and the iteration
// are agreed, so every rank reduces alike.
class NumericsReporting : public StepObserver {
 public:
  NumericsReporting(std::vector<std::string> layers, DType working, int64_t every)
      : monitor_(std::move(layers), working), every_(every),
        underflow_(NumericsMonitor::underflow_threshold(working)) {}
  void begin_step(int64_t) override { monitor_.begin_step(); }
  void layer_output(size_t index, Module&, Tensor& y, size_t, int64_t) override {
    monitor_.on_activation(index, stats_of(y, 0.0));
  }
  void gradient(Parameter& p, int64_t) override { monitor_.on_gradient(p.name, stats_of(p.grad, underflow_)); }
  void end_step(StepEnd& end) override {
    const bool skipped = end.agreed_found_inf();  // the report's one read of the step state per step
    const bool first_bad = skipped && !reported_first_nonfinite_;
    if (!first_bad && end.iteration % every_ != 0) return;
    end.numerics = std::make_shared<const NumericsReport>(monitor_.reduce(*end.comm, end.iteration));
    reported_first_nonfinite_ |= skipped;
  }

 private:
  // One tensor's statistics, reduced where it lives (a device tensor's on the device).
  static ValueStats stats_of(const Tensor& t, double threshold) {
    const kernels::AbsStats s = kernels::abs_stats(t, static_cast<float>(threshold));
    return {static_cast<double>(s.max_abs), s.nonfinite, s.below, t.numel()};
  }

  NumericsMonitor monitor_;
  int64_t every_;
  double underflow_;
  bool reported_first_nonfinite_ = false;
};

}  // namespace

void Trainer::setup_observers() {
  if (cfg_.log().phase_timing()) {
    auto timing = std::make_unique<PhaseTiming>(make_phase_timer(device_));
    timer_ = timing->timer();
    observers_.add(std::move(timing));
  }
  auto drills = std::make_unique<FaultDrills>(cfg_.fault(), comm_.rank());
  const bool numerics = cfg_.precision().numerics_report_every() > 0;
  std::vector<std::string> names;
  if (numerics || drills->hook().injects_activations()) {  // layer outputs are observed: a Sequential's layers
    observed_ = dynamic_cast<Sequential*>(model_.get());
    if (observed_)
      for (size_t i = 0; i < observed_->size(); ++i) names.push_back(observed_->at(i).name());
    else
      names.push_back(model_->name());  // one opaque layer: only its parameters' gradients are observed
    drills->hook().check_layers(names, observed_ != nullptr);
  }
  observers_.add(std::move(drills));
  if (numerics)
    observers_.add(std::make_unique<NumericsReporting>(names, masters_->working_dtype(),
                                                       cfg_.precision().numerics_report_every()));
}

}  // namespace ampdist
