#include "runtime/train/due_steps.h"

namespace ampdist {
namespace {
bool every(int64_t step, int64_t n) { return n > 0 && step % n == 0; }
}  // namespace

DueSteps::DueSteps(const RunConfig& cfg, int64_t total, int64_t steps_per_epoch)
    : total_(total),
      spe_(steps_per_epoch),
      log_every_(cfg.log().every_steps()),
      ckpt_every_(cfg.checkpoint().every_steps()),
      eval_epochs_(cfg.train().eval_every_epochs()),
      eval_steps_(cfg.train().eval_every_steps()) {}

bool DueSteps::log(int64_t step) const { return every(step, log_every_) || step == total_; }

bool DueSteps::checkpoint(int64_t step) const { return every(step, ckpt_every_); }

bool DueSteps::eval(int64_t step) const {
  const bool epoch_end = every(step, spe_);
  return step != total_ && ((epoch_end && eval_epochs_ > 0 && (step / spe_) % eval_epochs_ == 0) ||
                            every(step, eval_steps_));
}

bool DueSteps::read(int64_t step) const {
  return step >= total_ || log(step) || checkpoint(step) || eval(step) || every(step, spe_);
}

}  // namespace ampdist
