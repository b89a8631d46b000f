// The loss-scale rule over the whole FP32 range, and the set-up checks that keep a run inside it.
//
// The rule (amp/scaler_rule.h, scaler_update) is the one function LossScaler, the CPU step and the GPU's one-thread
// step kernel all call, so these properties hold for every backend.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/amp/loss_scaler.h"
#include "runtime/core/error.h"
#include "runtime/amp/scaler_rule.h"
#include "runtime/train/config.h"

namespace ampdist {
namespace {

bool normal_finite(float s) { return std::isnormal(s) && s > 0.0f; }

// Initial scales from the smallest normal float to the largest finite one: every power of two in between, the two
// ends, and values that are not powers of two (so growth and backoff round).
std::vector<float> init_scales() {
  std::vector<float> v = {FLT_MIN, FLT_MAX, 3.0e-38f, 1.0e38f, 3.0f, 65536.0f, 1.7e38f, std::nextafter(FLT_MIN, 1.0f)};
  for (int e = -126; e <= 127; ++e) v.push_back(std::ldexp(1.0f, e));
  return v;
}

// Growth factors the config accepts (> 1, finite) and backoff factors it accepts ((0, 1)), the extremes included.
const std::vector<float> kGrowth = {std::nextafter(1.0f, 2.0f), 1.5f, 2.0f, 10.0f, 1e10f, 1e30f, FLT_MAX};
const std::vector<float> kBackoff = {FLT_MIN, 1e-30f, 0.1f, 0.5f, std::nextafter(1.0f, 0.0f)};

TEST(LossScaleRange, GrowthNeverLeavesTheFiniteNormalRange) {
  for (float init : init_scales()) {
    for (float g : kGrowth) {
      ScalerRule rule;
      rule.dynamic = true;
      rule.growth_factor = g;
      rule.growth_interval = 1;  // every clean step grows
      LossScalerState s;
      s.scale = init;
      for (int step = 0; step < 400; ++step) {  // 400 growths pass 2^-126 .. 2^127 even for the smallest factor
        const float before = s.scale;
        ASSERT_EQ(scaler_update(s, rule, false), kScalerOk);
        ASSERT_TRUE(normal_finite(s.scale)) << "init " << init << " growth " << g << " step " << step;
        const float grown = before * g;
        if (std::isfinite(grown))
          ASSERT_EQ(s.scale, grown) << "a representable growth must happen";
        else
          ASSERT_EQ(s.scale, before) << "a growth that overflows keeps the old scale (GradScaler)";
        ASSERT_EQ(s.growth_tracker, 0);
        // The inverse the unscale multiplies by is finite too.
        ASSERT_TRUE(std::isfinite(1.0f / s.scale));
      }
    }
  }
}

TEST(LossScaleRange, BackoffStopsAtMinScaleAndNeverStoresASubnormal) {
  for (float init : init_scales()) {
    for (float b : kBackoff) {
      for (float min_scale : {FLT_MIN, 1.0f}) {
        if (min_scale > init) continue;  // set-up refuses min_scale > init_scale
        ScalerRule rule;
        rule.dynamic = true;
        rule.backoff_factor = b;
        rule.min_scale = min_scale;
        LossScalerState s;
        s.scale = init;
        int32_t status = kScalerOk;
        int steps = 0;
        while (status == kScalerOk && steps < 400) {  // 400 halvings cross the whole range
          const float before = s.scale;
          status = scaler_update(s, rule, true);
          ++steps;
          ASSERT_TRUE(normal_finite(s.scale)) << "init " << init << " backoff " << b;
          ASSERT_GE(s.scale, min_scale);
          if (status == kScalerOk) ASSERT_EQ(s.scale, before * b);
          else ASSERT_EQ(s.scale, before) << "the stop leaves the last valid scale stored";
        }
        // Backoffs needed to go below min_scale (a factor just under 1 needs billions from the top of the range).
        const double needed = std::log(static_cast<double>(min_scale) / init) / std::log(static_cast<double>(b)) + 1;
        if (needed < 390 || init == FLT_MIN)
          ASSERT_EQ(status, kScalerBelowMinScale) << "init " << init << " backoff " << b << " min " << min_scale;
      }
    }
  }
}

TEST(LossScaleRange, LongAlternatingRunsStayValidThroughLossScaler) {
  // Runs of growth and of backoff over the class used by the CPU step, from both ends of the range.
  for (float init : {FLT_MIN, FLT_MAX, 1.0f}) {
    for (float g : kGrowth) {
      DynamicLossScaleConfig cfg;
      cfg.set_init_scale(init);
      cfg.set_min_scale(FLT_MIN);
      cfg.set_growth_factor(g);
      cfg.set_growth_interval(3);
      LossScaler s = LossScaler::dynamic(cfg);
      for (int round = 0; round < 6; ++round) {
        for (int i = 0; i < 300; ++i) {
          s.update(false);
          ASSERT_TRUE(normal_finite(s.scale()));
        }
        for (int i = 0; i < 20; ++i) {
          try {
            s.update(true);
          } catch (const Error&) {  // below min_scale: the run would stop here, with a valid scale stored
          }
          ASSERT_TRUE(normal_finite(s.scale()));
        }
      }
    }
  }
}

TEST(LossScaleRange, TheValidityTestIsTheNormalFiniteRange) {
  EXPECT_TRUE(is_valid_loss_scale(FLT_MIN));
  EXPECT_TRUE(is_valid_loss_scale(FLT_MAX));
  EXPECT_TRUE(is_valid_loss_scale(65536.0f));
  EXPECT_FALSE(is_valid_loss_scale(std::nextafter(FLT_MIN, 0.0f)));  // the largest subnormal
  EXPECT_FALSE(is_valid_loss_scale(0.0f));
  EXPECT_FALSE(is_valid_loss_scale(-1.0f));
  EXPECT_FALSE(is_valid_loss_scale(INFINITY));
  EXPECT_FALSE(is_valid_loss_scale(NAN));
}

// ---- set-up: a configured scale outside that range is bad input, named by its field ----

RunConfig mlp_config() {
  RunConfig c = parse_config_text(
      "model { mlp { hidden: 8 } } data { synthetic { train_samples: 64 test_samples: 8 features: 4 classes: 2 } "
      "global_batch_size: 8 } precision { dtype: FP16 }",
      "test.pbtxt");
  return c;
}

std::string validation_error(const RunConfig& c) {
  try {
    validate_config(c, "run.pbtxt");
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return "";
}

TEST(LossScaleRange, SetUpRefusesScalesTheArithmeticCannotHonour) {
  EXPECT_EQ(validation_error(mlp_config()), "");
  const float bad[] = {0.0f, 1e-40f, std::nextafter(FLT_MIN, 0.0f), INFINITY, NAN, -4.0f};
  for (float v : bad) {
    RunConfig c = mlp_config();
    c.mutable_precision()->mutable_dynamic()->set_init_scale(v);
    c.mutable_precision()->mutable_dynamic()->set_min_scale(v);
    const std::string e = validation_error(c);
    EXPECT_NE(e.find("run.pbtxt: precision.dynamic.init_scale must be a finite, normal FP32 number"),
              std::string::npos)
        << v << ": " << e;
    RunConfig m = mlp_config();
    m.mutable_precision()->mutable_dynamic()->set_min_scale(v);
    EXPECT_NE(validation_error(m).find("precision.dynamic.min_scale must be a finite, normal"), std::string::npos) << v;
    RunConfig st = mlp_config();
    st.mutable_precision()->mutable_static_scale()->set_scale(v);
    EXPECT_NE(validation_error(st).find("precision.static_scale.scale must be a finite, normal"), std::string::npos)
        << v;
  }
  RunConfig edge = mlp_config();
  edge.mutable_precision()->mutable_dynamic()->set_init_scale(FLT_MAX);
  edge.mutable_precision()->mutable_dynamic()->set_min_scale(FLT_MIN);
  EXPECT_EQ(validation_error(edge), "");
}

}  // namespace
}  // namespace ampdist
