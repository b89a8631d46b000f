#include "runtime/train/loop.h"

#include <spdlog/fmt/fmt.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <sys/resource.h>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/obs/event_writer.h"

namespace ampdist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// JSON has no inf or NaN: they are written as null.
nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

std::string hex16(uint64_t v) { return fmt::format("{:016x}", v); }

std::string format_phase_ms(const PhaseTimes& t) {
  std::string out;
  const double steps = static_cast<double>(std::max<int64_t>(t.steps, 1));
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
    const Phase p = static_cast<Phase>(i);
    if (p == Phase::kCheckpoint && t[p] == 0.0) continue;
    out += fmt::format("{}{} {:.3f}", out.empty() ? "" : "  ", phase_name(p), 1e3 * t[p] / steps);
  }
  return out;
}

double peak_rss_mb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

namespace {

nlohmann::json phase_json(const PhaseTimes& t) {
  nlohmann::json j = nlohmann::json::object();
  const double steps = static_cast<double>(std::max<int64_t>(t.steps, 1));
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i)
    j[std::string(phase_name(static_cast<Phase>(i)))] = 1e3 * t.seconds[i] / steps;
  return j;
}

nlohmann::json numerics_json(const NumericsReport& n) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerNumerics& l : n.layers) {
    layers.push_back({{"name", l.name},
                      {"act_max", num(l.act_max)},
                      {"act_nonfinite", std::isinf(l.act_max)},
                      {"grad_max", l.grad_max < 0 ? nlohmann::json(nullptr) : num(l.grad_max)},
                      {"grad_nonfinite", std::isinf(l.grad_max)},
                      {"grad_underflow_fraction", l.underflow_fraction()},
                      {"headroom_bits", num(n.headroom_bits(l))}});
  }
  nlohmann::json j = {{"type", "numerics"}, {"step", n.step}, {"dtype", n.dtype}, {"dtype_max", n.dtype_max},
                      {"layers", layers}};
  if (!n.first_nonfinite_layer.empty())
    j["first_nonfinite"] = {{"layer", n.first_nonfinite_layer}, {"pass", n.first_nonfinite_pass}};
  return j;
}

}  // namespace

RunSummary run_training(Trainer& trainer, const LoopOptions& opt) {
  Communicator& comm = trainer.comm();
  const RunConfig& cfg = trainer.config();
  const bool rank0 = comm.rank() == 0;
  std::ofstream metrics;
  if (rank0 && cfg.log().metrics_jsonl() && !opt.run_dir.empty()) {
    std::filesystem::create_directories(opt.run_dir);
    const std::string path = opt.run_dir + "/metrics.jsonl";
    metrics.open(path, std::ios::app);
    if (!metrics) throw Error(path + ": cannot open for appending");
    nlohmann::json start = {{"type", "start"},
                            {"name", cfg.name()},
                            {"world_size", comm.world_size()},
                            {"dtype", dtype_name(trainer.working_dtype())},
                            {"global_batch_size", cfg.data().global_batch_size()},
                            {"total_steps", trainer.total_steps()},
                            {"parameters", trainer.masters().numel()}};
    metrics << start.dump() << "\n" << std::flush;
    if (trainer.iteration() > 0) {
      nlohmann::json resume = {{"type", "resume"},
                               {"step", trainer.iteration()},
                               {"dtype", dtype_name(trainer.working_dtype())},
                               {"scale", trainer.scaler().scale()},
                               {"scaler_reset", !opt.resume_note.empty()}};
      if (!opt.resume_note.empty()) resume["note"] = opt.resume_note;
      metrics << resume.dump() << "\n" << std::flush;
    }
  }
  std::unique_ptr<EventFileWriter> events;
  if (rank0 && cfg.log().tensorboard() && !opt.run_dir.empty()) events = std::make_unique<EventFileWriter>(opt.run_dir);
  PhaseTimer* timer = trainer.phase_timer();
  auto print = [&](const std::string& line, bool transient) {
    if (!opt.out) return;
    if (opt.tty)
      *opt.out << "\r\033[K" << line << (transient ? "" : "\n") << std::flush;
    else
      *opt.out << line << "\n" << std::flush;
  };

  RunSummary s;
  const CheckpointConfig& ck = cfg.checkpoint();
  const Clock::time_point run_start = Clock::now();
  Clock::time_point last_save = run_start;
  auto save = [&](int64_t step) {
    if (opt.checkpoint_dir.empty()) return;
    const Clock::time_point t0 = Clock::now();
    PhaseScope timed(timer, Phase::kCheckpoint);
    try {
      s.last_checkpoint =
          save_checkpoint(comm, trainer.checkpoint_state(), opt.checkpoint_dir, ck.keep_last(), &cfg.fault());
    } catch (const Error& e) {
      // Every rank gets the same verdict from save_checkpoint, so every rank continues or stops alike.
      ++s.failed_saves;
      if (metrics.is_open()) {
        nlohmann::json j = {{"type", "checkpoint_error"}, {"step", step}, {"error", e.what()}};
        metrics << j.dump() << "\n" << std::flush;
      }
      if (ck.on_save_error() == STOP) throw;
      if (rank0 && opt.out)
        *opt.out << "warning: " << e.what() << "; the previous checkpoint is intact and training continues "
                 << "(checkpoint.on_save_error: CONTINUE)\n" << std::flush;
      return;
    }
    last_save = Clock::now();
    print(fmt::format("saved {} ({:.2f} s)", s.last_checkpoint, seconds_since(t0)), false);
    if (metrics.is_open()) {
      nlohmann::json j = {{"type", "checkpoint"}, {"step", step}, {"path", s.last_checkpoint},
                          {"seconds", seconds_since(t0)}};
      metrics << j.dump() << "\n" << std::flush;
    }
  };
  const int64_t total = trainer.total_steps();
  const int64_t spe = trainer.steps_per_epoch();
  const int64_t every = cfg.log().every_steps();
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
    if (metrics.is_open()) {
      // Epochs are 1-based as on the console: an evaluation after the last step of epoch 3 reports epoch 3.
      nlohmann::json j = {{"type", "eval"},          {"step", step},
                          {"epoch", trainer.epoch_of(std::max<int64_t>(step, 1)) + 1},
                          {"test_accuracy", e.accuracy()}, {"test_loss", num(e.loss)},
                          {"test_correct", e.correct},  {"test_samples", e.samples}};
      metrics << j.dump() << "\n" << std::flush;
    }
    if (events) {
      events->add_scalars(step, {{"eval/test_accuracy", e.accuracy()}, {"eval/test_loss", e.loss}});
      events->flush();
    }
    if (cfg.model().has_gpt())  // a language model: the mean loss per validation token is the measure
      print(fmt::format("eval  step {:>6}  val_loss {:.4f} nat/token ({} windows)", step, e.loss, e.samples), false);
    else
      print(fmt::format("eval  step {:>6}  test_accuracy {:.4f} ({}/{})  test_loss {:.4f}", step, e.accuracy(),
                        e.correct, e.samples, e.loss),
            false);
  };

  int64_t saved_at = -1;
  const int64_t first = trainer.iteration() + 1;
  if (first > total)
    print(fmt::format("warning: the checkpoint is at step {} and this run ends at step {} ({}): nothing to train; "
                      "evaluating the checkpoint's weights",
                      trainer.iteration(), total,
                      cfg.train().steps() > 0 ? "train.steps" : "train.epochs x steps per epoch"),
          false);
  for (int64_t step = first; step <= total; ++step) {
    const Clock::time_point t0 = Clock::now();
    const StepResult r = trainer.step();
    const double dt = seconds_since(t0);
    s.train_seconds += dt;
    window_train_s += dt;
    window_loss += r.loss;
    window_steps += 1;
    window_samples += r.global_samples;
    samples += r.global_samples;
    s.dropped_contributions += r.dropped_ranks;
    s.steps = step;
    if (r.numerics) {
      if (metrics.is_open()) metrics << numerics_json(*r.numerics).dump() << "\n" << std::flush;
      if (events) {
        std::vector<std::pair<std::string, double>> v;
        for (const LayerNumerics& l : r.numerics->layers) {
          v.emplace_back("numerics/" + l.name + "/act_max", l.act_max);
          if (l.grad_max >= 0) {
            v.emplace_back("numerics/" + l.name + "/grad_max", l.grad_max);
            v.emplace_back("numerics/" + l.name + "/grad_underflow_fraction", l.underflow_fraction());
          }
          v.emplace_back("numerics/" + l.name + "/headroom_bits", r.numerics->headroom_bits(l));
        }
        events->add_scalars(step, v);
      }
      if (!r.numerics->first_nonfinite_layer.empty())
        print(fmt::format("numerics: step {} first non-finite value in {} ({})", step,
                          r.numerics->first_nonfinite_layer, r.numerics->first_nonfinite_pass),
              false);
    }

    bool save_due = ck.every_steps() > 0 && step % ck.every_steps() == 0;
    if (step % every == 0 || step == total) {
      // The only collective beyond the step's own: the window's loss summed over ranks, once per log line; it also
      // carries rank 0's clock verdict for checkpoint.every_minutes, so every rank saves at the same step.
      const bool minutes_due = rank0 && ck.every_minutes() > 0 &&
                               seconds_since(last_save) >= 60.0 * static_cast<double>(ck.every_minutes());
      double l[2] = {window_loss, minutes_due ? 1.0 : 0.0};
      comm.allreduce_f64(l, ReduceOp::kSum, "log loss all-reduce");
      save_due |= l[1] > 0.0;
      const double mean_loss = l[0] / static_cast<double>(window_steps);
      s.final_loss = mean_loss;
      const double sps = window_samples / std::max(window_train_s, 1e-9);
      const LossScalerState& st = trainer.scaler().state();
      PhaseTimes pt;
      if (timer) {
        pt = timer->collect();
        for (size_t i = 0; i < pt.seconds.size(); ++i) s.phases.seconds[i] += pt.seconds[i];
        s.phases.steps += pt.steps;
      }
      const double rss = peak_rss_mb();
      if (events) {
        std::vector<std::pair<std::string, double>> v = {
            {"train/loss", mean_loss}, {"train/lr", r.lr}, {"train/loss_scale", trainer.scaler().scale()},
            {"train/skipped_steps", static_cast<double>(st.skipped_steps)}, {"train/grad_norm", r.grad_norm},
            {"train/samples_per_s", sps}, {"memory/peak_rss_mb", rss}};
        if (timer)
          for (int i = 0; i < static_cast<int>(Phase::kCount); ++i)
            v.emplace_back("phase/" + std::string(phase_name(static_cast<Phase>(i))) + "_ms",
                           1e3 * pt.seconds[i] / static_cast<double>(std::max<int64_t>(pt.steps, 1)));
        events->add_scalars(step, v);
        events->flush();
      }
      if (metrics.is_open()) {
        nlohmann::json j = {{"type", "train"},
                            {"step", step},
                            {"epoch", trainer.epoch_of(step) + 1},
                            {"loss", num(mean_loss)},
                            {"lr", r.lr},
                            {"scale", trainer.scaler().scale()},
                            {"skipped_steps", st.skipped_steps},
                            {"dropped_rank_steps", s.dropped_contributions},
                            {"grad_norm", num(r.grad_norm)},
                            {"samples_per_s", sps},
                            {"time_s", s.train_seconds},
                            {"peak_rss_mb", rss}};
        if (timer) j["phase_ms"] = phase_json(pt);
        metrics << j.dump() << "\n" << std::flush;
      }
      print(fmt::format("step {:>6}/{}  epoch {:>3}  loss {:.4f}  scale {:g}  skipped {}  lr {:.3g}  {:.0f} samples/s",
                        step, total, trainer.epoch_of(step) + 1, mean_loss, trainer.scaler().scale(),
                        st.skipped_steps, r.lr, sps),
            true);
      if (timer && !opt.tty) print("phases (ms/step): " + format_phase_ms(pt), false);
      window_loss = 0.0;
      window_steps = window_samples = 0;
      window_train_s = 0.0;
    }

    if (save_due || r.stop) {
      save(step);
      saved_at = step;
    }
    if (r.stop) {
      print(fmt::format("stopping at step {}: a rank was asked to stop (SIGTERM/SIGUSR1)", step), false);
      s.stopped = true;
      break;
    }

    const bool epoch_end = spe > 0 && step % spe == 0;
    const int64_t eval_epochs = cfg.train().eval_every_epochs();
    const int64_t eval_steps = cfg.train().eval_every_steps();
    const bool due = (epoch_end && eval_epochs > 0 && (step / spe) % eval_epochs == 0) ||
                     (eval_steps > 0 && step % eval_steps == 0);
    if (due && step != total) evaluate(step);
  }
  if (!s.stopped) {
    evaluate(std::max(total, trainer.iteration()));  // labelled with the weights' real step
    if (ck.save_final() && saved_at != total && s.steps > 0) save(total);
  }

  s.skipped_steps = trainer.scaler().state().skipped_steps;
  s.final_scale = trainer.scaler().scale();
  s.samples_per_s = s.train_seconds > 0 ? static_cast<double>(samples) / s.train_seconds : 0.0;
  s.master_hash = trainer.masters().hash();
  s.peak_rss_mb = peak_rss_mb();
  if (timer) {  // checkpoint saves after the last log step
    const PhaseTimes pt = timer->collect();
    for (size_t i = 0; i < pt.seconds.size(); ++i) s.phases.seconds[i] += pt.seconds[i];
  }
  const std::vector<uint64_t> hashes = comm.allgather_u64(s.master_hash, "master weights hash gather");
  for (size_t r = 0; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0])
      throw Error("master weights differ across ranks: rank 0 has " + hex16(hashes[0]) + ", rank " +
                  std::to_string(r) + " has " + hex16(hashes[r]))
          .set_collective();
  }
  if (metrics.is_open()) {
    nlohmann::json j = {{"type", "summary"},
                        {"steps", s.steps},
                        {"skipped_steps", s.skipped_steps},
                        {"dropped_rank_steps", s.dropped_contributions},
                        {"failed_saves", s.failed_saves},
                        {"test_accuracy", s.test_accuracy},
                        {"test_loss", num(s.test_loss)},
                        {"samples_per_s", s.samples_per_s},
                        {"final_scale", s.final_scale},
                        {"master_weights_hash", hex16(s.master_hash)},
                        {"test_loss", num(s.test_loss)},
                        {"train_seconds", s.train_seconds},
                        {"peak_rss_mb", s.peak_rss_mb}};
    if (timer) j["phase_ms"] = phase_json(s.phases);
    metrics << j.dump() << "\n" << std::flush;
  }
  return s;
}

}  // namespace ampdist
