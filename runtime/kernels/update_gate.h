// StepGate: what the fused optimizer ops (kernels.h: sgd_step, adamw_step) read for one step, on the device of the
// buffers they update (host memory on the CPU backend, device memory on the GPU). optim/step_gate.h decides it
// (finish_step: the agreed skip flag, the schedule's learning rate, the clip factor, AdamW's bias corrections); the
// ops only read it, so a skipped step needs no host round-trip. Plain struct: device code includes this header.
#pragma once

#include <cstdint>

namespace ampdist {

struct StepGate {
  int32_t apply = 0;       // 1: update; 0: the step is skipped (nothing changes: weights, moments, decay)
  int32_t first_step = 0;  // SGD: the momentum buffer starts from this gradient
  float lr = 0.0f;
  float clip_coef = 1.0f;  // every gradient element is multiplied by it first (1: no clipping)
  float bias_correction1 = 1.0f, bias_correction2_sqrt = 1.0f;  // AdamW, for this update's t
};

}  // namespace ampdist
