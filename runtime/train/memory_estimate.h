// What one rank of a run needs in memory, estimated from the config and the (not yet allocated) model at set-up,
// and what the process may use; a run that cannot fit is refused before anything large is allocated.
//
// The estimate (bytes per rank): the FP32 master weights (4 P for P parameters; under ZeRO-1 the rank's slice) and
// FP32 gradients (4 P), the 16-bit working copy (2 P under fp16/bf16), the optimizer state (AdamW: two FP32 moments,
// 8 P; SGD with momentum: 4 P; a slice of it under ZeRO-1), and the activations the model keeps
// (Module::activation_bytes): one training micro-batch's forward and backward buffers, and the evaluation batch's
// forward buffers where they are larger than the training forward's (the same buffers grow to the larger size).
// The process, libraries and data are not counted: the estimate is a floor, so a refusal is never wrong about a run
// that would have fit.
#pragma once

#include <cstdint>
#include <string>

#include "ampdist/config.pb.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/nn/module.h"

namespace ampdist {

// The evaluation batch per rank: data.eval_batch_size, or (0, the default) the training micro-batch
// global_batch_size / (world_size * accumulation_steps), so that evaluation never needs more activation memory than
// a training step's forward.
int64_t eval_batch_size(const RunConfig& cfg, int world_size);

struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t micro_batch = 0, eval_batch = 0;
  int64_t master_bytes = 0, grad_bytes = 0, working_bytes = 0, optimizer_bytes = 0;
  int64_t train_activation_bytes = 0;  // a micro-batch's forward and backward
  int64_t eval_extra_bytes = 0;        // the evaluation forward beyond the training forward (0 when smaller)
  int64_t state_bytes() const { return master_bytes + grad_bytes + working_bytes + optimizer_bytes; }
  int64_t total_bytes() const { return state_bytes() + train_activation_bytes + eval_extra_bytes; }
};

// sample_shape: one input sample's shape as the loader delivers it (e.g. {784}, {seq_len + 3}). Nothing is allocated.
MemoryEstimate estimate_memory(const RunConfig& cfg, const Module& model, int64_t parameters,
                               const Shape& sample_shape, DType working, int world_size);

// What this rank may use: the smallest of the cgroup's memory limit (v2 memory.max, or v1 memory.limit_in_bytes)
// and the physical memory, each shared by the `ranks_on_node` ranks of this node, and the address-space limit
// (ulimit -v) of this process. On the GPU: the device's total memory. `what` names the limit that binds.
struct MemoryBudget {
  int64_t bytes = 0;  // 0: unknown (nothing is refused)
  std::string what;
};
MemoryBudget memory_budget(Device device, int ranks_on_node);

// Throws Error (bad input, exit 2) when the estimate exceeds the budget: one line with both sizes and the config
// field to change (the largest part of the estimate decides which).
void check_memory_fits(const MemoryEstimate& e, const MemoryBudget& budget, const RunConfig& cfg, int world_size);

// "1.95 GiB"
std::string gib(int64_t bytes);
// The estimate in a few lines, for `ampdist train --dry-run`.
std::string describe(const MemoryEstimate& e, const MemoryBudget& budget);

}  // namespace ampdist
