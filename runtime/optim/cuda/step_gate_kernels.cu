// finish_step as a one-thread kernel: the function the CPU backend calls directly, so a skipped step, the loss-scale
// update, the schedule and the clip factor never need a host round-trip on the GPU.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "runtime/optim/cuda/step_gate_kernels.h"

namespace ampdist::cuda {
namespace {

__global__ void k_finish_step(StepState* st, StepConfig cfg, double divisor) { finish_step(*st, cfg, divisor); }

}  // namespace

void launch_finish_step(StepState* st, const StepConfig& cfg, double loss_divisor, void* s) {
  k_finish_step<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(st, cfg, loss_divisor);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel finish_step: ") + cudaGetErrorString(e));
}

}  // namespace ampdist::cuda
