// finish_step (optim/step_gate.h) as a one-thread kernel on the compute stream (CUDA headers not needed to call it).
#pragma once

#include "runtime/optim/step_gate.h"

namespace ampdist::cuda {

// stream: a cudaStream_t (the compute stream). Launch errors throw std::runtime_error naming the kernel.
void launch_finish_step(StepState* st, const StepConfig& cfg, double loss_divisor, void* stream);

}  // namespace ampdist::cuda
