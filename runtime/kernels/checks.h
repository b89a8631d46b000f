// Argument checks shared by the CPU and CUDA implementations of kernels.h (internal to the kernels).
#pragma once

#include <cstdint>

#include "runtime/core/tensor.h"

namespace ampdist::kernels {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // op(A): [m, k], op(B): [k, n], C: [m, n]
};
// Checks gemm's contract (kernels.h): 2-d tensors, A and B of one dtype, matching shapes, C FP32 or the inputs'
// dtype, beta != 0 only with FP32 C, bias of N elements. Returns the problem size; throws Error naming the mismatch.
GemmShape check_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float beta,
                     const Tensor* bias);

// Checks an optimizer update's working-copy output (kernels.h, sgd_step / adamw_step): null, or fp16 / bf16 with the
// params' element count on the params' device. Throws Error naming `op` and the mismatch.
void check_working_out(const char* op, const Tensor& params, const Tensor* working);

}  // namespace ampdist::kernels
