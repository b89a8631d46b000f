// Launchers of amp/step_state.h's one-thread functions as CUDA kernels on the compute stream (CUDA headers not needed
// to call them). Without the CUDA backend each throws Error.
#pragma once

#include <cstdint>

#include "runtime/amp/step_state.h"

namespace ampdist::cuda {

// stream: a cudaStream_t (the compute stream). Launch errors throw std::runtime_error naming the kernel.
void launch_begin_step(StepState* st, void* stream);
void launch_drop_fill(StepState* st, int64_t local_samples, void* stream);
void launch_drop_apply(StepState* st, int64_t global_samples, void* stream);
void launch_sum_rank_sums(StepState* st, const double* per_rank, int world, void* stream);

}  // namespace ampdist::cuda
