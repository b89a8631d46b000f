// MasterWeights: every parameter of a model in one flat FP32 buffer, plus its working copy and its gradients.
//
// Tensors are laid out back to back in registration order (core/flat_layout.h):
//   master  [numel] FP32   the weights the optimizer updates (what checkpoints save)
//   working [numel] dtype  the fp16/bf16 copy forward and backward read; in an FP32 run, the master buffer itself
//   grads   [numel] FP32   gradients (weight-gradient GEMMs write here; the reducer's buckets are ranges of it)
// Flat buffers make every per-step pass one loop: one cast, one unscale + check, one optimizer update. A model's
// parameters get views into these buffers from nn/ (bind_parameters), which also fills the master weights from the
// parameters' initialisation rules.
#pragma once

#include <cstdint>

#include "runtime/core/flat_layout.h"
#include "runtime/core/tensor.h"

namespace ampdist {

class MasterWeights {
 public:
  // Allocates the flat buffers for `layout` on `device` (zeros).
  MasterWeights(FlatLayout layout, DType working_dtype, Device device = Device::kCPU);

  // master -> working copy, one pass, round to nearest even. No-op in an FP32 run.
  void cast_to_working();

  DType working_dtype() const { return working_dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return master_.numel(); }
  const FlatLayout& layout() const { return layout_; }
  Tensor& master() { return master_; }
  const Tensor& master() const { return master_; }
  Tensor& working() { return working_; }
  Tensor& grads() { return grads_; }
  const Tensor& grads() const { return grads_; }
  // Views of tensor i of the layout into each buffer, shaped as the tensor.
  Tensor master_view(size_t i);
  Tensor working_view(size_t i);
  Tensor grad_view(size_t i);

  // XXH3-64 of the master buffer's bytes: equal on every rank after every step (a device buffer is copied to the
  // host first, which synchronises).
  uint64_t hash() const;

 private:
  FlatLayout layout_;
  DType working_dtype_;
  Device device_;
  Tensor master_, working_, grads_;
};

}  // namespace ampdist
