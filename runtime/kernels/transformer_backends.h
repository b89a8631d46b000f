// The CPU and CUDA implementations behind kernels/transformer.h; kernels/transformer_dispatch.cc picks one by the
// tensors' device. Internal to the kernels.
#pragma once

#include "runtime/kernels/transformer.h"

#define AMPDIST_TRANSFORMER_DECLS                                                                                   \
  void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,    \
                         Tensor& out);                                                                              \
  void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,       \
                          bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe);                                    \
  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,            \
                         Tensor& mean, Tensor& rstd);                                                               \
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,             \
                          const Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dgamma, Tensor& dbeta,          \
                          bool accumulate_params);                                                                  \
  void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,             \
                         DType pv_dtype, Tensor& probs, Tensor& out);                                               \
  void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,          \
                          const Tensor& dout, Tensor& dqkv);                                                        \
  void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,       \
                               DType pv_dtype, Tensor& stats, Tensor& out);                                         \
  void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,  \
                                std::span<const uint8_t> key_mask, DType pv_dtype, const Tensor& dout,              \
                                Tensor& dqkv);                                                                      \
  void dropout_inplace(Tensor& x, float p, const DropoutKey& key, std::span<const uint32_t> sample_ids,             \
                       int64_t seq_len);                                                                            \
  void add_inplace(Tensor& x, const Tensor& y);

namespace ampdist::kernels::cpu {
AMPDIST_TRANSFORMER_DECLS
}  // namespace ampdist::kernels::cpu

namespace ampdist::kernels::cuda {
AMPDIST_TRANSFORMER_DECLS
}  // namespace ampdist::kernels::cuda
