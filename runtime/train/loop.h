// The training loop around Trainer::step(): epochs, evaluation, progress lines, metrics.jsonl, and the summary.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "runtime/obs/phase_timer.h"
#include "runtime/train/trainer.h"

namespace ampdist {

struct LoopOptions {
  std::string run_dir;      // metrics.jsonl goes here (rank 0); created if missing
  std::ostream* out = nullptr;  // progress and summary (rank 0 only; null elsewhere)
  bool tty = false;         // rewrite one progress line in place instead of printing plain lines
  // Where checkpoints go (checkpoint.dir, else <run_dir>/checkpoints); "" disables saving.
  std::string checkpoint_dir;
  // Trainer::restore's line about a precision change on resume ("" if none): also a {"type":"resume"} record.
  std::string resume_note;
};

struct RunSummary {
  int64_t steps = 0, skipped_steps = 0;
  double test_accuracy = 0.0, test_loss = 0.0;
  int64_t test_correct = 0, test_samples = 0;
  double train_seconds = 0.0;  // time inside training steps (evaluation excluded)
  double samples_per_s = 0.0;  // training samples over all ranks per second of training
  float final_scale = 1.0f;
  double final_loss = 0.0;     // mean loss of the last logged window
  uint64_t master_hash = 0;    // XXH3-64 of the master weights, verified equal on every rank
  bool stopped = false;        // stopped early by SIGTERM/SIGUSR1 (after saving)
  int64_t failed_saves = 0;    // checkpoint saves that failed and were passed over (on_save_error: CONTINUE)
  int64_t dropped_contributions = 0;  // rank-steps whose non-finite gradient was dropped (on_nonfinite: DROP_RANK)
  std::string last_checkpoint; // path of the last checkpoint saved by this run, if any
  PhaseTimes phases;           // this rank's per-phase seconds over the whole run (log.phase_timing; else zeros)
  double peak_rss_mb = 0.0;    // this rank's peak resident set size, MiB (getrusage ru_maxrss)
};

// "forward 1.23  backward 2.34 ..." in milliseconds per step, phases in step order (checkpoint only when > 0).
std::string format_phase_ms(const PhaseTimes& t);
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
// With precision.numerics_report_every, each report is a {"type":"numerics",...} record.
// Throws Error when the master weights differ across ranks at the end (naming the ranks).
RunSummary run_training(Trainer& trainer, const LoopOptions& opt);

// "0123456789abcdef"
std::string hex16(uint64_t v);

}  // namespace ampdist
