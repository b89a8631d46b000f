// The CUDA backend of kernels/transformer.h over Tensors: the checks of the CPU side, inputs that live on the host
// (token ids, key masks, window ids) copied to the device, and the launchers of cuda_transformer_ops.h. Without the
// CUDA backend every entry point throws Error.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/backends.h"
#include "runtime/kernels/transformer_checks.h"

#ifdef AMPDIST_HAVE_CUDA
#include <stdexcept>

#include "runtime/kernels/cuda/cuda_ops.h"
#include "runtime/kernels/cuda/cuda_transformer_ops.h"
#include "runtime/kernels/cuda/tensor_launch.h"
#endif

namespace ampdist::kernels::cuda {

#ifdef AMPDIST_HAVE_CUDA

namespace {

using detail::code;
using detail::launch;
using detail::stream;

// Host values copied into a device scratch slot (grown to the largest request; one stream, so uses never overlap).
struct Buffers {
  Tensor upload[6], scratch[8];
};
template <typename T> const T* upload(int slot, std::span<const T> v) {
  Tensor* buf = device::per_current_device<Buffers>().upload;
  const int64_t words = static_cast<int64_t>((v.size() * sizeof(T) + 3) / 4);
  buf[slot].ensure({std::max<int64_t>(words, 1)}, DType::kFloat32, Device::kCUDA);
  device::copy(buf[slot].data(), Device::kCUDA, v.data(), Device::kCPU, v.size() * sizeof(T));
  return static_cast<const T*>(buf[slot].data());
}
Tensor& scratch(int slot, const Shape& shape, DType dtype = DType::kFloat32) {
  Tensor* t = device::per_current_device<Buffers>().scratch;
  t[slot].ensure(shape, dtype, Device::kCUDA);
  return t[slot];
}

// One operand of a batched GEMM: a base pointer and its dtype (offsets are in elements of that dtype).
struct Operand {
  const void* data;
  DType dtype;
  const void* at(int64_t elements) const {
    return static_cast<const char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
  }
};

void batched_gemm(bool trans_x, bool trans_y, int64_t m, int64_t n, int64_t k, float alpha, const void* x, DType xt,
                  int64_t ldx, int64_t sx, const void* y, DType yt, int64_t ldy, int64_t sy, float* c, int64_t ldc,
                  int64_t sc, int64_t batch, const char* what) {
  kernels::cuda::batched_gemm(trans_x, trans_y, m, n, k, alpha, x, code(xt), ldx, sx, y, code(yt), ldy, sy, c, ldc, sc,
                              batch, what);
}

// t itself when it already has dtype d, else a copy converted into scratch `slot`.
Operand as_dtype(const Tensor& t, DType d, int slot) {
  if (t.dtype() == d) return {t.data(), d};
  Tensor& c = scratch(slot, t.shape(), d);
  kernels::cast(t, c);
  return {c.data(), d};
}

}  // namespace

void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       Tensor& out) {
  checks::embedding_forward(tokens, seq_len, wte, wpe, out, Device::kCUDA);
  const int64_t n = static_cast<int64_t>(tokens.size()), c = wte.dim(1);
  const int32_t* t = upload<int32_t>(0, tokens);
  launch([&] {
    ampdist::cuda::embedding_forward(t, n, seq_len, c, static_cast<const float*>(wte.data()),
                                     static_cast<const float*>(wpe.data()), static_cast<float*>(out.data()), stream());
  });
}

void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,
                        bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe) {
  checks::embedding_backward(tokens, seq_len, dout, dwte, dwpe, Device::kCUDA);
  const int64_t n = static_cast<int64_t>(tokens.size()), c = dwte.dim(1), vocab = dwte.dim(0);
  if (overwrite_wte) device::memset_zero(dwte.data(), dwte.nbytes());
  if (overwrite_wpe) device::memset_zero(dwpe.data(), dwpe.nbytes());
  // The rows of each distinct token in increasing order (a counting sort on the host, where the tokens are), so
  // the device adds them as the CPU does and no two threads write one element.
  thread_local std::vector<int32_t> count, uniq, begin, rows;
  count.assign(static_cast<size_t>(vocab) + 1, 0);
  for (int32_t t : tokens) ++count[static_cast<size_t>(t) + 1];
  uniq.clear();
  begin.assign(1, 0);
  for (int64_t v = 0; v < vocab; ++v) {
    if (count[static_cast<size_t>(v) + 1] == 0) continue;
    uniq.push_back(static_cast<int32_t>(v));
    begin.push_back(begin.back() + count[static_cast<size_t>(v) + 1]);
  }
  for (int64_t v = 0; v < vocab; ++v) count[static_cast<size_t>(v) + 1] += count[static_cast<size_t>(v)];
  rows.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) rows[static_cast<size_t>(count[static_cast<size_t>(tokens[r])]++)] = static_cast<int32_t>(r);
  const int32_t* u = upload<int32_t>(3, std::span<const int32_t>(uniq));
  const int32_t* b = upload<int32_t>(4, std::span<const int32_t>(begin));
  const int32_t* rw = upload<int32_t>(5, std::span<const int32_t>(rows));
  launch([&] {
    ampdist::cuda::embedding_backward(u, b, rw, static_cast<int64_t>(uniq.size()), n, seq_len, c, dout.data(),
                                      code(dout.dtype()), static_cast<float*>(dwte.data()),
                                      static_cast<float*>(dwpe.data()), stream());
  });
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  checks::layernorm_forward(x, gamma, beta, y, mean, rstd, Device::kCUDA);
  const int64_t n = x.dim(0), c = x.dim(1);
  launch([&] {
    ampdist::cuda::layernorm_forward(x.data(), code(x.dtype()), n, c, static_cast<const float*>(gamma.data()),
                                     static_cast<const float*>(beta.data()), eps, y.data(), code(y.dtype()),
                                     static_cast<float*>(mean.data()), static_cast<float*>(rstd.data()), stream());
  });
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dgamma, Tensor& dbeta,
                        bool accumulate_params) {
  checks::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, Device::kCUDA);
  const int64_t n = x.dim(0), c = x.dim(1);
  launch([&] {
    ampdist::cuda::layernorm_backward(x.data(), code(x.dtype()), dy.data(), code(dy.dtype()), n, c,
                                      static_cast<const float*>(gamma.data()), static_cast<const float*>(mean.data()),
                                      static_cast<const float*>(rstd.data()), static_cast<float*>(dx.data()),
                                      accumulate_dx, static_cast<float*>(dgamma.data()),
                                      static_cast<float*>(dbeta.data()), accumulate_params, stream());
  });
}


// Attention as cuBLAS strided-batched GEMMs (one call per window b, batched over the H heads, whose slices of the
// [B*T, 3C] qkv rows are hs apart) around a warp-per-row softmax:
//   scores = q k^T / sqrt(hs) (FP32 accumulation, into probs) -> softmax in place -> out = round(p) v.
// The products follow the autocast table: q k^T from the working dtype's exact values, FP32 scores and softmax,
// p @ v with p rounded to pv_dtype; the backward keeps ds in FP32 (as the CPU), so ds k and ds^T q are FP32 GEMMs.
void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  checks::attention_forward(qkv, s, key_mask, probs, out, Device::kCUDA);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  if (B * H * T == 0) return;
  const uint8_t* mask = key_mask.empty() ? nullptr : upload<uint8_t>(1, key_mask);
  // The output is summed in FP32 and rounded once into out (in place when out is FP32).
  Tensor o32 = out.dtype() == DType::kFloat32 ? out : scratch(0, {B * T, C});
  const DType qt = qkv.dtype();
  // p @ v needs both operands in one dtype: the working dtype when p is rounded to it, else FP32 (p rounded to
  // pv_dtype but stored as FP32, v converted exactly).
  const DType op_t = pv_dtype == qt ? qt : DType::kFloat32;
  float* pp = static_cast<float*>(probs.data());
  const Operand q{qkv.data(), qt};
  const int64_t ld3 = 3 * C, per_window = H * T * T;
  launch([&] {
    for (int64_t b = 0; b < B; ++b)
      batched_gemm(false, true, T, T, hs, 1.0f / std::sqrt(static_cast<float>(hs)), q.at(b * T * ld3), qt, ld3, hs,
                   q.at(b * T * ld3 + C), qt, ld3, hs, pp + b * per_window, T, T * T, H, "attention scores");
    Operand pr{pp, DType::kFloat32};
    void* pr_out = nullptr;
    if (op_t != DType::kFloat32 || pv_dtype != DType::kFloat32) {
      Tensor& prt = scratch(2, {B * per_window}, op_t);
      pr_out = prt.data();
      pr = {prt.data(), op_t};
    }
    ampdist::cuda::attention_softmax_forward(pp, B, T, H, mask, code(pv_dtype), pr_out, code(op_t), stream());
    const Operand v = as_dtype(qkv, op_t, 3);
    for (int64_t b = 0; b < B; ++b)
      batched_gemm(false, false, T, hs, T, 1.0f, pr.at(b * per_window), op_t, T, T * T, v.at(b * T * ld3 + 2 * C),
                   op_t, ld3, hs, static_cast<float*>(o32.data()) + b * T * C, C, hs, H, "attention p @ v");
  });
  if (out.dtype() != DType::kFloat32) kernels::cast(o32, out);
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,
                        const Tensor& dout, Tensor& dqkv) {
  checks::attention_backward(qkv, probs, s, dout, dqkv, Device::kCUDA);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  Tensor d32 = dqkv.dtype() == DType::kFloat32 ? dqkv : scratch(1, {B * T, 3 * C});
  if (B * H * T == 0) {
    device::memset_zero(d32.data(), d32.nbytes());
    if (dqkv.dtype() != DType::kFloat32) kernels::cast(d32, dqkv);
    return;
  }
  const int64_t ld3 = 3 * C, per_window = H * T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float* pp = static_cast<const float*>(probs.data());
  Tensor& dp = scratch(4, {B * per_window});
  float* d = static_cast<float*>(d32.data());
  launch([&] {
    // dv = round(p)^T g: 16-bit operands when p's rounding and g share a dtype (exact inputs), else FP32.
    const DType gt = dout.dtype();
    const DType dv_t = pv_dtype == gt ? gt : DType::kFloat32;
    Operand pr{pp, DType::kFloat32};
    if (dv_t != DType::kFloat32 || pv_dtype != DType::kFloat32) {
      Tensor& prt = scratch(2, {B * per_window}, dv_t);
      ampdist::cuda::round_probs(pp, B * per_window, code(pv_dtype), prt.data(), code(dv_t), stream());
      pr = {prt.data(), dv_t};
    }
    const Operand g_dv = as_dtype(dout, dv_t, 5);
    for (int64_t b = 0; b < B; ++b)
      batched_gemm(true, false, T, hs, T, 1.0f, pr.at(b * per_window), dv_t, T, T * T, g_dv.at(b * T * C), dv_t, C,
                   hs, d + b * T * ld3 + 2 * C, ld3, hs, H, "attention dv");
    // dp = g v^T, from exact inputs in one dtype.
    const DType dp_t = gt == qkv.dtype() ? gt : DType::kFloat32;
    const Operand g_dp = as_dtype(dout, dp_t, 5), v = as_dtype(qkv, dp_t, 3);
    for (int64_t b = 0; b < B; ++b)
      batched_gemm(false, true, T, T, hs, 1.0f, g_dp.at(b * T * C), dp_t, C, hs, v.at(b * T * ld3 + 2 * C), dp_t,
                   ld3, hs, static_cast<float*>(dp.data()) + b * per_window, T, T * T, H, "attention dp");
    ampdist::cuda::attention_softmax_backward(pp, static_cast<float*>(dp.data()), B * H * T, T, scale, stream());
    // dq = ds k, dk = ds^T q in FP32 (ds is FP32, as on the CPU).
    const Operand q32 = as_dtype(qkv, DType::kFloat32, 6);
    const Operand ds{dp.data(), DType::kFloat32};
    for (int64_t b = 0; b < B; ++b) {
      batched_gemm(false, false, T, hs, T, 1.0f, ds.at(b * per_window), DType::kFloat32, T, T * T,
                   q32.at(b * T * ld3 + C), DType::kFloat32, ld3, hs, d + b * T * ld3, ld3, hs, H, "attention dq");
      batched_gemm(true, false, T, hs, T, 1.0f, ds.at(b * per_window), DType::kFloat32, T, T * T,
                   q32.at(b * T * ld3), DType::kFloat32, ld3, hs, d + b * T * ld3 + C, ld3, hs, H, "attention dk");
    }
  });
  if (dqkv.dtype() != DType::kFloat32) kernels::cast(d32, dqkv);
}

static_assert(ampdist::cuda::kFlashKeyBlock == kernels::kFlashKeyBlock && kernels::kFlashQueryBlock == 64,
              "the GPU's fused attention uses the CPU's blocks (transformer_kernels.cu's kFlashRows is 64)");

// Fused attention: the kernels of transformer_kernels.cu; the backward's dq, dk and dv are written in FP32 into dqkv
// (or a scratch, rounded once into a 16-bit dqkv).
void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                             DType pv_dtype, Tensor& stats, Tensor& out) {
  checks::flash_attention_forward(qkv, s, key_mask, stats, out, Device::kCUDA);
  if (!ampdist::cuda::flash_attention_head_size_supported(s.head_dim))
    throw Error("flash_attention_forward: head size " + std::to_string(s.head_dim) +
                    " is not one the GPU kernels are built for (8, 16, 32, 64, 128); set model.gpt.attention: MATERIALIZED",
                ErrorKind::kBadInput);
  const uint8_t* mask = key_mask.empty() ? nullptr : upload<uint8_t>(1, key_mask);
  launch([&] {
    ampdist::cuda::flash_attention_forward(qkv.data(), code(qkv.dtype()), s.batch, s.seq_len, s.n_head, s.head_dim,
                                           mask, code(pv_dtype), out.data(), code(out.dtype()),
                                           static_cast<float*>(stats.data()), stream());
  });
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,
                              std::span<const uint8_t> key_mask, DType pv_dtype, const Tensor& dout, Tensor& dqkv) {
  checks::flash_attention_backward(qkv, out, stats, s, key_mask, dout, dqkv, Device::kCUDA);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, C = s.channels();
  Tensor d32 = dqkv.dtype() == DType::kFloat32 ? dqkv : scratch(1, {B * T, 3 * C});
  Tensor& D = scratch(3, {std::max<int64_t>(B * H * T, 1)});
  const uint8_t* mask = key_mask.empty() ? nullptr : upload<uint8_t>(1, key_mask);
  launch([&] {
    ampdist::cuda::flash_attention_backward(qkv.data(), code(qkv.dtype()), out.data(), code(out.dtype()),
                                            static_cast<const float*>(stats.data()), dout.data(), code(dout.dtype()),
                                            B, T, H, s.head_dim, mask, code(pv_dtype),
                                            static_cast<float*>(D.data()), static_cast<float*>(d32.data()), stream());
  });
  if (dqkv.dtype() != DType::kFloat32) kernels::cast(d32, dqkv);
}

void dropout_inplace(Tensor& x, float p, const DropoutKey& key, std::span<const uint32_t> sample_ids,
                     int64_t seq_len) {
  if (!checks::dropout(x, p, sample_ids, seq_len, Device::kCUDA)) return;
  const uint32_t* ids = upload<uint32_t>(2, sample_ids);
  launch([&] {
    ampdist::cuda::dropout_inplace(x.data(), code(x.dtype()), x.dim(0), x.dim(1), seq_len, p, key.seed, key.step,
                                   key.site, ids, stream());
  });
}

void add_inplace(Tensor& x, const Tensor& y) {
  checks::add_inplace(x, y, Device::kCUDA);
  launch([&] {
    ampdist::cuda::add_inplace(static_cast<float*>(x.data()), y.data(), code(y.dtype()), x.numel(), stream());
  });
}

#else  // no CUDA backend

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(std::string(op) + ": tensor on the GPU, but this build has no CUDA backend");
}
}  // namespace

void embedding_forward(std::span<const int32_t>, int64_t, const Tensor&, const Tensor&, Tensor&) {
  no_cuda("embedding_forward");
}
void embedding_backward(std::span<const int32_t>, int64_t, const Tensor&, Tensor&, bool, Tensor&, bool) {
  no_cuda("embedding_backward");
}
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) {
  no_cuda("layernorm_forward");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, bool,
                        Tensor&, Tensor&, bool) {
  no_cuda("layernorm_backward");
}
void attention_forward(const Tensor&, const AttentionShape&, std::span<const uint8_t>, DType, Tensor&, Tensor&) {
  no_cuda("attention_forward");
}
void attention_backward(const Tensor&, const Tensor&, const AttentionShape&, DType, const Tensor&, Tensor&) {
  no_cuda("attention_backward");
}
void flash_attention_forward(const Tensor&, const AttentionShape&, std::span<const uint8_t>, DType, Tensor&, Tensor&) {
  no_cuda("flash_attention_forward");
}
void flash_attention_backward(const Tensor&, const Tensor&, const Tensor&, const AttentionShape&,
                              std::span<const uint8_t>, DType, const Tensor&, Tensor&) {
  no_cuda("flash_attention_backward");
}
void dropout_inplace(Tensor&, float, const DropoutKey&, std::span<const uint32_t>, int64_t) {
  no_cuda("dropout_inplace");
}
void add_inplace(Tensor&, const Tensor&) { no_cuda("add_inplace"); }

#endif

}  // namespace ampdist::kernels::cuda
