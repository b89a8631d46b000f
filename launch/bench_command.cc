#include "launch/bench_command.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "launch/rank_env.h"
#include "runtime/kernels/kernels.h"
#include "runtime/obs/phase_timer.h"
#include "runtime/train/config.h"
#include "runtime/train/loop.h"
#include "runtime/train/trainer.h"

namespace ampdist {
namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// The bench's config: the user's, with the dataset replaced by synthetic data of the same feature width and
// classes (read from the configured dataset), sized for warm-up + measured steps, and nothing written to disk.
RunConfig bench_config(const BenchArgs& args, int64_t& features, int32_t& classes) {
  RunConfig cfg = parse_config_file(args.config);
  if (!args.precision.empty()) {
    const std::string p = upper(args.precision);
    if (p != "FP32" && p != "FP16" && p != "BF16" && p != "AUTO")
      throw BadInput("--precision", "expected fp32, fp16, bf16 or auto, got '" + args.precision + "'");
    apply_override(cfg, "precision.dtype=" + p);
  }
  for (const std::string& s : args.sets) apply_override(cfg, s);
  if (args.steps < 1) throw BadInput("--steps", "must be >= 1, got " + std::to_string(args.steps));
  if (args.warmup < 0) throw BadInput("--warmup", "must be >= 0, got " + std::to_string(args.warmup));
  validate_config(cfg, args.config);
  std::vector<int64_t> image;  // [C, H, W] for image data (conv models), else empty
  if (cfg.data().has_synthetic()) {
    features = cfg.data().synthetic().features();
    classes = cfg.data().synthetic().classes();
    image.assign(cfg.data().synthetic().image_shape().begin(), cfg.data().synthetic().image_shape().end());
  } else {
    const DatasetPair real = load_datasets(cfg.data(), cfg.train().seed());
    features = real.train->feature_dim();
    classes = real.train->classes();
    if (real.train->sample_shape().size() == 3) image = real.train->sample_shape();
  }
  if (!image.empty()) features = image[0] * image[1] * image[2];
  SyntheticDatasetConfig* syn = cfg.mutable_data()->mutable_synthetic();
  syn->set_features(features);
  syn->clear_image_shape();
  for (int64_t d : image) syn->add_image_shape(d);
  syn->set_classes(classes);
  syn->set_train_samples(cfg.data().global_batch_size() * (args.steps + args.warmup));
  syn->set_test_samples(eval_batch_size(cfg, 1));  // one evaluation batch of a single rank
  cfg.mutable_train()->set_steps(args.steps + args.warmup);
  cfg.mutable_log()->set_phase_timing(true);
  cfg.mutable_log()->set_tensorboard(false);
  cfg.mutable_precision()->set_numerics_report_every(0);
  cfg.clear_fault();
  cfg.mutable_checkpoint()->set_every_steps(0);
  return cfg;
}

// What the measured steps gave, on every rank.
struct BenchMeasure {
  double seconds = 0;             // wall time of the measured steps (barriers on both sides)
  int64_t samples = 0, skipped = 0;
  PhaseTimes phases;              // this rank's
  std::vector<uint64_t> rss_kib;  // every rank's peak resident memory
  int64_t state_bytes = 0;        // model state on this rank
};

// Collective: args.warmup steps, then args.steps timed ones. The state is read only at the loop's due steps, as in
// training: on the GPU the steps queue without waiting.
BenchMeasure measure(Trainer& trainer, MpiCommunicator& comm, const BenchArgs& args) {
  BenchMeasure b;
  trainer.set_state_reads(StateReads::kDueSteps);
  for (int64_t i = 0; i < args.warmup; ++i) trainer.step();
  trainer.read_now();
  const int64_t skipped_before = trainer.scaler().state().skipped_steps;
  PhaseTimer* timer = trainer.phase_timer();
  timer->collect();  // warm-up times are dropped
  double sync[1] = {0.0};
  comm.allreduce_f64(sync, ReduceOp::kSum, "bench start barrier");
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < args.steps; ++i) b.samples += trainer.step().global_samples;
  trainer.read_now();  // waits for the last step (on the GPU) inside the timed region
  comm.allreduce_f64(sync, ReduceOp::kSum, "bench end barrier");
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.phases = timer->collect();
  // Peak resident memory of every rank, and the bytes of model state each holds: master weights, optimizer moments,
  // working copy and gradients (the first two are 1/N per rank with optimizer.zero_stage 1).
  b.rss_kib = comm.allgather_u64(static_cast<uint64_t>(peak_rss_mb() * 1024.0), "bench RSS");
  MasterWeights& m = trainer.masters();
  b.state_bytes = m.master().nbytes() + m.grads().nbytes();
  if (m.working().data() != m.master().data()) b.state_bytes += m.working().nbytes();
  for (auto& [name, t] : trainer.optimizer().state()) b.state_bytes += t->nbytes();
  b.skipped = trainer.scaler().state().skipped_steps - skipped_before;
  return b;
}

// Rank 0's report of a measurement: throughput, the phases of a step, model FLOPs and memory.
void print_bench_report(const RunConfig& cfg, Trainer& trainer, int world_size, int64_t features, int32_t classes,
                        const BenchArgs& args, const BenchMeasure& b) {
  // Model FLOPs per sample: 2 per weight in forward, 4 in backward (dx and dW), as in Kaplan et al. 2020's
  // 6N per token; biases and element-wise ops are left out.
  int64_t weights = 0;
  bool convs = false;  // a convolution's FLOPs scale with its output size, which the weights do not say
  for (const FlatEntry& p : trainer.masters().layout().entries()) {
    if (p.shape.size() == 2) weights += p.numel();
    convs |= p.shape.size() == 4;
  }
  const double flops_per_sample = 6.0 * static_cast<double>(weights);
  const double sps = static_cast<double>(b.samples) / b.seconds;
  std::cout << fmt::format("ampdist bench: {} | {} | world size {} | synthetic data, {} features, {} classes | "
                           "{} warm-up + {} measured steps of {} samples\n",
                           cfg.name(), dtype_name(trainer.working_dtype()), world_size, features, classes,
                           args.warmup, args.steps, cfg.data().global_batch_size());
  std::cout << fmt::format("samples/s: {:.1f} ({} samples in {:.3f} s; {} skipped steps)\n", sps, b.samples,
                           b.seconds, b.skipped);
  std::cout << fmt::format("{:<20}{:>12}{:>9}\n", "phase (rank 0)", "ms/step", "share");
  const PhaseTimes& pt = b.phases;
  const double per = 1e3 / static_cast<double>(std::max<int64_t>(pt.steps, 1));
  const double step_ms = 1e3 * b.seconds / static_cast<double>(args.steps);
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
    const Phase p = static_cast<Phase>(i);
    if (p == Phase::kCheckpoint) continue;  // the bench saves nothing
    std::cout << fmt::format("{:<20}{:>12.3f}{:>8.1f}%\n", phase_name(p), per * pt[p], 100.0 * per * pt[p] / step_ms);
  }
  const double other = step_ms - per * pt.total();
  std::cout << fmt::format("{:<20}{:>12.3f}{:>8.1f}%\n", "other (untimed)", other, 100.0 * other / step_ms);
  std::cout << fmt::format("{:<20}{:>12.3f}{:>8.1f}%\n", "step (wall)", step_ms, 100.0);
  std::cout << fmt::format("model FLOPs: {:.3g} per sample (6 x {} weights{}); achieved {:.2f} GFLOP/s\n",
                           flops_per_sample, weights, convs ? " of the GEMMs; convolutions not counted" : "",
                           flops_per_sample * sps / 1e9);
  std::cout << "model FLOP utilisation: n/a (CPU backend: no device peak to compare with)\n";
  std::string per_rank;
  uint64_t most = 0;
  for (size_t r = 0; r < b.rss_kib.size(); ++r) {
    per_rank += fmt::format("{}{:.1f}", r ? " " : "", b.rss_kib[r] / 1024.0);
    most = std::max(most, b.rss_kib[r]);
  }
  std::cout << fmt::format("peak memory per rank (RSS, MiB): max {:.1f} (ranks: {}); model state on rank 0: {:.1f} "
                           "MiB (zero_stage {})\n",
                           most / 1024.0, per_rank, static_cast<double>(b.state_bytes) / (1 << 20),
                           trainer.sharded() ? 1 : 0)
            << std::flush;
}

}  // namespace

int run_bench_command(const BenchArgs& args, MpiCommunicator& comm) {
  RunConfig cfg;
  int64_t features = 0;
  int32_t classes = 0;
  std::unique_ptr<Trainer> trainer;
  int code = 0;
  std::string message;
  try {
    cfg = bench_config(args, features, classes);
    comm.set_timeout(cfg.comm().timeout_s());
    trainer = make_trainer(cfg, comm);
  } catch (const Error& e) {
    code = e.exit_code();
    message = e.in_source(args.config);
  }
  // Set-up is local to each rank; agree before the first collective so that no rank waits on one that failed.
  int64_t v[1] = {code};
  comm.allreduce_i64(v, ReduceOp::kMax, "bench set-up status all-reduce");
  if (v[0] != 0) {
    if (comm.rank() == 0)
      std::fprintf(stderr, "ampdist: error: %s\n", message.empty() ? "set-up failed on another rank" : message.c_str());
    return static_cast<int>(v[0]);
  }
  const std::string binding = thread_binding_hint(trainer->threads(), kernels::available_cpus());
  if (!binding.empty() && comm.rank() == 0) std::cout << "warning: " << binding << "\n" << std::flush;
  const BenchMeasure b = measure(*trainer, comm, args);
  if (comm.rank() == 0) print_bench_report(cfg, *trainer, comm.world_size(), features, classes, args, b);
  return 0;
}

}  // namespace ampdist
