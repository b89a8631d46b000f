// The CUDA backend of kernels/transformer.h over Tensors: the checks of the CPU side, inputs that live on the host
// (token ids, key masks, window ids) copied to the device, and the launchers of cuda_transformer_ops.h. Without the
// CUDA backend every entry point throws Error.
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer_backends.h"
#include "runtime/kernels/transformer_checks.h"

#ifdef AMPDIST_HAVE_CUDA
#include <stdexcept>

#include "runtime/kernels/cuda/cuda_transformer_ops.h"
#endif

namespace ampdist::kernels::cuda {

#ifdef AMPDIST_HAVE_CUDA

namespace {

int code(DType t) { return static_cast<int>(t); }
void* stream() { return device::compute_stream(); }

template <typename F> void launch(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

// Host values copied into a device scratch slot (grown to the largest request; one stream, so uses never overlap).
struct Buffers {
  Tensor upload[3], scratch[3];
};
template <typename T> const T* upload(int slot, std::span<const T> v) {
  Tensor* buf = device::per_current_device<Buffers>().upload;
  const int64_t words = static_cast<int64_t>((v.size() * sizeof(T) + 3) / 4);
  buf[slot].ensure({std::max<int64_t>(words, 1)}, DType::kFloat32, Device::kCUDA);
  device::copy(buf[slot].data(), Device::kCUDA, v.data(), Device::kCPU, v.size() * sizeof(T));
  return static_cast<const T*>(buf[slot].data());
}
Tensor& scratch(int slot, const Shape& shape) {
  Tensor* t = device::per_current_device<Buffers>().scratch;
  t[slot].ensure(shape, DType::kFloat32, Device::kCUDA);
  return t[slot];
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
  const int64_t n = static_cast<int64_t>(tokens.size()), c = dwte.dim(1);
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


void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  checks::attention_forward(qkv, s, key_mask, probs, out, Device::kCUDA);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
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
  checks::attention_backward(qkv, probs, s, dout, dqkv, Device::kCUDA);
  const int64_t B = s.batch, T = s.seq_len, H = s.n_head, hs = s.head_dim, C = s.channels();
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
void dropout_inplace(Tensor&, float, const DropoutKey&, std::span<const uint32_t>, int64_t) {
  no_cuda("dropout_inplace");
}
void add_inplace(Tensor&, const Tensor&) { no_cuda("add_inplace"); }

#endif

}  // namespace ampdist::kernels::cuda
