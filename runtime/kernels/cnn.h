// The convolutional-network op families: 2-d convolution, BatchNorm statistics and normalisation, max and average
// pooling, the residual add. Every tensor is NCHW (row-major [N, C, H, W]) and FP32, except the 16-bit inputs a
// convolution or BatchNorm also takes (below); the layers in runtime/nn/conv.h cast at their boundaries (autocast).
// The CPU backend runs oneDNN's convolution primitives and the loops of kernels/cpu/cnn_kernels.cc; when an op's
// tensors are on the GPU, the CUDA backend runs cuDNN's convolutions and the kernels of kernels/cuda/cnn_kernels.cu
// (kernels/cuda/cuda_cnn_ops.cc: which results equal the CPU's bit for bit, and the bounds of the others). All of an
// op's tensors are on one device; the `sums` spans of BatchNorm are host memory on both backends (the GPU backend
// copies them, which waits for the GPU: the statistics are formed on the host).
//
// Output sizes follow torch.nn.Conv2d / MaxPool2d (floor mode):
//   out = (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1.
// Every function throws ampdist::Error naming the op on a shape, dtype or device mismatch.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/core/tensor.h"

namespace ampdist::kernels {

// ---- convolution -----------------------------------------------------------------------------------------------
struct ConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0;                       // output channels
  int64_t kh = 1, kw = 1;              // kernel
  int64_t stride = 1, pad = 0, dilation = 1, groups = 1;
  int64_t out_h() const { return (h + 2 * pad - dilation * (kh - 1) - 1) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - dilation * (kw - 1) - 1) / stride + 1; }
  // Throws Error naming the shape unless n >= 0, every other size, the stride and the dilation are positive,
  // pad >= 0, groups divides c and k, the output is not empty, and every size fits in an int (cuDNN's descriptors).
  void validate() const;
};
// y [N, K, OH, OW] = conv(x [N, C, H, W], w [K, C/groups, kh, kw]) (+ bias [K]), cross-correlation as PyTorch.
// x and w share one dtype: FP32, BF16 or FP16. The products are exact and accumulate in FP32 (DESIGN.md's
// tensor-core contract); bias is FP32 and added to the FP32 result, which y holds as FP32 or in x's dtype, rounded
// once (round to nearest even; by oneDNN's bf16 kernel itself, else by kernels::cast). BF16 runs on oneDNN's bf16
// kernels where the CPU has them (AVX512-BF16, AMX: see cpu::onednn::native_bf16), else, like FP16 (oneDNN 2.6 has
// no fp16 convolution on the CPU), as FP32 on the exactly widened values. oneDNN chooses the memory layout its
// kernels run in (blocked nChw16c and the like); the operands are reordered into it and the result back to NCHW.
// bias: null for none.
void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
// dx [N, C, H, W] = d/dx of the convolution for dy [N, K, OH, OW] (oneDNN's convolution_backward_data); dy and w
// share one dtype, and dx is FP32 or that dtype, as x, w and y above.
void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, Tensor& dx);
// dw [K, C/groups, kh, kw] and dbias [K] (null: none), FP32, from x and dy (one dtype, as above; oneDNN's
// convolution_backward_weights); added to dw / dbias when accumulate (a later micro-batch of the step), else written.
void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, Tensor& dw, Tensor* dbias,
                             bool accumulate);
// Whether the GPU backend can run convolutions: the build has the CUDA backend and cuDNN. Config validation
// refuses CNN models on the GPU when it cannot.
bool gpu_convolutions();
// The CPU backend's oneDNN implementation chosen for a forward convolution of this shape with operands of `dtype` (e.g.
// "jit:avx512_core_bf16", "jit:avx512_core", "gemm:jit").
std::string conv2d_implementation(const ConvShape& s, DType dtype = DType::kFloat32);

// ---- BatchNorm (Ioffe & Szegedy 2015), FP32 arithmetic, statistics accumulated in double ------------------------
// x and dy may be FP32 or a 16-bit dtype (read as FP32, exactly); so may y, dx and relu_y where said; every other
// tensor is FP32. A 16-bit output is the FP32 value rounded once to nearest even, by the same conversion as
// kernels::cast, so a fused output is bitwise what the separate FP32 op followed by a cast gives.
// Per channel c of x [N, C, H, W]: sums[c] = sum of x, sums[C + c] = sum of x^2 over N, H, W (2C doubles, so that a
// synchronised BatchNorm can all-reduce them before the statistics are formed).
void batchnorm_sums(const Tensor& x, std::span<double> sums);
// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c] in FP32; with relu, then math::relu (max(y, 0), NaN kept): a
// BatchNorm and the ReLU after it in one pass. mean, invstd, gamma, beta: [C] FP32; y: FP32 or 16-bit.
void batchnorm_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                     const Tensor& beta, Tensor& y, bool relu = false);
// Per channel: sums[c] = sum dy, sums[C + c] = sum dy * (x - mean) * invstd (double), the two reductions of the
// backward (all-reduced in sync mode). relu_y: for a BatchNorm with a fused ReLU, its forward output y (any dtype);
// dy then counts only where relu_y > 0 (ReLU's gradient from its output, as math::relu_backward and PyTorch's
// threshold_backward: a 16-bit output that rounded to 0 passes no gradient). Null: no ReLU.
void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                             std::span<double> sums, const Tensor* relu_y = nullptr);
// dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count), from the (global) sums and the (global)
// element count per channel, computed in double and written as FP32 or 16-bit. Training mode; in evaluation mode the
// statistics are constants and dx = gamma * invstd * dy (count = 0 selects that). relu_y as above.
void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                           const Tensor& gamma, std::span<const double> sums, double count, Tensor& dx,
                           const Tensor* relu_y = nullptr);

// ---- BatchNorm in the training step: every per-channel value stays where x lives -----------------------------
// The same reductions as above with `sums` (2C doubles) on x's device (host memory on the CPU, device memory on the
// GPU), and the statistics formed there (math::batchnorm_mean/var/invstd/running, the formulas of the host path),
// so a training step reads nothing back to the host. count: the values per channel (N * H * W, or the global count
// of a synchronised BatchNorm).
void batchnorm_sums_to(const Tensor& x, double* sums);
void batchnorm_backward_sums_to(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                double* sums, const Tensor* relu_y = nullptr);
void batchnorm_backward_dx_from(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                const Tensor& gamma, const double* sums, double count, Tensor& dx,
                                const Tensor* relu_y = nullptr);
// Training: per channel c, from sums[c] and sums[C + c] over `count` values: mean, var (biased) and invstd [C] FP32,
// running_mean and running_var [C] updated in place with `momentum` (running_var with the unbiased variance), and
// tracked [1] (num_batches_tracked, FP32) += 1. Every tensor FP32 on one device; C = mean.numel().
void batchnorm_statistics(const double* sums, double count, float eps, float momentum, Tensor& mean, Tensor& var,
                          Tensor& invstd, Tensor& running_mean, Tensor& running_var, Tensor& tracked);
// Evaluation: mean = running_mean, var = running_var, invstd = float(1 / sqrt(double(running_var) + eps)).
void batchnorm_running_statistics(const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& mean,
                                  Tensor& var, Tensor& invstd);
// The parameter gradients from the backward sums: dgamma[c] = float(sums[C + c]), dbeta[c] = float(sums[c]),
// written, or added in FP32 (accumulate: a later micro-batch). FP32 [C] on the sums' device.
void batchnorm_param_grads(const double* sums, Tensor& dgamma, Tensor& dbeta, bool accumulate);

// ---- residual add -----------------------------------------------------------------------------------------------
// y = float(a) + float(b), then math::relu when relu: a ResNet block's add and final ReLU in one pass (the
// forward), or the sum of a block's two input gradients (the backward). a, b: FP32 or 16-bit, equal element
// counts; y: FP32.
void residual_add(const Tensor& a, const Tensor& b, Tensor& y, bool relu);

// ---- pooling ---------------------------------------------------------------------------------------------------
struct PoolShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kernel = 2, stride = 2, pad = 0;
  int64_t out_h() const { return (h + 2 * pad - kernel) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - kernel) / stride + 1; }
};
// y [N, C, OH, OW] = max over each window (padding is -inf, as PyTorch); argmax [N*C*OH*OW] int32 (the flat
// index inside the [H, W] plane; memory on x's device), saved for the backward. A NaN in a window is the window's maximum (PyTorch).
void maxpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y, std::span<int32_t> argmax);
// dx = scatter-add of dy to the saved argmax positions (dx is written whole).
void maxpool2d_backward(const PoolShape& s, const Tensor& dy, std::span<const int32_t> argmax, Tensor& dx);
// Average over each window, padding counted (count_include_pad = True, PyTorch's default).
void avgpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y);
void avgpool2d_backward(const PoolShape& s, const Tensor& dy, Tensor& dx);
// torch.nn.AdaptiveAvgPool2d((1, 1)): y [N, C] (or [N, C, 1, 1]) = the in-order FP32 sum over each [H, W] plane of
// x times 1 / (H * W); the backward writes dx [N, C, H, W] = dy[n, c] * (1 / (H * W)). FP32 tensors.
void global_avgpool2d_forward(const Tensor& x, Tensor& y);
void global_avgpool2d_backward(const Tensor& dy, Tensor& dx);

}  // namespace ampdist::kernels
