// kernels/cnn.h's functions: the CPU backend, or the CUDA backend when the op's tensors live on the GPU.
#include "runtime/core/device.h"
#include <climits>
#include <string>

#include "runtime/kernels/cnn_backends.h"

namespace ampdist::kernels {
namespace {
bool dev(const Tensor& t) { return t.device() == Device::kCUDA; }
}  // namespace

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

void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  if (dev(x) || dev(y)) return cuda::conv2d_forward(s, x, w, bias, y);
  cpu::conv2d_forward(s, x, w, bias, y);
}
void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, Tensor& dx) {
  if (dev(dy) || dev(dx)) return cuda::conv2d_backward_data(s, dy, w, dx);
  cpu::conv2d_backward_data(s, dy, w, dx);
}
void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, Tensor& dw, Tensor* dbias,
                             bool accumulate) {
  if (dev(x) || dev(dw)) return cuda::conv2d_backward_weights(s, x, dy, dw, dbias, accumulate);
  cpu::conv2d_backward_weights(s, x, dy, dw, dbias, accumulate);
}
void batchnorm_sums(const Tensor& x, std::span<double> sums) {
  device::note_host_read();  // the sums come back to the host
  if (dev(x)) return cuda::batchnorm_sums(x, sums);
  cpu::batchnorm_sums(x, sums);
}
void batchnorm_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                     const Tensor& beta, Tensor& y, bool relu) {
  if (dev(x) || dev(y)) return cuda::batchnorm_apply(x, mean, invstd, gamma, beta, y, relu);
  cpu::batchnorm_apply(x, mean, invstd, gamma, beta, y, relu);
}
void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                             std::span<double> sums, const Tensor* relu_y) {
  device::note_host_read();
  if (dev(x) || dev(dy)) return cuda::batchnorm_backward_sums(x, dy, mean, invstd, sums, relu_y);
  cpu::batchnorm_backward_sums(x, dy, mean, invstd, sums, relu_y);
}
void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                           const Tensor& gamma, std::span<const double> sums, double count, Tensor& dx,
                           const Tensor* relu_y) {
  if (dev(x) || dev(dx)) return cuda::batchnorm_backward_dx(x, dy, mean, invstd, gamma, sums, count, dx, relu_y);
  cpu::batchnorm_backward_dx(x, dy, mean, invstd, gamma, sums, count, dx, relu_y);
}
void batchnorm_sums_to(const Tensor& x, double* sums) {
  if (dev(x)) return cuda::batchnorm_sums_to(x, sums);
  cpu::batchnorm_sums_to(x, sums);
}
void batchnorm_backward_sums_to(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                double* sums, const Tensor* relu_y) {
  if (dev(x) || dev(dy)) return cuda::batchnorm_backward_sums_to(x, dy, mean, invstd, sums, relu_y);
  cpu::batchnorm_backward_sums_to(x, dy, mean, invstd, sums, relu_y);
}
void batchnorm_backward_dx_from(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                const Tensor& gamma, const double* sums, double count, Tensor& dx,
                                const Tensor* relu_y) {
  if (dev(x) || dev(dx)) return cuda::batchnorm_backward_dx_from(x, dy, mean, invstd, gamma, sums, count, dx, relu_y);
  cpu::batchnorm_backward_dx_from(x, dy, mean, invstd, gamma, sums, count, dx, relu_y);
}
void batchnorm_statistics(const double* sums, double count, float eps, float momentum, Tensor& mean, Tensor& var,
                          Tensor& invstd, Tensor& running_mean, Tensor& running_var, Tensor& tracked) {
  if (dev(mean))
    return cuda::batchnorm_statistics(sums, count, eps, momentum, mean, var, invstd, running_mean, running_var,
                                      tracked);
  cpu::batchnorm_statistics(sums, count, eps, momentum, mean, var, invstd, running_mean, running_var, tracked);
}
void batchnorm_running_statistics(const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& mean,
                                  Tensor& var, Tensor& invstd) {
  if (dev(mean)) return cuda::batchnorm_running_statistics(running_mean, running_var, eps, mean, var, invstd);
  cpu::batchnorm_running_statistics(running_mean, running_var, eps, mean, var, invstd);
}
void batchnorm_param_grads(const double* sums, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  if (dev(dgamma)) return cuda::batchnorm_param_grads(sums, dgamma, dbeta, accumulate);
  cpu::batchnorm_param_grads(sums, dgamma, dbeta, accumulate);
}
void residual_add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  if (dev(a) || dev(y)) return cuda::residual_add(a, b, y, relu);
  cpu::residual_add(a, b, y, relu);
}
void maxpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y, std::span<int32_t> argmax) {
  if (dev(x) || dev(y)) return cuda::maxpool2d_forward(s, x, y, argmax);
  cpu::maxpool2d_forward(s, x, y, argmax);
}
void maxpool2d_backward(const PoolShape& s, const Tensor& dy, std::span<const int32_t> argmax, Tensor& dx) {
  if (dev(dy) || dev(dx)) return cuda::maxpool2d_backward(s, dy, argmax, dx);
  cpu::maxpool2d_backward(s, dy, argmax, dx);
}
void avgpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y) {
  if (dev(x) || dev(y)) return cuda::avgpool2d_forward(s, x, y);
  cpu::avgpool2d_forward(s, x, y);
}
void avgpool2d_backward(const PoolShape& s, const Tensor& dy, Tensor& dx) {
  if (dev(dy) || dev(dx)) return cuda::avgpool2d_backward(s, dy, dx);
  cpu::avgpool2d_backward(s, dy, dx);
}
void global_avgpool2d_forward(const Tensor& x, Tensor& y) {
  if (dev(x) || dev(y)) return cuda::global_avgpool2d_forward(x, y);
  cpu::global_avgpool2d_forward(x, y);
}
void global_avgpool2d_backward(const Tensor& dy, Tensor& dx) {
  if (dev(dy) || dev(dx)) return cuda::global_avgpool2d_backward(dy, dx);
  cpu::global_avgpool2d_backward(dy, dx);
}

}  // namespace ampdist::kernels
