// The training step, one for both backends, in DESIGN.md's order. Every call below queues work where the step runs
// (the CPU, or the GPU's compute stream) and each decision lands in the step state (state_), so nothing here waits
// for the device unless a read is due.
#include <algorithm>

#include "runtime/core/device.h"
#include "runtime/dist/publish.h"
#include "runtime/kernels/kernels.h"
#include "runtime/train/trainer.h"

namespace ampdist {

StepResult Trainer::step() {
  if (!loader_) throw Error("Trainer::step(): no training dataset; use step(micro_batches, global_samples)");
  observers_.phase_begin(Phase::kDataWait);
  const StepBatch& batch = loader_->next();
  observers_.phase_end(Phase::kDataWait);
  return step(batch.micro, batch.global_samples);
}

StepResult Trainer::step(std::span<const MicroBatch> micro, int64_t global_samples) {
  if (micro.empty() || global_samples <= 0) throw Error("Trainer::step: a step needs micro-batches and samples");
  const kernels::ExecScope scope(exec_);
  StepResult r;
  r.iteration = ++iteration_;
  r.global_samples = global_samples;
  comm_.set_step(iteration_);
  model_->set_mode(true, iteration_);  // dropout masks are keyed by the iteration
  observers_.begin_step(iteration_);
  const bool drop_mode = cfg_.precision().on_nonfinite() == DROP_RANK;
  StepState* st = state_->get();  // where the step runs: fields are handed to kernels and collectives as pointers

  state_->begin_step();  // found_inf = 0, sum_sq = 0, the unscale factor 1/S
  if (buffers_) buffers_->begin_step();  // the forward updates the staged copy only
  const int64_t local_samples = forward_backward(micro, global_samples, drop_mode);
  if (drop_mode) {
    drop_nonfinite_ranks(local_samples, global_samples);
    reducer_->begin_backward(true);  // wait() launches every bucket
  }
  observers_.phase_begin(Phase::kCommWait);
  reducer_->wait();  // on the GPU: the compute stream waits for the bucket reductions, the host does not
  observers_.phase_end(Phase::kCommWait);

  // One fused pass over the reduced gradient this rank holds: unscale, find non-finite values, sum squares.
  observers_.phase_begin(Phase::kUnscaleConsensus);
  for (const GradSpan& s : reducer_->owned()) {
    Tensor g = Tensor::view(masters_->grads().data_as<float>() + s.begin, {s.count}, DType::kFloat32, device_);
    kernels::unscale_and_check(g, &st->inv_scale, &st->found_inf, &st->sum_sq);
  }
  consensus_.agree(consensus_fields(), stop_request().load());
  observers_.phase_end(Phase::kUnscaleConsensus);

  observers_.before_update();
  observers_.phase_begin(Phase::kOptimizer);
  if (sharded()) reduce_slice_sums(comm_, *state_, rank_sums_);  // the global norm from every rank's slice
  finish_step(*state_, step_cfg_, static_cast<double>(global_samples));  // gate, lr, clip factor, scaler update
  Tensor grads = masters_->grad_slice();
  // A no-op on a skipped step. Unsharded 16-bit runs round each updated weight into the working copy in the same
  // pass (the next step's cast); a skipped step leaves both as they were, so the copy stays current either way.
  optimizer_->step(masters_->master(), grads, &st->gate, masters_->fused_working_out());
  masters_->mark_working_current();
  // Sharded state all-gathers the updated working copy. Every step, so the host never needs the agreed flag: on a
  // skipped step the optimizer left the master slice as it was, and the gather moves the same working-copy bits.
  if (sharded()) publish(*masters_, comm_);
  // Model buffers: committed on the device only by an applied step (the commit reads the agreed flag there).
  if (buffers_) commit_buffers();
  observers_.phase_end(Phase::kOptimizer);

  StepEnd end;
  end.iteration = iteration_;
  end.comm = &comm_;
  end.agreed_found_inf = [this] { return agreed_found_inf(); };
  observers_.end_step(end);
  r.numerics = std::move(end.numerics);
  if (reads_ == StateReads::kEveryStep || due_->read(iteration_)) read_state(r);
  return r;
}

// The forward and backward of every micro-batch, each parameter's gradient handed to its bucket as soon as it is
// final (DROP_RANK: no bucket is launched before the local check). Returns this rank's samples.
int64_t Trainer::forward_backward(std::span<const MicroBatch> micro, int64_t global_samples, bool drop_mode) {
  StepState* st = state_->get();
  observers_.phase_begin(Phase::kForward);
  masters_->ensure_working();  // a pass only when the last update did not write the working copy (first step, load)
  // Each micro-batch's loss is divided by the global sample count of the step (all micro-batches, all ranks), so
  // neither accumulation nor world size changes the gradient; the scale multiplies it once. A criterion with the
  // state path reads S from the step state and adds its loss there; any other gets float(S / global) from the host
  // (on the GPU a 4-byte read, which waits for the previous step) and returns its loss here.
  float grad_scale = 0.0f;
  if (criterion_->supports_device_step()) {
    criterion_->set_device_step(&st->step_loss, &st->scaler.scale, static_cast<double>(global_samples));
  } else {
    float scale = 0.0f;
    device::read_to_host(&scale, &st->scaler.scale, device_, sizeof scale);
    grad_scale = static_cast<float>(scale / static_cast<double>(global_samples));
  }
  double host_loss = 0.0;
  int64_t local_samples = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    const bool final_micro = k + 1 == micro.size();
    local_samples += micro[k].size();
    reducer_->begin_backward(final_micro && !drop_mode);  // DROP_RANK reduces only after the local check
    if (k > 0) observers_.phase_begin(Phase::kForward);
    const Tensor& x = device_input(micro[k], k);
    host_loss += criterion_->forward(observed_forward(x, k), micro[k].y);  // 0 with the state path
    observers_.phase_end(Phase::kForward);
    observers_.phase_begin(Phase::kBackward);
    grad_ctx_.accumulate = k > 0;
    grad_ctx_.need_input_grad = false;
    // Each parameter's gradient goes to its bucket as soon as it is final; in the last micro-batch the observers see
    // it first (a fault drill writes into it, the numerics report reads it).
    grad_ctx_.on_grad_ready = [this, final_micro](Parameter& p) {
      if (final_micro) observers_.gradient(p, iteration_);
      reducer_->mark_ready(p.index);
    };
    model_->backward(criterion_->backward(grad_scale), grad_ctx_);
    observers_.phase_end(Phase::kBackward);
  }
  criterion_->set_device_step(nullptr, nullptr, 1.0);
  host_loss_since_read_ += host_loss / static_cast<double>(global_samples);
  return local_samples;
}

const Tensor& Trainer::observed_forward(const Tensor& x, size_t micro) {
  if (!observed_) return model_->forward(x);
  // The layers' outputs go to the observers in this training forward only (evaluation forwards are not observed).
  struct Unhook {
    Sequential* seq;
    ~Unhook() { seq->forward_observer = nullptr; }
  } unhook{observed_};
  observed_->forward_observer = [this, micro](size_t i, Module& m, Tensor& y) {
    observers_.layer_output(i, m, y, micro, iteration_);
  };
  return model_->forward(x);
}

const Tensor& Trainer::device_input(const MicroBatch& mb, size_t k) {
  const Tensor& x_host = k == 0 ? observers_.input(mb.x, iteration_) : mb.x;
  if (device_ == Device::kCPU || model_->takes_host_input()) return x_host;
  if (x_dev_.size() <= k) x_dev_.resize(k + 1);
  x_dev_[k].ensure(x_host.shape(), x_host.dtype(), device_);
  x_host.copy_to(x_dev_[k]);
  return x_dev_[k];
}

void Trainer::drop_nonfinite_ranks(int64_t local_samples, int64_t global_samples) {
  StepState* st = state_->get();
  Tensor& g = masters_->grads();
  kernels::check_nonfinite(g, &st->local_bad);
  state_->drop_fill(local_samples);
  // [ranks, samples] dropped, summed: FP32 counts are exact up to 2^24 samples per step (validate_config).
  comm_.allreduce_async(st->drop_counts, 2, DType::kFloat32, ReduceOp::kSum, "non-finite rank count all-reduce")
      ->wait();
  kernels::zero_if(g, &st->local_bad);
  state_->drop_apply(global_samples);
}

ConsensusFields Trainer::consensus_fields() {
  StepState* st = state_->get();
  ConsensusFields f;
  f.found_inf = &st->found_inf;
  f.scale = &st->scaler.scale;
  f.growth_tracker = &st->scaler.growth_tracker;
  f.agreed_found_inf = &st->agreed_found_inf;
  f.agreed_stop = &st->agreed_stop;
  f.disagree = &st->disagree;
  return f;
}

void Trainer::commit_buffers() {
  buffers_->commit_unless(&state_->get()->agreed_found_inf);  // a skipped step commits nothing
  if (comm_.world_size() == 1) return;
  // Rank 0's buffers to every rank (an all-gather to which only rank 0 contributes): with per-rank batch statistics
  // each rank's running statistics differ, and DDP keeps rank 0's. Every step, where the buffers live (on the GPU
  // NCCL over device memory, ordered on the compute stream): after a skipped step the same values travel again.
  std::vector<int64_t> counts(static_cast<size_t>(comm_.world_size()), 0);
  counts[0] = buffers_->numel();
  comm_.allgather_inplace_async(buffers_->values().data(), counts, DType::kFloat32, "model buffers broadcast")->wait();
}

bool Trainer::agreed_found_inf() {
  int32_t v = 0;
  device::read_to_host(&v, &state_->get()->agreed_found_inf, device_, sizeof v);
  return v != 0;
}

}  // namespace ampdist
