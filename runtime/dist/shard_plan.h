// ShardPlan: how a data-parallel run lays its state over the ranks, decided once at set-up and handed to everything
// that depends on it (the master weights' slice, the Reducer's collective, the step's norm and publish).
//
//   stage 0: every rank holds the whole FP32 master weights and optimizer state; gradients are all-reduced.
//   stage 1 (ZeRO-1; Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
//     SC 2020): rank r holds only the contiguous slice shard_counts(numel, world)[r] of the flat space (master weights,
//     optimizer moments), gradients are reduce-scattered onto the slices, and the updated working copy is
//     all-gathered after every applied step (on a world of one the slice is the whole space, through the same path).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/amp/master_weights.h"

namespace ampdist {

class ShardPlan {
 public:
  // Unsharded, a world of one.
  ShardPlan() = default;
  // stage: the run's ZeRO stage (train/config.h's zero_stage(), from optimizer.zero_stage); world_size >= 1,
  // 0 <= rank < world_size. Throws Error for a stage other than 0 or 1 or an impossible rank.
  ShardPlan(int stage, int rank, int world_size);

  int stage() const { return stage_; }
  bool sharded() const { return stage_ == 1; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // This rank's slice of the master weights: the whole flat space unsharded.
  MasterSlice master_slice() const { return sharded() ? MasterSlice{rank_, world_size_} : MasterSlice{}; }
  // Each rank's slice length of a flat space of `numel` elements, in rank order (shard_counts); empty unsharded.
  std::vector<int64_t> slice_counts(int64_t numel) const;

 private:
  int stage_ = 0, rank_ = 0, world_size_ = 1;
};

}  // namespace ampdist
