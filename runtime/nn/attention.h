// Causal multi-head self-attention (Vaswani et al. 2017; GPT-2's layout): c_attn Linear C -> 3C (q | k | v),
// softmax(q k^T / sqrt(hs)) v per head over keys j <= i, c_proj Linear C -> C.
// Autocast: both Linears and the p @ v product run in the working dtype ("linear", "attention"); the scores and the
// softmax are FP32 ("softmax"), so q k^T beyond fp16's 65504 stays finite. Forcing this layer ("h.0.attn") or the
// op kind "attention" to FP32 also keeps p unrounded.
// The kernel is model.gpt.attention: FLASH (fused, FlashAttention-2: keeps two FP32 softmax statistics per query
// row for the backward) or MATERIALIZED (keeps the [B, H, T, T] FP32 probabilities); kernels/transformer.h has both.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/nn/module.h"

namespace ampdist {

class Linear;

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(std::string name, int64_t channels, int64_t n_head, int64_t seq_len, float init_scale,
                      const Autocast& autocast, AttentionKernel kernel = FLASH);
  ~CausalSelfAttention() override;

  void collect_parameters(std::vector<Parameter*>& out) override;
  // x: [B*T, C] any dtype, T = seq_len(). Returns [B*T, C] in the working dtype.
  const Tensor& forward(const Tensor& x) override;
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  // forward() again, for its backward only (GptModel, recompute: BLOCK): the same buffers from the same x, but
  // c_proj's output, which the backward does not read, is not computed.
  void recompute_for_backward(const Tensor& x);

  // Window length of the next forward (<= the constructor's seq_len; generation runs shorter prompts).
  void set_seq_len(int64_t t) { seq_len_ = t; }
  int64_t seq_len() const { return seq_len_; }
  // Keys allowed per window position, [B*T] (1 = may be attended); empty = all (the causal mask only).
  void set_key_mask(std::vector<uint8_t> mask) { key_mask_ = std::move(mask); }
  Linear& c_attn() { return *c_attn_; }
  Linear& c_proj() { return *c_proj_; }
  AttentionKernel kernel() const { return kernel_; }
  void pass_buffers_to(Module& next, bool backward_only) override;

  // KV cache (inference on one window, GptModel::prefill / decode). cache_last_forward: keeps the keys and values
  // of the last forward, which must have been one window (batch 1) of t tokens at positions 0 .. t-1. decode: x is
  // [1, C], the input of position pos = cached(); appends its key and value and returns [1, C] in the working dtype:
  // the arithmetic of attention_forward for that row (q k^T in FP32 from the working-dtype q, k, scaled by
  // 1/sqrt(hs); the softmax of kernels/math.h, under FLASH its online form over the same key blocks; p rounded to
  // the p @ v dtype; p @ v accumulated in FP32 and rounded once), computed on the host, so the only difference from a
  // full forward is the order of the FP32 sums.
  // Throws Error when the cache is full (seq_len positions) or the last forward was not one window.
  void cache_last_forward();
  const Tensor& decode(const Tensor& x);
  int64_t cached() const { return cached_; }

 private:
  int64_t channels_, n_head_, max_seq_, seq_len_;
  DType pv_dtype_;
  AttentionKernel kernel_;
  std::unique_ptr<Linear> c_attn_, c_proj_;
  std::vector<uint8_t> key_mask_;
  Tensor qkv_, probs_, stats_, y_, dqkv_;  // probs_: MATERIALIZED's [B, H, T, T]; stats_: FLASH's [B, H, T, 2]
  std::vector<float> k_cache_, v_cache_;  // [H, max_seq, hs] FP32 (exact widenings of the working-dtype k, v)
  int64_t cached_ = 0;
  void attend(const Tensor& x);  // forward() up to c_proj: qkv_, the kernel's state and y_
  void append_kv(const float* row, int64_t pos);  // row: one [3C] row of qkv in FP32
  // One head's decode output y [hs] from its scores [n] and values vh [n, hs] in FLASH's arithmetic (its key blocks,
  // running maximum and rescaling, unnormalised p rounded to the p @ v dtype, one division by the sum).
  void decode_row_online(const std::vector<float>& scores, const float* vh, bool v_rounded, float* y) const;
  Tensor y_dec_;
};

}  // namespace ampdist
