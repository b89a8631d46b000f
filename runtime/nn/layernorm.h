// LayerNorm over the last dimension (Ba et al. 2016), as torch.nn.LayerNorm(C, eps=1e-5): gain (ones) and bias
// (zeros) of [C]. Autocast "layer_norm": statistics and arithmetic always FP32; the output is FP32 (torch.autocast
// returns FP32 from layer_norm), and the following GEMM casts it to the working dtype.
#pragma once

#include "runtime/nn/module.h"

namespace ampdist {

class LayerNorm : public Module {
 public:
  // eps: 1e-5, torch.nn.LayerNorm's default.
  LayerNorm(std::string name, int64_t channels, float eps = 1e-5f);
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

  void collect_parameters(std::vector<Parameter*>& out) override;
  // x: [N, C] any dtype. Returns y [N, C] FP32.
  const Tensor& forward(const Tensor& x) override;
  // dy: [N, C] any dtype. Returns dx [N, C] FP32 (computed even when !ctx.need_input_grad: LayerNorm never
  // starts a model).
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;

 private:
  int64_t channels_;
  float eps_;
  Parameter weight_, bias_;
  Tensor x_, y_, mean_, rstd_, dx_;
};

}  // namespace ampdist
