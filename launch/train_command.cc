#include "launch/train_command.h"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <vector>

#include "comm/device_binding.h"
#include "comm/nccl_communicator.h"
#include "launch/rank_env.h"
#include "launch/set_up_phase.h"
#include "runtime/core/device.h"
#include "runtime/kernels/kernels.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/train/config.h"
#include "runtime/train/lint.h"
#include "runtime/train/loop.h"
#include "runtime/train/trainer.h"

namespace ampdist {
namespace {

std::string to_upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

// The config lint (runtime/train/lint.h) on the model as built: input width and classes from the first and last
// parameters ([out, in] weights, [out] biases).
std::vector<std::string> lint_model(Trainer& t) {
  const std::vector<FlatEntry>& ps = t.masters().layout().entries();
  if (ps.empty()) return {};
  const int64_t in = ps.front().shape.size() == 2 ? ps.front().shape[1] : 0;
  const int64_t classes = ps.back().shape[0];
  return lint_config(t.config(), t.working_dtype(), in, classes, t.micro_batch_size());
}

}  // namespace

namespace {

// `ampdist train`, phase by phase. Each phase that can fail on one rank runs under run_phase and ends with every rank
// agreeing on the outcome (launch/set_up_phase.h), so no rank is left waiting in a collective.
class TrainCommand {
 public:
  TrainCommand(const TrainArgs& args, MpiCommunicator& comm) : args_(args), comm_(comm), source_(args.config) {}
  int run();

 private:
  // The config with the command line's overrides, validated; the run and checkpoint directories created (rank 0).
  void set_up();
  // --dry-run: the memory estimate, and whether the run fits.
  int dry_run();
  // This rank's GPU (a collective over the node's ranks), the GPU communicator and the trainer.
  int build();
  // The run id, and --resume: the newest undamaged checkpoint (auto) or the one named.
  void resume();
  // What rank 0 prints before the first step.
  void print_banner(const std::vector<std::string>& damaged_lines);
  int train();
  // A refusal before training: removes the directories this run created (rank 0), when nothing but this run's own
  // rank progress files (.ranks/) is in them, so a refused run leaves no trace.
  int refuse(int rc);

  const TrainArgs& args_;
  MpiCommunicator& comm_;
  std::string source_;
  RunConfig cfg_;
  Device device_ = Device::kCPU;
#ifdef AMPDIST_HAVE_CUDA
  std::unique_ptr<NcclCommunicator> nccl_;  // the GPU's communicator: declared first, so it outlives the trainer
#endif
  std::unique_ptr<Trainer> trainer_;
  std::string run_dir_, checkpoint_dir_, resumed_from_, resume_note_, resumed_checkpoint_;
  std::vector<std::pair<std::string, std::string>> damaged_;  // checkpoints --resume auto passed over, and why
  std::vector<std::filesystem::path> created_dirs_;           // this run's directories (rank 0), deepest last
};

int TrainCommand::refuse(int rc) {
  if (comm_.rank() != 0 || created_dirs_.empty()) return rc;
  std::error_code ec;
  const std::filesystem::path run = std::filesystem::absolute(run_dir_, ec).lexically_normal();
  if (std::find(created_dirs_.begin(), created_dirs_.end(), run) != created_dirs_.end())
    std::filesystem::remove_all(run / ".ranks", ec);
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it)
    std::filesystem::remove(*it, ec);  // only if empty
  return rc;
}

void TrainCommand::set_up() {
  cfg_ = parse_config_file(args_.config);
  if (!args_.precision.empty()) {
    const std::string p = to_upper(args_.precision);
    if (p != "FP32" && p != "FP16" && p != "BF16" && p != "AUTO")
      throw BadInput("--precision", "expected fp32, fp16, bf16 or auto, got '" + args_.precision + "'");
    apply_override(cfg_, "precision.dtype=" + p);
  }
  if (!args_.device.empty()) set_command_line_device(cfg_, args_.device);  // over AMPDIST_DEVICE and device.kind
  for (const std::string& s : args_.sets) apply_override(cfg_, s);
  if (!args_.init_from.empty()) cfg_.mutable_model()->set_init_from(args_.init_from);
  // Fault drills without editing a config: AMPDIST_FAULT holds a FaultConfig in text format.
  if (const char* faults = std::getenv("AMPDIST_FAULT"); faults && *faults) {
    const RunConfig f = parse_config_text(std::string("fault { ") + faults + " }", "AMPDIST_FAULT");
    cfg_.mutable_fault()->MergeFrom(f.fault());
  }
  const bool overridden = !args_.sets.empty() || !args_.precision.empty();
  if (overridden) source_ += " (with command-line overrides)";
  validate_config(cfg_, source_);
  check_init_from(cfg_);  // before any collective: every rank refuses a bad model.init_from alike
  if (!args_.run_dir.empty()) check_text(args_.run_dir, "--run-dir");
  if (!args_.resume.empty()) check_text(args_.resume, "--resume");
  comm_.set_timeout(cfg_.comm().timeout_s());
  if (args_.dry_run) return;  // no directory: the estimate below needs only the model and the data
  run_dir_ = !args_.run_dir.empty()      ? args_.run_dir
             : !cfg_.log().dir().empty() ? cfg_.log().dir()
                                         : "runs/" + cfg_.name();
  checkpoint_dir_ = !cfg_.checkpoint().dir().empty() ? cfg_.checkpoint().dir() : run_dir_ + "/checkpoints";
  if (comm_.rank() == 0) {
    // Fail now, with exit code 2 on every rank, rather than at the first log line or save.
    const std::pair<std::string, std::string> dirs[] = {
        {run_dir_, !args_.run_dir.empty() ? "--run-dir" : "log.dir"},
        {checkpoint_dir_, !cfg_.checkpoint().dir().empty() ? "checkpoint.dir" : "the run directory's checkpoints/"}};
    for (const auto& [dir, field] : dirs) {
      std::error_code ec;
      std::vector<std::filesystem::path> missing;  // dir and its missing ancestors, deepest first
      for (std::filesystem::path p = std::filesystem::absolute(dir, ec).lexically_normal();
           !p.empty() && p != p.root_path() && !std::filesystem::exists(p, ec); p = p.parent_path())
        missing.push_back(p);
      created_dirs_.insert(created_dirs_.end(), missing.rbegin(), missing.rend());
      std::filesystem::create_directories(dir, ec);
      if (ec || !std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
        throw BadInput(dir, field + ": cannot create or write this directory" + (ec ? ": " + ec.message() : ""));
    }
  }
  device_ = resolve_device(cfg_);
  validate_for_device(cfg_, device_, source_);
}

int TrainCommand::dry_run() {
  PhaseResult dry;
  run_phase(dry, source_, [&] {
    const ModelParts parts = build_model_parts(cfg_, comm_);
    const MemoryEstimate e = parts.estimate(cfg_, comm_.world_size());
    const MemoryBudget budget = memory_budget(Device::kCPU, comm_.local_size());
    if (comm_.rank() == 0) std::cout << describe(e, budget) << std::flush;
    check_memory_fits(e, budget, cfg_, comm_.world_size());
  });
  return agree_on_failure(comm_, dry);
}

int TrainCommand::build() {
  // Each rank's GPU: the node's ranks gather the GPUs each sees (a collective every rank reaches), and every rank
  // computes the same assignment (comm/device_binding.h), so a node with more ranks than GPUs refuses alike on all.
  const std::vector<std::vector<std::string>> visible = visible_gpus_on_node(comm_.comm());
  PhaseResult binding;
  run_phase(binding, source_, [&] {
    if (device_ == Device::kCUDA)
      bind_device(choose_device(comm_.local_rank(), visible, cfg_.device().allow_sharing()));
  });
  if (int rc = agree_on_failure(comm_, binding)) return rc;

  // The GPU's communicator (ncclCommInitRank is collective: only once every rank got this far) and the trainer.
  Communicator* train_comm = &comm_;
  PhaseResult build;
  run_phase(build, source_, [&] {
#ifdef AMPDIST_HAVE_CUDA
    if (device_ == Device::kCUDA) {
      NcclSetupFault fault;
      if (cfg_.fault().has_nccl_setup_error()) {
        const NcclSetupError& f = cfg_.fault().nccl_setup_error();
        fault.stage = f.stage() == NcclSetupError::UNIQUE_ID ? NcclSetupFault::Stage::kUniqueId
                                                             : NcclSetupFault::Stage::kInit;
        fault.rank = f.rank();
      }
      nccl_ = std::make_unique<NcclCommunicator>(comm_.comm(), cfg_.comm().timeout_s(), fault);
      train_comm = nccl_.get();
    }
#endif
    trainer_ = make_trainer(cfg_, *train_comm);
  });
  return agree_on_failure(comm_, build);
}

void TrainCommand::resume() {
  // One run id for every rank: rank 0's random draw.
  const uint64_t id = comm_.allgather_u64(std::random_device{}() * 0x100000000ull + std::random_device{}(),
                                         "run id gather")[0];
  trainer_->set_run_id(hex16(id));
  if (!args_.resume.empty()) {
    std::optional<std::string> path;
    std::optional<Manifest> loaded;
    if (args_.resume == "auto") {
      // Newest first. A checkpoint whose files are not whole, or whose bytes fail their checks on any rank (the
      // load agrees before it changes anything, so it fails alike on every rank), is damaged: passed over with a
      // warning, and moved aside once this run has resumed. A whole checkpoint of another model or optimizer is
      // not damage but a run directory shared by two configs: refused, so that no save of this run replaces it.
      const ResumeScan scan = scan_for_resume(checkpoint_dir_);
      damaged_ = scan.damaged;
      for (const std::string& candidate : scan.candidates) {
        CheckpointState state = trainer_->checkpoint_state();
        try {
          loaded = load_checkpoint(comm_, candidate, state);
          path = candidate;
          break;
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kBadInput) throw;
          // Rank 0 reads every byte to tell damage from a mismatch (and which file is damaged, wherever the
          // load found it); every rank follows its verdict.
          const std::vector<std::string> problems =
              comm_.rank() == 0 ? verify_checkpoint(candidate) : std::vector<std::string>{};
          if (comm_.allgather_u64(problems.empty() ? 1 : 0, "resume verdict gather")[0] == 1)
            throw Error(std::string(e.what()) + "; --resume auto does not pass over a whole checkpoint: resume "
                        "with the config that saved it, or use another --run-dir", ErrorKind::kBadInput);
          damaged_.emplace_back(candidate, problems.empty() ? e.what() : problems.front());
        }
      }
    } else {
      path = args_.resume;
      CheckpointState state = trainer_->checkpoint_state();
      loaded = load_checkpoint(comm_, *path, state);
    }
    if (path) {
      const Manifest& m = *loaded;
      resume_note_ = trainer_->restore(m);
      resumed_checkpoint_ = *path;
      resumed_from_ = *path + " (step " + std::to_string(m.step()) + ", saved on " + std::to_string(m.world_size()) +
                     " ranks, master weights hash " + hex16(trainer_->master_hash()) + ")";
    }
  }
}

void TrainCommand::print_banner(const std::vector<std::string>& damaged_lines) {
  const int64_t params = trainer_->masters().numel();
  std::string where = "CPU backend";
  if (device_ == Device::kCUDA) {
    const device::Properties p = device::properties(device::current_device());
    where = fmt::format("CUDA backend, {} (sm_{}{}) on rank 0", p.name, p.major, p.minor);
  }
  std::cout << fmt::format("ampdist train: {} | world size {} ({}) | {} | {} | {}\n", cfg_.name(), comm_.world_size(),
                           describe_launcher(), where, dtype_name(trainer_->working_dtype()),
                           trainer_->scaler().describe());
  std::cout << fmt::format(
      "model: {} parameters, {} gradient buckets, ZeRO stage {} | global batch {} = {} ranks x {} micro-batches x {} "
      "| {} steps ({} per epoch) | run dir {}\n",
      params, trainer_->reducer().buckets().size(), zero_stage(cfg_), cfg_.data().global_batch_size(),
      comm_.world_size(),
      cfg_.optimizer().accumulation_steps(), trainer_->micro_batch_size(), trainer_->total_steps(),
      trainer_->steps_per_epoch(), run_dir_);
  const std::string mismatch = launcher_mismatch(comm_.world_size());
  if (!mismatch.empty()) std::cout << "warning: " << mismatch << "\n";
  for (const std::string& w : lint_model(*trainer_)) std::cout << "warning: " << w << "\n";
  const std::string binding = thread_binding_hint(trainer_->threads(), kernels::available_cpus());
  if (!binding.empty()) std::cout << "warning: " << binding << "\n";
  for (const std::string& d : damaged_lines) std::cout << "warning: " << d << "\n";
  if (!resumed_from_.empty())
    std::cout << "resumed from " << resumed_from_ << "\n";
  else if (args_.resume == "auto")
    std::cout << (damaged_.empty() ? "no checkpoint in " : "no undamaged checkpoint in ") << checkpoint_dir_
              << ": starting fresh\n";
  if (args_.resume.empty()) {
    const ResumeScan earlier = scan_for_resume(checkpoint_dir_);
    if (!earlier.candidates.empty())
      std::cout << "warning: " << checkpoint_dir_ << " already holds checkpoints (newest "
                << earlier.candidates.front() << ") and this run starts fresh (no --resume): its saves replace "
                << "those of the same step, and checkpoint.keep_last counts them all\n";
  }
  if (!resume_note_.empty()) std::cout << resume_note_ << "\n";
  std::cout << std::flush;
}

int TrainCommand::train() {
  const bool rank0 = comm_.rank() == 0;
  try {
    LoopOptions opt;
    opt.run_dir = run_dir_;
    opt.out = rank0 ? &std::cout : nullptr;
    // One progress line rewritten in place only for a lone process on a terminal: under mpirun a rank's stdout can
    // be a pty even when the user's is a file, so launched ranks print plain lines.
    opt.tty = rank0 && comm_.world_size() == 1 && describe_launcher() == "single process" && isatty(STDOUT_FILENO);
    opt.checkpoint_dir = checkpoint_dir_;
    opt.resume_note = resume_note_;
    opt.resumed_checkpoint = resumed_checkpoint_;
    run_training(*trainer_, opt);  // the summary is printed by the loop's console sink
  } catch (const std::exception& e) {
    const Error* err = dynamic_cast<const Error*>(&e);
    if (err && err->collective()) {
      // Every rank stopped here on the same agreed state: one line from rank 0, and every rank exits with the same
      // code once all have arrived (a rank that did not would be named by the watchdog within comm.timeout_s).
      if (comm_.rank() == 0) print_error(0, false, e.what());
      int64_t code[1] = {err->exit_code()};
      comm_.allreduce_i64(code, ReduceOp::kMax, "error agreement all-reduce");
      trainer_.reset();
      return static_cast<int>(code[0]);
    }
    print_error(comm_.rank(), comm_.world_size() > 1, e.what());
    comm_.abort(err ? err->exit_code() : 1);
  }
  trainer_.reset();  // before the communicator it uses
  return 0;
}

int TrainCommand::run() {
  PhaseResult setup;
  run_phase(setup, source_, [&] { set_up(); });
  // Everything in set_up is local to each rank (no collective), so a rank that failed cannot leave another waiting.
  if (int rc = agree_on_failure(comm_, setup)) return refuse(rc);
  if (args_.dry_run) return dry_run();
  if (int rc = build()) return refuse(rc);
  comm_.set_progress_dir(run_dir_ + "/.ranks");
  PhaseResult resumed;
  run_phase(resumed, source_, [&] { resume(); });
  if (int rc = agree_on_failure(comm_, resumed)) return refuse(rc);
  // The damaged checkpoints passed over are evidence: out of the way of this run's saves and pruning, intact.
  std::vector<std::string> damaged_lines;
  if (comm_.rank() == 0)
    for (const auto& [dir, problem] : damaged_) {
      std::string where;
      try {
        where = "moved aside to " + move_aside_damaged(dir) + ", intact";
      } catch (const Error& e) {
        where = std::string("left in place (") + e.what() + "); a save of its step will move it aside";
      }
      damaged_lines.push_back(dir + " is damaged and was passed over: " + problem + "; " + where);
    }
  if (comm_.rank() == 0) print_banner(damaged_lines);
  return train();
}

}  // namespace

int run_train_command(const TrainArgs& args, MpiCommunicator& comm) { return TrainCommand(args, comm).run(); }

}  // namespace ampdist
