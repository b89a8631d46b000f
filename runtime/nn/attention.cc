#include "runtime/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernels/kernels.h"
#include "runtime/kernels/math.h"
#include "runtime/kernels/transformer.h"

namespace ampdist {

CausalSelfAttention::CausalSelfAttention(std::string name, int64_t channels, int64_t n_head, int64_t seq_len,
                                         float init_scale, const Autocast& autocast, AttentionKernel kernel)
    : Module(std::move(name)), channels_(channels), n_head_(n_head), max_seq_(seq_len), seq_len_(seq_len),
      kernel_(kernel) {
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
  attend(x);
  return c_proj_->forward(y_);
}

void CausalSelfAttention::recompute_for_backward(const Tensor& x) {
  attend(x);
  c_proj_->resave_input(y_);
}

void CausalSelfAttention::attend(const Tensor& x) {
  if (seq_len_ <= 0 || seq_len_ > max_seq_ || x.ndim() != 2 || x.dim(0) % seq_len_ != 0)
    throw Error("attention " + name() + ": input " + shape_str(x.shape()) + " is not windows of " +
                std::to_string(seq_len_) + " <= " + std::to_string(max_seq_) + " rows");
  qkv_ = c_attn_->forward(x);
  const kernels::AttentionShape s{x.dim(0) / seq_len_, seq_len_, n_head_, channels_ / n_head_};
  y_.ensure({x.dim(0), channels_}, pv_dtype_, qkv_.device());
  if (kernel_ == MATERIALIZED) {
    probs_.ensure({s.batch, n_head_, seq_len_, seq_len_}, DType::kFloat32, qkv_.device());
    kernels::attention_forward(qkv_, s, key_mask_, pv_dtype_, probs_, y_);
  } else {
    stats_.ensure({s.batch, n_head_, seq_len_, 2}, DType::kFloat32, qkv_.device());
    kernels::flash_attention_forward(qkv_, s, key_mask_, pv_dtype_, stats_, y_);
  }
}

const Tensor& CausalSelfAttention::backward(const Tensor& dy, GradContext& ctx) {
  const bool outer_need = ctx.need_input_grad;
  ctx.need_input_grad = true;
  const Tensor& dattn = c_proj_->backward(dy, ctx);
  const kernels::AttentionShape s{qkv_.dim(0) / seq_len_, seq_len_, n_head_, channels_ / n_head_};
  dqkv_.ensure(qkv_.shape(), qkv_.dtype(), qkv_.device());
  if (kernel_ == MATERIALIZED)
    kernels::attention_backward(qkv_, probs_, s, pv_dtype_, dattn, dqkv_);
  else
    kernels::flash_attention_backward(qkv_, y_, stats_, s, key_mask_, pv_dtype_, dattn, dqkv_);
  ctx.need_input_grad = outer_need;
  return c_attn_->backward(dqkv_, ctx);
}

void CausalSelfAttention::pass_buffers_to(Module& next_layer, bool backward_only) {
  auto* next = dynamic_cast<CausalSelfAttention*>(&next_layer);
  if (!next) throw Error(name() + ": buffers passed to " + next_layer.name() + ", a layer of another type");
  std::swap(dqkv_, next->dqkv_);
  c_attn_->pass_buffers_to(*next->c_attn_, backward_only);
  c_proj_->pass_buffers_to(*next->c_proj_, backward_only);
  if (backward_only) return;
  std::swap(qkv_, next->qkv_);
  std::swap(probs_, next->probs_);
  std::swap(stats_, next->stats_);
  std::swap(y_, next->y_);
}

namespace {
// A host FP32 copy of a (possibly device, possibly 16-bit) tensor.
std::vector<float> host_fp32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const Tensor h = t.device() == Device::kCPU ? t : t.to(Device::kCPU);
  Tensor dst = Tensor::view(out.data(), h.shape(), DType::kFloat32);
  kernels::cast(h, dst);
  return out;
}
float round_to(float x, DType d) {
  if (d == DType::kFloat16) return static_cast<float>(half(x));
  if (d == DType::kBFloat16) return static_cast<float>(bfloat16(x));
  return x;
}
}  // namespace

void CausalSelfAttention::decode_row_online(const std::vector<float>& scores, const float* vh, bool v_rounded,
                                            float* y) const {
  const int64_t n = static_cast<int64_t>(scores.size()), hs = channels_ / n_head_;
  float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
  std::vector<float> acc(static_cast<size_t>(hs), 0.0f);
  for (int64_t j0 = 0; j0 < n; j0 += kernels::kFlashKeyBlock) {
    const int64_t j1 = std::min(n, j0 + kernels::kFlashKeyBlock);
    const float m_new = std::max(m, *std::max_element(scores.begin() + j0, scores.begin() + j1));
    if (m_new != m) {
      const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : math::softmax_exp(m, m_new);
      l *= alpha;
      for (float& a : acc) a *= alpha;
      m = m_new;
    }
    float sum = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      const float p = math::softmax_exp(scores[static_cast<size_t>(j)], m);
      sum += p;
      const float pr = round_to(p, pv_dtype_);
      for (int64_t d = 0; d < hs; ++d) {
        const float v = vh[j * hs + d];
        acc[static_cast<size_t>(d)] += pr * (v_rounded ? round_to(v, pv_dtype_) : v);
      }
    }
    l += sum;
  }
  const float inv = math::softmax_inv_sum(l);
  for (int64_t d = 0; d < hs; ++d) y[d] = acc[static_cast<size_t>(d)] * inv;
}

void CausalSelfAttention::append_kv(const float* row, int64_t pos) {
  const int64_t hs = channels_ / n_head_;
  for (int64_t h = 0; h < n_head_; ++h) {
    std::copy_n(row + channels_ + h * hs, hs, k_cache_.data() + (h * max_seq_ + pos) * hs);
    std::copy_n(row + 2 * channels_ + h * hs, hs, v_cache_.data() + (h * max_seq_ + pos) * hs);
  }
}

void CausalSelfAttention::cache_last_forward() {
  if (qkv_.ndim() != 2 || qkv_.dim(0) != seq_len_)
    throw Error("attention " + name() + ": the KV cache needs one window of the last forward, got " +
                shape_str(qkv_.shape()) + " for windows of " + std::to_string(seq_len_));
  k_cache_.assign(static_cast<size_t>(max_seq_ * channels_), 0.0f);
  v_cache_.assign(static_cast<size_t>(max_seq_ * channels_), 0.0f);
  const std::vector<float> q = host_fp32(qkv_);
  for (int64_t t = 0; t < seq_len_; ++t) append_kv(q.data() + t * 3 * channels_, t);
  cached_ = seq_len_;
}

const Tensor& CausalSelfAttention::decode(const Tensor& x) {
  if (cached_ <= 0 || cached_ >= max_seq_ || x.ndim() != 2 || x.dim(0) != 1)
    throw Error("attention " + name() + ": decode needs one row after 1 .. " + std::to_string(max_seq_ - 1) +
                " cached positions, got " + shape_str(x.shape()) + " after " + std::to_string(cached_));
  const Tensor& qkv = c_attn_->forward(x);
  const std::vector<float> row = host_fp32(qkv);
  const int64_t pos = cached_, hs = channels_ / n_head_, n = pos + 1;
  append_kv(row.data(), pos);
  cached_ = n;
  // The working-dtype q, k, v are exact in FP32; as attention_forward, the p @ v operands are in pv_dtype_.
  const bool v_rounded = pv_dtype_ != DType::kFloat32 && qkv.dtype() == DType::kFloat32;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> scores(static_cast<size_t>(n)), y(static_cast<size_t>(channels_));
  for (int64_t h = 0; h < n_head_; ++h) {
    const float* q = row.data() + h * hs;
    const float* kh = k_cache_.data() + h * max_seq_ * hs;
    const float* vh = v_cache_.data() + h * max_seq_ * hs;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      float dot = 0.0f;
      for (int64_t d = 0; d < hs; ++d) dot += q[d] * kh[j * hs + d];
      scores[j] = dot * scale;
      mx = std::max(mx, scores[j]);
    }
    if (kernel_ == FLASH) {  // the fused kernel's online softmax over the same key blocks, so p rounds the same way
      decode_row_online(scores, vh, v_rounded, y.data() + h * hs);
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      scores[j] = math::softmax_exp(scores[j], mx);
      sum += scores[j];
    }
    const float inv = math::softmax_inv_sum(sum);
    for (int64_t j = 0; j < n; ++j) scores[j] = round_to(scores[j] * inv, pv_dtype_);
    for (int64_t d = 0; d < hs; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float v = vh[j * hs + d];
        acc += scores[j] * (v_rounded ? round_to(v, pv_dtype_) : v);
      }
      y[static_cast<size_t>(h * hs + d)] = acc;
    }
  }
  y_dec_.ensure({1, channels_}, pv_dtype_, qkv.device());
  const Tensor src = Tensor::view(y.data(), {1, channels_}, DType::kFloat32);
  if (qkv.device() == Device::kCPU) {
    kernels::cast(src, y_dec_);
  } else {
    Tensor tmp = Tensor::zeros({1, channels_}, pv_dtype_);
    kernels::cast(src, tmp);
    tmp.copy_to(y_dec_);
  }
  return c_proj_->forward(y_dec_);
}

}  // namespace ampdist
