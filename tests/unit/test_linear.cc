// One Linear layer in FP32, forward and backward, against a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/core/rng.h"
#include "runtime/nn/module.h"
#include "tests/test_tensors.h"

namespace ampdist {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24

const testing::TensorRng random_tensor{77};

// FP32 sums of n products (exact inputs) against double: |error| <= (n + 2) 2^-24 sum |terms| (Higham's gamma_n for
// recursive summation; +2 for the product rounding and the bias or beta add).
double tol(int64_t n, double magnitude) { return (n + 2) * kU * magnitude; }

struct LinearFixture {
  static constexpr int64_t B = 5, IN = 7, OUT = 4;
  Autocast ac{DType::kFloat32};
  Linear lin{"fc", IN, OUT, true, ac};
  std::vector<Parameter*> params;
  std::unique_ptr<MasterWeights> mw;
  LinearFixture() {
    lin.collect_parameters(params);
    mw = bind_parameters(params, DType::kFloat32, Device::kCPU, 11);
  }
  double W(int64_t o, int64_t i) const { return params[0]->master.item(o * IN + i); }
  double b(int64_t o) const { return params[1]->master.item(o); }
};

TEST(Linear, Fp32ForwardBackwardMatchDoubleReference) {
  LinearFixture f;
  constexpr int64_t B = LinearFixture::B, IN = LinearFixture::IN, OUT = LinearFixture::OUT;
  ASSERT_EQ(f.lin.compute_dtype(), DType::kFloat32);
  Tensor x = random_tensor({B, IN}, 1);
  const Tensor& y = f.lin.forward(x);
  ASSERT_EQ(y.shape(), (Shape{B, OUT}));
  ASSERT_EQ(y.dtype(), DType::kFloat32);
  for (int64_t n = 0; n < B; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double ref = f.b(o), mag = std::fabs(f.b(o));
      for (int64_t i = 0; i < IN; ++i) {
        ref += x.item(n * IN + i) * f.W(o, i);
        mag += std::fabs(x.item(n * IN + i) * f.W(o, i));
      }
      EXPECT_NEAR(y.item(n * OUT + o), ref, tol(IN, mag)) << "y(" << n << ", " << o << ")";
    }

  Tensor dy = random_tensor({B, OUT}, 2);
  std::vector<std::string> ready;
  GradContext ctx;
  ctx.accumulate = false;
  ctx.on_grad_ready = [&](Parameter& p) { ready.push_back(p.name); };
  // Stale values in the gradient buffer must be overwritten when accumulate is false.
  for (int64_t i = 0; i < f.mw->numel(); ++i) f.mw->grads().data_as<float>()[i] = 1e6f;
  const Tensor& dx = f.lin.backward(dy, ctx);
  EXPECT_EQ(ready, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  ASSERT_EQ(dx.shape(), (Shape{B, IN}));

  std::vector<double> dW(OUT * IN), db(OUT);
  for (int64_t o = 0; o < OUT; ++o) {
    double mag_b = 0;
    for (int64_t n = 0; n < B; ++n) {
      db[o] += dy.item(n * OUT + o);
      mag_b += std::fabs(dy.item(n * OUT + o));
    }
    EXPECT_NEAR(f.params[1]->grad.item(o), db[o], tol(B, mag_b)) << "db(" << o << ")";
    for (int64_t i = 0; i < IN; ++i) {
      double mag = 0;
      for (int64_t n = 0; n < B; ++n) {
        dW[o * IN + i] += dy.item(n * OUT + o) * x.item(n * IN + i);
        mag += std::fabs(dy.item(n * OUT + o) * x.item(n * IN + i));
      }
      EXPECT_NEAR(f.params[0]->grad.item(o * IN + i), dW[o * IN + i], tol(B, mag)) << "dW(" << o << ", " << i << ")";
    }
  }
  for (int64_t n = 0; n < B; ++n)
    for (int64_t i = 0; i < IN; ++i) {
      double ref = 0, mag = 0;
      for (int64_t o = 0; o < OUT; ++o) {
        ref += dy.item(n * OUT + o) * f.W(o, i);
        mag += std::fabs(dy.item(n * OUT + o) * f.W(o, i));
      }
      EXPECT_NEAR(dx.item(n * IN + i), ref, tol(OUT, mag)) << "dx(" << n << ", " << i << ")";
    }

  // A second micro-batch with accumulate = true adds its gradients to the first's.
  Tensor x2 = random_tensor({B, IN}, 3);
  Tensor dy2 = random_tensor({B, OUT}, 4);
  f.lin.forward(x2);
  ctx.accumulate = true;
  ctx.need_input_grad = false;
  const Tensor& none = f.lin.backward(dy2, ctx);
  EXPECT_FALSE(none.defined());  // nobody needs dx of the first layer
  for (int64_t o = 0; o < OUT; ++o) {
    double ref_b = db[o], mag_b = 0;
    for (int64_t n = 0; n < B; ++n) {
      ref_b += dy2.item(n * OUT + o);
      mag_b += std::fabs(dy.item(n * OUT + o)) + std::fabs(dy2.item(n * OUT + o));
    }
    EXPECT_NEAR(f.params[1]->grad.item(o), ref_b, tol(2 * B, mag_b)) << "accumulated db(" << o << ")";
    for (int64_t i = 0; i < IN; ++i) {
      double ref = dW[o * IN + i], mag = 0;
      for (int64_t n = 0; n < B; ++n) {
        ref += dy2.item(n * OUT + o) * x2.item(n * IN + i);
        mag += std::fabs(dy2.item(n * OUT + o) * x2.item(n * IN + i)) + std::fabs(dy.item(n * OUT + o) * x.item(n * IN + i));
      }
      EXPECT_NEAR(f.params[0]->grad.item(o * IN + i), ref, tol(2 * B, mag)) << "accumulated dW(" << o << ", " << i << ")";
    }
  }
}

TEST(Linear, RejectsWrongInputWidth) {
  LinearFixture f;
  Tensor x = Tensor::zeros({2, LinearFixture::IN + 1}, DType::kFloat32);
  EXPECT_THROW(f.lin.forward(x), Error);
  EXPECT_THROW(Linear("bad", 0, 3, true, Autocast(DType::kFloat32)), Error);
}

}  // namespace
}  // namespace ampdist
