// LayerNorm over the last dimension (Ba et al. 2016), as torch.nn.LayerNorm(C, eps=1e-5): gain (ones) and bias
// (zeros) of [C]. Autocast "layer_norm": statistics and arithmetic always FP32; the output is FP32 (torch.autocast
// returns FP32 from layer_norm) unless set_output_dtype() names the dtype of the GEMM it feeds: then it is rounded
// once to that dtype, which is the same value the GEMM's cast of an FP32 output would give, without keeping an FP32
// copy alive.
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
  // The dtype of forward()'s output (default FP32).
  void set_output_dtype(DType d) { out_dtype_ = d; }
  // x: [N, C] any dtype. Returns y [N, C] in the output dtype.
  const Tensor& forward(const Tensor& x) override;
  // forward() writing y into the caller's buffer (made [N, C] of the output dtype) instead of this layer's: a model
  // may hand several layers one buffer and recompute each output into it when needed again (the same values: the
  // same kernel on the same input). The backward reads x, the mean and rstd, not y.
  void forward_into(const Tensor& x, Tensor& y);
  // dy: [N, C] any dtype. Returns dx [N, C] FP32 (computed even when !ctx.need_input_grad: LayerNorm never
  // starts a model).
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  // The same gradient written into (accumulate: added to) dx [N, C] FP32, the residual stream's gradient, instead of
  // a buffer of this layer's: the same FP32 values as backward() followed by an add.
  void backward_into(const Tensor& dy, GradContext& ctx, Tensor& dx, bool accumulate);
  void pass_buffers_to(Module& next, bool backward_only) override;

 private:
  int64_t channels_;
  float eps_;
  DType out_dtype_ = DType::kFloat32;
  Parameter weight_, bias_;
  Tensor x_, y_, mean_, rstd_, dx_;
};

}  // namespace ampdist
