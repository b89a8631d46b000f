// DistributedSampler: which samples each rank reads in each micro-batch of each optimizer step.
//
// Each epoch is a permutation of [0, N) (a Fisher-Yates shuffle driven by the counter-based RNG keyed by
// (seed, epoch), or the identity without shuffle), identical on every rank. Step s of the epoch takes the global
// batch perm[s*G, (s+1)*G), G = global_batch_size. Position p inside that global batch belongs to micro-batch
// p / (W*M) and, within it, to rank (p % (W*M)) / M, where W = world size and M = micro-batch size = G / (W*A) for
// A accumulation steps. So the same samples make up each optimizer step for every world size and accumulation:
// only who computes which part changes.
//
// Every rank gets the same number of steps per epoch, also when the epoch does not split evenly: with drop_last the N % G tail is dropped;
// without it the tail is one last, smaller step whose positions are laid out by the same rule (later micro-batches
// and higher ranks may be short or empty), and every rank knows that step's global sample count.
#pragma once

#include <cstdint>
#include <vector>

namespace ampdist {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int64_t global_batch_size = 0;  // G
  int world_size = 1;             // W
  int rank = 0;
  int accumulation_steps = 1;     // A
  bool drop_last = true;
  bool shuffle = true;
  uint64_t seed = 0;
};

class DistributedSampler {
 public:
  // Throws Error (bad input) when G is not a multiple of W*A (naming data.global_batch_size) or the dataset has
  // fewer samples than one global batch with drop_last.
  explicit DistributedSampler(const SamplerOptions& opt);

  const SamplerOptions& options() const { return opt_; }
  int64_t micro_batch_size() const { return micro_; }
  int64_t steps_per_epoch() const { return steps_; }
  // Samples in global step `step` of any epoch summed over all ranks and micro-batches (G, or the tail's size).
  int64_t global_samples(int64_t step) const;
  // Dataset indices of micro-batch `micro` of this rank in step `step` of epoch `epoch` (0-based). At most M,
  // possibly empty for the tail step. Not thread-safe: it caches the epoch's permutation (O(N) to rebuild), so
  // one thread at a time may call it (the Loader's prefetch thread, while a Loader owns the sampler).
  void indices(int64_t epoch, int64_t step, int micro, std::vector<int64_t>& out) const;

 private:
  void permutation(int64_t epoch) const;

  SamplerOptions opt_;
  int64_t micro_ = 0, steps_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace ampdist
