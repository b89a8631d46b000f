// Step observers: what watches the training step (phase timing, the per-layer numerics report) or changes it on
// purpose (fault drills), behind one interface that Trainer::step calls at named points, in this order:
//
//   begin_step(iteration)                 before anything of the step runs
//   input(x, iteration)                   the first micro-batch's host input; an observer may return a replacement
//   phase_begin(phase) / phase_end(phase) around each phase of the step (runtime/obs/phase_timer.h's Phase)
//   layer_output(index, layer, y, micro)  after each layer of a Sequential model, in every micro-batch's training
//                                         forward (never in evaluation)
//   gradient(p, iteration)                a parameter's gradient is final for the step (the last micro-batch),
//                                         before the reduction
//   before_update()                       after the consensus and before the optimizer phase, outside any phase:
//                                         the last point before the step writes the master weights, the optimizer
//                                         state and the model buffers (an asynchronous save's staging copy waits here)
//   end_step(end)                         after the update and the phase timing's step end
//
// Each point does nothing by default. Observers run in the order they were added, at every point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"
#include "runtime/obs/numerics.h"
#include "runtime/obs/phase_timer.h"

namespace ampdist {

// What end_step may look at and fill in.
struct StepEnd {
  int64_t iteration = 0;
  Communicator* comm = nullptr;
  // The agreed skip flag of this step (on the GPU a 4-byte device read that waits for the step: call only when
  // needed).
  std::function<bool()> agreed_found_inf;
  // The step's per-layer report, when an observer made one.
  std::shared_ptr<const NumericsReport> numerics;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void begin_step(int64_t iteration) {}
  virtual const Tensor& input(const Tensor& x, int64_t iteration) { return x; }
  virtual void phase_begin(Phase phase) {}
  virtual void phase_end(Phase phase) {}
  virtual void layer_output(size_t index, Module& layer, Tensor& y, size_t micro, int64_t iteration) {}
  virtual void gradient(Parameter& p, int64_t iteration) {}
  virtual void before_update() {}
  virtual void end_step(StepEnd& end) {}
};

// The step's observers, called in the order they were added.
class StepObservers {
 public:
  void add(std::unique_ptr<StepObserver> o) { list_.push_back(std::move(o)); }
  bool empty() const { return list_.empty(); }

  void begin_step(int64_t iteration) {
    for (auto& o : list_) o->begin_step(iteration);
  }
  const Tensor& input(const Tensor& x, int64_t iteration) {
    const Tensor* cur = &x;
    for (auto& o : list_) cur = &o->input(*cur, iteration);
    return *cur;
  }
  void phase_begin(Phase phase) {
    for (auto& o : list_) o->phase_begin(phase);
  }
  void phase_end(Phase phase) {
    for (auto& o : list_) o->phase_end(phase);
  }
  void layer_output(size_t index, Module& layer, Tensor& y, size_t micro, int64_t iteration) {
    for (auto& o : list_) o->layer_output(index, layer, y, micro, iteration);
  }
  void gradient(Parameter& p, int64_t iteration) {
    for (auto& o : list_) o->gradient(p, iteration);
  }
  void before_update() {
    for (auto& o : list_) o->before_update();
  }
  void end_step(StepEnd& end) {
    for (auto& o : list_) o->end_step(end);
  }

 private:
  std::vector<std::unique_ptr<StepObserver>> list_;
};

}  // namespace ampdist
