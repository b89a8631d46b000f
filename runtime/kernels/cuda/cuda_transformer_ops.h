// Launchers of the transformer kernels (kernels/cuda/transformer_kernels.cu) over raw device pointers; the Tensor
// level with its checks is kernels/cuda/cuda_transformer_ops.cc. dtype codes are DType's values (0 fp32, 1 fp16,
// 2 bf16). Every launcher queues work on `stream` and returns; launch errors throw std::runtime_error.
#pragma once

#include <cstdint>

namespace ampdist::cuda {

using Stream = void*;

// out [n, c] FP32 = wte[tokens[r]] + wpe[r % seq_len]; tokens already checked against the vocabulary.
void embedding_forward(const int32_t* tokens, int64_t n, int64_t seq_len, int64_t c, const float* wte,
                       const float* wpe, float* out, Stream s);
// dwte[uniq[u]] += the rows rows[begin[u] .. begin[u + 1]) of dout, in that (increasing) order, for each of the
// `distinct` tokens; dwpe[p] += dout[r] for r = p, p + seq_len, ... (the caller zeroes when overwriting). The CPU
// loop's additions in its order: bitwise equal.
void embedding_backward(const int32_t* uniq, const int32_t* begin, const int32_t* rows, int64_t distinct, int64_t n,
                        int64_t seq_len, int64_t c, const void* dout, int dout_dtype, float* dwte, float* dwpe,
                        Stream s);
// One warp per row; dgamma/dbeta as two-stage column sums.
void layernorm_forward(const void* x, int x_dtype, int64_t n, int64_t c, const float* gamma, const float* beta,
                       float eps, void* y, int y_dtype, float* mean, float* rstd, Stream s);
void layernorm_backward(const void* x, int x_dtype, const void* dy, int dy_dtype, int64_t n, int64_t c,
                        const float* gamma, const float* mean, const float* rstd, float* dx, bool accumulate_dx,
                        float* dgamma, float* dbeta, bool accumulate_params, Stream s);
// probs [B, H, T, T] FP32 holds the scaled scores; becomes the causal, key-masked softmax (a fully masked row is 0).
// pr (may be null): the probabilities rounded to pv_dtype, stored in pr_dtype, [B, H, T, T].
void attention_softmax_forward(float* probs, int64_t B, int64_t T, int64_t H, const uint8_t* key_mask, int pv_dtype,
                               void* pr, int pr_dtype, Stream s);
// dp [rows, T] FP32 (dP = dO V^T) becomes ds = p (dp - sum_j p_j dp_j) * scale.
void attention_softmax_backward(const float* probs, float* dp, int64_t rows, int64_t T, float scale, Stream s);
// Fused causal attention (kernels/transformer.h's flash_attention_*): qkv [B*T, 3C], out [B*T, C], stats
// [B, H, T, 2] FP32. Head sizes 8, 16, 32, 64 and 128 (flash_attention_head_size_supported); others throw.
bool flash_attention_head_size_supported(int64_t hs);
// The CPU kernel's key block (kernels::kFlashKeyBlock; the query block is 64 on both): the GPU kernel moves its running
// maximum per key block as the CPU does, so both round p the same way.
constexpr int64_t kFlashKeyBlock = 256;
void flash_attention_forward(const void* qkv, int qkv_dtype, int64_t B, int64_t T, int64_t H, int64_t hs,
                             const uint8_t* key_mask, int pv_dtype, void* out, int out_dtype, float* stats, Stream s);
// dqkv [B*T, 3C] FP32, every element written; D: scratch of B*H*T floats.
void flash_attention_backward(const void* qkv, int qkv_dtype, const void* out, int out_dtype, const float* stats,
                              const void* dout, int dout_dtype, int64_t B, int64_t T, int64_t H, int64_t hs,
                              const uint8_t* key_mask, int pv_dtype, float* D, float* dqkv, Stream s);
// dst [n] (dst_dtype) = src rounded to pv_dtype.
void round_probs(const float* src, int64_t n, int pv_dtype, void* dst, int dst_dtype, Stream s);
void dropout_inplace(void* x, int x_dtype, int64_t n, int64_t c, int64_t seq_len, float p, uint64_t seed,
                     uint32_t step, uint32_t site, const uint32_t* sample_ids, Stream s);
// x [n] FP32 += y [n] (any dtype).
void add_inplace(float* x, const void* y, int y_dtype, int64_t n, Stream s);

}  // namespace ampdist::cuda
