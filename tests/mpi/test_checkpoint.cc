// Checkpoint scenarios: the scaler state survives a resume, the master weights are saved (not rebuilt from the
// working copy), exact resume, save -> load -> save byte-identity, and loading on another world size
// (sub-communicators of this MPI world stand in for a job started again on fewer or more ranks). A resumed trainer is
// a new Trainer object that gets every bit of its state from the checkpoint, as new processes would.
#include <chrono>
#include <cstdio>
#include <fstream>

#include "runtime/checkpoint/async_checkpoint.h"
#include "runtime/train/step_observer.h"
#include "test_util.h"

namespace ampdist {
namespace {

using testing::bytes;
using testing::config;
using testing::float_bits;
using testing::same_on_all_ranks;
using testing::SharedTempDir;

std::string job(const std::string& extra) {
  return R"(
    name: "ckpt"
    model { mlp { hidden: [16] } }
    data { synthetic { train_samples: 1024 test_samples: 128 features: 8 classes: 4 } global_batch_size: 32 }
    optimizer { adamw {} lr: 0.001 weight_decay: 0.01 }
    comm { timeout_s: 60 }
  )" + extra;
}

std::unique_ptr<Trainer> resume_from(const RunConfig& cfg, Communicator& comm, const std::string& path) {
  auto t = make_trainer(cfg, comm);
  CheckpointState state = t->checkpoint_state();
  t->restore(load_checkpoint(comm, path, state));
  return t;
}

struct ScalerTrace {
  std::vector<float> scale;
  std::vector<int64_t> growth, skipped;
  void add(const Trainer& t) {
    const LossScalerState s = t.scaler().state();
    scale.push_back(s.scale);
    growth.push_back(s.growth_tracker);
    skipped.push_back(s.skipped_steps);
  }
};

// ---- the scaler state survives a resume: growth at step 2000 and backoff counts go on where they stopped ----------

void scaler_survives_resume(int64_t overflow_step, int64_t total, int64_t save_step) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  RunConfig cfg = config(job("precision { dtype: FP16 } train { steps: " + std::to_string(total) + " }"));
  if (overflow_step > 0) {
    testing::inject_nonfinite(cfg, overflow_step, 0);
  }
  // Uninterrupted run, saving at save_step on the way.
  ScalerTrace straight;
  std::string path;
  std::vector<uint8_t> final_master;
  {
    auto t = make_trainer(cfg, comm);
    for (int64_t step = 1; step <= total; ++step) {
      t->step();
      straight.add(*t);
      if (step == save_step) path = save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0);
    }
    final_master = bytes(t->masters().master());
  }
  // Resumed run: a new trainer from the checkpoint.
  auto t = resume_from(cfg, comm, path);
  EXPECT_EQ(t->iteration(), save_step);
  bool same = true;
  for (int64_t step = save_step + 1; step <= total; ++step) {
    t->step();
    const LossScalerState s = t->scaler().state();
    const size_t i = static_cast<size_t>(step - 1);
    same &= s.scale == straight.scale[i] && s.growth_tracker == straight.growth[i] &&
            s.skipped_steps == straight.skipped[i];
  }
  EXPECT_TRUE(same) << "scale, growth tracker or skip count left the uninterrupted trajectory";
  EXPECT_EQ(bytes(t->masters().master()), final_master) << "resumed weights differ from the uninterrupted run";
  EXPECT_TRUE(same_on_all_ranks(comm, t->masters().hash()));
}

TEST(ScalerAcrossResume, CleanRunGrowsAtStep2000AfterResumeAt1500) {
  scaler_survives_resume(/*overflow_step=*/0, /*total=*/2000, /*save_step=*/1500);
}

TEST(ScalerAcrossResume, OverflowAt1400ThenResumeAt1500DoublesOnlyAfter3400) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  scaler_survives_resume(/*overflow_step=*/1400, /*total=*/3401, /*save_step=*/1500);
}

TEST(ScalerAcrossResume, ExpectedValuesOfTheTrajectory) {
  // The values the scenario states, on the straight run the test above compares against.
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  RunConfig cfg = config(job("precision { dtype: FP16 } train { steps: 3401 }"));
  testing::inject_nonfinite(cfg, 1400, 0);
  auto t = make_trainer(cfg, comm);
  std::string path;
  for (int64_t step = 1; step <= 1500; ++step) {
    t->step();
    if (step == 1399) { EXPECT_EQ(t->scaler().scale(), 65536.0f); }
  }
  path = save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0);
  auto r = resume_from(cfg, comm, path);
  EXPECT_EQ(r->scaler().scale(), 32768.0f);
  EXPECT_EQ(r->scaler().state().skipped_steps, 1);
  for (int64_t step = 1501; step <= 3400; ++step) {
    r->step();
    if (step == 3399) { EXPECT_EQ(r->scaler().scale(), 32768.0f); }
  }
  EXPECT_EQ(r->scaler().scale(), 65536.0f) << "2000 clean steps after the overflow at 1400 end at 3400";
}

TEST(ScalerAcrossResume, CleanRunValuesAt1999And2000) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  RunConfig cfg = config(job("precision { dtype: FP16 } train { steps: 2000 }"));
  auto t = make_trainer(cfg, comm);
  for (int step = 1; step <= 1500; ++step) t->step();
  const std::string path = save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0);
  auto r = resume_from(cfg, comm, path);
  for (int step = 1501; step <= 1999; ++step) r->step();
  EXPECT_EQ(r->scaler().scale(), 65536.0f);
  r->step();
  EXPECT_EQ(r->scaler().scale(), 131072.0f);
}

// ---- the master weights are saved, not rebuilt from the working copy --------------------------------------------

TEST(MasterSavedNotRebuilt, MasterWeightIsSavedNotRebuiltFromTheWorkingCopy) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  const RunConfig cfg = config(job("precision { dtype: FP16 } train { steps: 20 }"));
  auto start = [&] {
    auto t = make_trainer(cfg, comm);
    t->masters().master().data_as<float>()[0] = 1.0003f;
    return t;
  };
  // 1.0003 is not an fp16 value: its working copy is 1.0 (fp16 spacing near 1 is 2^-10).
  {
    float w = 1.0003f;
    Tensor h = Tensor::empty({1}, DType::kFloat16);
    kernels::cast(Tensor::view(&w, {1}, DType::kFloat32), h);
    ASSERT_EQ(h.item(0), 1.0f);
  }
  auto straight = start();
  std::vector<double> losses;
  for (int step = 1; step <= 10; ++step) straight->step();
  const std::string path = save_checkpoint(comm, straight->checkpoint_state(), tmp.path(), 0);
  const float saved_w0 = straight->masters().master().item(0);
  for (int step = 11; step <= 20; ++step) losses.push_back(straight->step().loss);

  auto r = resume_from(cfg, comm, path);
  EXPECT_EQ(float_bits(r->masters().master().item(0)), float_bits(saved_w0));
  bool same_losses = true;
  for (int step = 11; step <= 20; ++step) same_losses &= r->step().loss == losses[static_cast<size_t>(step - 11)];
  EXPECT_TRUE(same_losses) << "losses after resume differ from the uninterrupted run";
  EXPECT_EQ(bytes(r->masters().master()), bytes(straight->masters().master()));
}

TEST(MasterSavedNotRebuilt, SavedBeforeAnyStepKeepsTheExactMasterValue) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  const RunConfig cfg = config(job("precision { dtype: FP16 } train { steps: 10 }"));
  auto t = make_trainer(cfg, comm);
  t->masters().master().data_as<float>()[0] = 1.0003f;
  const std::string path = save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0);
  auto r = resume_from(cfg, comm, path);
  EXPECT_EQ(float_bits(r->masters().master().item(0)), float_bits(1.0003f));
}

// ---- byte identity and exact resume --------------------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(Checkpoint, SaveLoadSaveIsByteIdentical) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir a(comm), b(comm);
  const RunConfig cfg = config(job("precision { dtype: BF16 } train { steps: 20 }"));
  auto t = make_trainer(cfg, comm);
  t->set_run_id("0123456789abcdef");
  for (int step = 1; step <= 7; ++step) t->step();
  const std::string pa = save_checkpoint(comm, t->checkpoint_state(), a.path(), 0);
  auto r = resume_from(cfg, comm, pa);
  const std::string pb = save_checkpoint(comm, r->checkpoint_state(), b.path(), 0);
  if (comm.rank() == 0) {
    for (const auto& e : std::filesystem::directory_iterator(pa)) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(slurp(e.path().string()), slurp(pb + "/" + name)) << name << " differs after save -> load -> save";
    }
  }
}

// An asynchronous save copies host state on its background thread while the next step's forward and backward run;
// the step waits for that copy at before_update(), the observer point after the consensus and before the step
// writes the master weights and the optimizer state. Here the last rank's copy is held back for 1 s (the slow-save
// drill before the staging copy), far longer than the tiny model's forward and backward: were the step not to wait,
// that rank's shard would hold the next step's master weights. So the checkpoint must hold the state of the step it
// was started at, bit for bit, although the next step changed that state while the save was being written.
TEST(AsyncCheckpoint, HoldsTheStateOfItsStepWhileTheNextStepUpdatesIt) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  const RunConfig cfg = config(job("precision { dtype: BF16 } train { steps: 20 }"));
  auto t = make_trainer(cfg, comm);
  t->set_run_id("0123456789abcdef");
  FaultConfig faults;
  faults.mutable_slow_save()->set_step(3);
  faults.mutable_slow_save()->set_rank(comm.world_size() - 1);
  faults.mutable_slow_save()->set_seconds(1.0f);
  faults.mutable_slow_save()->set_before_staging_copy(true);
  auto async = std::make_shared<AsyncCheckpointer>(comm, tmp.path(), 0, &faults);
  struct Gate : StepObserver {
    AsyncCheckpointer* async = nullptr;
    const Tensor* master = nullptr;
    std::vector<uint8_t> at_gate;
    void before_update() override {
      async->wait_staged();
      at_gate = bytes(*master);
    }
  };
  auto gate = std::make_unique<Gate>();
  Gate* g = gate.get();
  g->async = async.get();
  g->master = &t->masters().master();
  t->add_observer(std::move(gate));
  for (int step = 1; step <= 3; ++step) t->step();
  const std::vector<uint8_t> saved = bytes(t->masters().master());
  const std::vector<uint8_t> saved_exp_avg = bytes(*t->checkpoint_state().buffers.at(1).second);
  async->start(t->checkpoint_state());
  const auto t0 = std::chrono::steady_clock::now();
  t->step();
  const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() == comm.world_size() - 1) {
    EXPECT_GE(step_s, 0.9) << "the step did not wait for the staging copy";
  }
  EXPECT_TRUE(g->at_gate == saved) << "before_update() came after the step wrote the master weights";
  EXPECT_FALSE(bytes(t->masters().master()) == saved) << "the step did not change the master weights";
  const std::optional<AsyncCheckpointer::Published> p = async->drain();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->step, 3);
  const std::vector<float> master = read_checkpoint_buffer(p->path, "master");
  const std::vector<float> exp_avg = read_checkpoint_buffer(p->path, t->checkpoint_state().buffers.at(1).first);
  ASSERT_EQ(master.size() * sizeof(float), saved.size());
  EXPECT_EQ(std::memcmp(master.data(), saved.data(), saved.size()), 0);
  ASSERT_EQ(exp_avg.size() * sizeof(float), saved_exp_avg.size());
  EXPECT_EQ(std::memcmp(exp_avg.data(), saved_exp_avg.data(), saved_exp_avg.size()), 0);
}

// The writer streams each record's payload from the state to the file; its bytes must be exactly what protobuf
// serialises for the same ShardRecord (readers parse them with protobuf), record after record.
TEST(Checkpoint, ShardRecordsAreProtobufsOwnSerialisation) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  auto t = make_trainer(config(job("train { steps: 10 }")), comm);
  t->set_run_id("0123456789abcdef");
  t->step();
  CheckpointState state = t->checkpoint_state();
  state.record_elements = 10;  // several records per buffer, the last one short
  const std::string path = save_checkpoint(comm, state, tmp.path(), 0);
  char name[64];
  std::snprintf(name, sizeof name, "/shard_%05d_of_%05d.pb", comm.rank(), comm.world_size());
  const std::string bytes = slurp(path + name);
  size_t at = 0;
  int records = 0;
  while (at < bytes.size()) {
    uint64_t len = 0;
    int shift = 0;
    size_t p = at;
    for (;; shift += 7) {
      const auto b = static_cast<unsigned char>(bytes.at(p++));
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) break;
    }
    const std::string record = bytes.substr(p, len);
    ShardRecord rec;
    ASSERT_TRUE(rec.ParseFromString(record)) << "record " << records;
    EXPECT_EQ(rec.SerializeAsString(), record) << "record " << records;
    EXPECT_EQ(rec.data().size(), static_cast<size_t>(rec.count()) * 4);
    EXPECT_EQ(rec.run_id(), "0123456789abcdef");
    at = p + len;
    ++records;
  }
  EXPECT_EQ(at, bytes.size());
  EXPECT_GT(records, 3);
}

TEST(Checkpoint, KeepLastPrunesOnlyAfterTheNewOneIsComplete) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  auto t = make_trainer(config(job("train { steps: 10 }")), comm);
  for (int step = 1; step <= 4; ++step) {
    t->step();
    save_checkpoint(comm, t->checkpoint_state(), tmp.path(), /*keep_last=*/2);
  }
  comm.barrier("test");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000003", "step_00000004"}));
  EXPECT_EQ(find_latest_checkpoint(tmp.path()).value(), tmp.path() + "/step_00000004");
}

// A damaged checkpoint in the way of a save is evidence: a save of the same step moves it aside to step_N.damaged
// (then .damaged.2, never onto an existing name) with its files unchanged and says so; a whole one is replaced.
TEST(Checkpoint, ASaveMovesADamagedCheckpointOfItsStepAsideAndReplacesAWholeOne) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SharedTempDir tmp(comm);
  auto t = make_trainer(config(job("train { steps: 10 }")), comm);
  t->step();
  const std::string path = save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0);
  char name[64];
  std::snprintf(name, sizeof name, "/shard_00000_of_%05d.pb", comm.world_size());
  const std::string shard = path + name;
  std::vector<std::string> warnings;
  // Whole: replaced, no warning.
  save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0, nullptr, &warnings);
  EXPECT_TRUE(warnings.empty());
  for (int round = 1; round <= 2; ++round) {
    std::string manifest;
    if (comm.rank() == 0) {
      EXPECT_EQ(whole_checkpoint_problem(path), "");
      manifest = slurp(path + "/manifest.pb");
      std::filesystem::remove(shard);
      EXPECT_EQ(whole_checkpoint_problem(path), shard + ": missing");
    }
    comm.barrier("test");
    warnings.clear();
    save_checkpoint(comm, t->checkpoint_state(), tmp.path(), 0, nullptr, &warnings);
    if (comm.rank() == 0) {
      const std::string aside = path + (round == 1 ? ".damaged" : ".damaged.2");
      ASSERT_EQ(warnings.size(), 1u);
      EXPECT_EQ(warnings[0], path + " was damaged (" + shard + ": missing): moved aside to " + aside +
                                 ", not written over");
      EXPECT_EQ(slurp(aside + "/manifest.pb"), manifest);
      EXPECT_FALSE(std::filesystem::exists(aside + "/" + std::filesystem::path(shard).filename().string()));
      EXPECT_TRUE(is_moved_aside(std::filesystem::path(aside).filename().string()));
      EXPECT_TRUE(verify_checkpoint(path).empty());
    } else {
      EXPECT_TRUE(warnings.empty()) << "only rank 0 publishes, and says so";
    }
    comm.barrier("test");
  }
  EXPECT_FALSE(is_moved_aside("step_00000001"));
  EXPECT_FALSE(is_moved_aside("step_00000001.damaged."));
  EXPECT_FALSE(is_moved_aside("step_0000001.damaged"));
  EXPECT_EQ(scan_for_resume(tmp.path()).candidates, std::vector<std::string>{path});
}

// ---- another world size --------------------------------------------------------------------------------------

struct SavedState {
  std::vector<uint8_t> master, m, v;
  LossScalerState scaler;
  int64_t iteration, step_count;
};

SavedState saved_state(Trainer& t) {
  auto& adam = dynamic_cast<AdamW&>(t.optimizer());
  return {bytes(t.masters().master()), bytes(adam.exp_avg()), bytes(adam.exp_avg_sq()), t.scaler().state(),
          t.iteration(), t.optimizer_steps()};
}

// Saves on a world of `save_ranks` (the first ranks of MPI_COMM_WORLD) and loads on a world of `load_ranks`.
void reshard(int save_ranks, int load_ranks) {
  MpiCommunicator world(MPI_COMM_WORLD, testing::kTimeoutS);
  if (world.world_size() < std::max(save_ranks, load_ranks)) GTEST_SKIP() << "needs more ranks";
  SharedTempDir tmp(world);
  const RunConfig cfg = config(job("precision { dtype: FP16 } train { steps: 40 }"));
  auto sub = [&](int ranks) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, world.rank() < ranks ? 0 : MPI_UNDEFINED, world.rank(), &c);
    return c;
  };
  // Every rank of the saving world holds the same full state; rank 0 of the world is in both worlds.
  uint64_t expected_hash = 0;
  SavedState expected{};
  MPI_Comm save_comm = sub(save_ranks);
  if (save_comm != MPI_COMM_NULL) {
    MpiCommunicator c(save_comm, testing::kTimeoutS);
    auto t = make_trainer(cfg, c);
    for (int step = 1; step <= 13; ++step) t->step();
    save_checkpoint(c, t->checkpoint_state(), tmp.path(), 0);
    expected = saved_state(*t);
    expected_hash = t->masters().hash();
    MPI_Comm_free(&save_comm);
  }
  // Rank 0's view of the saved state, for every loading rank to compare with.
  const uint64_t hash0 = world.allgather_u64(expected_hash, "hash")[0];
  MPI_Comm load_comm = sub(load_ranks);
  if (load_comm != MPI_COMM_NULL) {
    MpiCommunicator c(load_comm, testing::kTimeoutS);
    auto r = resume_from(cfg, c, tmp.path() + "/" + checkpoint_name(13));
    EXPECT_EQ(r->masters().hash(), hash0);
    if (world.rank() < save_ranks) {
      const SavedState got = saved_state(*r);
      EXPECT_EQ(got.master, expected.master);
      EXPECT_EQ(got.m, expected.m);
      EXPECT_EQ(got.v, expected.v);
      EXPECT_EQ(got.scaler, expected.scaler);
      EXPECT_EQ(got.iteration, 13);
      EXPECT_EQ(got.step_count, expected.step_count);
    }
    EXPECT_EQ(r->micro_batch_size(), 32 / load_ranks) << "the global batch is kept";
    for (int step = 14; step <= 16; ++step) EXPECT_FALSE(r->step().skipped);
    EXPECT_TRUE(same_on_all_ranks(c, r->masters().hash()));
    MPI_Comm_free(&load_comm);
  }
  world.barrier("reshard done");
}

TEST(Reshard, FourToTwo) { reshard(4, 2); }
TEST(Reshard, FourToOne) { reshard(4, 1); }
TEST(Reshard, TwoToFour) { reshard(2, 4); }
TEST(Reshard, TwoToOne) { reshard(2, 1); }
TEST(Reshard, OneToTwo) { reshard(1, 2); }

}  // namespace
}  // namespace ampdist
