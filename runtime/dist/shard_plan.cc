#include "runtime/dist/shard_plan.h"

#include <string>

#include "runtime/core/error.h"
#include "runtime/core/flat_layout.h"

namespace ampdist {

ShardPlan::ShardPlan(int stage, int rank, int world_size) : stage_(stage), rank_(rank), world_size_(world_size) {
  if (stage < 0 || stage > 1)
    throw Error("ShardPlan: ZeRO stage " + std::to_string(stage) + " (this runtime has stages 0 and 1)");
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error("ShardPlan: rank " + std::to_string(rank) + " of a world of " + std::to_string(world_size));
}

std::vector<int64_t> ShardPlan::slice_counts(int64_t numel) const {
  if (!sharded()) return {};
  return shard_counts(numel, world_size_);
}

}  // namespace ampdist
