// The step protocol in the GPU's mode, run on the CPU: the host reads the step state back only at the steps the
// training loop acts on (StateReads::kDueSteps), exactly as on the GPU. Against a twin trainer that reads after every
// step, every step's decisions (the scale it ran with, the skip flag, the learning rate) and the master weights are
// the same bits, through overflows, scale growth, a warmup-cosine schedule, clipping and gradient accumulation.
#include <limits>

#include "test_util.h"

namespace ampdist {
namespace {

using testing::bytes;
using testing::config;

TEST(StepProtocol, ReadingOnlyAtDueStepsDecidesEveryStepAsReadingEveryStep) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  const int last = comm.world_size() - 1;
  // Overflows on one rank at 4, 5 and 13 (two in a row: hysteresis 2 backs off on the second), growth every 3
  // clean steps; reads are due every 5 steps (log), at the epoch end (16 steps of 32 samples) and at the last.
  const std::string text = R"(
      name: "protocol"
      model { mlp { hidden: [16] } }
      data { synthetic { train_samples: 512 test_samples: 64 features: 8 classes: 4 } global_batch_size: 32 }
      optimizer { adamw {} lr: 0.01 clip_grad_norm: 0.5 accumulation_steps: 2
                  schedule { kind: COSINE warmup_steps: 3 min_lr: 0.001 } }
      precision { dtype: FP16 dynamic { init_scale: 1024 growth_interval: 3 hysteresis: 2 } }
      train { steps: 20 seed: 11 }
      log { every_steps: 5 }
      fault {
        inject_nonfinite { step: 4 rank: )" + std::to_string(last) + R"( element: 3 target: GRADIENT value: POS_INF }
        inject_nonfinite { step: 5 rank: 0 element: 40 target: GRADIENT value: QNAN }
        inject_nonfinite { step: 13 rank: )" + std::to_string(last) + R"( element: 7 target: GRADIENT value: NEG_INF }
      })";
  auto every = make_trainer(config(text), comm);
  auto due = make_trainer(config(text), comm);
  due->set_state_reads(StateReads::kDueSteps);
  int reads = 0, skips = 0, grew = 0;
  float previous_scale = 1024.0f;
  for (int step = 1; step <= 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepResult a = every->step();
    const StepResult b = due->step();
    ASSERT_TRUE(a.read);
    EXPECT_EQ(b.read, step % 5 == 0 || step == 16 || step == 20);
    // What the due-steps trainer decided at this step, looked at in its state (host memory on the CPU) without a
    // read, so its control flow is untouched.
    const StepState& s = *due->step_state().get();
    EXPECT_EQ(s.last_scale, a.scale);
    EXPECT_EQ(s.last_skipped != 0, a.skipped);
    EXPECT_EQ(s.last_lr, a.lr);
    EXPECT_EQ(s.scaler.scale, every->scaler().scale());
    EXPECT_EQ(s.scaler.growth_tracker, every->scaler().state().growth_tracker);
    EXPECT_EQ(s.optimizer_steps, every->optimizer_steps());
    EXPECT_EQ(bytes(due->masters().master()), bytes(every->masters().master()));
    skips += a.skipped;
    grew += a.scale > previous_scale;
    previous_scale = a.scale;
    if (b.read) {
      ++reads;
      EXPECT_EQ(b.scale, a.scale);
      EXPECT_EQ(b.skipped, a.skipped);
      EXPECT_EQ(b.lr, a.lr);
      EXPECT_EQ(due->scaler().state(), every->scaler().state());
      EXPECT_EQ(due->optimizer_steps(), every->optimizer_steps());
    } else {
      EXPECT_EQ(b.loss, 0.0) << "values carry over to the next read";
    }
  }
  EXPECT_EQ(reads, 5);
  EXPECT_EQ(skips, 3) << "the injected overflows at 4, 5 and 13";
  EXPECT_GE(grew, 1) << "the scale grew at least once";
  EXPECT_EQ(every->optimizer_steps(), 17);
}

}  // namespace
}  // namespace ampdist
