#include "runtime/train/checkpoint_binding.h"

#include <string>

#include "runtime/core/error.h"

namespace ampdist {
namespace {

void index_layout(const FlatLayout& layout, google::protobuf::RepeatedPtrField<TensorIndexEntry>& out) {
  for (const FlatEntry& e : layout.entries()) {
    TensorIndexEntry* t = out.Add();
    t->set_name(e.name);
    for (int64_t d : e.shape) t->add_shape(d);
    t->set_offset(e.offset);
    t->set_numel(e.numel());
  }
}

}  // namespace

CheckpointState CheckpointBinding::state(Manifest meta, bool device_buffers) {
  CheckpointState s;
  s.meta = std::move(meta);
  Manifest& m = s.meta;
  m.set_optimizer(optimizer_.kind());
  index_layout(masters_.layout(), *m.mutable_tensors());
  // Model buffers (BatchNorm running statistics: small, replicated) travel in the manifest, whose XXH3 covers them.
  if (buffers_) {
    index_layout(buffers_->layout(), *m.mutable_buffer_tensors());
    const std::vector<float> v = buffers_->host_values();
    m.mutable_buffer_values()->Add(v.begin(), v.end());
  }
  s.numel = masters_.numel();
  s.begin = masters_.slice_begin();  // 0 when replicated: the tensors are then the whole buffers
  if (device_ == Device::kCPU || device_buffers) {
    s.buffers.emplace_back("master", &masters_.master());
    for (auto& b : optimizer_.state()) s.buffers.push_back(b);
    return s;
  }
  // Checkpoints are written from host memory: copy the device buffers to host copies (synchronises).
  host_master_ = masters_.master().to(Device::kCPU);
  s.buffers.emplace_back("master", &host_master_);
  const auto state = optimizer_.state();
  host_optim_.resize(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    host_optim_[i] = state[i].second->to(Device::kCPU);
    s.buffers.emplace_back(state[i].first, &host_optim_[i]);
  }
  return s;
}

void CheckpointBinding::restore(const Manifest& m) {
  // The model buffers first: a mismatch is refused before any state changes (every rank reads the same manifest,
  // so every rank refuses alike).
  const int64_t want = buffers_ ? buffers_->numel() : 0;
  const size_t tensors = buffers_ ? buffers_->layout().entries().size() : 0;
  bool same = m.buffer_values_size() == want && static_cast<size_t>(m.buffer_tensors_size()) == tensors;
  for (int i = 0; same && i < m.buffer_tensors_size(); ++i) {
    const FlatEntry& e = buffers_->layout().entries()[static_cast<size_t>(i)];
    const TensorIndexEntry& t = m.buffer_tensors(i);
    same = t.name() == e.name && t.offset() == e.offset && Shape(t.shape().begin(), t.shape().end()) == e.shape;
  }
  if (!same)
    throw Error("checkpoint: its model buffers (" + std::to_string(m.buffer_tensors_size()) + " tensors, " +
                    std::to_string(m.buffer_values_size()) + " values) differ from this model's (" +
                    std::to_string(tensors) + " tensors, " + std::to_string(want) + " values)",
                ErrorKind::kBadInput);
  if (buffers_) buffers_->set_host_values(std::span<const float>(m.buffer_values().data(), m.buffer_values().size()));
  if (device_ == Device::kCUDA) {
    // load_checkpoint filled the host copies handed out by state(): move them to the GPU.
    host_master_.copy_to(masters_.master());
    const auto state = optimizer_.state();
    for (size_t i = 0; i < state.size() && i < host_optim_.size(); ++i) host_optim_[i].copy_to(*state[i].second);
  }
}

void write_scaler_state(const LossScalerState& s, ScalerStateProto& out) {
  out.set_scale(s.scale);
  out.set_growth_tracker(s.growth_tracker);
  out.set_hysteresis_tracker(s.hysteresis_tracker);
  out.set_skipped_steps(s.skipped_steps);
  out.set_consecutive_skips(s.consecutive_skips);
}

LossScalerState read_scaler_state(const ScalerStateProto& in) {
  LossScalerState s;
  s.scale = in.scale();
  s.growth_tracker = in.growth_tracker();
  s.hysteresis_tracker = in.hysteresis_tracker();
  s.skipped_steps = in.skipped_steps();
  s.consecutive_skips = in.consecutive_skips();
  return s;
}

}  // namespace ampdist
