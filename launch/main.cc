// The `ampdist` program: `ampdist train --config run.pbtxt`, alone, under mpirun or under srun.
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <iostream>
#include <thread>

#include "comm/bootstrap.h"
#include "comm/mpi_communicator.h"
#include "launch/bench_command.h"
#include "launch/ckpt_command.h"
#include "launch/env_command.h"
#include "launch/rank_env.h"
#include "launch/report_command.h"
#include "launch/generate_command.h"
#include "launch/prepare_text_command.h"
#include "launch/train_command.h"
#include "runtime/train/loop.h"  // stop_signal_notice
#include "runtime/train/trainer.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/kernels/cpu/isa.h"

namespace {

// SIGTERM and SIGUSR1 (SLURM's warning before a time limit, a requeue, mpirun passing on a kill) are taken by one
// thread in sigwait, never by an arbitrary thread: blocked in every thread from the start of main, before MPI_Init,
// so that MPI's own threads and every later one inherit the mask. A signal that lands on a thread inside MPI,
// oneDNN or the allocator interrupts whatever system call that thread is in; one such stop ended in a corrupted heap
// ("corrupted size vs. prev_size" in MPI_Iallreduce's realloc, 1 run in 40 under MALLOC_CHECK_=3). While a training
// or benchmark loop runs, a signal asks every rank to save and stop at the next step boundary; before that (set-up,
// the ckpt and report tools) it ends the process with the signal's default action, as without this thread.
std::atomic<bool> g_stop_armed{false};
std::atomic<int> g_rank{-1};  // this process's rank in MPI_COMM_WORLD, once known
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}
void take_stop_signals() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A forked child (an MPI helper) starts with the mask a fresh process has.
  pthread_atfork(nullptr, nullptr, [] {
    const sigset_t s = stop_signals();
    pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  });
  std::thread([] {
    const sigset_t wait_set = stop_signals();
    for (;;) {
      int sig = 0;
      if (sigwait(&wait_set, &sig) != 0) continue;
      if (g_stop_armed.load()) {
        ampdist::stop_request().store(true);
        // Said at once: mpirun ends its ranks about a second after passing a SIGTERM on, often before the
        // stop-save is done, and nothing else would say why the job ended.
        if (g_rank.load() == 0) {
          const std::string notice = ampdist::stop_signal_notice(sig == SIGTERM ? "SIGTERM" : "SIGUSR1");
          if (!notice.empty()) {
            const std::string line = "ampdist: " + notice + "\n";
            [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
          }
        }
        continue;
      }
      std::signal(sig, SIG_DFL);  // not training: the default action (terminate), on this thread
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      raise(sig);
    }
  }).detach();
}

// Every subcommand's arguments and its CLI11 App (set by add_commands).
struct Commands {
  ampdist::TrainArgs train;
  ampdist::CkptArgs ckpt;
  ampdist::EnvArgs env;
  ampdist::ReportArgs report;
  ampdist::BenchArgs bench;
  ampdist::PrepareTextArgs prep;
  ampdist::GenerateArgs gen;
  CLI::App *train_cmd = nullptr, *ckpt_cmd = nullptr, *inspect_cmd = nullptr, *verify_cmd = nullptr,
           *export_cmd = nullptr, *env_cmd = nullptr, *report_cmd = nullptr, *bench_cmd = nullptr,
           *prep_cmd = nullptr, *gen_cmd = nullptr;
};

constexpr const char* kPathHelp = "a checkpoint directory (step_XXXXXXXX) or a run's checkpoint directory (its newest)";

void add_train_command(CLI::App& app, Commands& c) {
  ampdist::TrainArgs& train = c.train;
  CLI::App* train_cmd = c.train_cmd = app.add_subcommand("train", "train a model from a config");
  train_cmd->add_option("--config", train.config, "run config, protobuf text format (.pbtxt)")->required();
  train_cmd->add_option("--precision", train.precision, "override precision.dtype: fp32, fp16, bf16 or auto");
  train_cmd->add_option("--device", train.device, "override device.kind: cpu, cuda or auto (default: auto)");
  train_cmd->add_option("--set", train.sets, "override one field, e.g. --set optimizer.lr=0.05 (repeatable)");
  train_cmd->add_option("--run-dir", train.run_dir, "directory for metrics.jsonl (default: log.dir or runs/<name>)");
  train_cmd->add_flag("--dry-run", train.dry_run,
                      "check the config, print the memory estimate per rank and the memory this rank may use, and exit "
                      "without creating or allocating anything (exit 2 when the run would not fit)");
  train_cmd->add_option("--resume", train.resume,
                        "auto: continue from the newest complete checkpoint in the checkpoint directory (or start "
                        "fresh when there is none); PATH: from that checkpoint");
  train_cmd->add_option("--init-from", train.init_from,
                        "initial weights from a safetensors file or a Hugging Face model directory (model.init_from)");
}

// `ampdist ckpt ...`: single-process tools, no communicator (under mpirun, rank 0 works and all exit alike).
void add_ckpt_command(CLI::App& app, Commands& c) {
  ampdist::CkptArgs& ckpt = c.ckpt;
  CLI::App* ckpt_cmd = c.ckpt_cmd = app.add_subcommand("ckpt", "inspect, verify or export a checkpoint");
  ckpt_cmd->require_subcommand(1);
  CLI::App* inspect_cmd = c.inspect_cmd =
      ckpt_cmd->add_subcommand("inspect", "print what a checkpoint's manifest says");
  inspect_cmd->add_option("path", ckpt.path, kPathHelp)->required();
  CLI::App* verify_cmd = c.verify_cmd =
      ckpt_cmd->add_subcommand("verify", "read and check every file of a checkpoint");
  verify_cmd->add_option("path", ckpt.path, "a checkpoint directory, or a directory of them (each is checked)")
      ->required();
  CLI::App* export_cmd = c.export_cmd =
      ckpt_cmd->add_subcommand("export", "write the FP32 master weights by tensor name");
  export_cmd->add_option("path", ckpt.path, kPathHelp)->required();
  export_cmd->add_option("--format", ckpt.format,
                         "safetensors (the default: one file, ampdist's names) or hf (a Hugging Face GPT-2 directory)");
  export_cmd->add_option("-o,--output", ckpt.output,
                         "output file, or directory for hf (written to a .tmp sibling, then renamed)")->required();
}

// env, report, bench, prepare-text and generate.
void add_tool_commands(CLI::App& app, Commands& c) {
  ampdist::EnvArgs& env = c.env;
  CLI::App* env_cmd = c.env_cmd =
      app.add_subcommand("env", "print ranks, hosts, devices, library versions and network interfaces");
  env_cmd->add_flag("--json", env.json, "one JSON object instead of the report");
  // `ampdist report RUN_DIR... -o FILE`: single-process, like ckpt.
  ampdist::ReportArgs& report = c.report;
  CLI::App* report_cmd = c.report_cmd =
      app.add_subcommand("report", "lay runs side by side in one self-contained HTML page");
  report_cmd->add_option("run_dirs", report.run_dirs, "run directories (each with a metrics.jsonl)")->required();
  report_cmd->add_option("-o,--output", report.output, "the HTML file to write")->required();

  // `ampdist bench --config X`: fixed steps on synthetic data, alone or under mpirun.
  ampdist::BenchArgs& bench = c.bench;
  CLI::App* bench_cmd = c.bench_cmd =
      app.add_subcommand("bench", "time a config's steps on synthetic data, phase by phase");
  bench_cmd->add_option("--config", bench.config, "run config, protobuf text format (.pbtxt)")->required();
  bench_cmd->add_option("--precision", bench.precision, "override precision.dtype: fp32, fp16, bf16 or auto");
  bench_cmd->add_option("--set", bench.sets, "override one field (repeatable)");
  bench_cmd->add_option("--steps", bench.steps, "measured optimizer steps (default 200)");
  bench_cmd->add_option("--warmup", bench.warmup, "unmeasured steps first (default 20)");
  // `ampdist prepare-text` and `ampdist generate`: single-process tools for the gpt model.
  ampdist::PrepareTextArgs& prep = c.prep;
  CLI::App* prep_cmd = c.prep_cmd =
      app.add_subcommand("prepare-text", "byte-level token files (train/val) from text files");
  prep_cmd->add_option("paths", prep.paths, "text files or directories (e.g. /usr/share/games/fortunes)")
      ->required();
  prep_cmd->add_option("--out", prep.out, "output directory for train.bin and val.bin")->required();
  prep_cmd->add_option("--val-fraction", prep.val_fraction, "share of documents for validation (default 0.1)");
  ampdist::GenerateArgs& gen = c.gen;
  CLI::App* gen_cmd = c.gen_cmd = app.add_subcommand("generate", "sample text from a gpt checkpoint");
  gen_cmd->add_option("--checkpoint", gen.checkpoint, kPathHelp)->required();
  gen_cmd->add_option("--prompt", gen.prompt, "text to continue (default: empty)");
  gen_cmd->add_option("--prompt-ids", gen.prompt_ids,
                      "token ids to continue, comma-separated (a model whose vocabulary is not bytes)");
  gen_cmd->add_option("--kv-cache", gen.kv_cache, "on (default) or off: recompute the whole window for each token");
  gen_cmd->add_flag("--timing", gen.timing, "print the time per generated token to stderr");
  gen_cmd->add_option("--tokens", gen.tokens, "tokens (bytes) to generate (default 200)");
  gen_cmd->add_option("--temperature", gen.temperature, "softmax temperature; 0 = greedy (default 0.8)");
  gen_cmd->add_option("--top-k", gen.top_k, "sample among the k most likely tokens; 0 = all (default 40)");
  gen_cmd->add_option("--seed", gen.seed, "sampling seed (default 1)");
  gen_cmd->add_option("--precision", gen.precision, "working dtype fp32, fp16 or bf16 (default: the checkpoint's)");
  gen_cmd->add_option("--device", gen.device, "cpu, cuda or auto (default: AMPDIST_DEVICE, else auto)");

}

// CLI11 answers a misspelt subcommand ("ampdist trian") with only "A subcommand is required": name the word and the
// choices instead, at every level that takes a subcommand (ampdist, ampdist ckpt). Returns 2 after printing that
// line (rank 0), or 0 when every word names a subcommand.
int check_subcommand_words(CLI::App& app, int argc, char** argv, int rank) {
  CLI::App* level = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const std::vector<CLI::App*> subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) break;
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subs) {
      if (sub->get_name() == argv[i]) next = sub;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!next) {
      const std::string parent = level == &app ? "ampdist" : "ampdist " + level->get_name();
      if (rank == 0)
        std::fprintf(stderr, "ampdist: error: %s: unknown command '%s' (expected one of: %s; see %s --help)\n",
                     parent.c_str(), argv[i], names.c_str(), parent.c_str());
      return 2;
    }
    level = next;
  }
  return 0;
}

// The single-process tools: rank 0 works, every rank exits with its code. -1: not one of them.
int run_tool(const Commands& c, int rank) {
  int code = 0;
  if (c.prep_cmd->parsed() || c.gen_cmd->parsed()) {
    if (rank == 0) code = c.prep_cmd->parsed() ? ampdist::run_prepare_text(c.prep) : ampdist::run_generate(c.gen);
  } else if (c.ckpt_cmd->parsed()) {
    if (rank == 0) {
      if (c.inspect_cmd->parsed()) code = ampdist::run_ckpt_inspect(c.ckpt);
      if (c.verify_cmd->parsed()) code = ampdist::run_ckpt_verify(c.ckpt);
      if (c.export_cmd->parsed()) code = ampdist::run_ckpt_export(c.ckpt);
    }
  } else if (c.report_cmd->parsed()) {
    code = rank == 0 ? ampdist::run_report_command(c.report) : 0;
  } else {
    return -1;
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  take_stop_signals();
  // The launcher's variables as it set them: MPI_Init may add its own.
  const ampdist::LauncherEnv launcher = ampdist::read_launcher_env();
  std::unique_ptr<ampdist::MpiRuntime> mpi;
  try {
    mpi = std::make_unique<ampdist::MpiRuntime>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  g_rank.store(rank);
  // AMPDIST_STARTUP_TRACE=1: one line per rank once MPI is up, so that a rank that dies inside MPI_Init (a launcher's
  // or MPI library's start-up failure, before any ampdist code runs) can be told from a failure of ampdist itself.
  if (const char* trace = std::getenv("AMPDIST_STARTUP_TRACE"); trace && std::string(trace) == "1")
    std::fprintf(stderr, "ampdist: [rank %d] MPI_Init done\n", rank);

  CLI::App app{"ampdist: data-parallel mixed-precision training", "ampdist"};
  app.require_subcommand(1);
  Commands c;
  add_train_command(app, c);
  add_ckpt_command(app, c);
  add_tool_commands(app, c);
  if (const int code = check_subcommand_words(app, argc, argv, rank)) return code;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (rank == 0) std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    // Every rank sees the same command line: one line from rank 0, exit code 2 everywhere.
    if (rank == 0) std::fprintf(stderr, "ampdist: error: %s (see ampdist --help)\n", e.what());
    return 2;
  }

  // Every rank checks its launcher's variables against MPI; the lowest disagreeing rank prints one line and every
  // rank exits with code 2 (a mis-launched job stops before any work, instead of training N copies or hanging).
  const ampdist::MpiPlacement placement = ampdist::mpi_placement(MPI_COMM_WORLD);
  if (!c.ckpt_cmd->parsed()) {
    const std::string mismatch = ampdist::check_rank_env(launcher, placement);
    int first_bad = mismatch.empty() ? placement.world_size : placement.rank;
    MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first_bad < placement.world_size) {
      if (first_bad == placement.rank) std::fprintf(stderr, "ampdist: error: %s\n", mismatch.c_str());
      return 2;
    }
  }
  // AMPDIST_MAX_CPU_ISA and AMPDIST_CKPT_DIRECT_IO are read here, before any kernel runs or any checkpoint is
  // touched: a bad value is bad input (one line, exit 2) on every rank alike, as every rank of a job sees the same
  // environment.
  try {
    ampdist::kernels::cpu::isa::max_class();
    ampdist::checkpoint_direct_io();
  } catch (const ampdist::Error& e) {
    if (rank == 0) std::fprintf(stderr, "ampdist: error: %s\n", e.what());
    return e.exit_code();
  }
  if (c.env_cmd->parsed()) return ampdist::run_env_command(c.env, launcher, placement);
  if (const int code = run_tool(c, rank); code >= 0) return code;

  // SLURM sends SIGUSR1 (--signal) or SIGTERM before a time limit: every rank saves at the next step boundary.
  g_stop_armed.store(true);

  int code = 0;
  try {
    ampdist::MpiCommunicator comm(MPI_COMM_WORLD);
    if (c.train_cmd->parsed()) code = ampdist::run_train_command(c.train, comm);
    if (c.bench_cmd->parsed()) code = ampdist::run_bench_command(c.bench, comm);
  } catch (const ampdist::Error& e) {
    std::fprintf(stderr, "ampdist: error: [rank %d] %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampdist: error: [rank %d] %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return code;
}
