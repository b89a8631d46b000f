#include "runtime/nn/layernorm.h"

#include "runtime/kernels/transformer.h"

namespace ampdist {

LayerNorm::LayerNorm(std::string name, int64_t channels, float eps)
    : Module(std::move(name)), channels_(channels), eps_(eps) {
  if (channels <= 0)
    throw Error("LayerNorm " + this->name() + ": channels must be positive, got " + std::to_string(channels),
                ErrorKind::kBadInput);
  weight_.name = this->name() + ".weight";
  weight_.shape = {channels};
  weight_.init = ParamInit::kOnes;
  bias_.name = this->name() + ".bias";
  bias_.shape = {channels};
  bias_.init = ParamInit::kZeros;
  weight_.reads_fp32 = bias_.reads_fp32 = true;  // statistics and normalisation in FP32
}

void LayerNorm::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(&weight_);
  out.push_back(&bias_);
}

const Tensor& LayerNorm::forward(const Tensor& x) {
  forward_into(x, y_);
  return y_;
}

void LayerNorm::forward_into(const Tensor& x, Tensor& y) {
  if (x.ndim() != 2 || x.dim(1) != channels_)
    throw Error("LayerNorm " + name() + ": input " + shape_str(x.shape()) + ", expected [N, " +
                std::to_string(channels_) + "]");
  x_ = x;
  y.ensure(x.shape(), out_dtype_, x.device());
  mean_.ensure({x.dim(0)}, DType::kFloat32, x.device());
  rstd_.ensure({x.dim(0)}, DType::kFloat32, x.device());
  // Gain and bias are read from the FP32 master weights: the op runs in FP32 whatever the working dtype.
  kernels::layernorm_forward(x, weight_.master, bias_.master, eps_, y, mean_, rstd_);
}

void LayerNorm::pass_buffers_to(Module& next_layer, bool backward_only) {
  LayerNorm* next = dynamic_cast<LayerNorm*>(&next_layer);
  if (!next) throw Error(name() + ": buffers passed to " + next_layer.name() + ", a layer of another type");
  std::swap(dx_, next->dx_);
  if (backward_only) return;
  std::swap(x_, next->x_);
  std::swap(y_, next->y_);
  std::swap(mean_, next->mean_);
  std::swap(rstd_, next->rstd_);
}

const Tensor& LayerNorm::backward(const Tensor& dy, GradContext& ctx) {
  dx_.ensure(x_.shape(), DType::kFloat32, x_.device());
  backward_into(dy, ctx, dx_, false);
  return dx_;
}

void LayerNorm::backward_into(const Tensor& dy, GradContext& ctx, Tensor& dx, bool accumulate) {
  kernels::layernorm_backward(x_, weight_.master, mean_, rstd_, dy, dx, accumulate, weight_.grad, bias_.grad,
                              ctx.accumulate);
  if (ctx.on_grad_ready) {
    ctx.on_grad_ready(weight_);
    ctx.on_grad_ready(bias_);
  }
}

}  // namespace ampdist
