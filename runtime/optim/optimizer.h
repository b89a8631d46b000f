// Optimizers over the flat FP32 master buffer.
//
// step() applies one update to every master weight with one learning rate; the formulas are torch.optim.SGD's and
// torch.optim.AdamW's, written once per element in kernels/math.h. A skipped (overflowing) step never calls step(),
// so moments, the step count and weight decay stay exactly as they were.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/step_math.h"

namespace ampdist {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params, grads: [n] FP32 (the flat buffers). lr: this update's learning rate.
  virtual void step(Tensor& params, const Tensor& grads, float lr) = 0;
  // The CUDA backend's gated update: reads the step's agreed values (skip, lr, clip factor, first step, bias
  // corrections) from st->gate on the device; the host's step_count() is brought up to date by the trainer when it
  // reads the device state. Buffers must be on the GPU.
  virtual void step_device(Tensor& params, const Tensor& grads, const DeviceTrainState* st) = 0;
  virtual std::string kind() const = 0;  // "sgd", "adamw"
  // Updates applied so far (AdamW's t).
  int64_t step_count() const { return step_count_; }
  // Restores the count from a checkpoint (the moments come back through state()).
  void set_step_count(int64_t n) { step_count_ = n; }
  // The per-element state buffers (momentum; m and v), [n] FP32 each, in a fixed order with their names.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;

 protected:
  int64_t step_count_ = 0;
};

class Sgd : public Optimizer {
 public:
  Sgd(int64_t numel, const SgdConfig& cfg, float weight_decay, Device device = Device::kCPU);
  void step(Tensor& params, const Tensor& grads, float lr) override;
  void step_device(Tensor& params, const Tensor& grads, const DeviceTrainState* st) override;
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
  void step(Tensor& params, const Tensor& grads, float lr) override;
  void step_device(Tensor& params, const Tensor& grads, const DeviceTrainState* st) override;
  std::string kind() const override { return "adamw"; }
  std::vector<std::pair<std::string, Tensor*>> state() override;
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

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
