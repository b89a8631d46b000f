#include "runtime/obs/phase_timer.h"

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

}  // namespace ampdist
