#include "runtime/nn/attention.h"

#include "runtime/kernels/transformer.h"

namespace ampdist {

CausalSelfAttention::CausalSelfAttention(std::string name, int64_t channels, int64_t n_head, int64_t seq_len,
                                         float init_scale, const Autocast& autocast)
    : Module(std::move(name)), channels_(channels), n_head_(n_head), max_seq_(seq_len), seq_len_(seq_len) {
  if (channels <= 0 || n_head <= 0 || channels % n_head != 0)
    throw Error("attention " + this->name() + ": n_embd " + std::to_string(channels) +
                    " must be a positive multiple of n_head " + std::to_string(n_head),
                ErrorKind::kBadInput);
  pv_dtype_ = autocast.compute_dtype(OpKind::kAttention, this->name(), autocast.working());
  c_attn_ = std::make_unique<Linear>(this->name() + ".c_attn", channels, 3 * channels, true, autocast);
  c_proj_ = std::make_unique<Linear>(this->name() + ".c_proj", channels, channels, true, autocast);
  for (Linear* l : {c_attn_.get(), c_proj_.get()}) {
    l->weight().init_bound *= init_scale;
    l->bias()->init_bound *= init_scale;
  }
}

CausalSelfAttention::~CausalSelfAttention() = default;

void CausalSelfAttention::collect_parameters(std::vector<Parameter*>& out) {
  c_attn_->collect_parameters(out);
  c_proj_->collect_parameters(out);
}

const Tensor& CausalSelfAttention::forward(const Tensor& x) {
  if (seq_len_ <= 0 || seq_len_ > max_seq_ || x.ndim() != 2 || x.dim(0) % seq_len_ != 0)
    throw Error("attention " + name() + ": input " + shape_str(x.shape()) + " is not windows of " +
                std::to_string(seq_len_) + " <= " + std::to_string(max_seq_) + " rows");
  qkv_ = c_attn_->forward(x);
  const kernels::AttentionShape s{x.dim(0) / seq_len_, seq_len_, n_head_, channels_ / n_head_};
  probs_.ensure({s.batch, n_head_, seq_len_, seq_len_}, DType::kFloat32, qkv_.device());
  y_.ensure({x.dim(0), channels_}, pv_dtype_, qkv_.device());
  kernels::attention_forward(qkv_, s, key_mask_, pv_dtype_, probs_, y_);
  return c_proj_->forward(y_);
}

const Tensor& CausalSelfAttention::backward(const Tensor& dy, GradContext& ctx) {
  const bool outer_need = ctx.need_input_grad;
  ctx.need_input_grad = true;
  const Tensor& dattn = c_proj_->backward(dy, ctx);
  const kernels::AttentionShape s{qkv_.dim(0) / seq_len_, seq_len_, n_head_, channels_ / n_head_};
  dqkv_.ensure(qkv_.shape(), qkv_.dtype(), qkv_.device());
  kernels::attention_backward(qkv_, probs_, s, pv_dtype_, dattn, dqkv_);
  ctx.need_input_grad = outer_need;
  return c_attn_->backward(dqkv_, ctx);
}

}  // namespace ampdist
