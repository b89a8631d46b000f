// Training throughput, mixed-precision overhead and peak memory of one config, under mpirun (bench/run_all.sh).
//
//   mpirun -np 2 build/bench/ampdist_bench_train --config configs/fashion_mnist_mlp.pbtxt --precision bf16
//       --warmup 20 --steps 50 --repeat 5 --json out.json
//
// What it measures, all on the Trainer that `ampdist train` builds (make_trainer), with no evaluation, logging or
// checkpointing in between:
//   - throughput: `repeat` windows of `steps` Trainer::step() calls after `warmup` steps; each window starts at a
//     barrier and its time is the maximum over ranks; samples/s = steps x global batch / time (data loading by the
//     prefetching loader thread is inside the window, as it is in a run);
//   - the mixed-precision machinery, each call timed alone on the same trainer after the windows, median of
//     `mp_iters`: MasterWeights::cast_to_working (a standalone cast: an unsharded fp16/bf16 step runs it only when
//     the working copy is not current, e.g. its first step; otherwise the optimizer pass writes the copy, 2 bytes a
//     parameter, which ampdist_bench_kernels' BM_SgdNesterov / BM_AdamW bf16_fused rows time), unscale_and_check
//     over the spans the reducer leaves reduced on this rank (factor 1, so repeated passes leave the values finite
//     and normal; the cost of a multiply is the same),
//     Consensus::agree (after a barrier, so it measures the collective and not the ranks' skew), LossScaler::update
//     on a copy of the scaler. Their sum over the median step time is the share of the step;
//   - memory: VmRSS before the trainer exists, VmHWM (peak RSS) at the end, and the bytes the design expects;
//   - the GEMM engine's rate on this machine in the working dtype at the same thread count (oneDNN, square,
//     --sgemm-n: bf16 natively, fp16 as the FP32 GEMM it is converted to), and the model's GEMM FLOPs per sample
//     (MLP or GPT), for the GEMM-bound limit of samples/s; which oneDNN implementation ran (engine.gemm_impl).
// Rank 0 prints one JSON object (and writes it to --json). Exit 2 on bad input, 1 on a runtime failure.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/mpi_communicator.h"
#include "runtime/core/error.h"
#include "runtime/kernels/cpu/isa.h"
#include "runtime/kernels/cpu/onednn.h"
#include "runtime/kernels/kernels.h"
#include "runtime/train/config.h"
#include "runtime/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;
using ampdist::DType;
using ampdist::Tensor;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); 0 when absent.
int64_t proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return 0;
}

double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

// FLOPs of one training sample's GEMMs for an MLP: forward 2*in*out per Linear, backward 2*in*out for the weight
// gradient and 2*in*out for the input gradient of every Linear but the first (the trainer asks for no input grad).
double mlp_gemm_flops_per_sample(const std::vector<int64_t>& widths) {
  double f = 0.0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const double io = static_cast<double>(widths[l]) * static_cast<double>(widths[l + 1]);
    f += (l == 0 ? 4.0 : 6.0) * io;
  }
  return f;
}

// Median rate (FLOP/s) of an n x n x n GEMM in `dtype` (FP32 output) on the CPU backend's engine at the current
// thread count: oneDNN's matmul in the dtype the backend multiplies `dtype` in (onednn::engine_dtype: bf16 natively
// where the CPU has bf16 kernels; fp16, and bf16 elsewhere, as the FP32 matmul they are widened to).
double measure_matmul(DType dtype, int n, int reps) {
  using namespace ampdist::kernels::cpu;
  const DType engine = onednn::engine_dtype(dtype);
  const size_t nn = static_cast<size_t>(n) * n;
  Tensor a = Tensor::empty({n, n}, engine), b = Tensor::empty({n, n}, engine);
  Tensor c = Tensor::zeros({n, n}, DType::kFloat32);
  Tensor half_a = Tensor::empty({n, n}, DType::kFloat32), quarter_b = Tensor::empty({n, n}, DType::kFloat32);
  for (size_t i = 0; i < nn; ++i) {
    half_a.data_as<float>()[i] = 0.5f;
    quarter_b.data_as<float>()[i] = 0.25f;
  }
  ampdist::kernels::cast(half_a, a);
  ampdist::kernels::cast(quarter_b, b);
  onednn::Matmul mm;
  mm.m = mm.n = mm.k = n;
  mm.ab_dtype = engine;
  mm.a_stride[1] = n;
  mm.b_stride[1] = 1;  // B^T, as a Linear's forward reads its weight
  mm.b_stride[2] = n;
  mm.c_stride[1] = n;
  onednn::matmul(mm, a.data(), b.data(), c.data());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    onednn::matmul(mm, a.data(), b.data(), c.data());
    t.push_back(seconds_since(t0));
  }
  // Checked like nccl-tests check results: every element is n * 0.5 * 0.25 exactly (small powers of two).
  const float* pc = c.data_as<float>();
  if (pc[0] != n * 0.125f || pc[nn - 1] != n * 0.125f) throw ampdist::Error("matmul check failed");
  return 2.0 * n * n * static_cast<double>(n) / median(t);
}

struct Args {
  std::string config, precision, json;
  std::vector<std::string> sets;
  int warmup = 20, steps = 50, repeat = 5, mp_iters = 20, sgemm_n = 1024;
};

int run(const Args& args, ampdist::MpiCommunicator& comm) {
  using namespace ampdist;
  RunConfig cfg = parse_config_file(args.config);
  if (!args.precision.empty()) {
    std::string p = args.precision;
    std::transform(p.begin(), p.end(), p.begin(), ::toupper);
    apply_override(cfg, "precision.dtype=" + p);
  }
  for (const std::string& s : args.sets) apply_override(cfg, s);
  // Long enough that the LR schedule never runs out inside the measurement.
  const int64_t total = args.warmup + static_cast<int64_t>(args.steps) * args.repeat + 1;
  if (cfg.train().steps() < total) apply_override(cfg, "train.steps=" + std::to_string(total));
  validate_config(cfg, args.config);

  const int64_t rss_start = proc_status_bytes("VmRSS");
  std::unique_ptr<Trainer> trainer = make_trainer(cfg, comm);
  const int64_t rss_setup = proc_status_bytes("VmRSS");
  const int64_t tensors_setup = ampdist::host_tensor_bytes();
  ampdist::reset_host_tensor_peak_bytes();
  const int64_t global_batch = cfg.data().global_batch_size();

  for (int i = 0; i < args.warmup; ++i) trainer->step();
  std::vector<double> window_s, samples_per_s;
  int64_t skipped = 0;
  for (int r = 0; r < args.repeat; ++r) {
    comm.barrier("window start");
    const auto t0 = Clock::now();
    for (int i = 0; i < args.steps; ++i) skipped += trainer->step().skipped;
    const double t = max_over_ranks(seconds_since(t0));
    window_s.push_back(t);
    samples_per_s.push_back(static_cast<double>(args.steps) * global_batch / t);
  }
  const double step_s = median(window_s) / args.steps;

  // ---- the mixed-precision machinery, each call alone, and the GEMM rate below: the kernels called here directly run
  // with the trainer's threads, as its step does (the trainer opens its own scope only inside its methods)
  const kernels::ExecContext trainer_threads{trainer->threads(), false};
  const kernels::ExecScope scope(trainer_threads);
  std::vector<double> t_cast, t_unscale, t_consensus, t_scaler;
  MasterWeights& masters = trainer->masters();
  LossScaler scaler_copy = trainer->scaler();
  for (int i = 0; i < args.mp_iters; ++i) {
    auto t0 = Clock::now();
    masters.cast_to_working();
    t_cast.push_back(seconds_since(t0));

    t0 = Clock::now();
    bool found_inf = false;
    for (const GradSpan& s : trainer->reducer().owned()) {
      Tensor g = Tensor::view(masters.grads().data_as<float>() + s.begin, {s.count}, DType::kFloat32);
      found_inf |= kernels::unscale_and_check(g, 1.0f).found_inf;
    }
    t_unscale.push_back(seconds_since(t0));

    StepState probe;  // host memory: this benchmark runs the CPU backend
    probe.scaler = trainer->scaler().state();
    probe.found_inf = found_inf ? 1.0f : 0.0f;
    const ConsensusFields fields{&probe.found_inf,        &probe.scaler.scale, &probe.scaler.growth_tracker,
                                 &probe.agreed_found_inf, &probe.agreed_stop,  &probe.disagree};
    comm.barrier("consensus timing");
    t0 = Clock::now();
    trainer->consensus().agree(fields, false);
    t_consensus.push_back(seconds_since(t0));

    t0 = Clock::now();
    scaler_copy.update(probe.agreed_found_inf != 0);
    t_scaler.push_back(seconds_since(t0));
  }
  const double cast_s = max_over_ranks(median(t_cast)), unscale_s = max_over_ranks(median(t_unscale));
  const double consensus_s = max_over_ranks(median(t_consensus)), scaler_s = max_over_ranks(median(t_scaler));

  // ---- memory
  const int64_t numel = masters.numel();
  const DType working = trainer->working_dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(working));
  int64_t optimizer_bytes = 0;
  for (auto& [name, t] : trainer->optimizer().state()) optimizer_bytes += t->nbytes();
  std::vector<int64_t> widths;  // in, hidden..., classes of the MLP
  const int64_t micro = trainer->micro_batch_size();
  for (const FlatEntry& p : masters.layout().entries()) {  // Linear weights [out, in], in layer order
    if (p.shape.size() != 2) continue;
    if (widths.empty()) widths.push_back(p.shape[1]);
    widths.push_back(p.shape[0]);
  }
  const bool gpt = cfg.model().has_gpt();
  if (!gpt && widths.size() < 2) throw Error(args.config + ": model has no Linear layer", ErrorKind::kBadInput);
  if (gpt) widths.clear();
  const int64_t in = gpt ? 0 : widths[0];
  // Per rank, as layers.cc keeps them: per Linear its output and (all but the first) its input gradient, the first
  // Linear's 16-bit copy of the FP32 input, per activation its output and input gradient, the loss gradient.
  int64_t act = es < 4 && !gpt ? micro * in * es : 0;
  for (size_t l = 1; l < widths.size(); ++l) act += micro * widths[l] * es + (l > 1 ? micro * widths[l - 1] * es : 0);
  for (size_t l = 1; l + 1 < widths.size(); ++l) act += 2 * micro * widths[l] * es;
  if (!gpt) act += micro * widths.back() * (es + 4);
  const int64_t master_b = numel * 4, working_b = es < 4 ? numel * es : 0, grads_b = numel * 4;
  const int64_t expected = master_b + working_b + grads_b + optimizer_bytes + act;
  const int64_t peak = proc_status_bytes("VmHWM");
  double peak_max = max_over_ranks(static_cast<double>(peak));

  // ---- GEMM-bound limit
  const double sgemm = max_over_ranks(measure_matmul(working, args.sgemm_n, 5));  // every rank measures; the best counts
  double flops = 0.0;
  if (gpt) {  // per window of T tokens: 6 FLOPs per weight and token (forward, input and weight gradients) for
              // every Linear and the tied head, and the 6 attention products over full T x T blocks per layer
    const auto& g = cfg.model().gpt();
    const double T = g.seq_len(), C = g.n_embd(), L = g.n_layer(), V = g.vocab_size();
    flops = 6.0 * T * (12.0 * L * C * C + V * C) + 12.0 * L * T * T * C;
  } else {
    flops = mlp_gemm_flops_per_sample(widths);
  }

  if (comm.rank() == 0) {
    nlohmann::json j;
    j["config"] = args.config;
    j["precision"] = dtype_name(working);
    j["world_size"] = comm.world_size();
    j["threads_per_rank"] = trainer->threads();
    j["global_batch"] = global_batch;
    j["micro_batch"] = micro;
    j["params"] = numel;
    j["widths"] = widths;
    j["warmup"] = args.warmup;
    j["steps"] = args.steps;
    j["repeat"] = args.repeat;
    j["skipped_steps"] = skipped;
    j["samples_per_s"] = samples_per_s;
    j["samples_per_s_median"] = median(samples_per_s);
    j["step_s_median"] = step_s;
    j["mp"] = {{"cast_to_working_s", cast_s},
               {"unscale_and_check_s", unscale_s},
               {"consensus_s", consensus_s},
               {"scaler_update_s", scaler_s},
               {"total_s", cast_s + unscale_s + consensus_s + scaler_s},
               {"share_of_step", (cast_s + unscale_s + consensus_s + scaler_s) / step_s}};
    j["memory"] = {{"rss_start_bytes", rss_start},
                   {"rss_after_setup_bytes", rss_setup},
                   // host memory held by tensors after set-up, and at most during the steps (rank 0)
                   {"tensor_bytes_after_setup", tensors_setup},
                   {"tensor_peak_bytes", ampdist::host_tensor_peak_bytes()},
                   {"peak_rss_bytes_max_over_ranks", static_cast<int64_t>(peak_max)},
                   {"expected_bytes", expected},
                   {"master_bytes", master_b},
                   {"working_bytes", working_b},
                   {"grads_bytes", grads_b},
                   {"optimizer_bytes", optimizer_bytes},
                   {"activations_bytes", act}};
    j["sgemm_flop_s"] = sgemm;  // the engine's matmul rate in the working dtype (name kept for old reports)
    j["matmul_flop_s"] = sgemm;
    j["engine"] = {{"onednn_version", kernels::cpu::onednn::version()},
                   {"gemm_impl", kernels::cpu::onednn::implementation(working, working)},
                   {"native_bf16", kernels::cpu::onednn::native_bf16()},
                   {"cpu_class_cap", kernels::cpu::isa::class_name(kernels::cpu::isa::max_class())},
                   {"onednn_isa", kernels::cpu::isa::onednn_isa()}};
    j["sgemm_n"] = args.sgemm_n;
    j["gemm_flops_per_sample"] = flops;
    // The world's GEMM throughput: each rank has its share of the cores and does its share of the samples.
    j["gemm_bound_samples_per_s"] = sgemm * comm.world_size() / flops;
    const std::string text = j.dump(2);
    std::printf("%s\n", text.c_str());
    if (!args.json.empty()) {
      std::ofstream out(args.json);
      out << text << "\n";
      if (!out) throw Error("cannot write " + args.json);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ampdist::MpiRuntime mpi(&argc, &argv);
  Args args;
  CLI::App app("ampdist training throughput, mixed-precision overhead and memory benchmark");
  app.add_option("--config", args.config, "run config (.pbtxt)")->required();
  app.add_option("--precision", args.precision, "override precision.dtype: fp32, fp16, bf16");
  app.add_option("--set", args.sets, "override one field, e.g. --set train.threads_per_rank=1 (repeatable)");
  app.add_option("--warmup", args.warmup, "steps before the first window")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", args.steps, "steps per timed window")->check(CLI::PositiveNumber);
  app.add_option("--repeat", args.repeat, "timed windows")->check(CLI::PositiveNumber);
  app.add_option("--mp-iters", args.mp_iters, "repetitions of each mixed-precision call")->check(CLI::PositiveNumber);
  app.add_option("--sgemm-n", args.sgemm_n, "size of the square sgemm that measures the machine")
      ->check(CLI::PositiveNumber);
  app.add_option("--json", args.json, "also write the result here (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  ampdist::MpiCommunicator comm;
  try {
    return run(args, comm);
  } catch (const ampdist::Error& e) {
    std::fprintf(stderr, "ampdist_bench_train: rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    comm.abort(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist_bench_train: rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    comm.abort(1);
  }
}
