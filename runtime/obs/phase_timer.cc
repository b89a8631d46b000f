#include "runtime/obs/phase_timer.h"

#include "runtime/core/device.h"

namespace ampdist {

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::kDataWait: return "data_wait";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kCommWait: return "comm_wait";
    case Phase::kUnscaleConsensus: return "unscale_consensus";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kCheckpoint: return "checkpoint";
    case Phase::kCount: break;
  }
  return "?";
}

double PhaseTimes::total() const {
  double t = 0.0;
  for (double s : seconds) t += s;
  return t;
}

PhaseTimes SteadyClockPhaseTimer::collect() {
  PhaseTimes out = acc_;
  acc_ = PhaseTimes{};
  return out;
}

CudaEventPhaseTimer::~CudaEventPhaseTimer() {
  for (void* e : pool_) device::event_destroy(e);
  for (const Pending& p : pending_) {
    device::event_destroy(p.start);
    device::event_destroy(p.end);
  }
  for (void* e : open_) device::event_destroy(e);
}

void* CudaEventPhaseTimer::take() {
  if (pool_.empty()) return device::event_create();
  void* e = pool_.back();
  pool_.pop_back();
  return e;
}

void CudaEventPhaseTimer::begin(Phase p) {
  if (on_host(p)) return host_.begin(p);
  void* e = take();
  device::event_record(e);
  open_[static_cast<int>(p)] = e;
}

void CudaEventPhaseTimer::end(Phase p) {
  if (on_host(p)) return host_.end(p);
  void*& start = open_[static_cast<int>(p)];
  if (!start) return;
  void* e = take();
  device::event_record(e);
  pending_.push_back({p, start, e});
  start = nullptr;
}

PhaseTimes CudaEventPhaseTimer::collect() {
  PhaseTimes out = host_.collect();
  for (const Pending& p : pending_) {
    out.seconds[static_cast<int>(p.phase)] += 1e-3 * device::event_elapsed_ms(p.start, p.end);
    pool_.push_back(p.start);
    pool_.push_back(p.end);
  }
  pending_.clear();
  out.steps = acc_.steps;
  acc_ = PhaseTimes{};
  return out;
}

std::unique_ptr<PhaseTimer> make_phase_timer(Device device) {
  if (device == Device::kCUDA) return std::make_unique<CudaEventPhaseTimer>();
  return std::make_unique<SteadyClockPhaseTimer>();
}

}  // namespace ampdist
