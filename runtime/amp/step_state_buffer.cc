#include "runtime/amp/step_state_buffer.h"

#include "runtime/amp/cuda/step_state_kernels.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace ampdist {

#ifndef AMPDIST_HAVE_CUDA
namespace cuda {  // a device StepStateBuffer cannot exist without a device; these are never reached
void launch_begin_step(StepState*, void*) { throw Error("begin_step: this build has no CUDA backend"); }
void launch_drop_fill(StepState*, int64_t, void*) { throw Error("drop_fill: this build has no CUDA backend"); }
void launch_drop_apply(StepState*, int64_t, void*) { throw Error("drop_apply: this build has no CUDA backend"); }
void launch_sum_rank_sums(StepState*, const double*, int, void*) {
  throw Error("sum_rank_sums: this build has no CUDA backend");
}
}  // namespace cuda
#endif

StepStateBuffer::StepStateBuffer(Device device) : device_(device) {
  if (device_ == Device::kCPU) {
    state_ = new StepState();
  } else {
    state_ = static_cast<StepState*>(device::alloc(sizeof(StepState)));
    write(StepState());
  }
}

StepStateBuffer::~StepStateBuffer() {
  if (device_ == Device::kCPU) {
    delete state_;
  } else {
    device::free(state_);
  }
}

StepState StepStateBuffer::read() const {
  StepState h;
  device::read_to_host(&h, state_, device_, sizeof h);  // on the GPU: waits for the queued steps
  return h;
}

void StepStateBuffer::write(const StepState& s) {
  if (device_ == Device::kCPU) {
    *state_ = s;
    return;
  }
  device::copy(state_, Device::kCUDA, &s, Device::kCPU, sizeof s);
  device::synchronize();  // s may be a temporary of the caller
}

void StepStateBuffer::clear_since_read() {
  StepState s = read();
  s.loss_sum = 0.0;
  s.dropped_rank_steps = 0;
  s.dropped_samples = 0;
  write(s);
}

void StepStateBuffer::begin_step() {
  if (device_ == Device::kCPU) return ampdist::begin_step(*state_);
  cuda::launch_begin_step(state_, device::compute_stream());
}

void StepStateBuffer::drop_fill(int64_t local_samples) {
  if (device_ == Device::kCPU) return ampdist::drop_fill(*state_, local_samples);
  cuda::launch_drop_fill(state_, local_samples, device::compute_stream());
}

void StepStateBuffer::drop_apply(int64_t global_samples) {
  if (device_ == Device::kCPU) return ampdist::drop_apply(*state_, global_samples);
  cuda::launch_drop_apply(state_, global_samples, device::compute_stream());
}

void StepStateBuffer::sum_rank_sums(const double* per_rank, int world) {
  if (device_ == Device::kCPU) return ampdist::sum_rank_sums(*state_, per_rank, world);
  cuda::launch_sum_rank_sums(state_, per_rank, world, device::compute_stream());
}

}  // namespace ampdist
