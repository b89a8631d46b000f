// DueSteps: at which optimizer steps the training loop logs, saves, evaluates, and therefore reads the step state
// back to the host. One calculator for the loop and the trainer, so that the steps the loop acts on are exactly the
// steps whose state was read.
#pragma once

#include <cstdint>

#include "ampdist/config.pb.h"

namespace ampdist {

class DueSteps {
 public:
  // total: the run's last step; steps_per_epoch: 0 when the trainer has no dataset.
  DueSteps(const RunConfig& cfg, int64_t total, int64_t steps_per_epoch);

  // A progress line, metrics record and the log all-reduce (log.every_steps, and the last step).
  bool log(int64_t step) const;
  // A checkpoint by checkpoint.every_steps (every_minutes and stop requests are decided at log steps).
  bool checkpoint(int64_t step) const;
  // An evaluation before the end (train.eval_every_epochs at epoch ends, train.eval_every_steps); the last step's
  // evaluation is the loop's own.
  bool eval(int64_t step) const;
  // The host reads the step state: any step above, an epoch end, and the last step. On the GPU these are the only
  // steps that wait for the device.
  bool read(int64_t step) const;

 private:
  int64_t total_, spe_, log_every_, ckpt_every_, eval_epochs_, eval_steps_;
};

}  // namespace ampdist
