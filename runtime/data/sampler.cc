#include "runtime/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/rng.h"

namespace ampdist {

DistributedSampler::DistributedSampler(const SamplerOptions& opt) : opt_(opt) {
  const int64_t n = opt.dataset_size, g = opt.global_batch_size;
  const int64_t w = opt.world_size, a = opt.accumulation_steps;
  // World size and rank come from the launcher, not from the user: a bad one is a bug.
  AMPDIST_CHECK(w >= 1 && opt.rank >= 0 && opt.rank < w,
                "rank " + std::to_string(opt.rank) + " of world size " + std::to_string(w));
  if (n <= 0) throw ConfigInput("data: the training set has no samples");
  // The Fisher-Yates draw (bits * (i + 1)) >> 32 needs i + 1 <= 2^32.
  if (n > (int64_t{1} << 32)) throw ConfigInput("data: the training set has more than 2^32 samples");
  if (a < 1) throw ConfigInput("optimizer.accumulation_steps must be >= 1, got " + std::to_string(a));
  if (g <= 0) throw ConfigInput("data.global_batch_size must be > 0, got " + std::to_string(g));
  if (g % (w * a) != 0)
    throw ConfigInput("data.global_batch_size = " + std::to_string(g) + " is not a multiple of world size " +
                                 std::to_string(w) + " x optimizer.accumulation_steps " + std::to_string(a) +
                                 " = " + std::to_string(w * a));
  if (opt.drop_last && n < g)
    throw ConfigInput("data.global_batch_size = " + std::to_string(g) + " is larger than the training set (" +
                                 std::to_string(n) + " samples) with data.drop_last = true: an epoch has no step");
  micro_ = g / (w * a);
  steps_ = opt.drop_last ? n / g : (n + g - 1) / g;
}

int64_t DistributedSampler::global_samples(int64_t step) const {
  AMPDIST_CHECK(step >= 0 && step < steps_, "step " + std::to_string(step) + " of " + std::to_string(steps_));
  const int64_t g = opt_.global_batch_size;
  return step < opt_.dataset_size / g ? g : opt_.dataset_size % g;
}

void DistributedSampler::indices(int64_t epoch, int64_t step, int micro, std::vector<int64_t>& out) const {
  AMPDIST_CHECK(epoch >= 0, "epoch " + std::to_string(epoch));
  AMPDIST_CHECK(micro >= 0 && micro < opt_.accumulation_steps,
                "micro-batch " + std::to_string(micro) + " of " + std::to_string(opt_.accumulation_steps));
  out.clear();
  const int64_t count = global_samples(step);  // checks step
  const int64_t base = step * opt_.global_batch_size;
  // Positions of this rank's slice of micro-batch `micro` inside the global batch: see the class comment.
  const int64_t first = micro * opt_.world_size * micro_ + opt_.rank * micro_;
  const int64_t last = std::min(first + micro_, count);
  if (opt_.shuffle) permutation(epoch);
  for (int64_t p = first; p < last; ++p) out.push_back(opt_.shuffle ? perm_[base + p] : base + p);
}

// Fisher-Yates (Knuth's Algorithm P) over the counter-based stream keyed by (seed, epoch): draw k picks the swap
// partner of position N-1-k. The multiply-shift maps 32 random bits onto [0, i] (Lemire), with a bias below
// (i + 1) / 2^32 that no training run can see.
void DistributedSampler::permutation(int64_t epoch) const {
  if (cached_epoch_ == epoch) return;
  const int64_t n = opt_.dataset_size;
  perm_.resize(static_cast<size_t>(n));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  const RngStream rng{opt_.seed, {static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32), 0},
                      RngPurpose::kShuffle};
  uint64_t k = 0;
  for (int64_t i = n - 1; i >= 1; --i, ++k) {
    int64_t j = static_cast<int64_t>((uint64_t{rng.bits(k)} * static_cast<uint64_t>(i + 1)) >> 32);
    std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
  }
  cached_epoch_ = epoch;
}

}  // namespace ampdist
