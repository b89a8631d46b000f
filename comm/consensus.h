// Consensus: every rank agrees, once per optimizer step, on whether the step overflowed, and checks that every
// rank holds the same loss-scaler state.
//
// One MAX all-reduce of six doubles: [found_inf, S, -S, growth_tracker, -growth_tracker, stop]. The agreed flag is
// the max of the flags (likewise `stop`: a rank that received SIGTERM/SIGUSR1 asks every rank to save and stop at
// this step boundary, at no extra collective); the scales agree iff max(S) == -max(-S) (likewise the trackers). A disagreement is a bug
// (the scalers must only ever see agreed flags): agree() then gathers every rank's scale to name the ranks that
// differ, and throws ampdist::Error on every rank.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "runtime/amp/loss_scaler.h"

namespace ampdist {

struct Agreement {
  bool found_inf = false;  // some rank found a non-finite gradient: every rank skips
  bool stop = false;       // some rank was asked to stop: every rank saves and stops after this step
};

class Consensus {
 public:
  explicit Consensus(Communicator& comm) : comm_(comm) {}
  // The flags agreed over all ranks.
  Agreement agree(bool local_found_inf, const LossScaler& scaler, bool local_stop = false);
  int64_t calls() const { return calls_; }

 private:
  Communicator& comm_;
  int64_t calls_ = 0;
};

}  // namespace ampdist
