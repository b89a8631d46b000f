#include "runtime/optim/optimizer.h"

#include <cmath>
#include <numbers>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"
#include "runtime/optim/step_gate.h"

namespace ampdist {

Sgd::Sgd(int64_t numel, const SgdConfig& cfg, float weight_decay, Device device)
    : cfg_(cfg), weight_decay_(weight_decay) {
  if (cfg.momentum() != 0.0f) momentum_ = Tensor::zeros({numel}, DType::kFloat32, device);
}

void Optimizer::step(Tensor& params, const Tensor& grads, float lr) {
  StepGate g;
  g.apply = 1;
  g.first_step = step_count_ == 0 ? 1 : 0;
  g.lr = lr;
  double beta1, beta2;
  if (bias_corrected(beta1, beta2))
    math::adamw_bias_corrections(beta1, beta2, step_count_ + 1, g.bias_correction1, g.bias_correction2_sqrt);
  if (params.device() == Device::kCPU) {
    step(params, grads, &g);
  } else {  // the gate must live where the kernels read it
    Tensor dev = Tensor::empty({static_cast<int64_t>((sizeof g + 3) / 4)}, DType::kFloat32, params.device());
    device::copy(dev.data(), params.device(), &g, Device::kCPU, sizeof g);
    step(params, grads, static_cast<const StepGate*>(dev.data()));
    device::synchronize();  // dev is freed on return
  }
  ++step_count_;
}

namespace {
// Elements [b, b + n) of a flat FP32 buffer, on its device.
Tensor span_of(const Tensor& t, int64_t b, int64_t n) {
  return Tensor::view(const_cast<float*>(t.data_as<float>()) + b, {n}, DType::kFloat32, t.device());
}
// The same elements of a working copy (16-bit), or null without one.
Tensor* working_span(Tensor* working, int64_t b, int64_t n, Tensor& out) {
  if (!working) return nullptr;
  out = working->rows(b, b + n);
  return &out;
}
}  // namespace

void Optimizer::set_no_decay(std::vector<std::pair<int64_t, int64_t>> ranges) {
  for (size_t i = 0; i < ranges.size(); ++i)
    if (ranges[i].first < 0 || ranges[i].second < ranges[i].first || (i > 0 && ranges[i].first < ranges[i - 1].second))
      throw Error("optimizer: no-decay ranges must be sorted, disjoint and non-negative");
  no_decay_ = std::move(ranges);
}

void Sgd::step(Tensor& params, const Tensor& grads, const StepGate* gate, Tensor* working) {
  // lr and first_step come from the gate.
  const kernels::SgdParams p{0.0f, cfg_.momentum(), cfg_.dampening(), weight_decay_, cfg_.nesterov(), false};
  if (no_decay_.empty()) return kernels::sgd_step(params, grads, momentum_, p, gate, working);
  const bool has_buf = cfg_.momentum() != 0.0f;
  for_each_run(params.numel(), [&](int64_t b, int64_t n, bool decay) {
    kernels::SgdParams q = p;
    if (!decay) q.weight_decay = 0.0f;
    Tensor w = span_of(params, b, n), buf = has_buf ? span_of(momentum_, b, n) : momentum_, ws;
    kernels::sgd_step(w, span_of(grads, b, n), buf, q, gate, working_span(working, b, n, ws));
  });
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

void AdamW::step(Tensor& params, const Tensor& grads, const StepGate* gate, Tensor* working) {
  // lr, the step and its bias corrections come from the gate.
  const kernels::AdamWParams p{0.0f, cfg_.beta1(), cfg_.beta2(), cfg_.eps(), weight_decay_, 0};
  if (no_decay_.empty()) return kernels::adamw_step(params, grads, m_, v_, p, gate, working);
  for_each_run(params.numel(), [&](int64_t b, int64_t n, bool decay) {
    kernels::AdamWParams q = p;
    if (!decay) q.weight_decay = 0.0f;
    Tensor w = span_of(params, b, n), m = span_of(m_, b, n), v = span_of(v_, b, n), ws;
    kernels::adamw_step(w, span_of(grads, b, n), m, v, q, gate, working_span(working, b, n, ws));
  });
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
