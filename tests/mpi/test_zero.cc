// Sharded optimizer state (optimizer.zero_stage 1): each rank holds a contiguous slice of the FP32 master weights
// and of the optimizer moments. It must change no number against replicated state where the summation order is the
// same (2 ranks), skip exactly as replicated state does, and checkpoint so that any world size and either stage can
// continue, each rank reading only the bytes of its own slice.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace ampdist {
namespace {

using testing::bytes;
using testing::config;
using testing::SharedTempDir;

// numel 8 * 13 + 13 + 13 * 3 + 3 = 159: not a multiple of 2 or 4, so slices differ in length and tensors straddle
// slice boundaries.
std::string zero_job(int stage, const std::string& extra) {
  return R"(
    name: "zero"
    model { mlp { hidden: [13] } }
    data { synthetic { train_samples: 960 test_samples: 64 features: 8 classes: 3 } global_batch_size: 32 }
    optimizer { adamw {} lr: 0.003 weight_decay: 0.1 zero_stage: )" + std::to_string(stage) + R"( }
    comm { timeout_s: 60 bucket_cap_mb: 0.0002 }
    train { steps: 30 seed: 5 }
  )" + extra;
}

// Every rank's slice of an FP32 tensor gathered in rank order (the test's own all-gather).
std::vector<float> gather_slices(Communicator& comm, const Tensor& slice, int64_t numel) {
  const std::vector<int64_t> counts = shard_counts(numel, comm.world_size());
  std::vector<float> all(static_cast<size_t>(numel));
  int64_t begin = 0;
  for (int r = 0; r < comm.rank(); ++r) begin += counts[r];
  std::copy(slice.data_as<float>(), slice.data_as<float>() + slice.numel(), all.begin() + begin);
  comm.allgather_inplace_async(all.data(), counts, DType::kFloat32, "test gather")->wait();
  return all;
}

TEST(ZeroOneAsReplicated, ShardedStateSkipsAndUpdatesAsReplicatedState) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  if (comm.world_size() < 2) GTEST_SKIP() << "sharding needs at least 2 ranks";
  // A +inf in rank 1's own gradient at step 12, fp16 with dynamic scaling, AdamW.
  const std::string fault = R"(
    precision { dtype: FP16 }
    fault { inject_nonfinite { step: 12 rank: 1 element: 17 target: GRADIENT value: POS_INF } })";
  auto rep = make_trainer(config(zero_job(0, fault)), comm);
  auto zero = make_trainer(config(zero_job(1, fault)), comm);
  ASSERT_FALSE(rep->sharded());
  ASSERT_TRUE(zero->sharded());
  const int64_t numel = zero->masters().numel();
  ASSERT_EQ(numel, 159);

  // Every element is owned by exactly one rank: the slices are contiguous, in rank order, and tile the flat space.
  const std::vector<uint64_t> begins = comm.allgather_u64(zero->masters().slice_begin(), "slice begins");
  const std::vector<uint64_t> counts = comm.allgather_u64(zero->masters().slice_count(), "slice counts");
  int64_t covered = 0;
  for (int r = 0; r < comm.world_size(); ++r) {
    EXPECT_EQ(static_cast<int64_t>(begins[r]), covered) << "rank " << r;
    covered += static_cast<int64_t>(counts[r]);
  }
  EXPECT_EQ(covered, numel);
  // Some tensor has elements on both sides of the boundary between rank 0's and rank 1's slices.
  bool straddles = false;
  for (const FlatEntry& e : zero->masters().layout().entries())
    straddles |= e.offset < static_cast<int64_t>(begins[1]) && e.offset + e.numel() > static_cast<int64_t>(begins[1]);
  EXPECT_TRUE(straddles);

  // 2 ranks: a sum of two values is the same in either order, so the modes agree bit for bit. More ranks reduce in
  // another order (all-reduce ring against reduce-scatter): the losses must then agree within what reordering a sum
  // of W FP32 terms can change. Each reduced gradient element moves by at most (W - 1) u sum|g_r| (u = 2^-24), a
  // relative 3u = 1.8e-7 for W = 4; to first order in the 30 steps of lr 0.003 that moves the loss by less than
  // 30 x 1.8e-7 x (relative step) << 1e-6; 1e-5 relative leaves room for the second-order terms.
  const bool bitwise = comm.world_size() == 2;
  for (int step = 1; step <= 30; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepResult a = rep->step();
    const int64_t gathers = comm.stats().allgather;
    const std::vector<uint8_t> working_before = bytes(zero->masters().working());
    const StepResult b = zero->step();
    const int64_t gathered = comm.stats().allgather - gathers;
    EXPECT_EQ(a.skipped, step == 12);
    EXPECT_EQ(b.skipped, step == 12);
    EXPECT_EQ(b.scale, a.scale);
    // Every step all-gathers every rank's sum of squares and the working copy: the host never reads the skip flag to
    // decide. On a skipped step the optimizer left every slice as it was, so the gather moves the same bits.
    EXPECT_EQ(gathered, 2);
    if (step == 12) {
      EXPECT_EQ(bytes(zero->masters().working()), working_before) << "a skipped step changed the working copy";
    }
    if (bitwise) {
      EXPECT_EQ(b.loss, a.loss);
      // The working copy the next forward reads: sharded state all-gathered it after the update; replicated state
      // casts its master weights at the start of the next step.
      Tensor next = Tensor::empty({numel}, DType::kFloat16);
      kernels::cast(rep->masters().master(), next);
      EXPECT_EQ(bytes(zero->masters().working()), bytes(next));
      const std::vector<float> full = zero->gather_master();
      EXPECT_EQ(std::memcmp(full.data(), rep->masters().master().data(), full.size() * sizeof(float)), 0);
    } else {
      double l[2] = {a.loss, b.loss};
      comm.allreduce_f64(l, ReduceOp::kSum, "test losses");
      EXPECT_NEAR(l[1], l[0], 1e-5 * std::fabs(l[0]));
    }
  }
  EXPECT_EQ(rep->scaler().scale(), 32768.0f);
  EXPECT_EQ(zero->scaler().scale(), 32768.0f) << "the scale halves once";
  EXPECT_EQ(zero->scaler().state().skipped_steps, 1);
  EXPECT_EQ(zero->optimizer_steps(), 29);
  if (bitwise) {
    auto& ma = dynamic_cast<AdamW&>(rep->optimizer());
    auto& mb = dynamic_cast<AdamW&>(zero->optimizer());
    const std::vector<float> m = gather_slices(comm, mb.exp_avg(), numel), v = gather_slices(comm, mb.exp_avg_sq(), numel);
    EXPECT_EQ(std::memcmp(m.data(), ma.exp_avg().data(), m.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(v.data(), ma.exp_avg_sq().data(), v.size() * sizeof(float)), 0);
  }
  const uint64_t sharded_hash = zero->master_hash();  // collective: every rank calls it
  if (bitwise) { EXPECT_EQ(sharded_hash, rep->masters().hash()) << "the hash of the whole master buffer"; }
}

// ---- resume on other world sizes and the other stage -------------------------------------------------------------

struct FullState {
  std::vector<float> master, m, v;
  LossScalerState scaler;
  int64_t step_count = 0;
};

FullState full_state(Trainer& t) {
  Communicator& comm = t.comm();
  auto& adam = dynamic_cast<AdamW&>(t.optimizer());
  FullState s;
  s.master = t.gather_master();
  const int64_t numel = t.masters().numel();
  if (t.sharded()) {
    s.m = gather_slices(comm, adam.exp_avg(), numel);
    s.v = gather_slices(comm, adam.exp_avg_sq(), numel);
  } else {
    s.m.assign(adam.exp_avg().data_as<float>(), adam.exp_avg().data_as<float>() + numel);
    s.v.assign(adam.exp_avg_sq().data_as<float>(), adam.exp_avg_sq().data_as<float>() + numel);
  }
  s.scaler = t.scaler().state();
  s.step_count = t.optimizer_steps();
  return s;
}

// Saves a run in `save_stage` on 4 ranks (records of 16 elements, so slices cut through records) and loads it on
// `load_ranks` ranks in `load_stage`.
void resume_sharded(int save_stage, int load_ranks, int load_stage) {
  MpiCommunicator world(MPI_COMM_WORLD, testing::kTimeoutS);
  if (world.world_size() < 4) GTEST_SKIP() << "saves on 4 ranks";
  SharedTempDir tmp(world);
  const std::string extra = "precision { dtype: FP16 }";
  auto sub = [&](int ranks) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, world.rank() < ranks ? 0 : MPI_UNDEFINED, world.rank(), &c);
    return c;
  };
  constexpr int64_t kRecord = 16;
  FullState saved;
  {
    MpiCommunicator c(MPI_COMM_WORLD, testing::kTimeoutS);
    auto t = make_trainer(config(zero_job(save_stage, extra)), c);
    for (int step = 1; step <= 7; ++step) t->step();
    CheckpointState state = t->checkpoint_state();
    state.record_elements = kRecord;
    save_checkpoint(c, state, tmp.path(), 0);
    saved = full_state(*t);
  }
  MPI_Comm load_comm = sub(load_ranks);
  if (load_comm != MPI_COMM_NULL) {
    MpiCommunicator c(load_comm, testing::kTimeoutS);
    auto r = make_trainer(config(zero_job(load_stage, extra)), c);
    CheckpointState state = r->checkpoint_state();
    LoadStats stats;
    r->restore(load_checkpoint(c, tmp.path() + "/" + checkpoint_name(7), state, &stats));
    const FullState got = full_state(*r);
    EXPECT_EQ(got.master, saved.master);
    EXPECT_EQ(got.m, saved.m);
    EXPECT_EQ(got.v, saved.v);
    EXPECT_EQ(got.scaler, saved.scaler);
    EXPECT_EQ(got.step_count, saved.step_count);
    EXPECT_EQ(r->iteration(), 7);
    // What this rank read: the records of the three buffers over its new slice, and at most one record more at
    // each end where an old shard's records cut through it; every record carries at most 64 bytes around its
    // payload (length prefix, run id, buffer name, offset, count, hash); plus the first 256 bytes of each of the at
    // most 4 shards it reads from (their run id, checked against the manifest's).
    const int64_t n = shard_counts(159, load_ranks)[c.rank()];
    const int64_t bound = 3 * (4 * n + 2 * 4 * kRecord) + stats.records * 64 + 4 * 256;
    EXPECT_LE(stats.bytes_read, bound) << stats.records << " records";
    EXPECT_GT(stats.bytes_read, 3 * 4 * n) << "every element of the slice was read";
    // And the run goes on.
    for (int step = 8; step <= 10; ++step) EXPECT_FALSE(r->step().skipped);
    MPI_Comm_free(&load_comm);
  }
  world.barrier("resume done");
}

TEST(ZeroResume, FourRanksStageOneToTwoRanksStageOne) { resume_sharded(1, 2, 1); }
TEST(ZeroResume, FourRanksStageOneToTwoRanksReplicated) { resume_sharded(1, 2, 0); }
TEST(ZeroResume, FourRanksStageOneToOneRankStageOne) { resume_sharded(1, 1, 1); }
TEST(ZeroResume, FourRanksStageOneToOneRankReplicated) { resume_sharded(1, 1, 0); }
TEST(ZeroResume, FourRanksReplicatedToTwoRanksStageOne) { resume_sharded(0, 2, 1); }

}  // namespace
}  // namespace ampdist
