// The trainer's state beyond the flat buffers: reading the step state back to the host, and the run's own fields of
// a checkpoint (its tensors are the CheckpointBinding's, train/checkpoint_binding.h).
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "runtime/core/device.h"
#include "runtime/dist/publish.h"
#include "runtime/train/config.h"
#include "runtime/train/trainer.h"

namespace ampdist {

void Trainer::read_state(StepResult& r) {
  snapshot_ = state_->read();  // on the GPU: waits for every queued step
  state_->clear_since_read();
  const StepState& h = snapshot_;
  if (h.status == kStateDisagree)
    consensus_.report_disagreement(h.scaler.scale, h.scaler.growth_tracker, iteration_);  // every rank: it is agreed
  if (h.status != 0) scaler().throw_status(h.status);
  r.read = true;
  r.loss = h.loss_sum + host_loss_since_read_;
  host_loss_since_read_ = 0.0;
  r.skipped = h.last_skipped != 0;
  r.scale = h.last_scale;
  r.lr = h.last_lr;
  r.grad_norm = h.grad_norm;
  r.stop = h.stop != 0;
  r.dropped_ranks = static_cast<int>(h.dropped_rank_steps);
  r.dropped_samples = h.dropped_samples;
}

template <typename F> void Trainer::for_each_master_chunk(F&& fn) {
  Tensor& master = masters_->master();
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (!sharded()) {
    const Tensor host = device_ == Device::kCPU ? master : master.to(Device::kCPU);
    const float* p = host.data_as<float>();
    for (int64_t off = 0; off < host.numel(); off += kChunk) fn(p + off, std::min(kChunk, host.numel() - off));
    return;
  }
  // Rank r's slice, chunk by chunk, to every rank: an all-gather in which only r contributes is a broadcast.
  const std::vector<int64_t>& slices = masters_->slice_counts();
  const int world = comm_.world_size();
  Tensor chunk = Tensor::empty({std::min(kChunk, std::max<int64_t>(slices.empty() ? 1 : slices[0], 1))},
                               DType::kFloat32, device_);
  std::vector<float> host(static_cast<size_t>(chunk.numel()));
  for (int r = 0; r < world; ++r) {
    for (int64_t off = 0; off < slices[r]; off += chunk.numel()) {
      const int64_t n = std::min(chunk.numel(), slices[r] - off);
      if (r == comm_.rank())
        device::copy(chunk.data(), device_, master.data_as<float>() + off, device_, n * sizeof(float));
      std::vector<int64_t> counts(static_cast<size_t>(world), 0);
      counts[r] = n;
      comm_.allgather_inplace_async(chunk.data(), counts, DType::kFloat32, "master weights broadcast")->wait();
      device::copy(host.data(), Device::kCPU, chunk.data(), device_, n * sizeof(float));
      fn(host.data(), n);
    }
  }
}

uint64_t Trainer::with_buffers_hash(uint64_t seed) const {
  if (!buffers_) return seed;
  const std::vector<float> v = buffers_->host_values();
  return XXH3_64bits_withSeed(v.data(), v.size() * sizeof(float), seed);
}

uint64_t Trainer::master_hash() {
  const kernels::ExecScope scope(exec_);
  if (!sharded()) return with_buffers_hash(masters_->hash());
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  for_each_master_chunk([&](const float* p, int64_t n) { XXH3_64bits_update(h, p, n * sizeof(float)); });
  const uint64_t out = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return with_buffers_hash(out);
}

std::vector<float> Trainer::gather_master() {
  const kernels::ExecScope scope(exec_);
  std::vector<float> out;
  out.reserve(static_cast<size_t>(masters_->numel()));
  for_each_master_chunk([&](const float* p, int64_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

StepResult Trainer::read_now() {
  StepResult r;
  r.iteration = iteration_;
  read_state(r);
  return r;
}

LossScaler Trainer::scaler() const {
  LossScaler s = scaler_policy_;
  s.set_state(snapshot_.scaler);
  s.set_updates(snapshot_.scaler_updates);
  return s;
}

void Trainer::write_state() {
  StepState s = state_->read();
  s.scaler = snapshot_.scaler;
  s.scaler_updates = snapshot_.scaler_updates;
  s.optimizer_steps = snapshot_.optimizer_steps;
  s.status = 0;
  s.stop = 0;
  s.loss_sum = 0.0;
  s.dropped_rank_steps = 0;
  s.dropped_samples = 0;
  state_->write(s);
  snapshot_ = s;
}

CheckpointState Trainer::checkpoint_state(bool device_buffers) {
  const kernels::ExecScope scope(exec_);
  read_now();  // the snapshot: the scaler state and step count as of the last step
  Manifest m;
  m.set_run_id(run_id_);
  m.set_step(iteration_);
  const int64_t spe = steps_per_epoch();
  m.set_epoch(spe > 0 ? iteration_ / spe : 0);
  m.set_step_in_epoch(spe > 0 ? iteration_ % spe : 0);
  m.set_global_batch_size(cfg_.data().global_batch_size());
  m.set_precision(dtype_to_name(working_dtype()));
  *m.mutable_config() = cfg_;
  m.mutable_config()->clear_fault();
  write_scaler_state(snapshot_.scaler, *m.mutable_scaler());
  m.set_optimizer_step_count(snapshot_.optimizer_steps);
  m.set_master_xxh3(master_hash());
  return checkpoint_->state(std::move(m), device_buffers);
}

std::string Trainer::restore(const Manifest& m) {
  const kernels::ExecScope scope(exec_);
  LossScalerState st = read_scaler_state(m.scaler());
  // The saved scaler state belongs to the saved precision's policy. Resumed with another working dtype or loss-scale
  // mode (fp16 -> bf16 after a min_scale stop, say), the configured policy starts afresh: its initial scale and
  // empty trackers; only the run's count of skipped steps carries over.
  const DTypeName saved_dtype = m.has_precision() ? m.precision() : dtype_to_name(working_dtype());
  LossScaler saved = LossScaler::from_config(m.config().precision(), saved_dtype);
  saved.set_state(st);
  std::string note;
  if (saved_dtype != dtype_to_name(working_dtype())) {
    note = std::string("precision changed on resume: the checkpoint was trained in ") +
           dtype_name(resolve_dtype(saved_dtype, Device::kCPU)) + " with " + saved.describe() + ", this run is " +
           dtype_name(working_dtype()) + ": the loss scaler starts afresh with " + scaler_policy_.describe();
  } else if (saved.mode() != scaler_policy_.mode()) {
    note = std::string("loss scaling changed on resume: the checkpoint was trained (") +
           dtype_name(working_dtype()) + ") with " + saved.describe() + ", this run uses " + scaler_policy_.describe() +
           ", which starts afresh";
  }
  if (!note.empty()) {
    const int64_t skipped = st.skipped_steps;
    st = scaler_policy_.state();
    st.skipped_steps = skipped;
  }
  checkpoint_->restore(m);  // refuses other model buffers before anything changes
  iteration_ = m.step();
  snapshot_.scaler = st;
  snapshot_.optimizer_steps = m.optimizer_step_count();
  if (!m.run_id().empty()) run_id_ = m.run_id();
  masters_->cast_to_working();
  if (sharded()) publish(*masters_, comm_);  // every rank restored its slice: rebuild the whole working copy
  write_state();
  if (sampler_) {
    // Continue at the same global sample position; with the same global batch (any world size, any
    // accumulation) that is the same step of the same epoch.
    const int64_t g = cfg_.data().global_batch_size();
    const int64_t saved_g = m.global_batch_size() > 0 ? m.global_batch_size() : g;
    const int64_t step_in_epoch = m.step_in_epoch() * saved_g / g;
    loader_.reset();
    loader_ = std::make_unique<Loader>(train_, *sampler_, cfg_.optimizer().accumulation_steps(),
                                       cfg_.data().prefetch_steps(), m.epoch(), step_in_epoch);
  }
  return note;
}

}  // namespace ampdist
