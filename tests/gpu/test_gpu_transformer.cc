// The transformer ops (kernels/transformer.h) and the whole GPT model on the GPU against the CPU backend. Each test
// skips, saying why, without a GPU.
//
// Tolerances: the CUDA kernels keep the CPU loops' summation order (one thread per output), so embedding, LayerNorm,
// dropout and the residual add are bitwise equal. Attention's softmax calls expf, which may differ by 2 ulp between
// CUDA and glibc (CUDA Programming Guide, "Mathematical Functions"): probabilities agree to 1e-6 relative and
// outputs to 1e-5 absolute for O(1) inputs. The whole model adds cuBLAS GEMMs (a different FP32 summation order,
// bounded as in test_gpu.cc): loss to 1e-5 relative, gradients to 1e-4 absolute + 1e-3 relative in FP32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/device.h"
#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"
#include "runtime/nn/gpt.h"
#include "tests/gpu/gpu_test_util.h"

namespace ampdist {
namespace {

Tensor random_tensor(const Shape& shape, uint32_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  const RngStream rng{99, {stream, 0, 0}, RngPurpose::kSynthetic};
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = lo + (hi - lo) * rng.uniform(i);
  return t;
}

Tensor as(const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
  Tensor out = Tensor::empty(t.shape(), d);
  kernels::cast(t, out);
  return out;
}

using testing::floats;

void expect_bitwise(const Tensor& got, const Tensor& want, const char* what) {
  const std::vector<float> a = floats(got), b = floats(want);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
}

void expect_near(const Tensor& got, const Tensor& want, double abs_tol, double rel_tol, const char* what) {
  const std::vector<float> a = floats(got), b = floats(want);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], abs_tol + rel_tol * std::fabs(b[i])) << what << "[" << i << "]";
}

TEST(GpuTransformer, EmbeddingLayerNormDropoutAndAddAreBitwiseEqual) {
  REQUIRE_GPU();
  const int64_t V = 50, Tmax = 16, T = 12, B = 3, C = 40, N = B * T;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 17 + 3) % V);
  tokens[5] = tokens[9];  // a repeated token: its gradient rows add up
  const Tensor wte = random_tensor({V, C}, 1), wpe = random_tensor({Tmax, C}, 2);
  Tensor out = Tensor::empty({N, C}, DType::kFloat32), out_d = Tensor::empty({N, C}, DType::kFloat32, Device::kCUDA);
  kernels::embedding_forward(tokens, T, wte, wpe, out);
  kernels::embedding_forward(tokens, T, wte.to(Device::kCUDA), wpe.to(Device::kCUDA), out_d);
  expect_bitwise(out_d, out, "embedding");
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor dout = as(random_tensor({N, C}, 3), dt);
    Tensor dwte = random_tensor({V, C}, 4), dwpe = random_tensor({Tmax, C}, 5);
    Tensor dwte_d = dwte.to(Device::kCUDA), dwpe_d = dwpe.to(Device::kCUDA);
    kernels::embedding_backward(tokens, T, dout, dwte, false, dwpe, true);
    kernels::embedding_backward(tokens, T, dout.to(Device::kCUDA), dwte_d, false, dwpe_d, true);
    expect_bitwise(dwte_d, dwte, "dwte");
    expect_bitwise(dwpe_d, dwpe, "dwpe");

    const Tensor x = as(random_tensor({N, C}, 6, -3.0f, 5.0f), dt);
    const Tensor gamma = random_tensor({C}, 7), beta = random_tensor({C}, 8);
    Tensor y = Tensor::empty({N, C}, dt), mean = Tensor::empty({N}, DType::kFloat32), rstd = mean.to(Device::kCPU);
    Tensor y_d = Tensor::empty({N, C}, dt, Device::kCUDA), mean_d = Tensor::empty({N}, DType::kFloat32, Device::kCUDA),
           rstd_d = Tensor::empty({N}, DType::kFloat32, Device::kCUDA);
    const Tensor x_d = x.to(Device::kCUDA), gamma_d = gamma.to(Device::kCUDA), beta_d = beta.to(Device::kCUDA);
    kernels::layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
    kernels::layernorm_forward(x_d, gamma_d, beta_d, 1e-5f, y_d, mean_d, rstd_d);
    expect_bitwise(y_d, y, "layernorm y");
    expect_bitwise(mean_d, mean, "layernorm mean");
    expect_bitwise(rstd_d, rstd, "layernorm rstd");
    const Tensor dy = as(random_tensor({N, C}, 9), dt);
    Tensor dx = random_tensor({N, C}, 10), dg = random_tensor({C}, 11), db = random_tensor({C}, 12);
    Tensor dx_d = dx.to(Device::kCUDA), dg_d = dg.to(Device::kCUDA), db_d = db.to(Device::kCUDA);
    kernels::layernorm_backward(x, gamma, mean, rstd, dy, dx, true, dg, db, true);
    kernels::layernorm_backward(x_d, gamma_d, mean_d, rstd_d, dy.to(Device::kCUDA), dx_d, true, dg_d, db_d, true);
    expect_bitwise(dx_d, dx, "layernorm dx");
    expect_bitwise(dg_d, dg, "layernorm dgamma");
    expect_bitwise(db_d, db, "layernorm dbeta");

    Tensor h = as(random_tensor({N, C}, 13), dt);
    Tensor h_d = h.to(Device::kCUDA);
    const std::vector<uint32_t> ids = {7, 123456, 42};
    const kernels::DropoutKey key{2024, 17, 3};
    kernels::dropout_inplace(h, 0.25f, key, ids, T);
    kernels::dropout_inplace(h_d, 0.25f, key, ids, T);
    expect_bitwise(h_d, h, "dropout");
    Tensor r = random_tensor({N, C}, 14);
    Tensor r_d = r.to(Device::kCUDA);
    kernels::add_inplace(r, h);
    kernels::add_inplace(r_d, h_d);
    expect_bitwise(r_d, r, "add_inplace");
  }
}

TEST(GpuTransformer, AttentionMatchesTheCpuIncludingFullyMaskedRows) {
  REQUIRE_GPU();
  const kernels::AttentionShape s{2, 9, 3, 8};
  const int64_t N = s.batch * s.seq_len, C = s.channels();
  std::vector<uint8_t> mask(N, 1);
  mask[0] = 0;  // window 0, key 0 masked: query 0 of window 0 has no allowed key (a fully masked row)
  mask[9 + 4] = 0;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor qkv = as(random_tensor({N, 3 * C}, 21, -2.0f, 2.0f), dt);
    const Tensor qkv_d = qkv.to(Device::kCUDA);
    Tensor probs = Tensor::empty({s.batch, s.n_head, s.seq_len, s.seq_len}, DType::kFloat32);
    Tensor probs_d = Tensor::empty(probs.shape(), DType::kFloat32, Device::kCUDA);
    Tensor out = Tensor::empty({N, C}, dt), out_d = Tensor::empty({N, C}, dt, Device::kCUDA);
    kernels::attention_forward(qkv, s, mask, dt, probs, out);
    kernels::attention_forward(qkv_d, s, mask, dt, probs_d, out_d);
    expect_near(probs_d, probs, 1e-7, 1e-6, "probs");
    // A p rounded to 16 bits may land on the other side of a rounding boundary: one ulp of the dtype times |v|.
    const double pv_ulp = dt == DType::kFloat32 ? 0.0 : dt == DType::kFloat16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    expect_near(out_d, out, 1e-5 + 2 * pv_ulp * 2.0, 1e-5, "out");
    const std::vector<float> o = floats(out_d);
    for (int64_t e = 0; e < C; ++e) EXPECT_EQ(o[e], 0.0f) << "fully masked row, column " << e;
    const Tensor dout = as(random_tensor({N, C}, 22), dt);
    Tensor dqkv = Tensor::empty({N, 3 * C}, dt), dqkv_d = Tensor::empty({N, 3 * C}, dt, Device::kCUDA);
    kernels::attention_backward(qkv, probs, s, dt, dout, dqkv);
    kernels::attention_backward(qkv_d, probs_d, s, dt, dout.to(Device::kCUDA), dqkv_d);
    expect_near(dqkv_d, dqkv, 1e-4 + 8 * pv_ulp, 1e-4, "dqkv");
    for (float v : floats(dqkv_d)) ASSERT_TRUE(std::isfinite(v));
  }
}

// ---- the whole model: loss and every parameter's gradient, CPU against GPU ---------------------------------------

GptConfig small_config() {
  GptConfig c;
  c.set_n_layer(2);
  c.set_n_head(2);
  c.set_n_embd(16);
  c.set_seq_len(8);
  c.set_vocab_size(32);
  c.set_dropout(0.1f);
  c.set_tie_embeddings(true);
  return c;
}

Tensor windows(const GptConfig& c, int64_t B) {
  const int64_t T = c.seq_len();
  Tensor x = Tensor::empty({B, T + 1 + kGptIndexColumns}, DType::kFloat32);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t <= T; ++t)
      x.data_as<float>()[b * x.dim(1) + t] = static_cast<float>((b * 11 + t * t * 5 + 3) % c.vocab_size());
    x.data_as<float>()[b * x.dim(1) + T + 1] = static_cast<float>(b + 3);
    x.data_as<float>()[b * x.dim(1) + T + 2] = 0.0f;
  }
  return x;
}

struct ModelRun {
  double loss = 0.0;
  std::vector<float> grads;
};

ModelRun run_model(Device device) {
  const GptConfig cfg = small_config();
  GptModel model(cfg, Autocast(DType::kFloat32), 5);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  auto masters = bind_parameters(params, DType::kFloat32, device, 11);
  MasterWeights& mw = *masters;
  model.set_mode(true, 3);
  LanguageModelLoss crit(model);
  const Tensor x = windows(cfg, 4);  // token ids stay on the host on either device
  ModelRun r;
  r.loss = crit.forward(model.forward(x), {});
  GradContext ctx;
  ctx.need_input_grad = false;
  model.backward(crit.backward(1.0f), ctx);
  r.grads = floats(mw.grads());
  return r;
}

TEST(GpuTransformer, GptLossAndGradientsMatchTheCpu) {
  REQUIRE_GPU();
  const ModelRun cpu = run_model(Device::kCPU);
  const ModelRun gpu = run_model(Device::kCUDA);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::fabs(cpu.loss));
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    ASSERT_NEAR(gpu.grads[i], cpu.grads[i], 1e-4 + 1e-3 * std::fabs(cpu.grads[i])) << "gradient element " << i;
}

}  // namespace
}  // namespace ampdist
