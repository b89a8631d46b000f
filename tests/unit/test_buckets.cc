// Gradient bucket plans, shard sizes, and the flat-buffer layout of MasterWeights.
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

namespace ampdist {
namespace {

// Parameters of the given sizes, owned by the fixture, bound to flat buffers (bind_parameters).
struct Params {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> ptrs;
  std::unique_ptr<MasterWeights> mw;
  explicit Params(const std::vector<Shape>& shapes, DType working = DType::kFloat32, float bound = 0.5f) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto p = std::make_unique<Parameter>();
      p->name = "p";
      p->name += std::to_string(i);  // (not "p" + ...: GCC 12 -Wrestrict false positive)
      p->shape = shapes[i];
      p->init_bound = bound;
      ptrs.push_back(p.get());
      owned.push_back(std::move(p));
    }
    mw = bind_parameters(ptrs, working, Device::kCPU, 0);
  }
};

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

// ---- MasterWeights --------------------------------------------------------------------------------------------

TEST(MasterWeights, ViewsPointIntoFlatBuffers) {
  Params ps({{3, 4}, {3}, {5}}, DType::kFloat16);
  MasterWeights& mw = *ps.mw;
  EXPECT_EQ(mw.numel(), 20);
  EXPECT_EQ(mw.master().dtype(), DType::kFloat32);
  EXPECT_EQ(mw.grads().dtype(), DType::kFloat32);
  EXPECT_EQ(mw.working().dtype(), DType::kFloat16);
  EXPECT_EQ(mw.working().nbytes(), 40u);
  const int64_t offsets[] = {0, 12, 15};
  for (int i = 0; i < 3; ++i) {
    const Parameter& p = *ps.ptrs[i];
    EXPECT_EQ(p.index, i);
    EXPECT_EQ(p.offset, offsets[i]);
    EXPECT_EQ(p.master.data(), mw.master().data_as<float>() + offsets[i]);
    EXPECT_EQ(p.grad.data(), mw.grads().data_as<float>() + offsets[i]);
    EXPECT_EQ(p.working.data(), static_cast<char*>(mw.working().data()) + 2 * offsets[i]);
    EXPECT_EQ(p.master.shape(), p.shape);
    EXPECT_EQ(p.working.dtype(), DType::kFloat16);
    EXPECT_EQ(&p.weights_for(DType::kFloat32), &p.master);
    EXPECT_EQ(&p.weights_for(DType::kFloat16), &p.working);
  }
  // Writing through a view lands in the flat buffer.
  ps.ptrs[1]->master.data_as<float>()[2] = 42.0f;
  EXPECT_EQ(mw.master().item(14), 42.0f);
  ps.ptrs[2]->grad.data_as<float>()[0] = -1.0f;
  EXPECT_EQ(mw.grads().item(15), -1.0f);
}

TEST(MasterWeights, WorkingCopyIsTheRoundedMaster) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    Params ps({{6}}, dt);
    MasterWeights& mw = *ps.mw;
    float* m = mw.master().data_as<float>();
    const float vals[] = {1.0003f, 1.0f + std::ldexp(1.0f, -11), 70000.0f, 1e-8f, -0.1f, 3.0f};
    std::memcpy(m, vals, sizeof vals);
    mw.cast_to_working();
    for (int i = 0; i < 6; ++i) {
      const float expect = dt == DType::kFloat16 ? static_cast<float>(half(vals[i]))
                                                 : static_cast<float>(bfloat16(vals[i]));
      const float got = mw.working().item(i);
      if (std::isinf(expect)) {
        EXPECT_TRUE(std::isinf(got));
      } else {
        EXPECT_EQ(got, expect) << dtype_name(dt) << " " << i;
      }
      EXPECT_EQ(m[i], vals[i]);  // the master is untouched (scenario C9: 1.0003 stays 1.0003)
    }
    if (dt == DType::kFloat16) {
      EXPECT_EQ(mw.working().item(0), 1.0f);  // fp16 copy of 1.0003 is 1.0
    }
  }
}

TEST(MasterWeights, InitializeIsDeterministicPerSeed) {
  const std::vector<Shape> shapes = {{16, 8}, {16}, {4, 16}, {4}};
  Params a(shapes, DType::kFloat16), b(shapes, DType::kFloat16), c(shapes, DType::kFloat16);
  a.ptrs[1]->init = ParamInit::kZeros;
  b.ptrs[1]->init = ParamInit::kZeros;
  c.ptrs[1]->init = ParamInit::kZeros;
  initialize_parameters(a.ptrs, *a.mw, 42);
  initialize_parameters(b.ptrs, *b.mw, 42);
  initialize_parameters(c.ptrs, *c.mw, 43);
  const size_t bytes = a.mw->master().nbytes();
  EXPECT_EQ(std::memcmp(a.mw->master().data(), b.mw->master().data(), bytes), 0);
  EXPECT_EQ(a.mw->hash(), b.mw->hash());
  EXPECT_NE(std::memcmp(a.mw->master().data(), c.mw->master().data(), bytes), 0);
  EXPECT_NE(a.mw->hash(), c.mw->hash());
  // Values in [-bound, bound), zeros where asked, not all equal, and the working copy cast after initialize.
  const float* m = a.mw->master().data_as<float>();
  int distinct_from_first = 0;
  for (int64_t i = 0; i < a.mw->numel(); ++i) {
    EXPECT_GE(m[i], -0.5f);
    EXPECT_LT(m[i], 0.5f);
    if (m[i] != m[0]) ++distinct_from_first;
    EXPECT_EQ(a.mw->working().item(i), static_cast<float>(half(m[i])));
  }
  EXPECT_GT(distinct_from_first, 100);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(a.ptrs[1]->master.item(i), 0.0f);
  // Different parameters get different streams.
  EXPECT_NE(a.ptrs[0]->master.item(0), a.ptrs[2]->master.item(0));
}

TEST(MasterWeights, Fp32WorkingAliasesMaster) {
  Params ps({{3, 2}, {2}}, DType::kFloat32);
  MasterWeights& mw = *ps.mw;
  EXPECT_EQ(mw.working().data(), mw.master().data());
  EXPECT_EQ(mw.working().dtype(), DType::kFloat32);
  for (Parameter* p : ps.ptrs) EXPECT_EQ(p->working.data(), p->master.data());
  initialize_parameters(ps.ptrs, mw, 1);
  mw.cast_to_working();  // a no-op
  EXPECT_EQ(mw.working().data(), mw.master().data());
}

TEST(MasterWeights, HashTracksEveryWeight) {
  Params ps({{10}, {10}}, DType::kFloat32);
  initialize_parameters(ps.ptrs, *ps.mw, 5);
  const uint64_t h0 = ps.mw->hash();
  EXPECT_EQ(ps.mw->hash(), h0);
  float* last = ps.ptrs[1]->master.data_as<float>() + 9;
  const float saved = *last;
  *last = std::nextafter(saved, 1.0f);  // one ulp of the last weight
  EXPECT_NE(ps.mw->hash(), h0);
  *last = saved;
  EXPECT_EQ(ps.mw->hash(), h0);
  ps.mw->grads().data_as<float>()[0] = 7.0f;  // gradients are not part of the hash
  EXPECT_EQ(ps.mw->hash(), h0);
}

}  // namespace
}  // namespace ampdist
