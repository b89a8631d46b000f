// amp/step_state.h's functions as one-thread kernels: the same code the CPU backend calls directly, so the
// step's bookkeeping never needs a host round-trip on the GPU (finish_step's kernel: optim/cuda/step_gate_kernels.cu).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "runtime/amp/cuda/step_state_kernels.h"

namespace ampdist::cuda {
namespace {

__global__ void k_begin_step(StepState* st) { begin_step(*st); }
__global__ void k_drop_fill(StepState* st, int64_t local_samples) { drop_fill(*st, local_samples); }
__global__ void k_drop_apply(StepState* st, int64_t global_samples) { drop_apply(*st, global_samples); }
__global__ void k_sum_rank_sums(StepState* st, const double* per_rank, int world) {
  sum_rank_sums(*st, per_rank, world);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
void check(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

}  // namespace

void launch_begin_step(StepState* st, void* s) {
  k_begin_step<<<1, 1, 0, as_stream(s)>>>(st);
  check("begin_step");
}
void launch_drop_fill(StepState* st, int64_t local_samples, void* s) {
  k_drop_fill<<<1, 1, 0, as_stream(s)>>>(st, local_samples);
  check("drop_fill");
}
void launch_drop_apply(StepState* st, int64_t global_samples, void* s) {
  k_drop_apply<<<1, 1, 0, as_stream(s)>>>(st, global_samples);
  check("drop_apply");
}
void launch_sum_rank_sums(StepState* st, const double* per_rank, int world, void* s) {
  k_sum_rank_sums<<<1, 1, 0, as_stream(s)>>>(st, per_rank, world);
  check("sum_rank_sums");
}

}  // namespace ampdist::cuda
