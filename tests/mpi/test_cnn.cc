// BatchNorm in data-parallel mixed-precision training: running statistics are buffers that a skipped step (an fp16
// overflow) leaves bitwise unchanged, that stay identical on every rank (broadcast from rank 0, or equal by
// construction with synchronised statistics), and synchronised batch statistics are those of the global batch.
#include <cmath>

#include "test_util.h"

namespace ampdist {
namespace {

using testing::config;

std::string cnn_job(bool sync) {
  return std::string(R"(
    name: "batchnorm_skip"
    model { cnn { conv { channels: 4 kernel: 3 bias: false batch_norm: true max_pool: 2 } hidden: [8] }
            sync_batchnorm: )") + (sync ? "true" : "false") + R"( }
    data { synthetic { train_samples: 256 test_samples: 32 image_shape: [1, 8, 8] classes: 3 } global_batch_size: 16 }
    optimizer { adamw {} lr: 0.001 }
    precision { dtype: FP16 }
    comm { timeout_s: 60 }
    train { steps: 10 seed: 3 }
  )";
}

std::vector<uint8_t> buffer_bytes(Trainer& t) { return testing::bytes(t.buffers()->values()); }
uint64_t fnv1a(const std::vector<uint8_t>& b) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Samples [first, first + n) of the dataset as one micro-batch.
MicroBatch samples(const Dataset& d, int64_t first, int64_t n, float factor) {
  MicroBatch b;
  b.x = Tensor::empty({n, d.feature_dim()}, DType::kFloat32);
  b.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d.get(first + i, b.x.data_as<float>() + i * d.feature_dim(), &b.y[i]);
  for (int64_t i = 0; i < b.x.numel(); ++i) b.x.data_as<float>()[i] *= factor;
  return b;
}

void run_batchnorm_skip(bool sync) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  if (comm.world_size() != 2) GTEST_SKIP() << "this scenario runs on 2 ranks";
  const RunConfig cfg = config(cnn_job(sync));
  auto t = make_trainer(cfg, comm);
  ASSERT_NE(t->buffers(), nullptr);
  const DatasetPair data = load_datasets(cfg.data(), cfg.train().seed());
  auto& seq = dynamic_cast<Sequential&>(t->model());
  auto& bn = dynamic_cast<BatchNorm2d&>(seq.at(2));  // input view, conv1, bn1
  const int64_t per_rank = 8, global = 16;
  auto step = [&](int64_t s, float rank0_factor) {
    const MicroBatch mb = samples(*data.train, (s - 1) * global + comm.rank() * per_rank, per_rank,
                                  comm.rank() == 0 ? rank0_factor : 1.0f);
    return t->step(std::span<const MicroBatch>(&mb, 1), global);
  };
  for (int64_t s = 1; s <= 3; ++s) ASSERT_FALSE(step(s, 1.0f).skipped) << "step " << s;
  const std::vector<uint8_t> after3 = buffer_bytes(*t);
  EXPECT_EQ(bn.num_batches_tracked().value.item(0), 3.0f);
  EXPECT_TRUE(testing::same_on_all_ranks(comm, t->master_hash()));

  // Step 4: rank 0's pixels times 1e5: the first convolution's fp16 output overflows (|y| > 65504) to inf, the
  // batch statistics become inf/NaN, the gradient is non-finite, and every rank skips.
  const StepResult r4 = step(4, 1e5f);
  EXPECT_TRUE(r4.skipped);
  EXPECT_EQ(buffer_bytes(*t), after3) << "a skipped step changed the running statistics";
  EXPECT_TRUE(testing::all_finite(t->buffers()->values()));
  EXPECT_EQ(bn.num_batches_tracked().value.item(0), 3.0f);

  // Step 5 applies: the buffers change, identically on every rank.
  const StepResult r5 = step(5, 1.0f);
  EXPECT_FALSE(r5.skipped);
  EXPECT_NE(buffer_bytes(*t), after3);
  EXPECT_EQ(bn.num_batches_tracked().value.item(0), 4.0f);
  EXPECT_TRUE(testing::all_finite(t->buffers()->values()));
  const std::vector<uint8_t> b5 = buffer_bytes(*t);
  const uint64_t h5 = fnv1a(b5);
  EXPECT_TRUE(testing::same_on_all_ranks(comm, h5)) << "running statistics differ across ranks";
  EXPECT_TRUE(testing::same_on_all_ranks(comm, t->master_hash()));

  if (sync) {
    // The batch statistics of step 5 against the concatenated global batch in double: BatchNorm's input (the
    // conv output, [8, 4, 8, 8] per rank) gathered from both ranks.
    const Tensor& in = bn.last_input();  // in the working dtype, which BatchNorm reads as FP32
    const int64_t n = in.numel();
    std::vector<float> all(static_cast<size_t>(2 * n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(comm.rank() * n + i)] = in.item(i);
    const std::vector<int64_t> counts{n, n};
    comm.allgather_inplace_async(all.data(), counts, DType::kFloat32, "test gather")->wait();
    const int64_t C = 4, hw = 64;
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, q = 0, m = 0;
      for (int64_t r = 0; r < 2 * per_rank; ++r)
        for (int64_t i = 0; i < hw; ++i) s += all[static_cast<size_t>((r * C + c) * hw + i)];
      m = s / (2 * per_rank * hw);
      for (int64_t r = 0; r < 2 * per_rank; ++r)
        for (int64_t i = 0; i < hw; ++i) q += std::pow(all[static_cast<size_t>((r * C + c) * hw + i)] - m, 2);
      const double var = q / (2 * per_rank * hw);
      // FP32 statistics from double sums of FP32 values: a few FP32 roundings, so 1e-5 relative (the case's bound)
      // is ~100 ulps; the variance from sums of squares loses at most |mean|^2 / var more digits, small here.
      EXPECT_NEAR(bn.batch_mean().item(c), m, 1e-5 * std::max(std::fabs(m), 1e-3)) << "channel " << c;
      EXPECT_NEAR(bn.batch_var().item(c), var, 1e-5 * var) << "channel " << c;
    }
  }
}

TEST(BatchNormOnSkippedStep, SkippedStepLeavesBatchNormBuffersUnchangedPerRankStatistics) { run_batchnorm_skip(false); }
TEST(BatchNormOnSkippedStep, SkippedStepLeavesBatchNormBuffersUnchangedSyncBatchNorm) { run_batchnorm_skip(true); }

}  // namespace
}  // namespace ampdist
