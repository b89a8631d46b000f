#include "runtime/nn/gpt.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"

namespace ampdist {

namespace {
const Tensor kNone;

void copy_fp32(const Tensor& src, Tensor& dst) {
  dst.ensure(src.shape(), DType::kFloat32, src.device());
  kernels::cast(src, dst);
}

void check_config(const GptConfig& c) {
  auto bad = [](const std::string& field, const std::string& what) {
    return ConfigInput("model.gpt." + field + " " + what);
  };
  if (c.n_layer() < 0) throw bad("n_layer", "must be >= 0, got " + std::to_string(c.n_layer()));
  if (c.n_head() <= 0) throw bad("n_head", "must be > 0, got " + std::to_string(c.n_head()));
  if (c.n_embd() <= 0 || c.n_embd() % c.n_head() != 0)
    throw bad("n_embd", "must be a positive multiple of n_head (" + std::to_string(c.n_head()) + "), got " +
                            std::to_string(c.n_embd()));
  if (c.seq_len() <= 0 || c.seq_len() > 65536)
    throw bad("seq_len", "must be in [1, 65536], got " + std::to_string(c.seq_len()));
  if (c.vocab_size() < 2 || c.vocab_size() > 65536)
    throw bad("vocab_size", "must be in [2, 65536] (uint16 tokens), got " + std::to_string(c.vocab_size()));
  if (!(c.dropout() >= 0.0f && c.dropout() < 1.0f))
    throw bad("dropout", "must be in [0, 1), got " + std::to_string(c.dropout()));
  if (c.padded_vocab_multiple() < 1 || c.padded_vocab_multiple() > 4096)
    throw bad("padded_vocab_multiple", "must be in [1, 4096], got " + std::to_string(c.padded_vocab_multiple()));
  if (!(c.init_scale() > 0.0f) || !std::isfinite(c.init_scale()))
    throw bad("init_scale", "must be finite and > 0, got " + std::to_string(c.init_scale()));
  if (c.recompute() != NONE && c.recompute() != POINTWISE && c.recompute() != BLOCK)
    throw bad("recompute", "must be NONE, POINTWISE or BLOCK, got " + GptRecompute_Name(c.recompute()));
  if (c.head_chunk_rows() < 0)
    throw bad("head_chunk_rows", "must be >= 0 (0: automatic), got " + std::to_string(c.head_chunk_rows()));
  if (c.attention() != FLASH && c.attention() != MATERIALIZED)
    throw bad("attention", "must be FLASH or MATERIALIZED, got " + AttentionKernel_Name(c.attention()));
  const double params = 12.0 * c.n_layer() * double(c.n_embd()) * c.n_embd() +
                        double(c.vocab_size() + c.seq_len()) * c.n_embd();
  if (params > double(int64_t{1} << 31))
    throw bad("n_embd", "and n_layer give more than 2^31 parameters (" + std::to_string(params) + ")");
}
}  // namespace

struct GptModel::Block {
  std::unique_ptr<LayerNorm> ln_1, ln_2;
  std::unique_ptr<CausalSelfAttention> attn;
  std::unique_ptr<Linear> c_fc, c_proj;
  std::unique_ptr<Activation> gelu;

  // The block's two branch outputs, once added into the residual stream (nothing reads them again): to `next`.
  void pass_branch_outputs(Block* next) {
    if (next == this) return;
    attn->c_proj().pass_output_to(next->attn->c_proj());
    c_proj->pass_output_to(*next->c_proj);
  }
  // Module::pass_buffers_to for each layer: one block's buffers move from block to block.
  void pass_buffers_to(Block& next, bool backward_only) {
    const std::vector<Module*> mine = modules(), theirs = next.modules();
    for (size_t i = 0; i < mine.size(); ++i) mine[i]->pass_buffers_to(*theirs[i], backward_only);
  }
  std::vector<Module*> modules() { return {ln_1.get(), attn.get(), ln_2.get(), c_fc.get(), gelu.get(), c_proj.get()}; }
};

GptModel::GptModel(const GptConfig& cfg, const Autocast& autocast, uint64_t seed)
    : Module("gpt"), cfg_(cfg), seed_(seed) {
  check_config(cfg_);
  const int64_t C = cfg_.n_embd(), T = cfg_.seq_len(), V = cfg_.vocab_size();
  const float scale = cfg_.init_scale();
  emb_ = std::make_unique<Embedding>("embedding", V, T, C, scale, table_rows());
  for (int l = 0; l < cfg_.n_layer(); ++l) {
    const std::string p = "h." + std::to_string(l);
    auto b = std::make_unique<Block>();
    b->ln_1 = std::make_unique<LayerNorm>(p + ".ln_1", C);
    b->attn = std::make_unique<CausalSelfAttention>(p + ".attn", C, cfg_.n_head(), T, scale, autocast,
                                                    cfg_.attention());
    b->ln_2 = std::make_unique<LayerNorm>(p + ".ln_2", C);
    b->c_fc = std::make_unique<Linear>(p + ".mlp.c_fc", C, 4 * C, true, autocast);
    b->gelu = std::make_unique<Activation>(p + ".mlp.gelu", Activation::Kind::kGELU, autocast);
    b->c_proj = std::make_unique<Linear>(p + ".mlp.c_proj", 4 * C, C, true, autocast);
    for (Linear* lin : {b->c_fc.get(), b->c_proj.get()}) {
      lin->weight().init_bound *= scale;
      lin->bias()->init_bound *= scale;
    }
    // Each LayerNorm's output goes only to the GEMM after it: stored in that GEMM's dtype (16 bits under autocast).
    b->ln_1->set_output_dtype(b->attn->c_attn().compute_dtype());
    b->ln_2->set_output_dtype(b->c_fc->compute_dtype());
    blocks_.push_back(std::move(b));
  }
  ln_f_ = std::make_unique<LayerNorm>("ln_f", C);
  if (cfg_.tie_embeddings()) {
    head_dtype_ = autocast.compute_dtype(OpKind::kLinear, "lm_head", autocast.working());
  } else {
    lm_head_ = std::make_unique<Linear>("lm_head", C, V, false, autocast);
    lm_head_->weight().init_bound *= scale;
    head_dtype_ = lm_head_->compute_dtype();
  }
  ln_f_->set_output_dtype(head_dtype_);
  resid_.resize(2 * blocks_.size() + 1);
}

GptModel::~GptModel() = default;

int64_t GptModel::table_rows() const {
  const int64_t m = cfg_.padded_vocab_multiple();
  return (cfg_.vocab_size() + m - 1) / m * m;
}

void GptModel::collect_parameters(std::vector<Parameter*>& out) {
  emb_->collect_parameters(out);
  for (auto& b : blocks_) {
    b->ln_1->collect_parameters(out);
    b->attn->collect_parameters(out);
    b->ln_2->collect_parameters(out);
    b->c_fc->collect_parameters(out);
    b->c_proj->collect_parameters(out);
  }
  ln_f_->collect_parameters(out);
  if (lm_head_) lm_head_->collect_parameters(out);
}

void GptModel::set_mode(bool training, int64_t step) {
  training_ = training;
  step_ = step;
}

void GptModel::set_key_mask(const std::vector<uint8_t>& mask) {
  for (auto& b : blocks_) b->attn->set_key_mask(mask);
}

void GptModel::dropout(Tensor& x, uint32_t site) {
  if (!training_ || cfg_.dropout() == 0.0f) return;
  const kernels::DropoutKey key{seed_, static_cast<uint32_t>(step_), site};
  kernels::dropout_inplace(x, cfg_.dropout(), key, sample_ids_, x.dim(0) / static_cast<int64_t>(sample_ids_.size()));
}

const Tensor& GptModel::forward(const Tensor& x) {
  const int64_t T = cfg_.seq_len();
  if (x.ndim() != 2 || x.dim(1) != T + 1 + kGptIndexColumns || x.dtype() != DType::kFloat32)
    throw Error("gpt: input " + shape_str(x.shape()) + " " + dtype_name(x.dtype()) + ", expected FP32 [B, " +
                std::to_string(T + 1 + kGptIndexColumns) + "] (seq_len + 1 tokens and the window index)");
  const int64_t B = x.dim(0);
  ids_.ensure({B, T}, DType::kFloat32);
  targets_.resize(static_cast<size_t>(B * T));
  sample_ids_.resize(static_cast<size_t>(B));
  const float* in = x.data_as<float>();
  float* ids = ids_.data_as<float>();
  const int64_t V = cfg_.vocab_size();
  for (int64_t b = 0; b < B; ++b) {
    const float* row = in + b * x.dim(1);
    for (int64_t t = 0; t < T; ++t) {
      ids[b * T + t] = row[t];
      const float y = row[t + 1];
      if (!(y >= 0.0f && y < static_cast<float>(V)))
        throw Error("gpt: target token " + std::to_string(y) + " of window row " + std::to_string(b) +
                        " is outside the vocabulary [0, " + std::to_string(V) + ")",
                    ErrorKind::kBadInput);
      targets_[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(y);
    }
    sample_ids_[static_cast<size_t>(b)] =
        static_cast<uint32_t>(row[T + 1]) | (static_cast<uint32_t>(row[T + 2]) << 16);
  }
  return run(ids_, T, cfg_.recompute() != BLOCK);
}

Shape GptModel::output_shape(const Shape& in) const {
  const int64_t n = (in.empty() ? 0 : in[0]) * cfg_.seq_len();
  return {n, cfg_.recompute() == BLOCK ? cfg_.n_embd() : cfg_.vocab_size()};
}

int64_t GptModel::activation_bytes(const Shape& in, DType working, bool training) const {
  const int64_t N = (in.empty() ? 0 : in[0]) * cfg_.seq_len(), T = cfg_.seq_len(), C = cfg_.n_embd(),
                H = cfg_.n_head(), L = cfg_.n_layer(), V = cfg_.vocab_size();
  const int64_t w = static_cast<int64_t>(dtype_size(working)), hw = static_cast<int64_t>(dtype_size(head_dtype_));
  const bool materialized = cfg_.attention() == MATERIALIZED, recompute = cfg_.recompute() == BLOCK;
  // A block's forward buffers: the LayerNorms' statistics, the LayerNorm outputs (2 C), qkv (3 C), the attention
  // output (C), the MLP's hidden and activated (8 C), the attention kernel's state.
  const int64_t block_forward = 16 + 14 * C * w + (materialized ? 4 * H * T : 8 * H);
  // A block's backward buffers: dqkv (3 C), the Linears' and GELU's input gradients (11 C), and under autocast the
  // two c_proj Linears' working-dtype copies of the FP32 residual gradient.
  const int64_t block_backward = 14 * C * w + (w < 4 ? 2 * C * w : 0);
  // Per layer the two FP32 residual streams it adds, and its forward buffers (one block's under recompute: BLOCK;
  // under POINTWISE the blocks share one output of each LayerNorm and of the GELU).
  int64_t per_token = L * 8 * C + (recompute ? std::min<int64_t>(L, 1) : L) * block_forward;
  if (cfg_.recompute() == POINTWISE && L > 0) per_token -= (L - 1) * 6 * C * w;
  per_token += 8 * C + 8 + C * hw;  // the embedding and residual 0, ln_f and its statistics
  if (!recompute) per_token += V * hw;  // the logits (under BLOCK one chunk's, below)
  per_token += L > 0 ? 2 * C * w : 0;  // one block's two branch outputs (they move from block to block)
  if (training) {
    // One block's backward buffers (they move down the blocks in the backward and are still allocated, with the
    // gradients below, during the next step's forward).
    per_token += L > 0 ? block_backward : 0;
    // the loss's per-row values (dlogits overwrite the logits), the head's input gradient, the residual gradient
    // (and the branch gradient's FP32 copy under dropout)
    per_token += 8 + C * hw + 4 * C + (cfg_.dropout() > 0.0f ? 4 * C : 0);
  }
  int64_t bytes = N * per_token;
  if (recompute) bytes += std::min(N, head_chunk_rows()) * V * hw;
  if (materialized && L > 0)  // the kernels' per-thread scores (and, training, dp and ds) of one window
    bytes += static_cast<int64_t>(kernels::num_threads()) * H * T * T * 4 * (training ? 3 : 1);
  return bytes;
}

const Tensor& GptModel::logits(std::span<const int32_t> tokens, int64_t batch, int64_t t) {
  if (batch <= 0 || t <= 0 || t > cfg_.seq_len() || static_cast<int64_t>(tokens.size()) != batch * t)
    throw Error("gpt: " + std::to_string(tokens.size()) + " tokens are not " + std::to_string(batch) +
                " windows of t in [1, " + std::to_string(cfg_.seq_len()) + "]");
  ids_.ensure({batch, t}, DType::kFloat32);
  float* ids = ids_.data_as<float>();
  for (size_t i = 0; i < tokens.size(); ++i) ids[i] = static_cast<float>(tokens[i]);
  sample_ids_.assign(static_cast<size_t>(batch), 0);
  const bool was_training = training_;
  training_ = false;
  const Tensor& out = run(ids_, t, true);
  training_ = was_training;
  return out;
}

const Tensor& GptModel::prefill(std::span<const int32_t> tokens) {
  keep_block_buffers_ = true;  // every block's keys and values are read below, also under recompute
  const Tensor& out = logits(tokens, 1, static_cast<int64_t>(tokens.size()));
  keep_block_buffers_ = false;
  for (auto& b : blocks_) b->attn->cache_last_forward();
  cached_ = static_cast<int64_t>(tokens.size());
  return out;
}

const Tensor& GptModel::decode(int32_t token) {
  if (cached_ <= 0 || cached_ >= cfg_.seq_len())
    throw Error("gpt: decode needs 1 .. " + std::to_string(cfg_.seq_len() - 1) + " cached positions, got " +
                std::to_string(cached_) + " (prefill first, or again once the window is full)");
  ids_.ensure({1, 1}, DType::kFloat32);
  ids_.data_as<float>()[0] = static_cast<float>(token);
  const bool was_training = training_;
  training_ = false;
  copy_fp32(emb_->forward_at(ids_, cached_), resid_[0]);
  size_t k = 0;
  auto residual = [&](const Tensor& branch) {
    copy_fp32(resid_[k], resid_[k + 1]);
    kernels::add_inplace(resid_[k + 1], branch);
    ++k;
  };
  for (auto& bp : blocks_) {
    Block& b = *bp;
    residual(b.attn->decode(b.ln_1->forward(resid_[k])));
    residual(b.c_proj->forward(b.gelu->forward(b.c_fc->forward(b.ln_2->forward(resid_[k])))));
  }
  ++cached_;
  training_ = was_training;
  return head(ln_f_->forward(resid_[k]), true);
}

const Tensor& GptModel::run(const Tensor& token_ids, int64_t t, bool keep_logits) {
  for (auto& b : blocks_) b->attn->set_seq_len(t);
  copy_fp32(emb_->forward(token_ids), resid_[0]);
  dropout(resid_[0], 0);
  size_t k = 0;
  auto residual = [&](const Tensor& branch, uint32_t site) {
    Tensor br = branch;  // the branch's output buffer, owned by its last layer; dropout may change it in place
    dropout(br, site);
    copy_fp32(resid_[k], resid_[k + 1]);
    kernels::add_inplace(resid_[k + 1], br);
    ++k;
  };
  const bool recompute = cfg_.recompute() == BLOCK && !keep_block_buffers_;
  // Under recompute one set of block buffers moves up the blocks in a forward and down in a backward; a forward
  // without a backward (evaluation) leaves it at the last block: it starts every forward at block 0.
  if (recompute) move_block_buffers(0, false);
  // POINTWISE: the LayerNorm and GELU outputs go to the shared buffers, overwritten by the next block.
  const bool shared = cfg_.recompute() == POINTWISE;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = *blocks_[l];
    if (shared) b.ln_1->forward_into(resid_[k], ln_out_[0]);
    residual(b.attn->forward(shared ? ln_out_[0] : b.ln_1->forward(resid_[k])), static_cast<uint32_t>(1 + 2 * l));
    if (shared) b.ln_2->forward_into(resid_[k], ln_out_[1]);
    const Tensor& fc = b.c_fc->forward(shared ? ln_out_[1] : b.ln_2->forward(resid_[k]));
    const Tensor* h = &gelu_out_;
    if (shared) b.gelu->forward_into(fc, gelu_out_);
    else h = &b.gelu->forward(fc);
    residual(b.c_proj->forward(*h), static_cast<uint32_t>(2 + 2 * l));
    Block* next = l + 1 < blocks_.size() ? blocks_[l + 1].get() : nullptr;
    // Under recompute the block's input (resid_) is all the backward's rerun needs: all its buffers, the branch
    // outputs with them, serve the next block.
    if (recompute) {
      if (next) move_block_buffers(l + 1, false);  // the last block keeps the set, branch outputs included, for its rerun
    } else {
      // The branch outputs go to the next block; the last block's back to the first, for the next forward.
      b.pass_branch_outputs(next ? next : blocks_.front().get());
    }
  }
  return head(ln_f_->forward(resid_[k]), keep_logits);
}

void GptModel::recompute_block(size_t l) {
  // The forward of run() for block l from its kept input, without the residual adds (resid_ holds their results):
  // the same deterministic kernels on the same inputs, so every buffer the backward reads is bitwise the original.
  // The two c_proj outputs (the branches, and their dropout) are not read by the backward: not computed again.
  Block& b = *blocks_[l];
  b.attn->recompute_for_backward(b.ln_1->forward(resid_[2 * l]));
  b.c_proj->resave_input(b.gelu->forward(b.c_fc->forward(b.ln_2->forward(resid_[2 * l + 1]))));
}

void GptModel::move_block_buffers(size_t to, bool backward_only) {
  if (moving_set_at_ != to && moving_set_at_ < blocks_.size() && to < blocks_.size())
    blocks_[moving_set_at_]->pass_buffers_to(*blocks_[to], backward_only);
  moving_set_at_ = to;
}

int64_t GptModel::head_chunk_rows() const {
  if (cfg_.head_chunk_rows() > 0) return cfg_.head_chunk_rows();
  const int64_t rows = (int64_t{128} << 20) / (int64_t{4} * cfg_.vocab_size()) / 64 * 64;
  return std::max<int64_t>(64, rows);
}

Parameter& GptModel::head_weight() { return lm_head_ ? lm_head_->weight() : emb_->token_weight(); }

const Tensor& GptModel::head(const Tensor& hf, bool keep_logits) {
  // logits = h @ W^T, W = wte (tied) or lm_head.weight, a GEMM in the head's dtype (autocast "linear" of layer
  // "lm_head"), by chunks of rows: the same calls whether the logits are kept or recomputed per chunk.
  if (hf.dtype() != head_dtype_) {
    h_cast_.ensure(hf.shape(), head_dtype_, hf.device());
    kernels::cast(hf, h_cast_);
  } else {
    h_cast_ = hf;
  }
  logits_kept_ = keep_logits;
  if (!keep_logits) {
    logits_ = Tensor();  // whatever an inference call left; head_logits computes one chunk at a time
    return h_cast_;
  }
  const int64_t N = hf.dim(0), V = cfg_.vocab_size(), R = head_chunk_rows();
  logits_.ensure({N, V}, head_dtype_, hf.device());
  const Tensor W = head_weight().weights_for(head_dtype_).rows(0, V);
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    Tensor out = logits_.rows(r0, std::min(N, r0 + R));
    kernels::gemm(h_cast_.rows(r0, std::min(N, r0 + R)), false, W, true, out);
  }
  return logits_;
}

Tensor GptModel::head_logits(int64_t r0, int64_t r1) {
  const int64_t N = h_cast_.ndim() == 2 ? h_cast_.dim(0) : 0, V = cfg_.vocab_size();
  if (r0 < 0 || r1 <= r0 || r1 > N || r0 % head_chunk_rows() != 0 || r1 - r0 > head_chunk_rows())
    throw Error("gpt: head_logits(" + std::to_string(r0) + ", " + std::to_string(r1) + ") is not a chunk of " +
                std::to_string(head_chunk_rows()) + " of the last forward's " + std::to_string(N) + " rows");
  if (logits_kept_) return logits_.rows(r0, r1);
  chunk_logits_.ensure({r1 - r0, V}, head_dtype_, h_cast_.device());
  kernels::gemm(h_cast_.rows(r0, r1), false, head_weight().weights_for(head_dtype_).rows(0, V), true, chunk_logits_);
  return chunk_logits_;
}

const Tensor& GptModel::backward(const Tensor& dy, GradContext& ctx) {
  const bool outer_need = ctx.need_input_grad;
  ctx.need_input_grad = true;
  const int64_t N = h_cast_.dim(0), V = cfg_.vocab_size(), R = head_chunk_rows();
  const bool given = dy.data() != nullptr;  // an empty Tensor(): the bound head gradient
  if (given && (dy.ndim() != 2 || dy.dim(0) != N || dy.dim(1) != V))
    throw Error("gpt: backward got dlogits " + shape_str(dy.shape()) + " for logits [" + std::to_string(N) + ", " +
                std::to_string(V) + "]");
  // The binding is consumed by this backward whatever happens in it (it refers to the loss that bound it).
  const HeadGradient head_gradient = std::move(head_gradient_);
  head_gradient_ = nullptr;
  if (!given && !head_gradient)
    throw Error("gpt: backward without dlogits needs a head gradient (LanguageModelLoss::backward binds one)");
  // Per chunk: dW [V, C] += dlogits^T [V, rows] @ h [rows, C] in FP32 (written by the first chunk of the first
  // micro-batch), dh [rows, C] = dlogits @ W. For the tied head the embedding's backward adds its scatter after
  // this; the padded rows beyond V are never written here (the embedding's backward zeroes them with the rest).
  Parameter& w = head_weight();
  const Tensor W = w.weights_for(head_dtype_).rows(0, V);
  Tensor dW = w.grad.rows(0, V);
  dh_.ensure(h_cast_.shape(), head_dtype_, h_cast_.device());
  for (int64_t c = 0, r0 = 0; r0 < N; ++c, r0 += R) {
    const int64_t r1 = std::min(N, r0 + R);
    Tensor dl;
    if (given) {
      dl = dy.rows(r0, r1);
      if (dl.dtype() != head_dtype_) {
        dl_cast_.ensure(dl.shape(), head_dtype_, dl.device());
        kernels::cast(dl, dl_cast_);
        dl = dl_cast_;
      }
    } else {
      dl = head_logits(r0, r1);
      head_gradient(c, dl);
    }
    kernels::gemm(dl, true, h_cast_.rows(r0, r1), false, dW, 1.0f, ctx.accumulate || r0 > 0 ? 1.0f : 0.0f);
    Tensor dh = dh_.rows(r0, r1);
    kernels::gemm(dl, false, W, false, dh);
  }
  if (lm_head_ && ctx.on_grad_ready) ctx.on_grad_ready(w);
  dresid_.ensure(resid_.back().shape(), DType::kFloat32, resid_.back().device());
  ln_f_->backward_into(dh_, ctx, dresid_, false);
  const bool drop = training_ && cfg_.dropout() > 0.0f;
  auto branch_grad = [&](uint32_t site) -> const Tensor& {
    if (!drop) return dresid_;
    copy_fp32(dresid_, dbranch_);
    dropout(dbranch_, site);
    return dbranch_;
  };
  const bool recompute = cfg_.recompute() == BLOCK;
  // The moving set of buffers (backward ones; under recompute all) starts at the last block and moves down: it ended
  // the last backward at block 0 (under recompute the forward has just left it at the last block).
  if (!blocks_.empty()) move_block_buffers(blocks_.size() - 1, !recompute);
  for (size_t l = blocks_.size(); l-- > 0;) {
    Block& b = *blocks_[l];
    if (recompute) recompute_block(l);
    if (cfg_.recompute() == POINTWISE) {  // this block's point-wise outputs again, where the GEMMs' backward reads them
      b.ln_1->forward_into(resid_[2 * l], ln_out_[0]);
      b.attn->c_attn().resave_input(ln_out_[0]);
      b.ln_2->forward_into(resid_[2 * l + 1], ln_out_[1]);
      b.c_fc->resave_input(ln_out_[1]);
      b.gelu->forward_into(b.c_fc->output(), gelu_out_);
      b.c_proj->resave_input(gelu_out_);
    }
    const Tensor& dm = b.c_fc->backward(b.gelu->backward(b.c_proj->backward(branch_grad(2 + 2 * l), ctx), ctx), ctx);
    b.ln_2->backward_into(dm, ctx, dresid_, true);
    const Tensor& da = b.attn->backward(branch_grad(1 + 2 * l), ctx);
    b.ln_1->backward_into(da, ctx, dresid_, true);
    // One block's backward buffers at a time (under recompute one block's buffers of any kind), handed down.
    if (l > 0) move_block_buffers(l - 1, !recompute);
  }
  dropout(dresid_, 0);
  emb_->set_keep_token_grad(!lm_head_);
  emb_->backward(dresid_, ctx);
  ctx.need_input_grad = outer_need;
  return kNone;
}

// ---- LanguageModelLoss -------------------------------------------------------------------------------------------

double LanguageModelLoss::forward(const Tensor& output, std::span<const int32_t>) {
  const std::span<const int32_t> targets = model_.targets();
  const int64_t N = static_cast<int64_t>(targets.size()), R = model_.head_chunk_rows();
  if (output.ndim() != 2 || output.dim(0) != N)
    throw Error("language-model loss: model output " + shape_str(output.shape()) + " for " + std::to_string(N) +
                " targets");
  chunks_.resize(static_cast<size_t>((N + R - 1) / R));
  const double seq_len = static_cast<double>(model_.seq_len());
  double sum = 0.0;
  for (int64_t c = 0, r0 = 0; r0 < N; ++c, r0 += R) {
    const int64_t r1 = std::min(N, r0 + R);
    const Tensor logits = model_.head_logits(r0, r1);
    const std::span<const int32_t> t = targets.subspan(static_cast<size_t>(r0), static_cast<size_t>(r1 - r0));
    Chunk& ch = chunks_[static_cast<size_t>(c)];
    if (device_loss_sum_)  // the training step: added to the step state where it lives (no host read)
      kernels::softmax_cross_entropy_forward_to(logits, t, ch.targets_dev, ch.lse, ch.row_loss, device_loss_sum_,
                                                seq_len);
    else
      sum += kernels::softmax_cross_entropy_forward(logits, t, ch.lse) / seq_len;  // as the step state adds it
  }
  return sum;
}

const Tensor& LanguageModelLoss::backward(float grad_scale) {
  const float* scale = device_scale_;
  const double divisor = device_divisor_;
  model_.set_head_gradient([this, scale, divisor, grad_scale](int64_t c, Tensor& logits) {
    const int64_t r0 = c * model_.head_chunk_rows();
    const std::span<const int32_t> t =
        model_.targets().subspan(static_cast<size_t>(r0), static_cast<size_t>(logits.dim(0)));
    if (c < 0 || c >= std::ssize(chunks_))
      throw Error("language-model loss: chunk " + std::to_string(c) + " of a backward whose forward had " +
                  std::to_string(chunks_.size()) + " chunks");
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    const float seq_len = static_cast<float>(model_.seq_len());
    // In place: an element-wise kernel, and nothing reads a chunk's logits after its gradient.
    if (scale)
      kernels::softmax_cross_entropy_backward_from(logits, t, ch.targets_dev, ch.lse, scale, divisor, seq_len, logits);
    else
      kernels::softmax_cross_entropy_backward(logits, t, ch.lse, grad_scale / seq_len, logits);
  });
  return kNone;
}

int32_t sample_next_token(std::span<const float> logits, float temperature, int top_k, float u) {
  if (logits.empty()) throw Error("sample_next_token: no logits");
  const int32_t V = static_cast<int32_t>(logits.size());
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  // Largest first; equal logits by ascending id (stable_sort keeps the id order).
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (!(temperature > 0.0f)) return order[0];
  const size_t k = top_k > 0 ? std::min<size_t>(static_cast<size_t>(top_k), order.size()) : order.size();
  const double mx = logits[order[0]];
  std::vector<double> p(k);
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    p[i] = std::exp((static_cast<double>(logits[order[i]]) - mx) / temperature);
    sum += p[i];
  }
  double target = static_cast<double>(u) * sum, acc = 0.0;
  for (size_t i = 0; i < k; ++i) {
    acc += p[i];
    if (target < acc) return order[i];
  }
  return order[k - 1];
}

}  // namespace ampdist
