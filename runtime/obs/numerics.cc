#include "runtime/obs/numerics.h"

#include <cmath>
#include <limits>


namespace ampdist {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

double NumericsReport::headroom_bits(const LayerNumerics& l) const {
  const double m = std::max(l.act_max, l.grad_max);
  if (!std::isfinite(m)) return -kInf;
  if (m <= 0.0) return kInf;
  return std::log2(dtype_max / m);
}

double NumericsMonitor::underflow_threshold(DType t) {
  switch (t) {
    case DType::kFloat16: return std::ldexp(1.0, -25);   // smallest fp16 subnormal 2^-24, halved
    case DType::kBFloat16: return std::ldexp(1.0, -134); // smallest bf16 subnormal 2^-133, halved
    case DType::kFloat32: break;
  }
  return 0.0;
}

NumericsMonitor::NumericsMonitor(std::vector<std::string> layer_names, DType working)
    : names_(std::move(layer_names)), working_(working) {
  begin_step();
}

void NumericsMonitor::begin_step() {
  const size_t n = names_.size();
  act_max_.assign(n, 0.0);
  grad_max_.assign(n, -1.0);
  grad_elems_.assign(n, 0);
  grad_under_.assign(n, 0);
  events_ = 0;
  first_pos_ = -1;
  first_layer_ = -1;
}

int NumericsMonitor::layer_of(const std::string& param_name) const {
  const std::string layer = param_name.substr(0, param_name.rfind('.'));
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == layer) return static_cast<int>(i);
  return -1;
}

void NumericsMonitor::on_activation(size_t index, const ValueStats& y) {
  const int64_t pos = events_++;
  if (index >= names_.size()) return;
  const double m = y.nonfinite ? kInf : y.max_abs;
  act_max_[index] = std::max(act_max_[index], m);
  if (std::isinf(m) && first_pos_ < 0) {
    first_pos_ = pos;
    first_layer_ = static_cast<int>(index);
    first_forward_ = true;
  }
}

void NumericsMonitor::on_gradient(const std::string& param_name, const ValueStats& s) {
  const int64_t pos = events_++;
  const int l = layer_of(param_name);
  if (l < 0) return;
  const bool bad = s.nonfinite;
  grad_max_[l] = std::max(grad_max_[l], bad ? kInf : s.max_abs);
  grad_elems_[l] += s.elements;
  grad_under_[l] += s.below;
  if (bad && first_pos_ < 0) {
    first_pos_ = pos;
    first_layer_ = l;
    first_forward_ = false;
  }
}

NumericsReport NumericsMonitor::reduce(Communicator& comm, int64_t step) const {
  const size_t n = names_.size();
  // MAX over ranks: the maxima, and minus the first position (so the earliest position wins); SUM: the counts.
  std::vector<double> mx(2 * n + 1);
  for (size_t i = 0; i < n; ++i) {
    mx[2 * i] = act_max_[i];
    mx[2 * i + 1] = grad_max_[i];
  }
  mx[2 * n] = first_pos_ >= 0 ? -static_cast<double>(first_pos_) : -kInf;
  comm.allreduce_f64(mx, ReduceOp::kMax, "numerics report maxima all-reduce");
  std::vector<int64_t> counts(2 * n);
  for (size_t i = 0; i < n; ++i) {
    counts[2 * i] = grad_elems_[i];
    counts[2 * i + 1] = grad_under_[i];
  }
  comm.allreduce_i64(counts, ReduceOp::kSum, "numerics report counts all-reduce");
  // The rank holding the earliest position names its layer: the lowest such rank reports (layer index, pass).
  const bool mine = first_pos_ >= 0 && -static_cast<double>(first_pos_) == mx[2 * n];
  std::vector<int64_t> who = {mine ? comm.world_size() - comm.rank() : 0};
  comm.allreduce_i64(who, ReduceOp::kMax, "numerics report first non-finite rank");
  const bool reporter = mine && who[0] == comm.world_size() - comm.rank();
  std::vector<double> first = {reporter ? static_cast<double>(first_layer_) : -1.0,
                               reporter ? (first_forward_ ? 1.0 : 0.0) : -1.0};
  comm.allreduce_f64(first, ReduceOp::kMax, "numerics report first non-finite layer");

  NumericsReport r;
  r.step = step;
  r.dtype = dtype_name(working_);
  r.dtype_max = dtype_max(working_);
  for (size_t i = 0; i < n; ++i) {
    LayerNumerics l;
    l.name = names_[i];
    l.act_max = mx[2 * i];
    l.grad_max = mx[2 * i + 1];
    l.grad_elements = counts[2 * i];
    l.grad_underflow = counts[2 * i + 1];
    r.layers.push_back(l);
  }
  if (first[0] >= 0) {
    r.first_nonfinite_layer = names_[static_cast<size_t>(first[0])];
    r.first_nonfinite_pass = first[1] > 0.5 ? "forward" : "backward";
  }
  return r;
}

}  // namespace ampdist
