#include "runtime/train/loop.h"

#include <spdlog/fmt/fmt.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <mutex>
#include <sstream>

#include <sys/resource.h>

#include "runtime/checkpoint/async_checkpoint.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/obs/metrics_sink.h"

namespace ampdist {
namespace {

using Clock = std::chrono::steady_clock;

// What the loop is doing, for stop_signal_notice (read by another thread).
struct Activity {
  std::mutex mu;
  bool running = false;
  bool saves = false;   // a stop-save will be written (a checkpoint directory is set)
  int64_t step = 0;     // the step under way (or last finished)
  std::string saving;   // the checkpoint being written, "" when none
  std::string newest;   // the newest complete checkpoint of this run, "" when none
};
Activity& activity() {
  static Activity a;
  return a;
}
template <typename F>
void update_activity(F f) {
  Activity& a = activity();
  std::lock_guard<std::mutex> lock(a.mu);
  f(a);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string stop_signal_notice(const std::string& signal_name) {
  Activity& a = activity();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!a.running) return "";
  const std::string newest =
      "the newest complete checkpoint is " + (a.newest.empty() ? std::string("none (this run has saved none)") : a.newest);
  if (!a.saving.empty())
    return signal_name + " received while writing checkpoint " + a.saving + ": the ranks finish it, then save and stop at the "
           "next step boundary where they agree; if the job is ended before " + a.saving + " is published, " + newest;
  if (!a.saves)
    return signal_name + " received at step " + std::to_string(a.step) +
           ": the ranks stop at the next step boundary where they agree (no checkpoint directory: nothing is saved)";
  return signal_name + " received at step " + std::to_string(a.step) +
         ": the ranks save a checkpoint and stop at the next step boundary where they agree; if the job is ended "
         "before that save is published, " + newest;
}

std::string hex16(uint64_t v) { return fmt::format("{:016x}", v); }

double peak_rss_mb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

namespace {

// Holds the step's update until the asynchronous save in flight has its staging copy (AsyncCheckpointer's
// contract: the state start() was given stays unwritten until wait_staged()), the wait timed as the checkpoint
// phase. A no-op once the loop that owns the checkpointer is gone.
class StagingGate : public StepObserver {
 public:
  StagingGate(std::weak_ptr<AsyncCheckpointer> async, PhaseTimer* timer) : async_(std::move(async)), timer_(timer) {}
  void before_update() override {
    const std::shared_ptr<AsyncCheckpointer> a = async_.lock();
    if (!a || a->staged()) return;
    PhaseScope timed(timer_, Phase::kCheckpoint);
    a->wait_staged();
  }

 private:
  std::weak_ptr<AsyncCheckpointer> async_;
  PhaseTimer* timer_;
};

// run_training's state and its parts: the sinks, the checkpoint saves (blocking or asynchronous), the log windows,
// evaluation, and the end-of-run checks. Every rank runs the same calls in the same order.
class TrainingLoop {
 public:
  TrainingLoop(Trainer& trainer, const LoopOptions& opt)
      : trainer_(trainer), opt_(opt), comm_(trainer.comm()), cfg_(trainer.config()), ck_(cfg_.checkpoint()),
        rank0_(comm_.rank() == 0), timer_(trainer.phase_timer()) {}

  RunSummary run();

 private:
  void open_sinks();
  void published(const std::string& path, int64_t step, double seconds, const std::vector<std::string>& warnings);
  void save_failed(int64_t step, const Error& e);
  void finish_async_untimed(bool wait);
  void finish_async(bool wait);
  void save(int64_t step, bool durable);
  void evaluate(int64_t step);
  // A log step: the window's loss over ranks (and rank 0's clock verdict for checkpoint.every_minutes, which it
  // returns), the phase times, one train record.
  bool log(int64_t step, int64_t total, const StepResult& r);
  void train_steps(int64_t first, int64_t total);
  void check_ranks_agree();

  Trainer& trainer_;
  const LoopOptions& opt_;
  Communicator& comm_;
  const RunConfig& cfg_;
  const CheckpointConfig& ck_;
  const bool rank0_;
  PhaseTimer* timer_;
  MetricsSinks sinks_;  // rank 0 only
  RunSummary s_;
  Clock::time_point last_save_ = Clock::now();
  // checkpoint.async: saves written by a background thread and published at a later step boundary.
  std::shared_ptr<AsyncCheckpointer> async_;
  double window_loss_ = 0.0, window_train_s_ = 0.0;
  int64_t window_steps_ = 0, window_samples_ = 0, samples_ = 0, saved_at_ = -1;
};

void TrainingLoop::open_sinks() {
  if (rank0_ && cfg_.log().metrics_jsonl() && !opt_.run_dir.empty()) {
    std::filesystem::create_directories(opt_.run_dir);
    sinks_.add(std::make_unique<JsonlSink>(opt_.run_dir + "/metrics.jsonl"));
  }
  if (rank0_ && cfg_.log().tensorboard() && !opt_.run_dir.empty())
    sinks_.add(std::make_unique<TensorBoardSink>(opt_.run_dir));
  if (rank0_ && opt_.out) sinks_.add(std::make_unique<ConsoleSink>(*opt_.out, opt_.tty));
  StartRecord start;
  start.name = cfg_.name();
  start.dtype = dtype_name(trainer_.working_dtype());
  start.world_size = comm_.world_size();
  start.global_batch_size = cfg_.data().global_batch_size();
  start.total_steps = trainer_.total_steps();
  start.parameters = trainer_.masters().numel();
  start.resumed_step = trainer_.iteration();
  start.scale = trainer_.scaler().scale();
  start.resume_note = opt_.resume_note;
  sinks_.start(start);
}

void TrainingLoop::published(const std::string& path, int64_t step, double seconds,
                             const std::vector<std::string>& warnings) {
  s_.last_checkpoint = path;
  update_activity([&](Activity& a) {
    a.saving.clear();
    a.newest = path;
  });
  for (const std::string& w : warnings) sinks_.message("warning: " + w);
  last_save_ = Clock::now();
  sinks_.checkpoint(CheckpointRecord{step, path, seconds});
}

// A failed save: every rank gets the same verdict (the commit is collective), so every rank continues or stops.
// Called inside a catch handler: STOP rethrows the error being handled.
void TrainingLoop::save_failed(int64_t step, const Error& e) {
  update_activity([](Activity& a) { a.saving.clear(); });
  ++s_.failed_saves;
  sinks_.checkpoint_error(step, e.what(), ck_.on_save_error() != STOP);
  if (ck_.on_save_error() == STOP) throw;
}

// Collective. The asynchronous save in flight: published once every rank has written its shard (at every step
// boundary), or now, waiting for the writes (`wait`: before the run ends). Untimed: the caller holds the checkpoint
// phase (phases do not nest).
void TrainingLoop::finish_async_untimed(bool wait) {
  if (!async_ || !async_->in_flight()) return;
  const int64_t step = async_->in_flight_step();
  try {
    if (std::optional<AsyncCheckpointer::Published> p = wait ? async_->drain() : async_->poll())
      published(p->path, p->step, p->seconds, p->warnings);
  } catch (const Error& e) {
    save_failed(step, e);
  }
}

void TrainingLoop::finish_async(bool wait) {
  if (!async_ || !async_->in_flight()) return;
  PhaseScope timed(timer_, Phase::kCheckpoint);  // the progress all-reduce, and the commit when it is due
  finish_async_untimed(wait);
}

// Collective. `durable`: the checkpoint must be published before this returns (the stop-save, the final save).
void TrainingLoop::save(int64_t step, bool durable) {
  if (opt_.checkpoint_dir.empty()) return;
  const Clock::time_point t0 = Clock::now();
  PhaseScope timed(timer_, Phase::kCheckpoint);
  if (async_) {
    // The save in flight first (a failure there is its own, handled like any failed save), then this one.
    if (async_->in_flight()) {
      const bool writing = !async_->write_done();
      const int64_t previous = async_->in_flight_step();
      const Clock::time_point tw = Clock::now();
      finish_async_untimed(/*wait=*/true);
      if (writing)
        sinks_.message(fmt::format("warning: step {} waited {:.2f} s for the checkpoint of step {} to be written "
                                   "(the saves come faster than the disk takes them)",
                                   step, seconds_since(tw), previous));
    }
    try {
      async_->start(trainer_.checkpoint_state(/*device_buffers=*/true));
      update_activity([&](Activity& a) { a.saving = async_->in_flight_path(); });
      if (durable)
        if (std::optional<AsyncCheckpointer::Published> p = async_->drain())
          published(p->path, p->step, p->seconds, p->warnings);
    } catch (const Error& e) {
      save_failed(step, e);
    }
    return;
  }
  std::vector<std::string> warnings;
  update_activity(
      [&](Activity& a) { a.saving = (std::filesystem::path(opt_.checkpoint_dir) / checkpoint_name(step)).string(); });
  try {
    const std::string path = save_checkpoint(comm_, trainer_.checkpoint_state(), opt_.checkpoint_dir, ck_.keep_last(),
                                             &cfg_.fault(), &warnings);
    published(path, step, seconds_since(t0), warnings);
  } catch (const Error& e) {
    save_failed(step, e);
  }
}

void TrainingLoop::evaluate(int64_t step) {
  const EvalResult e = trainer_.evaluate();
  s_.test_accuracy = e.accuracy();
  s_.test_loss = e.loss;
  s_.test_correct = e.correct;
  s_.test_samples = e.samples;
  // Epochs are 1-based as on the console: an evaluation after the last step of epoch 3 reports epoch 3.
  sinks_.eval(EvalRecord{step, trainer_.epoch_of(std::max<int64_t>(step, 1)) + 1, e.accuracy(), e.loss, e.correct,
                         e.samples, s_.language_model});
}

bool TrainingLoop::log(int64_t step, int64_t total, const StepResult& r) {
  // The only collective beyond the step's own: the window's loss summed over ranks, once per log line; it also
  // carries rank 0's clock verdict for checkpoint.every_minutes, so every rank saves at the same step.
  const bool minutes_due = rank0_ && ck_.every_minutes() > 0 &&
                           seconds_since(last_save_) >= 60.0 * static_cast<double>(ck_.every_minutes());
  double l[2] = {window_loss_, minutes_due ? 1.0 : 0.0};
  comm_.allreduce_f64(l, ReduceOp::kSum, "log loss all-reduce");
  const double mean_loss = l[0] / static_cast<double>(window_steps_);
  s_.final_loss = mean_loss;
  PhaseTimes pt;
  if (timer_) {
    pt = timer_->collect();
    for (size_t i = 0; i < pt.seconds.size(); ++i) s_.phases.seconds[i] += pt.seconds[i];
    s_.phases.steps += pt.steps;
  }
  const LossScaler scaler = trainer_.scaler();
  TrainRecord t;
  t.step = step;
  t.total_steps = total;
  t.epoch = trainer_.epoch_of(step) + 1;
  t.loss = mean_loss;
  t.lr = r.lr;
  t.scale = scaler.scale();
  t.grad_norm = r.grad_norm;
  t.skipped_steps = scaler.state().skipped_steps;
  t.dropped_rank_steps = s_.dropped_contributions;
  t.samples_per_s = window_samples_ / std::max(window_train_s_, 1e-9);
  t.time_s = s_.train_seconds;
  t.peak_rss_mb = peak_rss_mb();
  t.phases = timer_ ? &pt : nullptr;
  sinks_.train(t);
  window_loss_ = 0.0;
  window_steps_ = window_samples_ = 0;
  window_train_s_ = 0.0;
  return l[1] > 0.0;
}

void TrainingLoop::train_steps(int64_t first, int64_t total) {
  const DueSteps& due = trainer_.due();
  for (int64_t step = first; step <= total; ++step) {
    update_activity([&](Activity& a) { a.step = step; });
    const Clock::time_point t0 = Clock::now();
    const StepResult r = trainer_.step();
    const double dt = seconds_since(t0);
    s_.train_seconds += dt;
    window_train_s_ += dt;
    window_steps_ += 1;
    window_samples_ += r.global_samples;
    samples_ += r.global_samples;
    s_.steps = step;
    if (r.numerics) sinks_.numerics(*r.numerics);
    // Values of the step state arrive only at read steps (every step this loop acts on is one: DueSteps::read).
    window_loss_ += r.loss;
    s_.dropped_contributions += r.dropped_ranks;
    bool save_due = due.checkpoint(step);
    if (due.log(step)) save_due |= log(step, total, r);
    if (save_due || r.stop) {
      save(step, /*durable=*/r.stop);
      saved_at_ = step;
    } else {
      finish_async(/*wait=*/false);
    }
    if (r.stop) {
      sinks_.message(fmt::format("stopping at step {}: a rank was asked to stop (SIGTERM/SIGUSR1)", step));
      s_.stopped = true;
      return;
    }
    if (due.eval(step)) evaluate(step);
  }
}

// Every rank must hold the same replicated state: the master weights, or with sharded master weights the working
// copy (the all-gathered result of every slice).
void TrainingLoop::check_ranks_agree() {
  const bool sharded = trainer_.sharded();
  const std::vector<uint64_t> hashes =
      comm_.allgather_u64(sharded ? trainer_.with_buffers_hash(trainer_.masters().working_hash()) : s_.master_hash,
                          "master weights hash gather");
  for (size_t r = 0; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0])
      throw Error(std::string(sharded ? "working copies" : "master weights") + " differ across ranks: rank 0 has " +
                  hex16(hashes[0]) + ", rank " + std::to_string(r) + " has " + hex16(hashes[r]))
          .set_collective();
  }
}

RunSummary TrainingLoop::run() {
  open_sinks();
  s_.language_model = cfg_.model().has_gpt();
  s_.phase_timing = timer_ != nullptr;
  if (ck_.async() && !opt_.checkpoint_dir.empty()) {
    async_ = std::make_shared<AsyncCheckpointer>(comm_, opt_.checkpoint_dir, ck_.keep_last(), &cfg_.fault());
    trainer_.add_observer(std::make_unique<StagingGate>(async_, timer_));
  }
  const int64_t total = trainer_.total_steps();
  const int64_t first = trainer_.iteration() + 1;
  update_activity([&](Activity& a) {
    a.running = true;
    a.saves = !opt_.checkpoint_dir.empty();
    a.step = first;
    a.saving.clear();
    a.newest = opt_.resumed_checkpoint;
  });
  // Not running once this returns or throws.
  struct Finished {
    ~Finished() { update_activity([](Activity& a) { a.running = false; }); }
  } finished;
  if (first > total && trainer_.iteration() == 0)  // steps 0 and epochs 0, and no checkpoint ahead of that
    sinks_.message(std::string("train.steps and train.epochs are 0: nothing to train; evaluating the ") +
                   (cfg_.model().init_from().empty() ? "initial weights" : "weights of model.init_from"));
  else if (first > total)
    sinks_.message(fmt::format("warning: the checkpoint is at step {} and this run ends at step {} ({}): nothing to "
                               "train; evaluating the checkpoint's weights",
                               trainer_.iteration(), total,
                               cfg_.train().steps() > 0 ? "train.steps" : "train.epochs x steps per epoch"));
  try {
    train_steps(first, total);
    if (!s_.stopped) {
      evaluate(std::max(total, trainer_.iteration()));  // labelled with the weights' real step
      // A run of no steps (train.steps and train.epochs 0: the initial weights, e.g. model.init_from's, evaluated) also
      // saves them, as step 0, so that they can be exported.
      if (ck_.save_final() && saved_at_ != total && (s_.steps > 0 || (total == 0 && first == 1))) save(total, true);
    }
    finish_async(/*wait=*/true);  // the last periodic save, when no final one followed it
  } catch (const Error& e) {
    // Every rank stopped at the same agreed point (a scaler limit, a failed save under STOP): the save in flight is
    // finished and published first, so the newest checkpoint is as new as it can be. Otherwise the job is being
    // taken down and the save stays unpublished (a .tmp_step_* directory).
    if (e.collective() && async_ && async_->in_flight()) {
      try {
        if (std::optional<AsyncCheckpointer::Published> p = async_->drain())
          published(p->path, p->step, p->seconds, p->warnings);
      } catch (const Error&) {
      }
    }
    throw;
  }
  const LossScaler scaler = trainer_.scaler();
  s_.skipped_steps = scaler.state().skipped_steps;
  s_.final_scale = scaler.scale();
  s_.samples_per_s = s_.train_seconds > 0 ? static_cast<double>(samples_) / s_.train_seconds : 0.0;
  s_.master_hash = trainer_.master_hash();  // collective when the master weights are sharded
  s_.peak_rss_mb = peak_rss_mb();
  if (timer_) {  // checkpoint saves after the last log step
    const PhaseTimes pt = timer_->collect();
    for (size_t i = 0; i < pt.seconds.size(); ++i) s_.phases.seconds[i] += pt.seconds[i];
  }
  check_ranks_agree();
  sinks_.summary(s_);
  return s_;
}

}  // namespace

RunSummary run_training(Trainer& trainer, const LoopOptions& opt) {
  // The host reads the step state only at the steps this loop acts on (on both backends).
  trainer.set_state_reads(StateReads::kDueSteps);
  return TrainingLoop(trainer, opt).run();
}

}  // namespace ampdist
