#include "runtime/nn/embedding.h"

#include <cmath>

#include "runtime/kernels/transformer.h"

namespace ampdist {

namespace {
const Tensor kNone;
constexpr float kGpt2InitStd = 0.02f;  // GPT-2's initializer_range
}  // namespace

Embedding::Embedding(std::string name, int64_t vocab_size, int64_t max_positions, int64_t channels, float init_scale,
                     int64_t table_rows)
    : Module(std::move(name)), vocab_(vocab_size), max_pos_(max_positions), channels_(channels) {
  if (vocab_size <= 0 || max_positions <= 0 || channels <= 0 || (table_rows != 0 && table_rows < vocab_size))
    throw Error("Embedding " + this->name() + ": vocab_size, positions and channels must be positive",
                ErrorKind::kBadInput);
  const float bound = kGpt2InitStd * std::sqrt(3.0f) * init_scale;  // U(-a, a) has std a / sqrt(3)
  wte_.name = "wte.weight";
  wte_.shape = {table_rows > 0 ? table_rows : vocab_size, channels};
  wte_.init_bound = bound;
  wpe_.name = "wpe.weight";
  wpe_.shape = {max_positions, channels};
  wpe_.init_bound = bound;
  wte_.reads_fp32 = wpe_.reads_fp32 = true;  // the embedding is a gather from the FP32 weights
}

void Embedding::collect_parameters(std::vector<Parameter*>& out) {
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

const Tensor& Embedding::forward_at(const Tensor& x, int64_t first_position) {
  if (x.ndim() != 2 || first_position < 0 || x.dim(1) > max_pos_ - first_position || x.dtype() != DType::kFloat32)
    throw Error("Embedding " + name() + ": input " + shape_str(x.shape()) + " " + dtype_name(x.dtype()) +
                " from position " + std::to_string(first_position) + ", expected FP32 token ids [B, T <= " +
                std::to_string(max_pos_ - first_position) + "]");
  seq_len_ = x.dim(1);
  tokens_.resize(static_cast<size_t>(x.numel()));
  const float* t = x.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!(t[i] >= 0.0f && t[i] < static_cast<float>(vocab_)) || t[i] != std::floor(t[i]))
      throw Error("Embedding " + name() + ": token " + std::to_string(t[i]) + " at position " + std::to_string(i) +
                      " is not an id in [0, " + std::to_string(vocab_) + ")",
                  ErrorKind::kBadInput);
    tokens_[static_cast<size_t>(i)] = static_cast<int32_t>(t[i]);
  }
  // Token ids are read on the host (x is a host tensor on either backend); the output lives with the weights.
  y_.ensure({x.numel(), channels_}, DType::kFloat32, wte_.master.device());
  const Tensor wpe = first_position == 0 ? wpe_.master : wpe_.master.rows(first_position, first_position + seq_len_);
  kernels::embedding_forward(tokens_, seq_len_, wte_.master, wpe, y_);
  return y_;
}

const Tensor& Embedding::backward(const Tensor& dy, GradContext& ctx) {
  kernels::embedding_backward(tokens_, seq_len_, dy, wte_.grad, !ctx.accumulate && !keep_token_grad_, wpe_.grad,
                              !ctx.accumulate);
  if (ctx.on_grad_ready) {
    ctx.on_grad_ready(wte_);
    ctx.on_grad_ready(wpe_);
  }
  return kNone;
}

}  // namespace ampdist
