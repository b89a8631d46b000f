// The transformer op families: token + position embedding, LayerNorm, causal multi-head attention, dropout and the
// FP32 residual add. Dispatched on the tensors' device like kernels.h; the CPU implementations are in
// kernels/cpu/transformer_kernels.cc and every per-element formula is in kernels/math.h.
//
// Shapes are row-major. N = B * T rows (B windows of T tokens), C = n_embd, H heads of hs = C / H columns.
// Every function throws ampdist::Error naming the op on a shape, dtype or device mismatch.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/core/tensor.h"

namespace ampdist::kernels {

// ---- embedding -------------------------------------------------------------------------------------------------
// out[b*T + t, :] = wte[tokens[b*T + t], :] + wpe[t, :].
// tokens: N ids; wte: [V, C] FP32; wpe: [T_max, C] FP32 with T <= T_max; out: [N, C] FP32.
// Throws Error (bad input) naming the position when a token is outside [0, V).
void embedding_forward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& wte, const Tensor& wpe,
                       Tensor& out);
// dwte[tokens[r], :] += dout[r, :] and dwpe[r % T, :] += dout[r, :] for every row r, in FP32. dout: [N, C] any
// dtype; dwte, dwpe: FP32. With overwrite_* the gradient is first zeroed (the first micro-batch of a step).
void embedding_backward(std::span<const int32_t> tokens, int64_t seq_len, const Tensor& dout, Tensor& dwte,
                        bool overwrite_wte, Tensor& dwpe, bool overwrite_wpe);

// ---- LayerNorm (statistics always FP32) ------------------------------------------------------------------------
// y = LayerNorm(x) over the last dimension (math::layernorm). x: [N, C] any dtype; gamma, beta: [C] FP32;
// y: [N, C] any dtype (rounded once); mean, rstd: [N] FP32, saved for the backward.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd);
// dx (FP32 [N, C]) = d/dx, added to dx when accumulate_dx (the residual stream's gradient), else written.
// dgamma, dbeta (FP32 [C]) get sum over rows of dy * xhat and dy, added when accumulate_params, else written.
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, Tensor& dx, bool accumulate_dx, Tensor& dgamma, Tensor& dbeta,
                        bool accumulate_params);

// ---- causal multi-head self-attention --------------------------------------------------------------------------
struct AttentionShape {
  int64_t batch = 0, seq_len = 0, n_head = 0, head_dim = 0;
  int64_t channels() const { return n_head * head_dim; }
};
// qkv: [N, 3C] (columns q | k | v; head h owns columns h*hs .. (h+1)*hs of each), any dtype.
// Scores s[i, j] = (q_i . k_j) / sqrt(hs) are accumulated and kept in FP32 and softmaxed in FP32 with the row
// maximum subtracted, over keys j <= i with key_mask[b*T + j] != 0 (key_mask empty: every key). A query with no
// allowed key gets probabilities 0 and output 0 (never NaN). out[i] = sum_j p[i, j] v_j, where p is rounded to
// pv_dtype (the working dtype of autocast's "attention", the tensor-core contract of a p @ v GEMM) and the sum is
// FP32, rounded once to out's dtype. probs: [B, H, T, T] FP32, the unrounded p saved for the backward; out: [N, C].
void attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                       DType pv_dtype, Tensor& probs, Tensor& out);
// dqkv ([N, 3C], rounded once to its dtype) from dout [N, C] (any dtype) and the forward's qkv and probs.
void attention_backward(const Tensor& qkv, const Tensor& probs, const AttentionShape& s, DType pv_dtype,
                        const Tensor& dout, Tensor& dqkv);

// Fused causal attention (FlashAttention-2, Dao 2023: "FlashAttention-2: Faster Attention with Better Parallelism and
// Work Partitioning", Algorithms 1 and 2): the attention above without its [B, H, T, T] probabilities. Per (window,
// head) and block of kFlashQueryBlock queries, the scores of one block of at most kFlashKeyBlock keys at a time
// (FP32, as above; key blocks past the query block's last row are never computed) go through an online softmax: a
// running row maximum m and sum l of exp(s - m) in FP32, the FP32 output accumulator rescaled by exp(m_old - m_new)
// whenever m grows. The p @ v operands are exp(s - m) rounded to pv_dtype (unnormalised, where the materialised
// kernel rounds the normalised p) and v in pv_dtype; the accumulator is divided by l once and rounded once to out's
// dtype. Rows with no allowed key give 0, as above.
// stats: [B, H, T, 2] FP32, written: per query row its final m and 1 / l (0 and 0 for a row with no allowed key),
// the only state the backward needs besides qkv and out (O(B H T), where the materialised kernel keeps B H T^2).
constexpr int64_t kFlashQueryBlock = 64;   // query rows per block: one [64, 256] FP32 score tile is 64 KiB
constexpr int64_t kFlashKeyBlock = 256;    // keys per block
void flash_attention_forward(const Tensor& qkv, const AttentionShape& s, std::span<const uint8_t> key_mask,
                             DType pv_dtype, Tensor& stats, Tensor& out);
// dqkv ([N, 3C], rounded once to its dtype) from dout [N, C]: the probabilities are recomputed block by block from
// qkv and stats, exactly as the forward computed them (the same score GEMMs), p = exp(s - m) / l; dv = round(p)^T
// dout with round() to pv_dtype as above, dp = dout v^T, ds = p (dp - D) / sqrt(hs) with D = rowsum(dout * out)
// (FlashAttention-2's D: the materialised kernel's sum_j p_j dp_j up to the rounding of out), dq = ds k, dk = ds^T q
// in FP32. out is the forward's output, key_mask the forward's mask.
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& stats, const AttentionShape& s,
                              std::span<const uint8_t> key_mask, DType pv_dtype, const Tensor& dout, Tensor& dqkv);

// ---- dropout ---------------------------------------------------------------------------------------------------
// The mask of element (r, c) of a [N, C] tensor of B windows of T rows: kept when uniform draw (r % T) * C + c of
// the Philox stream {seed, (step, sample_ids[r / T], site), RngPurpose::kDropout} is >= p (math::dropout). The
// stream is named by the window's dataset index, not its position in the batch, so every world size and every
// resume draws the same mask for the same window at the same step.
struct DropoutKey {
  uint64_t seed = 0;
  uint32_t step = 0;  // the optimizer iteration
  uint32_t site = 0;  // which dropout in the model (< 2^24)
};
// x[r, c] = dropout(x[r, c]) in place, in x's dtype (math in FP32, rounded once). Applying it to a gradient with
// the same key is the backward. p in [0, 1); sample_ids: B entries.
void dropout_inplace(Tensor& x, float p, const DropoutKey& key, std::span<const uint32_t> sample_ids,
                     int64_t seq_len);

// ---- residual stream -------------------------------------------------------------------------------------------
// x[i] += y[i]: x FP32 (the residual stream), y any dtype with the same number of elements.
void add_inplace(Tensor& x, const Tensor& y);

}  // namespace ampdist::kernels
