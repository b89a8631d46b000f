// Scenarios that real runs hit, owned by the step, the reducer and the consensus: each test states its scenario and
// asserts the value the scenario expects. Each runs on every world size CTest launches (1, 2, 4 ranks); a scenario
// about a particular rank uses the highest rank that exists where it names one.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace ampdist {
namespace {

using testing::batch;
using testing::bytes;
using testing::config;
using testing::float_bits;
using testing::linear_trainer;
using testing::same_on_all_ranks;

// A small MLP on synthetic data: cheap enough for thousands of steps on 4 oversubscribed ranks.
std::string small_job(const std::string& extra) {
  return R"(
    name: "small"
    model { mlp { hidden: [16] } }
    data { synthetic { train_samples: 1024 test_samples: 128 features: 8 classes: 4 } global_batch_size: 32 }
  )" + extra;
}

// ---- one loss scale everywhere: 2000 clean steps grow it on every rank together -------------------------------------

TEST(OneLossScale, TwoThousandCleanStepsGrowTheScaleOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  auto t = make_trainer(config(small_job(R"(
      optimizer { sgd { momentum: 0.9 } lr: 0.01 }
      precision { dtype: FP16 }
      train { steps: 2000 seed: 7 })")), comm);
  bool weights_equal = true, clean = true;
  for (int step = 1; step <= 2000; ++step) {
    const StepResult r = t->step();
    clean &= !r.skipped;
    weights_equal &= same_on_all_ranks(comm, t->masters().hash());
    if (step == 1999) {
      EXPECT_EQ(t->scaler().scale(), 65536.0f);
    }
  }
  EXPECT_TRUE(clean);
  EXPECT_TRUE(weights_equal) << "master weights differed across ranks after some step";
  EXPECT_EQ(t->scaler().scale(), 131072.0f);
  EXPECT_EQ(t->scaler().state().growth_tracker, 0);
  EXPECT_TRUE(same_on_all_ranks(comm, float_bits(t->scaler().scale())));
  EXPECT_TRUE(same_on_all_ranks(comm, static_cast<uint64_t>(t->scaler().state().growth_tracker)));
}

// The variant: a dataset whose batches do not split evenly. Every rank takes every step, including the short tail
// step, whose loss is divided by its own global sample count; no rank waits for a step another rank skipped.
TEST(OneLossScale, UnevenEpochTailIsTakenByAllRanksOrByNone) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  for (const bool drop_last : {true, false}) {
    const std::string extra = std::string(R"(
        optimizer { sgd {} lr: 0.05 }
        precision { dtype: FP16 }
        train { steps: 8 }
        data { synthetic { train_samples: 100 features: 8 classes: 4 } global_batch_size: 32 drop_last: )") +
                              (drop_last ? "true" : "false") + " }";
    auto t = make_trainer(config(R"(name: "tail" model { mlp { hidden: [16] } })" + extra), comm);
    EXPECT_EQ(t->steps_per_epoch(), drop_last ? 3 : 4);
    for (int step = 1; step <= 8; ++step) {
      const StepResult r = t->step();
      const int64_t in_epoch = (step - 1) % t->steps_per_epoch();
      EXPECT_EQ(r.global_samples, !drop_last && in_epoch == 3 ? 4 : 32) << "step " << step;
      EXPECT_FALSE(r.skipped);
      EXPECT_TRUE(same_on_all_ranks(comm, t->masters().hash())) << "step " << step;
    }
  }
}

// ---- skip together: an overflow on one rank skips the step and halves the scale on every rank -----------------------

struct Snapshot {
  std::vector<uint8_t> master, m, v;
  int64_t step_count;
};

Snapshot snapshot(Trainer& t) {
  auto& adam = dynamic_cast<AdamW&>(t.optimizer());
  return {bytes(t.masters().master()), bytes(adam.exp_avg()), bytes(adam.exp_avg_sq()), t.optimizer_steps()};
}

void skip_together(ReduceMode mode, int victim, NonFiniteValue value) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const std::string base = small_job(std::string(R"(
      optimizer { adamw {} lr: 0.001 weight_decay: 0.1 }
      precision { dtype: FP16 }
      comm { bucket_cap_mb: 0.0003 mode: )") + (mode == REDUCE_SCATTER ? "REDUCE_SCATTER" : "ALLREDUCE") + " }");
  // The poisoned element: in reduce-scatter mode (sharded state) the first of the victim's own slice, so that only
  // the victim ever checks it; in all-reduce mode an element of the first bucket of the victim's local gradient.
  int64_t element = 0;
  {
    auto probe = make_trainer(config(base), comm);
    const BucketLayout& b0 = probe->reducer().buckets().at(0);
    element = mode == ALLREDUCE ? b0.begin + 1 : probe->masters().slice_begin();
    std::vector<uint64_t> begins = comm.allgather_u64(static_cast<uint64_t>(element), "slice begins");
    element = static_cast<int64_t>(begins[victim]);
  }
  RunConfig cfg = config(base);
  NonFiniteInjection* f = testing::inject_nonfinite(cfg, 3, victim, value);
  f->set_element(element);
  auto t = make_trainer(cfg, comm);
  EXPECT_GT(t->reducer().buckets().size(), 1u) << "the test wants several buckets";

  t->step();
  t->step();
  const Snapshot after2 = snapshot(*t);
  // The fp16 weights the next forward reads: the cast of the step-2 master weights, current right after the step
  // (sharded state all-gathers it after each applied step; replicated state writes it in the optimizer's pass).
  Tensor working2 = Tensor::empty({t->masters().numel()}, DType::kFloat16);
  if (t->sharded()) {
    t->masters().working().copy_to(working2);
  } else {
    kernels::cast(static_cast<const MasterWeights&>(t->masters()).master(), working2);
    EXPECT_EQ(bytes(t->masters().working()), bytes(working2)) << "the working copy after step 2 is not its cast";
  }
  EXPECT_EQ(t->scaler().scale(), 65536.0f);

  const StepResult r3 = t->step();
  EXPECT_TRUE(r3.skipped);
  EXPECT_EQ(r3.lr, 0.0f);
  EXPECT_EQ(t->scaler().scale(), 32768.0f);
  EXPECT_EQ(t->scaler().state().skipped_steps, 1);
  const Snapshot after3 = snapshot(*t);
  EXPECT_EQ(after3.master, after2.master) << "master weights changed on a skipped step";
  EXPECT_EQ(after3.m, after2.m) << "exp_avg changed on a skipped step";
  EXPECT_EQ(after3.v, after2.v) << "exp_avg_sq changed on a skipped step";
  EXPECT_EQ(after3.step_count, 2);
  EXPECT_EQ(bytes(t->masters().working()), bytes(working2)) << "fp16 weights differ from the step-2 cast";

  const StepResult r4 = t->step();
  EXPECT_FALSE(r4.skipped);
  EXPECT_EQ(r4.scale, 32768.0f);
  EXPECT_NE(bytes(t->masters().master()), after2.master);
  EXPECT_EQ(t->optimizer_steps(), 3);
  // Replicated state: the master weights; sharded: each rank's slice differs, the all-gathered working copy not.
  EXPECT_TRUE(same_on_all_ranks(comm, t->sharded() ? t->masters().working_hash() : t->masters().hash()));
  EXPECT_TRUE(same_on_all_ranks(comm, float_bits(t->scaler().scale())));
  EXPECT_TRUE(same_on_all_ranks(comm, static_cast<uint64_t>(t->scaler().state().skipped_steps)));
}

class SkipTogether : public ::testing::TestWithParam<std::tuple<ReduceMode, bool, NonFiniteValue>> {};

TEST_P(SkipTogether, EveryRankSkipsAndBacksOff) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto [mode, last_rank, value] = GetParam();
  skip_together(mode, last_rank ? world - 1 : 0, value);
}

INSTANTIATE_TEST_SUITE_P(Scenarios, SkipTogether,
                         ::testing::Combine(::testing::Values(ALLREDUCE, REDUCE_SCATTER), ::testing::Bool(),
                                            ::testing::Values(POS_INF, QNAN)));

// ---- bad data on one rank: a NaN input on one rank skips the step everywhere, nothing non-finite is kept ------------

TEST(BadDataOnOneRank, NanInputOnOneRankSkipsEverywhere) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  RunConfig cfg = config(small_job(R"(
      optimizer { adamw {} lr: 0.001 }
      precision { dtype: FP16 })"));
  testing::inject_nonfinite(cfg, 5, std::min(2, comm.world_size() - 1), QNAN, INPUT);
  auto t = make_trainer(cfg, comm);
  for (int step = 1; step <= 4; ++step) EXPECT_FALSE(t->step().skipped);
  const std::vector<uint8_t> before = bytes(t->masters().master());
  const StepResult r = t->step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(t->scaler().scale(), 32768.0f);
  EXPECT_EQ(t->scaler().state().skipped_steps, 1);
  EXPECT_EQ(bytes(t->masters().master()), before);
  auto& adam = dynamic_cast<AdamW&>(t->optimizer());
  EXPECT_TRUE(testing::all_finite(t->masters().master()));
  EXPECT_TRUE(testing::all_finite(adam.exp_avg()));
  EXPECT_TRUE(testing::all_finite(adam.exp_avg_sq()));
  EXPECT_FALSE(t->step().skipped);
  EXPECT_TRUE(same_on_all_ranks(comm, static_cast<uint64_t>(t->scaler().state().skipped_steps)));
  EXPECT_TRUE(same_on_all_ranks(comm, t->masters().hash()));
}

// ---- clip after one unscale: the global norm is taken of the unscaled gradient, once per step -----------------------

// Every rank holds 4 samples x = [3, 4] of loss w . x, so the mean gradient over the global batch is [3, 4].
std::vector<MicroBatch> c4_batch() { return {batch({{3, 4}, {3, 4}, {3, 4}, {3, 4}}, 2)}; }

TEST(ClipAfterOneUnscale, NormIsFiveAndClippedStepIsPointSixPointEight) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  for (const std::string mode : {"ALLREDUCE", "REDUCE_SCATTER"}) {
  SCOPED_TRACE(mode);
  auto t = linear_trainer(config(R"(
      optimizer { sgd {} lr: 1.0 clip_grad_norm: 1.0 }
      comm { mode: )" + mode + R"( }
      precision { dtype: FP16 static_scale { scale: 1024 } })"), comm, 2, 1);
  // The whole master buffer: with sharded state (REDUCE_SCATTER is ZeRO stage 1) each rank holds only its slice.
  const std::vector<float> w0 = t->gather_master();
  const StepResult r = t->step(c4_batch(), 4 * comm.world_size());
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.scale, 1024.0f);
  // Every product and sum here is exact in fp16/FP32 (small integers times powers of two), so the norm is exact.
  EXPECT_EQ(r.grad_norm, 5.0);
  const std::vector<float> w1 = t->gather_master();
  // lr * clip factor = 1 / (5 + 1e-6): the update is 0.6 and 0.8 to within 2e-7 plus FP32 rounding of w.
  EXPECT_NEAR(w1[0] - w0[0], -0.6f, 1e-6);
  EXPECT_NEAR(w1[1] - w0[1], -0.8f, 1e-6);
  }
}

TEST(ClipAfterOneUnscale, NormUnchangedWhenTheScaleGrowsAndUnscaledOncePerStep) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  auto t = linear_trainer(config(R"(
      optimizer { sgd {} lr: 0.001 clip_grad_norm: 1.0 }
      precision { dtype: FP16 dynamic { growth_interval: 2 } })"), comm, 2, 1);
  const int64_t allreduce0 = comm.stats().allreduce + comm.stats().reduce_scatter;
  const float scales[] = {65536.0f, 65536.0f, 131072.0f};
  for (int step = 0; step < 3; ++step) {
    const StepResult r = t->step(c4_batch(), 4 * comm.world_size());
    EXPECT_EQ(r.scale, scales[step]);
    EXPECT_FALSE(r.skipped);
    EXPECT_EQ(r.grad_norm, 5.0) << "step " << step + 1;
  }
  EXPECT_EQ(t->scaler().scale(), 131072.0f);
  // One reduction per bucket, one consensus and one scaler update per optimizer step, nothing more.
  EXPECT_EQ(t->reducer().launches(), 3 * static_cast<int64_t>(t->reducer().buckets().size()));
  EXPECT_EQ(t->consensus().calls(), 3);
  EXPECT_EQ(t->scaler().updates(), 3);
  EXPECT_EQ(comm.stats().allreduce + comm.stats().reduce_scatter - allreduce0,
            3 * (static_cast<int64_t>(t->reducer().buckets().size()) + 1));
}

// ---- a skipped step advances nothing: not the LR schedule, not the step count; bf16 never scales --------------------

TEST(SkippedStepAdvancesNothing, WarmupCountsAppliedUpdatesOnly) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  RunConfig cfg = config(R"(
      optimizer { sgd {} lr: 1.0 schedule { kind: CONSTANT warmup_steps: 100 } }
      precision { dtype: FP16 })");
  for (int step : {2, 3}) {
    testing::inject_nonfinite(cfg, step, 0);
  }
  auto t = linear_trainer(cfg, comm, 2, 1);
  const float expected_lr[] = {0.01f, 0.0f, 0.0f, 0.02f, 0.03f};
  const bool expected_skip[] = {false, true, true, false, false};
  uint64_t flags = 0;
  for (int i = 0; i < 5; ++i) {
    // 4 samples per rank keep d(S * loss)/d(output) = S / (4 W) inside the fp16 range.
    const std::vector<MicroBatch> mb = {batch({{0.5f, 0.25f}, {0.5f, 0.25f}, {0.5f, 0.25f}, {0.5f, 0.25f}}, 2)};
    const StepResult r = t->step(mb, 4 * comm.world_size());
    EXPECT_EQ(r.skipped, expected_skip[i]) << "iteration " << i + 1;
    EXPECT_FLOAT_EQ(r.lr, expected_lr[i]) << "iteration " << i + 1;
    flags |= static_cast<uint64_t>(r.skipped) << i;
  }
  EXPECT_EQ(t->optimizer_steps(), 3);
  EXPECT_EQ(t->scaler().state().skipped_steps, 2);
  EXPECT_TRUE(same_on_all_ranks(comm, flags));
}

TEST(SkippedStepAdvancesNothing, Bf16NeverScalesButStillSkips) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  RunConfig cfg = config(small_job(R"(
      optimizer { sgd {} lr: 0.01 }
      precision { dtype: BF16 })"));
  testing::inject_nonfinite(cfg, 2501, comm.world_size() - 1, NEG_INF);
  auto t = make_trainer(cfg, comm);
  EXPECT_EQ(t->scaler().mode(), LossScaler::Mode::kNone);
  for (int step = 1; step <= 2500; ++step) t->step();
  EXPECT_EQ(t->scaler().scale(), 1.0f);
  EXPECT_EQ(t->scaler().state().skipped_steps, 0);
  const std::vector<uint8_t> before = bytes(t->masters().master());
  const StepResult r = t->step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(t->scaler().scale(), 1.0f);
  EXPECT_EQ(t->scaler().state().skipped_steps, 1);
  EXPECT_EQ(bytes(t->masters().master()), before);
  EXPECT_TRUE(same_on_all_ranks(comm, static_cast<uint64_t>(t->scaler().state().skipped_steps)));
}

// ---- a skipped step leaves AdamW alone: moments and bias correction count applied steps only ------------------------

TEST(SkippedStepLeavesAdamW, OverflowFirstThenTwoCleanAdamWSteps) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  RunConfig cfg = config(R"(
      optimizer { adamw { beta1: 0.9 beta2: 0.999 eps: 1e-8 } lr: 0.001 weight_decay: 0.1 }
      precision { dtype: FP32 })");
  testing::inject_nonfinite(cfg, 1, 0);
  auto t = linear_trainer(cfg, comm, 1, 1);
  float* p = t->masters().master().data_as<float>();
  p[0] = 1.0f;
  auto& adam = dynamic_cast<AdamW&>(t->optimizer());
  // One sample x = 0.1 per rank: the mean gradient of w * x is 0.1 exactly (the per-rank shares are 0.1 / W,
  // exact for W a power of two, and their sum is exact).
  const std::vector<MicroBatch> mb = {batch({{0.1f}}, 1)};
  EXPECT_TRUE(t->step(mb, comm.world_size()).skipped);
  EXPECT_EQ(float_bits(p[0]), float_bits(1.0f));
  EXPECT_EQ(adam.exp_avg().item(0), 0.0f);
  EXPECT_EQ(adam.exp_avg_sq().item(0), 0.0f);
  EXPECT_EQ(t->optimizer_steps(), 0);
  EXPECT_FALSE(t->step(mb, comm.world_size()).skipped);
  EXPECT_EQ(t->masters().grads().item(0), 0.1f);
  EXPECT_FALSE(t->step(mb, comm.world_size()).skipped);
  EXPECT_EQ(t->optimizer_steps(), 2);
  // FP32 arithmetic: m and v carry a few ulps of rounding from 0.1f.
  EXPECT_NEAR(adam.exp_avg().item(0), 0.019f, 1e-8);
  EXPECT_NEAR(adam.exp_avg_sq().item(0), 1.999e-5f, 1e-11);
  // Reference AdamW (torch.optim.AdamW's formula) in double for exactly two steps.
  double ref = 1.0, m = 0.0, v = 0.0;
  for (int step = 1; step <= 2; ++step) {
    const double g = 0.1f;
    ref *= 1.0 - 1e-3 * 0.1;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double mhat = m / (1.0 - std::pow(0.9, step)), vhat = v / (1.0 - std::pow(0.999, step));
    ref -= 1e-3 * mhat / (std::sqrt(vhat) + 1e-8);
  }
  // FP32 update of a value near 1: a few ulps (2^-23 each) of difference from the double reference.
  EXPECT_NEAR(p[0], ref, 4e-7);
}

// ---- loss reductions in FP32: a large-vocabulary fp16 loss neither overflows nor skips ------------------------------

TEST(Fp32LossReduction, LargeVocabularyLossUnderFp16NeitherOverflowsNorSkips) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const int64_t vocab = 14749, targets = 20500, features = 4;
  const RunConfig cfg = config(R"(optimizer { sgd {} lr: 0.1 } precision { dtype: FP16 })");
  const Autocast ac = make_autocast(cfg, comm.device());
  auto model = std::make_unique<Linear>("head", features, vocab, true, ac);
  Trainer t(cfg, comm, ac, std::move(model), std::make_unique<SoftmaxCrossEntropy>(), nullptr, nullptr);
  // All weights 0: every logit is exactly 0 and the loss of every sample is ln(vocab).
  std::memset(t.masters().master().data(), 0, t.masters().master().nbytes());
  const std::vector<int64_t> counts = shard_counts(targets, comm.world_size());
  int64_t begin = 0;
  for (int r = 0; r < comm.rank(); ++r) begin += counts[r];
  MicroBatch mb;
  mb.x = Tensor::empty({counts[comm.rank()], features}, DType::kFloat32);
  for (int64_t i = 0; i < mb.x.numel(); ++i) mb.x.data_as<float>()[i] = 0.25f * static_cast<float>(i % 7);
  for (int64_t i = 0; i < counts[comm.rank()]; ++i) mb.y.push_back(static_cast<int32_t>((begin + i) % vocab));
  const StepResult r = t.step(std::span<const MicroBatch>(&mb, 1), targets);
  EXPECT_FALSE(r.skipped);
  double loss[1] = {r.loss};
  comm.allreduce_f64(loss, ReduceOp::kSum, "test loss");
  EXPECT_NEAR(loss[0], std::log(14749.0), 1e-3);
  EXPECT_GT(loss[0] * targets, 65504.0) << "the summed loss is beyond the fp16 range";
}

// ---- accumulation normalisation: the gradient is the mean over the global batch in every layout ---------------------

TEST(MeanOverGlobalBatch, GradientIsTheMeanOverTheGlobalBatchInEveryLayout) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const int world = comm.world_size(), rank = comm.rank();
  const MicroBatch a = batch({{4.0f}}, 1), b = batch({{0.0f}, {0.0f}, {0.0f}}, 1), empty = batch({}, 1);
  // World of one: A and B as two accumulated micro-batches. Otherwise: A on rank 0, B on rank 1, and nothing on
  // any further rank (an empty micro-batch still joins every collective).
  std::vector<MicroBatch> mine;
  if (world == 1) {
    mine = {a, b};
  } else {
    mine = {rank == 0 ? a : rank == 1 ? b : empty};
  }
  auto t = linear_trainer(config(R"(optimizer { sgd {} lr: 1.0 } precision { dtype: FP32 })"), comm, 1, 1);
  const float w0 = t->masters().master().item(0);
  const int64_t collectives0 = comm.stats().allreduce;
  const StepResult r = t->step(mine, 4);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(t->masters().grads().item(0), 1.0f) << "mean of 4, 0, 0, 0";
  EXPECT_EQ(t->masters().master().item(0), w0 - 1.0f);
  EXPECT_EQ(t->reducer().launches(), 1);
  EXPECT_EQ(t->consensus().calls(), 1);
  EXPECT_EQ(t->scaler().updates(), 1);
  EXPECT_EQ(comm.stats().allreduce - collectives0, 2) << "one bucket all-reduce and one consensus all-reduce";
}

}  // namespace
}  // namespace ampdist
