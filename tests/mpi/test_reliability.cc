// Non-finite policies when one rank's data is bad (a NaN input on one rank): SKIP skips on every rank; DROP_RANK
// leaves out the poisoned rank's gradient and applies the mean over the other ranks' samples, identically everywhere.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace ampdist {
namespace {

using testing::batch;
using testing::config;
using testing::linear_trainer;
using testing::same_on_all_ranks;

// Rank r holds r + 1 samples of x = r + 1 (loss w * x); the poisoned rank's first sample is NaN.
std::vector<MicroBatch> poisoned_batch(int rank, int poisoned) {
  std::vector<std::vector<float>> rows(static_cast<size_t>(rank + 1), std::vector<float>{static_cast<float>(rank + 1)});
  if (rank == poisoned) rows[0][0] = std::numeric_limits<float>::quiet_NaN();
  return {batch(rows, 1)};
}

TEST(NonFinitePolicies, DropRankAppliesTheMeanOfTheFiniteRanks) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const int world = comm.world_size(), poisoned = std::min(2, world - 1);
  const int64_t global = static_cast<int64_t>(world) * (world + 1) / 2;
  auto t = linear_trainer(config(R"(optimizer { sgd {} lr: 1.0 } precision { dtype: FP32 on_nonfinite: DROP_RANK })"),
                          comm, 1, 1);
  const float w0 = t->masters().master().item(0);
  const StepResult r = t->step(poisoned_batch(comm.rank(), poisoned), global);
  if (world == 1) {
    EXPECT_TRUE(r.skipped) << "no finite rank is left: the step is skipped";
    return;
  }
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.dropped_ranks, 1);
  EXPECT_EQ(r.dropped_samples, poisoned + 1);
  // The mean of x over the kept samples: sum_r (r+1)^2 / sum_r (r+1), over r != poisoned.
  double num = 0.0, den = 0.0;
  for (int q = 0; q < world; ++q)
    if (q != poisoned) num += (q + 1.0) * (q + 1.0), den += q + 1.0;
  // FP32 sums of a few small terms, each divided by the global count and rescaled: a few ulps.
  EXPECT_NEAR(t->masters().grads().item(0), num / den, 1e-5 * num / den);
  EXPECT_NEAR(t->masters().master().item(0), w0 - num / den, 1e-5 * (1.0 + num / den));
  EXPECT_TRUE(std::isfinite(t->masters().master().item(0)));
  EXPECT_TRUE(same_on_all_ranks(comm, t->masters().hash()));
  EXPECT_EQ(t->scaler().state().skipped_steps, 0);
}

TEST(NonFinitePolicies, SkipSkipsEverywhere) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const int world = comm.world_size(), poisoned = std::min(2, world - 1);
  auto t = linear_trainer(config(R"(optimizer { sgd {} lr: 1.0 } precision { dtype: FP32 on_nonfinite: SKIP })"),
                          comm, 1, 1);
  const float w0 = t->masters().master().item(0);
  const StepResult r = t->step(poisoned_batch(comm.rank(), poisoned), static_cast<int64_t>(world) * (world + 1) / 2);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.dropped_ranks, 0);
  EXPECT_EQ(t->masters().master().item(0), w0);
  EXPECT_EQ(t->scaler().state().skipped_steps, 1);
}

TEST(NonFinitePolicies, DropRankWithCleanDataMatchesSkipPolicyBitwise) {
  // Without a poisoned rank the two policies compute the same update (the drop check only reads the gradient).
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  auto run = [&](const char* policy) {
    auto t = make_trainer(config(std::string(R"(
        name: "p" model { mlp { hidden: [16] } }
        data { synthetic { train_samples: 512 features: 8 classes: 4 } global_batch_size: 32 }
        optimizer { adamw {} lr: 0.001 }
        precision { dtype: FP16 on_nonfinite: )") + policy + " }"), comm);
    for (int i = 0; i < 5; ++i) t->step();
    return t->masters().hash();
  };
  EXPECT_EQ(run("SKIP"), run("DROP_RANK"));
}

}  // namespace
}  // namespace ampdist
