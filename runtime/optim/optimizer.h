// Optimizers over the flat FP32 master buffer.
//
// The training step calls step(params, grads, gate) with the gate finish_step decided (optim/step_gate.h), on the
// device the buffers live on: a skipped step's gate says so and nothing changes (moments, weight decay); the
// gate also carries the learning rate, the clip factor and AdamW's bias corrections. The formulas are
// torch.optim.SGD's and torch.optim.AdamW's, written once per element in kernels/math.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/update_gate.h"

namespace ampdist {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params, grads: [n] FP32 (the flat buffers). gate: the step's StepGate on their device. step_count() is not
  // changed: the step state counts the applied updates of a training step (Trainer::optimizer_steps).
  // working: null, or the [n] fp16/bf16 working copy of params, written in the same pass with each updated value
  // rounded (kernels.h, sgd_step), so that it is current after the step without a separate cast.
  virtual void step(Tensor& params, const Tensor& grads, const StepGate* gate, Tensor* working = nullptr) = 0;
  // One update applied from the host with learning rate `lr` and no clipping (for host-side loops and tests): the
  // gated update above with a gate built here; counts the update.
  void step(Tensor& params, const Tensor& grads, float lr);
  virtual std::string kind() const = 0;  // "sgd", "adamw"
  // Host-driven updates applied so far (the step(params, grads, lr) overload: AdamW's t there).
  int64_t step_count() const { return step_count_; }
  // The per-element state buffers (momentum; m and v), [n] FP32 each, in a fixed order with their names.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
  // Parameter groups (optimizer.no_decay): element ranges [begin, end) of the buffers step() updates (this rank's
  // slice with ZeRO stage 1, so ranges relative to the slice) that get no weight decay; sorted, disjoint. Each step
  // then updates the runs of the buffer in order, the no-decay runs with weight_decay 0, with the same per-element
  // function (kernels/math.h) as one whole-buffer update; empty (the default) is that one update.
  void set_no_decay(std::vector<std::pair<int64_t, int64_t>> ranges);
  const std::vector<std::pair<int64_t, int64_t>>& no_decay() const { return no_decay_; }

 protected:
  // AdamW's betas, for the host-built gate's bias corrections (none for SGD).
  virtual bool bias_corrected(double& beta1, double& beta2) const { return false; }
  // Calls f(begin, count, decay) for the runs of [0, n) in order: the whole buffer with decay when no ranges are
  // set, else alternating decay / no-decay runs (empty runs skipped).
  template <typename F> void for_each_run(int64_t n, F&& f) const {
    int64_t at = 0;
    for (const auto& [b, e] : no_decay_) {
      if (b > at) f(at, b - at, true);
      if (e > b) f(b, e - b, false);
      at = e;
    }
    if (n > at) f(at, n - at, true);
  }
  int64_t step_count_ = 0;
  std::vector<std::pair<int64_t, int64_t>> no_decay_;
};

class Sgd : public Optimizer {
 public:
  Sgd(int64_t numel, const SgdConfig& cfg, float weight_decay, Device device = Device::kCPU);
  using Optimizer::step;
  void step(Tensor& params, const Tensor& grads, const StepGate* gate, Tensor* working = nullptr) override;
  std::string kind() const override { return "sgd"; }
  std::vector<std::pair<std::string, Tensor*>> state() override;

 private:
  SgdConfig cfg_;
  float weight_decay_;
  Tensor momentum_;  // empty when momentum == 0
};

class AdamW : public Optimizer {
 public:
  AdamW(int64_t numel, const AdamWConfig& cfg, float weight_decay, Device device = Device::kCPU);
  using Optimizer::step;
  void step(Tensor& params, const Tensor& grads, const StepGate* gate, Tensor* working = nullptr) override;
  std::string kind() const override { return "adamw"; }
  std::vector<std::pair<std::string, Tensor*>> state() override;
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

 protected:
  bool bias_corrected(double& beta1, double& beta2) const override {
    beta1 = cfg_.beta1();
    beta2 = cfg_.beta2();
    return true;
  }

 private:
  AdamWConfig cfg_;
  float weight_decay_;
  Tensor m_, v_;
};

// The optimizer named by optimizer { sgd {...} } or { adamw {...} } (default: SGD without momentum), its state
// buffers on `device`.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel, Device device = Device::kCPU);

// Learning rate of the n-th applied update (n = 0, 1, ...): linear warmup lr * (n+1) / warmup_steps for
// n < warmup_steps, then constant or a cosine from lr to min_lr over the remaining updates up to total_steps
// (SGDR's cosine, Loshchilov & Hutter 2017; the nanoGPT form). n counts applied updates only: a skipped step
// does not advance the schedule.
class LrSchedule {
 public:
  LrSchedule(float lr, const ScheduleConfig& cfg, int64_t total_steps);
  float lr(int64_t n) const;

 private:
  float base_;
  ScheduleConfig cfg_;
  int64_t total_;
};

// Global L2 norm clipping (torch.nn.utils.clip_grad_norm_): with norm = the global norm of the unscaled gradients,
// multiplies them by max_norm / (norm + 1e-6) when that is < 1. Returns the factor applied (1 when none).
float clip_grad_norm(Tensor& grads, double norm, float max_norm);

}  // namespace ampdist
