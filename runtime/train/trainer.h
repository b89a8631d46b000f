// Trainer: one optimizer step of data-parallel mixed-precision training, evaluation, and the state a checkpoint
// holds.
//
// step() is DESIGN.md's step, in its order, for both backends (train/step.cc): every decision of the step (skip,
// clip factor, learning rate, loss-scale update) is made where the step runs, in a StepState on the communicator's
// device (runtime/amp/step_state.h), and the host reads that state back only when it needs values. Every rank
// constructs its Trainer from the same config and calls step() the same number of times; the collectives inside
// are the gradient reduction (buckets) and the one consensus all-reduce (plus DROP_RANK's count all-reduce).
//
// Files: trainer.cc (construction, evaluate()), step.cc (the step), evaluate.h (the Evaluator), train_state.cc
// (reading the step state, the run's fields of a checkpoint), checkpoint_binding.h (the tensors a checkpoint holds),
// observers.cc and step_observer.h (the step's observers: phase timing, fault drills, the numerics report), faults.h
// (the drills), due_steps.h (when the loop logs, saves, evaluates and reads), model_factory.cc (make_trainer).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ampdist/checkpoint.pb.h"
#include "ampdist/config.pb.h"
#include "comm/communicator.h"
#include "runtime/dist/consensus.h"
#include "runtime/dist/reducer.h"
#include "runtime/dist/shard_plan.h"
#include "runtime/amp/autocast.h"
#include "runtime/amp/loss_scaler.h"
#include "runtime/amp/master_weights.h"
#include "runtime/amp/step_state_buffer.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/kernels/exec_context.h"
#include "runtime/nn/module.h"
#include "runtime/obs/numerics.h"
#include "runtime/obs/phase_timer.h"
#include "runtime/optim/optimizer.h"
#include "runtime/optim/step_gate.h"
#include "runtime/train/checkpoint_binding.h"
#include "runtime/train/due_steps.h"
#include "runtime/train/evaluate.h"
#include "runtime/train/faults.h"
#include "runtime/train/memory_estimate.h"
#include "runtime/train/step_observer.h"

namespace ampdist {

struct StepResult {
  int64_t iteration = 0;       // 1-based, counting skipped steps
  // Whether the host read the step state after this step (StateReads): only then are the fields below filled in;
  // otherwise they are 0/false/NaN-free defaults and the values carry over to the next read.
  bool read = false;
  bool skipped = false;        // the agreed found_inf: nothing but the scaler changed
  float scale = 1.0f;          // loss scale this step ran with
  float lr = 0.0f;             // learning rate applied (0 when skipped)
  // This rank's share of the mean loss of every step since the previous read (sum over ranks = the sum of those
  // steps' mean losses; one step's mean loss when every step is read).
  double loss = 0.0;
  double grad_norm = 0.0;      // global L2 norm of the unscaled gradient before clipping (NaN when skipped)
  int64_t global_samples = 0;  // samples in this step over all ranks and micro-batches (always filled in)
  bool stop = false;           // some rank was asked to stop (SIGTERM/SIGUSR1): save and stop after this step
  int dropped_ranks = 0;       // on_nonfinite DROP_RANK: ranks whose non-finite gradient was left out (since the
  int64_t dropped_samples = 0; // previous read), and their samples
  // precision.numerics_report_every: the per-layer report of this step, on every rank (null when not due).
  std::shared_ptr<const NumericsReport> numerics;
};

// When the host reads the step state back (StepResult::read). kEveryStep, the default, suits host-side loops and
// tests that look at every step's result. kDueSteps reads only at the steps DueSteps::read names (log, checkpoint,
// evaluation, epoch end, last step): the training loop's setting on both backends, so the CPU runs the GPU's
// timing of decisions. A stop request or a scaler limit then takes effect at the next read.
enum class StateReads { kEveryStep, kDueSteps };

// Set from a signal handler (SIGTERM, SIGUSR1) or a test; read by every step and agreed on by the consensus.
std::atomic<bool>& stop_request();

class Trainer {
 public:
  // autocast: the policy the model was built with (make_autocast); its working dtype is the run's. model/criterion:
  // the network and its loss. train/test: datasets (test may be null; train may be null when only the explicit
  // step() is used). The config supplies precision, optimizer, comm, data and seed settings.
  // Throws Error (bad input) for a config that cannot run on this world size.
  Trainer(const RunConfig& cfg, Communicator& comm, const Autocast& autocast, std::unique_ptr<Module> model,
          std::unique_ptr<Criterion> criterion, std::shared_ptr<const Dataset> train,
          std::shared_ptr<const Dataset> test);
  ~Trainer();

  // The next step from the training data.
  StepResult step();
  // One step on explicitly given micro-batches of this rank (accumulation = micro.size(), which must be the same on
  // every rank); global_samples: samples of the step over all ranks (the loss divisor).
  StepResult step(std::span<const MicroBatch> micro, int64_t global_samples);
  // Accuracy and loss on the whole test set, each rank taking a contiguous slice; counts summed over ranks.
  EvalResult evaluate();

  void set_state_reads(StateReads r) { reads_ = r; }
  // Reads the step state now (on the GPU: waits for the queued steps): the values since the previous read.
  StepResult read_now();
  int64_t iteration() const { return iteration_; }
  // The step state where it lives (device memory on the GPU); for tests and tools that look without reading.
  const StepStateBuffer& step_state() const { return *state_; }

  // The state a checkpoint saves, as views (run_id: the run's identity, kept across resumes): the run's fields here,
  // the tensors from the CheckpointBinding (train/checkpoint_binding.h). Reads the step state; collective when
  // sharded (the master weights hash). On the GPU the buffers are host copies of the device state (for
  // save_checkpoint and load_checkpoint), or with `device_buffers` the device tensors themselves (for
  // AsyncCheckpointer, which copies only its shard, to page-locked staging).
  CheckpointState checkpoint_state(bool device_buffers = false);
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
  // The CPU kernels' threads for this rank (train.threads_per_rank, or its default).
  int threads() const { return exec_.threads; }
  int64_t epoch_of(int64_t iteration) const;  // 0-based epoch of a 1-based iteration
  DType working_dtype() const { return masters_->working_dtype(); }
  // Where the step runs: the communicator's device (CPU with MpiCommunicator, the current GPU with NcclCommunicator).
  Device device() const { return device_; }
  int64_t micro_batch_size() const { return micro_batch_; }
  const DueSteps& due() const { return *due_; }

  // The run's shard plan (runtime/dist/shard_plan.h), decided once from optimizer.zero_stage. Sharded (stage 1): each
  // rank holds only its slice of the master weights and the optimizer moments (masters().master(), the optimizer's
  // state), and the working copy is all-gathered after every applied step.
  const ShardPlan& shard_plan() const { return plan_; }
  bool sharded() const { return plan_.sharded(); }
  // XXH3-64 of the whole FP32 master buffer, the same on every rank. Collective when sharded (each rank's slice is
  // broadcast in chunks and hashed in order, so the result equals the hash of a replicated run's buffer).
  uint64_t master_hash();
  // The whole FP32 master buffer on the host (collective when sharded; for tests and tools).
  std::vector<float> gather_master();
  // The model's buffers (BatchNorm running statistics), FP32 on the host, the same on every rank; null when the
  // model has none. They are committed only by applied steps and then broadcast from rank 0 (DDP's
  // broadcast_buffers), saved in the checkpoint's manifest, and folded into master_hash().
  ModelBuffers* buffers() { return buffers_.get(); }
  // `seed` when the model has no buffers, else XXH3-64 of the buffers' bytes seeded with it: master_hash() and the
  // end-of-run cross-rank check fold the buffers in this way.
  uint64_t with_buffers_hash(uint64_t seed) const;

  Module& model() { return *model_; }
  MasterWeights& masters() { return *masters_; }
  // The loss scaler as of the last read of the step state: this run's policy (mode, rule) with the state the step
  // left. A value: the one copy of the scaler state is the step state's, and the host's is the snapshot of a read.
  LossScaler scaler() const;
  // Applied optimizer updates (AdamW's t) as of the last read, from the same snapshot. The optimizer's own
  // step_count() counts only its host-driven steps.
  int64_t optimizer_steps() const { return snapshot_.optimizer_steps; }
  Optimizer& optimizer() { return *optimizer_; }
  Reducer& reducer() { return *reducer_; }
  Consensus& consensus() { return consensus_; }
  Communicator& comm() { return comm_; }
  const RunConfig& config() const { return cfg_; }

  // The step's phase timer (log.phase_timing; null when off): host clocks on the CPU, CUDA events on the GPU. The
  // training loop collects it at log steps and times checkpoint saves with it.
  PhaseTimer* phase_timer() { return timer_; }
  // Adds an observer of the step (step_observer.h) after the trainer's own (phase timing, fault drills, numerics
  // report); the training loop's asynchronous checkpoint waits for its staging copy at before_update().
  void add_observer(std::unique_ptr<StepObserver> o) { observers_.add(std::move(o)); }

 private:
  // ---- step.cc
  // The micro-batches' forwards and backwards, gradients handed to the buckets; returns this rank's samples.
  int64_t forward_backward(std::span<const MicroBatch> micro, int64_t global_samples, bool drop_mode);
  // The model's training forward of micro-batch `micro`, its layers' outputs shown to the observers.
  const Tensor& observed_forward(const Tensor& x, size_t micro);
  // The input of micro-batch k on the step's device (the host tensor when the model reads its input there).
  const Tensor& device_input(const MicroBatch& mb, size_t k);
  // DROP_RANK: the ranks whose own gradient is non-finite contribute zeros; the unscale factor corrects the mean.
  void drop_nonfinite_ranks(int64_t local_samples, int64_t global_samples);
  ConsensusFields consensus_fields();
  // The agreed skip flag of the step just decided, on the host (a 4-byte read: the modes that need it every step).
  bool agreed_found_inf();
  // An applied step: the staged buffers become the committed ones, then rank 0's are broadcast.
  void commit_buffers();
  // Calls fn(values, count) for the whole master buffer in order, in chunks (collective when sharded).
  template <typename F> void for_each_master_chunk(F&& fn);
  // ---- train_state.cc
  void read_state(StepResult& r);  // the step state -> snapshot_ and the result fields; throws on a status
  void write_state();              // snapshot_'s scaler state and step counts -> the step state (set-up, restore)
  // ---- observers.cc
  void setup_observers();

  RunConfig cfg_;
  Communicator& comm_;
  Device device_ = Device::kCPU;
  std::unique_ptr<Module> model_;
  std::unique_ptr<Criterion> criterion_;
  std::shared_ptr<const Dataset> train_, test_;
  std::vector<Parameter*> params_;
  std::vector<Buffer*> buffer_list_;
  std::unique_ptr<ModelBuffers> buffers_;
  ShardPlan plan_;
  std::unique_ptr<MasterWeights> masters_;
  LossScaler scaler_policy_;  // mode and rule; its state is the run's initial one, never updated
  std::unique_ptr<Reducer> reducer_;
  Consensus consensus_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<StepStateBuffer> state_;
  StepState snapshot_;  // the host's copy of *state_ as of the last read or write
  StepConfig step_cfg_;
  std::unique_ptr<Loader> loader_;
  std::optional<DistributedSampler> sampler_;
  std::unique_ptr<DueSteps> due_;
  StateReads reads_ = StateReads::kEveryStep;
  int64_t micro_batch_ = 0, total_steps_ = 0, iteration_ = 0;
  // How this trainer's kernels execute (threads; allow_tf32 on the GPU): every public method that runs kernels opens
  // a kernels::ExecScope of it, so nothing of it is a process-wide setting.
  kernels::ExecContext exec_;
  GradContext grad_ctx_;
  double host_loss_since_read_ = 0.0;  // losses of criteria without the state path, since the last read
  std::vector<Tensor> x_dev_;          // inputs copied to the GPU, per micro-batch
  std::unique_ptr<Evaluator> evaluator_;  // null without a test set
  std::unique_ptr<CheckpointBinding> checkpoint_;  // the tensors a checkpoint holds
  Tensor rank_sums_;   // sharded: every rank's sum of squares (a double as 4 x 16 bits each), on the step's device
  std::string run_id_;

  // ---- the step's observers (train/step_observer.h): phase timing, fault drills, the numerics report
  StepObservers observers_;
  PhaseTimer* timer_ = nullptr;    // the phase timing observer's timer (null when log.phase_timing is off)
  Sequential* observed_ = nullptr;  // the model, when its layers' outputs are observed
};

// What a config describes, built but not allocated: its datasets (data {...}), its model (model {...}; parameters
// not yet bound) with its loss, and the working dtype (train/model_factory.cc).
struct ModelParts {
  explicit ModelParts(Autocast a) : autocast(std::move(a)) {}
  Autocast autocast;  // make_autocast: the working dtype, decided once for the run
  std::unique_ptr<Module> model;
  std::unique_ptr<Criterion> criterion;
  std::shared_ptr<const Dataset> train, test;
  // The memory this model needs per rank on `world_size` ranks (runtime/train/memory_estimate.h).
  MemoryEstimate estimate(const RunConfig& cfg, int world_size) const;
};
ModelParts build_model_parts(const RunConfig& cfg, Communicator& comm);

// The run's autocast policy: the working dtype decided once for `device` (precision.dtype; AUTO takes bf16 where the
// device computes in it, runtime/train/config.h's resolve_dtype) with the config's FP32 layers and ops. The model
// is built with it and the Trainer given it, so both run in the one dtype it names.
Autocast make_autocast(const RunConfig& cfg, Device device);

// The trainer of a config: build_model_parts, then (check_memory_fits: bad input, exit 2, before anything of the
// model's size is allocated) a run that cannot fit in the memory this rank may use is refused.
std::unique_ptr<Trainer> make_trainer(const RunConfig& cfg, Communicator& comm);

// The step's constants from the config (optimizer, schedule, clipping) and the loss scaler's rule: what finish_step
// reads every step. total_steps: the run's length, the cosine schedule's end unless schedule.total_steps sets it.
StepConfig make_step_config(const RunConfig& cfg, int64_t total_steps, const ScalerRule& scaler);

// optimizer.no_decay as element ranges of this rank's master slice (the whole flat space unsharded): the tensors
// whose name matches a pattern (fnmatch(3)), intersected with the slice, adjacent ones merged. Throws ConfigInput
// naming a pattern that matches no tensor.
std::vector<std::pair<int64_t, int64_t>> no_decay_ranges(const OptimizerConfig& cfg, const MasterWeights& masters);

// model.init_from checked against the model cfg describes (a gpt model; nothing for others, whose layout depends on
// the data), without reading any weight: every rank runs it in its set-up, before any collective, and refuses a bad
// source alike (runtime/checkpoint/pretrained.h lists the checks). Throws BadInput naming the file and tensor.
void check_init_from(const RunConfig& cfg);

}  // namespace ampdist
