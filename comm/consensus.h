// Consensus: every rank agrees, once per optimizer step, on whether the step overflowed, and checks that every
// rank holds the same loss-scaler state.
//
// One MAX all-reduce of five doubles: [found_inf, S, -S, growth_tracker, -growth_tracker]. The agreed flag is the
// max of the flags; the scales agree iff max(S) == -max(-S) (likewise the trackers). A disagreement is a bug
// (the scalers must only ever see agreed flags): agree() then gathers every rank's scale to name the ranks that
// differ, and throws ampdist::Error on every rank.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "runtime/amp/loss_scaler.h"

namespace ampdist {

class Consensus {
 public:
  explicit Consensus(Communicator& comm) : comm_(comm) {}
  // Returns the flag agreed over all ranks.
  bool agree(bool local_found_inf, const LossScaler& scaler);
  int64_t calls() const { return calls_; }

 private:
  Communicator& comm_;
  int64_t calls_ = 0;
};

}  // namespace ampdist
