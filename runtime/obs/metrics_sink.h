// Metrics sinks: where the training loop's records go. The loop builds each record once and hands it to a
// MetricsSinks fan-out; behind it, JsonlSink writes metrics.jsonl, TensorBoardSink the event file and ConsoleSink
// the progress lines and the summary. Only rank 0 has sinks.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/obs/event_writer.h"
#include "runtime/obs/numerics.h"
#include "runtime/obs/phase_timer.h"

namespace ampdist {

struct StartRecord {
  std::string name, dtype;
  int world_size = 1;
  int64_t global_batch_size = 0, total_steps = 0, parameters = 0;
  int64_t resumed_step = 0;  // > 0: the run continues a checkpoint of this step
  float scale = 1.0f;        // the loss scale the first step runs with
  std::string resume_note;   // a precision change on resume ("" if none)
};

struct TrainRecord {
  int64_t step = 0, total_steps = 0, epoch = 0;  // epoch 1-based
  double loss = 0.0;                             // mean loss of the logged window
  double lr = 0.0, scale = 1.0, grad_norm = 0.0;  // of the last step
  int64_t skipped_steps = 0, dropped_rank_steps = 0;
  double samples_per_s = 0.0, time_s = 0.0, peak_rss_mb = 0.0;
  const PhaseTimes* phases = nullptr;  // the window's phase times (log.phase_timing), else null
};

struct EvalRecord {
  int64_t step = 0, epoch = 0;
  double accuracy = 0.0, loss = 0.0;
  int64_t correct = 0, samples = 0;
  bool language_model = false;  // the loss is the measure (nats per token); no accuracy is printed
};

struct CheckpointRecord {
  int64_t step = 0;
  std::string path;
  double seconds = 0.0;
};

// What a training run did (run_training's result, and the summary record and lines).
struct RunSummary {
  int64_t steps = 0, skipped_steps = 0;
  double test_accuracy = 0.0, test_loss = 0.0;
  int64_t test_correct = 0, test_samples = 0;
  bool language_model = false;  // test_loss is the measure (nats per token)
  double train_seconds = 0.0;  // time inside training steps (evaluation excluded)
  double samples_per_s = 0.0;  // training samples over all ranks per second of training
  float final_scale = 1.0f;
  double final_loss = 0.0;     // mean loss of the last logged window
  uint64_t master_hash = 0;    // XXH3-64 of the master weights, verified equal on every rank
  bool stopped = false;        // stopped early by SIGTERM/SIGUSR1 (after saving)
  int64_t failed_saves = 0;    // checkpoint saves that failed and were passed over (on_save_error: CONTINUE)
  int64_t dropped_contributions = 0;  // rank-steps whose non-finite gradient was dropped (on_nonfinite: DROP_RANK)
  std::string last_checkpoint; // path of the last checkpoint saved by this run, if any
  bool phase_timing = false;   // log.phase_timing was on
  PhaseTimes phases;           // this rank's per-phase seconds over the whole run (log.phase_timing; else zeros)
  double peak_rss_mb = 0.0;    // this rank's peak resident set size, MiB (getrusage ru_maxrss)
};

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void start(const StartRecord&) {}
  virtual void train(const TrainRecord&) {}
  virtual void eval(const EvalRecord&) {}
  virtual void checkpoint(const CheckpointRecord&) {}
  // A save that failed; `continuing`: checkpoint.on_save_error is CONTINUE and training goes on.
  virtual void checkpoint_error(int64_t step, const std::string& error, bool continuing) {}
  virtual void numerics(const NumericsReport&) {}
  // A line for the reader (a warning, why the run stops early).
  virtual void message(const std::string& line) {}
  virtual void summary(const RunSummary&) {}
};

// Every record to every sink, in order.
class MetricsSinks final : public MetricsSink {
 public:
  void add(std::unique_ptr<MetricsSink> s) { sinks_.push_back(std::move(s)); }
  bool empty() const { return sinks_.empty(); }
  void start(const StartRecord& r) override;
  void train(const TrainRecord& r) override;
  void eval(const EvalRecord& r) override;
  void checkpoint(const CheckpointRecord& r) override;
  void checkpoint_error(int64_t step, const std::string& error, bool continuing) override;
  void numerics(const NumericsReport& r) override;
  void message(const std::string& line) override;
  void summary(const RunSummary& r) override;

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

// metrics.jsonl: one JSON object per line ({"type": "start" | "resume" | "train" | "eval" | "checkpoint" |
// "checkpoint_error" | "numerics" | "summary", ...}), appended (a new run adds its own "start" record), flushed per
// record. Non-finite numbers are written as null. Throws Error naming the file when it cannot be opened.
class JsonlSink final : public MetricsSink {
 public:
  explicit JsonlSink(const std::string& path);
  void start(const StartRecord& r) override;
  void train(const TrainRecord& r) override;
  void eval(const EvalRecord& r) override;
  void checkpoint(const CheckpointRecord& r) override;
  void checkpoint_error(int64_t step, const std::string& error, bool continuing) override;
  void numerics(const NumericsReport& r) override;
  void summary(const RunSummary& r) override;

 private:
  std::ofstream out_;
};

// TensorBoard: scalars train/*, eval/*, phase/*_ms, memory/peak_rss_mb and numerics/<layer>/* at their steps.
class TensorBoardSink final : public MetricsSink {
 public:
  explicit TensorBoardSink(const std::string& dir) : events_(dir) {}
  void train(const TrainRecord& r) override;
  void eval(const EvalRecord& r) override;
  void numerics(const NumericsReport& r) override;

 private:
  EventFileWriter events_;
};

// The console: a progress line per logged step (rewritten in place when `tty`), evaluation lines, checkpoint
// lines, warnings, and the summary.
class ConsoleSink final : public MetricsSink {
 public:
  ConsoleSink(std::ostream& out, bool tty) : out_(out), tty_(tty) {}
  void train(const TrainRecord& r) override;
  void eval(const EvalRecord& r) override;
  void checkpoint(const CheckpointRecord& r) override;
  void checkpoint_error(int64_t step, const std::string& error, bool continuing) override;
  void numerics(const NumericsReport& r) override;
  void message(const std::string& line) override;
  void summary(const RunSummary& r) override;

 private:
  void print(const std::string& line, bool transient);
  std::ostream& out_;
  bool tty_;
};

// "forward 1.23  backward 2.34 ..." in milliseconds per step, phases in step order (checkpoint only when > 0).
std::string format_phase_ms(const PhaseTimes& t);

}  // namespace ampdist
