// Argument checks of kernels/transformer.h shared by its CPU and CUDA implementations (internal to the kernels).
// Each throws Error naming the op and the argument: a tensor on another device than `device`, a wrong shape or
// dtype, or (bad input) a token outside the vocabulary.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/kernels/transformer.h"

namespace ampdist::kernels::checks {

void require_on(const char* op, const char* what, const Tensor& t, Device device);
void require_shape(const char* op, const char* what, const Tensor& t, const Shape& want, Device device);
void require_fp32(const char* op, const char* what, const Tensor& t);

void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out, Device device);
void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe, Device device);
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, Device device);
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, Device device);
void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       const Tensor& probs, const Tensor& out, Device device);
void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, const Tensor& dout,
                        const Tensor& dqkv, Device device);
void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                             const Tensor& stats, const Tensor& out, Device device);
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,
                              std::span<const uint8_t> key_mask, const Tensor& dout, const Tensor& dqkv,
                              Device device);
// Returns false when there is nothing to do (p == 0).
bool dropout(const Tensor& x, float p, std::span<const uint32_t> sample_ids, int64_t seq_len, Device device);
void add_inplace(const Tensor& x, const Tensor& y, Device device);

}  // namespace ampdist::kernels::checks
