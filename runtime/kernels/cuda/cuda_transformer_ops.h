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
// dwte[tokens[r]] += dout[r], dwpe[r % seq_len] += dout[r], rows in order (the caller zeroes when overwriting).
void embedding_backward(const int32_t* tokens, int64_t n, int64_t seq_len, int64_t c, const void* dout,
                        int dout_dtype, float* dwte, float* dwpe, Stream s);
void layernorm_forward(const void* x, int x_dtype, int64_t n, int64_t c, const float* gamma, const float* beta,
                       float eps, void* y, int y_dtype, float* mean, float* rstd, Stream s);
void layernorm_backward(const void* x, int x_dtype, const void* dy, int dy_dtype, int64_t n, int64_t c,
                        const float* gamma, const float* mean, const float* rstd, float* dx, bool accumulate_dx,
                        float* dgamma, float* dbeta, bool accumulate_params, Stream s);
// probs [B, H, T, T] FP32 and the output in FP32 scratch o32 [B*T, C] (the caller rounds it into the output).
void attention_forward(const void* qkv, int qkv_dtype, int64_t B, int64_t T, int64_t H, int64_t hs,
                       const uint8_t* key_mask, int pv_dtype, float* probs, float* o32, Stream s);
// d32 [B*T, 3C] FP32, zeroed by the caller; dot [B*H*T] FP32 scratch.
void attention_backward(const void* qkv, int qkv_dtype, const float* probs, const void* dout, int dout_dtype,
                        int64_t B, int64_t T, int64_t H, int64_t hs, int pv_dtype, float* dot, float* d32, Stream s);
void dropout_inplace(void* x, int x_dtype, int64_t n, int64_t c, int64_t seq_len, float p, uint64_t seed,
                     uint32_t step, uint32_t site, const uint32_t* sample_ids, Stream s);
// x [n] FP32 += y [n] (any dtype).
void add_inplace(float* x, const void* y, int y_dtype, int64_t n, Stream s);

}  // namespace ampdist::cuda
