#include "runtime/optim/optimizer.h"

#include <cmath>
#include <numbers>

#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/step_math.h"

namespace ampdist {

Sgd::Sgd(int64_t numel, const SgdConfig& cfg, float weight_decay, Device device)
    : cfg_(cfg), weight_decay_(weight_decay) {
  if (cfg.momentum() != 0.0f) momentum_ = Tensor::zeros({numel}, DType::kFloat32, device);
}

void Sgd::step_device(Tensor& params, const Tensor& grads, const DeviceTrainState* st) {
  kernels::gpu::sgd_step(params, grads, momentum_, cfg_.momentum(), cfg_.dampening(), weight_decay_,
                            cfg_.nesterov(), st);
}

void Sgd::step(Tensor& params, const Tensor& grads, float lr) {
  kernels::SgdParams p{lr, cfg_.momentum(), cfg_.dampening(), weight_decay_, cfg_.nesterov(), step_count_ == 0};
  kernels::sgd_step(params, grads, momentum_, p);
  ++step_count_;
}

std::vector<std::pair<std::string, Tensor*>> Sgd::state() {
  if (cfg_.momentum() == 0.0f) return {};  // no buffer (momentum_ is a default Tensor: shape {}, numel 1, no data)
  return {{"momentum", &momentum_}};
}

AdamW::AdamW(int64_t numel, const AdamWConfig& cfg, float weight_decay, Device device)
    : cfg_(cfg),
      weight_decay_(weight_decay),
      m_(Tensor::zeros({numel}, DType::kFloat32, device)),
      v_(Tensor::zeros({numel}, DType::kFloat32, device)) {}

void AdamW::step_device(Tensor& params, const Tensor& grads, const DeviceTrainState* st) {
  kernels::gpu::adamw_step(params, grads, m_, v_, cfg_.beta1(), cfg_.beta2(), cfg_.eps(), weight_decay_, st);
}

void AdamW::step(Tensor& params, const Tensor& grads, float lr) {
  kernels::AdamWParams p{lr, cfg_.beta1(), cfg_.beta2(), cfg_.eps(), weight_decay_, step_count_ + 1};
  kernels::adamw_step(params, grads, m_, v_, p);
  ++step_count_;
}

std::vector<std::pair<std::string, Tensor*>> AdamW::state() { return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}; }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel, Device device) {
  if (cfg.has_adamw()) return std::make_unique<AdamW>(numel, cfg.adamw(), cfg.weight_decay(), device);
  return std::make_unique<Sgd>(numel, cfg.sgd(), cfg.weight_decay(), device);
}

LrSchedule::LrSchedule(float lr, const ScheduleConfig& cfg, int64_t total_steps)
    : base_(lr), cfg_(cfg), total_(cfg.total_steps() > 0 ? cfg.total_steps() : total_steps) {}

float LrSchedule::lr(int64_t n) const {
  return lr_at(n, base_, cfg_.warmup_steps(), cfg_.kind() == COSINE, total_, cfg_.min_lr());
}

float clip_grad_norm(Tensor& grads, double norm, float max_norm) {
  const float coef = clip_coef(norm, max_norm);
  if (coef != 1.0f) kernels::scale_inplace(grads, coef);
  return coef;
}

}  // namespace ampdist
