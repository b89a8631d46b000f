// The two implementations behind kernels.h: cpu:: (kernels/cpu/) and cuda:: over Tensors (kernels/cuda/).
// kernels/dispatch.cc picks one by the tensors' device; the contracts are kernels.h's. Internal to the kernels.
#pragma once

#include "runtime/kernels/kernels.h"

#define AMPDIST_KERNEL_DECLS                                                                                      \
  void cast(const Tensor& src, Tensor& dst);                                                                      \
  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,     \
            const Tensor* bias);                                                                                  \
  void sum_rows(const Tensor& x, Tensor& out, float beta);                                                        \
  void relu_forward(const Tensor& x, Tensor& y);                                                                  \
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);                                              \
  void gelu_forward(const Tensor& x, Tensor& y);                                                                  \
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);                                              \
  double softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& lse);      \
  void softmax_cross_entropy_backward(const Tensor& logits, std::span<const int32_t> targets, const Tensor& lse,  \
                                      float grad_scale, Tensor& dlogits);                                         \
  int64_t count_correct(const Tensor& logits, std::span<const int32_t> targets);                                  \
  UnscaleResult unscale_and_check(Tensor& grads, float inv_scale);                                                \
  void unscale_and_check(Tensor& grads, const float* inv_scale, float* found_inf, double* sum_sq);                \
  void check_nonfinite(const Tensor& x, float* bad);                                                              \
  void zero_if(Tensor& x, const float* flag);                                                                     \
  void copy_unless(Tensor& dst, const Tensor& src, const int32_t* flag);                                          \
  double sum_squares(const Tensor& x);                                                                            \
  void sum_squares(const Tensor& x, double* out);                                                                 \
  void scale_inplace(Tensor& x, float factor);                                                                    \
  void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdParams& p,                    \
                const StepGate* gate, Tensor* working);                                                           \
  void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const AdamWParams& p,                \
                  const StepGate* gate, Tensor* working);                                                         \
  AbsStats abs_stats(const Tensor& x, float threshold);

namespace ampdist::kernels::cpu {
AMPDIST_KERNEL_DECLS
}  // namespace ampdist::kernels::cpu

namespace ampdist::kernels::cuda {
AMPDIST_KERNEL_DECLS
}  // namespace ampdist::kernels::cuda
