// LossScaler: dynamic (GradScaler + Megatron hysteresis and minimum), static and none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/amp/loss_scaler.h"
#include "runtime/core/error.h"

namespace ampdist {
namespace {

void clean(LossScaler& s, int n) {
  for (int i = 0; i < n; ++i) s.update(false);
}

TEST(LossScaler, DefaultsGrowAfter2000CleanSteps) {
  LossScaler s = LossScaler::dynamic(DynamicLossScaleConfig());
  EXPECT_EQ(s.mode(), LossScaler::Mode::kDynamic);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().hysteresis_tracker, 1);
  clean(s, 1999);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.state().growth_tracker, 1999);
  s.update(false);  // the 2000th consecutive clean step
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().skipped_steps, 0);
  EXPECT_EQ(s.updates(), 2000);
  clean(s, 2000);
  EXPECT_EQ(s.scale(), 262144.0f);
}

TEST(LossScaler, OverflowHalvesResetsTrackerAndCountsSkip) {
  LossScaler s = LossScaler::dynamic(DynamicLossScaleConfig());
  clean(s, 1500);
  EXPECT_EQ(s.state().growth_tracker, 1500);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().skipped_steps, 1);
  // The counter restarts: growth comes 2000 clean steps after the overflow, not 500.
  clean(s, 1999);
  EXPECT_EQ(s.scale(), 32768.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.updates(), 1500 + 1 + 2000);
}

TEST(LossScaler, MixedTrajectoryMatchesHandComputed) {
  // (event, count) runs and the state after each run: {scale, growth_tracker, skipped_steps}.
  struct Run {
    bool overflow;
    int count;
    float scale;
    int64_t tracker, skipped;
  };
  const std::vector<Run> runs = {
      {false, 3, 65536, 3, 0},        //
      {true, 1, 32768, 0, 1},         // overflow: halve
      {false, 1999, 32768, 1999, 1},  //
      {false, 1, 65536, 0, 1},        // 2000 consecutive clean: grow
      {true, 1, 32768, 0, 2},         //
      {true, 1, 16384, 0, 3},         // back-to-back overflows halve each time
      {false, 10, 16384, 10, 3},      //
      {true, 1, 8192, 0, 4},          //
      {false, 2000, 16384, 0, 4},     //
      {false, 2000, 32768, 0, 4},     //
  };
  LossScaler s = LossScaler::dynamic(DynamicLossScaleConfig());
  int64_t updates = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    for (int k = 0; k < runs[i].count; ++k) s.update(runs[i].overflow);
    updates += runs[i].count;
    EXPECT_EQ(s.scale(), runs[i].scale) << "after run " << i;
    EXPECT_EQ(s.state().growth_tracker, runs[i].tracker) << "after run " << i;
    EXPECT_EQ(s.state().skipped_steps, runs[i].skipped) << "after run " << i;
    EXPECT_EQ(s.updates(), updates);
  }
}

TEST(LossScaler, HysteresisDelaysBackoffAndIsRefilledOnlyByGrowth) {
  DynamicLossScaleConfig cfg;
  cfg.set_hysteresis(2);
  LossScaler s = LossScaler::dynamic(cfg);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  s.update(true);  // first overflow: skipped, no backoff
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 1);
  EXPECT_EQ(s.state().skipped_steps, 1);
  s.update(false);  // a clean step between does not refill the tracker (Megatron-LM)
  EXPECT_EQ(s.state().hysteresis_tracker, 1);
  s.update(true);  // second overflow: back off
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 0);
  s.update(true);  // tracker stays exhausted: every further overflow backs off
  EXPECT_EQ(s.scale(), 16384.0f);
  EXPECT_EQ(s.state().skipped_steps, 3);
  clean(s, 2000);  // growth refills the tracker
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 16384.0f);
  EXPECT_EQ(s.state().skipped_steps, 5);
}

TEST(LossScaler, BackoffBelowMinScaleThrows) {
  DynamicLossScaleConfig cfg;
  cfg.set_init_scale(4.0f);
  cfg.set_min_scale(1.0f);
  LossScaler s = LossScaler::dynamic(cfg);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0f);  // reaching min_scale exactly is allowed
  try {
    s.update(true);
    FAIL() << "a backoff to 0.5 below min_scale 1 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("min_scale"), std::string::npos) << e.what();
  }
  // From the defaults: 16 backoffs reach 1, the 17th throws.
  LossScaler d = LossScaler::dynamic(DynamicLossScaleConfig());
  for (int i = 0; i < 16; ++i) d.update(true);
  EXPECT_EQ(d.scale(), 1.0f);
  EXPECT_THROW(d.update(true), Error);
}

TEST(LossScaler, NoneStaysOneAndStillCountsSkips) {
  // bf16 never scales and a skipped step still counts: no scaling even after 2500 clean steps; an overflow is still skipped and counted.
  LossScaler s = LossScaler::none();
  EXPECT_EQ(s.mode(), LossScaler::Mode::kNone);
  EXPECT_EQ(s.scale(), 1.0f);
  clean(s, 2500);
  EXPECT_EQ(s.scale(), 1.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(s.state().skipped_steps, 1);
  EXPECT_EQ(s.updates(), 2501);
  clean(s, 5);
  s.update(true);
  EXPECT_EQ(s.state().skipped_steps, 2);
  EXPECT_EQ(s.scale(), 1.0f);
}

TEST(LossScaler, FixedStaysAndCountsSkips) {
  LossScaler s = LossScaler::fixed(1024.0f);
  EXPECT_EQ(s.mode(), LossScaler::Mode::kStatic);
  EXPECT_EQ(s.scale(), 1024.0f);
  clean(s, 2500);
  EXPECT_EQ(s.scale(), 1024.0f);
  for (int i = 0; i < 20; ++i) s.update(true);  // never backs off, never hits a minimum
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().skipped_steps, 20);
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a = LossScaler::dynamic(DynamicLossScaleConfig());
  clean(a, 1500);
  a.update(true);
  clean(a, 7);
  LossScaler b = LossScaler::dynamic(DynamicLossScaleConfig());
  b.set_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  clean(a, 1993);
  clean(b, 1993);
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.scale(), 65536.0f);
}

TEST(LossScaler, FromConfig) {
  PrecisionConfig p;
  LossScaler fp16 = LossScaler::from_config(p, FP16);
  EXPECT_EQ(fp16.mode(), LossScaler::Mode::kDynamic);
  EXPECT_EQ(fp16.scale(), 65536.0f);
  EXPECT_EQ(LossScaler::from_config(p, BF16).mode(), LossScaler::Mode::kNone);
  EXPECT_EQ(LossScaler::from_config(p, BF16).scale(), 1.0f);
  EXPECT_EQ(LossScaler::from_config(p, FP32).mode(), LossScaler::Mode::kNone);

  PrecisionConfig st;
  st.mutable_static_scale()->set_scale(128.0f);
  for (DTypeName d : {FP16, BF16, FP32}) {
    LossScaler s = LossScaler::from_config(st, d);
    EXPECT_EQ(s.mode(), LossScaler::Mode::kStatic);
    EXPECT_EQ(s.scale(), 128.0f);
  }
  PrecisionConfig none;
  none.mutable_none();
  EXPECT_EQ(LossScaler::from_config(none, FP16).mode(), LossScaler::Mode::kNone);

  PrecisionConfig dyn;
  dyn.mutable_dynamic()->set_init_scale(1024.0f);
  dyn.mutable_dynamic()->set_growth_interval(3);
  LossScaler d = LossScaler::from_config(dyn, BF16);
  EXPECT_EQ(d.mode(), LossScaler::Mode::kDynamic);
  EXPECT_EQ(d.scale(), 1024.0f);
  clean(d, 3);
  EXPECT_EQ(d.scale(), 2048.0f);
}

}  // namespace
}  // namespace ampdist

namespace {

TEST(LossScalerLimits, MaxConsecutiveSkipsStopsTheRunAndNamesTheField) {
  ampdist::LossScaler s = ampdist::LossScaler::none();
  s.set_max_consecutive_skips(3);
  s.update(true);
  s.update(true);
  s.update(false);  // a clean step resets the run of skips
  EXPECT_EQ(s.state().consecutive_skips, 0);
  s.update(true);
  s.update(true);
  try {
    s.update(true);
    FAIL() << "the third consecutive skip must stop the run";
  } catch (const ampdist::Error& e) {
    EXPECT_NE(std::string(e.what()).find("precision.max_consecutive_skips = 3"), std::string::npos) << e.what();
  }
}

TEST(LossScalerLimits, FromConfigAppliesTheDefaultLimitOf100) {
  ampdist::PrecisionConfig cfg;
  cfg.set_dtype(ampdist::BF16);
  ampdist::LossScaler s = ampdist::LossScaler::from_config(cfg, ampdist::BF16);
  for (int i = 0; i < 99; ++i) s.update(true);
  EXPECT_THROW(s.update(true), ampdist::Error);
}

}  // namespace
