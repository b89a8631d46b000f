#include "runtime/optim/step_gate.h"

#include "runtime/amp/step_state_buffer.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/optim/cuda/step_gate_kernels.h"

namespace ampdist {

#ifndef AMPDIST_HAVE_CUDA
namespace cuda {  // a device StepStateBuffer cannot exist without a device; never reached
void launch_finish_step(StepState*, const StepConfig&, double, void*) {
  throw Error("finish_step: this build has no CUDA backend");
}
}  // namespace cuda
#endif

void finish_step(StepStateBuffer& state, const StepConfig& cfg, double loss_divisor) {
  if (state.device() == Device::kCPU) return finish_step(*state.get(), cfg, loss_divisor);
  cuda::launch_finish_step(state.get(), cfg, loss_divisor, device::compute_stream());
}

}  // namespace ampdist
