#include "runtime/kernels/checks.h"

#include <string>

namespace ampdist::kernels {

GemmShape check_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float beta,
                     const Tensor* bias) {
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2)
    throw Error("gemm: expected 2-d tensors, got " + shape_str(a.shape()) + ", " + shape_str(b.shape()) + ", " +
                shape_str(c.shape()));
  if (a.dtype() != b.dtype())
    throw Error(std::string("gemm: A is ") + dtype_name(a.dtype()) + " but B is " + dtype_name(b.dtype()));
  GemmShape s;
  s.m = trans_a ? a.dim(1) : a.dim(0);
  s.k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  s.n = trans_b ? b.dim(0) : b.dim(1);
  if (s.k != kb || c.dim(0) != s.m || c.dim(1) != s.n)
    throw Error("gemm: shapes do not match: op(A) [" + std::to_string(s.m) + ", " + std::to_string(s.k) +
                "], op(B) [" + std::to_string(kb) + ", " + std::to_string(s.n) + "], C " + shape_str(c.shape()));
  if (beta != 0.0f && c.dtype() != DType::kFloat32) throw Error("gemm: beta != 0 needs an FP32 output");
  if (c.dtype() != DType::kFloat32 && c.dtype() != a.dtype())
    throw Error(std::string("gemm: output dtype ") + dtype_name(c.dtype()) + " is neither FP32 nor the inputs' " +
                dtype_name(a.dtype()));
  if (bias && bias->numel() != s.n)
    throw Error("gemm: bias " + shape_str(bias->shape()) + " does not match N = " + std::to_string(s.n));
  return s;
}

void check_working_out(const char* op, const Tensor& params, const Tensor* working) {
  if (!working) return;
  if (working->dtype() != DType::kFloat16 && working->dtype() != DType::kBFloat16)
    throw Error(std::string(op) + ": the working copy must be fp16 or bf16, got " + dtype_name(working->dtype()));
  if (working->numel() != params.numel())
    throw Error(std::string(op) + ": the working copy has " + std::to_string(working->numel()) +
                " elements, the params " + std::to_string(params.numel()));
  if (working->device() != params.device())
    throw Error(std::string(op) + ": the working copy and the params are on different devices");
}

}  // namespace ampdist::kernels
