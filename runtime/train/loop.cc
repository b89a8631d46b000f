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

RunSummary run_training(Trainer& trainer, const LoopOptions& opt) {
  // The host reads the step state only at the steps this loop acts on (on both backends).
  trainer.set_state_reads(StateReads::kDueSteps);
  Communicator& comm = trainer.comm();
  const RunConfig& cfg = trainer.config();
  const DueSteps& due = trainer.due();
  const bool rank0 = comm.rank() == 0;
  const bool language_model = cfg.model().has_gpt();
  MetricsSinks sinks;  // rank 0 only
  if (rank0 && cfg.log().metrics_jsonl() && !opt.run_dir.empty()) {
    std::filesystem::create_directories(opt.run_dir);
    sinks.add(std::make_unique<JsonlSink>(opt.run_dir + "/metrics.jsonl"));
  }
  if (rank0 && cfg.log().tensorboard() && !opt.run_dir.empty())
    sinks.add(std::make_unique<TensorBoardSink>(opt.run_dir));
  if (rank0 && opt.out) sinks.add(std::make_unique<ConsoleSink>(*opt.out, opt.tty));
  StartRecord start;
  start.name = cfg.name();
  start.dtype = dtype_name(trainer.working_dtype());
  start.world_size = comm.world_size();
  start.global_batch_size = cfg.data().global_batch_size();
  start.total_steps = trainer.total_steps();
  start.parameters = trainer.masters().numel();
  start.resumed_step = trainer.iteration();
  start.scale = trainer.scaler().scale();
  start.resume_note = opt.resume_note;
  sinks.start(start);
  PhaseTimer* timer = trainer.phase_timer();

  RunSummary s;
  s.language_model = language_model;
  s.phase_timing = timer != nullptr;
  const CheckpointConfig& ck = cfg.checkpoint();
  const Clock::time_point run_start = Clock::now();
  Clock::time_point last_save = run_start;
  // checkpoint.async: saves written by a background thread and published at a later step boundary.
  std::unique_ptr<AsyncCheckpointer> async;
  if (ck.async() && !opt.checkpoint_dir.empty())
    async = std::make_unique<AsyncCheckpointer>(comm, opt.checkpoint_dir, ck.keep_last(), &cfg.fault());
  auto published = [&](const std::string& path, int64_t step, double seconds, const std::vector<std::string>& warnings) {
    s.last_checkpoint = path;
    update_activity([&](Activity& a) {
      a.saving.clear();
      a.newest = path;
    });
    for (const std::string& w : warnings) sinks.message("warning: " + w);
    last_save = Clock::now();
    sinks.checkpoint(CheckpointRecord{step, path, seconds});
  };
  // A failed save: every rank gets the same verdict (the commit is collective), so every rank continues or stops.
  auto save_failed = [&](int64_t step, const Error& e) {
    update_activity([](Activity& a) { a.saving.clear(); });
    ++s.failed_saves;
    sinks.checkpoint_error(step, e.what(), ck.on_save_error() != STOP);
    if (ck.on_save_error() == STOP) throw;
  };
  // Collective. The asynchronous save in flight: published once every rank has written its shard (at every step
  // boundary), or now, waiting for the writes (`wait`: before the run ends).
  // Untimed: the caller holds the checkpoint phase (phases do not nest).
  auto finish_async_untimed = [&](bool wait) {
    if (!async || !async->in_flight()) return;
    const int64_t step = async->in_flight_step();
    try {
      if (std::optional<AsyncCheckpointer::Published> p = wait ? async->drain() : async->poll())
        published(p->path, p->step, p->seconds, p->warnings);
    } catch (const Error& e) {
      save_failed(step, e);
    }
  };
  auto finish_async = [&](bool wait) {
    if (!async || !async->in_flight()) return;
    PhaseScope timed(timer, Phase::kCheckpoint);  // the progress all-reduce, and the commit when it is due
    finish_async_untimed(wait);
  };
  // Collective. `durable`: the checkpoint must be published before this returns (the stop-save, the final save).
  auto save = [&](int64_t step, bool durable) {
    if (opt.checkpoint_dir.empty()) return;
    const Clock::time_point t0 = Clock::now();
    PhaseScope timed(timer, Phase::kCheckpoint);
    if (async) {
      // The save in flight first (a failure there is its own, handled like any failed save), then this one.
      if (async->in_flight()) {
        const bool writing = !async->write_done();
        const int64_t previous = async->in_flight_step();
        const Clock::time_point tw = Clock::now();
        finish_async_untimed(/*wait=*/true);
        if (writing)
          sinks.message(fmt::format("warning: step {} waited {:.2f} s for the checkpoint of step {} to be written "
                                    "(the saves come faster than the disk takes them)",
                                    step, seconds_since(tw), previous));
      }
      try {
        async->start(trainer.checkpoint_state(/*device_buffers=*/true));
        update_activity([&](Activity& a) { a.saving = async->in_flight_path(); });
        if (durable)
          if (std::optional<AsyncCheckpointer::Published> p = async->drain())
            published(p->path, p->step, p->seconds, p->warnings);
      } catch (const Error& e) {
        save_failed(step, e);
      }
      return;
    }
    std::vector<std::string> warnings;
    update_activity(
        [&](Activity& a) { a.saving = (std::filesystem::path(opt.checkpoint_dir) / checkpoint_name(step)).string(); });
    try {
      const std::string path = save_checkpoint(comm, trainer.checkpoint_state(), opt.checkpoint_dir, ck.keep_last(),
                                               &cfg.fault(), &warnings);
      published(path, step, seconds_since(t0), warnings);
    } catch (const Error& e) {
      save_failed(step, e);
    }
  };
  const int64_t total = trainer.total_steps();
  double window_loss = 0.0;
  int64_t window_steps = 0, window_samples = 0;
  double window_train_s = 0.0;
  int64_t samples = 0;

  auto evaluate = [&](int64_t step) {
    const EvalResult e = trainer.evaluate();
    s.test_accuracy = e.accuracy();
    s.test_loss = e.loss;
    s.test_correct = e.correct;
    s.test_samples = e.samples;
    // Epochs are 1-based as on the console: an evaluation after the last step of epoch 3 reports epoch 3.
    sinks.eval(EvalRecord{step, trainer.epoch_of(std::max<int64_t>(step, 1)) + 1, e.accuracy(), e.loss, e.correct,
                          e.samples, language_model});
  };

  int64_t saved_at = -1;
  const int64_t first = trainer.iteration() + 1;
  update_activity([&](Activity& a) {
    a.running = true;
    a.saves = !opt.checkpoint_dir.empty();
    a.step = first;
    a.saving.clear();
    a.newest = opt.resumed_checkpoint;
  });
  // Not running once this returns or throws.
  struct Finished {
    ~Finished() { update_activity([](Activity& a) { a.running = false; }); }
  } finished;
  if (first > total && trainer.iteration() == 0)  // steps 0 and epochs 0, and no checkpoint ahead of that
    sinks.message(std::string("train.steps and train.epochs are 0: nothing to train; evaluating the ") +
                  (cfg.model().init_from().empty() ? "initial weights" : "weights of model.init_from"));
  else if (first > total)
    sinks.message(fmt::format("warning: the checkpoint is at step {} and this run ends at step {} ({}): nothing to "
                              "train; evaluating the checkpoint's weights",
                              trainer.iteration(), total,
                              cfg.train().steps() > 0 ? "train.steps" : "train.epochs x steps per epoch"));
  try {
    for (int64_t step = first; step <= total; ++step) {
      update_activity([&](Activity& a) { a.step = step; });
      const Clock::time_point t0 = Clock::now();
      const StepResult r = trainer.step();
      const double dt = seconds_since(t0);
      s.train_seconds += dt;
      window_train_s += dt;
      window_steps += 1;
      window_samples += r.global_samples;
      samples += r.global_samples;
      s.steps = step;
      if (r.numerics) sinks.numerics(*r.numerics);
      // Values of the step state arrive only at read steps (every step this loop acts on is one: DueSteps::read).
      window_loss += r.loss;
      s.dropped_contributions += r.dropped_ranks;

      bool save_due = due.checkpoint(step);
      if (due.log(step)) {
        // The only collective beyond the step's own: the window's loss summed over ranks, once per log line; it also
        // carries rank 0's clock verdict for checkpoint.every_minutes, so every rank saves at the same step.
        const bool minutes_due = rank0 && ck.every_minutes() > 0 &&
                                 seconds_since(last_save) >= 60.0 * static_cast<double>(ck.every_minutes());
        double l[2] = {window_loss, minutes_due ? 1.0 : 0.0};
        comm.allreduce_f64(l, ReduceOp::kSum, "log loss all-reduce");
        save_due |= l[1] > 0.0;
        const double mean_loss = l[0] / static_cast<double>(window_steps);
        s.final_loss = mean_loss;
        PhaseTimes pt;
        if (timer) {
          pt = timer->collect();
          for (size_t i = 0; i < pt.seconds.size(); ++i) s.phases.seconds[i] += pt.seconds[i];
          s.phases.steps += pt.steps;
        }
        TrainRecord t;
        t.step = step;
        t.total_steps = total;
        t.epoch = trainer.epoch_of(step) + 1;
        t.loss = mean_loss;
        t.lr = r.lr;
        t.scale = trainer.scaler().scale();
        t.grad_norm = r.grad_norm;
        t.skipped_steps = trainer.scaler().state().skipped_steps;
        t.dropped_rank_steps = s.dropped_contributions;
        t.samples_per_s = window_samples / std::max(window_train_s, 1e-9);
        t.time_s = s.train_seconds;
        t.peak_rss_mb = peak_rss_mb();
        t.phases = timer ? &pt : nullptr;
        sinks.train(t);
        window_loss = 0.0;
        window_steps = window_samples = 0;
        window_train_s = 0.0;
      }

      if (save_due || r.stop) {
        save(step, /*durable=*/r.stop);
        saved_at = step;
      } else {
        finish_async(/*wait=*/false);
      }
      if (r.stop) {
        sinks.message(fmt::format("stopping at step {}: a rank was asked to stop (SIGTERM/SIGUSR1)", step));
        s.stopped = true;
        break;
      }
      if (due.eval(step)) evaluate(step);
    }
    if (!s.stopped) {
      evaluate(std::max(total, trainer.iteration()));  // labelled with the weights' real step
      // A run of no steps (train.steps and train.epochs 0: the initial weights, e.g. model.init_from's, evaluated) also
      // saves them, as step 0, so that they can be exported.
      if (ck.save_final() && saved_at != total && (s.steps > 0 || (total == 0 && first == 1))) save(total, true);
    }
    finish_async(/*wait=*/true);  // the last periodic save, when no final one followed it
  } catch (const Error& e) {
    // Every rank stopped at the same agreed point (a scaler limit, a failed save under STOP): the save in flight is
    // finished and published first, so the newest checkpoint is as new as it can be. Otherwise the job is being
    // taken down and the save stays unpublished (a .tmp_step_* directory).
    if (e.collective() && async && async->in_flight()) {
      try {
        if (std::optional<AsyncCheckpointer::Published> p = async->drain())
          published(p->path, p->step, p->seconds, p->warnings);
      } catch (const Error&) {
      }
    }
    throw;
  }
  s.skipped_steps = trainer.scaler().state().skipped_steps;
  s.final_scale = trainer.scaler().scale();
  s.samples_per_s = s.train_seconds > 0 ? static_cast<double>(samples) / s.train_seconds : 0.0;
  s.master_hash = trainer.master_hash();  // collective when the master weights are sharded
  s.peak_rss_mb = peak_rss_mb();
  if (timer) {  // checkpoint saves after the last log step
    const PhaseTimes pt = timer->collect();
    for (size_t i = 0; i < pt.seconds.size(); ++i) s.phases.seconds[i] += pt.seconds[i];
  }
  // Every rank must hold the same replicated state: the master weights, or with sharded master weights the working
  // copy (the all-gathered result of every slice).
  const bool sharded = trainer.sharded();
  const std::vector<uint64_t> hashes =
      comm.allgather_u64(sharded ? trainer.with_buffers_hash(trainer.masters().working_hash()) : s.master_hash,
                         "master weights hash gather");
  for (size_t r = 0; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0])
      throw Error(std::string(sharded ? "working copies" : "master weights") + " differ across ranks: rank 0 has " +
                  hex16(hashes[0]) + ", rank " + std::to_string(r) + " has " + hex16(hashes[r]))
          .set_collective();
  }
  sinks.summary(s);
  return s;
}

}  // namespace ampdist
