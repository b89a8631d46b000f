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

int run_train_command(const TrainArgs& args, MpiCommunicator& comm) {
  RunConfig cfg;
  Device device = Device::kCPU;
  std::unique_ptr<Trainer> trainer;
  PhaseResult setup;
  std::string run_dir, checkpoint_dir, resumed_from, resume_note, resumed_checkpoint;
  std::vector<std::pair<std::string, std::string>> damaged;  // checkpoints --resume auto passed over, and why
  // The directories this run created (rank 0), deepest last: a refusal before training removes them again when
  // nothing but this run's own rank progress files (.ranks/) is in them, so a refused run leaves no trace.
  std::vector<std::filesystem::path> created_dirs;
  const auto refuse = [&](int rc) {
    if (comm.rank() != 0 || created_dirs.empty()) return rc;
    std::error_code ec;
    const std::filesystem::path run = std::filesystem::absolute(run_dir, ec).lexically_normal();
    if (std::find(created_dirs.begin(), created_dirs.end(), run) != created_dirs.end())
      std::filesystem::remove_all(run / ".ranks", ec);
    for (auto it = created_dirs.rbegin(); it != created_dirs.rend(); ++it) std::filesystem::remove(*it, ec);  // if empty
    return rc;
  };
  std::string source = args.config;
  run_phase(setup, source, [&] {
    cfg = parse_config_file(args.config);
    if (!args.precision.empty()) {
      const std::string p = to_upper(args.precision);
      if (p != "FP32" && p != "FP16" && p != "BF16" && p != "AUTO")
        throw BadInput("--precision", "expected fp32, fp16, bf16 or auto, got '" + args.precision + "'");
      apply_override(cfg, "precision.dtype=" + p);
    }
    if (!args.device.empty()) set_command_line_device(cfg, args.device);  // over AMPDIST_DEVICE and device.kind
    for (const std::string& s : args.sets) apply_override(cfg, s);
    if (!args.init_from.empty()) cfg.mutable_model()->set_init_from(args.init_from);
    // Fault drills without editing a config: AMPDIST_FAULT holds a FaultConfig in text format.
    if (const char* faults = std::getenv("AMPDIST_FAULT"); faults && *faults) {
      const RunConfig f = parse_config_text(std::string("fault { ") + faults + " }", "AMPDIST_FAULT");
      cfg.mutable_fault()->MergeFrom(f.fault());
    }
    const bool overridden = !args.sets.empty() || !args.precision.empty();
    if (overridden) source += " (with command-line overrides)";
    validate_config(cfg, source);
    check_init_from(cfg);  // before any collective: every rank refuses a bad model.init_from alike
    if (!args.run_dir.empty()) check_text(args.run_dir, "--run-dir");
    if (!args.resume.empty()) check_text(args.resume, "--resume");
    comm.set_timeout(cfg.comm().timeout_s());
    if (args.dry_run) return;  // no directory: the estimate below needs only the model and the data
    run_dir = !args.run_dir.empty() ? args.run_dir : !cfg.log().dir().empty() ? cfg.log().dir() : "runs/" + cfg.name();
    checkpoint_dir = !cfg.checkpoint().dir().empty() ? cfg.checkpoint().dir() : run_dir + "/checkpoints";
    if (comm.rank() == 0) {
      // Fail now, with exit code 2 on every rank, rather than at the first log line or save.
      const std::pair<std::string, std::string> dirs[] = {
          {run_dir, !args.run_dir.empty() ? "--run-dir" : "log.dir"},
          {checkpoint_dir, !cfg.checkpoint().dir().empty() ? "checkpoint.dir" : "the run directory's checkpoints/"}};
      for (const auto& [dir, field] : dirs) {
        std::error_code ec;
        std::vector<std::filesystem::path> missing;  // dir and its missing ancestors, deepest first
        for (std::filesystem::path p = std::filesystem::absolute(dir, ec).lexically_normal();
             !p.empty() && p != p.root_path() && !std::filesystem::exists(p, ec); p = p.parent_path())
          missing.push_back(p);
        created_dirs.insert(created_dirs.end(), missing.rbegin(), missing.rend());
        std::filesystem::create_directories(dir, ec);
        if (ec || !std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
          throw BadInput(dir, field + ": cannot create or write this directory" + (ec ? ": " + ec.message() : ""));
      }
    }
    device = resolve_device(cfg);
    validate_for_device(cfg, device, source);
  });
  // Everything above is local to each rank (no collective), so a rank that failed cannot leave another waiting.
  if (int rc = agree_on_failure(comm, setup)) return refuse(rc);
  if (args.dry_run) {
    PhaseResult dry;
    run_phase(dry, source, [&] {
      const ModelParts parts = build_model_parts(cfg, comm);
      const MemoryEstimate e = parts.estimate(cfg, comm.world_size());
      const MemoryBudget budget = memory_budget(Device::kCPU, comm.local_size());
      if (comm.rank() == 0) std::cout << describe(e, budget) << std::flush;
      check_memory_fits(e, budget, cfg, comm.world_size());
    });
    return agree_on_failure(comm, dry);
  }

  // Each rank's GPU: the node's ranks gather the GPUs each sees (a collective every rank reaches), and every rank
  // computes the same assignment (comm/device_binding.h), so a node with more ranks than GPUs refuses alike on all.
  const std::vector<std::vector<std::string>> visible = visible_gpus_on_node(comm.comm());
  PhaseResult binding;
  run_phase(binding, source, [&] {
    if (device == Device::kCUDA) bind_device(choose_device(comm.local_rank(), visible, cfg.device().allow_sharing()));
  });
  if (int rc = agree_on_failure(comm, binding)) return refuse(rc);

  // The GPU's communicator (ncclCommInitRank is collective: only once every rank got this far) and the trainer.
  Communicator* train_comm = &comm;
#ifdef AMPDIST_HAVE_CUDA
  std::unique_ptr<NcclCommunicator> nccl;
#endif
  PhaseResult build;
  run_phase(build, source, [&] {
#ifdef AMPDIST_HAVE_CUDA
    if (device == Device::kCUDA) {
      NcclSetupFault fault;
      if (cfg.fault().has_nccl_setup_error()) {
        const NcclSetupError& f = cfg.fault().nccl_setup_error();
        fault.stage = f.stage() == NcclSetupError::UNIQUE_ID ? NcclSetupFault::Stage::kUniqueId
                                                             : NcclSetupFault::Stage::kInit;
        fault.rank = f.rank();
      }
      nccl = std::make_unique<NcclCommunicator>(comm.comm(), cfg.comm().timeout_s(), fault);
      train_comm = nccl.get();
    }
#endif
    trainer = make_trainer(cfg, *train_comm);
  });
  if (int rc = agree_on_failure(comm, build)) return refuse(rc);

  comm.set_progress_dir(run_dir + "/.ranks");
  PhaseResult resume;
  run_phase(resume, source, [&] {
    // One run id for every rank: rank 0's random draw.
    const uint64_t id = comm.allgather_u64(std::random_device{}() * 0x100000000ull + std::random_device{}(),
                                           "run id gather")[0];
    trainer->set_run_id(hex16(id));
    if (!args.resume.empty()) {
      std::optional<std::string> path;
      std::optional<Manifest> loaded;
      if (args.resume == "auto") {
        // Newest first. A checkpoint whose files are not whole, or whose bytes fail their checks on any rank (the
        // load agrees before it changes anything, so it fails alike on every rank), is damaged: passed over with a
        // warning, and moved aside once this run has resumed. A whole checkpoint of another model or optimizer is
        // not damage but a run directory shared by two configs: refused, so that no save of this run replaces it.
        const ResumeScan scan = scan_for_resume(checkpoint_dir);
        damaged = scan.damaged;
        for (const std::string& candidate : scan.candidates) {
          CheckpointState state = trainer->checkpoint_state();
          try {
            loaded = load_checkpoint(comm, candidate, state);
            path = candidate;
            break;
          } catch (const Error& e) {
            if (e.kind() != ErrorKind::kBadInput) throw;
            // Rank 0 reads every byte to tell damage from a mismatch (and which file is damaged, wherever the
            // load found it); every rank follows its verdict.
            const std::vector<std::string> problems =
                comm.rank() == 0 ? verify_checkpoint(candidate) : std::vector<std::string>{};
            if (comm.allgather_u64(problems.empty() ? 1 : 0, "resume verdict gather")[0] == 1)
              throw Error(std::string(e.what()) + "; --resume auto does not pass over a whole checkpoint: resume "
                          "with the config that saved it, or use another --run-dir", ErrorKind::kBadInput);
            damaged.emplace_back(candidate, problems.empty() ? e.what() : problems.front());
          }
        }
      } else {
        path = args.resume;
        CheckpointState state = trainer->checkpoint_state();
        loaded = load_checkpoint(comm, *path, state);
      }
      if (path) {
        const Manifest& m = *loaded;
        resume_note = trainer->restore(m);
        resumed_checkpoint = *path;
        resumed_from = *path + " (step " + std::to_string(m.step()) + ", saved on " + std::to_string(m.world_size()) +
                       " ranks, master weights hash " + hex16(trainer->master_hash()) + ")";
      }
    }
  });
  if (int rc = agree_on_failure(comm, resume)) return refuse(rc);

  // The damaged checkpoints passed over are evidence: out of the way of this run's saves and pruning, intact.
  std::vector<std::string> damaged_lines;
  if (comm.rank() == 0)
    for (const auto& [dir, problem] : damaged) {
      std::string where;
      try {
        where = "moved aside to " + move_aside_damaged(dir) + ", intact";
      } catch (const Error& e) {
        where = std::string("left in place (") + e.what() + "); a save of its step will move it aside";
      }
      damaged_lines.push_back(dir + " is damaged and was passed over: " + problem + "; " + where);
    }

  const bool rank0 = comm.rank() == 0;
  if (rank0) {
    const int64_t params = trainer->masters().numel();
    std::string where = "CPU backend";
    if (device == Device::kCUDA) {
      const device::Properties p = device::properties(device::current_device());
      where = fmt::format("CUDA backend, {} (sm_{}{}) on rank 0", p.name, p.major, p.minor);
    }
    std::cout << fmt::format("ampdist train: {} | world size {} ({}) | {} | {} | {}\n", cfg.name(), comm.world_size(),
                             describe_launcher(), where, dtype_name(trainer->working_dtype()),
                             trainer->scaler().describe());
    std::cout << fmt::format(
        "model: {} parameters, {} gradient buckets, ZeRO stage {} | global batch {} = {} ranks x {} micro-batches x {} "
        "| {} steps ({} per epoch) | run dir {}\n",
        params, trainer->reducer().buckets().size(), zero_stage(cfg), cfg.data().global_batch_size(), comm.world_size(),
        cfg.optimizer().accumulation_steps(), trainer->micro_batch_size(), trainer->total_steps(),
        trainer->steps_per_epoch(), run_dir);
    const std::string mismatch = launcher_mismatch(comm.world_size());
    if (!mismatch.empty()) std::cout << "warning: " << mismatch << "\n";
    for (const std::string& w : lint_model(*trainer)) std::cout << "warning: " << w << "\n";
    const std::string binding = thread_binding_hint(trainer->threads(), kernels::available_cpus());
    if (!binding.empty()) std::cout << "warning: " << binding << "\n";
    for (const std::string& d : damaged_lines) std::cout << "warning: " << d << "\n";
    if (!resumed_from.empty())
      std::cout << "resumed from " << resumed_from << "\n";
    else if (args.resume == "auto")
      std::cout << (damaged.empty() ? "no checkpoint in " : "no undamaged checkpoint in ") << checkpoint_dir
                << ": starting fresh\n";
    if (args.resume.empty()) {
      const ResumeScan earlier = scan_for_resume(checkpoint_dir);
      if (!earlier.candidates.empty())
        std::cout << "warning: " << checkpoint_dir << " already holds checkpoints (newest "
                  << earlier.candidates.front() << ") and this run starts fresh (no --resume): its saves replace "
                  << "those of the same step, and checkpoint.keep_last counts them all\n";
    }
    if (!resume_note.empty()) std::cout << resume_note << "\n";
    std::cout << std::flush;
  }

  try {
    LoopOptions opt;
    opt.run_dir = run_dir;
    opt.out = rank0 ? &std::cout : nullptr;
    // One progress line rewritten in place only for a lone process on a terminal: under mpirun a rank's stdout can
    // be a pty even when the user's is a file, so launched ranks print plain lines.
    opt.tty = rank0 && comm.world_size() == 1 && describe_launcher() == "single process" && isatty(STDOUT_FILENO);
    opt.checkpoint_dir = checkpoint_dir;
    opt.resume_note = resume_note;
    opt.resumed_checkpoint = resumed_checkpoint;
    run_training(*trainer, opt);  // the summary is printed by the loop's console sink
  } catch (const std::exception& e) {
    const Error* err = dynamic_cast<const Error*>(&e);
    if (err && err->collective()) {
      // Every rank stopped here on the same agreed state: one line from rank 0, and every rank exits with the same
      // code once all have arrived (a rank that did not would be named by the watchdog within comm.timeout_s).
      if (comm.rank() == 0) print_error(0, false, e.what());
      int64_t code[1] = {err->exit_code()};
      comm.allreduce_i64(code, ReduceOp::kMax, "error agreement all-reduce");
      trainer.reset();
      return static_cast<int>(code[0]);
    }
    print_error(comm.rank(), comm.world_size() > 1, e.what());
    comm.abort(err ? err->exit_code() : 1);
  }
  trainer.reset();  // before the communicator it uses
  return 0;
}

}  // namespace ampdist
