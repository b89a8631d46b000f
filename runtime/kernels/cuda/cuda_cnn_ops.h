// Launchers of the convolutional-network kernels (kernels/cuda/cnn_kernels.cu) over raw device pointers; the Tensor
// level with its checks, and the cuDNN convolutions, are kernels/cuda/cuda_cnn_ops.cc. Tensors are NCHW; `planes`
// is N * C and `hw` is H * W. dtype codes are DType's values (0 fp32, 1 fp16, 2 bf16); a 16-bit value is read as
// the FP32 value it is, and a 16-bit output is the FP32 result rounded once to nearest even. Every launcher queues
// work on `stream` and returns; launch errors throw std::runtime_error.
//
// Orders: the BatchNorm sums are double sums in a fixed order that depends on the shape alone (one block per
// channel, each thread a fixed stride of elements, a fixed tree across threads), so a run is reproducible, but
// not the CPU's order (tests/gpu bounds the difference). Every other kernel computes each output in the CPU
// loop's order, with the formulas of kernels/math.h: bitwise the CPU's result.
#pragma once

#include <cstdint>

namespace ampdist::cuda {

using Stream = void*;

// sums [2C] (device doubles) = per channel c: sum of x, sum of x^2 over N, H, W.
void batchnorm_sums(const void* x, int x_dtype, int64_t n, int64_t c, int64_t hw, double* sums, Stream s);
// y = math::batchnorm(x, mean[c], invstd[c] * gamma[c], beta[c]), then math::relu when relu. Per-channel tensors
// are FP32 [C].
void batchnorm_apply(const void* x, int x_dtype, int64_t n, int64_t c, int64_t hw, const float* mean,
                     const float* invstd, const float* gamma, const float* beta, void* y, int y_dtype, bool relu,
                     Stream s);
// sums [2C] = per channel: sum g, sum g * (x - mean) * invstd, g = dy, or dy only where relu_y > 0 when relu_y is
// not null (math::relu_backward).
void batchnorm_backward_sums(const void* x, int x_dtype, const void* dy, int dy_dtype, const void* relu_y,
                             int relu_dtype, int64_t n, int64_t c, int64_t hw, const float* mean, const float* invstd,
                             double* sums, Stream s);
// dx = math::batchnorm_backward(...) from the device sums [2C] and the element count per channel (0: evaluation
// mode, dx = gamma * invstd * g).
void batchnorm_backward_dx(const void* x, int x_dtype, const void* dy, int dy_dtype, const void* relu_y,
                           int relu_dtype, int64_t n, int64_t c, int64_t hw, const float* mean, const float* invstd,
                           const float* gamma, const double* sums, double count, void* dx, int dx_dtype, Stream s);
// The per-channel statistics of kernels/cnn.h's batchnorm_statistics / batchnorm_running_statistics /
// batchnorm_param_grads, one thread per channel, with math.h's formulas (bitwise the CPU's).
void batchnorm_statistics(const double* sums, int64_t c, double count, float eps, float momentum, float* mean,
                          float* var, float* invstd, float* running_mean, float* running_var, float* tracked, Stream s);
void batchnorm_running_statistics(const float* running_mean, const float* running_var, int64_t c, float eps,
                                  float* mean, float* var, float* invstd, Stream s);
void batchnorm_param_grads(const double* sums, int64_t c, float* dgamma, float* dbeta, bool accumulate, Stream s);
// y [n] FP32 = float(a) + float(b), then math::relu when relu.
void residual_add(const void* a, int a_dtype, const void* b, int b_dtype, int64_t n, float* y, bool relu, Stream s);

// Pooling over FP32 planes [planes, h, w] -> [planes, oh, ow]; windows of kernel x kernel with stride and padding.
struct PoolDims {
  int64_t planes, h, w, oh, ow, kernel, stride, pad;
};
// y = the window's maximum (a NaN wins), argmax = its flat index in the plane (first in row-major order on ties).
void maxpool2d_forward(const float* x, const PoolDims& d, float* y, int32_t* argmax, Stream s);
// dx (written whole) = sum of dy over the outputs whose argmax is this element, in increasing output order.
void maxpool2d_backward(const float* dy, const int32_t* argmax, const PoolDims& d, float* dx, Stream s);
// Average with the padding counted (count_include_pad), and its backward (dx written whole; each element the sum
// of dy / kernel^2 over the windows that hold it, in increasing output order).
void avgpool2d_forward(const float* x, const PoolDims& d, float* y, Stream s);
void avgpool2d_backward(const float* dy, const PoolDims& d, float* dx, Stream s);
// y [rows] = (sum of x[r, 0 .. hw) in order) * (1 / hw); the backward dx [rows, hw] = dy[r] * (1 / hw).
void global_avgpool_forward(const float* x, int64_t rows, int64_t hw, float* y, Stream s);
void global_avgpool_backward(const float* dy, int64_t rows, int64_t hw, float* dx, Stream s);

}  // namespace ampdist::cuda
