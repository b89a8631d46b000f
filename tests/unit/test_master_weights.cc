// MasterWeights: the flat FP32 master buffer, its working copy and their views (runtime/amp/master_weights.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/amp/master_weights.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"
#include "tests/test_tensors.h"

namespace ampdist {
namespace {

using Params = testing::OwnedParams;

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
      EXPECT_EQ(m[i], vals[i]);  // the master is untouched (the master is saved, not rebuilt: 1.0003 stays 1.0003)
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
