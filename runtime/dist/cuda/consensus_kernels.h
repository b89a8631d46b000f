// The consensus payload's fill and decode as one-thread kernels on the compute stream (CUDA headers not needed to
// call them): the GPU step agrees without a host round-trip.
#pragma once

#include "runtime/dist/consensus_payload.h"

namespace ampdist::cuda {

// stream: a cudaStream_t (the compute stream). Launch errors throw std::runtime_error naming the kernel.
void launch_consensus_fill(float* payload, const ConsensusFields& fields, bool local_stop, void* stream);
void launch_consensus_decode(const float* payload, const ConsensusFields& fields, void* stream);

}  // namespace ampdist::cuda
