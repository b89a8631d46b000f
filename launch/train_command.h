// `ampdist train`: builds a trainer from a config and runs it on every rank.
#pragma once

#include <string>
#include <vector>

#include "comm/mpi_communicator.h"

namespace ampdist {

struct TrainArgs {
  std::string config;               // --config FILE
  std::string device;     // --device: cpu, cuda or auto (device.kind)
  std::string precision;            // --precision fp32|fp16|bf16|auto ("" = the config's)
  std::vector<std::string> sets;    // --set field=value, applied in order
  std::string run_dir;              // --run-dir DIR ("" = log.dir or runs/<name>)
  std::string resume;               // --resume auto|PATH ("" = start fresh)
  std::string init_from;            // --init-from PATH (model.init_from; "" = the config's)
  bool dry_run = false;             // --dry-run: print the memory estimate and stop (nothing created or allocated)
};

// Returns the process exit code (0 on success). Errors during set-up (bad input) are agreed on by every rank and
// reported once; errors during training take the job down from the failing rank.
int run_train_command(const TrainArgs& args, MpiCommunicator& comm);

}  // namespace ampdist
