#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "runtime/dist/cuda/consensus_kernels.h"

namespace ampdist::cuda {
namespace {

__global__ void k_fill(float* v, ConsensusFields f, int local_stop) { consensus_fill(v, f, local_stop != 0); }
__global__ void k_decode(const float* v, ConsensusFields f) { consensus_decode(v, f); }

void check(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

}  // namespace

void launch_consensus_fill(float* payload, const ConsensusFields& fields, bool local_stop, void* s) {
  k_fill<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(payload, fields, local_stop ? 1 : 0);
  check("consensus fill");
}
void launch_consensus_decode(const float* payload, const ConsensusFields& fields, void* s) {
  k_decode<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(payload, fields);
  check("consensus decode");
}

}  // namespace ampdist::cuda
