// The step state's scalar logic (optim/step_gate.h's finish_step, runtime/dist/consensus_payload.h's layout), run on the host:
// the CPU step calls these functions directly and the GPU runs them in one thread around the consensus all-reduce,
// so these tests check that arithmetic against the host-side classes (LossScaler, LrSchedule, clip_grad_norm, AdamW's
// bias corrections), bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "runtime/ampdist.h"
#include "runtime/core/device.h"
#include "runtime/amp/step_state.h"
#include "runtime/optim/step_gate.h"
#include "runtime/dist/consensus_payload.h"

namespace ampdist {
namespace {

RunConfig cfg_of(const std::string& text) { return parse_config_text(text, "test"); }

struct StepSetup {
  RunConfig cfg;
  LossScaler scaler;
  LrSchedule schedule;
  StepConfig step;
};

StepSetup make_setup() {
  RunConfig cfg = cfg_of(R"(
      optimizer { adamw { beta1: 0.9 beta2: 0.95 } lr: 0.003 clip_grad_norm: 1.0
                  schedule { kind: COSINE warmup_steps: 2 min_lr: 0.0003 total_steps: 12 } }
      precision { dtype: FP16 dynamic { growth_interval: 3 hysteresis: 2 } max_consecutive_skips: 0 })");
  StepSetup s{cfg, LossScaler::from_config(cfg.precision(), FP16),
          LrSchedule(cfg.optimizer().lr(), cfg.optimizer().schedule(), 12), {}};
  s.step = make_step_config(cfg, 12, s.scaler.rule());  // as the Trainer makes it
  return s;
}

// The schedule of make_setup written out from its definition (linear warmup over 2 steps to 0.003, then cosine to
// 0.0003 at step 12), in double: an independent oracle, not the function finish_step calls.
double expected_lr(int64_t n) {
  if (n < 2) return 0.003 * static_cast<double>(n + 1) / 2.0;
  const double progress = std::min(1.0, static_cast<double>(n - 2) / 10.0);
  return 0.0003 + 0.5 * (1.0 + std::cos(M_PI * progress)) * (0.003 - 0.0003);
}

ConsensusFields fields_of(StepState& st) {
  return ConsensusFields{&st.found_inf,        &st.scaler.scale, &st.scaler.growth_tracker,
                         &st.agreed_found_inf, &st.agreed_stop,  &st.disagree};
}

// The consensus of one rank (the all-reduce is the identity): `edit` may change the reduced payload first, as other
// ranks' contributions would.
template <typename Edit>
void agree_alone(StepState& st, bool found_inf, bool stop, Edit edit) {
  st.found_inf = found_inf ? 1.0f : 0.0f;
  float v[kConsensusWords];
  consensus_fill(v, fields_of(st), stop);
  edit(v);
  consensus_decode(v, fields_of(st));
}
void fill(StepState& st, bool found_inf, bool stop) {
  agree_alone(st, found_inf, stop, [](float*) {});
}

TEST(DeviceStep, FinishStepEqualsTheCpuClassesOverSkipsGrowthAndSchedule) {
  StepSetup s = make_setup();
  StepState st;
  st.scaler = s.scaler.state();
  int64_t applied = 0;
  // Overflows at 2, 5, 6 (the second backoff needs hysteresis 2), growth every 3 clean steps otherwise.
  const bool flags[] = {false, true, false, false, false, true, true, false, false, false, false, false, false, false};
  for (int it = 0; it < 14; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it + 1));
    const double sum_sq = 0.25 * (it + 1) * (it + 1);  // norm 0.5 (it + 1): clipped from iteration 2 on
    st.sum_sq = sum_sq;
    st.step_loss = 3.0 * (it + 1);
    const float scale_before = s.scaler.scale();
    fill(st, flags[it], false);
    finish_step(st, s.step, 4.0);

    EXPECT_EQ(st.last_scale, scale_before);
    EXPECT_EQ(st.last_skipped, flags[it] ? 1 : 0);
    if (!flags[it]) {
      EXPECT_EQ(st.gate.apply, 1);
      EXPECT_EQ(st.gate.lr, s.schedule.lr(applied));  // the host's LrSchedule and the step agree bit for bit
      // and both are the schedule as defined: within 2 roundings to FP32 of the double oracle.
      EXPECT_NEAR(st.gate.lr, expected_lr(applied), 2 * 0.003 * 0x1p-24);
      EXPECT_EQ(st.grad_norm, std::sqrt(sum_sq));
      // clip_grad_norm's factor on the CPU: max_norm / (norm + 1e-6) when below 1.
      Tensor g = Tensor::zeros({1}, DType::kFloat32);
      g.data_as<float>()[0] = 1.0f;
      const float cpu_coef = clip_grad_norm(g, std::sqrt(sum_sq), 1.0f);
      EXPECT_EQ(st.gate.clip_coef, cpu_coef);
      // kernels::adamw_step's bias corrections for t = applied + 1.
      const double t = static_cast<double>(applied + 1);
      EXPECT_EQ(st.gate.bias_correction1, static_cast<float>(1.0 - std::pow(0.9, t)));
      EXPECT_EQ(st.gate.bias_correction2_sqrt, static_cast<float>(std::sqrt(1.0 - std::pow(0.95, t))));
      EXPECT_EQ(st.gate.first_step, applied == 0 ? 1 : 0);
      ++applied;
    } else {
      EXPECT_EQ(st.gate.apply, 0);
      EXPECT_TRUE(std::isnan(st.grad_norm));
    }
    s.scaler.update(flags[it]);
    EXPECT_TRUE(st.scaler == s.scaler.state()) << "every field of the scaler state, at iteration " << it;
    EXPECT_EQ(st.optimizer_steps, applied);
    EXPECT_EQ(st.status, 0);
  }
  // Loss shares: sum over iterations of 3 (it + 1) / 4 = 3 * 105 / 4.
  EXPECT_EQ(st.loss_sum, 3.0 * 105.0 / 4.0);
  EXPECT_EQ(s.scaler.state().skipped_steps, 3);
}

TEST(DeviceStep, RanksThatDisagreeOnTheScaleAreReported) {
  StepSetup s = make_setup();
  StepState st;
  st.scaler = s.scaler.state();
  // another rank's scale, as the MAX all-reduce of -S would show it
  agree_alone(st, false, false, [](float* v) { v[2] = -32768.0f; });
  finish_step(st, s.step, 1.0);
  EXPECT_EQ(st.status, kStateDisagree);
}

TEST(DeviceStep, StopIsStickyAndTooManySkipsStops) {
  StepSetup s = make_setup();
  s.step.scaler.max_consecutive_skips = 2;
  s.step.scaler.dynamic = false;
  StepState st;
  st.scaler = s.scaler.state();
  fill(st, true, true);
  finish_step(st, s.step, 1.0);
  EXPECT_EQ(st.stop, 1);
  EXPECT_EQ(st.status, 0);
  fill(st, true, false);
  finish_step(st, s.step, 1.0);
  EXPECT_EQ(st.stop, 1);  // a later step without the request keeps it
  EXPECT_EQ(st.status, kScalerTooManySkips);
  // The host turns the status into LossScaler's own error.
  LossScaler ls = LossScaler::from_config(cfg_of("precision { dtype: FP16 max_consecutive_skips: 2 }").precision(),
                                          FP16);
  ls.set_state(st.scaler);
  try {
    ls.throw_status(st.status);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 consecutive steps had non-finite gradients"), std::string::npos)
        << e.what();
  }
}

TEST(DeviceStep, BackoffBelowMinScaleStops) {
  StepSetup s = make_setup();
  s.step.scaler.hysteresis = 1;
  s.step.scaler.min_scale = 65536.0f;
  StepState st;
  st.scaler = s.scaler.state();
  st.scaler.hysteresis_tracker = 1;
  fill(st, true, false);
  finish_step(st, s.step, 1.0);
  EXPECT_EQ(st.status, kScalerBelowMinScale);
  EXPECT_EQ(st.scaler.scale, 65536.0f);  // never stored below the minimum
}

// ---- device selection without a GPU -------------------------------------------------------------------------------

struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (const char* old = std::getenv("AMPDIST_DEVICE")) saved = old, had = true;
    if (value) setenv("AMPDIST_DEVICE", value, 1);
    else unsetenv("AMPDIST_DEVICE");
  }
  ~EnvGuard() {
    if (had) setenv("AMPDIST_DEVICE", saved.c_str(), 1);
    else unsetenv("AMPDIST_DEVICE");
  }
  std::string saved;
  bool had = false;
};

TEST(DeviceSelection, EnvironmentAndConfigChooseTheDevice) {
  {
    EnvGuard env("cpu");
    EXPECT_EQ(resolve_device(cfg_of("device { kind: DEVICE_CUDA }")), Device::kCPU);
  }
  {
    EnvGuard env("gpu");
    try {
      resolve_device(RunConfig());
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("AMPDIST_DEVICE"), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    }
  }
  if (device::device_count() == 0) {
    EnvGuard env(nullptr);
    EXPECT_EQ(resolve_device(RunConfig()), Device::kCPU);  // AUTO without a GPU
    try {
      resolve_device(cfg_of("device { kind: DEVICE_CUDA }"));
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("device.kind asks for the GPU"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Tensor::empty({4}, DType::kFloat32, Device::kCUDA), Error);
  }
}

TEST(DeviceSelection, AutoPrecisionFollowsTheDevice) {
  EXPECT_EQ(resolve_dtype(AUTO, Device::kCPU), DType::kFloat32);
  EXPECT_EQ(resolve_dtype(AUTO, Device::kCUDA, /*device_has_bf16=*/true), DType::kBFloat16);
  EXPECT_EQ(resolve_dtype(AUTO, Device::kCUDA, /*device_has_bf16=*/false), DType::kFloat16);
  // fp16 without a configured loss scale gets the dynamic one.
  EXPECT_EQ(LossScaler::from_config(PrecisionConfig(), FP16).mode(), LossScaler::Mode::kDynamic);
}

}  // namespace
}  // namespace ampdist
