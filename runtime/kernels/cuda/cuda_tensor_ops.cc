// The CUDA backend of kernels.h and kernels/device_ops.h over Tensors: shape checks, cuBLAS GEMMs, and the kernel
// launchers of cuda_ops.h. Without the CUDA backend every entry point throws Error.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/checks.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/exec_context.h"
#include "runtime/kernels/math.h"

#ifdef AMPDIST_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "runtime/kernels/cuda/cuda_ops.h"
#endif

namespace ampdist::kernels {

#ifdef AMPDIST_HAVE_CUDA

namespace {

int code(DType t) { return static_cast<int>(t); }
void* stream() { return device::compute_stream(); }

void require_cuda(const char* op, const Tensor& t) {
  if (t.device() != Device::kCUDA)
    throw Error(std::string(op) + ": tensor on " + device_name(t.device()) + " mixed with tensors on the GPU");
}
void require_numel(const char* op, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel())
    throw Error(std::string(op) + ": element counts differ: " + shape_str(a.shape()) + " vs " + shape_str(b.shape()));
}
void require_f32(const char* op, const Tensor& t) {
  if (t.dtype() != DType::kFloat32) throw Error(std::string(op) + ": expected an FP32 tensor, got " + dtype_name(t.dtype()));
}

// Runs a launcher, turning its std::runtime_error into Error.
template <typename F> void launch(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

void check_blas(cublasStatus_t s, const std::string& what);

// One cuBLAS handle per device, bound to that device's compute stream, with
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: without it cuBLAS may split K and reduce the partial sums in the
// output type (fp16/bf16) for 16-bit outputs (cuBLAS documentation, cublasSetMathMode), which breaks the GEMM
// contract of FP32 accumulation and one rounding. TF32 is chosen per call by the compute type, not by the handle.
// The handle gets its own 32 MiB workspace (cuBLAS documentation recommends 32 MiB on Hopper; 4 MiB suffices
// elsewhere), so that cuBLAS never allocates one behind the stream's back.
struct Blas {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};
constexpr size_t kBlasWorkspace = size_t{32} << 20;
cublasHandle_t blas() {
  Blas& b = device::per_current_device<Blas>();
  if (!b.handle) {
    cublasHandle_t x = nullptr;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS)
      throw Error("cublasCreate failed on CUDA device " + std::to_string(device::current_device()));
    check_blas(cublasSetStream(x, static_cast<cudaStream_t>(stream())), "cublasSetStream");
    check_blas(cublasSetMathMode(x, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
               "cublasSetMathMode");
    if (cudaMalloc(&b.workspace, kBlasWorkspace) != cudaSuccess) {
      cudaGetLastError();
      throw Error("cudaMalloc of the cuBLAS workspace (32 MiB) failed");
    }
    check_blas(cublasSetWorkspace(x, b.workspace, kBlasWorkspace), "cublasSetWorkspace");
    b.handle = x;
  }
  return b.handle;
}

void check_blas(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(what + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat32: break;
  }
  return CUDA_R_32F;
}

// Device scratch of the current device that grows to the largest request (one stream per device: uses never
// overlap).
struct Scratch {
  Tensor t[4];
};
Tensor& scratch(int slot, const Shape& shape, DType dtype) {
  Tensor& t = device::per_current_device<Scratch>().t[slot];
  t.ensure(shape, dtype, Device::kCUDA);
  return t;
}

void check_ce(const char* op, const Tensor& logits, int64_t ntargets) {
  require_cuda(op, logits);
  if (logits.ndim() != 2 || ntargets != logits.dim(0))
    throw Error(std::string(op) + ": logits " + shape_str(logits.shape()) + " and " + std::to_string(ntargets) +
                " targets do not match");
}

void check_host_targets(const char* op, int64_t classes, std::span<const int32_t> targets) {
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i] < 0 || targets[i] >= classes)
      throw Error(std::string(op) + ": target " + std::to_string(targets[i]) + " of row " + std::to_string(i) +
                      " is outside [0, " + std::to_string(classes) + ")",
                  ErrorKind::kBadInput);
}

const Tensor& upload_targets(std::span<const int32_t> targets) {
  Tensor& t = scratch(1, {static_cast<int64_t>(targets.size())}, DType::kFloat32);  // int32 payload, 4 bytes each
  device::copy(t.data(), Device::kCUDA, targets.data(), Device::kCPU, targets.size() * sizeof(int32_t));
  return t;
}

double read_double(const double* dev) {
  double v = 0.0;
  device::copy(&v, Device::kCPU, dev, Device::kCUDA, sizeof v);
  return v;
}

}  // namespace

namespace cuda {

void batched_gemm(bool trans_x, bool trans_y, int64_t m, int64_t n, int64_t k, float alpha, const void* x, int xt,
                  int64_t ldx, int64_t sx, const void* y, int yt, int64_t ldy, int64_t sy, float* c, int64_t ldc,
                  int64_t sc, int64_t batch, const char* what) {
  // As in gemm: row-major C = op(X) op(Y) is column-major C^T = op(Y)^T op(X)^T, so cuBLAS gets Y first.
  const float beta = 0.0f;
  check_blas(cublasGemmStridedBatchedEx(blas(), trans_y ? CUBLAS_OP_T : CUBLAS_OP_N, trans_x ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, y,
                                        blas_type(static_cast<DType>(yt)), static_cast<int>(ldy), sy, x,
                                        blas_type(static_cast<DType>(xt)), static_cast<int>(ldx), sx, &beta, c,
                                        CUDA_R_32F, static_cast<int>(ldc), sc, static_cast<int>(batch),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             std::string("cublasGemmStridedBatchedEx (") + what + ")");
}

void cast(const Tensor& src, Tensor& dst) {
  require_cuda("cast", src);
  require_cuda("cast", dst);
  require_numel("cast", src, dst);
  launch([&] { ampdist::cuda::cast(src.data(), code(src.dtype()), dst.data(), code(dst.dtype()), src.numel(), stream()); });
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
          const Tensor* bias) {
  require_cuda("gemm", a);
  require_cuda("gemm", b);
  require_cuda("gemm", c);
  if (bias) require_cuda("gemm", *bias);
  const GemmShape shape = check_gemm(a, trans_a, b, trans_b, c, beta, bias);
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  if (m == 0 || n == 0) return;

  // A bias on a 16-bit output goes through an FP32 scratch, so that GEMM + bias is rounded once (as on the CPU).
  const bool via_scratch = bias && c.dtype() != DType::kFloat32;
  Tensor out = via_scratch ? scratch(0, {m, n}, DType::kFloat32) : c;
  if (k == 0) {
    if (beta == 0.0f || via_scratch) device::memset_zero(out.data(), out.nbytes());
    else launch([&] { ampdist::cuda::scale_inplace(static_cast<float*>(out.data()), m * n, beta, stream()); });
  } else {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the transposes.
    const cublasComputeType_t compute = a.dtype() == DType::kFloat32 && kernels::current_exec_context().allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                      : CUBLAS_COMPUTE_32F;
    check_blas(cublasGemmEx(blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b.data(),
                            blas_type(b.dtype()), static_cast<int>(b.dim(1)), a.data(), blas_type(a.dtype()),
                            static_cast<int>(a.dim(1)), &beta, out.data(), blas_type(out.dtype()), static_cast<int>(n),
                            compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx [" + std::to_string(m) + ", " + std::to_string(n) + ", " + std::to_string(k) + "]");
  }
  if (bias || via_scratch) {
    launch([&] {
      ampdist::cuda::add_bias_cast(static_cast<const float*>(out.data()), bias ? bias->data() : nullptr,
                                   bias ? code(bias->dtype()) : 0, c.data(), code(c.dtype()), m, n, stream());
    });
  }
}

void sum_rows(const Tensor& x, Tensor& out, float beta) {
  require_cuda("sum_rows", x);
  require_cuda("sum_rows", out);
  require_f32("sum_rows", out);
  if (x.ndim() != 2 || out.numel() != x.dim(1))
    throw Error("sum_rows: x " + shape_str(x.shape()) + " and out " + shape_str(out.shape()) + " do not match");
  launch([&] {
    ampdist::cuda::sum_rows(x.data(), code(x.dtype()), x.dim(0), x.dim(1), static_cast<float*>(out.data()), beta,
                            stream());
  });
}

#define AMPDIST_UNARY(name)                                                                                    \
  void name(const Tensor& x, Tensor& y) {                                                                      \
    require_cuda(#name, x);                                                                                    \
    require_cuda(#name, y);                                                                                    \
    require_numel(#name, x, y);                                                                                \
    if (x.dtype() != y.dtype()) throw Error(#name ": input and output dtypes differ");                         \
    launch([&] { ampdist::cuda::name(x.data(), y.data(), code(x.dtype()), x.numel(), stream()); });            \
  }
#define AMPDIST_BINARY(name)                                                                                   \
  void name(const Tensor& x, const Tensor& dy, Tensor& dx) {                                                   \
    require_cuda(#name, x);                                                                                    \
    require_cuda(#name, dy);                                                                                   \
    require_cuda(#name, dx);                                                                                   \
    require_numel(#name, x, dy);                                                                               \
    require_numel(#name, x, dx);                                                                               \
    if (x.dtype() != dy.dtype() || x.dtype() != dx.dtype()) throw Error(#name ": dtypes differ");              \
    launch([&] { ampdist::cuda::name(x.data(), dy.data(), dx.data(), code(x.dtype()), x.numel(), stream()); }); \
  }
AMPDIST_UNARY(relu_forward)
AMPDIST_UNARY(gelu_forward)
AMPDIST_BINARY(relu_backward)
AMPDIST_BINARY(gelu_backward)
#undef AMPDIST_UNARY
#undef AMPDIST_BINARY

double softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& lse) {
  check_ce("softmax_cross_entropy", logits, static_cast<int64_t>(targets.size()));
  check_host_targets("softmax_cross_entropy", logits.dim(1), targets);
  Tensor row_loss = scratch(2, {logits.dim(0)}, DType::kFloat32);
  Tensor sum = scratch(3, {2}, DType::kFloat32);  // one double
  device::memset_zero(sum.data(), sizeof(double));
  gpu::softmax_cross_entropy_forward(logits, targets, scratch(1, {logits.dim(0)}, DType::kFloat32), lse, row_loss,
                                     static_cast<double*>(sum.data()), 1.0);
  return read_double(static_cast<const double*>(sum.data()));
}

void softmax_cross_entropy_backward(const Tensor& logits, std::span<const int32_t> targets, const Tensor& lse,
                                    float grad_scale, Tensor& dlogits) {
  check_ce("softmax_cross_entropy_backward", logits, static_cast<int64_t>(targets.size()));
  check_host_targets("softmax_cross_entropy_backward", logits.dim(1), targets);
  gpu::softmax_cross_entropy_backward(logits, upload_targets(targets), lse, grad_scale, nullptr, 1.0, 1.0f, dlogits);
}

int64_t count_correct(const Tensor& logits, std::span<const int32_t> targets) {
  check_ce("count_correct", logits, static_cast<int64_t>(targets.size()));
  check_host_targets("count_correct", logits.dim(1), targets);
  const Tensor& t = upload_targets(targets);
  Tensor hits = scratch(2, {logits.dim(0)}, DType::kFloat32);
  Tensor sum = scratch(3, {2}, DType::kFloat32);
  launch([&] {
    ampdist::cuda::argmax_hits(logits.data(), code(logits.dtype()), static_cast<const int32_t*>(t.data()),
                               logits.dim(0), logits.dim(1), static_cast<float*>(hits.data()), stream());
    ampdist::cuda::sum_f32(static_cast<const float*>(hits.data()), logits.dim(0), static_cast<double*>(sum.data()),
                           false, stream());
  });
  return static_cast<int64_t>(read_double(static_cast<const double*>(sum.data())));
}

UnscaleResult unscale_and_check(Tensor& grads, float inv_scale) {
  require_cuda("unscale_and_check", grads);
  require_f32("unscale_and_check", grads);
  // [found_inf float | pad | sum_sq double]
  Tensor flags = Tensor::zeros({4}, DType::kFloat32, Device::kCUDA);
  float* found = static_cast<float*>(flags.data());
  double* sum_sq = reinterpret_cast<double*>(found + 2);
  launch([&] {
    ampdist::cuda::unscale_and_check(static_cast<float*>(grads.data()), grads.numel(), inv_scale, nullptr, found,
                                     sum_sq, stream());
  });
  float host[4];
  device::copy(host, Device::kCPU, flags.data(), Device::kCUDA, sizeof host);
  UnscaleResult r;
  r.found_inf = host[0] > 0.0f;
  std::memcpy(&r.sum_sq, &host[2], sizeof(double));
  return r;
}

void unscale_and_check(Tensor& grads, const float* inv_scale, float* found_inf, double* sum_sq) {
  require_cuda("unscale_and_check", grads);
  require_f32("unscale_and_check", grads);
  launch([&] {
    ampdist::cuda::unscale_and_check(static_cast<float*>(grads.data()), grads.numel(), 1.0f, inv_scale, found_inf,
                                     sum_sq, stream());
  });
}

void check_nonfinite(const Tensor& x, float* bad) {
  require_cuda("check_nonfinite", x);
  require_f32("check_nonfinite", x);
  launch([&] { ampdist::cuda::check_nonfinite(static_cast<const float*>(x.data()), x.numel(), bad, stream()); });
}

void copy_unless(Tensor& dst, const Tensor& src, const int32_t* flag) {
  require_cuda("copy_unless", dst);
  require_cuda("copy_unless", src);
  require_numel("copy_unless", dst, src);
  if (dst.dtype() != src.dtype()) throw Error("copy_unless: dtypes differ");
  launch([&] { ampdist::cuda::copy_unless(dst.data(), src.data(), dst.nbytes(), flag, stream()); });
}

void zero_if(Tensor& x, const float* flag) {
  require_cuda("zero_if", x);
  require_f32("zero_if", x);
  launch([&] { ampdist::cuda::zero_if(static_cast<float*>(x.data()), x.numel(), flag, stream()); });
}

AbsStats abs_stats(const Tensor& x, float threshold) {
  require_cuda("abs_stats", x);
  Tensor out = scratch(3, {4}, DType::kFloat32);
  device::memset_zero(out.data(), 4 * sizeof(uint32_t));
  launch([&] {
    ampdist::cuda::abs_stats(x.data(), code(x.dtype()), x.numel(), threshold, static_cast<unsigned int*>(out.data()),
                             stream());
  });
  uint32_t host[4];
  device::copy(host, Device::kCPU, out.data(), Device::kCUDA, sizeof host);  // waits
  AbsStats s;
  std::memcpy(&s.max_abs, &host[0], sizeof(float));
  s.nonfinite = host[1] != 0;
  uint64_t below;
  std::memcpy(&below, &host[2], sizeof below);
  s.below = static_cast<int64_t>(below);
  return s;
}

double sum_squares(const Tensor& x) {
  require_cuda("sum_squares", x);
  require_f32("sum_squares", x);
  Tensor sum = scratch(3, {2}, DType::kFloat32);
  launch([&] {
    ampdist::cuda::sum_squares(static_cast<const float*>(x.data()), x.numel(), static_cast<double*>(sum.data()),
                               stream());
  });
  return read_double(static_cast<const double*>(sum.data()));
}

void sum_squares(const Tensor& x, double* out) {
  require_cuda("sum_squares", x);
  require_f32("sum_squares", x);
  launch([&] { ampdist::cuda::sum_squares(static_cast<const float*>(x.data()), x.numel(), out, stream()); });
}

void scale_inplace(Tensor& x, float factor) {
  require_cuda("scale_inplace", x);
  require_f32("scale_inplace", x);
  launch([&] { ampdist::cuda::scale_inplace(static_cast<float*>(x.data()), x.numel(), factor, stream()); });
}

void sgd_step(Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdParams& p, const StepGate* gate,
              Tensor* working) {
  require_cuda("sgd_step", params);
  require_cuda("sgd_step", grads);
  require_numel("sgd_step", params, grads);
  if (working) require_cuda("sgd_step", *working);
  float* buf = nullptr;
  if (p.momentum != 0.0f) {
    require_cuda("sgd_step", momentum_buf);
    require_numel("sgd_step", params, momentum_buf);
    buf = static_cast<float*>(momentum_buf.data());
  }
  launch([&] {
    ampdist::cuda::sgd_step(static_cast<float*>(params.data()), static_cast<const float*>(grads.data()), buf,
                            params.numel(), p.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, p.first_step,
                            gate, working ? working->data() : nullptr, working ? code(working->dtype()) : 0,
                            stream());
  });
}

void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const AdamWParams& p,
                const StepGate* gate, Tensor* working) {
  require_cuda("adamw_step", params);
  require_numel("adamw_step", params, grads);
  require_numel("adamw_step", params, m);
  require_numel("adamw_step", params, v);
  if (working) require_cuda("adamw_step", *working);
  float bc1 = 1.0f, bc2_sqrt = 1.0f;  // with a gate, the kernel reads them from it
  if (!gate) math::adamw_bias_corrections(p.beta1, p.beta2, p.step, bc1, bc2_sqrt);
  launch([&] {
    ampdist::cuda::adamw_step(static_cast<float*>(params.data()), static_cast<const float*>(grads.data()),
                              static_cast<float*>(m.data()), static_cast<float*>(v.data()), params.numel(), p.lr,
                              static_cast<float>(p.beta1), static_cast<float>(1.0 - p.beta1),
                              static_cast<float>(p.beta2), static_cast<float>(1.0 - p.beta2),
                              static_cast<float>(p.eps), p.weight_decay, bc1, bc2_sqrt, gate,
                              working ? working->data() : nullptr, working ? code(working->dtype()) : 0, stream());
  });
}

}  // namespace cuda

namespace gpu {

void softmax_cross_entropy_forward(const Tensor& logits, std::span<const int32_t> targets, Tensor& targets_dev,
                                   Tensor& lse, Tensor& row_loss, double* loss_sum, double divisor) {
  check_ce("softmax_cross_entropy", logits, static_cast<int64_t>(targets.size()));
  check_host_targets("softmax_cross_entropy", logits.dim(1), targets);
  const int64_t rows = logits.dim(0);
  targets_dev.ensure({rows}, DType::kFloat32, Device::kCUDA);  // int32 payload, 4 bytes each
  device::copy(targets_dev.data(), Device::kCUDA, targets.data(), Device::kCPU, targets.size() * sizeof(int32_t));
  lse.ensure({rows}, DType::kFloat32, Device::kCUDA);
  row_loss.ensure({rows}, DType::kFloat32, Device::kCUDA);
  launch([&] {
    // The targets were checked on the host: no device-side check (bad_row) needed.
    ampdist::cuda::softmax_xent_forward(logits.data(), code(logits.dtype()),
                                        static_cast<const int32_t*>(targets_dev.data()), rows, logits.dim(1),
                                        static_cast<float*>(lse.data()), static_cast<float*>(row_loss.data()), nullptr,
                                        stream());
    ampdist::cuda::sum_f32(static_cast<const float*>(row_loss.data()), rows, loss_sum, true, stream(), divisor);
  });
}

void softmax_cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, float grad_scale,
                                    const float* scale_dev, double divisor, float row_divisor, Tensor& dlogits) {
  check_ce("softmax_cross_entropy_backward", logits, targets.numel());
  require_cuda("softmax_cross_entropy_backward", dlogits);
  require_numel("softmax_cross_entropy_backward", logits, dlogits);
  launch([&] {
    ampdist::cuda::softmax_xent_backward(logits.data(), code(logits.dtype()),
                                         static_cast<const int32_t*>(targets.data()),
                                         static_cast<const float*>(lse.data()), logits.dim(0), logits.dim(1),
                                         grad_scale, scale_dev, divisor, row_divisor, dlogits.data(),
                                         code(dlogits.dtype()), stream());
  });
}

}  // namespace gpu

#else  // no CUDA backend

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(std::string(op) + ": tensor on the GPU, but this build has no CUDA backend");
}
}  // namespace

namespace cuda {
void cast(const Tensor&, Tensor&) { no_cuda("cast"); }
void gemm(const Tensor&, bool, const Tensor&, bool, Tensor&, float, float, const Tensor*) { no_cuda("gemm"); }
void sum_rows(const Tensor&, Tensor&, float) { no_cuda("sum_rows"); }
void relu_forward(const Tensor&, Tensor&) { no_cuda("relu_forward"); }
void relu_backward(const Tensor&, const Tensor&, Tensor&) { no_cuda("relu_backward"); }
void gelu_forward(const Tensor&, Tensor&) { no_cuda("gelu_forward"); }
void gelu_backward(const Tensor&, const Tensor&, Tensor&) { no_cuda("gelu_backward"); }
double softmax_cross_entropy_forward(const Tensor&, std::span<const int32_t>, Tensor&) { no_cuda("softmax_cross_entropy"); }
void softmax_cross_entropy_backward(const Tensor&, std::span<const int32_t>, const Tensor&, float, Tensor&) {
  no_cuda("softmax_cross_entropy_backward");
}
int64_t count_correct(const Tensor&, std::span<const int32_t>) { no_cuda("count_correct"); }
UnscaleResult unscale_and_check(Tensor&, float) { no_cuda("unscale_and_check"); }
void unscale_and_check(Tensor&, const float*, float*, double*) { no_cuda("unscale_and_check"); }
void check_nonfinite(const Tensor&, float*) { no_cuda("check_nonfinite"); }
void zero_if(Tensor&, const float*) { no_cuda("zero_if"); }
void copy_unless(Tensor&, const Tensor&, const int32_t*) { no_cuda("copy_unless"); }
AbsStats abs_stats(const Tensor&, float) { no_cuda("abs_stats"); }
double sum_squares(const Tensor&) { no_cuda("sum_squares"); }
void sum_squares(const Tensor&, double*) { no_cuda("sum_squares"); }
void scale_inplace(Tensor&, float) { no_cuda("scale_inplace"); }
void sgd_step(Tensor&, const Tensor&, Tensor&, const SgdParams&, const StepGate*, Tensor*) { no_cuda("sgd_step"); }
void adamw_step(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWParams&, const StepGate*, Tensor*) {
  no_cuda("adamw_step");
}
}  // namespace cuda

namespace gpu {
void softmax_cross_entropy_forward(const Tensor&, std::span<const int32_t>, Tensor&, Tensor&, Tensor&, double*, double) {
  no_cuda("softmax_cross_entropy");
}
void softmax_cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, float, const float*, double, float,
                                    Tensor&) {
  no_cuda("softmax_cross_entropy_backward");
}
}  // namespace gpu

#endif

}  // namespace ampdist::kernels
