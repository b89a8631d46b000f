// kernels/transformer.h's functions: the CPU backend, or the CUDA backend when the op's tensors live on the GPU.
#include "runtime/kernels/transformer_backends.h"

namespace ampdist::kernels {
namespace {
bool dev(const Tensor& t) { return t.device() == Device::kCUDA; }
}  // namespace

void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       Tensor& out) {
  if (dev(wte) || dev(out)) return cuda::embedding_forward(tokens, seq_len, wte, wpe, out);
  cpu::embedding_forward(tokens, seq_len, wte, wpe, out);
}
void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,
                        bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe) {
  if (dev(dout) || dev(dwte)) return cuda::embedding_backward(tokens, seq_len, dout, dwte, overwrite_wte, dwpe, overwrite_wpe);
  cpu::embedding_backward(tokens, seq_len, dout, dwte, overwrite_wte, dwpe, overwrite_wpe);
}
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  if (dev(x) || dev(y)) return cuda::layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
  cpu::layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
}
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dgamma, Tensor& dbeta,
                        bool accumulate_params) {
  if (dev(x) || dev(dx))
    return cuda::layernorm_backward(x, gamma, mean, rstd, dy, dx, accumulate_dx, dgamma, dbeta, accumulate_params);
  cpu::layernorm_backward(x, gamma, mean, rstd, dy, dx, accumulate_dx, dgamma, dbeta, accumulate_params);
}
void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out) {
  if (dev(qkv) || dev(out)) return cuda::attention_forward(qkv, s, key_mask, pv_dtype, probs, out);
  cpu::attention_forward(qkv, s, key_mask, pv_dtype, probs, out);
}
void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,
                        const Tensor& dout, Tensor& dqkv) {
  if (dev(qkv) || dev(dqkv)) return cuda::attention_backward(qkv, probs, s, pv_dtype, dout, dqkv);
  cpu::attention_backward(qkv, probs, s, pv_dtype, dout, dqkv);
}
void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                             DType pv_dtype, Tensor& stats, Tensor& out) {
  if (dev(qkv) || dev(out)) return cuda::flash_attention_forward(qkv, s, key_mask, pv_dtype, stats, out);
  cpu::flash_attention_forward(qkv, s, key_mask, pv_dtype, stats, out);
}
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,
                              std::span<const uint8_t> key_mask, DType pv_dtype, const Tensor& dout, Tensor& dqkv) {
  if (dev(qkv) || dev(dqkv)) return cuda::flash_attention_backward(qkv, out, stats, s, key_mask, pv_dtype, dout, dqkv);
  cpu::flash_attention_backward(qkv, out, stats, s, key_mask, pv_dtype, dout, dqkv);
}
void dropout_inplace(Tensor& x, float p, const DropoutKey& key, std::span<const uint32_t> sample_ids,
                     int64_t seq_len) {
  if (dev(x)) return cuda::dropout_inplace(x, p, key, sample_ids, seq_len);
  cpu::dropout_inplace(x, p, key, sample_ids, seq_len);
}
void add_inplace(Tensor& x, const Tensor& y) {
  if (dev(x) || dev(y)) return cuda::add_inplace(x, y);
  cpu::add_inplace(x, y);
}

}  // namespace ampdist::kernels
