// Argument checks of kernels/cnn.h shared by its CPU and CUDA implementations (internal to the kernels), as
// kernels/transformer_checks.h for the transformer ops. Each throws Error naming the op and the argument: a tensor
// on another device than `device`, a wrong element count or dtype, or a convolution or pooling shape that does not
// fit (ConvShape::validate).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernels/cnn.h"
#include "runtime/kernels/transformer_checks.h"

namespace ampdist::kernels::checks {

// The convolutions: x and w share a dtype (dy and w for the data gradient, x and dy for the weight gradient); y and
// dx are FP32 or that dtype; bias, dw and dbias are FP32 (bias, dbias may be null).
void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                    Device device);
void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, const Tensor& dx, Device device);
void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, const Tensor& dw,
                             const Tensor* dbias, Device device);

// x [N, C, H, W] on `device`, of any dtype, as its N, C and H * W.
struct Nchw {
  int64_t n, c, hw;
};
// A BatchNorm op: x [N, C, H, W]; `like_x` (nulls skipped) hold as many elements as x, any dtype; `per_channel` are
// FP32 [C]; `sums` is the size of the op's sums span, which must be 2C (-1: the op has none). All on `device`.
Nchw batchnorm(const char* op, const Tensor& x, std::initializer_list<const Tensor*> like_x,
               std::initializer_list<const Tensor*> per_channel, int64_t sums, Device device);
// BatchNorm's per-channel tensors of the step-state ops (batchnorm_statistics and its kin): each FP32 [c] on `device`.
void batchnorm_channels(const char* op, int64_t c, std::initializer_list<const Tensor*> tensors, Device device);
// C of x [N, C, H, W] (0 for another rank, which checks::batchnorm then refuses): the size of the ops' sums is 2C.
inline int64_t channels_of(const Tensor& x) { return x.ndim() == 4 ? x.dim(1) : 0; }
// a and b any dtype, y FP32, one element count.
void residual_add(const Tensor& a, const Tensor& b, const Tensor& y, Device device);
// in [N, C, H, W] and out [N, C, OH, OW], FP32, for the window of s (padding at most half the kernel); `argmax`, the
// size of max-pooling's index span (-1 for average pooling), must be one index per output.
void pool(const char* op, const PoolShape& s, const Tensor& in, const Tensor& out, int64_t argmax, Device device);
// planes [N, C, H, W] and means (N * C elements), FP32. Returns H * W.
int64_t global_avgpool(const char* op, const Tensor& planes, const Tensor& means, Device device);

}  // namespace ampdist::kernels::checks
