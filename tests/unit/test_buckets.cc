// Gradient bucket plans (runtime/dist/reducer.h) and shard sizes (runtime/core/flat_layout.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dist/reducer.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"
#include "tests/test_tensors.h"

namespace ampdist {
namespace {

using Params = testing::OwnedParams;

std::vector<Shape> sizes_to_shapes(const std::vector<int64_t>& sizes) {
  std::vector<Shape> s;
  for (int64_t n : sizes) s.push_back({n});
  return s;
}

const std::vector<int64_t> kSizes = {100, 10, 200, 20, 50, 5};  // offsets 0, 100, 110, 310, 330, 380; total 385

struct Expect {
  int64_t begin, end;
  std::vector<int> params;
};

void expect_layout(const std::vector<BucketLayout>& got, const std::vector<Expect>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].begin, want[b].begin) << what << " bucket " << b;
    EXPECT_EQ(got[b].end, want[b].end) << what << " bucket " << b;
    EXPECT_EQ(got[b].params, want[b].params) << what << " bucket " << b;
  }
}

// Invariants of any plan: buckets in reverse order, contiguous, covering [0, total) exactly once, each within the
// cap unless it holds a single parameter, parameters in descending registration order.
void check_invariants(const std::vector<BucketLayout>& plan, const Params& ps, int64_t cap, int64_t elem_bytes) {
  const int64_t total = ps.mw->numel();
  ASSERT_FALSE(plan.empty());
  EXPECT_EQ(plan.front().end, total);
  EXPECT_EQ(plan.back().begin, 0);
  int expected_param = static_cast<int>(ps.ptrs.size()) - 1;
  for (size_t b = 0; b < plan.size(); ++b) {
    const BucketLayout& bk = plan[b];
    if (b + 1 < plan.size()) {
      EXPECT_EQ(plan[b + 1].end, bk.begin) << "bucket " << b;
    }
    ASSERT_FALSE(bk.params.empty());
    int64_t elems = 0;
    for (int idx : bk.params) {
      EXPECT_EQ(idx, expected_param--);  // every parameter exactly once, in reverse registration order
      elems += ps.ptrs[idx]->numel();
    }
    EXPECT_EQ(elems, bk.end - bk.begin) << "bucket " << b;
    EXPECT_EQ(ps.ptrs[bk.params.back()]->offset, bk.begin);
    if (bk.params.size() > 1) {
      EXPECT_LE(elems * elem_bytes, cap) << "bucket " << b << " cap " << cap;
    }
  }
  EXPECT_EQ(expected_param, -1);
}

TEST(PlanBuckets, ExactLayoutsFp32) {
  Params ps(sizes_to_shapes(kSizes));
  ASSERT_EQ(ps.mw->numel(), 385);
  // Bytes at 4 per element, in reverse order: p5 20, p4 200, p3 80, p2 800, p1 40, p0 400.
  // cap 400: 20+200+80 = 300 | 800 alone (over the cap) | 40 (+400 = 440 > 400) | 400.
  expect_layout(plan_buckets(ps.mw->layout(), 400, 4),
                {{310, 385, {5, 4, 3}}, {110, 310, {2}}, {100, 110, {1}}, {0, 100, {0}}}, "cap 400");
  // cap 1000: 300 | 800+40 = 840 | 400.
  expect_layout(plan_buckets(ps.mw->layout(), 1000, 4), {{310, 385, {5, 4, 3}}, {100, 310, {2, 1}}, {0, 100, {0}}},
                "cap 1000");
  // cap 220: exactly full is allowed: 20+200 | 80 | 800 | 40 | 400.
  expect_layout(plan_buckets(ps.mw->layout(), 220, 4),
                {{330, 385, {5, 4}}, {310, 330, {3}}, {110, 310, {2}}, {100, 110, {1}}, {0, 100, {0}}}, "cap 220");
  // A cap below every parameter: one bucket each.
  expect_layout(plan_buckets(ps.mw->layout(), 1, 4),
                {{380, 385, {5}}, {330, 380, {4}}, {310, 330, {3}}, {110, 310, {2}}, {100, 110, {1}}, {0, 100, {0}}},
                "cap 1");
  // Large cap: one bucket.
  expect_layout(plan_buckets(ps.mw->layout(), 25 << 20, 4), {{0, 385, {5, 4, 3, 2, 1, 0}}}, "cap 25 MiB");
}

TEST(PlanBuckets, ExactLayoutsFp16) {
  Params ps(sizes_to_shapes(kSizes));
  // Bytes at 2 per element: p5 10, p4 100, p3 40, p2 400, p1 20, p0 200.
  // cap 400: 10+100+40 = 150 (+400 > 400) | 400 | 20+200 = 220.
  expect_layout(plan_buckets(ps.mw->layout(), 400, 2), {{310, 385, {5, 4, 3}}, {110, 310, {2}}, {0, 110, {1, 0}}},
                "cap 400");
  // cap 770 = the whole model exactly: one bucket.
  expect_layout(plan_buckets(ps.mw->layout(), 770, 2), {{0, 385, {5, 4, 3, 2, 1, 0}}}, "cap 770");
  // cap 769: 770 does not fit; the last parameter spills.
  expect_layout(plan_buckets(ps.mw->layout(), 769, 2), {{100, 385, {5, 4, 3, 2, 1}}, {0, 100, {0}}}, "cap 769");
}

TEST(PlanBuckets, InvariantsForManyCaps) {
  Params ps(sizes_to_shapes({7, 300, 1, 64, 64, 129, 2, 1000, 33}));
  for (int64_t elem : {2, 4})
    for (int64_t cap : {1, 8, 100, 128, 256, 257, 600, 1000, 2000, 4000, 100000}) {
      SCOPED_TRACE("cap " + std::to_string(cap) + " elem " + std::to_string(elem));
      check_invariants(plan_buckets(ps.mw->layout(), cap, elem), ps, cap, elem);
    }
}

TEST(ShardCounts, SplitsEvenlyFirstRanksTakeTheRemainder) {
  EXPECT_EQ(shard_counts(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(shard_counts(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(shard_counts(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));  // n < world
  EXPECT_EQ(shard_counts(0, 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(shard_counts(385, 1), (std::vector<int64_t>{385}));
  for (int64_t n = 0; n < 50; ++n)
    for (int w : {1, 2, 3, 4, 7, 8}) {
      const auto c = shard_counts(n, w);
      ASSERT_EQ(static_cast<int>(c.size()), w);
      int64_t sum = 0;
      for (int r = 0; r < w; ++r) {
        sum += c[r];
        if (r > 0) {
          EXPECT_LE(c[r], c[r - 1]);
        }
        EXPECT_LE(c.front() - c[r], 1);
      }
      EXPECT_EQ(sum, n) << n << " over " << w;
    }
}

}  // namespace
}  // namespace ampdist
