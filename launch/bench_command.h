// `ampdist bench --config X`: the config's model, precision, optimizer and world size on synthetic data of the
// same shape, for a fixed number of steps after warm-up; prints samples/s, the per-phase breakdown of a step
// (runtime/obs/phase_timer.h) and the model FLOP utilisation (n/a on the CPU backend, which has no peak to compare
// with). Runs alone or under mpirun; nothing is written to disk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"

namespace ampdist {

struct BenchArgs {
  std::string config;             // --config FILE
  std::string precision;          // --precision fp32|fp16|bf16|auto ("" = the config's)
  std::vector<std::string> sets;  // --set field=value
  int64_t steps = 200;            // --steps: measured optimizer steps
  int64_t warmup = 20;            // --warmup: steps run first and not measured (buffers sized, caches warm)
};

// Returns the exit code; bad input (config, arguments) is one line on rank 0 and exit code 2 on every rank.
int run_bench_command(const BenchArgs& args, MpiCommunicator& comm);

}  // namespace ampdist
