// The training loop around Trainer::step(): epochs, evaluation, progress lines, metrics.jsonl, and the summary.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "runtime/obs/metrics_sink.h"  // RunSummary
#include "runtime/train/trainer.h"

namespace ampdist {

struct LoopOptions {
  std::string run_dir;      // metrics.jsonl goes here (rank 0); created if missing
  std::ostream* out = nullptr;  // progress lines and the summary (rank 0 only; null elsewhere)
  bool tty = false;         // rewrite one progress line in place instead of printing plain lines
  // Where checkpoints go (checkpoint.dir, else <run_dir>/checkpoints); "" disables saving.
  std::string checkpoint_dir;
  // Trainer::restore's line about a precision change on resume ("" if none): also a {"type":"resume"} record.
  std::string resume_note;
  // The checkpoint this run resumed from ("" if none): the newest complete one until this run saves its own.
  std::string resumed_checkpoint;
};

// One line saying what a stop signal (`signal_name`: "SIGTERM", "SIGUSR1") arriving now interrupts and what survives
// if the job is ended before the stop-save completes (mpirun ends its ranks about 1 s after passing on a SIGTERM, which
// may be in the middle of a save): the checkpoint being written or the step under way, and the newest complete
// checkpoint of this run. "" when no training loop runs. Thread-safe: for the signal thread of launch/main.cc.
std::string stop_signal_notice(const std::string& signal_name);


// Peak resident set size of this process in MiB (getrusage(RUSAGE_SELF).ru_maxrss, which Linux reports in KiB).
double peak_rss_mb();

// Runs from the trainer's current iteration (0, or a restored checkpoint's) to the configured number of steps
// (train.steps, or train.epochs epochs), saving checkpoints every checkpoint.every_steps steps, every
// checkpoint.every_minutes (checked at log steps), at the end (checkpoint.save_final), and when any rank was asked
// to stop (stop_request(), agreed at the step's consensus), in which case it returns early. Evaluates after every
// train.eval_every_epochs epochs / train.eval_every_steps steps and at the end. metrics.jsonl gets one JSON object
// per logged step ({"type":"train",...}) and per evaluation ({"type":"eval",...,"test_accuracy":...}); a new run
// appends after a {"type":"start",...} record, so nothing already there is lost. With log.phase_timing, each
// "train" record has "phase_ms" (milliseconds per step of each phase over the window) and a plain-text progress
// line "phases (ms/step): ..." follows each progress line; with log.tensorboard, rank 0 writes the same scalars to
// an events.out.tfevents.* file in run_dir (tags train/*, eval/*, phase/*_ms, memory/peak_rss_mb, numerics/*).
// With precision.numerics_report_every, each report is a {"type":"numerics",...} record. Every record goes through
// the metrics sinks of runtime/obs/metrics_sink.h (metrics.jsonl, TensorBoard, the console's progress lines and the
// summary, on rank 0). The trainer reads its step state back only at the steps DueSteps names (StateReads::kDueSteps),
// so a stop request or a scaler limit takes effect at the next such step.
// Throws Error when the master weights differ across ranks at the end (naming the ranks).
RunSummary run_training(Trainer& trainer, const LoopOptions& opt);

// "0123456789abcdef"
std::string hex16(uint64_t v);

}  // namespace ampdist
