// The transformer layers and the GPT model on the CPU backend: every backward against central finite differences
// in FP32, attention's masked rows and FP32 scores, dropout masks keyed by the window, and sampling.
//
// The finite-difference bound and where it comes from: testing::check_grad (tests/test_tensors.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/math.h"
#include "runtime/kernels/transformer.h"
#include "runtime/nn/attention.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/layernorm.h"
#include "runtime/train/config.h"
#include "tests/test_tensors.h"

namespace ampdist {
namespace {

using testing::check_grad;
using testing::copy_of;
using testing::dot;
const testing::TensorRng random_tensor{4242};

// Parameters of a module laid out in FP32 master weights, each set to U(lo, hi) (LayerNorm gains 1 + U(-0.2, 0.2)).
std::unique_ptr<MasterWeights> fp32_masters(Module& m, float lo = -0.5f, float hi = 0.5f) {
  std::vector<Parameter*> params;
  m.collect_parameters(params);
  auto mw = bind_parameters(params, DType::kFloat32, Device::kCPU, 0);
  random_tensor.fill(params, lo, hi);
  return mw;
}

GradContext fresh_ctx() {
  GradContext ctx;
  ctx.accumulate = false;
  ctx.need_input_grad = true;
  return ctx;
}

// ---- LayerNorm -------------------------------------------------------------------------------------------------

TEST(GptLayers, LayerNormGradientsMatchFiniteDifferences) {
  const Autocast ac(DType::kFloat32);
  LayerNorm ln("ln", 8);
  auto mw = fp32_masters(ln);
  Tensor x = random_tensor({5, 8}, 1, -2.0f, 2.0f);
  const Tensor w = random_tensor({5, 8}, 2);
  auto loss = [&] { return dot(ln.forward(x), w); };
  loss();
  GradContext ctx = fresh_ctx();
  const std::vector<float> dx = copy_of(ln.backward(w, ctx));
  const std::vector<float> dg = copy_of(ln.weight().grad), db = copy_of(ln.bias().grad);
  check_grad("dx", x.data_as<float>(), dx.data(), x.numel(), 40, loss);
  check_grad("dgamma", ln.weight().master.data_as<float>(), dg.data(), 8, 8, loss);
  check_grad("dbeta", ln.bias().master.data_as<float>(), db.data(), 8, 8, loss);
}

TEST(GptLayers, LayerNormStatisticsStayFp32ForFp16Input) {
  // Rows of fp16 values around 1000 with a spread of 1: E[x^2] - E[x]^2 in fp16 would lose every digit; the FP32
  // two-pass statistics give a unit-variance output.
  LayerNorm ln("ln", 64);
  auto mw = fp32_masters(ln);
  for (Parameter* p : {&ln.weight(), &ln.bias()})
    for (int64_t i = 0; i < p->numel(); ++i) p->master.data_as<float>()[i] = p == &ln.weight() ? 1.0f : 0.0f;
  Tensor x = Tensor::empty({2, 64}, DType::kFloat16);
  for (int64_t i = 0; i < 128; ++i) x.data_as<half>()[i] = half(1000.0f + ((i % 2) ? 1.0f : -1.0f));
  const Tensor& y = ln.forward(x);
  ASSERT_EQ(y.dtype(), DType::kFloat32);
  for (int64_t i = 0; i < 128; ++i) EXPECT_NEAR(y.item(i), (i % 2) ? 1.0f : -1.0f, 1e-4f) << i;  // eps 1e-5 shrinks 1
}

// ---- GELU (tanh form) ------------------------------------------------------------------------------------------

TEST(GptLayers, GeluGradientMatchesFiniteDifferences) {
  const Autocast ac(DType::kFloat32);
  Activation gelu("gelu", Activation::Kind::kGELU, ac);
  Tensor x = random_tensor({4, 16}, 8, -4.0f, 4.0f);
  const Tensor w = random_tensor({4, 16}, 9);
  auto loss = [&] { return dot(gelu.forward(x), w); };
  loss();
  GradContext ctx = fresh_ctx();
  const std::vector<float> dx = copy_of(gelu.backward(w, ctx));
  check_grad("dx", x.data_as<float>(), dx.data(), x.numel(), 64, loss);
  // The tanh form at a few points against the double formula (torch.nn.GELU(approximate="tanh")).
  for (double v : {-6.0, -1.0, -0.1, 0.0, 0.3, 2.0, 9.0}) {
    const double ref = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(math::gelu(static_cast<float>(v)), ref, 1e-6 * std::max(1.0, std::abs(v))) << v;
  }
}

// ---- Embedding -------------------------------------------------------------------------------------------------

TEST(GptLayers, EmbeddingGradientsMatchFiniteDifferences) {
  Embedding emb("emb", 11, 6, 4, 1.0f);
  auto mw = fp32_masters(emb);
  Tensor ids = Tensor::empty({2, 6}, DType::kFloat32);
  const float toks[12] = {3, 1, 3, 10, 0, 3, 7, 7, 2, 1, 0, 9};  // repeats: the scatter must add
  for (int i = 0; i < 12; ++i) ids.data_as<float>()[i] = toks[i];
  const Tensor w = random_tensor({12, 4}, 3);
  auto loss = [&] { return dot(emb.forward(ids), w); };
  loss();
  GradContext ctx = fresh_ctx();
  emb.backward(w, ctx);
  const std::vector<float> dte = copy_of(emb.token_weight().grad), dpe = copy_of(emb.position_weight().grad);
  check_grad("dwte", emb.token_weight().master.data_as<float>(), dte.data(), 44, 44, loss);
  check_grad("dwpe", emb.position_weight().master.data_as<float>(), dpe.data(), 24, 24, loss);
  // Token 3 appears three times: its gradient row is the sum of three rows of w.
  for (int c = 0; c < 4; ++c)
    EXPECT_FLOAT_EQ(dte[3 * 4 + c], w.item(0 * 4 + c) + w.item(2 * 4 + c) + w.item(5 * 4 + c));
}

TEST(GptLayers, EmbeddingRejectsTokenOutsideVocabulary) {
  Embedding emb("emb", 11, 6, 4, 1.0f);
  auto mw = fp32_masters(emb);
  Tensor ids = Tensor::zeros({1, 3}, DType::kFloat32);
  ids.data_as<float>()[2] = 11.0f;
  try {
    emb.forward(ids);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
}

// ---- attention -------------------------------------------------------------------------------------------------

TEST(GptLayers, AttentionGradientsMatchFiniteDifferences) {
  const Autocast ac(DType::kFloat32);
  CausalSelfAttention attn("attn", 8, 2, 5, 1.0f, ac);
  auto mw = fp32_masters(attn);
  Tensor x = random_tensor({10, 8}, 4, -1.5f, 1.5f);  // B = 2 windows of T = 5
  const Tensor w = random_tensor({10, 8}, 5);
  auto loss = [&] { return dot(attn.forward(x), w); };
  loss();
  GradContext ctx = fresh_ctx();
  const std::vector<float> dx = copy_of(attn.backward(w, ctx));
  check_grad("dx", x.data_as<float>(), dx.data(), x.numel(), 80, loss);
  std::vector<Parameter*> params;
  attn.collect_parameters(params);
  for (Parameter* p : params) {
    const std::vector<float> g = copy_of(p->grad);
    check_grad(p->name, p->master.data_as<float>(), g.data(), p->numel(), 30, loss);
  }
}

TEST(GptLayers, AttentionFullyMaskedRowIsFiniteAndZero) {
  // Window 0 masks key 0: its query 0 has no key at all. Window 1 masks nothing.
  const kernels::AttentionShape s{2, 4, 2, 3};
  Tensor qkv = random_tensor({8, 18}, 6, -2.0f, 2.0f);
  std::vector<uint8_t> mask(8, 1);
  mask[0] = 0;
  Tensor probs = Tensor::empty({2, 2, 4, 4}, DType::kFloat32);
  Tensor out = Tensor::empty({8, 6}, DType::kFloat32);
  kernels::attention_forward(qkv, s, mask, DType::kFloat32, probs, out);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.item(i))) << i;
  for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(out.item(c), 0.0f) << "row 0 has no key: output 0";
  for (int64_t h = 0; h < 2; ++h) {
    // Query 1 of window 0 sees only key 1 (key 0 is masked): probability exactly 1.
    EXPECT_EQ(probs.item(((0 * 2 + h) * 4 + 1) * 4 + 1), 1.0f);
    EXPECT_EQ(probs.item(((0 * 2 + h) * 4 + 1) * 4 + 0), 0.0f);
  }
  const Tensor w = random_tensor({8, 6}, 7);
  Tensor dqkv = Tensor::empty({8, 18}, DType::kFloat32);
  kernels::attention_backward(qkv, probs, s, DType::kFloat32, w, dqkv);
  for (int64_t i = 0; i < dqkv.numel(); ++i) ASSERT_TRUE(std::isfinite(dqkv.item(i))) << i;
  // And the gradient is right with the mask in place.
  auto loss = [&] {
    kernels::attention_forward(qkv, s, mask, DType::kFloat32, probs, out);
    return dot(out, w);
  };
  const std::vector<float> an = copy_of(dqkv);
  check_grad("dqkv (masked)", qkv.data_as<float>(), an.data(), qkv.numel(), 144, loss);
}

TEST(GptLayers, AttentionScoresBeyondFp16RangeStayFinite) {
  // fp16 q and k of 200 in every column: q.k / sqrt(hs) = 200 * 200 * 16 / 4 = 160000 > 65504, which an fp16 score
  // would turn into inf (and softmax into NaN). Scores are FP32 (autocast "softmax"), so outputs are finite.
  const kernels::AttentionShape s{1, 3, 1, 16};
  Tensor qkv = Tensor::empty({3, 48}, DType::kFloat16);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 48; ++c)
      qkv.data_as<half>()[r * 48 + c] = half(c < 32 ? 200.0f : static_cast<float>(r + 1));
  Tensor probs = Tensor::empty({1, 1, 3, 3}, DType::kFloat32);
  Tensor out = Tensor::empty({3, 16}, DType::kFloat16);
  kernels::attention_forward(qkv, s, {}, DType::kFloat16, probs, out);
  // Equal scores: uniform attention over the visible keys; v of row r is r + 1, so out[i] = mean(1 .. i + 1).
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t c = 0; c < 16; ++c) EXPECT_NEAR(out.item(i * 16 + c), (i + 2) / 2.0f, 1e-3f) << i;
  Tensor dqkv = Tensor::empty({3, 48}, DType::kFloat16);
  Tensor dout = Tensor::empty({3, 16}, DType::kFloat16);
  for (int64_t i = 0; i < 48; ++i) dout.data_as<half>()[i] = half(1.0f);
  kernels::attention_backward(qkv, probs, s, DType::kFloat16, dout, dqkv);
  for (int64_t i = 0; i < dqkv.numel(); ++i) ASSERT_TRUE(std::isfinite(dqkv.item(i))) << i;
}

// ---- dropout ---------------------------------------------------------------------------------------------------

TEST(GptLayers, DropoutMaskFollowsTheWindowNotItsBatchPosition) {
  const kernels::DropoutKey key{99, 7, 3};
  Tensor a = Tensor::empty({6, 50}, DType::kFloat32), b = Tensor::empty({6, 50}, DType::kFloat32);
  for (int64_t i = 0; i < 300; ++i) a.data_as<float>()[i] = b.data_as<float>()[i] = 1.0f;
  const std::vector<uint32_t> ids_ab = {5, 123456}, ids_ba = {123456, 5};  // windows of 3 rows, swapped
  kernels::dropout_inplace(a, 0.25f, key, ids_ab, 3);
  kernels::dropout_inplace(b, 0.25f, key, ids_ba, 3);
  int64_t kept = 0;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 50; ++c) {
      EXPECT_EQ(a.item(r * 50 + c), b.item((r + 3) * 50 + c));
      EXPECT_EQ(a.item((r + 3) * 50 + c), b.item(r * 50 + c));
    }
  for (int64_t i = 0; i < 300; ++i) {
    const float v = a.item(i);
    EXPECT_TRUE(v == 0.0f || v == 1.0f / 0.75f) << v;
    kept += v != 0.0f;
  }
  // 300 Bernoulli(0.75) draws: mean 225, standard deviation 7.5; +-5 sd.
  EXPECT_NEAR(static_cast<double>(kept), 225.0, 37.5);
}

// ---- the whole model -------------------------------------------------------------------------------------------

GptConfig small_config(bool tied, float dropout) {
  GptConfig c;
  c.set_n_layer(2);
  c.set_n_head(2);
  c.set_n_embd(8);
  c.set_seq_len(6);
  c.set_vocab_size(13);
  c.set_dropout(dropout);
  c.set_tie_embeddings(tied);
  return c;
}

// B windows of T + 1 tokens plus the window index columns.
Tensor windows(const GptConfig& c, int64_t B) {
  const int64_t T = c.seq_len();
  Tensor x = Tensor::empty({B, T + 3}, DType::kFloat32);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t <= T; ++t)
      x.data_as<float>()[b * (T + 3) + t] = static_cast<float>((b * 7 + t * t * 3 + 1) % c.vocab_size());
    x.data_as<float>()[b * (T + 3) + T + 1] = static_cast<float>(b + 40);
    x.data_as<float>()[b * (T + 3) + T + 2] = 0.0f;
  }
  return x;
}

void check_model_gradients(bool tied, float dropout, GptRecompute recompute = POINTWISE, int head_chunk_rows = 0) {
  GptConfig cfg = small_config(tied, dropout);
  cfg.set_recompute(recompute);
  cfg.set_head_chunk_rows(head_chunk_rows);
  const Autocast ac(DType::kFloat32);
  GptModel model(cfg, ac, 5);
  auto mw = fp32_masters(model);
  model.set_mode(true, 3);  // dropout masks fixed by (seed, step 3, site, window): the loss is a function
  LanguageModelLoss crit(model);
  const Tensor x = windows(cfg, 3);
  auto loss = [&] { return crit.forward(model.forward(x), {}); };
  const double l0 = loss();
  EXPECT_GT(l0, 0.0);
  GradContext ctx = fresh_ctx();
  ctx.need_input_grad = false;
  int ready = 0;
  ctx.on_grad_ready = [&](Parameter&) { ++ready; };
  model.backward(crit.backward(1.0f), ctx);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  EXPECT_EQ(ready, static_cast<int>(params.size())) << "every parameter reported ready once";
  for (Parameter* p : params) {
    const std::vector<float> g = copy_of(p->grad);
    check_grad(p->name, p->master.data_as<float>(), g.data(), p->numel(), 12, loss);
  }
}

TEST(GptModel, GradientsMatchFiniteDifferencesTied) { check_model_gradients(true, 0.0f); }
TEST(GptModel, GradientsMatchFiniteDifferencesUntied) { check_model_gradients(false, 0.0f); }
TEST(GptModel, GradientsMatchFiniteDifferencesWithDropout) { check_model_gradients(true, 0.2f); }
// The head and the loss by chunks of 5 of the 18 rows (the last chunk 3): under BLOCK each chunk's logits are
// computed in the loss's forward and again in the backward, and the head's weight gradient is added chunk by chunk.
TEST(GptModel, GradientsMatchFiniteDifferencesByHeadChunks) {
  for (bool tied : {true, false})
    for (GptRecompute r : {NONE, BLOCK}) {
      SCOPED_TRACE(std::string(tied ? "tied " : "untied ") + GptRecompute_Name(r));
      check_model_gradients(tied, 0.0f, r, 5);
    }
}

// The head by chunks of 5 of the 18 rows, tied and untied: (a) a whole dlogits tensor handed to backward gives bitwise
// the gradients of the chunk gradients the loss binds (the same dlogits kernel per chunk, the same GEMMs); (b) a
// second micro-batch of the same windows with ctx.accumulate adds to the head's weight gradient chunk after chunk:
// twice the one-micro-batch gradient up to the FP32 roundings of the additions. Chunk contributions of opposite signs
// cancel, so the bound is on the scale of the gradient, not of each element: each of the <= 8 additions into an
// element rounds by <= 2^-24 of a partial sum, and the partial sums here stay within a few times max |2g|, so
// 1e-5 max |2g| is over 10x the rounding; a dropped or overwritten chunk is off by O(max |g|). Every parameter is
// reported ready once per backward.
TEST(GptModel, HeadChunksTakeAGivenDlogitsAndAccumulateOverMicroBatches) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GptConfig cfg = small_config(tied, 0.0f);
    cfg.set_recompute(NONE);
    cfg.set_head_chunk_rows(5);
    const Autocast ac(DType::kFloat32);
    const Tensor x = windows(cfg, 3);
    GptModel bound(cfg, ac, 5), given(cfg, ac, 5);
    auto mw_bound = fp32_masters(bound), mw_given = fp32_masters(given);
    bound.set_mode(true, 3);
    given.set_mode(true, 3);
    LanguageModelLoss crit_bound(bound);
    GradContext ctx = fresh_ctx();
    ctx.need_input_grad = false;
    int ready = 0;
    ctx.on_grad_ready = [&](Parameter&) { ++ready; };
    crit_bound.forward(bound.forward(x), {});
    bound.backward(crit_bound.backward(1.0f), ctx);
    // The same dlogits formed whole from the kept logits, outside the loss.
    const Tensor& logits = given.forward(x);
    Tensor lse, dlogits = Tensor::empty(logits.shape(), DType::kFloat32);
    kernels::softmax_cross_entropy_forward(logits, given.targets(), lse);
    kernels::softmax_cross_entropy_backward(logits, given.targets(), lse, 1.0f / static_cast<float>(cfg.seq_len()),
                                            dlogits);
    given.backward(dlogits, ctx);
    const std::vector<float> g_bound = copy_of(mw_bound->grads()), g_given = copy_of(mw_given->grads());
    ASSERT_EQ(g_bound.size(), g_given.size());
    for (size_t i = 0; i < g_bound.size(); ++i)
      ASSERT_EQ(std::memcmp(&g_bound[i], &g_given[i], sizeof(float)), 0) << "gradient element " << i;
    std::vector<Parameter*> params;
    bound.collect_parameters(params);
    EXPECT_EQ(ready, 2 * static_cast<int>(params.size()));
    // A second micro-batch of the same windows, accumulated.
    ctx.accumulate = true;
    crit_bound.forward(bound.forward(x), {});
    bound.backward(crit_bound.backward(1.0f), ctx);
    const std::vector<float> g2 = copy_of(mw_bound->grads());
    float scale = 0.0f;
    for (float g : g_bound) scale = std::max(scale, std::fabs(2.0f * g));
    ASSERT_GT(scale, 0.0f);
    for (size_t i = 0; i < g2.size(); ++i)
      ASSERT_NEAR(g2[i], 2.0f * g_bound[i], 1e-5 * scale) << "gradient element " << i;
    EXPECT_THROW(bound.backward(Tensor(), ctx), Error) << "the binding is consumed by one backward";
  }
}

// recompute: POINTWISE reruns each block's GELU and BLOCK each block's forward before its backward: the same kernels on
// the same inputs, so the loss and every gradient element are bitwise those of NONE, in every precision and with
// dropout (whose masks are keyed by step, site and window, not drawn in order), for both attention kernels. The head
// runs by chunks of 7 of the 18 rows: BLOCK computes each chunk's logits again in the backward, the other modes
// keep them.
TEST(GptModel, RecomputeGivesBitwiseTheSameLossAndGradients) {
  for (DType working : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (AttentionKernel kernel : {FLASH, MATERIALIZED}) {
      SCOPED_TRACE(std::string(dtype_name(working)) + (kernel == FLASH ? " FLASH" : " MATERIALIZED"));
      std::vector<float> grads[3];
      double losses[3];
      for (int r = 0; r < 3; ++r) {
        GptConfig cfg = small_config(true, 0.2f);
        cfg.set_n_layer(3);
        cfg.set_attention(kernel);
        cfg.set_recompute(r == 0 ? NONE : r == 1 ? POINTWISE : BLOCK);
        cfg.set_head_chunk_rows(7);
        const Autocast ac(working);
        GptModel model(cfg, ac, 5);
        std::vector<Parameter*> params;
        model.collect_parameters(params);
        auto mw = bind_parameters(params, working, Device::kCPU, 17);
        model.set_mode(true, 4);
        LanguageModelLoss crit(model);
        const Tensor x = windows(cfg, 3);
        GradContext ctx = fresh_ctx();
        ctx.need_input_grad = false;
        for (int step = 0; step < 2; ++step) {  // the second step reuses (or reallocates) the released buffers
          losses[r] = crit.forward(model.forward(x), {});
          model.backward(crit.backward(1024.0f), ctx);
        }
        grads[r] = copy_of(mw->grads());
      }
      for (int r = 1; r < 3; ++r) {
        SCOPED_TRACE(r == 1 ? "POINTWISE" : "BLOCK");
        EXPECT_EQ(losses[0], losses[r]);
        ASSERT_EQ(grads[0].size(), grads[r].size());
        for (size_t i = 0; i < grads[0].size(); ++i)
          ASSERT_EQ(std::memcmp(&grads[0][i], &grads[r][i], sizeof(float)), 0) << "gradient element " << i;
      }
    }
}

TEST(GptModel, ParameterNamesFollowNanoGpt) {
  const Autocast ac(DType::kFloat32);
  GptModel model(small_config(false, 0.0f), ac, 5);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  std::vector<std::string> names;
  for (Parameter* p : params) names.push_back(p->name);
  ASSERT_EQ(names.size(), 2u + 2u * 12u + 2u + 1u);
  EXPECT_EQ(names[0], "wte.weight");
  EXPECT_EQ(names[1], "wpe.weight");
  EXPECT_EQ(names[2], "h.0.ln_1.weight");
  EXPECT_EQ(names[4], "h.0.attn.c_attn.weight");
  EXPECT_EQ(names[10], "h.0.mlp.c_fc.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
}

TEST(GptModel, InferenceLogitsMatchTrainingForward) {
  // logits() on a prefix equals the training forward's rows for the same positions (causality: later tokens do not
  // change earlier logits).
  const GptConfig cfg = small_config(true, 0.0f);
  const Autocast ac(DType::kFloat32);
  GptModel model(cfg, ac, 5);
  auto mw = fp32_masters(model);
  model.set_mode(false, 0);
  const Tensor x = windows(cfg, 1);
  const std::vector<float> full = copy_of(model.forward(x));
  std::vector<int32_t> prefix;
  for (int t = 0; t < 4; ++t) prefix.push_back(static_cast<int32_t>(x.item(t)));
  const Tensor& l = model.logits(prefix, 1, 4);
  ASSERT_EQ(l.dim(0), 4);
  for (int64_t i = 0; i < 4 * 13; ++i) EXPECT_NEAR(l.item(i), full[static_cast<size_t>(i)], 1e-5f) << i;
}

TEST(GptModel, KvCacheDecodeMatchesFullWindows) {
  // prefill(3 tokens) then decode 3 more: each decoded row equals the last row of a full forward of the same prefix.
  // Tolerance 1e-5: both are FP32 of the same operands; only the order of the FP32 sums in q k^T and p v differs
  // (hs = 4 and <= 6 terms: a few ulps of logits of magnitude ~1).
  for (const bool tied : {true, false}) {
    GptConfig cfg = small_config(tied, 0.0f);
    cfg.set_padded_vocab_multiple(8);  // 13 -> 16 rows of wte
    const Autocast ac(DType::kFloat32);
    GptModel model(cfg, ac, 5);
    auto mw = fp32_masters(model);
    model.set_mode(false, 0);
    const std::vector<int32_t> seq = {3, 11, 0, 7, 12, 5};
    const Tensor& pre = model.prefill(std::span<const int32_t>(seq.data(), 3));
    ASSERT_EQ(pre.dim(1), 13) << "logits over the real vocabulary only";
    std::vector<std::vector<float>> decoded;
    for (size_t n = 3; n < seq.size(); ++n) decoded.push_back(copy_of(model.decode(seq[n])));
    EXPECT_EQ(model.cached(), 6);
    EXPECT_THROW(model.decode(1), Error) << "the window (seq_len 6) is full";
    for (size_t n = 3; n < seq.size(); ++n) {
      const Tensor& full = model.logits(std::span<const int32_t>(seq.data(), n + 1), 1, static_cast<int64_t>(n + 1));
      for (int64_t v = 0; v < 13; ++v)
        EXPECT_NEAR(decoded[n - 3][static_cast<size_t>(v)], full.item(static_cast<int64_t>(n) * 13 + v), 1e-5f)
            << "tied " << tied << " position " << n << " id " << v;
    }
  }
}

TEST(GptModel, PaddedVocabularyRowsAreNeverReadAndGetNoGradient) {
  GptConfig cfg = small_config(true, 0.0f);
  cfg.set_padded_vocab_multiple(8);
  const Autocast ac(DType::kFloat32);
  GptModel model(cfg, ac, 5);
  EXPECT_EQ(model.table_rows(), 16);
  auto mw = fp32_masters(model);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  Parameter* wte = params[0];
  ASSERT_EQ(wte->shape, (Shape{16, 8}));
  // Padded rows set to a huge value: if any op read them, the logits or the loss would show it.
  GptModel ref(small_config(true, 0.0f), ac, 5);
  auto mw_ref = fp32_masters(ref);
  std::vector<Parameter*> ref_params;
  ref.collect_parameters(ref_params);
  for (size_t i = 0; i < params.size(); ++i) {
    float* dst = params[i]->master.data_as<float>();
    const float* src = ref_params[i]->master.data_as<float>();
    for (int64_t k = 0; k < ref_params[i]->numel(); ++k) dst[k] = src[k];
  }
  for (int64_t k = 13 * 8; k < 16 * 8; ++k) wte->master.data_as<float>()[k] = 1e30f;
  model.set_mode(true, 1);
  ref.set_mode(true, 1);
  LanguageModelLoss crit(model), crit_ref(ref);
  const Tensor x = windows(cfg, 2);
  const double loss = crit.forward(model.forward(x), {});
  EXPECT_EQ(loss, crit_ref.forward(ref.forward(x), {})) << "padding changes nothing, bitwise";
  GradContext ctx = fresh_ctx();
  ctx.need_input_grad = false;
  model.backward(crit.backward(1.0f), ctx);
  for (int64_t k = 13 * 8; k < 16 * 8; ++k) EXPECT_EQ(wte->grad.item(k), 0.0f) << "padded row element " << k;
}

TEST(GptModel, Fp16LargeInitKeepsLossFinite) {
  // init_scale 40 gives attention logits far beyond 65504 in fp16; the FP32 scores and LayerNorm keep the forward
  // finite, and fp16 GEMM outputs are the only place an overflow could appear.
  GptConfig cfg = small_config(true, 0.0f);
  cfg.set_init_scale(40.0f);
  const Autocast ac(DType::kFloat16);
  GptModel model(cfg, ac, 5);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  auto masters = bind_parameters(params, DType::kFloat16, Device::kCPU, 9);
  model.set_mode(true, 1);
  LanguageModelLoss crit(model);
  const double loss = crit.forward(model.forward(windows(cfg, 2)), {});
  EXPECT_TRUE(std::isfinite(loss)) << loss;
}

TEST(GptModel, RejectsBadConfig) {
  GptConfig c = small_config(true, 0.0f);
  c.set_n_embd(9);  // not a multiple of n_head 2
  EXPECT_THROW(GptModel(c, Autocast(DType::kFloat32), 1), Error);
}

// ---- autocast table ----------------------------------------------------------------------------------------------

TEST(GptAutocast, NewOpKindsHaveTheirPolicy) {
  EXPECT_EQ(autocast_rule(OpKind::kEmbedding), OpPrecision::kFP32);
  EXPECT_EQ(autocast_rule(OpKind::kAttention), OpPrecision::kWorking);
  EXPECT_EQ(autocast_rule(OpKind::kLayerNorm), OpPrecision::kFP32);
  EXPECT_EQ(autocast_rule(OpKind::kSoftmax), OpPrecision::kFP32);
  EXPECT_EQ(autocast_rule(OpKind::kCrossEntropy), OpPrecision::kFP32);
  EXPECT_EQ(parse_op_kind("embedding"), OpKind::kEmbedding);
  EXPECT_EQ(parse_op_kind("attention"), OpKind::kAttention);
  const Autocast forced(DType::kFloat16, {}, {OpKind::kAttention});
  EXPECT_EQ(forced.compute_dtype(OpKind::kAttention, "h.0.attn", DType::kFloat16), DType::kFloat32);
}

// ---- config ------------------------------------------------------------------------------------------------------

TEST(GptConfigCheck, ShippedConfigValidatesAndBadFieldsAreNamed) {
  const RunConfig shipped = parse_config_file(std::string(AMPDIST_SOURCE_DIR) + "/configs/fortunes_gpt.pbtxt");
  EXPECT_NO_THROW(validate_config(shipped, "fortunes_gpt.pbtxt"));
  const RunConfig gpt2 = parse_config_file(std::string(AMPDIST_SOURCE_DIR) + "/configs/gpt2_124m.pbtxt");
  EXPECT_NO_THROW(validate_config(gpt2, "gpt2_124m.pbtxt"));
  EXPECT_EQ(gpt2.model().gpt().vocab_size(), 50257);
  EXPECT_EQ(gpt2.model().gpt().seq_len(), 1024);
  auto message = [](const std::string& text) {
    try {
      validate_config(parse_config_text(text, "x.pbtxt"), "x.pbtxt");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string text = "text { paths: \"/tmp\" }";
  EXPECT_NE(message("model { gpt { n_head: 3 n_embd: 64 } } data { " + text + " }").find("model.gpt.n_embd"),
            std::string::npos);
  EXPECT_NE(message("model { gpt { dropout: 1.0 } } data { " + text + " }").find("model.gpt.dropout"),
            std::string::npos);
  EXPECT_NE(message("model { gpt { } } data { synthetic { } }").find("a gpt model needs tokens"), std::string::npos);
  EXPECT_NE(message("model { mlp { } } data { " + text + " }").find("read by model { gpt"), std::string::npos);
}

// ---- sampling --------------------------------------------------------------------------------------------------

TEST(GptSampling, GreedyTopKAndInverseCdf) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f};
  EXPECT_EQ(sample_next_token(logits, 0.0f, 0, 0.7f), 1) << "argmax, ties to the lower id";
  EXPECT_EQ(sample_next_token(logits, 1.0f, 1, 0.999f), 1) << "top-1 is greedy";
  // top-2 keeps ids 1 and 3 with equal probability: u < 0.5 -> 1, else 3.
  EXPECT_EQ(sample_next_token(logits, 1.0f, 2, 0.49f), 1);
  EXPECT_EQ(sample_next_token(logits, 1.0f, 2, 0.51f), 3);
  // All four at temperature 1: p = e^{l} / Z in the order 1, 3, 2, 0; u just below 1 gives the last, id 0.
  EXPECT_EQ(sample_next_token(logits, 1.0f, 0, 0.9999f), 0);
}

}  // namespace
}  // namespace ampdist
