// StepStateBuffer: one StepState on the device the step runs on, and the one-thread functions of amp/step_state.h
// run where it lives.
//
// On the CPU backend the struct is host memory and each function is a direct call. On the GPU it is device memory,
// each function is a one-thread kernel queued on the compute stream (nothing waits), and read()/write() are the only
// host<->device copies of the step protocol: read() waits for the queued steps.
#pragma once

#include <cstdint>

#include "runtime/amp/step_state.h"
#include "runtime/core/dtype.h"

namespace ampdist {

class StepStateBuffer {
 public:
  // A zero-initialised StepState on `device`. Throws Error when the device cannot allocate it.
  explicit StepStateBuffer(Device device);
  ~StepStateBuffer();
  StepStateBuffer(const StepStateBuffer&) = delete;
  StepStateBuffer& operator=(const StepStateBuffer&) = delete;

  Device device() const { return device_; }
  // The struct on its device: fields may be handed to kernels and collectives as device pointers. On the CPU it is
  // plain host memory (tests may look at it between steps without changing the protocol).
  StepState* get() { return state_; }
  const StepState* get() const { return state_; }

  // A host copy of the struct (on the GPU: waits for every queued step).
  StepState read() const;
  // Replaces the struct (a restored checkpoint's scaler and step count, say).
  void write(const StepState& s);
  // After a read: clears the fields that accumulate between reads (loss_sum and the DROP_RANK counts).
  void clear_since_read();

  // The one-thread functions of amp/step_state.h, run where the struct lives (optim/step_gate.h's finish_step is
  // run the same way by a function of its own).
  void begin_step();
  void drop_fill(int64_t local_samples);
  void drop_apply(int64_t global_samples);
  void sum_rank_sums(const double* per_rank, int world);  // per_rank: on the struct's device

 private:
  Device device_;
  StepState* state_ = nullptr;
};

}  // namespace ampdist
