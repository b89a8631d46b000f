// The memory estimate (runtime/train/memory_estimate.h): the state's bytes for each optimizer and ZeRO stage, the
// evaluation batch's default, and the GPT's activation estimate against the host bytes its buffers actually take in
// a training step (host_tensor_peak_bytes, which counts every tensor allocation).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/kernels/kernels.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/mlp.h"
#include "runtime/train/config.h"
#include "runtime/train/memory_estimate.h"

namespace ampdist {
namespace {

RunConfig config(const char* text) { return parse_config_text(text, "test"); }

TEST(MemoryEstimate, StateFollowsTheOptimizerTheDtypeAndZero) {
  const Autocast ac(DType::kFloat32);
  auto mlp = build_mlp(MlpConfig(), 10, 3, ac);  // no hidden layer: 10 x 3 + 3 = 33 parameters
  const int64_t P = 1000;                        // the parameter count is the caller's
  RunConfig sgd = config("model { mlp { } } data { synthetic { } global_batch_size: 64 } optimizer { sgd { momentum: 0.9 } }");
  MemoryEstimate e = estimate_memory(sgd, *mlp, P, {10}, DType::kFloat32, 1);
  EXPECT_EQ(e.master_bytes, 4 * P);
  EXPECT_EQ(e.grad_bytes, 4 * P);
  EXPECT_EQ(e.working_bytes, 0);
  EXPECT_EQ(e.optimizer_bytes, 4 * P);  // the momentum buffer
  RunConfig plain = config("model { mlp { } } data { synthetic { } global_batch_size: 64 } optimizer { sgd { } }");
  EXPECT_EQ(estimate_memory(plain, *mlp, P, {10}, DType::kFloat32, 1).optimizer_bytes, 0);
  RunConfig adam = config(
      "model { mlp { } } data { synthetic { } global_batch_size: 64 } optimizer { adamw { } zero_stage: 1 }");
  e = estimate_memory(adam, *mlp, P, {10}, DType::kBFloat16, 4);
  EXPECT_EQ(e.master_bytes, 4 * 250);     // ZeRO-1: the rank's slice of the masters ...
  EXPECT_EQ(e.optimizer_bytes, 8 * 250);  // ... and of the two moments
  EXPECT_EQ(e.grad_bytes, 4 * P);         // the gradient buffer is whole
  EXPECT_EQ(e.working_bytes, 2 * P);      // the bf16 working copy
  EXPECT_EQ(e.micro_batch, 16);
  // The MLP's activations: its Linear's output [16, 3] and input gradient [16, 10] in the working dtype.
  EXPECT_EQ(e.train_activation_bytes, (16 * 3 + 16 * 10) * 2);
  EXPECT_EQ(e.total_bytes(), e.state_bytes() + e.train_activation_bytes + e.eval_extra_bytes);
}

TEST(MemoryEstimate, EvaluationBatchDefaultsToTheTrainingMicroBatch) {
  RunConfig c = config(
      "model { mlp { } } data { synthetic { } global_batch_size: 96 } optimizer { sgd { } accumulation_steps: 2 }");
  EXPECT_EQ(eval_batch_size(c, 1), 48);
  EXPECT_EQ(eval_batch_size(c, 3), 16);
  c.mutable_data()->set_eval_batch_size(500);
  EXPECT_EQ(eval_batch_size(c, 3), 500);
  // A larger evaluation batch adds only its forward beyond the training forward.
  const Autocast ac(DType::kFloat32);
  auto mlp = build_mlp(MlpConfig(), 10, 3, ac);
  const MemoryEstimate e = estimate_memory(c, *mlp, 33, {10}, DType::kFloat32, 3);
  EXPECT_EQ(e.eval_extra_bytes, (500 - 16) * 3 * 4);
}

// Training steps of a small GPT, each followed by two evaluation forwards of the same batch: the host bytes its
// tensors take beyond the parameters' (the peak over three steps)
// against GptModel::activation_bytes, which counts every buffer of the model and its loss; allocations are rounded
// up to 64 bytes (at most 64 bytes for each of about 60 buffers here, against megabytes): 0.2%.
// head_chunk_rows 0: automatic (one chunk here); under BLOCK a chunk of 96 of the 256 rows (three chunks, the last
// of 64) must leave one chunk's logits, never all of them.
void check_gpt_step(DType working, AttentionKernel kernel, GptRecompute recompute, int head_chunk_rows) {
  SCOPED_TRACE(std::string(dtype_name(working)) + (kernel == FLASH ? " FLASH" : " MATERIALIZED") +
               " recompute " + GptRecompute_Name(recompute) + " head_chunk_rows " + std::to_string(head_chunk_rows));
  GptConfig g;
  g.set_n_layer(2);
  g.set_n_head(4);
  g.set_n_embd(64);
  g.set_seq_len(64);
  g.set_vocab_size(256);
  g.set_attention(kernel);
  g.set_recompute(recompute);
  g.set_head_chunk_rows(head_chunk_rows);
  const Autocast ac(working);
  GptModel model(g, ac, 1);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  auto masters = bind_parameters(params, working, Device::kCPU, 3);
  LanguageModelLoss loss(model);
  const int64_t B = 4, T = g.seq_len();
  Tensor x = Tensor::zeros({B, T + 1 + kGptIndexColumns}, DType::kFloat32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t <= T; ++t) x.data_as<float>()[b * x.dim(1) + t] = static_cast<float>((b * 7 + t * 3) % 256);
  const int64_t before = host_tensor_bytes();
  reset_host_tensor_peak_bytes();
  GradContext ctx;
  ctx.need_input_grad = false;
  for (int step = 1; step <= 3; ++step) {  // buffers that move between blocks must not pile up over steps ...
    model.set_mode(true, step);
    loss.forward(model.forward(x), {});
    model.backward(loss.backward(1.0f), ctx);
    model.set_mode(false, step);  // ... nor over evaluation forwards, which have no backward to move them back
    model.forward(x);
    model.forward(x);
  }
  const int64_t used = host_tensor_peak_bytes() - before;
  int64_t estimate = model.activation_bytes({B, T + 1 + kGptIndexColumns}, working, true);
  if (kernel == MATERIALIZED)  // its per-thread scratch is not tensors: take it out of the estimate
    estimate -= static_cast<int64_t>(kernels::num_threads()) * g.n_head() * T * T * 4 * 3;
  EXPECT_NEAR(static_cast<double>(used), static_cast<double>(estimate), 0.002 * static_cast<double>(estimate))
      << "bytes the step's tensors took: " << used << ", estimated: " << estimate;
}

TEST(MemoryEstimate, GptActivationsAreTheBytesAStepsBuffersTake) {
  for (DType w : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (AttentionKernel k : {FLASH, MATERIALIZED})
      for (GptRecompute r : {NONE, POINTWISE, BLOCK})
        for (int rows : {0, 96}) check_gpt_step(w, k, r, rows);
}

}  // namespace
}  // namespace ampdist
