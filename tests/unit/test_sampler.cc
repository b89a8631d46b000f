// DistributedSampler: the same samples make each optimizer step for every world size and accumulation; every rank
// has the same number of steps; epochs are permutations.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/sampler.h"

namespace ampdist {
namespace {

SamplerOptions options(int64_t n, int64_t g, int world, int rank, int accum, bool drop_last, bool shuffle = true,
                       uint64_t seed = 1234) {
  return {.dataset_size = n, .global_batch_size = g, .world_size = world, .rank = rank, .accumulation_steps = accum,
          .drop_last = drop_last, .shuffle = shuffle, .seed = seed};
}

std::vector<int64_t> indices(const DistributedSampler& s, int64_t epoch, int64_t step, int micro) {
  std::vector<int64_t> out;
  s.indices(epoch, step, micro, out);
  return out;
}

// The whole epoch as world 1, accumulation 1 sees it: step s is perm[s*G, s*G + global_samples(s)).
std::vector<int64_t> reference_epoch(const SamplerOptions& like, int64_t epoch) {
  SamplerOptions o = like;
  o.world_size = 1;
  o.rank = 0;
  o.accumulation_steps = 1;
  DistributedSampler ref(o);
  std::vector<int64_t> all;
  for (int64_t s = 0; s < ref.steps_per_epoch(); ++s) {
    std::vector<int64_t> step = indices(ref, epoch, s, 0);
    EXPECT_EQ(static_cast<int64_t>(step.size()), ref.global_samples(s));
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

void expect_bad_input(const SamplerOptions& o, const std::string& needle) {
  try {
    DistributedSampler s(o);
    ADD_FAILURE() << "no exception; expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DistributedSampler, EveryLayoutMakesTheSameSteps) {
  int checked = 0;
  for (int64_t g : {24, 48}) {
    for (int64_t n : {5, 24, 25, 47, 48, 100, 131, 200}) {
      for (bool drop_last : {true, false}) {
        if (drop_last && n < g) continue;  // invalid: covered by RejectsDatasetSmallerThanGlobalBatch
        for (int64_t epoch : {0, 1}) {
          const std::vector<int64_t> ref = reference_epoch(options(n, g, 1, 0, 1, drop_last), epoch);
          const int64_t ref_steps = drop_last ? n / g : (n + g - 1) / g;
          ASSERT_EQ(static_cast<int64_t>(ref.size()), drop_last ? ref_steps * g : n);
          for (int w : {1, 2, 3, 4}) {
            for (int a : {1, 2}) {
              SCOPED_TRACE("G=" + std::to_string(g) + " N=" + std::to_string(n) + " drop_last=" +
                           std::to_string(drop_last) + " epoch=" + std::to_string(epoch) + " W=" +
                           std::to_string(w) + " A=" + std::to_string(a));
              std::vector<DistributedSampler> ranks;
              for (int r = 0; r < w; ++r) ranks.emplace_back(options(n, g, w, r, a, drop_last));
              std::vector<int64_t> seen;  // the epoch in position order: micro-batch, then rank
              for (int r = 0; r < w; ++r) {
                EXPECT_EQ(ranks[r].steps_per_epoch(), ref_steps);
                EXPECT_EQ(ranks[r].micro_batch_size(), g / (w * a));
              }
              for (int64_t s = 0; s < ref_steps; ++s) {
                int64_t step_total = 0;
                for (int k = 0; k < a; ++k) {
                  for (int r = 0; r < w; ++r) {
                    EXPECT_EQ(ranks[r].global_samples(s), s < n / g ? g : n % g);
                    std::vector<int64_t> mine = indices(ranks[r], epoch, s, k);
                    EXPECT_LE(static_cast<int64_t>(mine.size()), g / (w * a));
                    step_total += static_cast<int64_t>(mine.size());
                    seen.insert(seen.end(), mine.begin(), mine.end());
                  }
                }
                EXPECT_EQ(step_total, ranks[0].global_samples(s));
              }
              // Same samples in the same positions as world 1, accumulation 1.
              EXPECT_EQ(seen, ref);
              std::set<int64_t> unique(seen.begin(), seen.end());
              EXPECT_EQ(unique.size(), seen.size()) << "an index repeats within the epoch";
              EXPECT_GE(*unique.begin(), 0);
              EXPECT_LT(*unique.rbegin(), n);
              if (!drop_last) {
                EXPECT_EQ(static_cast<int64_t>(unique.size()), n) << "not every sample is covered";
              }
              ++checked;
            }
          }
        }
      }
    }
  }
  // (G=24: 7 drop_last + 8 keep; G=48: 4 + 8) layouts x 2 epochs x 4 world sizes x 2 accumulations.
  EXPECT_EQ(checked, 27 * 2 * 4 * 2);
}

TEST(DistributedSampler, ExactLayoutWithoutShuffle) {
  // N = 20, G = 8, W = 2, A = 2, so M = 2: step s covers [8s, 8s+8), positions 0-1 rank 0 micro 0, 2-3 rank 1
  // micro 0, 4-5 rank 0 micro 1, 6-7 rank 1 micro 1. The tail step (16..19) fills micro-batch 0 only.
  DistributedSampler r0(options(20, 8, 2, 0, 2, /*drop_last=*/false, /*shuffle=*/false));
  DistributedSampler r1(options(20, 8, 2, 1, 2, /*drop_last=*/false, /*shuffle=*/false));
  ASSERT_EQ(r0.steps_per_epoch(), 3);
  ASSERT_EQ(r1.steps_per_epoch(), 3);
  EXPECT_EQ(r0.micro_batch_size(), 2);
  EXPECT_EQ(indices(r0, 0, 0, 0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(indices(r1, 0, 0, 0), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(indices(r0, 0, 0, 1), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(indices(r1, 0, 0, 1), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(indices(r1, 5, 1, 1), (std::vector<int64_t>{14, 15}));
  EXPECT_EQ(r0.global_samples(2), 4);
  EXPECT_EQ(indices(r0, 0, 2, 0), (std::vector<int64_t>{16, 17}));
  EXPECT_EQ(indices(r1, 0, 2, 0), (std::vector<int64_t>{18, 19}));
  EXPECT_EQ(indices(r0, 0, 2, 1), (std::vector<int64_t>{}));
  EXPECT_EQ(indices(r1, 0, 2, 1), (std::vector<int64_t>{}));

  DistributedSampler dropped(options(20, 8, 2, 1, 2, /*drop_last=*/true, /*shuffle=*/false));
  EXPECT_EQ(dropped.steps_per_epoch(), 2);
  EXPECT_EQ(dropped.global_samples(1), 8);
}

TEST(DistributedSampler, ShuffleChangesWithEpochAndSeedOnly) {
  const int64_t n = 1000;
  auto epoch_of = [&](uint64_t seed, int64_t epoch, bool shuffle) {
    DistributedSampler s(options(n, n, 1, 0, 1, true, shuffle, seed));
    return indices(s, epoch, 0, 0);
  };
  std::vector<int64_t> identity(n);
  for (int64_t i = 0; i < n; ++i) identity[i] = i;

  const std::vector<int64_t> e0 = epoch_of(7, 0, true);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity) << "epoch 0 is not a permutation";
  EXPECT_NE(e0, identity);
  EXPECT_EQ(e0, epoch_of(7, 0, true)) << "same seed, separate instances, different permutation";
  EXPECT_NE(e0, epoch_of(7, 1, true)) << "epochs 0 and 1 have the same permutation";
  EXPECT_NE(e0, epoch_of(8, 0, true)) << "seeds 7 and 8 have the same permutation";
  EXPECT_EQ(epoch_of(7, 0, false), identity);
  EXPECT_EQ(epoch_of(7, 3, false), identity);

  // One instance going back and forth between epochs (the permutation cache) gives the same answers.
  DistributedSampler s(options(n, 100, 1, 0, 1, true, true, 7));
  std::vector<int64_t> a = indices(s, 0, 3, 0), b = indices(s, 1, 3, 0), c = indices(s, 0, 3, 0);
  EXPECT_EQ(a, c);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, std::vector<int64_t>(e0.begin() + 300, e0.begin() + 400));
}

TEST(DistributedSampler, ShuffleIsUniformOverPermutations) {
  // All 24 permutations of 4 elements over 2400 epochs: each expected 100 times, binomial sd ~ 9.8. The bounds
  // [50, 150] are 5 sd: a fair Fisher-Yates stays inside them; the classic bug (j drawn from [0, N) instead of
  // [0, i]) makes some permutations 1.8x as frequent as others and leaves them.
  DistributedSampler s(options(4, 4, 1, 0, 1, true, true, 99));
  std::map<std::vector<int64_t>, int> count;
  for (int64_t e = 0; e < 2400; ++e) ++count[indices(s, e, 0, 0)];
  EXPECT_EQ(count.size(), 24u);
  for (const auto& [perm, c] : count) {
    EXPECT_GE(c, 50);
    EXPECT_LE(c, 150);
  }
}

TEST(DistributedSampler, EveryRankGetsTheSameNumberOfSteps) {
  // An uneven epoch tail: N = 10, W = 4, G = 8 (M = 2). Naive sharding (rank r takes r, r+W, ...; then batches of M)
  // gives rank 0 three samples (two batches) and rank 3 two samples (one batch): rank 0 would wait in an
  // all-reduce nobody joins. Here every rank has two steps; the tail step's 2 samples go to rank 0.
  const int64_t n = 10, g = 8;
  const int w = 4;
  std::vector<int64_t> naive_batches;
  for (int r = 0; r < w; ++r) naive_batches.push_back(((n - r + w - 1) / w + 1) / 2);
  ASSERT_NE(naive_batches.front(), naive_batches.back()) << "the case does not show the problem";

  for (int r = 0; r < w; ++r) {
    DistributedSampler s(options(n, g, w, r, 1, /*drop_last=*/false));
    EXPECT_EQ(s.steps_per_epoch(), 2);
    EXPECT_EQ(s.global_samples(1), 2);
    EXPECT_EQ(indices(s, 0, 0, 0).size(), 2u);
    EXPECT_EQ(indices(s, 0, 1, 0).size(), r == 0 ? 2u : 0u);
    DistributedSampler d(options(n, g, w, r, 1, /*drop_last=*/true));
    EXPECT_EQ(d.steps_per_epoch(), 1);
  }
}

TEST(DistributedSampler, RejectsGlobalBatchNotDivisible) {
  expect_bad_input(options(100, 10, 4, 0, 1, true), "data.global_batch_size");
  expect_bad_input(options(100, 12, 2, 1, 4, true), "data.global_batch_size");
  expect_bad_input(options(100, 0, 1, 0, 1, true), "data.global_batch_size");
  expect_bad_input(options(100, -8, 1, 0, 1, true), "data.global_batch_size");
  expect_bad_input(options(100, 8, 1, 0, 0, true), "optimizer.accumulation_steps");
  try {
    DistributedSampler s(options(100, 12, 2, 1, 4, true));
    ADD_FAILURE() << "G = 12 with W x A = 8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("accumulation_steps 4"), std::string::npos) << e.what();
  }
}

TEST(DistributedSampler, RejectsDatasetSmallerThanGlobalBatch) {
  expect_bad_input(options(20, 24, 2, 0, 1, /*drop_last=*/true), "data.global_batch_size");
  DistributedSampler ok(options(20, 24, 2, 0, 1, /*drop_last=*/false));
  EXPECT_EQ(ok.steps_per_epoch(), 1);
  EXPECT_EQ(ok.global_samples(0), 20);
}

}  // namespace
}  // namespace ampdist
