// Optimizers (torch.optim.SGD / AdamW formulas), LR schedules and global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/kernels/kernels.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/trainer.h"

namespace ampdist {
namespace {

Tensor vec(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kFloat32);
  for (size_t i = 0; i < v.size(); ++i) t.data_as<float>()[i] = v[i];
  return t;
}

// FP32 vs a double reference after a few steps: each step is a handful of FP32 roundings (2^-24 relative each), so
// 1e-6 relative to max(|ref|, 1e-3) leaves room for ~10 roundings while still catching any formula error.
void expect_close(const Tensor& got, const std::vector<double>& ref, double rel = 1e-6) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(ref.size()));
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got.item(i), ref[i], rel * std::max(std::fabs(ref[i]), 1e-3)) << "element " << i;
}

// torch.optim.SGD, written out independently in double.
struct SgdRef {
  double lr, momentum, dampening, wd;
  bool nesterov;
  std::vector<double> p, buf;
  bool first = true;
  void step(const std::vector<double>& grad) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + wd * p[i];
      if (momentum != 0) {
        buf[i] = first ? g : momentum * buf[i] + (1 - dampening) * g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
    first = false;
  }
};

const std::vector<float> kP0 = {1.0f, -2.0f, 0.5f, 0.0f};
const std::vector<std::vector<float>> kGrads = {
    {0.1f, 0.2f, -0.3f, 1.0f}, {-0.05f, 0.4f, 0.25f, 0.5f}, {0.2f, -0.1f, 0.0f, -0.75f}};

std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void run_sgd_case(float lr, float momentum, float dampening, float wd, bool nesterov) {
  SgdConfig cfg;
  cfg.set_momentum(momentum);
  cfg.set_dampening(dampening);
  cfg.set_nesterov(nesterov);
  Sgd opt(4, cfg, wd);
  Tensor p = vec(kP0);
  SgdRef ref{lr, momentum, dampening, wd, nesterov, to_d(kP0), std::vector<double>(4, 0.0)};
  for (size_t s = 0; s < kGrads.size(); ++s) {
    Tensor g = vec(kGrads[s]);
    opt.step(p, g, lr);
    ref.step(to_d(kGrads[s]));
    SCOPED_TRACE("step " + std::to_string(s + 1) + " momentum " + std::to_string(momentum) + " dampening " +
                 std::to_string(dampening) + " nesterov " + std::to_string(nesterov) + " wd " + std::to_string(wd));
    expect_close(p, ref.p);
    EXPECT_EQ(opt.step_count(), static_cast<int64_t>(s + 1));
  }
}

TEST(Sgd, PlainStepIsPMinusLrG) {
  Sgd opt(4, SgdConfig(), 0.0f);
  Tensor p = vec(kP0), g = vec(kGrads[0]);
  opt.step(p, g, 0.1f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.item(i), kP0[i] - 0.1f * kGrads[0][i]) << i;  // one FP32 mul and sub
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_TRUE(opt.state().empty());  // no momentum buffer without momentum
  EXPECT_EQ(opt.kind(), "sgd");
}

TEST(Sgd, ClosedFormsAgainstTorchFormula) {
  run_sgd_case(0.1f, 0.0f, 0.0f, 0.0f, false);   // plain
  run_sgd_case(0.1f, 0.0f, 0.0f, 0.01f, false);  // L2 weight decay added to the gradient
  run_sgd_case(0.1f, 0.9f, 0.0f, 0.0f, false);   // heavy-ball momentum, 3 steps
  run_sgd_case(0.1f, 0.9f, 0.0f, 0.01f, false);  // momentum + weight decay
  run_sgd_case(0.05f, 0.9f, 0.0f, 0.0f, true);   // Nesterov
  run_sgd_case(0.1f, 0.9f, 0.5f, 0.0f, false);   // dampening (not applied to the first step, as torch)
}

TEST(Sgd, MomentumHandUnrolled) {
  // lr 0.1, momentum 0.9, one element p0 = 1, gradients 1, 2, 3:
  //   b1 = 1            p1 = 1 - 0.1          = 0.9
  //   b2 = 0.9 + 2 = 2.9  p2 = 0.9 - 0.29      = 0.61
  //   b3 = 2.61 + 3 = 5.61  p3 = 0.61 - 0.561  = 0.049
  SgdConfig cfg;
  cfg.set_momentum(0.9f);
  Sgd opt(1, cfg, 0.0f);
  Tensor p = vec({1.0f});
  const double expect_p[] = {0.9, 0.61, 0.049}, expect_b[] = {1.0, 2.9, 5.61};
  for (int s = 0; s < 3; ++s) {
    Tensor g = vec({static_cast<float>(s + 1)});
    opt.step(p, g, 0.1f);
    // a few FP32 roundings of values of order 1-6: 1e-6 absolute
    EXPECT_NEAR(p.item(0), expect_p[s], 1e-6) << "step " << s + 1;
    ASSERT_EQ(opt.state().size(), 1u);
    EXPECT_EQ(opt.state()[0].first, "momentum");
    EXPECT_NEAR(opt.state()[0].second->item(0), expect_b[s], 1e-6) << "step " << s + 1;
  }
}

// torch.optim.AdamW, independently in double.
struct AdamWRef {
  double lr, b1, b2, eps, wd;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

TEST(AdamW, FirstStepClosedForm) {
  // Step 1: m_hat = g and v_hat = g^2, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
  AdamWConfig cfg;  // betas (0.9, 0.999), eps 1e-8
  const float lr = 1e-2f, wd = 0.1f;
  AdamW opt(4, cfg, wd);
  const std::vector<float> p0 = {1.0f, 2.0f, -1.0f, 0.5f}, g0 = {0.1f, -0.5f, 1e-3f, 0.0f};
  Tensor p = vec(p0), g = vec(g0);
  opt.step(p, g, lr);
  std::vector<double> ref(4);
  for (int i = 0; i < 4; ++i)
    ref[i] = p0[i] * (1.0 - double(lr) * wd) - double(lr) * g0[i] / (std::fabs(double(g0[i])) + 1e-8);
  expect_close(p, ref);
  EXPECT_EQ(p.item(3), 0.5f * (1.0f - lr * wd));  // zero gradient: decay only
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(AdamW, TwoStepsMatchReference) {
  // A skipped step leaves AdamW alone: p0 = 1, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.1, gradient 0.1 twice.
  AdamWConfig cfg;
  cfg.set_beta1(0.9f);
  cfg.set_beta2(0.999f);
  cfg.set_eps(1e-8f);
  AdamW opt(1, cfg, 0.1f);
  Tensor p = vec({1.0f});
  AdamWRef ref{1e-3, 0.9, 0.999, 1e-8, 0.1, {1.0}, {0.0}, {0.0}};
  for (int s = 0; s < 2; ++s) {
    Tensor g = vec({0.1f});
    opt.step(p, g, 1e-3f);
    ref.step({0.1});
  }
  EXPECT_EQ(opt.step_count(), 2);
  // m = 0.9 * 0.01 + 0.01 = 0.019: a few FP32 roundings, 1e-6 relative.
  EXPECT_NEAR(opt.exp_avg().item(0), 0.019, 0.019 * 1e-6);
  // v = 0.999 * 1e-5 + 1e-5 = 1.999e-5. The config holds beta2 as a proto float, fl(0.999) = 0.99900001287, so
  // 1 - beta2 = 0.000999987 is 1.29e-5 below 0.001 in relative terms and v carries that error (torch, whose betas
  // are doubles, gets 1.999e-5 to FP32 precision). The update itself does not: the bias correction 1 - beta2^t
  // uses the same beta2 and cancels it. Hence 2e-5 relative against 1.999e-5 ...
  EXPECT_NEAR(opt.exp_avg_sq().item(0), 1.999e-5, 1.999e-5 * 2e-5);
  // ... and 1e-6 relative against the exact value for beta2 = fl(0.999): (1 - b2)(1 + b2) * 0.01.
  const double b2 = 0.999f;
  EXPECT_NEAR(opt.exp_avg_sq().item(0), (1 - b2) * (1 + b2) * 0.01, 1.999e-5 * 1e-6);
  EXPECT_NEAR(p.item(0), ref.p[0], std::fabs(ref.p[0]) * 1e-6);
  // The reference itself: two decays and two steps of ~lr each.
  EXPECT_NEAR(ref.p[0], 1.0 * (1 - 1e-4) * (1 - 1e-4) - 2e-3, 1e-6);
  const auto st = opt.state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].first, "exp_avg");
  EXPECT_EQ(st[1].first, "exp_avg_sq");
  EXPECT_EQ(st[0].second->item(0), opt.exp_avg().item(0));
}

TEST(AdamW, SeveralStepsMatchReference) {
  AdamWConfig cfg;
  cfg.set_beta1(0.8f);
  cfg.set_beta2(0.99f);
  cfg.set_eps(1e-6f);
  AdamW opt(4, cfg, 0.05f);
  Tensor p = vec(kP0);
  AdamWRef ref{3e-2, 0.8f, 0.99f, 1e-6f, 0.05f, to_d(kP0), std::vector<double>(4), std::vector<double>(4)};
  for (int s = 0; s < 6; ++s) {
    const auto& g = kGrads[s % 3];
    Tensor gt = vec(g);
    opt.step(p, gt, 3e-2f);
    ref.step(to_d(g));
  }
  expect_close(p, ref.p, 2e-6);  // 6 steps
  expect_close(opt.exp_avg(), ref.m, 2e-6);
  expect_close(opt.exp_avg_sq(), ref.v, 2e-6);
}

// ---- learning-rate schedules --------------------------------------------------------------------------------------

TEST(LrSchedule, LinearWarmupC6) {
  ScheduleConfig cfg;
  cfg.set_warmup_steps(100);
  LrSchedule s(1.0f, cfg, 1000);
  EXPECT_EQ(s.lr(0), 0.01f);  // (n + 1) / 100, one correctly rounded division
  EXPECT_EQ(s.lr(1), 0.02f);
  EXPECT_EQ(s.lr(2), 0.03f);
  EXPECT_EQ(s.lr(49), 0.5f);
  EXPECT_EQ(s.lr(99), 1.0f);
  EXPECT_EQ(s.lr(100), 1.0f);  // constant afterwards
  EXPECT_EQ(s.lr(5000), 1.0f);
}

TEST(LrSchedule, Constant) {
  ScheduleConfig cfg;  // CONSTANT, no warmup
  LrSchedule s(0.05f, cfg, 10);
  for (int64_t n : {0, 1, 9, 10, 1000}) EXPECT_EQ(s.lr(n), 0.05f) << n;
}

TEST(LrSchedule, CosineAfterWarmup) {
  ScheduleConfig cfg;
  cfg.set_kind(COSINE);
  cfg.set_warmup_steps(10);
  cfg.set_min_lr(0.1f);
  LrSchedule s(1.0f, cfg, 110);  // total from the run (cfg.total_steps = 0)
  EXPECT_EQ(s.lr(0), 0.1f);
  EXPECT_EQ(s.lr(9), 1.0f);
  EXPECT_EQ(s.lr(10), 1.0f);                 // the cosine starts at lr
  EXPECT_FLOAT_EQ(s.lr(60), 0.55f);          // half way: (lr + min_lr) / 2
  EXPECT_EQ(s.lr(110), 0.1f);                // reaches min_lr at total_steps
  EXPECT_EQ(s.lr(500), 0.1f);                // and stays there
  // quarter way: min + (lr - min) (1 + cos(pi/4)) / 2
  EXPECT_FLOAT_EQ(s.lr(35), static_cast<float>(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4))));
  for (int64_t n = 10; n < 110; ++n) EXPECT_GE(s.lr(n), s.lr(n + 1)) << n;  // non-increasing

  // cfg.total_steps overrides the run's total.
  ScheduleConfig c2 = cfg;
  c2.set_total_steps(20);
  LrSchedule s2(1.0f, c2, 110);
  EXPECT_FLOAT_EQ(s2.lr(15), 0.55f);
  EXPECT_EQ(s2.lr(20), 0.1f);
}

// ---- clipping -----------------------------------------------------------------------------------------------------

TEST(ClipGradNorm, ScalesByMaxNormOverNorm) {
  // Clip after one unscale: gradient [3, 4], norm 5, max_norm 1.
  Tensor g = vec({3.0f, 4.0f});
  const float f = clip_grad_norm(g, 5.0, 1.0f);
  EXPECT_EQ(f, static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_EQ(g.item(0), 3.0f * f);
  EXPECT_EQ(g.item(1), 4.0f * f);
  EXPECT_NEAR(g.item(0), 0.6, 2e-7);  // 0.6 * (1 - 2e-7) from the 1e-6 in the denominator
  EXPECT_NEAR(g.item(1), 0.8, 2e-7);
}

TEST(ClipGradNorm, NoClipWhenNormBelowMaxOrDisabled) {
  Tensor g = vec({3.0f, 4.0f});
  EXPECT_EQ(clip_grad_norm(g, 5.0, 10.0f), 1.0f);
  EXPECT_EQ(g.item(0), 3.0f);
  EXPECT_EQ(g.item(1), 4.0f);
  EXPECT_EQ(clip_grad_norm(g, 5.0, 5.0001f), 1.0f);
  EXPECT_EQ(g.item(0), 3.0f);
  EXPECT_EQ(clip_grad_norm(g, 1e30, 0.0f), 1.0f);  // max_norm 0 disables clipping
  EXPECT_EQ(g.item(0), 3.0f);
  EXPECT_EQ(g.item(1), 4.0f);
}

// ---- factory ------------------------------------------------------------------------------------------------------

TEST(MakeOptimizer, PicksKindAndState) {
  OptimizerConfig plain;
  auto a = make_optimizer(plain, 8);
  EXPECT_EQ(a->kind(), "sgd");
  EXPECT_TRUE(a->state().empty());

  OptimizerConfig mom;
  mom.mutable_sgd()->set_momentum(0.9f);
  auto b = make_optimizer(mom, 8);
  EXPECT_EQ(b->kind(), "sgd");
  auto sb = b->state();
  ASSERT_EQ(sb.size(), 1u);
  EXPECT_EQ(sb[0].first, "momentum");
  EXPECT_EQ(sb[0].second->numel(), 8);

  OptimizerConfig adam;
  adam.mutable_adamw();
  adam.set_weight_decay(0.1f);
  auto c = make_optimizer(adam, 8);
  EXPECT_EQ(c->kind(), "adamw");
  auto sc = c->state();
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].first, "exp_avg");
  EXPECT_EQ(sc[1].first, "exp_avg_sq");
  EXPECT_EQ(sc[0].second->numel(), 8);
  EXPECT_EQ(sc[0].second->item(7), 0.0f);  // moments start at zero
  // The weight decay reaches the optimizer: zero gradient, one step shrinks p by (1 - lr wd).
  Tensor p = Tensor::zeros({8}, DType::kFloat32), g = Tensor::zeros({8}, DType::kFloat32);
  p.data_as<float>()[0] = 1.0f;
  c->step(p, g, 0.5f);
  EXPECT_EQ(p.item(0), 1.0f - 0.5f * 0.1f);
}

// ---- parameter groups (optimizer.no_decay) ----------------------------------------------------------------------

TEST(NoDecay, AdamWFirstStepClosedFormPerGroup) {
  // Step 1 of AdamW: p1 = p0 (1 - lr wd) - lr g / (|g| + eps) where decay applies, p1 = p0 - lr g / (|g| + eps) in
  // the no-decay ranges [1, 3) and [4, 5); with g = 0 that is p0 (1 - lr wd), resp. exactly p0.
  AdamWConfig cfg;
  const float lr = 1e-2f, wd = 0.1f;
  AdamW opt(6, cfg, wd);
  opt.set_no_decay({{1, 3}, {4, 5}});
  const std::vector<float> p0 = {1.0f, 2.0f, -1.0f, 0.5f, 3.0f, -2.0f}, g0 = {0.1f, -0.5f, 0.0f, 0.0f, 0.0f, 0.25f};
  Tensor p = vec(p0), g = vec(g0);
  opt.step(p, g, lr);
  const bool decays[6] = {true, false, false, true, false, true};
  std::vector<double> ref(6);
  for (int i = 0; i < 6; ++i)
    ref[i] = p0[i] * (decays[i] ? 1.0 - double(lr) * wd : 1.0) -
             double(lr) * g0[i] / (std::fabs(double(g0[i])) + 1e-8);
  expect_close(p, ref);
  EXPECT_EQ(p.item(2), -1.0f);                       // no decay, zero gradient: unchanged, bitwise
  EXPECT_EQ(p.item(4), 3.0f);
  EXPECT_EQ(p.item(3), 0.5f * (1.0f - lr * wd));     // decay, zero gradient: decay only
  // The decayed elements are bitwise those of a whole-buffer update (the same per-element function).
  AdamW whole(6, cfg, wd);
  Tensor q = vec(p0), gq = vec(g0);
  whole.step(q, gq, lr);
  for (int i : {0, 3, 5}) EXPECT_EQ(p.item(i), q.item(i)) << i;
  // Moments are per element whatever the group: m = (1 - beta1) g after one step.
  EXPECT_FLOAT_EQ(opt.exp_avg().item(1), 0.1f * -0.5f);
}

TEST(NoDecay, SgdMomentumFirstStepClosedFormPerGroup) {
  // torch.optim.SGD's first step with momentum: buf = g + wd p, p1 = p0 - lr buf; no decay: buf = g.
  SgdConfig cfg;
  cfg.set_momentum(0.9f);
  const float lr = 0.5f, wd = 0.25f;
  Sgd opt(4, cfg, wd);
  opt.set_no_decay({{2, 4}});
  const std::vector<float> p0 = {1.0f, -2.0f, 4.0f, 8.0f}, g0 = {0.5f, 0.25f, 0.5f, 0.0f};
  Tensor p = vec(p0), g = vec(g0);
  opt.step(p, g, lr);
  // Values chosen exact in FP32: 1 - 0.5 (0.5 + 0.25) = 0.625; -2 - 0.5 (0.25 - 0.5) = -1.875; 4 - 0.25 = 3.75; 8.
  EXPECT_EQ(p.item(0), 0.625f);
  EXPECT_EQ(p.item(1), -1.875f);
  EXPECT_EQ(p.item(2), 3.75f);
  EXPECT_EQ(p.item(3), 8.0f);
}

TEST(NoDecay, RangesAreCheckedSortedAndDisjoint) {
  Sgd opt(8, SgdConfig(), 0.1f);
  EXPECT_THROW(opt.set_no_decay({{4, 6}, {2, 3}}), Error);
  EXPECT_THROW(opt.set_no_decay({{2, 5}, {4, 6}}), Error);
  EXPECT_NO_THROW(opt.set_no_decay({{0, 2}, {2, 3}}));
}

TEST(NoDecay, RangesFromPatternsIntersectTheZeroSlice) {
  // Layout: w0 [6] at 0, b0 [2] at 6, w1 [3] at 8, b1 [1] at 11: 12 elements; rank 1 of 2 holds [6, 12).
  FlatLayout layout;
  layout.add("fc0.weight", {2, 3});
  layout.add("fc0.bias", {2});
  layout.add("fc1.weight", {1, 3});
  layout.add("fc1.bias", {1});
  OptimizerConfig cfg;
  cfg.add_no_decay("*.bias");
  MasterWeights whole(layout, DType::kFloat32);
  EXPECT_EQ(no_decay_ranges(cfg, whole), (std::vector<std::pair<int64_t, int64_t>>{{6, 8}, {11, 12}}));
  MasterWeights r1(layout, DType::kFloat32, Device::kCPU, MasterSlice{1, 2});
  EXPECT_EQ(no_decay_ranges(cfg, r1), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {5, 6}}));
  MasterWeights r0(layout, DType::kFloat32, Device::kCPU, MasterSlice{0, 2});
  EXPECT_TRUE(no_decay_ranges(cfg, r0).empty());  // rank 0 holds fc0.weight only
  cfg.add_no_decay("fc1.*");  // [8, 12) follows fc0.bias [6, 8): merged into one range
  EXPECT_EQ(no_decay_ranges(cfg, whole), (std::vector<std::pair<int64_t, int64_t>>{{6, 12}}));
  cfg.add_no_decay("ln_*");
  try {
    no_decay_ranges(cfg, whole);
    FAIL() << "a pattern matching nothing must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.no_decay[2] \"ln_*\" matches no tensor"), std::string::npos)
        << e.what();
  }
}

// ---- the working copy written by the update (the unsharded 16-bit step's cast, fused) ------------------------------

// n elements over several 4096-element blocks and a ragged tail, values over many binades, some of which round to
// the same 16-bit value, some halfway cases.
std::vector<float> spread(int64_t n, float scale, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;  // Numerical Recipes' LCG: any fixed sequence will do
    const float u = static_cast<float>(x >> 8) / static_cast<float>(1u << 24);  // [0, 1)
    e = scale * (u - 0.5f) * std::ldexp(1.0f, static_cast<int>(x % 13u) - 6);
  }
  return v;
}

std::vector<uint16_t> bits16(const Tensor& t) {
  std::vector<uint16_t> b(static_cast<size_t>(t.numel()));
  std::memcpy(b.data(), t.data(), b.size() * sizeof(uint16_t));
  return b;
}

// Runs `steps` updates of one optimizer kind with and without a working copy: the master weights and the moments
// must be bitwise those of the plain update, and after every step the working copy bitwise cast(master). A skipped
// step (gate.apply = 0) must leave the working copy as it was.
void check_fused_working(const OptimizerConfig& cfg, DType working_dtype, bool no_decay) {
  const int64_t n = 3 * 4096 + 1234;  // the CPU kernel rounds in 4096-element blocks: several, and a tail
  auto fused = make_optimizer(cfg, n), plain = make_optimizer(cfg, n);
  if (no_decay) {
    fused->set_no_decay({{100, 5000}, {9000, 9001}});
    plain->set_no_decay({{100, 5000}, {9000, 9001}});
  }
  Tensor p = vec(spread(n, 4.0f, 1)), q = vec(spread(n, 4.0f, 1));
  Tensor working = Tensor::empty({n}, working_dtype), want = Tensor::empty({n}, working_dtype);
  kernels::cast(p, working);
  for (int s = 0; s < 4; ++s) {
    const Tensor g = vec(spread(n, 0.1f, 100 + s));
    StepGate gate;
    gate.apply = s == 2 ? 0 : 1;  // step 2 is skipped
    gate.first_step = s == 0;
    gate.lr = 0.01f;
    gate.clip_coef = s == 3 ? 0.5f : 1.0f;
    math::adamw_bias_corrections(0.9, 0.999, s + 1, gate.bias_correction1, gate.bias_correction2_sqrt);
    const std::vector<uint16_t> before = bits16(working);
    fused->step(p, g, &gate, &working);
    plain->step(q, g, &gate);
    ASSERT_EQ(std::memcmp(p.data(), q.data(), p.nbytes()), 0) << "master weights differ at step " << s;
    kernels::cast(q, want);
    EXPECT_EQ(bits16(working), bits16(want)) << "working copy is not the cast of the master at step " << s;
    if (s == 2) {
      EXPECT_EQ(bits16(working), before) << "a skipped step wrote the working copy";
    }
    if (s == 1) {
      EXPECT_NE(bits16(working), before) << "the update changed no working weight: the test is vacuous";
    }
  }
  const auto fs = fused->state(), ps = plain->state();
  ASSERT_EQ(fs.size(), ps.size());
  for (size_t i = 0; i < fs.size(); ++i)
    EXPECT_EQ(std::memcmp(fs[i].second->data(), ps[i].second->data(), fs[i].second->nbytes()), 0) << fs[i].first;
}

OptimizerConfig sgd_nesterov() {
  OptimizerConfig c;
  c.mutable_sgd()->set_momentum(0.9f);
  c.mutable_sgd()->set_nesterov(true);
  c.set_weight_decay(1e-4f);
  return c;
}
OptimizerConfig adamw_wd() {
  OptimizerConfig c;
  c.mutable_adamw();
  c.set_weight_decay(0.1f);
  return c;
}

TEST(FusedWorking, SgdWritesTheCastOfTheUpdatedMaster) {
  check_fused_working(sgd_nesterov(), DType::kBFloat16, false);
  check_fused_working(sgd_nesterov(), DType::kFloat16, true);
  check_fused_working(OptimizerConfig(), DType::kBFloat16, false);  // no momentum: the other loop
}

TEST(FusedWorking, AdamWWritesTheCastOfTheUpdatedMaster) {
  check_fused_working(adamw_wd(), DType::kBFloat16, true);
  check_fused_working(adamw_wd(), DType::kFloat16, false);
}

TEST(FusedWorking, AWorkingCopyOfAnotherDtypeOrSizeIsRefused) {
  Tensor p = vec({1.0f, 2.0f}), g = vec({0.0f, 0.0f}), buf = Tensor::zeros({2}, DType::kFloat32);
  Tensor f32 = Tensor::zeros({2}, DType::kFloat32), short_copy = Tensor::zeros({1}, DType::kBFloat16);
  const kernels::SgdParams sp{0.1f, 0.9f, 0.0f, 0.0f, false, true};
  EXPECT_THROW(kernels::sgd_step(p, g, buf, sp, nullptr, &f32), Error);
  EXPECT_THROW(kernels::sgd_step(p, g, buf, sp, nullptr, &short_copy), Error);
  Tensor m = Tensor::zeros({2}, DType::kFloat32), v = Tensor::zeros({2}, DType::kFloat32);
  EXPECT_THROW(kernels::adamw_step(p, g, m, v, {1e-3f, 0.9, 0.999, 1e-8, 0.0f, 1}, nullptr, &f32), Error);
  EXPECT_EQ(p.item(0), 1.0f);  // refused before anything changed
}

TEST(FusedWorking, MasterWeightsForgetTheCurrentCopyWhenMasterIsWritten) {
  FlatLayout layout;
  layout.add("w", {4});
  MasterWeights mw(layout, DType::kBFloat16);
  mw.fill([](size_t, int64_t first, int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i) out[i] = 1.0f + static_cast<float>(first + i);
  });
  EXPECT_EQ(mw.working().item(3), 4.0f);
  mw.master().data_as<float>()[3] = 8.0f;  // a write through master(), as a checkpoint load or a test does
  mw.ensure_working();
  EXPECT_EQ(mw.working().item(3), 8.0f) << "ensure_working skipped the cast after master() was written";
  // After an update that wrote the working copy, ensure_working leaves it alone: poke the copy to see that.
  ASSERT_NE(mw.fused_working_out(), nullptr);
  mw.mark_working_current();
  static_cast<uint16_t*>(mw.working().data())[0] = 0;  // bf16 +0
  mw.ensure_working();
  EXPECT_EQ(mw.working().item(0), 0.0f) << "ensure_working cast although the copy was current";
  mw.cast_to_working();  // the explicit cast always runs
  EXPECT_EQ(mw.working().item(0), 1.0f);
  MasterWeights f32(layout, DType::kFloat32);
  EXPECT_EQ(f32.fused_working_out(), nullptr);  // FP32: the working copy is the master buffer
}

}  // namespace
}  // namespace ampdist
