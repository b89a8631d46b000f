// Modules: layers with an explicit forward and backward, and the parameters they own.
//
// A Module owns its activation buffers (sized on the first call, reused after), not its parameter storage:
// MasterWeights lays every Parameter out in flat buffers and points its views there. The gradient of each
// parameter is FP32 (a view into the flat gradient buffer), written by the GEMM that computes it.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/flat_layout.h"
#include "runtime/core/tensor.h"

namespace ampdist {

enum class ParamInit {
  kZeros,
  kUniform,  // U(-init_bound, init_bound)
  kOnes,     // every element 1 (LayerNorm gains)
};

struct Parameter {
  std::string name;  // "fc1.weight"
  Shape shape;
  ParamInit init = ParamInit::kUniform;
  float init_bound = 0.0f;
  // An FP32 op reads this parameter (LayerNorm, an embedding gather, a layer forced to FP32): with sharded master
  // weights and a 16-bit working copy it then gets a full FP32 copy. Set by the layer that owns it.
  bool reads_fp32 = false;

  // Set by bind_parameters:
  int index = -1;       // registration order (the parameter's index in the flat layout)
  int64_t offset = -1;  // element offset in the flat buffers
  Tensor master;        // the full FP32 values an FP32 op reads (MasterWeights::fp32_view: the master, unsharded)
  Tensor working;       // view into the working copy (the master buffer itself in an unsharded FP32 run)
  Tensor grad;          // FP32 view into the gradient buffer

  int64_t numel() const { return shape_numel(shape); }
  // The copy an op computing in `dtype` reads: the working copy, or the FP32 values for an FP32 op. Throws Error when
  // a sharded 16-bit run has no FP32 copy of this parameter (its layer did not set reads_fp32).
  const Tensor& weights_for(DType dtype) const {
    if (dtype != DType::kFloat32) return working;
    if (!master.data() && numel() > 0)
      throw Error(name + ": read in FP32, but it has no FP32 copy with sharded master weights (reads_fp32 unset)");
    return master;
  }
};

// The flat layout of `params` in registration order (names, shapes, back-to-back offsets).
FlatLayout flat_layout(std::span<Parameter* const> params);
// Master weights for `params`: the flat buffers on `device` (this rank's slice of the master weights when `slice`
// shards them), each parameter's index, offset and master / working / grad views pointing into them, and the master
// weights filled from each parameter's init rule with the counter-based RNG keyed by (seed, parameter index),
// identical on every rank without a broadcast (drawn on the host, then copied to the device), then cast to the
// working copy. Parameters must outlive the result.
std::unique_ptr<MasterWeights> bind_parameters(std::span<Parameter* const> params, DType working_dtype,
                                               Device device, uint64_t seed, MasterSlice slice = {});
// Fills the master weights of bound parameters from their init rules again (as bind_parameters does).
void initialize_parameters(std::span<Parameter* const> params, MasterWeights& masters, uint64_t seed);

// A model buffer: state a layer keeps that is neither a parameter nor an activation (BatchNorm's running_mean,
// running_var, num_batches_tracked). Not optimized and without a gradient; FP32 whatever the working dtype; part of
// the checkpoint, the cross-rank weights hash and the export. Two copies: `value`, the committed state that
// evaluation reads and checkpoints save, and `staged`, which a training forward updates; the trainer starts every
// step with staged = value and commits staged -> value only when the step is applied (a skipped step, whose forward
// may have produced inf or NaN, leaves value bitwise unchanged).
struct Buffer {
  std::string name;  // "bn1.running_mean"
  Shape shape;
  float init = 0.0f;  // every element's initial value (running_var: 1)
  // Set by the layer (its own storage) and re-pointed by ModelBuffers::bind into the flat buffers:
  Tensor value, staged;
  int64_t offset = -1;  // element offset in ModelBuffers' flat space
  int64_t numel() const { return shape_numel(shape); }
  // Allocates the layer's own storage filled with `init` (a layer used without a ModelBuffers).
  void allocate();
};

// Every buffer of a model in two flat FP32 buffers (committed and staged) on the model's device (host memory on the
// CPU, device memory on the GPU), laid out back to back in registration order: one copy per step start, one
// conditional copy per step end, one broadcast to keep ranks identical, all where the step runs.
class ModelBuffers {
 public:
  // Re-points every buffer's value and staged into the flat buffers on `device`, keeping their current values.
  explicit ModelBuffers(std::span<Buffer* const> buffers, Device device = Device::kCPU);
  const FlatLayout& layout() const { return layout_; }
  int64_t numel() const { return layout_.numel(); }
  Device device() const { return committed_.device(); }
  // The committed values, [numel] FP32 on device().
  Tensor& values() { return committed_; }
  const Tensor& values() const { return committed_; }
  // A host copy of the committed values (on the GPU a read that waits for the queued steps: for checkpoints and
  // hashes), and their replacement from the host (a load).
  std::vector<float> host_values() const;
  void set_host_values(std::span<const float> values);
  // staged = committed (the start of a training step).
  void begin_step();
  // committed = staged (an applied step).
  void commit();
  // committed = staged unless *agreed_found_inf != 0, read where the buffers live (the step state's agreed flag):
  // only an applied step commits, and the host never needs the flag.
  void commit_unless(const int32_t* agreed_found_inf);

 private:
  FlatLayout layout_;
  Tensor committed_, staged_;
};

// What backward() needs to know beyond dy.
struct GradContext {
  // false on the first micro-batch of a step: parameter gradients are written (beta = 0), not added.
  bool accumulate = false;
  // false for the first layer of a model: nobody needs dx.
  bool need_input_grad = true;
  // Called once a parameter's gradient for this micro-batch is complete (the reducer launches buckets from it).
  std::function<void(Parameter&)> on_grad_ready;
};

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }

  // Appends this module's parameters (and its children's) in a fixed order.
  virtual void collect_parameters(std::vector<Parameter*>& out) {}
  // Appends this module's buffers (and its children's) in a fixed order.
  virtual void collect_buffers(std::vector<Buffer*>& out) {}
  // x: [B, in] of any dtype. Returns the output [B, out], owned by the module and valid until the next forward.
  virtual const Tensor& forward(const Tensor& x) = 0;
  // dy: gradient of the last forward's output, [B, out]. Writes or adds (ctx.accumulate) parameter gradients,
  // calls ctx.on_grad_ready for each, and returns dx [B, in] (owned by the module), or an empty tensor when
  // !ctx.need_input_grad.
  virtual const Tensor& backward(const Tensor& dy, GradContext& ctx) = 0;
  // Training (dropout on) for optimizer iteration `step` (1-based), or evaluation/inference (training = false).
  // Called by the Trainer before each step and each evaluation; modules without dropout ignore it.
  virtual void set_mode(bool training, int64_t step) {}
  // Whether forward() reads its input on the host (token ids that the model turns into lookups) rather than as a
  // tensor on the parameters' device. The CUDA step copies inputs to the GPU only for models that return false.
  virtual bool takes_host_input() const { return false; }

  // Buffers handed between layers of the same type and shape, so that a model whose layers run one at a time holds
  // one layer's buffers at a time, allocated once, instead of one set per layer (GptModel's blocks): this module's
  // buffers go to `next` and next's come here. backward_only: only what backward() writes (input gradients, casts
  // of dy), once the caller is done with what backward() returned; otherwise everything, the forward's too (this
  // module's backward() then needs a new forward() first). Throws Error when `next` is another type of layer.
  virtual void pass_buffers_to(Module& next, bool backward_only) {}

  // For the memory estimate (runtime/train/memory_estimate.h), without running anything or allocating. The shape
  // forward() returns for an input of shape `in` (batch first). Default: `in` (an element-wise layer).
  virtual Shape output_shape(const Shape& in) const { return in; }
  // Bytes of the buffers this module keeps for an input of shape `in` in a run whose working dtype is `working`:
  // what its forward keeps (its output, what the backward reads) and, when `training`, its backward's buffers (the
  // input gradient and casts). Default: the output and, when training, the input gradient, both of the working
  // dtype's size.
  virtual int64_t activation_bytes(const Shape& in, DType working, bool training) const {
    const int64_t es = static_cast<int64_t>(dtype_size(working));
    return shape_numel(output_shape(in)) * es + (training ? shape_numel(in) * es : 0);
  }

 private:
  std::string name_;
};

// Modules applied in order. Layers read the Autocast only while they are constructed.
class Sequential : public Module {
 public:
  explicit Sequential(std::string name) : Module(std::move(name)) {}
  Module& add(std::unique_ptr<Module> m);
  size_t size() const { return layers_.size(); }
  Module& at(size_t i) { return *layers_.at(i); }

  void collect_parameters(std::vector<Parameter*>& out) override;
  void collect_buffers(std::vector<Buffer*>& out) override;
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  void set_mode(bool training, int64_t step) override;
  Shape output_shape(const Shape& in) const override;
  int64_t activation_bytes(const Shape& in, DType working, bool training) const override;  // the layers' sum

  // Called after each layer's forward with (layer index, the layer, its output), for observability: the numerics
  // report reads the output, a fault drill may write one element of it. Empty (the default) costs one test per
  // layer.
  std::function<void(size_t, Module&, Tensor&)> forward_observer;

 private:
  std::vector<std::unique_ptr<Module>> layers_;
  int64_t first_trainable_ = -1;  // index of the first layer with parameters (-1: not yet computed)
  Tensor identity_;
};

// y = x W^T + b. W: [out, in], b: [out]. PyTorch's nn.Linear initialisation: U(-1/sqrt(in), 1/sqrt(in)) for both.
// Runs in autocast's dtype for "linear" (the working dtype unless forced to FP32): the input is cast to it, the
// GEMM accumulates in FP32 and rounds once; weight and bias gradients go straight to their FP32 buffers.
class Linear : public Module {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, bool bias, const Autocast& autocast);
  Parameter& weight() { return weight_; }
  Parameter* bias() { return has_bias_ ? &bias_ : nullptr; }
  DType compute_dtype() const { return dtype_; }

  void collect_parameters(std::vector<Parameter*>& out) override;
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  Shape output_shape(const Shape& in) const override { return {in.empty() ? 0 : in[0], out_}; }
  void pass_buffers_to(Module& next, bool backward_only) override;
  // The output buffer alone, once the caller has consumed it (a residual branch added into the stream), to the
  // same layer of another block.
  void pass_output_to(Linear& next) { std::swap(y_, next.y_); }
  // The output of the last forward().
  const Tensor& output() const { return y_; }
  // What backward() reads as the input of the last forward(), set again to `x` (the same values: a recomputed
  // input; cast to the compute dtype as forward() does).
  void resave_input(const Tensor& x);

 private:
  int64_t in_, out_;
  bool has_bias_;
  DType dtype_;
  Parameter weight_, bias_;
  Tensor x_cast_, x_saved_, y_, dy_cast_, dx_;
};

// Element-wise activation. Keeps its input's dtype (autocast "keep input") unless forced to FP32.
class Activation : public Module {
 public:
  enum class Kind { kReLU, kGELU };
  Activation(std::string name, Kind kind, const Autocast& autocast);

  const Tensor& forward(const Tensor& x) override;
  // forward() writing its output into the caller's `y` (made the right shape and dtype) instead of a buffer of
  // this layer's: a model may hand several layers one output buffer and recompute each layer's output into it
  // when its consumer's backward needs it again (GptModel, model.gpt.recompute: POINTWISE).
  void forward_into(const Tensor& x, Tensor& y);
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  void pass_buffers_to(Module& next, bool backward_only) override;

 private:
  Kind kind_;
  bool forced_fp32_;  // autocast override for this layer or op kind; otherwise the input's dtype is kept
  Tensor x_cast_, saved_, y_, dy_cast_, dx_;
};

// A loss over a batch. forward returns the SUM of per-sample losses (FP32 arithmetic); the trainer divides by the
// global sample count of the optimizer step. backward(grad_scale) returns d(grad_scale * sum)/d(input) in the
// input's dtype, or an empty tensor when the model forms that gradient itself from what the criterion binds to it
// (LanguageModelLoss: the GPT's head takes each chunk's dlogits from it; see runtime/nn/gpt.h).
class Criterion {
 public:
  virtual ~Criterion() = default;
  virtual double forward(const Tensor& output, std::span<const int32_t> targets) = 0;
  virtual const Tensor& backward(float grad_scale) = 0;
  // Samples of the last forward whose prediction matched the target (classification only; 0 otherwise).
  virtual int64_t correct() const { return 0; }

  // The training step's state path: when set, forward ADDS its loss sum to *loss_sum and returns 0, and backward
  // ignores its argument and uses float(*scale / divisor), both pointers into the step state on the outputs' device
  // (host memory on the CPU, device memory on the GPU), so on the GPU the step never waits for a value; the trainer
  // reads the sum when it reads the step state. Null (the default): forward returns the sum (synchronising on a
  // device). Whether a criterion implements that path: the trainer reads the scale on the host (on the GPU one small
  // synchronisation per step) and adds the returned loss itself for criteria that do not.
  virtual bool supports_device_step() const { return false; }
  void set_device_step(double* loss_sum, const float* scale, double divisor) {
    device_loss_sum_ = loss_sum;
    device_scale_ = scale;
    device_divisor_ = divisor;
  }

 protected:
  double* device_loss_sum_ = nullptr;
  const float* device_scale_ = nullptr;
  double device_divisor_ = 1.0;
};

// Softmax cross-entropy over classes, in FP32 whatever the logits' dtype (autocast "cross_entropy").
class SoftmaxCrossEntropy : public Criterion {
 public:
  double forward(const Tensor& logits, std::span<const int32_t> targets) override;
  const Tensor& backward(float grad_scale) override;
  // Counted on request (evaluation), not in every training step's forward.
  int64_t correct() const override;
  bool supports_device_step() const override { return true; }

 private:
  Tensor logits_, lse_, dlogits_, targets_dev_, row_loss_;
  std::vector<int32_t> targets_;
};

}  // namespace ampdist
