// Device-resident variants of kernels.h for the CUDA backend's training step: nothing here reads a value back to
// the host, so a step queues all its work on the compute stream without waiting for it.
//
// Every function throws ampdist::Error for tensors not on the GPU, or in a build without the CUDA backend.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/core/tensor.h"

namespace ampdist::kernels::gpu {

// Softmax cross-entropy over logits [B, C] (any dtype). targets: B host ids, checked on the host (Error, bad
// input, naming the row) and copied into targets_dev ([B] int32 payload on the device, resized; keep it for the
// backward). Writes lse [B] and row_loss [B] (FP32, resized as needed) and adds (sum_i row_loss[i]) / divisor
// (double, fixed order) to *loss_sum on the device.
void softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& targets_dev,
                                   Tensor& lse, Tensor& row_loss, double* loss_sum, double divisor);
// dlogits = g * (softmax - onehot) with targets [B] int32 on the device, g = grad_scale / row_divisor; with
// scale_dev non-null, grad_scale is float(*scale_dev / divisor) read on the device.
void softmax_cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, float grad_scale,
                                    const float* scale_dev, double divisor, float row_divisor, Tensor& dlogits);

}  // namespace ampdist::kernels::gpu
