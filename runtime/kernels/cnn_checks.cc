#include "runtime/kernels/cnn_checks.h"

#include <climits>
#include <string>

namespace ampdist::kernels {

void ConvShape::validate() const {
  const bool positive = n >= 0 && c > 0 && h > 0 && w > 0 && k > 0 && kh > 0 && kw > 0 && stride > 0 && pad >= 0 &&
                        dilation > 0 && groups > 0 && c % groups == 0 && k % groups == 0;
  bool fits = true;
  for (int64_t v : {n, c, h, w, k, kh, kw, stride, pad, dilation, groups}) fits = fits && v <= INT_MAX;
  if (!positive || !fits || out_h() <= 0 || out_w() <= 0)
    throw Error("conv2d: invalid shape: input [" + std::to_string(n) + ", " + std::to_string(c) + ", " +
                std::to_string(h) + ", " + std::to_string(w) + "], " + std::to_string(k) + " filters of " +
                std::to_string(kh) + "x" + std::to_string(kw) + ", stride " + std::to_string(stride) + ", padding " +
                std::to_string(pad) + ", dilation " + std::to_string(dilation) + ", groups " +
                std::to_string(groups));
}

namespace checks {
namespace {

void require_numel(const char* op, const char* what, const Tensor& t, int64_t n, Device device) {
  require_on(op, what, t, device);
  if (t.numel() != n)
    throw Error(std::string(op) + ": " + what + " has " + std::to_string(t.numel()) + " elements, expected " +
                std::to_string(n));
}
// An operand of `want`, the dtype the convolution's operands share.
void require_operand(const char* op, const char* what, const Tensor& t, DType want, int64_t n, Device device) {
  require_numel(op, what, t, n, device);
  if (t.dtype() != want)
    throw Error(std::string(op) + ": " + what + " is " + dtype_name(t.dtype()) + ", expected " + dtype_name(want) +
                " (the operands of one convolution share a dtype)");
}
// An output: FP32, or the operands' 16-bit dtype (rounded once from the FP32 result).
void require_output(const char* op, const char* what, const Tensor& t, DType in, int64_t n, Device device) {
  require_numel(op, what, t, n, device);
  if (t.dtype() != DType::kFloat32 && t.dtype() != in)
    throw Error(std::string(op) + ": " + what + " must be fp32 or " + dtype_name(in) + ", got " +
                dtype_name(t.dtype()));
}
void require_fp32_numel(const char* op, const char* what, const Tensor& t, int64_t n, Device device) {
  require_numel(op, what, t, n, device);
  require_fp32(op, what, t);
}
int64_t x_numel(const ConvShape& s) { return s.n * s.c * s.h * s.w; }
int64_t y_numel(const ConvShape& s) { return s.n * s.k * s.out_h() * s.out_w(); }
int64_t w_numel(const ConvShape& s) { return s.k * (s.c / s.groups) * s.kh * s.kw; }

}  // namespace

void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                    Device device) {
  const char* op = "conv2d";
  s.validate();
  require_operand(op, "x", x, x.dtype(), x_numel(s), device);
  require_operand(op, "weight", w, x.dtype(), w_numel(s), device);
  require_output(op, "y", y, x.dtype(), y_numel(s), device);
  if (bias) require_fp32_numel(op, "bias", *bias, s.k, device);
}

void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, const Tensor& dx, Device device) {
  const char* op = "conv2d backward";
  s.validate();
  require_operand(op, "dy", dy, dy.dtype(), y_numel(s), device);
  require_operand(op, "weight", w, dy.dtype(), w_numel(s), device);
  require_output(op, "dx", dx, dy.dtype(), x_numel(s), device);
}

void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, const Tensor& dw,
                             const Tensor* dbias, Device device) {
  const char* op = "conv2d weight gradient";
  s.validate();
  require_operand(op, "x", x, x.dtype(), x_numel(s), device);
  require_operand(op, "dy", dy, x.dtype(), y_numel(s), device);
  require_fp32_numel(op, "dw", dw, w_numel(s), device);
  if (dbias) require_fp32_numel(op, "dbias", *dbias, s.k, device);
}

void batchnorm_channels(const char* op, int64_t c, std::initializer_list<const Tensor*> tensors, Device device) {
  for (const Tensor* t : tensors)
    if (t->device() != device || t->dtype() != DType::kFloat32 || t->numel() != c)
      throw Error(std::string(op) + ": per-channel tensors must be FP32 [" + std::to_string(c) + "] on the " +
                  (device == Device::kCUDA ? "GPU" : "CPU") + ", got " + shape_str(t->shape()) + " " +
                  dtype_name(t->dtype()));
}

Nchw batchnorm(const char* op, const Tensor& x, std::initializer_list<const Tensor*> like_x,
               std::initializer_list<const Tensor*> per_channel, int64_t sums, Device device) {
  require_on(op, "x", x, device);
  if (x.ndim() != 4) throw Error(std::string(op) + ": x " + shape_str(x.shape()) + " is not [N, C, H, W]");
  const Nchw d{x.dim(0), x.dim(1), x.dim(2) * x.dim(3)};
  for (const Tensor* t : like_x)
    if (t) require_numel(op, "a tensor shaped as x", *t, x.numel(), device);
  for (const Tensor* t : per_channel) require_fp32_numel(op, "a per-channel tensor", *t, d.c, device);
  if (sums >= 0 && sums != 2 * d.c)
    throw Error(std::string(op) + ": sums must hold 2C = " + std::to_string(2 * d.c) + " doubles, got " +
                std::to_string(sums));
  return d;
}

void residual_add(const Tensor& a, const Tensor& b, const Tensor& y, Device device) {
  const char* op = "residual_add";
  require_on(op, "y", y, device);
  require_fp32(op, "y", y);
  require_numel(op, "a", a, y.numel(), device);
  require_numel(op, "b", b, y.numel(), device);
}

void pool(const char* op, const PoolShape& s, const Tensor& in, const Tensor& out, int64_t argmax, Device device) {
  if (s.kernel <= 0 || s.stride <= 0 || s.pad < 0 || 2 * s.pad > s.kernel || s.out_h() <= 0 || s.out_w() <= 0)
    throw Error(std::string(op) + ": kernel " + std::to_string(s.kernel) + ", stride " + std::to_string(s.stride) +
                ", padding " + std::to_string(s.pad) + " do not fit a " + std::to_string(s.h) + "x" +
                std::to_string(s.w) + " input (padding at most half the kernel)");
  require_fp32_numel(op, "input", in, s.n * s.c * s.h * s.w, device);
  require_fp32_numel(op, "output", out, s.n * s.c * s.out_h() * s.out_w(), device);
  if (argmax >= 0 && argmax != out.numel())
    throw Error(std::string(op) + ": argmax must hold one index per output");
}

int64_t global_avgpool(const char* op, const Tensor& planes, const Tensor& means, Device device) {
  require_on(op, "the [N, C, H, W] tensor", planes, device);
  require_fp32(op, "the [N, C, H, W] tensor", planes);
  if (planes.ndim() != 4) throw Error(std::string(op) + ": " + shape_str(planes.shape()) + " is not [N, C, H, W]");
  require_fp32_numel(op, "the per-plane tensor", means, planes.dim(0) * planes.dim(1), device);
  return planes.dim(2) * planes.dim(3);
}

}  // namespace checks
}  // namespace ampdist::kernels
