// FaultHook: the config's fault drills (fault { ... } or AMPDIST_FAULT), behind the one hook the training step
// calls at its fixed points. Checkpoint faults (crash_during_save, save_error) are the checkpoint writer's.
//
// Every injection names a 1-based optimizer iteration and a rank (-1: every rank). Injected values are written
// where the tensor lives, so the drills run alike on the CPU and the GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"

namespace ampdist {

class FaultHook {
 public:
  FaultHook(const FaultConfig& faults, int rank);

  // Start of an iteration: kill { } raises SIGKILL on this rank, stall { } sleeps.
  void before_step(int64_t iteration) const;
  // The first micro-batch's input (host, FP32): a copy with the INPUT injection's element, or x itself.
  const Tensor& input(const Tensor& x, int64_t iteration);
  // A parameter's gradient is final for the step (last micro-batch, before the reduction): GRADIENT injections
  // whose element (an offset in the flat buffer) falls in it.
  void gradient(Parameter& p, int64_t iteration) const;
  // A layer's output in the step's first micro-batch: ACTIVATION injections naming the layer.
  void activation(const std::string& layer, Tensor& y, int64_t iteration) const;

  bool injects_activations() const;
  // Checks that every ACTIVATION injection names one of `layers`, whose outputs the trainer can observe only when
  // `observable` (a Sequential model). Throws Error (bad input) naming the field and the model's layers.
  void check_layers(const std::vector<std::string>& layers, bool observable) const;

 private:
  FaultConfig f_;
  int rank_;
  Tensor injected_x_;
};

}  // namespace ampdist
