#include "runtime/dist/consensus.h"

#include <cstring>
#include <sstream>

#include "runtime/dist/cuda/consensus_kernels.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace ampdist {

#ifndef AMPDIST_HAVE_CUDA
namespace cuda {  // a communicator on the GPU cannot exist without the CUDA backend; never reached
void launch_consensus_fill(float*, const ConsensusFields&, bool, void*) { throw Error("consensus: no CUDA backend"); }
void launch_consensus_decode(const float*, const ConsensusFields&, void*) { throw Error("consensus: no CUDA backend"); }
}  // namespace cuda
#endif

Consensus::Consensus(Communicator& comm) : comm_(comm) {
  const size_t bytes = kConsensusWords * sizeof(float);
  payload_ = comm_.device() == Device::kCPU ? new float[kConsensusWords]() : static_cast<float*>(device::alloc(bytes));
}

Consensus::~Consensus() {
  if (comm_.device() == Device::kCPU) {
    delete[] payload_;
  } else {
    device::free(payload_);
  }
}

void Consensus::agree(const ConsensusFields& f, bool local_stop) {
  ++calls_;
  const bool host = comm_.device() == Device::kCPU;
  if (host) consensus_fill(payload_, f, local_stop);
  else cuda::launch_consensus_fill(payload_, f, local_stop, device::compute_stream());
  // On the GPU, wait() orders the compute stream after the all-reduce; the host does not wait.
  comm_.allreduce_async(payload_, kConsensusWords, DType::kFloat32, ReduceOp::kMax, "consensus all-reduce")->wait();
  if (host) consensus_decode(payload_, f);
  else cuda::launch_consensus_decode(payload_, f, device::compute_stream());
}

void Consensus::report_disagreement(float scale, int64_t growth_tracker, int64_t step) {
  const double s = scale;
  uint64_t bits;
  std::memcpy(&bits, &s, sizeof bits);
  const std::vector<uint64_t> all = comm_.allgather_u64(bits, "consensus scale gather");
  const std::vector<uint64_t> trackers =
      comm_.allgather_u64(static_cast<uint64_t>(growth_tracker), "consensus growth tracker gather");
  std::ostringstream o;
  o << "loss scales differ across ranks at step " << step
    << " (a bug: every rank must update its scaler from the agreed flag only):";
  for (size_t r = 0; r < all.size(); ++r) {
    double sr;
    std::memcpy(&sr, &all[r], sizeof sr);
    o << " rank " << r << " S=" << sr << " growth=" << trackers[r] << (r + 1 < all.size() ? "," : "");
  }
  throw Error(o.str()).set_collective();
}

}  // namespace ampdist
