// The training step reads nothing back to the host except at the steps the loop acts on. On the GPU every host read
// of a value the step computed waits for the compute stream; the step is one code path for both backends, and every
// such read goes through device::read_to_host or is counted by the kernel that returns a value to the host
// (device::note_host_read), so the count taken here on the CPU is the count the GPU's step makes.
// For the MLP, the GPT and the CNN (BatchNorm), each in ZeRO stage 0 and 1, fp16 with dynamic loss scaling (the
// scale is read by the losses where it lives), gradient accumulation and an overflow on a step that is not due:
// 0 host reads at every step whose state is not read, and at least one at each due step (the state read itself).
#include <fstream>
#include <string>

#include "runtime/core/device.h"
#include "test_util.h"

namespace ampdist {
namespace {

using testing::config;

// Byte-level text for the GPT: 40 documents separated as fortune files are ("%" lines).
std::string write_text(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/docs.txt";
  std::ofstream f(path);
  for (int d = 0; d < 40; ++d) {
    for (int w = 0; w < 30; ++w) f << "word" << (d * 31 + w * 7) % 97 << (w % 9 == 8 ? ".\n" : " ");
    f << "\n%\n";
  }
  return dir;
}

std::string model_text(const std::string& family, const std::string& text_dir) {
  if (family == "mlp")
    return R"(model { mlp { hidden: [16] } }
              data { synthetic { train_samples: 512 test_samples: 64 features: 8 classes: 4 } global_batch_size: 32 })";
  if (family == "cnn")
    return R"(model { cnn { conv { channels: 4 kernel: 3 bias: false batch_norm: true max_pool: 2 } hidden: [8] } }
              data { synthetic { train_samples: 512 test_samples: 32 image_shape: [1, 8, 8] classes: 3 }
                     global_batch_size: 32 })";
  return R"(model { gpt { n_layer: 1 n_head: 2 n_embd: 16 seq_len: 16 vocab_size: 256 dropout: 0.0 } }
            data { text { paths: ")" + text_dir + R"(" val_fraction: 0.1 } global_batch_size: 8 })";
}

void expect_reads_only_at_due_steps(const std::string& family, int zero_stage, const std::string& text_dir) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  SCOPED_TRACE(family + " stage " + std::to_string(zero_stage) + " on " + std::to_string(comm.world_size()) +
               " ranks");
  const std::string text = "name: \"host_reads\"\n" + model_text(family, text_dir) + R"(
      optimizer { adamw {} lr: 0.001 accumulation_steps: 2 zero_stage: )" + std::to_string(zero_stage) + R"( }
      precision { dtype: FP16 dynamic { init_scale: 1024 growth_interval: 3 } }
      train { steps: 12 seed: 5 }
      log { every_steps: 5 }
      fault { inject_nonfinite { step: 7 rank: 0 element: 1 target: GRADIENT value: POS_INF } })";
  auto trainer = make_trainer(config(text), comm);
  trainer->set_state_reads(StateReads::kDueSteps);
  int due = 0, skipped = 0;
  for (int step = 1; step <= 12; ++step) {
    const int64_t before = device::host_reads();
    const StepResult r = trainer->step();
    const int64_t reads = device::host_reads() - before;
    if (r.read) {
      ++due;
      skipped += r.skipped;
      EXPECT_GE(reads, 1) << "step " << step << " (due): the state read is counted";
    } else {
      EXPECT_EQ(reads, 0) << "step " << step << " is not due, but the host read the device " << reads << " times";
    }
  }
  EXPECT_EQ(due, 3) << "steps 5, 10 and 12 (log, log, last)";
  EXPECT_EQ(trainer->step_state().read().optimizer_steps, 11) << "the overflow at step 7 was skipped";
}

TEST(HostReads, NoStepReadsTheDeviceExceptAtDueSteps) {
  MpiCommunicator comm(MPI_COMM_WORLD, testing::kTimeoutS);
  testing::SharedTempDir tmp(comm);
  const std::string text_dir = tmp.path() + "/text_rank" + std::to_string(comm.rank());
  write_text(text_dir);
  for (const std::string family : {"mlp", "gpt", "cnn"})
    for (int stage : {0, 1}) expect_reads_only_at_due_steps(family, stage, text_dir);
}

}  // namespace
}  // namespace ampdist
