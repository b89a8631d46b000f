// The CUDA backend of kernels/cnn.h over Tensors: convolutions through cuDNN's convolution API, BatchNorm, pooling
// and the residual add through the kernels of cuda_cnn_ops.h. Without the CUDA backend (or without cuDNN) every
// entry point throws Error.
//
// Convolutions keep kernels/cnn.h's contract (exact products, FP32 accumulation, one rounding of the output, bias
// added before it):
//   - FP32 operands run cuDNN's FP32 convolution with FMA math only, or with TF32 tensor cores when
//     precision.allow_tf32 is set (the ExecContext, kernels/exec_context.h), as the GEMMs.
//   - 16-bit operands with a 16-bit output and no bias run cuDNN's 16-bit convolution with FP32 compute type on
//     tensor cores (cuDNN's "pseudo half" configuration: FP32 accumulation, the output rounded once).
//   - Every other 16-bit case (an FP32 output, a bias, every weight gradient, which is FP32) runs on the operands
//     converted exactly to FP32, with tensor-core (TF32) math: a TF32 operand keeps 10 mantissa bits, and an fp16 or
//     bf16 value has at most 10, so the products are the exact products of the 16-bit values.
// Algorithms are cuDNN's heuristic choices (cudnnGet*Algorithm_v7, no timing runs), restricted to deterministic
// ones, so that a step computes the same bits every time, and to those that sum the products themselves (no FFT or
// Winograd transforms); the choice, its math type and its workspace are cached per shape. A 16-bit case for which
// cuDNN offers no such algorithm runs on the widened operands instead (the same contract).
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/cnn_checks.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/exec_context.h"
#include "runtime/kernels/kernels.h"

#ifdef AMPDIST_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/kernels/cuda/cuda_cnn_ops.h"
#include "runtime/kernels/cuda/tensor_launch.h"
#ifdef AMPDIST_HAVE_CUDNN
#include <cudnn.h>
#endif
#endif

namespace ampdist::kernels {
#if defined(AMPDIST_HAVE_CUDA) && defined(AMPDIST_HAVE_CUDNN)
bool gpu_convolutions() { return true; }
#else
bool gpu_convolutions() { return false; }
#endif
}  // namespace ampdist::kernels

namespace ampdist::kernels::cuda {

#ifdef AMPDIST_HAVE_CUDA

namespace {

using detail::code;
using detail::launch;
using detail::stream;

constexpr Device kGpu = Device::kCUDA;
using checks::Nchw;

// Device scratch of the current device, grown to the largest request (one stream: uses never overlap).
struct Scratch {
  Tensor t[6];
};
Tensor& scratch(int slot, const Shape& shape, DType dtype) {
  Tensor& t = device::per_current_device<Scratch>().t[slot];
  t.ensure(shape, dtype, Device::kCUDA);
  return t;
}
// Host doubles to a device scratch slot / a device slot to host doubles (the latter waits for the stream).
double* upload_sums(std::span<const double> v) {
  Tensor& t = scratch(0, {static_cast<int64_t>(v.size()) * 2}, DType::kFloat32);
  device::copy(t.data(), Device::kCUDA, v.data(), Device::kCPU, v.size() * sizeof(double));
  return static_cast<double*>(t.data());
}
double* sums_slot(size_t n) { return static_cast<double*>(scratch(0, {static_cast<int64_t>(n) * 2}, DType::kFloat32).data()); }
void download_sums(const double* dev, std::span<double> out) {
  device::copy(out.data(), Device::kCPU, dev, Device::kCUDA, out.size() * sizeof(double));
}

const void* relu_data(const Tensor* r) { return r ? r->data() : nullptr; }
int relu_code(const Tensor* r) { return r ? code(r->dtype()) : 0; }

}  // namespace

// ---- BatchNorm ------------------------------------------------------------------------------------------------

void batchnorm_sums(const Tensor& x, std::span<double> sums) {
  const Nchw d = checks::batchnorm("batchnorm", x, {}, {}, std::ssize(sums), kGpu);
  double* s = sums_slot(sums.size());
  launch([&] { ampdist::cuda::batchnorm_sums(x.data(), code(x.dtype()), d.n, d.c, d.hw, s, stream()); });
  download_sums(s, sums);
}

void batchnorm_apply(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                     const Tensor& beta, Tensor& y, bool relu) {
  const Nchw d = checks::batchnorm("batchnorm", x, {&y}, {&mean, &invstd, &gamma, &beta}, -1, kGpu);
  launch([&] {
    ampdist::cuda::batchnorm_apply(x.data(), code(x.dtype()), d.n, d.c, d.hw, mean.data_as<float>(),
                                   invstd.data_as<float>(), gamma.data_as<float>(), beta.data_as<float>(), y.data(),
                                   code(y.dtype()), relu, stream());
  });
}

void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                             std::span<double> sums, const Tensor* relu_y) {
  const Nchw d = checks::batchnorm("batchnorm backward", x, {&dy, relu_y}, {&mean, &invstd}, std::ssize(sums), kGpu);
  double* s = sums_slot(sums.size());
  launch([&] {
    ampdist::cuda::batchnorm_backward_sums(x.data(), code(x.dtype()), dy.data(), code(dy.dtype()), relu_data(relu_y),
                                           relu_code(relu_y), d.n, d.c, d.hw, mean.data_as<float>(),
                                           invstd.data_as<float>(), s, stream());
  });
  download_sums(s, sums);
}

void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                           const Tensor& gamma, std::span<const double> sums, double count, Tensor& dx,
                           const Tensor* relu_y) {
  const Nchw d = checks::batchnorm("batchnorm backward", x, {&dy, &dx, relu_y}, {&mean, &invstd, &gamma},
                                   std::ssize(sums), kGpu);
  const double* s = upload_sums(sums);
  launch([&] {
    ampdist::cuda::batchnorm_backward_dx(x.data(), code(x.dtype()), dy.data(), code(dy.dtype()), relu_data(relu_y),
                                         relu_code(relu_y), d.n, d.c, d.hw, mean.data_as<float>(),
                                         invstd.data_as<float>(), gamma.data_as<float>(), s, count, dx.data(),
                                         code(dx.dtype()), stream());
  });
}

using checks::channels_of;

void batchnorm_sums_to(const Tensor& x, double* sums) {
  const Nchw d = checks::batchnorm("batchnorm", x, {}, {}, 2 * channels_of(x), kGpu);
  launch([&] { ampdist::cuda::batchnorm_sums(x.data(), code(x.dtype()), d.n, d.c, d.hw, sums, stream()); });
}

void batchnorm_backward_sums_to(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                double* sums, const Tensor* relu_y) {
  const Nchw d =
      checks::batchnorm("batchnorm backward", x, {&dy, relu_y}, {&mean, &invstd}, 2 * channels_of(x), kGpu);
  launch([&] {
    ampdist::cuda::batchnorm_backward_sums(x.data(), code(x.dtype()), dy.data(), code(dy.dtype()), relu_data(relu_y),
                                           relu_code(relu_y), d.n, d.c, d.hw, mean.data_as<float>(),
                                           invstd.data_as<float>(), sums, stream());
  });
}

void batchnorm_backward_dx_from(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                                const Tensor& gamma, const double* sums, double count, Tensor& dx,
                                const Tensor* relu_y) {
  const Nchw d = checks::batchnorm("batchnorm backward", x, {&dy, &dx, relu_y}, {&mean, &invstd, &gamma},
                                   2 * channels_of(x), kGpu);
  launch([&] {
    ampdist::cuda::batchnorm_backward_dx(x.data(), code(x.dtype()), dy.data(), code(dy.dtype()), relu_data(relu_y),
                                         relu_code(relu_y), d.n, d.c, d.hw, mean.data_as<float>(),
                                         invstd.data_as<float>(), gamma.data_as<float>(), sums, count, dx.data(),
                                         code(dx.dtype()), stream());
  });
}

void batchnorm_statistics(const double* sums, double count, float eps, float momentum, Tensor& mean, Tensor& var,
                          Tensor& invstd, Tensor& running_mean, Tensor& running_var, Tensor& tracked) {
  const int64_t c = mean.numel();
  checks::batchnorm_channels("batchnorm_statistics", c, {&mean, &var, &invstd, &running_mean, &running_var}, kGpu);
  checks::batchnorm_channels("batchnorm_statistics", 1, {&tracked}, kGpu);
  launch([&] {
    ampdist::cuda::batchnorm_statistics(sums, c, count, eps, momentum, mean.data_as<float>(), var.data_as<float>(),
                                        invstd.data_as<float>(), running_mean.data_as<float>(),
                                        running_var.data_as<float>(), tracked.data_as<float>(), stream());
  });
}

void batchnorm_running_statistics(const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& mean,
                                  Tensor& var, Tensor& invstd) {
  const int64_t c = mean.numel();
  checks::batchnorm_channels("batchnorm_running_statistics", c, {&running_mean, &running_var, &mean, &var, &invstd}, kGpu);
  launch([&] {
    ampdist::cuda::batchnorm_running_statistics(running_mean.data_as<float>(), running_var.data_as<float>(), c, eps,
                                                mean.data_as<float>(), var.data_as<float>(), invstd.data_as<float>(),
                                                stream());
  });
}

void batchnorm_param_grads(const double* sums, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  const int64_t c = dgamma.numel();
  checks::batchnorm_channels("batchnorm_param_grads", c, {&dgamma, &dbeta}, kGpu);
  launch([&] {
    ampdist::cuda::batchnorm_param_grads(sums, c, dgamma.data_as<float>(), dbeta.data_as<float>(), accumulate,
                                         stream());
  });
}

void residual_add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  checks::residual_add(a, b, y, kGpu);
  launch([&] {
    ampdist::cuda::residual_add(a.data(), code(a.dtype()), b.data(), code(b.dtype()), y.numel(), y.data_as<float>(),
                                relu, stream());
  });
}

// ---- pooling --------------------------------------------------------------------------------------------------

namespace {
ampdist::cuda::PoolDims pool_dims(const PoolShape& s, const Tensor& in, const Tensor& out, int64_t argmax,
                                  const char* op) {
  checks::pool(op, s, in, out, argmax, kGpu);
  return {s.n * s.c, s.h, s.w, s.out_h(), s.out_w(), s.kernel, s.stride, s.pad};
}
}  // namespace

void maxpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y, std::span<int32_t> argmax) {
  const auto d = pool_dims(s, x, y, std::ssize(argmax), "maxpool2d");
  launch([&] { ampdist::cuda::maxpool2d_forward(x.data_as<float>(), d, y.data_as<float>(), argmax.data(), stream()); });
}

void maxpool2d_backward(const PoolShape& s, const Tensor& dy, std::span<const int32_t> argmax, Tensor& dx) {
  const auto d = pool_dims(s, dx, dy, std::ssize(argmax), "maxpool2d backward");
  launch([&] {
    ampdist::cuda::maxpool2d_backward(dy.data_as<float>(), argmax.data(), d, dx.data_as<float>(), stream());
  });
}

void avgpool2d_forward(const PoolShape& s, const Tensor& x, Tensor& y) {
  const auto d = pool_dims(s, x, y, -1, "avgpool2d");
  launch([&] { ampdist::cuda::avgpool2d_forward(x.data_as<float>(), d, y.data_as<float>(), stream()); });
}

void avgpool2d_backward(const PoolShape& s, const Tensor& dy, Tensor& dx) {
  const auto d = pool_dims(s, dx, dy, -1, "avgpool2d backward");
  launch([&] { ampdist::cuda::avgpool2d_backward(dy.data_as<float>(), d, dx.data_as<float>(), stream()); });
}

void global_avgpool2d_forward(const Tensor& x, Tensor& y) {
  const int64_t hw = checks::global_avgpool("global_avgpool2d", x, y, kGpu), rows = y.numel();
  launch([&] { ampdist::cuda::global_avgpool_forward(x.data_as<float>(), rows, hw, y.data_as<float>(), stream()); });
}

void global_avgpool2d_backward(const Tensor& dy, Tensor& dx) {
  const int64_t hw = checks::global_avgpool("global_avgpool2d backward", dx, dy, kGpu), rows = dy.numel();
  launch([&] { ampdist::cuda::global_avgpool_backward(dy.data_as<float>(), rows, hw, dx.data_as<float>(), stream()); });
}

// ---- convolutions ---------------------------------------------------------------------------------------------

#ifdef AMPDIST_HAVE_CUDNN

namespace {

void check_dnn(cudnnStatus_t st, const std::string& what) {
  if (st != CUDNN_STATUS_SUCCESS) throw Error("cuDNN " + what + ": " + cudnnGetErrorString(st));
}

// One cuDNN handle per device, on its compute stream.
struct Dnn {
  cudnnHandle_t handle = nullptr;
};
cudnnHandle_t dnn() {
  Dnn& d = device::per_current_device<Dnn>();
  if (!d.handle) {
    cudnnHandle_t h = nullptr;
    check_dnn(cudnnCreate(&h), "cudnnCreate on CUDA device " + std::to_string(device::current_device()));
    check_dnn(cudnnSetStream(h, static_cast<cudaStream_t>(stream())), "cudnnSetStream");
    d.handle = h;
  }
  return d.handle;
}

cudnnDataType_t dnn_type(DType t) {
  switch (t) {
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    case DType::kFloat32: break;
  }
  return CUDNN_DATA_FLOAT;
}

// The descriptors of one convolution shape in one operand dtype and math mode, and, per pass, the algorithm chosen
// for it with its math type and workspace (or that none qualifies).
enum class Pass { kForward = 0, kData = 1, kWeights = 2 };
enum class Choice { kUnknown, kChosen, kNone };
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Choice choice[3] = {Choice::kUnknown, Choice::kUnknown, Choice::kUnknown};
  int algo[3] = {0, 0, 0};
  cudnnMathType_t math[3] = {CUDNN_DEFAULT_MATH, CUDNN_DEFAULT_MATH, CUDNN_DEFAULT_MATH};
  size_t workspace[3] = {0, 0, 0};
};
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int>;
// The largest workspace an algorithm may ask for: one that needs more is passed over for the next one.
constexpr size_t kMaxWorkspace = size_t{1} << 30;

// What the operands' values allow: FMA only for FP32 inputs without allow_tf32 (TF32 would round them), tensor
// cores otherwise (exact for 16-bit values, and for 16-bit values widened to FP32: see the top of the file).
cudnnMathType_t math_for(DType operands, bool widened) {
  if (operands != DType::kFloat32 || widened) return CUDNN_TENSOR_OP_MATH;
  return kernels::current_exec_context().allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

ConvPlan& plan(const ConvShape& s, DType dtype, cudnnMathType_t math) {
  static std::map<PlanKey, ConvPlan>* plans = new std::map<PlanKey, ConvPlan>[64];
  auto& table = plans[device::current_device()];
  const PlanKey key{static_cast<int>(dtype), s.n, s.c, s.h, s.w, s.k, s.kh, s.kw, s.stride, s.pad, s.dilation,
                    s.groups, static_cast<int>(math)};
  auto it = table.find(key);
  if (it != table.end()) return it->second;
  ConvPlan p;
  const cudnnDataType_t t = dnn_type(dtype);
  const auto i = [](int64_t v) { return static_cast<int>(v); };  // ConvShape::validate: every size fits in an int
  check_dnn(cudnnCreateTensorDescriptor(&p.x), "cudnnCreateTensorDescriptor");
  check_dnn(cudnnCreateTensorDescriptor(&p.y), "cudnnCreateTensorDescriptor");
  check_dnn(cudnnCreateTensorDescriptor(&p.bias), "cudnnCreateTensorDescriptor");
  check_dnn(cudnnCreateFilterDescriptor(&p.w), "cudnnCreateFilterDescriptor");
  check_dnn(cudnnCreateConvolutionDescriptor(&p.conv), "cudnnCreateConvolutionDescriptor");
  check_dnn(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, t, i(s.n), i(s.c), i(s.h), i(s.w)), "x descriptor");
  check_dnn(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, t, i(s.n), i(s.k), i(s.out_h()), i(s.out_w())),
            "y descriptor");
  check_dnn(cudnnSetTensor4dDescriptor(p.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, i(s.k), 1, 1),
            "bias descriptor");
  check_dnn(cudnnSetFilter4dDescriptor(p.w, t, CUDNN_TENSOR_NCHW, i(s.k), i(s.c / s.groups), i(s.kh), i(s.kw)),
            "weight descriptor");
  check_dnn(cudnnSetConvolution2dDescriptor(p.conv, i(s.pad), i(s.pad), i(s.stride), i(s.stride), i(s.dilation),
                                            i(s.dilation), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "convolution descriptor");
  check_dnn(cudnnSetConvolutionGroupCount(p.conv, i(s.groups)), "cudnnSetConvolutionGroupCount");
  check_dnn(cudnnSetConvolutionMathType(p.conv, math), "cudnnSetConvolutionMathType");
  return table.emplace(key, p).first->second;
}

// Whether an algorithm forms each output as a sum of the products themselves (direct, GEMM and implicit-GEMM
// algorithms). FFT and Winograd algorithms transform the operands first, in FP32, so their products are not the
// exact products of the inputs: the contract above excludes them.
bool sums_products(Pass pass, int algo) {
  switch (pass) {
    case Pass::kForward:
      return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || algo == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
    case Pass::kData:
      return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    case Pass::kWeights:
      return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  }
  return false;
}
// Whether a result's math type is one the plan allows: FMA only means FMA only, and never a conversion of the
// operands to a narrower type (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION would round FP32 to FP16).
bool math_allowed(cudnnMathType_t allowed, cudnnMathType_t got) {
  if (got == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return allowed != CUDNN_FMA_MATH || got == CUDNN_FMA_MATH;
}

// The first of cuDNN's heuristic choices (cudnnGet*Algorithm_v7: ordered by expected speed, nothing timed) that
// sums products, is deterministic, has an allowed math type and fits kMaxWorkspace; Choice::kNone when none does.
template <typename Perf>
void choose(ConvPlan& p, Pass pass, const Perf* perf, int returned, cudnnMathType_t allowed) {
  const int k = static_cast<int>(pass);
  p.choice[k] = Choice::kNone;
  for (int r = 0; r < returned; ++r) {
    if (perf[r].status != CUDNN_STATUS_SUCCESS || perf[r].determinism != CUDNN_DETERMINISTIC ||
        perf[r].memory > kMaxWorkspace || !sums_products(pass, static_cast<int>(perf[r].algo)) ||
        !math_allowed(allowed, perf[r].mathType))
      continue;
    p.algo[k] = static_cast<int>(perf[r].algo);
    p.math[k] = perf[r].mathType;
    p.workspace[k] = perf[r].memory;
    p.choice[k] = Choice::kChosen;
    return;
  }
}

// The plan for (shape, dtype, math) with an algorithm chosen for `pass`, or null when cuDNN offers none that
// qualifies. The descriptor gets the chosen algorithm's math type (its workspace size is that combination's).
ConvPlan* ready_with(const ConvShape& s, DType dtype, cudnnMathType_t math, Pass pass) {
  ConvPlan& p = plan(s, dtype, math);
  const int k = static_cast<int>(pass);
  if (p.choice[k] == Choice::kUnknown) {
    int n = 0;
    if (pass == Pass::kForward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      check_dnn(cudnnGetConvolutionForwardAlgorithm_v7(dnn(), p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                       &n, perf),
                "cudnnGetConvolutionForwardAlgorithm_v7");
      choose(p, pass, perf, n, math);
    } else if (pass == Pass::kData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      check_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn(), p.w, p.y, p.conv, p.x,
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      choose(p, pass, perf, n, math);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      check_dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn(), p.x, p.y, p.conv, p.w,
                                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      choose(p, pass, perf, n, math);
    }
  }
  if (p.choice[k] != Choice::kChosen) return nullptr;
  check_dnn(cudnnSetConvolutionMathType(p.conv, p.math[k]), "cudnnSetConvolutionMathType");
  return &p;
}
// ready_with `math`, and for FP32 operands then with FMA math. Of the weight-gradient algorithms that sum products,
// cuDNN documents only ALGO_1 as deterministic (ALGO_0 and ALGO_3 add with atomics), and its heuristics need not
// offer ALGO_1 with tensor-core math for every shape; plain FP32 FMA math keeps the contract (each product is formed
// exactly inside the fused multiply-add, the sums are FP32), and is what an FP32 run without TF32 uses anyway.
ConvPlan* ready(const ConvShape& s, DType dtype, cudnnMathType_t math, Pass pass) {
  if (ConvPlan* p = ready_with(s, dtype, math, pass)) return p;
  if (dtype != DType::kFloat32 || math == CUDNN_FMA_MATH) return nullptr;
  return ready_with(s, dtype, CUDNN_FMA_MATH, pass);
}
[[noreturn]] void no_algorithm(const char* what) {
  throw Error(std::string("cuDNN ") + what +
              ": no deterministic direct or implicit-GEMM algorithm for this shape within 1 GiB of workspace");
}

void* workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  return scratch(5, {static_cast<int64_t>((bytes + 3) / 4)}, DType::kFloat32).data();
}

// y = conv(x, w) with operands of `dtype` (y in that dtype); false when no algorithm qualifies.
bool forward_into(const ConvShape& s, DType dtype, cudnnMathType_t math, const void* x, const void* w, void* y) {
  ConvPlan* p = ready(s, dtype, math, Pass::kForward);
  if (!p) return false;
  const float one = 1.0f, zero = 0.0f;
  check_dnn(cudnnConvolutionForward(dnn(), &one, p->x, x, p->w, w, p->conv,
                                    static_cast<cudnnConvolutionFwdAlgo_t>(p->algo[0]), workspace(p->workspace[0]),
                                    p->workspace[0], &zero, p->y, y),
            "cudnnConvolutionForward");
  return true;
}

bool data_into(const ConvShape& s, DType dtype, cudnnMathType_t math, const void* dy, const void* w, void* dx) {
  ConvPlan* p = ready(s, dtype, math, Pass::kData);
  if (!p) return false;
  const float one = 1.0f, zero = 0.0f;
  check_dnn(cudnnConvolutionBackwardData(dnn(), &one, p->w, w, p->y, dy, p->conv,
                                         static_cast<cudnnConvolutionBwdDataAlgo_t>(p->algo[1]),
                                         workspace(p->workspace[1]), p->workspace[1], &zero, p->x, dx),
            "cudnnConvolutionBackwardData");
  return true;
}

// A 16-bit tensor's values converted exactly to FP32 in scratch slot `slot` (1 to 3), or an FP32 tensor itself.
const void* fp32_of(const Tensor& t, int slot) {
  if (t.dtype() == DType::kFloat32) return t.data();
  Tensor& c = scratch(slot, t.shape(), DType::kFloat32);
  kernels::cast(t, c);
  return c.data();
}

void add_bias(const ConvShape& s, DType dtype, cudnnMathType_t math, const Tensor& bias, void* y) {
  const float one = 1.0f;
  ConvPlan& p = plan(s, dtype, math);
  check_dnn(cudnnAddTensor(dnn(), &one, p.bias, bias.data(), &one, p.y, y), "cudnnAddTensor (bias)");
}

}  // namespace

void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  checks::conv2d_forward(s, x, w, bias, y, kGpu);
  if (s.n == 0) return;
  const DType d = x.dtype();
  if (d == DType::kFloat32) {
    if (!forward_into(s, d, math_for(d, false), x.data(), w.data(), y.data())) no_algorithm("convolution forward");
    if (bias) add_bias(s, d, math_for(d, false), *bias, y.data());
    return;
  }
  // 16-bit operands: natively when the output is 16-bit and there is no bias, and cuDNN has an algorithm; else on
  // the exactly widened operands, the FP32 result (bias added) rounded once into y.
  if (y.dtype() == d && !bias && forward_into(s, d, math_for(d, false), x.data(), w.data(), y.data())) return;
  Tensor& y32 = y.dtype() == DType::kFloat32 ? y : scratch(3, y.shape(), DType::kFloat32);
  const cudnnMathType_t m = math_for(d, true);
  if (!forward_into(s, DType::kFloat32, m, fp32_of(x, 1), fp32_of(w, 2), y32.data()))
    no_algorithm("convolution forward");
  if (bias) add_bias(s, DType::kFloat32, m, *bias, y32.data());
  if (&y32 != &y) kernels::cast(y32, y);
}

void conv2d_backward_data(const ConvShape& s, const Tensor& dy, const Tensor& w, Tensor& dx) {
  checks::conv2d_backward_data(s, dy, w, dx, kGpu);
  if (s.n == 0) return;
  const DType d = dy.dtype();
  if (d == DType::kFloat32) {
    if (!data_into(s, d, math_for(d, false), dy.data(), w.data(), dx.data())) no_algorithm("convolution backward data");
    return;
  }
  if (dx.dtype() == d && data_into(s, d, math_for(d, false), dy.data(), w.data(), dx.data())) return;
  Tensor& dx32 = dx.dtype() == DType::kFloat32 ? dx : scratch(3, dx.shape(), DType::kFloat32);
  if (!data_into(s, DType::kFloat32, math_for(d, true), fp32_of(dy, 1), fp32_of(w, 2), dx32.data()))
    no_algorithm("convolution backward data");
  if (&dx32 != &dx) kernels::cast(dx32, dx);
}

void conv2d_backward_weights(const ConvShape& s, const Tensor& x, const Tensor& dy, Tensor& dw, Tensor* dbias,
                             bool accumulate) {
  checks::conv2d_backward_weights(s, x, dy, dw, dbias, kGpu);
  if (s.n == 0) {  // as the CPU: nothing to add, or zero gradients
    if (!accumulate) {
      device::memset_zero(dw.data(), dw.nbytes());
      if (dbias) device::memset_zero(dbias->data(), dbias->nbytes());
    }
    return;
  }
  // The gradient is FP32, so 16-bit operands are widened exactly and run in FP32 (tensor cores: exact for them).
  const DType d = x.dtype();
  ConvPlan* p = ready(s, DType::kFloat32, math_for(d, d != DType::kFloat32), Pass::kWeights);
  if (!p) no_algorithm("convolution weight gradient");
  const void* x32 = fp32_of(x, 1);
  const void* dy32 = fp32_of(dy, 2);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_dnn(cudnnConvolutionBackwardFilter(dnn(), &one, p->x, x32, p->y, dy32, p->conv,
                                           static_cast<cudnnConvolutionBwdFilterAlgo_t>(p->algo[2]),
                                           workspace(p->workspace[2]), p->workspace[2], &beta, p->w, dw.data()),
            "cudnnConvolutionBackwardFilter");
  if (dbias)
    check_dnn(cudnnConvolutionBackwardBias(dnn(), &one, p->y, dy32, &beta, p->bias, dbias->data()),
              "cudnnConvolutionBackwardBias");
}

#else  // CUDA without cuDNN

namespace {
[[noreturn]] void no_cudnn(const char* op) {
  throw Error(std::string(op) + ": tensor on the GPU, but this build has no cuDNN (configure where cudnn.h and "
                                "libcudnn are found)");
}
}  // namespace
void conv2d_forward(const ConvShape&, const Tensor&, const Tensor&, const Tensor*, Tensor&) { no_cudnn("conv2d"); }
void conv2d_backward_data(const ConvShape&, const Tensor&, const Tensor&, Tensor&) { no_cudnn("conv2d backward"); }
void conv2d_backward_weights(const ConvShape&, const Tensor&, const Tensor&, Tensor&, Tensor*, bool) {
  no_cudnn("conv2d weight gradient");
}

#endif  // AMPDIST_HAVE_CUDNN

#else  // no CUDA backend

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(std::string(op) + ": tensor on the GPU, but this build has no CUDA backend");
}
}  // namespace

void conv2d_forward(const ConvShape&, const Tensor&, const Tensor&, const Tensor*, Tensor&) { no_cuda("conv2d"); }
void conv2d_backward_data(const ConvShape&, const Tensor&, const Tensor&, Tensor&) { no_cuda("conv2d backward"); }
void conv2d_backward_weights(const ConvShape&, const Tensor&, const Tensor&, Tensor&, Tensor*, bool) {
  no_cuda("conv2d weight gradient");
}
void batchnorm_sums(const Tensor&, std::span<double>) { no_cuda("batchnorm"); }
void batchnorm_apply(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, bool) {
  no_cuda("batchnorm");
}
void batchnorm_backward_sums(const Tensor&, const Tensor&, const Tensor&, const Tensor&, std::span<double>,
                             const Tensor*) {
  no_cuda("batchnorm backward");
}
void batchnorm_backward_dx(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           std::span<const double>, double, Tensor&, const Tensor*) {
  no_cuda("batchnorm backward");
}
void batchnorm_sums_to(const Tensor&, double*) { no_cuda("batchnorm"); }
void batchnorm_backward_sums_to(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double*, const Tensor*) {
  no_cuda("batchnorm backward");
}
void batchnorm_backward_dx_from(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const double*, double, Tensor&, const Tensor*) {
  no_cuda("batchnorm backward");
}
void batchnorm_statistics(const double*, double, float, float, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
  no_cuda("batchnorm");
}
void batchnorm_running_statistics(const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) {
  no_cuda("batchnorm");
}
void batchnorm_param_grads(const double*, Tensor&, Tensor&, bool) { no_cuda("batchnorm backward"); }
void residual_add(const Tensor&, const Tensor&, Tensor&, bool) { no_cuda("residual_add"); }
void maxpool2d_forward(const PoolShape&, const Tensor&, Tensor&, std::span<int32_t>) { no_cuda("maxpool2d"); }
void maxpool2d_backward(const PoolShape&, const Tensor&, std::span<const int32_t>, Tensor&) {
  no_cuda("maxpool2d backward");
}
void avgpool2d_forward(const PoolShape&, const Tensor&, Tensor&) { no_cuda("avgpool2d"); }
void avgpool2d_backward(const PoolShape&, const Tensor&, Tensor&) { no_cuda("avgpool2d backward"); }
void global_avgpool2d_forward(const Tensor&, Tensor&) { no_cuda("global_avgpool2d"); }
void global_avgpool2d_backward(const Tensor&, Tensor&) { no_cuda("global_avgpool2d backward"); }

#endif  // AMPDIST_HAVE_CUDA

}  // namespace ampdist::kernels::cuda
