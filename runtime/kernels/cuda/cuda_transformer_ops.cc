// The CUDA backend of kernels/transformer.h over Tensors: the checks of the CPU side, inputs that live on the host
// (token ids, key masks, window ids) copied to the device, and the launchers of cuda_transformer_ops.h. Without the
// CUDA backend every entry point throws Error.
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer_backends.h"

#ifdef AMPDIST_HAVE_CUDA
#include <stdexcept>

#include "runtime/kernels/cuda/cuda_transformer_ops.h"
#endif

namespace ampdist::kernels::cuda {

#ifdef AMPDIST_HAVE_CUDA

namespace {

int code(DType t) { return static_cast<int>(t); }
void* stream() { return device::compute_stream(); }

void require_cuda(const char* op, const char* what, const Tensor& t) {
  if (t.device() != Device::kCUDA)
    throw Error(std::string(op) + ": " + what + " on " + device_name(t.device()) + " mixed with tensors on the GPU");
}
void require_shape(const char* op, const char* what, const Tensor& t, const Shape& want) {
  require_cuda(op, what, t);
  if (t.shape() != want)
    throw Error(std::string(op) + ": " + what + " is " + shape_str(t.shape()) + ", expected " + shape_str(want));
}
void require_fp32(const char* op, const char* what, const Tensor& t) {
  if (t.dtype() != DType::kFloat32)
    throw Error(std::string(op) + ": " + what + " must be fp32, got " + dtype_name(t.dtype()));
}
template <typename F> void launch(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

// Host values copied into a device scratch slot (grown to the largest request; one stream, so uses never overlap).
template <typename T> const T* upload(int slot, std::span<const T> v) {
  static Tensor buf[3];
  const int64_t words = static_cast<int64_t>((v.size() * sizeof(T) + 3) / 4);
  buf[slot].ensure({std::max<int64_t>(words, 1)}, DType::kFloat32, Device::kCUDA);
  device::copy(buf[slot].data(), Device::kCUDA, v.data(), Device::kCPU, v.size() * sizeof(T));
  return static_cast<const T*>(buf[slot].data());
}
Tensor& scratch(int slot, const Shape& shape) {
  static Tensor t[3];
  t[slot].ensure(shape, DType::kFloat32, Device::kCUDA);
  return t[slot];
}

}  // namespace

void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       Tensor& out) {
  const char* op = "embedding_forward";
  require_cuda(op, "wte", wte);
  require_cuda(op, "wpe", wpe);
  require_fp32(op, "wte", wte);
  require_fp32(op, "wpe", wpe);
  if (wte.ndim() != 2 || wpe.ndim() != 2 || wte.dim(1) != wpe.dim(1))
    throw Error(std::string(op) + ": wte " + shape_str(wte.shape()) + " and wpe " + shape_str(wpe.shape()) +
                " must be [V, C] and [T_max, C]");
  const int64_t n = static_cast<int64_t>(tokens.size()), c = wte.dim(1), v = wte.dim(0);
  if (seq_len <= 0 || seq_len > wpe.dim(0) || n % seq_len != 0)
    throw Error(std::string(op) + ": " + std::to_string(n) + " tokens are not windows of " +
                std::to_string(seq_len) + " <= " + std::to_string(wpe.dim(0)) + " positions");
  require_shape(op, "out", out, {n, c});
  require_fp32(op, "out", out);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t tok = tokens[static_cast<size_t>(r)];
    if (tok < 0 || tok >= v)
      throw Error(std::string(op) + ": token " + std::to_string(tok) + " at position " + std::to_string(r) +
                      " is outside the vocabulary [0, " + std::to_string(v) + ")",
                  ErrorKind::kBadInput);
  }
  const int32_t* t = upload<int32_t>(0, tokens);
  launch([&] {
    ampdist::cuda::embedding_forward(t, n, seq_len, c, static_cast<const float*>(wte.data()),
                                     static_cast<const float*>(wpe.data()), static_cast<float*>(out.data()), stream());
  });
}

void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,
                        bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe) {
  const char* op = "embedding_backward";
  require_cuda(op, "dwte", dwte);
  require_cuda(op, "dwpe", dwpe);
  require_fp32(op, "dwte", dwte);
  require_fp32(op, "dwpe", dwpe);
  const int64_t n = static_cast<int64_t>(tokens.size()), c = dwte.dim(1), v = dwte.dim(0);
  require_shape(op, "dout", dout, {n, c});
  if (dwpe.dim(1) != c || seq_len <= 0 || seq_len > dwpe.dim(0))
    throw Error(std::string(op) + ": dwpe " + shape_str(dwpe.shape()) + " does not match " + std::to_string(c) +
                " channels and " + std::to_string(seq_len) + " positions");
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= v) throw Error(std::string(op) + ": token " + std::to_string(tok) + " outside the vocabulary");
  if (overwrite_wte) device::memset_zero(dwte.data(), dwte.nbytes());
  if (overwrite_wpe) device::memset_zero(dwpe.data(), dwpe.nbytes());
  const int32_t* t = upload<int32_t>(0, tokens);
  launch([&] {
    ampdist::cuda::embedding_backward(t, n, seq_len, c, dout.data(), code(dout.dtype()),
                                      static_cast<float*>(dwte.data()), static_cast<float*>(dwpe.data()), stream());
  });
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  const char* op = "layernorm_forward";
  require_cuda(op, "x", x);
  if (x.ndim() != 2) throw Error(std::string(op) + ": x is " + shape_str(x.shape()) + ", expected [N, C]");
  const int64_t n = x.dim(0), c = x.dim(1);
  require_shape(op, "gamma", gamma, {c});
  require_shape(op, "beta", beta, {c});
  require_fp32(op, "gamma", gamma);
  require_fp32(op, "beta", beta);
  require_shape(op, "y", y, {n, c});
  require_shape(op, "mean", mean, {n});
  require_shape(op, "rstd", rstd, {n});
  require_fp32(op, "mean", mean);
  require_fp32(op, "rstd", rstd);
  launch([&] {
    ampdist::cuda::layernorm_forward(x.data(), code(x.dtype()), n, c, static_cast<const float*>(gamma.data()),
                                     static_cast<const float*>(beta.data()), eps, y.data(), code(y.dtype()),
                                     static_cast<float*>(mean.data()), static_cast<float*>(rstd.data()), stream());
  });
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dgamma, Tensor& dbeta,
                        bool accumulate_params) {
  const char* op = "layernorm_backward";
  require_cuda(op, "x", x);
  if (x.ndim() != 2) throw Error(std::string(op) + ": x is " + shape_str(x.shape()) + ", expected [N, C]");
  const int64_t n = x.dim(0), c = x.dim(1);
  require_shape(op, "dy", dy, {n, c});
  require_shape(op, "dx", dx, {n, c});
  require_fp32(op, "dx", dx);
  require_shape(op, "dgamma", dgamma, {c});
  require_shape(op, "dbeta", dbeta, {c});
  require_fp32(op, "dgamma", dgamma);
  require_fp32(op, "dbeta", dbeta);
  require_shape(op, "gamma", gamma, {c});
  require_shape(op, "mean", mean, {n});
  require_shape(op, "rstd", rstd, {n});
  launch([&] {
    ampdist::cuda::layernorm_backward(x.data(), code(x.dtype()), dy.data(), code(dy.dtype()), n, c,
                                      static_cast<const float*>(gamma.data()), static_cast<const float*>(mean.data()),
                                      static_cast<const float*>(rstd.data()), static_cast<float*>(dx.data()),
                                      accumulate_dx, static_cast<float*>(dgamma.data()),
                                      static_cast<float*>(dbeta.data()), accumulate_params, stream());
  });
}

namespace {
void check_attention(const char* op, const Tensor& qkv, const AttentionShape& s) {
  if (s.batch < 0 || s.seq_len <= 0 || s.n_head <= 0 || s.head_dim <= 0)
    throw Error(std::string(op) + ": bad shape B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq_len) +
                " H=" + std::to_string(s.n_head) + " hs=" + std::to_string(s.head_dim));
  require_shape(op, "qkv", qkv, {s.batch * s.seq_len, 3 * s.channels()});
}
}  // namespace

void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  const char* op = "attention_forward";
  check_attention(op, qkv, s);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  require_shape(op, "probs", probs, {B, H, T, T});
  require_fp32(op, "probs", probs);
  require_shape(op, "out", out, {B * T, C});
  if (!key_mask.empty() && static_cast<int64_t>(key_mask.size()) != B * T)
    throw Error(std::string(op) + ": key_mask has " + std::to_string(key_mask.size()) + " entries, expected " +
                std::to_string(B * T));
  const uint8_t* mask = key_mask.empty() ? nullptr : upload<uint8_t>(1, key_mask);
  // The output is summed in FP32 and rounded once into out (in place when out is FP32).
  Tensor o32 = out.dtype() == DType::kFloat32 ? out : scratch(0, {B * T, C});
  launch([&] {
    ampdist::cuda::attention_forward(qkv.data(), code(qkv.dtype()), B, T, H, hs, mask, code(pv_dtype),
                                     static_cast<float*>(probs.data()), static_cast<float*>(o32.data()), stream());
  });
  if (out.dtype() != DType::kFloat32) kernels::cast(o32, out);
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,
                        const Tensor& dout, Tensor& dqkv) {
  const char* op = "attention_backward";
  check_attention(op, qkv, s);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
  require_shape(op, "probs", probs, {B, H, T, T});
  require_fp32(op, "probs", probs);
  require_shape(op, "dout", dout, {B * T, C});
  require_shape(op, "dqkv", dqkv, {B * T, 3 * C});
  Tensor d32 = dqkv.dtype() == DType::kFloat32 ? dqkv : scratch(1, {B * T, 3 * C});
  Tensor& dot = scratch(2, {B * H * T});
  device::memset_zero(d32.data(), d32.nbytes());
  launch([&] {
    ampdist::cuda::attention_backward(qkv.data(), code(qkv.dtype()), static_cast<const float*>(probs.data()),
                                      dout.data(), code(dout.dtype()), B, T, H, hs, code(pv_dtype),
                                      static_cast<float*>(dot.data()), static_cast<float*>(d32.data()), stream());
  });
  if (dqkv.dtype() != DType::kFloat32) kernels::cast(d32, dqkv);
}

void dropout_inplace(Tensor& x, float p, const DropoutKey& key, std::span<const uint32_t> sample_ids,
                     int64_t seq_len) {
  const char* op = "dropout_inplace";
  require_cuda(op, "x", x);
  if (!(p >= 0.0f && p < 1.0f)) throw Error(std::string(op) + ": p must be in [0, 1), got " + std::to_string(p));
  if (p == 0.0f) return;
  if (x.ndim() != 2 || seq_len <= 0 || x.dim(0) != static_cast<int64_t>(sample_ids.size()) * seq_len)
    throw Error(std::string(op) + ": x " + shape_str(x.shape()) + " is not " + std::to_string(sample_ids.size()) +
                " windows of " + std::to_string(seq_len) + " rows");
  const uint32_t* ids = upload<uint32_t>(2, sample_ids);
  launch([&] {
    ampdist::cuda::dropout_inplace(x.data(), code(x.dtype()), x.dim(0), x.dim(1), seq_len, p, key.seed, key.step,
                                   key.site, ids, stream());
  });
}

void add_inplace(Tensor& x, const Tensor& y) {
  const char* op = "add_inplace";
  require_cuda(op, "x", x);
  require_cuda(op, "y", y);
  require_fp32(op, "x", x);
  if (x.numel() != y.numel())
    throw Error(std::string(op) + ": element counts differ: " + shape_str(x.shape()) + " vs " + shape_str(y.shape()));
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
void dropout_inplace(Tensor&, float, const DropoutKey&, std::span<const uint32_t>, int64_t) {
  no_cuda("dropout_inplace");
}
void add_inplace(Tensor&, const Tensor&) { no_cuda("add_inplace"); }

#endif

}  // namespace ampdist::kernels::cuda
