#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/core/device.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/module.h"

#include "runtime/core/rng.h"

namespace ampdist {

FlatLayout flat_layout(std::span<Parameter* const> params) {
  FlatLayout layout;
  for (Parameter* p : params) {
    p->index = layout.add(p->name, p->shape);
    p->offset = layout[p->index].offset;
  }
  return layout;
}

std::unique_ptr<MasterWeights> bind_parameters(std::span<Parameter* const> params, DType working_dtype,
                                               Device device, uint64_t seed, MasterSlice slice) {
  FlatLayout layout = flat_layout(params);
  std::vector<bool> fp32_reads;
  for (const Parameter* p : params) fp32_reads.push_back(p->reads_fp32);
  auto masters = std::make_unique<MasterWeights>(std::move(layout), working_dtype, device, slice, fp32_reads);
  for (Parameter* p : params) {
    p->master = masters->fp32_view(p->index);
    p->grad = masters->grad_view(p->index);
    p->working = masters->working_view(p->index);
  }
  initialize_parameters(params, *masters, seed);
  return masters;
}

void initialize_parameters(std::span<Parameter* const> params, MasterWeights& masters, uint64_t seed) {
  masters.fill([&](size_t index, int64_t first, int64_t count, float* out) {
    const Parameter* p = params[index];
    const RngStream rng{seed, {0, 0, static_cast<uint32_t>(p->index)}, RngPurpose::kInit};
    for (int64_t i = 0; i < count; ++i) {
      out[i] = p->init == ParamInit::kZeros  ? 0.0f
               : p->init == ParamInit::kOnes ? 1.0f
                                             : (2.0f * rng.uniform(first + i) - 1.0f) * p->init_bound;
    }
  });
}

// ---- buffers ----------------------------------------------------------------------------------------------------

void Buffer::allocate() {
  value = Tensor::empty(shape, DType::kFloat32);
  staged = Tensor::empty(shape, DType::kFloat32);
  std::fill(value.data_as<float>(), value.data_as<float>() + value.numel(), init);
  std::fill(staged.data_as<float>(), staged.data_as<float>() + staged.numel(), init);
}

ModelBuffers::ModelBuffers(std::span<Buffer* const> buffers, Device device) {
  for (Buffer* b : buffers) b->offset = layout_[layout_.add(b->name, b->shape)].offset;
  // The current values gathered on the host, then placed on the device once.
  std::vector<float> host(static_cast<size_t>(layout_.numel()));
  for (Buffer* b : buffers) {
    float* c = host.data() + b->offset;
    if (b->value.data()) {
      const Tensor v = b->value.device() == Device::kCPU ? b->value : b->value.to(Device::kCPU);
      std::memcpy(c, v.data(), static_cast<size_t>(b->numel()) * sizeof(float));
    } else {
      std::fill(c, c + b->numel(), b->init);
    }
  }
  committed_ = Tensor::empty({layout_.numel()}, DType::kFloat32, device);
  staged_ = Tensor::empty({layout_.numel()}, DType::kFloat32, device);
  set_host_values(host);
  begin_step();
  for (Buffer* b : buffers) {
    b->value = Tensor::view(committed_.data_as<float>() + b->offset, b->shape, DType::kFloat32, device);
    b->staged = Tensor::view(staged_.data_as<float>() + b->offset, b->shape, DType::kFloat32, device);
  }
}

std::vector<float> ModelBuffers::host_values() const {
  std::vector<float> out(static_cast<size_t>(committed_.numel()));
  device::read_to_host(out.data(), committed_.data(), committed_.device(), committed_.nbytes());
  return out;
}
void ModelBuffers::set_host_values(std::span<const float> values) {
  if (static_cast<int64_t>(values.size()) != committed_.numel())
    throw Error("model buffers: " + std::to_string(values.size()) + " values for " +
                std::to_string(committed_.numel()));
  device::copy(committed_.data(), committed_.device(), values.data(), Device::kCPU, committed_.nbytes());
  if (committed_.device() == Device::kCUDA) device::synchronize();  // values may be a temporary of the caller
}
void ModelBuffers::begin_step() {
  device::copy(staged_.data(), staged_.device(), committed_.data(), committed_.device(), committed_.nbytes());
}
void ModelBuffers::commit() {
  device::copy(committed_.data(), committed_.device(), staged_.data(), staged_.device(), committed_.nbytes());
}
void ModelBuffers::commit_unless(const int32_t* agreed_found_inf) {
  kernels::copy_unless(committed_, staged_, agreed_found_inf);
}

namespace {
// Returns x in `dtype`, casting into `buffer` when it differs (autocast at an op boundary).
const Tensor& in_dtype(const Tensor& x, DType dtype, Tensor& buffer) {
  if (x.dtype() == dtype) return x;
  buffer.ensure(x.shape(), dtype, x.device());
  kernels::cast(x, buffer);
  return buffer;
}
const Tensor kNone;
}  // namespace

// ---- Sequential ------------------------------------------------------------------------------------------------

Module& Sequential::add(std::unique_ptr<Module> m) {
  layers_.push_back(std::move(m));
  first_trainable_ = -1;
  return *layers_.back();
}

void Sequential::collect_parameters(std::vector<Parameter*>& out) {
  for (auto& l : layers_) l->collect_parameters(out);
}

void Sequential::collect_buffers(std::vector<Buffer*>& out) {
  for (auto& l : layers_) l->collect_buffers(out);
}

void Sequential::set_mode(bool training, int64_t step) {
  for (auto& l : layers_) l->set_mode(training, step);
}

Shape Sequential::output_shape(const Shape& in) const {
  Shape s = in;
  for (const auto& l : layers_) s = l->output_shape(s);
  return s;
}

int64_t Sequential::activation_bytes(const Shape& in, DType working, bool training) const {
  int64_t bytes = 0;
  Shape s = in;
  for (const auto& l : layers_) {
    bytes += l->activation_bytes(s, working, training);
    s = l->output_shape(s);
  }
  return bytes;
}

const Tensor& Sequential::forward(const Tensor& x) {
  if (layers_.empty()) return identity_ = x;
  const Tensor* h = &x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = &layers_[i]->forward(*h);
    // A layer's output is its own buffer, returned const only to keep callers from writing it by accident.
    if (forward_observer) forward_observer(i, *layers_[i], const_cast<Tensor&>(*h));
  }
  return *h;
}

const Tensor& Sequential::backward(const Tensor& dy, GradContext& ctx) {
  if (layers_.empty()) return identity_ = dy;
  if (first_trainable_ < 0) {  // the layers are fixed once training runs; add() resets this
    first_trainable_ = static_cast<int64_t>(layers_.size());
    for (size_t i = 0; i < layers_.size() && first_trainable_ == static_cast<int64_t>(layers_.size()); ++i) {
      std::vector<Parameter*> p;
      layers_[i]->collect_parameters(p);
      if (!p.empty()) first_trainable_ = static_cast<int64_t>(i);
    }
  }
  const bool outer_need = ctx.need_input_grad;
  const Tensor* g = &dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    // A layer's input gradient is needed only by a trainable layer before it (or by the caller): a network's first
    // convolution skips its data gradient, as autograd does for an input that needs none.
    ctx.need_input_grad = static_cast<int64_t>(i) > first_trainable_ || outer_need;
    g = &layers_[i]->backward(*g, ctx);
  }
  ctx.need_input_grad = outer_need;
  return *g;
}

// ---- Linear ----------------------------------------------------------------------------------------------------

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, bool bias, const Autocast& autocast)
    : Module(std::move(name)), in_(in_features), out_(out_features), has_bias_(bias) {
  if (in_features <= 0 || out_features <= 0)
    throw Error("Linear " + this->name() + ": features must be positive, got in=" + std::to_string(in_features) +
                    " out=" + std::to_string(out_features),
                ErrorKind::kBadInput);
  dtype_ = autocast.compute_dtype(OpKind::kLinear, this->name(), autocast.working());
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  weight_.name = this->name() + ".weight";
  weight_.shape = {out_features, in_features};
  weight_.init_bound = bound;
  bias_.name = this->name() + ".bias";
  bias_.shape = {out_features};
  bias_.init_bound = bound;
  weight_.reads_fp32 = bias_.reads_fp32 = dtype_ == DType::kFloat32;
}

void Linear::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(&weight_);
  if (has_bias_) out.push_back(&bias_);
}

const Tensor& Linear::forward(const Tensor& x) {
  if (x.ndim() != 2 || x.dim(1) != in_)
    throw Error("Linear " + name() + ": input " + shape_str(x.shape()) + ", expected [B, " + std::to_string(in_) +
                "]");
  x_saved_ = in_dtype(x, dtype_, x_cast_);
  y_.ensure({x.dim(0), out_}, dtype_, x.device());
  const Tensor& w = weight_.weights_for(dtype_);
  kernels::gemm(x_saved_, false, w, true, y_, 1.0f, 0.0f, has_bias_ ? &bias_.weights_for(dtype_) : nullptr);
  return y_;
}

const Tensor& Linear::backward(const Tensor& dy_in, GradContext& ctx) {
  const Tensor& dy = in_dtype(dy_in, dtype_, dy_cast_);
  const float beta = ctx.accumulate ? 1.0f : 0.0f;
  // dW[out, in] = dy^T [out, B] @ x [B, in], accumulated in FP32 straight into the gradient buffer.
  kernels::gemm(dy, true, x_saved_, false, weight_.grad, 1.0f, beta);
  if (ctx.on_grad_ready) ctx.on_grad_ready(weight_);
  if (has_bias_) {
    kernels::sum_rows(dy, bias_.grad, beta);
    if (ctx.on_grad_ready) ctx.on_grad_ready(bias_);
  }
  if (!ctx.need_input_grad) return kNone;
  dx_.ensure({dy.dim(0), in_}, dtype_, dy.device());
  kernels::gemm(dy, false, weight_.weights_for(dtype_), false, dx_);
  return dx_;
}

void Linear::resave_input(const Tensor& x) { x_saved_ = in_dtype(x, dtype_, x_cast_); }

namespace {
// The same layer type as `self`, or Error (a model handing buffers between different layers is a bug).
template <typename T>
T& same_layer(Module& self, Module& next) {
  T* n = dynamic_cast<T*>(&next);
  if (!n) throw Error(self.name() + ": buffers passed to " + next.name() + ", a layer of another type");
  return *n;
}
}  // namespace

void Linear::pass_buffers_to(Module& next_layer, bool backward_only) {
  Linear& next = same_layer<Linear>(*this, next_layer);
  std::swap(dy_cast_, next.dy_cast_);
  std::swap(dx_, next.dx_);
  if (backward_only) return;
  std::swap(x_cast_, next.x_cast_);
  std::swap(x_saved_, next.x_saved_);
  std::swap(y_, next.y_);
}

// ---- Activation ------------------------------------------------------------------------------------------------

Activation::Activation(std::string name, Kind kind, const Autocast& autocast)
    : Module(std::move(name)),
      kind_(kind),
      forced_fp32_(autocast.compute_dtype(kind == Kind::kReLU ? OpKind::kReLU : OpKind::kGELU, this->name(),
                                          DType::kFloat16) == DType::kFloat32) {}

const Tensor& Activation::forward(const Tensor& x_in) {
  forward_into(x_in, y_);
  return y_;
}

void Activation::forward_into(const Tensor& x_in, Tensor& y) {
  const Tensor& x = in_dtype(x_in, forced_fp32_ ? DType::kFloat32 : x_in.dtype(), x_cast_);
  y.ensure(x.shape(), x.dtype(), x.device());
  if (kind_ == Kind::kReLU) {
    kernels::relu_forward(x, y);
    saved_ = y;  // ReLU's gradient needs only the sign of the output
  } else {
    kernels::gelu_forward(x, y);
    saved_ = x;
  }
}

void Activation::pass_buffers_to(Module& next_layer, bool backward_only) {
  Activation& next = same_layer<Activation>(*this, next_layer);
  std::swap(dy_cast_, next.dy_cast_);
  std::swap(dx_, next.dx_);
  if (backward_only) return;
  std::swap(x_cast_, next.x_cast_);
  std::swap(saved_, next.saved_);
  std::swap(y_, next.y_);
}

const Tensor& Activation::backward(const Tensor& dy_in, GradContext& ctx) {
  if (!ctx.need_input_grad) return kNone;
  const Tensor& dy = in_dtype(dy_in, saved_.dtype(), dy_cast_);
  dx_.ensure(dy.shape(), dy.dtype(), dy.device());
  if (kind_ == Kind::kReLU)
    kernels::relu_backward(saved_, dy, dx_);
  else
    kernels::gelu_backward(saved_, dy, dx_);
  return dx_;
}

// ---- SoftmaxCrossEntropy ----------------------------------------------------------------------------------------

double SoftmaxCrossEntropy::forward(const Tensor& logits, std::span<const int32_t> targets) {
  logits_ = logits;
  targets_.assign(targets.begin(), targets.end());
  if (!device_loss_sum_) return kernels::softmax_cross_entropy_forward(logits, targets, lse_);
  // The training step: the loss is added to the step state where it lives (no host read on either backend).
  kernels::softmax_cross_entropy_forward_to(logits, targets, targets_dev_, lse_, row_loss_, device_loss_sum_, 1.0);
  return 0.0;
}

int64_t SoftmaxCrossEntropy::correct() const { return kernels::count_correct(logits_, targets_); }

const Tensor& SoftmaxCrossEntropy::backward(float grad_scale) {
  dlogits_.ensure(logits_.shape(), logits_.dtype(), logits_.device());
  if (device_scale_)
    kernels::softmax_cross_entropy_backward_from(logits_, targets_, targets_dev_, lse_, device_scale_,
                                                 device_divisor_, 1.0f, dlogits_);
  else
    kernels::softmax_cross_entropy_backward(logits_, targets_, lse_, grad_scale, dlogits_);
  return dlogits_;
}

}  // namespace ampdist
