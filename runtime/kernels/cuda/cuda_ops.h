// Launchers of the CUDA backend's kernels, over raw device pointers (CUDA headers not needed to call them).
//
// kernels/cuda/cuda_tensor_ops.cc unpacks Tensors and calls these for device tensors (kernels/dispatch.cc picks the
// backend). Every launcher queues work on `stream` (a cudaStream_t) and returns at once; a launch error throws
// std::runtime_error naming the kernel, which the Tensor level turns into ampdist::Error. dtype codes are DType's values: 0 fp32, 1 fp16, 2 bf16. Per-element arithmetic
// is kernels/math.h's (compiled with --fmad=false, so element-wise results equal the CPU backend's bit for bit).
// Reductions (sum_rows, sum of squares, loss sums) use a fixed grid and a fixed tree order: the same inputs give the
// same bits on every run and every rank, which the consensus and the clip factor rely on.

#pragma once

#include <cstdint>

#include "runtime/kernels/update_gate.h"

// Row-major C[i] [m, n] (FP32, leading dimension ldc, stride sc between matrices) = alpha op(X[i]) op(Y[i]) for
// `batch` matrices, with FP32 accumulation (CUBLAS_COMPUTE_32F: tensor cores for 16-bit inputs, FP32 FMA for FP32,
// never TF32) on the current device's cuBLAS handle; x_dtype and y_dtype must be equal (DType codes). For the
// attention GEMMs of kernels/cuda/cuda_transformer_ops.cc. Throws Error with the cuBLAS status.
namespace ampdist::kernels::cuda {
void batched_gemm(bool trans_x, bool trans_y, int64_t m, int64_t n, int64_t k, float alpha, const void* x, int x_dtype,
                  int64_t ldx, int64_t sx, const void* y, int y_dtype, int64_t ldy, int64_t sy, float* c, int64_t ldc,
                  int64_t sc, int64_t batch, const char* what);
}

namespace ampdist::cuda {

using Stream = void*;

// dst[i] = src[i] converted, round to nearest even.
void cast(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n, Stream s);
// c[M, N] (c_dtype) = c32[M, N] + bias[N] (bias may be null), rounded once.
void add_bias_cast(const float* c32, const void* bias, int bias_dtype, void* c, int c_dtype, int64_t m, int64_t n,
                   Stream s);
// out[j] = beta * out[j] + sum_i x[i, j], x [rows, cols] of x_dtype, FP32 accumulation in two fixed-order stages
// (chunks of 64 rows per column tile, then the chunks in order): deterministic, not the CPU's row order.
void sum_rows(const void* x, int x_dtype, int64_t rows, int64_t cols, float* out, float beta, Stream s);

// Element-wise activations, dtype of x/y/dy/dx the same.
void relu_forward(const void* x, void* y, int dtype, int64_t n, Stream s);
void relu_backward(const void* y, const void* dy, void* dx, int dtype, int64_t n, Stream s);
void gelu_forward(const void* x, void* y, int dtype, int64_t n, Stream s);
void gelu_backward(const void* x, const void* dy, void* dx, int dtype, int64_t n, Stream s);

// Softmax cross-entropy over logits [rows, classes] (any dtype), FP32 arithmetic per row (max-subtracted).
// Writes lse[row] and row_loss[row] = lse - z[target]; *bad_row = the first row whose target is out of range
// (left untouched when all are valid; the caller initialises it to -1; may be null when the caller checked them).
void softmax_xent_forward(const void* logits, int dtype, const int32_t* targets, int64_t rows, int64_t classes,
                          float* lse, float* row_loss, int32_t* bad_row, Stream s);
// dlogits = g * (softmax - onehot), rounded once to dlogits_dtype, with g = grad_scale / row_divisor; with scale_dev
// non-null, grad_scale is float(*scale_dev / divisor) read on the device (the device-resident loss scale over the
// step's samples). row_divisor: a criterion's own division (the GPT's sequence length; 1: none, exact).
void softmax_xent_backward(const void* logits, int dtype, const int32_t* targets, const float* lse, int64_t rows,
                           int64_t classes, float grad_scale, const float* scale_dev, double divisor,
                           float row_divisor, void* dlogits, int dlogits_dtype, Stream s);
// row_hit[row] = 1 when argmax(row) == target (first maximum, as the CPU backend), else 0.
void argmax_hits(const void* logits, int dtype, const int32_t* targets, int64_t rows, int64_t classes,
                 float* row_hit, Stream s);

// *out (+)= (sum_i x[i]) / divisor (add: accumulate into *out) in double, deterministic order (divisor 1: exact).
void sum_f32(const float* x, int64_t n, double* out, bool add, Stream s, double divisor = 1.0);
// *out = sum_i x[i]^2 in double, deterministic order.
void sum_squares(const float* x, int64_t n, double* out, Stream s);

// One fused pass over FP32 gradients: g *= inv_scale; *found_inf = 1 if any result is inf/NaN (never reset here);
// *sum_sq += sum of squares of the finite results (double, deterministic). inv_scale from the host value, or, when
// `inv_scale_dev` is non-null, *inv_scale_dev read on the device (the step state's unscale factor).
void unscale_and_check(float* g, int64_t n, float inv_scale, const float* inv_scale_dev, float* found_inf,
                       double* sum_sq, Stream s);
// *bad = 1 when any x[i] is inf or NaN (never reset here).
void check_nonfinite(const float* x, int64_t n, float* bad, Stream s);
// x[i] = 0 for all i when *flag > 0.
void zero_if(float* x, int64_t n, const float* flag, Stream s);
// dst = src (bytes) unless *flag != 0 (device int32).
void copy_unless(void* dst, const void* src, int64_t bytes, const int32_t* flag, Stream s);
// out[0] (as float bits) = max |x| over finite elements, out[1] = 1 when any is inf/NaN, out[2..3] (a uint64) = count
// of 0 < |x| <= threshold; out must hold 4 zeroed words. Deterministic (maxima and counts).
void abs_stats(const void* x, int dtype, int64_t n, float threshold, unsigned int* out, Stream s);
void scale_inplace(float* x, int64_t n, float factor, Stream s);

// Optimizer updates over flat FP32 buffers. With `gate` null the host values are used (the CPU-equivalent path);
// otherwise the update reads the step's agreed values on the device: nothing happens when gate->apply == 0, the
// gradient is multiplied by gate->clip_coef first, and lr / first_step / bias corrections come from gate.
// working: null, or [n] elements of dtype code working_dtype (1 fp16, 2 bf16) that receive each updated param
// rounded to nearest even, as cast() rounds (kernels.h's fused working-copy write).
void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float dampening,
              float weight_decay, bool nesterov, bool first_step, const StepGate* gate, void* working,
              int working_dtype, Stream s);
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float one_minus_beta1,
                float beta2, float one_minus_beta2, float eps, float weight_decay, float bias_correction1,
                float bias_correction2_sqrt, const StepGate* gate, void* working, int working_dtype, Stream s);


}  // namespace ampdist::cuda
