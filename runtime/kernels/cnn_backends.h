// The CPU and CUDA implementations behind kernels/cnn.h (kernels/cpu/cnn_kernels.cc, kernels/cuda/cuda_cnn_ops.cc);
// kernels/cnn_dispatch.cc picks one by the tensors' device. Internal to the kernels.
#pragma once

#include "runtime/kernels/cnn.h"

#define AMPDIST_CNN_DECLS                                                                                          \
  void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);        \
  void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, Tensor& dx);                    \
  void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, Tensor& dw, Tensor* dbias,   \
                               bool accumulate);                                                                   \
  void batchnorm_sums(const Tensor& x, std::span<double> sums);                                                    \
  void batchnorm_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,              \
                       const Tensor& beta, Tensor& y, bool relu);                                                  \
  void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,         \
                               std::span<double> sums, const Tensor* relu_y);                                      \
  void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,           \
                             const Tensor& gamma, std::span<const double> sums, double count, Tensor& dx,          \
                             const Tensor* relu_y);                                                                \
  void batchnorm_sums_to(const Tensor& x, double* sums);                                                           \
  void batchnorm_backward_sums_to(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,     \
                                  double* sums, const Tensor* relu_y);                                             \
  void batchnorm_backward_dx_from(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,     \
                                  const Tensor& gamma, const double* sums, double count, Tensor& dx,               \
                                  const Tensor* relu_y);                                                           \
  void batchnorm_statistics(const double* sums, double count, float eps, float momentum, Tensor& mean,             \
                            Tensor& var, Tensor& invstd, Tensor& running_mean, Tensor& running_var,                \
                            Tensor& tracked);                                                                      \
  void batchnorm_running_statistics(const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& mean, \
                                    Tensor& var, Tensor& invstd);                                                  \
  void batchnorm_param_grads(const double* sums, Tensor& dgamma, Tensor& dbeta, bool accumulate);                  \
  void residual_add(const Tensor& a, const Tensor& b, Tensor& y, bool relu);                                       \
  void maxpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y, std::span<int32_t> argmax);              \
  void maxpool2d_backward(const PoolShape& s, const Tensor& dy, std::span<const int32_t> argmax, Tensor& dx);      \
  void avgpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y);                                          \
  void avgpool2d_backward(const PoolShape& s, const Tensor& dy, Tensor& dx);                                       \
  void global_avgpool2d_forward(const Tensor& x, Tensor& y);                                                       \
  void global_avgpool2d_backward(const Tensor& dy, Tensor& dx);

namespace ampdist::kernels::cpu {
AMPDIST_CNN_DECLS
}  // namespace ampdist::kernels::cpu

namespace ampdist::kernels::cuda {
AMPDIST_CNN_DECLS
}  // namespace ampdist::kernels::cuda
