// The fused causal attention (kernels/transformer.h flash_attention_*) on the CPU against the materialised kernel,
// both against a double-precision reference within the error bound derived in tests/attention_reference.h, in FP32,
// fp16 and bf16; with key masks, a query row with no key at all, and sequence lengths that are not a multiple of the
// query or key block.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/transformer.h"
#include "tests/attention_reference.h"

namespace ampdist {
namespace {

using attention_reference::Case;
using attention_reference::expect_within;
using attention_reference::random_tensor;
using attention_reference::Reference;

void run_case(const Case& c, DType working) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
               " hs=" + std::to_string(c.hs) + (c.masked ? " masked " : " ") + dtype_name(working));
  const kernels::AttentionShape s{c.B, c.T, c.H, c.hs};
  const int64_t N = c.B * c.T, C = c.H * c.hs;
  const Tensor qkv = random_tensor(N, 3 * C, working, 1, -1.5f, 1.5f);
  const Tensor dout = random_tensor(N, C, working, 2, -1.0f, 1.0f);
  const std::vector<uint8_t> mask = attention_reference::key_mask(c);
  const DType pv = working;
  const Reference ref = attention_reference::reference(c, qkv, dout, mask, pv, working);

  Tensor out_m = Tensor::empty({N, C}, working), out_f = Tensor::empty({N, C}, working);
  Tensor probs = Tensor::empty({c.B, c.H, c.T, c.T}, DType::kFloat32);
  Tensor stats = Tensor::empty({c.B, c.H, c.T, 2}, DType::kFloat32);
  kernels::attention_forward(qkv, s, mask, pv, probs, out_m);
  kernels::flash_attention_forward(qkv, s, mask, pv, stats, out_f);
  expect_within("materialised out", out_m, ref.out, ref.out_bound);
  expect_within("fused out", out_f, ref.out, ref.out_bound);

  Tensor d_m = Tensor::empty({N, 3 * C}, working), d_f = Tensor::empty({N, 3 * C}, working);
  kernels::attention_backward(qkv, probs, s, pv, dout, d_m);
  kernels::flash_attention_backward(qkv, out_f, stats, s, mask, pv, dout, d_f);
  expect_within("materialised dqkv", d_m, ref.dqkv, ref.dqkv_bound);
  expect_within("fused dqkv", d_f, ref.dqkv, ref.dqkv_bound);

  if (c.masked)  // query 0 of window 0 has no key: output 0, statistics 0 and 0, never NaN
    for (int64_t h = 0; h < c.H; ++h) {
      EXPECT_EQ(stats.item(h * c.T * 2), 0.0f);
      EXPECT_EQ(stats.item(h * c.T * 2 + 1), 0.0f);
      for (int64_t f = 0; f < c.hs; ++f) EXPECT_EQ(out_f.item(h * c.hs + f), 0.0f);
    }
}

// T = 300: five query blocks, the last partial, and two key blocks (the online rescale across blocks); T = 65: a
// query block of one row; T = 1: one key.
const Case kCases[] = {{2, 300, 3, 32, true}, {1, 65, 2, 64, false}, {3, 1, 2, 16, false}};

TEST(FlashAttention, Fp32WithinTheDerivedBoundOfTheExactAttentionAsIsTheMaterialisedKernel) {
  for (const Case& c : kCases) run_case(c, DType::kFloat32);
}
TEST(FlashAttention, Fp16WithinTheDerivedBoundOfTheExactAttentionAsIsTheMaterialisedKernel) {
  for (const Case& c : kCases) run_case(c, DType::kFloat16);
}
TEST(FlashAttention, Bf16WithinTheDerivedBoundOfTheExactAttentionAsIsTheMaterialisedKernel) {
  for (const Case& c : kCases) run_case(c, DType::kBFloat16);
}
TEST(FlashAttention, Bf16OnTheWideningPathWithinTheSameBound) {
  namespace onednn = kernels::cpu::onednn;
  struct Restore {
    ~Restore() { onednn::set_native_bf16_enabled(true); }
  } restore;
  onednn::set_native_bf16_enabled(false);
  run_case(kCases[0], DType::kBFloat16);
}

// The backward recomputes the forward's probabilities: with a dout that is 0 except one row, dv of every key is that
// row's p times dout, and the materialised kernel's saved p gives the same to FP32 rounding (the score GEMMs differ
// only in blocking), so a backward that recomputed different scores (another block partition, a stale mask) fails.
TEST(FlashAttention, BackwardRecomputesTheForwardsProbabilities) {
  const kernels::AttentionShape s{1, 300, 1, 32};
  const Tensor qkv = random_tensor(300, 96, DType::kFloat32, 3, -2.0f, 2.0f);
  Tensor dout = Tensor::zeros({300, 32}, DType::kFloat32);
  const int64_t row = 299;
  dout.data_as<float>()[row * 32] = 1.0f;  // d out[299, 0]
  Tensor probs = Tensor::empty({1, 1, 300, 300}, DType::kFloat32), stats = Tensor::empty({1, 1, 300, 2}, DType::kFloat32);
  Tensor out = Tensor::empty({300, 32}, DType::kFloat32), out_m = Tensor::empty({300, 32}, DType::kFloat32);
  kernels::attention_forward(qkv, s, {}, DType::kFloat32, probs, out_m);
  kernels::flash_attention_forward(qkv, s, {}, DType::kFloat32, stats, out);
  Tensor dqkv = Tensor::empty({300, 96}, DType::kFloat32);
  kernels::flash_attention_backward(qkv, out, stats, s, {}, DType::kFloat32, dout, dqkv);
  for (int64_t j = 0; j < 300; ++j) {
    // dv[j, 0] = p[299, j]; FP32 scores of 32 terms and a softmax over 300: within 1e-6 of p (p <= 1).
    EXPECT_NEAR(dqkv.item(j * 96 + 64), probs.item(row * 300 + j), 1e-6) << j;
  }
}

}  // namespace
}  // namespace ampdist
