// Trainer: one optimizer step of data-parallel mixed-precision training, and evaluation.
//
// step() is DESIGN.md's step, in its order (see trainer.cc). Every rank constructs its Trainer from the same
// config and calls step() the same number of times; the collectives inside are the gradient reduction (buckets)
// and the one consensus all-reduce.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <atomic>

#include "ampdist/checkpoint.pb.h"
#include "ampdist/config.pb.h"
#include "comm/communicator.h"
#include "comm/consensus.h"
#include "comm/reducer.h"
#include "runtime/amp/autocast.h"
#include "runtime/amp/loss_scaler.h"
#include "runtime/amp/master_weights.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/nn/module.h"
#include "runtime/obs/numerics.h"
#include "runtime/obs/phase_timer.h"
#include "runtime/optim/optimizer.h"

namespace ampdist {

struct StepResult {
  int64_t iteration = 0;       // 1-based, counting skipped steps
  bool skipped = false;        // the agreed found_inf: nothing but the scaler changed
  float scale = 1.0f;          // loss scale this step ran with
  float lr = 0.0f;             // learning rate applied (0 when skipped)
  double loss = 0.0;           // this rank's share of the step's mean loss (sum over ranks = the mean)
  double grad_norm = 0.0;      // global L2 norm of the unscaled gradient before clipping (NaN when skipped)
  int64_t global_samples = 0;  // samples in the step over all ranks and micro-batches
  bool stop = false;           // some rank was asked to stop (SIGTERM/SIGUSR1): save and stop after this step
  int dropped_ranks = 0;       // on_nonfinite DROP_RANK: ranks whose non-finite gradient was left out
  int64_t dropped_samples = 0; // and their samples
  // precision.numerics_report_every: the per-layer report of this step, on every rank (null when not due).
  std::shared_ptr<const NumericsReport> numerics;
};

// Set from a signal handler (SIGTERM, SIGUSR1) or a test; read by every step and agreed on by the consensus.
std::atomic<bool>& stop_request();

struct EvalResult {
  int64_t correct = 0, samples = 0;  // summed over ranks, exact
  double loss = 0.0;                 // mean per-sample loss over all ranks
  double accuracy() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
};

class Trainer {
 public:
  // model/criterion: the network and its loss. train/test: datasets (test may be null; train may be null when only
  // the explicit step() is used). The config supplies precision, optimizer, comm, data and seed settings.
  // Throws Error (bad input) for a config that cannot run on this world size.
  Trainer(const RunConfig& cfg, Communicator& comm, std::unique_ptr<Module> model,
          std::unique_ptr<Criterion> criterion, std::shared_ptr<const Dataset> train,
          std::shared_ptr<const Dataset> test);
  ~Trainer();

  // The next step from the training data.
  //
  // On the GPU the step is queued on the compute stream without waiting for it: a skipped step is decided, and the
  // loss scale, learning rate, clip factor and optimizer gate computed, on the device. The host reads the device's
  // state only at steps where the loop needs values (log steps, checkpoint steps, evaluation steps, the last step;
  // see sync_due()); there the StepResult is complete and `loss` is this rank's share of the losses of every step
  // since the previous such read (so a window's sum is unchanged). At other steps loss, lr, grad_norm, skipped and
  // stop are 0/false. A stop request is therefore acted on at the next such step.
  StepResult step();
  // One step on explicitly given micro-batches of this rank (accumulation = micro.size(), which must be the same on
  // every rank); global_samples: samples of the step over all ranks (the loss divisor).
  StepResult step(std::span<const MicroBatch> micro, int64_t global_samples);
  // Accuracy and loss on the whole test set, each rank taking a contiguous slice; counts summed over ranks.
  EvalResult evaluate();

  int64_t iteration() const { return iteration_; }

  // The state a checkpoint saves, as views (run_id: the run's identity, kept across resumes).
  CheckpointState checkpoint_state();
  // Continues from a loaded checkpoint's manifest: iteration, loss scaler, optimizer step count, sampler position.
  // The buffers themselves were filled by load_checkpoint through checkpoint_state(). When the checkpoint's working
  // dtype or loss-scale mode differs from this run's, the saved scaler state is not used: this run's scaler starts
  // afresh (initial scale, empty trackers; the count of skipped steps carries over), and the returned line says so
  // ("precision changed on resume: ..."); otherwise it returns "".
  std::string restore(const Manifest& m);
  const std::string& run_id() const { return run_id_; }
  void set_run_id(const std::string& id) { run_id_ = id; }
  int64_t steps_per_epoch() const;
  int64_t total_steps() const { return total_steps_; }
  int64_t epoch_of(int64_t iteration) const;  // 0-based epoch of a 1-based iteration
  DType working_dtype() const { return masters_->working_dtype(); }
  // Where the step runs: the communicator's device (CPU with MpiCommunicator, the current GPU with
  // NcclCommunicator; see step() for what differs on the GPU).
  Device device() const { return device_; }
  int64_t micro_batch_size() const { return micro_batch_; }

  Module& model() { return *model_; }
  MasterWeights& masters() { return *masters_; }
  LossScaler& scaler() { return scaler_; }
  Optimizer& optimizer() { return *optimizer_; }
  const LrSchedule& schedule() const { return schedule_; }
  Reducer& reducer() { return *reducer_; }
  Consensus& consensus() { return consensus_; }
  Communicator& comm() { return comm_; }
  const RunConfig& config() const { return cfg_; }

  // ---- observability (runtime/obs) ----
  // The step's phase timer (log.phase_timing; null when off). The training loop collects it at log steps and
  // times checkpoint saves with it.
  PhaseTimer* phase_timer() { return timer_.get(); }

 private:
  void on_grad_ready(Parameter& p);
  void apply_faults();
  // DROP_RANK: agrees on which ranks' local gradients are non-finite, zeroes this rank's if so, and returns the
  // factor that turns the sum over the remaining ranks into their mean (0 when no rank is left).
  double drop_nonfinite_ranks(int64_t local_samples, int64_t global_samples, StepResult& r);
  const Tensor& maybe_inject_input(const Tensor& x);
  // CUDA backend.
  StepResult step_device(std::span<const MicroBatch> micro, int64_t global_samples);
  bool sync_due(int64_t iteration) const;
  void read_device_state(StepResult& r);  // device -> host, updates scaler and optimizer step count
  void push_device_state();               // host scaler and optimizer step count -> device

  RunConfig cfg_;
  Communicator& comm_;
  std::unique_ptr<Module> model_;
  std::unique_ptr<Criterion> criterion_;
  std::shared_ptr<const Dataset> train_, test_;
  std::vector<Parameter*> params_;
  std::unique_ptr<MasterWeights> masters_;
  LossScaler scaler_;
  std::unique_ptr<Reducer> reducer_;
  Consensus consensus_;
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule schedule_;
  std::unique_ptr<Loader> loader_;
  std::optional<DistributedSampler> sampler_;
  int64_t micro_batch_ = 0, total_steps_ = 0, iteration_ = 0;
  GradContext grad_ctx_;
  bool final_micro_ = false;
  Tensor injected_x_, eval_x_, eval_x_dev_;
  std::vector<int32_t> eval_y_;
  std::string run_id_;
  Device device_ = Device::kCPU;
  Tensor device_state_;                 // bytes of a DeviceTrainState on the GPU
  DeviceTrainState* dstate_ = nullptr;  // = device_state_.data()
  StepConfig step_cfg_;
  std::vector<Tensor> x_dev_;           // inputs copied to the GPU, per micro-batch
  Tensor host_master_;                  // host copies for checkpoints of GPU runs
  std::vector<Tensor> host_optim_;
  double host_loss_since_read_ = 0.0;   // losses of criteria without a device path, since the last read

  // ---- observability (runtime/obs) ----
  void phase_begin(Phase p) { if (timer_) timer_->begin(p); }
  void phase_end(Phase p) { if (timer_) timer_->end(p); }
  void setup_observers();
  void on_layer_output(size_t index, Module& layer, Tensor& y);
  std::unique_ptr<PhaseTimer> timer_;
  std::unique_ptr<NumericsMonitor> numerics_;
  bool observing_ = false;            // inside a training step's forward (evaluation is not observed)
  bool first_micro_ = false;
  bool reported_first_nonfinite_ = false;
};

// The trainer of a config: its datasets (data {...}), its model (model {...}) with softmax cross-entropy.
std::unique_ptr<Trainer> make_trainer(const RunConfig& cfg, Communicator& comm);

}  // namespace ampdist
