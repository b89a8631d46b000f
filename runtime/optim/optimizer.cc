#include "runtime/optim/optimizer.h"

#include <cmath>
#include <numbers>

#include "runtime/kernels/kernels.h"

namespace ampdist {

Sgd::Sgd(int64_t numel, const SgdConfig& cfg, float weight_decay) : cfg_(cfg), weight_decay_(weight_decay) {
  if (cfg.momentum() != 0.0f) momentum_ = Tensor::zeros({numel}, DType::kFloat32);
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

AdamW::AdamW(int64_t numel, const AdamWConfig& cfg, float weight_decay)
    : cfg_(cfg),
      weight_decay_(weight_decay),
      m_(Tensor::zeros({numel}, DType::kFloat32)),
      v_(Tensor::zeros({numel}, DType::kFloat32)) {}

void AdamW::step(Tensor& params, const Tensor& grads, float lr) {
  kernels::AdamWParams p{lr, cfg_.beta1(), cfg_.beta2(), cfg_.eps(), weight_decay_, step_count_ + 1};
  kernels::adamw_step(params, grads, m_, v_, p);
  ++step_count_;
}

std::vector<std::pair<std::string, Tensor*>> AdamW::state() { return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}; }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel) {
  if (cfg.has_adamw()) return std::make_unique<AdamW>(numel, cfg.adamw(), cfg.weight_decay());
  return std::make_unique<Sgd>(numel, cfg.sgd(), cfg.weight_decay());
}

LrSchedule::LrSchedule(float lr, const ScheduleConfig& cfg, int64_t total_steps)
    : base_(lr), cfg_(cfg), total_(cfg.total_steps() > 0 ? cfg.total_steps() : total_steps) {}

float LrSchedule::lr(int64_t n) const {
  const int64_t warm = cfg_.warmup_steps();
  if (n < warm) return base_ * static_cast<float>(n + 1) / static_cast<float>(warm);
  if (cfg_.kind() != COSINE || total_ <= warm) return base_;
  const double progress = std::min(1.0, static_cast<double>(n - warm) / static_cast<double>(total_ - warm));
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(cfg_.min_lr() + coeff * (base_ - cfg_.min_lr()));
}

float clip_grad_norm(Tensor& grads, double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
  if (coef >= 1.0) return 1.0f;
  kernels::scale_inplace(grads, static_cast<float>(coef));
  return static_cast<float>(coef);
}

}  // namespace ampdist
