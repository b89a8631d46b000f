// The consensus payload's layout and the fields it is filled from and decoded into (see runtime/dist/consensus.h), one
// definition for the CPU and for the GPU's one-thread kernels. No CUDA, Eigen or MPI header: device code includes it.
#pragma once

#include <cstdint>

#include "runtime/core/host_device.h"

namespace ampdist {

// The step state's fields the consensus reads and writes, as pointers on the communicator's device (host memory
// with the MPI communicator, device memory with NCCL).
struct ConsensusFields {
  const float* found_inf = nullptr;         // > 0: this rank's gradient holds inf/NaN
  const float* scale = nullptr;             // this rank's loss scale
  const int64_t* growth_tracker = nullptr;  // and its growth tracker
  int32_t* agreed_found_inf = nullptr;      // out: 1 when any rank found inf/NaN
  int32_t* agreed_stop = nullptr;           // out: 1 when any rank asked to stop
  int32_t* disagree = nullptr;              // out: 1 when the ranks' scales or growth trackers differ
};

// The payload layout, one definition for both backends.
constexpr int kConsensusWords = 6;
AMPDIST_HOST_DEVICE void consensus_fill(float* v, const ConsensusFields& f, bool local_stop) {
  const float g = static_cast<float>(*f.growth_tracker);
  v[0] = *f.found_inf > 0.0f ? 1.0f : 0.0f;
  v[1] = *f.scale;
  v[2] = -*f.scale;
  v[3] = g;
  v[4] = -g;
  v[5] = local_stop ? 1.0f : 0.0f;
}
AMPDIST_HOST_DEVICE void consensus_decode(const float* v, const ConsensusFields& f) {
  *f.agreed_found_inf = v[0] > 0.0f ? 1 : 0;
  *f.agreed_stop = v[5] > 0.0f ? 1 : 0;
  *f.disagree = (v[1] != -v[2] || v[3] != -v[4]) ? 1 : 0;
}

}  // namespace ampdist
