#include "runtime/obs/metrics_sink.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace ampdist {
namespace {

// JSON has no inf or NaN: they are written as null.
nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

double per_step_ms(const PhaseTimes& t, int i) {
  return 1e3 * t.seconds[i] / static_cast<double>(std::max<int64_t>(t.steps, 1));
}

nlohmann::json phase_json(const PhaseTimes& t) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i)
    j[std::string(phase_name(static_cast<Phase>(i)))] = per_step_ms(t, i);
  return j;
}

}  // namespace

std::string format_phase_ms(const PhaseTimes& t) {
  std::string out;
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
    const Phase p = static_cast<Phase>(i);
    if (p == Phase::kCheckpoint && t[p] == 0.0) continue;
    out += fmt::format("{}{} {:.3f}", out.empty() ? "" : "  ", phase_name(p), per_step_ms(t, i));
  }
  return out;
}

// ---- fan-out ------------------------------------------------------------------------------------------------------

void MetricsSinks::start(const StartRecord& r) { for (auto& s : sinks_) s->start(r); }
void MetricsSinks::train(const TrainRecord& r) { for (auto& s : sinks_) s->train(r); }
void MetricsSinks::eval(const EvalRecord& r) { for (auto& s : sinks_) s->eval(r); }
void MetricsSinks::checkpoint(const CheckpointRecord& r) { for (auto& s : sinks_) s->checkpoint(r); }
void MetricsSinks::checkpoint_error(int64_t step, const std::string& error, bool continuing) {
  for (auto& s : sinks_) s->checkpoint_error(step, error, continuing);
}
void MetricsSinks::numerics(const NumericsReport& r) { for (auto& s : sinks_) s->numerics(r); }
void MetricsSinks::message(const std::string& line) { for (auto& s : sinks_) s->message(line); }
void MetricsSinks::summary(const RunSummary& r) { for (auto& s : sinks_) s->summary(r); }

// ---- metrics.jsonl ------------------------------------------------------------------------------------------------

JsonlSink::JsonlSink(const std::string& path) : out_(path, std::ios::app) {
  if (!out_) throw Error(path + ": cannot open for appending");
}

#define AMPDIST_WRITE(j) (out_ << (j).dump() << "\n" << std::flush)

void JsonlSink::start(const StartRecord& r) {
  AMPDIST_WRITE(nlohmann::json({{"type", "start"},
                                {"name", r.name},
                                {"world_size", r.world_size},
                                {"dtype", r.dtype},
                                {"global_batch_size", r.global_batch_size},
                                {"total_steps", r.total_steps},
                                {"parameters", r.parameters}}));
  if (r.resumed_step > 0) {
    nlohmann::json resume = {{"type", "resume"},
                             {"step", r.resumed_step},
                             {"dtype", r.dtype},
                             {"scale", r.scale},
                             {"scaler_reset", !r.resume_note.empty()}};
    if (!r.resume_note.empty()) resume["note"] = r.resume_note;
    AMPDIST_WRITE(resume);
  }
}

void JsonlSink::train(const TrainRecord& r) {
  nlohmann::json j = {{"type", "train"},
                      {"step", r.step},
                      {"epoch", r.epoch},
                      {"loss", num(r.loss)},
                      {"lr", r.lr},
                      {"scale", r.scale},
                      {"skipped_steps", r.skipped_steps},
                      {"dropped_rank_steps", r.dropped_rank_steps},
                      {"grad_norm", num(r.grad_norm)},
                      {"samples_per_s", r.samples_per_s},
                      {"time_s", r.time_s},
                      {"peak_rss_mb", r.peak_rss_mb}};
  if (r.phases) j["phase_ms"] = phase_json(*r.phases);
  AMPDIST_WRITE(j);
}

void JsonlSink::eval(const EvalRecord& r) {
  nlohmann::json j = {{"type", "eval"}, {"step", r.step}, {"epoch", r.epoch}};
  if (!r.language_model) {  // a language model has no accuracy: its loss per token is the measure
    j["test_accuracy"] = r.accuracy;
    j["test_correct"] = r.correct;
  }
  j["test_loss"] = num(r.loss);
  j["test_samples"] = r.samples;
  AMPDIST_WRITE(j);
}

void JsonlSink::checkpoint(const CheckpointRecord& r) {
  AMPDIST_WRITE(nlohmann::json({{"type", "checkpoint"}, {"step", r.step}, {"path", r.path}, {"seconds", r.seconds}}));
}

void JsonlSink::checkpoint_error(int64_t step, const std::string& error, bool) {
  AMPDIST_WRITE(nlohmann::json({{"type", "checkpoint_error"}, {"step", step}, {"error", error}}));
}

void JsonlSink::numerics(const NumericsReport& n) {
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
  AMPDIST_WRITE(j);
}

void JsonlSink::summary(const RunSummary& r) {
  nlohmann::json j = {{"type", "summary"},
                      {"steps", r.steps},
                      {"skipped_steps", r.skipped_steps},
                      {"dropped_rank_steps", r.dropped_contributions},
                      {"failed_saves", r.failed_saves},
                      {"test_loss", r.test_samples > 0 ? num(r.test_loss) : nlohmann::json(nullptr)},
                      {"test_samples", r.test_samples},
                      {"samples_per_s", r.samples_per_s},
                      {"final_scale", r.final_scale},
                      {"master_weights_hash", fmt::format("{:016x}", r.master_hash)},
                      {"train_seconds", r.train_seconds},
                      {"peak_rss_mb", r.peak_rss_mb}};
  // No accuracy where none was measured: a language model's, or a run that stopped before its evaluation.
  if (!r.language_model && r.test_samples > 0) j["test_accuracy"] = r.test_accuracy;
  if (r.phase_timing) j["phase_ms"] = phase_json(r.phases);
  AMPDIST_WRITE(j);
}

#undef AMPDIST_WRITE

// ---- TensorBoard --------------------------------------------------------------------------------------------------

void TensorBoardSink::train(const TrainRecord& r) {
  std::vector<std::pair<std::string, double>> v = {
      {"train/loss", r.loss},       {"train/lr", r.lr},
      {"train/loss_scale", r.scale}, {"train/skipped_steps", static_cast<double>(r.skipped_steps)},
      {"train/grad_norm", r.grad_norm}, {"train/samples_per_s", r.samples_per_s},
      {"memory/peak_rss_mb", r.peak_rss_mb}};
  if (r.phases)
    for (int i = 0; i < static_cast<int>(Phase::kCount); ++i)
      v.emplace_back("phase/" + std::string(phase_name(static_cast<Phase>(i))) + "_ms", per_step_ms(*r.phases, i));
  events_.add_scalars(r.step, v);
  events_.flush();
}

void TensorBoardSink::eval(const EvalRecord& r) {
  events_.add_scalars(r.step, {{"eval/test_accuracy", r.accuracy}, {"eval/test_loss", r.loss}});
  events_.flush();
}

void TensorBoardSink::numerics(const NumericsReport& n) {
  std::vector<std::pair<std::string, double>> v;
  for (const LayerNumerics& l : n.layers) {
    v.emplace_back("numerics/" + l.name + "/act_max", l.act_max);
    if (l.grad_max >= 0) {
      v.emplace_back("numerics/" + l.name + "/grad_max", l.grad_max);
      v.emplace_back("numerics/" + l.name + "/grad_underflow_fraction", l.underflow_fraction());
    }
    v.emplace_back("numerics/" + l.name + "/headroom_bits", n.headroom_bits(l));
  }
  events_.add_scalars(n.step, v);
}

// ---- console ------------------------------------------------------------------------------------------------------

void ConsoleSink::print(const std::string& line, bool transient) {
  if (tty_)
    out_ << "\r\033[K" << line << (transient ? "" : "\n") << std::flush;
  else
    out_ << line << "\n" << std::flush;
}

void ConsoleSink::train(const TrainRecord& r) {
  // Three significant digits below 100 samples/s: a GPT's windows per second are often below 1.
  const std::string rate =
      r.samples_per_s >= 100 ? fmt::format("{:.0f}", r.samples_per_s) : fmt::format("{:.3g}", r.samples_per_s);
  print(fmt::format("step {:>6}/{}  epoch {:>3}  loss {:.4f}  scale {:g}  skipped {}  lr {:.3g}  {} samples/s", r.step,
                    r.total_steps, r.epoch, r.loss, r.scale, r.skipped_steps, r.lr, rate),
        true);
  if (r.phases && !tty_) print("phases (ms/step): " + format_phase_ms(*r.phases), false);
}

void ConsoleSink::eval(const EvalRecord& r) {
  if (r.language_model)  // the mean loss per validation token is the measure
    print(fmt::format("eval  step {:>6}  val_loss {:.4f} nat/token ({} windows)", r.step, r.loss, r.samples), false);
  else
    print(fmt::format("eval  step {:>6}  test_accuracy {:.4f} ({}/{})  test_loss {:.4f}", r.step, r.accuracy,
                      r.correct, r.samples, r.loss),
          false);
}

void ConsoleSink::checkpoint(const CheckpointRecord& r) {
  print(fmt::format("saved {} ({:.2f} s)", r.path, r.seconds), false);
}

void ConsoleSink::checkpoint_error(int64_t, const std::string& error, bool continuing) {
  if (continuing)
    print("warning: " + error + "; the previous checkpoint is intact and training continues "
          "(checkpoint.on_save_error: CONTINUE)",
          false);
}

void ConsoleSink::numerics(const NumericsReport& n) {
  if (!n.first_nonfinite_layer.empty())
    print(fmt::format("numerics: step {} first non-finite value in {} ({})", n.step, n.first_nonfinite_layer,
                      n.first_nonfinite_pass),
          false);
}

void ConsoleSink::message(const std::string& line) { print(line, false); }

void ConsoleSink::summary(const RunSummary& s) {
  if (s.test_samples == 0)  // stopped (a signal, a fault) before its evaluation ran
    out_ << (s.language_model ? "validation loss" : "test accuracy") << ": not evaluated\n";
  else if (s.language_model)
    out_ << fmt::format("validation loss: {:.4f} nat/token ({} windows)\n", s.test_loss, s.test_samples);
  else
    out_ << fmt::format("test accuracy: {:.4f} ({}/{})\n", s.test_accuracy, s.test_correct, s.test_samples);
  out_ << fmt::format("samples/s: {:.1f} ({} steps in {:.1f} s of training)\n", s.samples_per_s, s.steps,
                      s.train_seconds);
  out_ << fmt::format("skipped steps: {}\n", s.skipped_steps);
  if (s.phase_timing && s.phases.steps > 0) out_ << "phases (ms/step, rank 0): " << format_phase_ms(s.phases) << "\n";
  out_ << fmt::format("peak memory (rank 0 RSS): {:.1f} MiB\n", s.peak_rss_mb);
  out_ << fmt::format("final loss scale: {:g}\n", s.final_scale);
  out_ << fmt::format("master weights hash: {:016x}\n", s.master_hash);
  if (!s.last_checkpoint.empty()) out_ << "checkpoint: " << s.last_checkpoint << "\n";
  if (s.stopped) out_ << "stopped early on request; resume with --resume auto\n";
  out_ << std::flush;
}

}  // namespace ampdist
