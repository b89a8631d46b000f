// kernels.h's functions: each runs on the CPU backend, or on the CUDA backend when any tensor it is given lives on
// the GPU (the CUDA side then checks that all of them do).
#include "runtime/core/device.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/checks.h"
#include "runtime/kernels/device_ops.h"

namespace ampdist::kernels {
namespace {
bool dev(const Tensor& t) { return t.device() == Device::kCUDA; }
}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  if (dev(src) || dev(dst)) return cuda::cast(src, dst);
  cpu::cast(src, dst);
}
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
          const Tensor* bias) {
  if (dev(a) || dev(b) || dev(c)) return cuda::gemm(a, trans_a, b, trans_b, c, alpha, beta, bias);
  cpu::gemm(a, trans_a, b, trans_b, c, alpha, beta, bias);
}
void sum_rows(const Tensor& x, Tensor& out, float beta) {
  if (dev(x) || dev(out)) return cuda::sum_rows(x, out, beta);
  cpu::sum_rows(x, out, beta);
}
void relu_forward(const Tensor& x, Tensor& y) {
  if (dev(x) || dev(y)) return cuda::relu_forward(x, y);
  cpu::relu_forward(x, y);
}
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (dev(y) || dev(dy) || dev(dx)) return cuda::relu_backward(y, dy, dx);
  cpu::relu_backward(y, dy, dx);
}
void gelu_forward(const Tensor& x, Tensor& y) {
  if (dev(x) || dev(y)) return cuda::gelu_forward(x, y);
  cpu::gelu_forward(x, y);
}
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (dev(x) || dev(dy) || dev(dx)) return cuda::gelu_backward(x, dy, dx);
  cpu::gelu_backward(x, dy, dx);
}
double softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& lse) {
  device::note_host_read();  // the sum comes back to the host
  if (dev(logits)) return cuda::softmax_cross_entropy_forward(logits, targets, lse);
  return cpu::softmax_cross_entropy_forward(logits, targets, lse);
}
void softmax_cross_entropy_backward(const Tensor& logits, std::span<const int32_t> targets, const Tensor& lse,
                                    float grad_scale, Tensor& dlogits) {
  if (dev(logits) || dev(dlogits)) return cuda::softmax_cross_entropy_backward(logits, targets, lse, grad_scale, dlogits);
  cpu::softmax_cross_entropy_backward(logits, targets, lse, grad_scale, dlogits);
}
int64_t count_correct(const Tensor& logits, std::span<const int32_t> targets) {
  device::note_host_read();  // the count comes back to the host
  if (dev(logits)) return cuda::count_correct(logits, targets);
  return cpu::count_correct(logits, targets);
}
void softmax_cross_entropy_forward_to(const Tensor& logits, std::span<const int32_t> targets, Tensor& targets_dev,
                                      Tensor& lse, Tensor& row_loss, double* loss_sum, double divisor) {
  if (dev(logits))
    return gpu::softmax_cross_entropy_forward(logits, targets, targets_dev, lse, row_loss, loss_sum, divisor);
  *loss_sum += cpu::softmax_cross_entropy_forward(logits, targets, lse) / divisor;  // host memory: the step state
}
void softmax_cross_entropy_backward_from(const Tensor& logits, std::span<const int32_t> targets,
                                         const Tensor& targets_dev, const Tensor& lse, const float* scale,
                                         double divisor, float row_divisor, Tensor& dlogits) {
  if (dev(logits) || dev(dlogits))
    return gpu::softmax_cross_entropy_backward(logits, targets_dev, lse, 0.0f, scale, divisor, row_divisor, dlogits);
  const float grad_scale = static_cast<float>(static_cast<double>(*scale) / divisor) / row_divisor;
  cpu::softmax_cross_entropy_backward(logits, targets, lse, grad_scale, dlogits);
}
UnscaleResult unscale_and_check(Tensor& grads, float inv_scale) {
  device::note_host_read();  // the result comes back to the host
  if (dev(grads)) return cuda::unscale_and_check(grads, inv_scale);
  return cpu::unscale_and_check(grads, inv_scale);
}
void unscale_and_check(Tensor& grads, const float* inv_scale, float* found_inf, double* sum_sq) {
  if (dev(grads)) return cuda::unscale_and_check(grads, inv_scale, found_inf, sum_sq);
  cpu::unscale_and_check(grads, inv_scale, found_inf, sum_sq);
}
void check_nonfinite(const Tensor& x, float* bad) {
  if (dev(x)) return cuda::check_nonfinite(x, bad);
  cpu::check_nonfinite(x, bad);
}
void copy_unless(Tensor& dst, const Tensor& src, const int32_t* flag) {
  if (dev(dst) || dev(src)) return cuda::copy_unless(dst, src, flag);
  cpu::copy_unless(dst, src, flag);
}
void zero_if(Tensor& x, const float* flag) {
  if (dev(x)) return cuda::zero_if(x, flag);
  cpu::zero_if(x, flag);
}
AbsStats abs_stats(const Tensor& x, float threshold) {
  device::note_host_read();
  if (dev(x)) return cuda::abs_stats(x, threshold);
  return cpu::abs_stats(x, threshold);
}
void sum_squares(const Tensor& x, double* out) {
  if (dev(x)) return cuda::sum_squares(x, out);
  cpu::sum_squares(x, out);
}
double sum_squares(const Tensor& x) {
  device::note_host_read();
  if (dev(x)) return cuda::sum_squares(x);
  return cpu::sum_squares(x);
}
void scale_inplace(Tensor& x, float factor) {
  if (dev(x)) return cuda::scale_inplace(x, factor);
  cpu::scale_inplace(x, factor);
}
void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdParams& p, const StepGate* gate,
              Tensor* working) {
  check_working_out("sgd_step", params, working);
  if (dev(params) || dev(grads)) return cuda::sgd_step(params, grads, momentum_buf, p, gate, working);
  cpu::sgd_step(params, grads, momentum_buf, p, gate, working);
}
void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const AdamWParams& p,
                const StepGate* gate, Tensor* working) {
  check_working_out("adamw_step", params, working);
  if (dev(params) || dev(grads)) return cuda::adamw_step(params, grads, m, v, p, gate, working);
  cpu::adamw_step(params, grads, m, v, p, gate, working);
}

}  // namespace ampdist::kernels
