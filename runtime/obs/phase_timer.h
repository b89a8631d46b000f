// Where the time of a training step goes, phase by phase, without adding synchronisation to the step.
//
// The trainer marks phase boundaries (begin/end) as it runs; an implementation records them as cheaply as it can
// and turns them into durations only when collect() is called, at log time. The steady-clock implementation
// below is the CPU backend's: each boundary is one clock read. A device implementation records events on the
// compute stream at the same boundaries (one cudaEventRecord each, no synchronisation) and resolves them in
// collect(), which is the only place it may wait.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/core/dtype.h"

namespace ampdist {

enum class Phase : int {
  kDataWait = 0,         // waiting for the loader's next global batch
  kForward,              // cast of the working copy, forward and loss of every micro-batch
  kBackward,             // backward of every micro-batch (bucket all-reduces are launched from inside it)
  kCommWait,             // waiting for the gradient reduction after backward: communication not hidden by it
  kUnscaleConsensus,     // the fused unscale + non-finite check and the consensus all-reduce
  kOptimizer,            // all-gather (reduce-scatter mode), clipping, optimizer step, loss scaler update
  kCheckpoint,           // checkpoint saves (timed by the training loop)
  kCount
};

// "data_wait", "forward", "backward", "comm_wait", "unscale_consensus", "optimizer", "checkpoint".
std::string_view phase_name(Phase p);

// Seconds spent in each phase (indexed by Phase) since the last collect(), and the steps they cover.
struct PhaseTimes {
  std::array<double, static_cast<int>(Phase::kCount)> seconds{};
  int64_t steps = 0;
  double total() const;
  double operator[](Phase p) const { return seconds[static_cast<int>(p)]; }
};

class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  // Phase boundaries, in the order the step reaches them. A phase may be entered several times per step
  // (forward and backward once per micro-batch); its durations add up. Phases do not nest.
  virtual void begin(Phase p) = 0;
  virtual void end(Phase p) = 0;
  // One training step has finished (counts the steps a collect() covers).
  virtual void end_step() = 0;
  // Durations accumulated since the previous collect(), which are then reset. Called at log time only.
  virtual PhaseTimes collect() = 0;
};

// The CPU implementation: std::chrono::steady_clock read at every boundary (a vDSO call, no system call; about
// 0.27 us per read measured on a loaded 2-core machine, so a few microseconds per step of tens of milliseconds).
class SteadyClockPhaseTimer final : public PhaseTimer {
 public:
  void begin(Phase p) override { start_[static_cast<int>(p)] = std::chrono::steady_clock::now(); }
  void end(Phase p) override {
    const int i = static_cast<int>(p);
    acc_.seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_[i]).count();
  }
  void end_step() override { ++acc_.steps; }
  PhaseTimes collect() override;

 private:
  std::array<std::chrono::steady_clock::time_point, static_cast<int>(Phase::kCount)> start_{};
  PhaseTimes acc_;
};

// The GPU implementation: the phases that run on the device are timed by a pair of CUDA events recorded on the
// compute stream at their boundaries (no host wait), resolved to durations in collect(), which waits for the last
// event; the host's own phases (data wait, checkpoint) use the steady clock. Events are pooled and reused.
class CudaEventPhaseTimer final : public PhaseTimer {
 public:
  ~CudaEventPhaseTimer() override;
  void begin(Phase p) override;
  void end(Phase p) override;
  void end_step() override { ++acc_.steps; }
  PhaseTimes collect() override;

 private:
  struct Pending {
    Phase phase;
    void *start, *end;
  };
  static bool on_host(Phase p) { return p == Phase::kDataWait || p == Phase::kCheckpoint; }
  void* take();
  SteadyClockPhaseTimer host_;
  std::array<void*, static_cast<int>(Phase::kCount)> open_{};
  std::vector<Pending> pending_;
  std::vector<void*> pool_;
  PhaseTimes acc_;
};

// The timer of a step that runs on `device`: SteadyClockPhaseTimer on the CPU, CudaEventPhaseTimer on the GPU.
std::unique_ptr<PhaseTimer> make_phase_timer(Device device);

// begin() on construction, end() on destruction; does nothing when the timer is null (timing off).
class PhaseScope {
 public:
  PhaseScope(PhaseTimer* t, Phase p) : t_(t), p_(p) {
    if (t_) t_->begin(p_);
  }
  ~PhaseScope() {
    if (t_) t_->end(p_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer* t_;
  Phase p_;
};

}  // namespace ampdist
