#include "runtime/train/faults.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <thread>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"

namespace ampdist {
namespace {

float nonfinite_value(NonFiniteValue v) {
  switch (v) {
    case NEG_INF: return -std::numeric_limits<float>::infinity();
    case QNAN: return std::numeric_limits<float>::quiet_NaN();
    default: return std::numeric_limits<float>::infinity();
  }
}

// Element `i` of t := v, rounded to t's dtype, on t's device.
void write_element(Tensor& t, int64_t i, float v) {
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T value = static_cast<T>(v);
    T* dst = static_cast<T*>(t.data()) + i;
    if (t.device() == Device::kCPU) *dst = value;
    else device::copy(dst, t.device(), &value, Device::kCPU, sizeof value);
  });
}

}  // namespace

FaultHook::FaultHook(const FaultConfig& faults, int rank) : f_(faults), rank_(rank) {}

namespace {
bool applies(const NonFiniteInjection& f, int64_t iteration, int rank, InjectTarget target) {
  return f.step() == iteration && (f.rank() < 0 || f.rank() == rank) && f.target() == target;
}
}  // namespace

void FaultHook::before_step(int64_t iteration) const {
  if (f_.has_kill() && f_.kill().step() == iteration && f_.kill().rank() == rank_) {
    std::fprintf(stderr, "ampdist: fault injection: rank %d kills itself at step %lld\n", rank_,
                 static_cast<long long>(iteration));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  if (f_.has_stall() && f_.stall().step() == iteration && f_.stall().rank() == rank_)
    std::this_thread::sleep_for(std::chrono::duration<double>(f_.stall().seconds()));
}

const Tensor& FaultHook::input(const Tensor& x, int64_t iteration) {
  for (const NonFiniteInjection& f : f_.inject_nonfinite()) {
    if (!applies(f, iteration, rank_, INPUT) || f.element() >= x.numel()) continue;
    injected_x_.ensure(x.shape(), x.dtype());
    kernels::cast(x, injected_x_);
    write_element(injected_x_, f.element(), nonfinite_value(f.value()));
    return injected_x_;
  }
  return x;
}

void FaultHook::gradient(Parameter& p, int64_t iteration) const {
  for (const NonFiniteInjection& f : f_.inject_nonfinite()) {
    if (!applies(f, iteration, rank_, GRADIENT)) continue;
    if (f.element() >= p.offset && f.element() < p.offset + p.numel())
      write_element(p.grad, f.element() - p.offset, nonfinite_value(f.value()));
  }
}

void FaultHook::activation(const std::string& layer, Tensor& y, int64_t iteration) const {
  for (const NonFiniteInjection& f : f_.inject_nonfinite()) {
    if (!applies(f, iteration, rank_, ACTIVATION) || f.layer() != layer || f.element() >= y.numel()) continue;
    write_element(y, f.element(), nonfinite_value(f.value()));
  }
}

bool FaultHook::injects_activations() const {
  return std::any_of(f_.inject_nonfinite().begin(), f_.inject_nonfinite().end(),
                     [](const NonFiniteInjection& f) { return f.target() == ACTIVATION; });
}

void FaultHook::check_layers(const std::vector<std::string>& layers, bool observable) const {
  for (int i = 0; i < f_.inject_nonfinite_size(); ++i) {
    const NonFiniteInjection& f = f_.inject_nonfinite(i);
    if (f.target() != ACTIVATION) continue;
    if (!observable || std::find(layers.begin(), layers.end(), f.layer()) == layers.end()) {
      std::string all;
      for (const std::string& n : layers) all += (all.empty() ? "" : ", ") + n;
      throw BadInput("fault.inject_nonfinite[" + std::to_string(i) + "].layer",
                     "no layer named \"" + f.layer() + "\" in the model (layers: " + all + ")");
    }
  }
}

}  // namespace ampdist
