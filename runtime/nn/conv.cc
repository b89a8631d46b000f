#include "runtime/nn/conv.h"

#include <cmath>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"

namespace ampdist {
namespace {

// x in `dtype`, cast into `buffer` when it differs.
const Tensor& in_dtype(const Tensor& x, DType dtype, Tensor& buffer) {
  if (x.dtype() == dtype) return x;
  buffer.ensure(x.shape(), dtype, x.device());
  kernels::cast(x, buffer);
  return buffer;
}
const Tensor kNone;

}  // namespace

// ---- Conv2d ------------------------------------------------------------------------------------------------------

Conv2d::Conv2d(std::string name, const Options& o, const Autocast& autocast) : Module(std::move(name)), o_(o) {
  if (o.in <= 0 || o.out <= 0 || o.kernel <= 0 || o.stride <= 0 || o.padding < 0 || o.dilation <= 0 ||
      o.groups <= 0 || o.in % o.groups != 0 || o.out % o.groups != 0)
    throw Error("Conv2d " + this->name() + ": in=" + std::to_string(o.in) + " out=" + std::to_string(o.out) +
                    " kernel=" + std::to_string(o.kernel) + " stride=" + std::to_string(o.stride) +
                    " padding=" + std::to_string(o.padding) + " dilation=" + std::to_string(o.dilation) +
                    " groups=" + std::to_string(o.groups) +
                    ": sizes must be positive (padding >= 0) and groups must divide in and out",
                ErrorKind::kBadInput);
  dtype_ = autocast.compute_dtype(OpKind::kConv2d, this->name(), autocast.working());
  const int64_t fan_in = o.in / o.groups * o.kernel * o.kernel;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  weight_.name = this->name() + ".weight";
  weight_.shape = {o.out, o.in / o.groups, o.kernel, o.kernel};
  weight_.init_bound = o.init_bound > 0 ? o.init_bound : bound;
  bias_.name = this->name() + ".bias";
  bias_.shape = {o.out};
  bias_.init_bound = bound;
  weight_.reads_fp32 = bias_.reads_fp32 = dtype_ == DType::kFloat32;
}

void Conv2d::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(&weight_);
  if (o_.bias) out.push_back(&bias_);
}

Shape Conv2d::output_shape(const Shape& in) const {
  if (in.size() != 4) return in;
  const kernels::ConvShape s{in[0], o_.in, in[2], in[3], o_.out, o_.kernel, o_.kernel, o_.stride, o_.padding,
                             o_.dilation, o_.groups};
  return {in[0], o_.out, s.out_h(), s.out_w()};
}

const Tensor& Conv2d::forward(const Tensor& x) {
  if (x.ndim() != 4 || x.dim(1) != o_.in)
    throw Error("Conv2d " + name() + ": input " + shape_str(x.shape()) + ", expected [N, " + std::to_string(o_.in) +
                ", H, W]");
  shape_ = {x.dim(0), o_.in, x.dim(2), x.dim(3), o_.out, o_.kernel, o_.kernel, o_.stride, o_.padding, o_.dilation,
            o_.groups};
  if (shape_.out_h() <= 0 || shape_.out_w() <= 0)
    throw Error("Conv2d " + name() + ": input " + shape_str(x.shape()) + " is smaller than its dilated kernel");
  // Saved for the weight gradient: the input in the working dtype (the input itself when it already is). The
  // kernel multiplies the 16-bit values exactly and accumulates in FP32 (natively or on the widened values).
  x_saved_ = in_dtype(x, dtype_, x_low_);
  w_saved_ = weight_.weights_for(dtype_);
  const Tensor* b32 = o_.bias ? &in_dtype(bias_.weights_for(dtype_), DType::kFloat32, b32_) : nullptr;
  // In the working dtype: the kernel rounds the FP32 result (bias included) once.
  y_.ensure({shape_.n, o_.out, shape_.out_h(), shape_.out_w()}, dtype_, x.device());
  kernels::conv2d_forward(shape_, x_saved_, w_saved_, b32, y_);
  return y_;
}

const Tensor& Conv2d::backward(const Tensor& dy_in, GradContext& ctx) {
  const Tensor& dy = in_dtype(dy_in, dtype_, dy_low_);
  kernels::conv2d_backward_weights(shape_, x_saved_, dy, weight_.grad, o_.bias ? &bias_.grad : nullptr,
                                   ctx.accumulate);
  if (ctx.on_grad_ready) {
    ctx.on_grad_ready(weight_);
    if (o_.bias) ctx.on_grad_ready(bias_);
  }
  if (!ctx.need_input_grad) return kNone;
  dx_.ensure({shape_.n, shape_.c, shape_.h, shape_.w}, dtype_, dy.device());
  kernels::conv2d_backward_data(shape_, dy, w_saved_, dx_);
  return dx_;
}

// ---- BatchNorm2d -------------------------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(std::string name, int64_t channels, AllReduce allreduce_sum, float eps, float momentum)
    : Module(std::move(name)), channels_(channels), eps_(eps), momentum_(momentum), allreduce_(std::move(allreduce_sum)) {
  if (channels <= 0 || !(eps > 0) || !(momentum >= 0 && momentum <= 1))
    throw Error("BatchNorm2d " + this->name() + ": channels must be positive, eps > 0 and momentum in [0, 1]",
                ErrorKind::kBadInput);
  weight_.name = this->name() + ".weight";
  weight_.shape = {channels};
  weight_.init = ParamInit::kOnes;
  bias_.name = this->name() + ".bias";
  bias_.shape = {channels};
  bias_.init = ParamInit::kZeros;
  weight_.reads_fp32 = bias_.reads_fp32 = true;  // the op is FP32 whatever the working dtype
  running_mean_.name = this->name() + ".running_mean";
  running_mean_.shape = {channels};
  running_mean_.init = 0.0f;
  running_var_.name = this->name() + ".running_var";
  running_var_.shape = {channels};
  running_var_.init = 1.0f;
  tracked_.name = this->name() + ".num_batches_tracked";
  tracked_.shape = {1};
  tracked_.init = 0.0f;
  for (Buffer* b : {&running_mean_, &running_var_, &tracked_}) b->allocate();
}

void BatchNorm2d::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(&weight_);
  out.push_back(&bias_);
}

void BatchNorm2d::collect_buffers(std::vector<Buffer*>& out) {
  out.push_back(&running_mean_);
  out.push_back(&running_var_);
  out.push_back(&tracked_);
}

void BatchNorm2d::place_buffers(Device device) {
  for (Buffer* b : {&running_mean_, &running_var_, &tracked_}) {
    if (b->value.device() == device && b->staged.device() == device) continue;
    if (b->offset >= 0)
      throw Error("BatchNorm2d " + name() + ": its running statistics (bound to the model's buffers) are not on the " +
                  (device == Device::kCUDA ? "GPU" : "CPU") + ", where its input is");
    b->value = b->value.to(device);
    b->staged = b->staged.to(device);
  }
}

void BatchNorm2d::allreduce_sums(int64_t n, bool with_count) {
  const size_t len = static_cast<size_t>(n);
  host_sums_.resize(len + (with_count ? 1 : 0));
  device::read_to_host(host_sums_.data(), sums(), sums_.device(), len * sizeof(double));
  if (with_count) host_sums_[len] = count_;  // this rank's count; the global one after the all-reduce
  allreduce_(std::span<double>(host_sums_));
  device::copy(sums(), sums_.device(), host_sums_.data(), Device::kCPU, len * sizeof(double));
  if (with_count) count_ = host_sums_[len];
}

const Tensor& BatchNorm2d::forward(const Tensor& x_in) {
  if (x_in.ndim() != 4 || x_in.dim(1) != channels_)
    throw Error("BatchNorm2d " + name() + ": input " + shape_str(x_in.shape()) + ", expected [N, " +
                std::to_string(channels_) + ", H, W]");
  // The input as it came (FP32 or the working dtype): the kernels read 16-bit values as FP32, exactly.
  x_saved_ = x_in;
  const Tensor& x = x_saved_;
  const int64_t C = channels_;
  const Device dev = x.device();
  place_buffers(dev);
  mean_.ensure({C}, DType::kFloat32, dev);
  var_.ensure({C}, DType::kFloat32, dev);
  invstd_.ensure({C}, DType::kFloat32, dev);
  if (training_) {
    sums_.ensure({4 * C}, DType::kFloat32, dev);  // 2C doubles
    kernels::batchnorm_sums_to(x, sums());
    count_ = static_cast<double>(x.dim(0) * x.dim(2) * x.dim(3));
    if (allreduce_) allreduce_sums(2 * C, true);
    if (count_ <= 1)
      throw Error("BatchNorm2d " + name() + ": training needs more than one value per channel, got input " +
                  shape_str(x.shape()));
    kernels::batchnorm_statistics(sums(), count_, eps_, momentum_, mean_, var_, invstd_, running_mean_.staged,
                                  running_var_.staged, tracked_.staged);
  } else {
    kernels::batchnorm_running_statistics(running_mean_.value, running_var_.value, eps_, mean_, var_, invstd_);
    count_ = 0;
  }
  y_.ensure(x.shape(), out_dtype_, dev);
  kernels::batchnorm_apply(x, mean_, invstd_, weight_.master, bias_.master, y_, relu_);
  return y_;
}

const Tensor& BatchNorm2d::backward(const Tensor& dy_in, GradContext& ctx) {
  const Tensor& dy = dy_in;  // FP32 or 16-bit, read as FP32
  const int64_t C = channels_;
  const Tensor* relu_y = relu_ ? &y_ : nullptr;
  sums_.ensure({4 * C}, DType::kFloat32, x_saved_.device());
  kernels::batchnorm_backward_sums_to(x_saved_, dy, mean_, invstd_, sums(), relu_y);
  // This rank's share of dgamma = sum dy * xhat and dbeta = sum dy, formed where the sums are and written, or added
  // (a later micro-batch), into the gradient buffer (the gradient reduction sums the ranks').
  kernels::batchnorm_param_grads(sums(), weight_.grad, bias_.grad, ctx.accumulate);
  if (ctx.on_grad_ready) {
    ctx.on_grad_ready(weight_);
    ctx.on_grad_ready(bias_);
  }
  // Synchronised statistics: every rank's dx depends on the global sums (called on every rank alike, so the
  // collective is matched even when this rank's dx is not needed).
  if (allreduce_ && count_ > 0) allreduce_sums(2 * C, false);
  if (!ctx.need_input_grad) return kNone;
  dx_.ensure(x_saved_.shape(), x_saved_.dtype(), x_saved_.device());
  kernels::batchnorm_backward_dx_from(x_saved_, dy, mean_, invstd_, weight_.master, sums(), count_, dx_, relu_y);
  return dx_;
}

// ---- pooling -----------------------------------------------------------------------------------------------------

Pool2d::Pool2d(std::string name, Kind kind, int64_t kernel, int64_t stride, int64_t padding)
    : Module(std::move(name)), kind_(kind) {
  if (kernel <= 0 || stride <= 0 || padding < 0 || 2 * padding > kernel)
    throw Error("Pool2d " + this->name() + ": kernel and stride must be positive and padding in [0, kernel / 2]",
                ErrorKind::kBadInput);
  s_.kernel = kernel;
  s_.stride = stride;
  s_.pad = padding;
}

Shape Pool2d::output_shape(const Shape& in) const {
  if (in.size() != 4) return in;
  kernels::PoolShape s = s_;
  s.h = in[2];
  s.w = in[3];
  return {in[0], in[1], s.out_h(), s.out_w()};
}

const Tensor& Pool2d::forward(const Tensor& x_in) {
  if (x_in.ndim() != 4) throw Error("Pool2d " + name() + ": input " + shape_str(x_in.shape()) + " is not NCHW");
  const Tensor& x = in_dtype(x_in, DType::kFloat32, x_cast_);
  s_.n = x.dim(0);
  s_.c = x.dim(1);
  s_.h = x.dim(2);
  s_.w = x.dim(3);
  if (s_.out_h() <= 0 || s_.out_w() <= 0)
    throw Error("Pool2d " + name() + ": input " + shape_str(x.shape()) + " is smaller than the window");
  y_.ensure({s_.n, s_.c, s_.out_h(), s_.out_w()}, DType::kFloat32, x.device());
  if (kind_ == Kind::kMax) {
    argmax_.ensure({y_.numel()}, DType::kFloat32, x.device());  // int32 indices in 4-byte elements
    kernels::maxpool2d_forward(s_, x, y_, argmax());
  } else {
    kernels::avgpool2d_forward(s_, x, y_);
  }
  return y_;
}

const Tensor& Pool2d::backward(const Tensor& dy_in, GradContext& ctx) {
  if (!ctx.need_input_grad) return kNone;
  const Tensor& dy = in_dtype(dy_in, DType::kFloat32, dy_cast_);
  dx_.ensure({s_.n, s_.c, s_.h, s_.w}, DType::kFloat32, dy.device());
  if (kind_ == Kind::kMax)
    kernels::maxpool2d_backward(s_, dy, argmax(), dx_);
  else
    kernels::avgpool2d_backward(s_, dy, dx_);
  return dx_;
}

const Tensor& GlobalAvgPool2d::forward(const Tensor& x_in) {
  if (x_in.ndim() != 4) throw Error("GlobalAvgPool2d " + name() + ": input " + shape_str(x_in.shape()) + " is not NCHW");
  const Tensor& x = in_dtype(x_in, DType::kFloat32, x_cast_);
  in_shape_ = x.shape();
  y_.ensure({x.dim(0), x.dim(1), 1, 1}, DType::kFloat32, x.device());
  kernels::global_avgpool2d_forward(x, y_);
  return y_;
}

const Tensor& GlobalAvgPool2d::backward(const Tensor& dy_in, GradContext& ctx) {
  if (!ctx.need_input_grad) return kNone;
  const Tensor& dy = in_dtype(dy_in, DType::kFloat32, dy_cast_);
  dx_.ensure(in_shape_, DType::kFloat32, dy.device());
  kernels::global_avgpool2d_backward(dy, dx_);
  return dx_;
}

// ---- views -------------------------------------------------------------------------------------------------------

const Tensor& Flatten::forward(const Tensor& x) {
  in_shape_ = x.shape();
  y_ = Tensor::view(const_cast<void*>(x.data()), {x.dim(0), x.numel() / std::max<int64_t>(x.dim(0), 1)}, x.dtype(),
                    x.device());
  return y_;
}

const Tensor& Flatten::backward(const Tensor& dy, GradContext& ctx) {
  if (!ctx.need_input_grad) return kNone;
  dx_ = Tensor::view(const_cast<void*>(dy.data()), in_shape_, dy.dtype(), dy.device());
  return dx_;
}

const Tensor& ImageView::forward(const Tensor& x) {
  const int64_t per = shape_numel(chw_);
  if (x.ndim() < 1 || x.numel() != x.dim(0) * per)
    throw Error("ImageView " + name() + ": input " + shape_str(x.shape()) + " does not hold images of " +
                shape_str(chw_));
  in_shape_ = x.shape();
  Shape s{x.dim(0)};
  s.insert(s.end(), chw_.begin(), chw_.end());
  y_ = Tensor::view(const_cast<void*>(x.data()), s, x.dtype(), x.device());
  return y_;
}

const Tensor& ImageView::backward(const Tensor& dy, GradContext& ctx) {
  if (!ctx.need_input_grad) return kNone;
  dx_ = Tensor::view(const_cast<void*>(dy.data()), in_shape_, dy.dtype(), dy.device());
  return dx_;
}

// ---- BasicBlock --------------------------------------------------------------------------------------------------

BasicBlock::BasicBlock(std::string name, int64_t in, int64_t out, int64_t stride, const Autocast& autocast,
                       const BatchNorm2d::AllReduce& allreduce_sum, float conv_init_gain)
    : Module(std::move(name)) {
  const std::string& n = this->name();
  auto he = [&](int64_t out_c, int64_t k) {
    // kaiming_normal_(mode="fan_out", nonlinearity="relu") as torchvision, in its uniform form with the same
    // variance: bound = gain * sqrt(3 / fan_out).
    return conv_init_gain > 0 ? conv_init_gain * std::sqrt(3.0f / static_cast<float>(out_c * k * k)) : 0.0f;
  };
  conv1_ = std::make_unique<Conv2d>(n + ".conv1", Conv2d::Options{in, out, 3, stride, 1, 1, 1, false, he(out, 3)},
                                    autocast);
  bn1_ = std::make_unique<BatchNorm2d>(n + ".bn1", out, allreduce_sum);
  conv2_ = std::make_unique<Conv2d>(n + ".conv2", Conv2d::Options{out, out, 3, 1, 1, 1, 1, false, he(out, 3)},
                                    autocast);
  bn1_->fuse_relu(conv2_->compute_dtype());
  bn2_ = std::make_unique<BatchNorm2d>(n + ".bn2", out, allreduce_sum);
  if (stride != 1 || in != out) {
    down_conv_ = std::make_unique<Conv2d>(n + ".downsample.0",
                                          Conv2d::Options{in, out, 1, stride, 0, 1, 1, false, he(out, 1)}, autocast);
    down_bn_ = std::make_unique<BatchNorm2d>(n + ".downsample.1", out, allreduce_sum);
  }
}

void BasicBlock::collect_parameters(std::vector<Parameter*>& out) {
  conv1_->collect_parameters(out);
  bn1_->collect_parameters(out);
  conv2_->collect_parameters(out);
  bn2_->collect_parameters(out);
  if (down_conv_) {
    down_conv_->collect_parameters(out);
    down_bn_->collect_parameters(out);
  }
}

void BasicBlock::collect_buffers(std::vector<Buffer*>& out) {
  bn1_->collect_buffers(out);
  bn2_->collect_buffers(out);
  if (down_bn_) down_bn_->collect_buffers(out);
}

void BasicBlock::set_mode(bool training, int64_t step) {
  bn1_->set_mode(training, step);
  bn2_->set_mode(training, step);
  if (down_bn_) down_bn_->set_mode(training, step);
}

int64_t BasicBlock::activation_bytes(const Shape& in, DType working, bool training) const {
  const int64_t out = shape_numel(output_shape(in)), es = static_cast<int64_t>(dtype_size(working));
  const int64_t branches = down_conv_ ? 2 : 1;
  // Per branch a conv output (working dtype) and a BatchNorm output (FP32), conv2's input, and the FP32 sum.
  int64_t bytes = branches * out * (es + 4) + out * (es + 4) + out * 4;
  if (training) bytes += (branches + 2) * out * 4 + shape_numel(in) * 4;  // BatchNorm and conv input gradients
  return bytes;
}

const Tensor& BasicBlock::forward(const Tensor& x_in) {
  const Tensor& x = in_dtype(x_in, DType::kFloat32, x_cast_);
  const Tensor& h = bn2_->forward(conv2_->forward(bn1_->forward(conv1_->forward(x))));
  const Tensor& s = down_conv_ ? down_bn_->forward(down_conv_->forward(x)) : x;
  y_.ensure(h.shape(), DType::kFloat32, h.device());
  kernels::residual_add(h, s, y_, /*relu=*/true);
  return y_;
}

const Tensor& BasicBlock::backward(const Tensor& dy_in, GradContext& ctx) {
  const Tensor& dy = in_dtype(dy_in, DType::kFloat32, dy_cast_);
  dsum_.ensure(y_.shape(), DType::kFloat32, dy.device());
  kernels::relu_backward(y_, dy, dsum_);
  const bool outer_need = ctx.need_input_grad;
  ctx.need_input_grad = true;
  const Tensor& g = bn2_->backward(dsum_, ctx);
  const Tensor& g2 = conv2_->backward(g, ctx);
  const Tensor& g3 = bn1_->backward(g2, ctx);
  ctx.need_input_grad = outer_need;
  const Tensor& dx_branch = conv1_->backward(g3, ctx);
  const Tensor* ds = &dsum_;
  if (down_conv_) {
    ctx.need_input_grad = true;
    const Tensor& gb = down_bn_->backward(dsum_, ctx);
    ctx.need_input_grad = outer_need;
    ds = &down_conv_->backward(gb, ctx);
  }
  if (!outer_need) return kNone;
  dx_.ensure(dx_branch.shape(), DType::kFloat32, dx_branch.device());
  kernels::residual_add(dx_branch, *ds, dx_, /*relu=*/false);
  return dx_;
}

}  // namespace ampdist
