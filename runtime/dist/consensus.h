// Consensus: every rank agrees, once per optimizer step, on whether the step overflowed and whether to stop, and
// checks that every rank holds the same loss-scaler state.
//
// One MAX all-reduce of six FP32 words, [found_inf, S, -S, growth_tracker, -growth_tracker, stop]: the agreed flag
// is the max of the flags (likewise `stop`: a rank that received SIGTERM/SIGUSR1 asks every rank to save and stop
// at this step boundary, at no extra collective); the scales agree iff max(S) == -max(-S), likewise the trackers
// (FP32 holds them exactly: a scale is a float, a tracker an integer below the growth interval). The payload lives
// on the communicator's device and is filled from and decoded into the step's state there, so on the GPU nothing
// waits for the host: the fill and the decode are one-thread kernels around the NCCL all-reduce.
//
// A disagreement is a bug (the scalers must only ever see agreed flags): it is decoded as `disagree`, and once the
// host reads it, report_disagreement() names the ranks that differ.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "runtime/dist/consensus_payload.h"

namespace ampdist {

class Consensus {
 public:
  // Allocates the payload on comm.device().
  explicit Consensus(Communicator& comm);
  ~Consensus();
  Consensus(const Consensus&) = delete;
  Consensus& operator=(const Consensus&) = delete;

  // Fills the payload from this rank's fields, all-reduces it (MAX) and decodes the agreed flags into the out
  // fields. Collective: every rank calls it once per optimizer step. On the GPU it only queues work.
  void agree(const ConsensusFields& fields, bool local_stop);
  // After the host read `disagree`: gathers every rank's scale and growth tracker (collective: every rank read the
  // same agreed flag at the same step) and throws a collective Error naming the ranks that differ.
  [[noreturn]] void report_disagreement(float scale, int64_t growth_tracker, int64_t step);
  int64_t calls() const { return calls_; }

 private:
  Communicator& comm_;
  float* payload_ = nullptr;  // kConsensusWords on comm.device()
  int64_t calls_ = 0;
};

}  // namespace ampdist
