// Convolutional layers: Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d, GlobalAvgPool2d, Flatten, ImageView and the
// residual BasicBlock of ResNet (He et al. 2016). Tensors are NCHW: [N, C, H, W] row-major, on the CPU or the GPU
// (the kernels in runtime/kernels/cnn.h; on the GPU cuDNN's convolutions, which a build may lack:
// kernels::gpu_convolutions()).
//
// Autocast:
//   conv2d (working dtype): the input and the weights are in the working dtype (cast at the boundary), products and
//     sums are FP32 (oneDNN's FP32 convolution over the exactly converted fp16/bf16 values) and the output is
//     rounded once to the working dtype; weight and bias gradients are FP32 into the gradient buffer; dx is rounded
//     once to the working dtype. Input and gradient tensors of any dtype are accepted.
//   batch_norm (FP32): statistics (sums in double), normalisation, the affine transform and the running statistics
//     are FP32; gamma and beta are read from the FP32 master weights (reads_fp32); the output is FP32.
//   pooling, flatten, residual add: FP32 (their inputs here are FP32 BatchNorm/ReLU outputs; others are converted).
#pragma once

#include <functional>
#include <span>

#include "runtime/kernels/cnn.h"
#include "runtime/nn/module.h"

namespace ampdist {

// torch.nn.Conv2d(in, out, kernel, stride, padding, dilation, groups, bias). Weight [out, in/groups, k, k], bias
// [out]. Initialisation U(-b, b) for both; b defaults to PyTorch's 1/sqrt(fan_in), fan_in = in/groups * k * k
// (kaiming_uniform with a = sqrt(5)); init_bound > 0 overrides it for the weight (ResNet's He initialisation).
class Conv2d : public Module {
 public:
  struct Options {
    int64_t in = 0, out = 0, kernel = 3, stride = 1, padding = 0, dilation = 1, groups = 1;
    bool bias = true;
    float init_bound = 0.0f;
  };
  Conv2d(std::string name, const Options& o, const Autocast& autocast);
  Parameter& weight() { return weight_; }
  Parameter* bias() { return o_.bias ? &bias_ : nullptr; }
  // The dtype the convolution multiplies in (autocast's choice for this layer): its output's and its dx's dtype.
  DType compute_dtype() const { return dtype_; }
  // x: [N, in, H, W] any dtype -> [N, out, OH, OW] in the compute dtype.
  void collect_parameters(std::vector<Parameter*>& out) override;
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override;

 private:
  Options o_;
  DType dtype_;
  Parameter weight_, bias_;
  kernels::ConvShape shape_;
  Tensor x_low_, b32_, y_, dy_low_, dx_;
  Tensor x_saved_, w_saved_;  // what the backward reads: views of the inputs or of the buffers above
};

// torch.nn.BatchNorm2d(C, eps=1e-5, momentum=0.1): gamma (weight, ones) and beta (bias, zeros) of [C]; buffers
// running_mean (zeros), running_var (ones) [C] and num_batches_tracked [1] (a count kept as an FP32 value, exact to
// 2^24 steps; exported as int64). Training: batch statistics over N, H, W (biased variance for the normalisation,
// unbiased for running_var, as PyTorch), running = (1 - momentum) * running + momentum * batch, into the staged
// buffers. Evaluation: the committed running statistics.
// Synchronised (SyncBatchNorm): `allreduce_sum` sums doubles over the ranks in place; the statistics are then those
// of the global batch (sums and sums of squares all-reduced in the forward, the two gradient sums in the
// backward), and gamma/beta gradients stay this rank's share (the gradient reduction sums them).
// Where it runs: the sums, the statistics and the running statistics stay on the input's device (kernels/cnn.h's
// batchnorm_*_to / batchnorm_statistics), so an unsynchronised BatchNorm reads nothing back to the host in a
// training step. A synchronised one takes its sums through the host for the all-reduce (`allreduce_sum` is a host
// collective): two host reads per layer per micro-batch (device::note_host_read counts them).
class BatchNorm2d : public Module {
 public:
  using AllReduce = std::function<void(std::span<double>)>;
  BatchNorm2d(std::string name, int64_t channels, AllReduce allreduce_sum = {}, float eps = 1e-5f,
              float momentum = 0.1f);
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }
  Buffer& running_mean() { return running_mean_; }
  Buffer& running_var() { return running_var_; }
  Buffer& num_batches_tracked() { return tracked_; }
  // The statistics of the last training forward (FP32 [C]): the batch mean and biased variance.
  const Tensor& batch_mean() const { return mean_; }
  const Tensor& batch_var() const { return var_; }
  // The input of the last forward (valid until the next one).
  const Tensor& last_input() const { return x_saved_; }
  // Fuses the ReLU that follows this BatchNorm into it (torch's bn -> relu): the output is math::relu of the FP32
  // normalisation, written in `out` (FP32, or the next convolution's 16-bit dtype: rounded once, bitwise what a
  // cast of the FP32 result gives), and the backward passes dy only where that output is > 0. Call before the
  // first forward.
  void fuse_relu(DType out) {
    relu_ = true;
    out_dtype_ = out;
  }

  void collect_parameters(std::vector<Parameter*>& out) override;
  void collect_buffers(std::vector<Buffer*>& out) override;
  void set_mode(bool training, int64_t) override { training_ = training; }
  // x: [N, C, H, W] any dtype -> FP32 (or fuse_relu's dtype). Throws Error when a training batch has one value per
  // channel.
  const Tensor& forward(const Tensor& x) override;
  // dy: any dtype -> dx in x's dtype (the gradient of a 16-bit input is 16-bit, rounded once from the FP32 result,
  // which is what the convolution before it multiplies in).
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;

 private:
  bool relu_ = false;
  DType out_dtype_ = DType::kFloat32;
  int64_t channels_;
  float eps_, momentum_;
  AllReduce allreduce_;
  bool training_ = true;
  Parameter weight_, bias_;
  Buffer running_mean_, running_var_, tracked_;
  Tensor x_saved_, y_, mean_, var_, invstd_, dx_;
  // 2C doubles on the input's device: the forward's or the backward's per-channel sums, so that the statistics are
  // formed where the step runs and the step reads nothing back.
  Tensor sums_;
  double* sums() { return static_cast<double*>(sums_.data()); }
  std::vector<double> host_sums_;  // a synchronised BatchNorm's sums on their way through the all-reduce
  double count_ = 0;  // elements per channel of the last training forward (global when synchronised)
  // The running statistics on the input's device: a layer used on its own moves its buffers there; bound to
  // ModelBuffers they are already there (else Error).
  void place_buffers(Device device);
  // Synchronised: sums_'s first n doubles (and the count at n when with_count) through the host all-reduce.
  void allreduce_sums(int64_t n, bool with_count);
};

// torch.nn.MaxPool2d(kernel, stride, padding) / AvgPool2d(kernel, stride, padding) (count_include_pad), FP32.
class Pool2d : public Module {
 public:
  enum class Kind { kMax, kAvg };
  Pool2d(std::string name, Kind kind, int64_t kernel, int64_t stride, int64_t padding);
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override;

 private:
  Kind kind_;
  kernels::PoolShape s_;
  Tensor x_cast_, y_, dy_cast_, dx_;
  Tensor argmax_;  // max-pooling's int32 argmax, in a 4-byte tensor on the input's device
  std::span<int32_t> argmax() { return {static_cast<int32_t*>(argmax_.data()), static_cast<size_t>(argmax_.numel())}; }
};

// torch.nn.AdaptiveAvgPool2d((1, 1)): [N, C, H, W] -> [N, C, 1, 1], the mean over H, W in FP32.
class GlobalAvgPool2d : public Module {
 public:
  explicit GlobalAvgPool2d(std::string name) : Module(std::move(name)) {}
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override {
    return in.size() == 4 ? Shape{in[0], in[1], 1, 1} : in;
  }

 private:
  Shape in_shape_;
  Tensor x_cast_, y_, dy_cast_, dx_;
};

// torch.flatten(x, 1): [N, ...] -> [N, prod(...)], a view (no copy, the dtype kept); backward views dy back.
class Flatten : public Module {
 public:
  explicit Flatten(std::string name) : Module(std::move(name)) {}
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override {
    return in.empty() ? in : Shape{in[0], in[0] ? shape_numel(in) / in[0] : 0};
  }
  int64_t activation_bytes(const Shape&, DType, bool) const override { return 0; }  // views

 private:
  Shape in_shape_;
  Tensor y_, dx_;
};

// The loader's image batch [N, C*H*W] viewed as [N, C, H, W] (no copy): the first op of a CNN.
class ImageView : public Module {
 public:
  ImageView(std::string name, Shape chw) : Module(std::move(name)), chw_(std::move(chw)) {}
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override {
    return in.empty() ? in : Shape{in[0], chw_.at(0), chw_.at(1), chw_.at(2)};
  }
  int64_t activation_bytes(const Shape&, DType, bool) const override { return 0; }  // views

 private:
  Shape chw_;
  Shape in_shape_;
  Tensor y_, dx_;
};

// ResNet's BasicBlock (torchvision.models.resnet.BasicBlock): y = relu(bn2(conv2(relu(bn1(conv1(x))))) + s(x)),
// s = downsample (1x1 conv with the block's stride, no bias, then BatchNorm) when the stride or the width changes,
// else the identity. 3x3 convolutions without bias. Parameters in torchvision's order and names under `name`
// ("layer1.0.conv1.weight", ..., "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight"). The residual
// add and the final ReLU are FP32, one pass (kernels::residual_add). bn1 carries the ReLU after it and writes in
// conv2's dtype (BatchNorm2d::fuse_relu): the values conv2 multiplies are bitwise those of the separate ops.
class BasicBlock : public Module {
 public:
  BasicBlock(std::string name, int64_t in, int64_t out, int64_t stride, const Autocast& autocast,
             const BatchNorm2d::AllReduce& allreduce_sum, float conv_init_gain);
  void collect_parameters(std::vector<Parameter*>& out) override;
  void collect_buffers(std::vector<Buffer*>& out) override;
  void set_mode(bool training, int64_t step) override;
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override { return conv1_->output_shape(in); }
  // conv1, bn1, conv2, bn2 (FP32), the downsample's conv and BatchNorm and the FP32 sum; the backward's gradients.
  int64_t activation_bytes(const Shape& in, DType working, bool training) const override;

 private:
  std::unique_ptr<Conv2d> conv1_, conv2_, down_conv_;
  std::unique_ptr<BatchNorm2d> bn1_, bn2_, down_bn_;
  Tensor x_cast_, y_, dy_cast_, dsum_, dx_;
};

}  // namespace ampdist
