// GPT: a decoder-only transformer built from model.gpt (GPT-2's pre-LayerNorm layout, Radford et al. 2019):
//
//   x = dropout(wte[tokens] + wpe[positions])                      FP32 residual stream, [B*T, C]
//   for each block l:  x += dropout(attn(ln_1(x)));  x += dropout(mlp(ln_2(x)))   mlp = c_proj(gelu(c_fc(.)))
//   logits = ln_f(x) @ wte^T  (tied, GPT-2)  or  lm_head(ln_f(x))  [B*T, V], working dtype
//
// Parameter names follow nanoGPT: wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight, ...,
// ln_f.weight, lm_head.weight (untied only). wte has table_rows() rows: vocab_size rounded up to a multiple of
// padded_vocab_multiple (llm.c's padded vocabulary); the tied head's GEMM reads its first vocab_size rows only, so the
// logits are [*, vocab_size], the padded rows are never sampled and get no gradient (they keep their initial values,
// 0 from init_from).
//
// Input rows (what TokenWindowDataset produces): [B, T + 3] FP32, columns 0 .. T the window's T + 1 tokens (inputs
// are 0 .. T-1, targets 1 .. T), columns T+1 and T+2 the window's dataset index (low 16 bits, high bits), which
// keys the dropout masks. LanguageModelLoss reads the targets from the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/nn/attention.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/layernorm.h"
#include "runtime/nn/module.h"

namespace ampdist {

// Extra input columns after the T + 1 tokens: the dataset index (low 16 bits, high bits).
constexpr int64_t kGptIndexColumns = 2;

class GptModel : public Module {
 public:
  // seed: keys the dropout masks (train.seed). Throws Error (bad input) naming model.gpt.* for a bad config.
  GptModel(const GptConfig& cfg, const Autocast& autocast, uint64_t seed);
  ~GptModel() override;

  const GptConfig& config() const { return cfg_; }
  void collect_parameters(std::vector<Parameter*>& out) override;
  // x: [B, seq_len + 3] as above. Returns logits [B * seq_len, V] in the LM head's dtype; under recompute: BLOCK
  // the head's input instead (ln_f's output [B * seq_len, C], the head's dtype): the logits are never whole, a loss
  // reads them a chunk at a time through head_logits.
  const Tensor& forward(const Tensor& x) override;
  // dy: dlogits [B * T, V] (any dtype), or an empty tensor: then each chunk's dlogits are its logits (head_logits)
  // overwritten by the head gradient bound with set_head_gradient (LanguageModelLoss::backward binds it; the binding
  // holds for this one backward). The head's weight gradient is added chunk after chunk (FP32, in row order).
  // Returns an empty tensor (tokens have no gradient). Throws Error for dy of the wrong shape, or an empty dy
  // without a bound head gradient.
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;
  void set_mode(bool training, int64_t step) override;
  // Token ids and window indices are read on the host; the embedding kernel copies the ids to the GPU.
  bool takes_host_input() const override { return true; }

  // Inference on `batch` windows of t <= seq_len tokens each (no targets, no dropout): logits [batch * t, V].
  const Tensor& logits(std::span<const int32_t> tokens, int64_t batch, int64_t t);
  // KV-cache inference on one window: prefill runs t <= seq_len tokens at positions 0 .. t-1 as logits(tokens, 1, t)
  // does (returning its logits [t, V]) and keeps every block's keys and values; decode runs one more token at
  // position cached() and returns its logits [1, V], one position's work (CausalSelfAttention::decode), the same
  // arithmetic as the last row of a full forward up to the order of FP32 sums in attention. Throws Error when
  // nothing is cached or the cache holds seq_len positions (then prefill the window again).
  const Tensor& prefill(std::span<const int32_t> tokens);
  const Tensor& decode(int32_t token);
  int64_t cached() const { return cached_; }
  // Rows of wte (>= vocab_size: the padded vocabulary, GptConfig.padded_vocab_multiple).
  int64_t table_rows() const;
  // The LM head by chunks of rows (model.gpt.head_chunk_rows; 0: the rows of 128 MiB of FP32 logits, a multiple of
  // 64, at least 64). The chunking is the same in every recompute mode, so their results are bitwise equal.
  int64_t head_chunk_rows() const;
  // Logits [r1 - r0, V] (the head's dtype) of rows [r0, r1) of the last forward(x), a chunk of head_chunk_rows()
  // rows (the last one may be shorter): a view of the kept logits, or under recompute: BLOCK the chunk's GEMM run
  // into a buffer of one chunk (valid until the next call; the same call each time, so bitwise the same values).
  Tensor head_logits(int64_t r0, int64_t r1);
  // Overwrites one chunk's logits (chunk index c, rows [c * head_chunk_rows(), ...)) with their dlogits.
  using HeadGradient = std::function<void(int64_t c, Tensor& logits)>;
  void set_head_gradient(HeadGradient g) { head_gradient_ = std::move(g); }
  // Targets of the last forward(x): [B * T].
  std::span<const int32_t> targets() const { return targets_; }
  int64_t seq_len() const { return cfg_.seq_len(); }
  // Per-window key masks for attention ([B*T], 1 = may be attended), for tests of masked rows; empty = causal only.
  void set_key_mask(const std::vector<uint8_t>& mask);
  // Memory estimate. output_shape: logits [B * T, V] for an input [B, T + 3] (ln_f's output [B * T, C] under
  // recompute: BLOCK). activation_bytes: the bytes at the peak of a step, as run() and backward() keep them, per
  // token: per layer the FP32 residual streams (8 C bytes); per layer (one layer under recompute: BLOCK) the forward's
  // LayerNorm statistics, 14 C of the working dtype's size (LayerNorm outputs, qkv, the attention output, the MLP's
  // 4 C hidden and activated; under POINTWISE one set of LayerNorm outputs and one activated for all layers) and the
  // attention kernel's state (FLASH: 2 floats per head; MATERIALIZED: T per head, and its per-thread [H, T, T]
  // scratch); one block's two branch outputs; when training one block's backward buffers (14 C: dqkv, the Linears'
  // and GELU's input gradients, plus 2 C of FP32-to-working casts under autocast); the head's logits (V, the head's
  // dtype; their gradient overwrites them; under BLOCK one chunk's, not per token) and the FP32 residual gradient.
  Shape output_shape(const Shape& in) const override;
  int64_t activation_bytes(const Shape& in, DType working, bool training) const override;

 private:
  struct Block;
  // keep_logits false (recompute: BLOCK's training and evaluation forward): returns the head's input.
  const Tensor& run(const Tensor& token_ids, int64_t t, bool keep_logits);
  // Logits [N, V] of ln_f's output, or (keep_logits false) that output in the head's dtype, for head_logits.
  const Tensor& head(const Tensor& ln_f_out, bool keep_logits);
  Parameter& head_weight();  // [table_rows or V, C]: wte (tied) or lm_head.weight; the head reads rows 0 .. V
  void recompute_block(size_t l);              // model.gpt.recompute: BLOCK, before block l's backward
  // The one moving set of block buffers (backward_only: the backward's) from block moving_set_at_ to block `to`.
  void move_block_buffers(size_t to, bool backward_only);
  void dropout(Tensor& x, uint32_t site);

  GptConfig cfg_;
  uint64_t seed_;
  bool training_ = false;
  int64_t step_ = 0;
  DType head_dtype_;
  std::unique_ptr<Embedding> emb_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<LayerNorm> ln_f_;
  std::unique_ptr<Linear> lm_head_;  // untied only
  std::vector<int32_t> targets_;
  std::vector<uint32_t> sample_ids_;
  int64_t cached_ = 0;
  bool keep_block_buffers_ = false;  // prefill: every block keeps its buffers whatever model.gpt.recompute says
  Tensor ln_out_[2], gelu_out_;  // recompute: POINTWISE, the blocks' one output of ln_1, ln_2 and the GELU
  size_t moving_set_at_ = 0;      // the block that holds the one moving set of block buffers
  std::vector<Tensor> resid_;  // resid_[k]: the residual stream after k branches (0: the embedding), FP32
  Tensor ids_, h_cast_, logits_, dresid_, dbranch_, dh_;
  bool logits_kept_ = true;  // whether the last forward kept the whole logits (else head_logits computes a chunk)
  Tensor chunk_logits_, dl_cast_;  // one chunk's logits (BLOCK), one chunk of a given dy cast to the head's dtype
  HeadGradient head_gradient_;
};

// Cross-entropy of next-token prediction in FP32 (autocast "cross_entropy"), per window: forward returns the sum
// over windows of the window's mean per-token loss in nats, so the trainer's division by the global number of
// windows gives the mean loss per token (nats per byte for the byte vocabulary). The targets are the model's.
// The loss runs over the model's logits a chunk of rows at a time (GptModel::head_logits), so under recompute: BLOCK
// no [B*T, V] buffer exists. backward() binds each chunk's gradient to the model and returns an empty tensor; the
// model's backward writes each chunk's dlogits over its logits (llm.c's fused classifier does the same) and runs the
// head's backward on the chunk.
class LanguageModelLoss : public Criterion {
 public:
  explicit LanguageModelLoss(GptModel& model) : model_(model) {}
  // output: the model's forward output for its last forward (logits, or ln_f's output under BLOCK): only its rows
  // are checked against the targets. Throws Error (bad input) for a target outside the vocabulary.
  double forward(const Tensor& output, std::span<const int32_t> unused_labels) override;
  const Tensor& backward(float grad_scale) override;
  bool supports_device_step() const override { return true; }

 private:
  struct Chunk {
    Tensor lse, targets_dev, row_loss;  // the chunk's log-sum-exp per row, and its device scratch
  };
  GptModel& model_;
  std::vector<Chunk> chunks_;
};

// One draw from softmax(logits / temperature) restricted to the top_k largest logits (top_k <= 0: all), by
// inverting the CDF at u in [0, 1) (FP32 logits, probabilities in double). temperature <= 0 picks the argmax. Ties
// between equal logits go to the lower id, so the result is a pure function of its arguments.
// logits: [V] FP32 (e.g. a row of GptModel::logits). Throws Error for empty logits.
int32_t sample_next_token(std::span<const float> logits, float temperature, int top_k, float u);

}  // namespace ampdist
