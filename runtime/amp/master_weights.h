// MasterWeights: every parameter of a model in one flat FP32 buffer, plus its working copy and its gradients.
//
// Parameters are laid out back to back in registration order:
//   master  [numel] FP32   the weights the optimizer updates (what checkpoints save)
//   working [numel] dtype  the fp16/bf16 copy forward and backward read; in an FP32 run, the master buffer itself
//   grads   [numel] FP32   gradients (weight-gradient GEMMs write here; the reducer's buckets are ranges of it)
// Flat buffers make every per-step pass one loop: one cast, one unscale + check, one optimizer update.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"

namespace ampdist {

class MasterWeights {
 public:
  // Points each Parameter's master/working/grad views into the flat buffers, allocated on `device`. Parameters must
  // stay alive.
  MasterWeights(std::vector<Parameter*> params, DType working_dtype, Device device = Device::kCPU);

  // Fills the master weights from each parameter's init rule with the counter-based RNG keyed by
  // (seed, parameter index): identical on every rank without a broadcast. Then casts to the working copy.
  void initialize(uint64_t seed);
  // master -> working copy, one pass, round to nearest even. No-op in an FP32 run.
  void cast_to_working();

  DType working_dtype() const { return working_dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return master_.numel(); }
  Tensor& master() { return master_; }
  const Tensor& master() const { return master_; }
  Tensor& working() { return working_; }
  Tensor& grads() { return grads_; }
  const Tensor& grads() const { return grads_; }
  std::span<Parameter* const> params() const { return params_; }

  // XXH3-64 of the master buffer's bytes: equal on every rank after every step (a device buffer is copied to the
  // host first, which synchronises).
  uint64_t hash() const;

 private:
  std::vector<Parameter*> params_;
  DType working_dtype_;
  Device device_;
  Tensor master_, working_, grads_;
};

}  // namespace ampdist
