// Token + position embedding (GPT-2): out[b*T + t] = wte[token] + wpe[t]. wte: [V, C], wpe: [T_max, C], both
// initialised with std 0.02 (GPT-2's initializer_range), here U(+-0.02 sqrt(3)) times init_scale, which has that
// standard deviation. Autocast "embedding": a gather from the FP32 master weights with an FP32 output, so the
// residual stream starts (and stays) in FP32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/nn/module.h"

namespace ampdist {

class Embedding : public Module {
 public:
  // table_rows: rows of wte, >= vocab_size (a padded vocabulary, GptConfig.padded_vocab_multiple; 0 = vocab_size).
  // Tokens are ids in [0, vocab_size); the rows beyond are never gathered.
  Embedding(std::string name, int64_t vocab_size, int64_t max_positions, int64_t channels, float init_scale,
            int64_t table_rows = 0);
  Parameter& token_weight() { return wte_; }
  Parameter& position_weight() { return wpe_; }

  void collect_parameters(std::vector<Parameter*>& out) override;
  // x: [B, T] FP32 token ids (integers < 2^24 are exact in FP32), T <= max_positions. Returns [B*T, C] FP32.
  // Throws Error (bad input) for a token outside [0, V).
  const Tensor& forward(const Tensor& x) override { return forward_at(x, 0); }
  // The same with positions first_position .. first_position + T - 1 (decoding with a KV cache, inference only).
  const Tensor& forward_at(const Tensor& x, int64_t first_position);
  // dy: [B*T, C] any dtype. Adds (scatter) into the FP32 gradients; wte's gradient is written fresh unless
  // ctx.accumulate or keep_token_grad() (a tied LM head wrote its part first). Returns an empty tensor.
  const Tensor& backward(const Tensor& dy, GradContext& ctx) override;

  // A tied LM head writes wte's gradient before this backward adds to it.
  void set_keep_token_grad(bool keep) { keep_token_grad_ = keep; }
  std::span<const int32_t> tokens() const { return tokens_; }

 private:
  int64_t vocab_, max_pos_, channels_, seq_len_ = 0;
  bool keep_token_grad_ = false;
  Parameter wte_, wpe_;
  std::vector<int32_t> tokens_;
  Tensor y_;
};

}  // namespace ampdist
