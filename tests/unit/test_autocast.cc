// The autocast table and its overrides, and how Linear / Activation layers pick their compute dtype from it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/amp/autocast.h"
#include "runtime/amp/master_weights.h"
#include "runtime/nn/module.h"

namespace ampdist {
namespace {

const OpKind kAllOps[] = {OpKind::kLinear,    OpKind::kReLU,      OpKind::kGELU, OpKind::kSoftmax,
                          OpKind::kLogSoftmax, OpKind::kCrossEntropy, OpKind::kLayerNorm, OpKind::kSum,
                          OpKind::kMean,      OpKind::kExp,       OpKind::kLog};

TEST(Autocast, Table) {
  EXPECT_EQ(autocast_rule(OpKind::kLinear), OpPrecision::kWorking);
  EXPECT_EQ(autocast_rule(OpKind::kReLU), OpPrecision::kKeepInput);
  EXPECT_EQ(autocast_rule(OpKind::kGELU), OpPrecision::kKeepInput);
  for (OpKind op : {OpKind::kSoftmax, OpKind::kLogSoftmax, OpKind::kCrossEntropy, OpKind::kLayerNorm, OpKind::kSum,
                    OpKind::kMean, OpKind::kExp, OpKind::kLog})
    EXPECT_EQ(autocast_rule(op), OpPrecision::kFP32) << op_kind_name(op);
}

TEST(Autocast, OpKindNamesRoundTrip) {
  const std::vector<std::string> names = {"linear", "relu",       "gelu", "softmax", "log_softmax", "cross_entropy",
                                          "layer_norm", "sum", "mean", "exp",     "log"};
  int i = 0;
  for (OpKind op : kAllOps) {
    EXPECT_EQ(op_kind_name(op), names[i]);
    const auto parsed = parse_op_kind(names[i]);
    ASSERT_TRUE(parsed.has_value()) << names[i];
    EXPECT_EQ(*parsed, op);
    ++i;
  }
  EXPECT_FALSE(parse_op_kind("softmaxx").has_value());
  EXPECT_FALSE(parse_op_kind("Linear").has_value());
  EXPECT_FALSE(parse_op_kind("").has_value());
}

TEST(Autocast, ComputeDtypeWithoutOverrides) {
  for (DType working : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    const Autocast ac(working);
    EXPECT_EQ(ac.working(), working);
    for (DType in : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
      EXPECT_EQ(ac.compute_dtype(OpKind::kLinear, "fc1", in), working);
      EXPECT_EQ(ac.compute_dtype(OpKind::kReLU, "act1", in), in);
      EXPECT_EQ(ac.compute_dtype(OpKind::kGELU, "act1", in), in);
      EXPECT_EQ(ac.compute_dtype(OpKind::kCrossEntropy, "loss", in), DType::kFloat32);
      EXPECT_EQ(ac.compute_dtype(OpKind::kLayerNorm, "ln", in), DType::kFloat32);
      EXPECT_EQ(ac.compute_dtype(OpKind::kSum, "x", in), DType::kFloat32);
    }
  }
}

TEST(Autocast, ComputeDtypeWithOverrides) {
  const Autocast ac(DType::kFloat16, {"fc1", "act2"}, {OpKind::kGELU});
  EXPECT_TRUE(ac.layer_forced_fp32("fc1"));
  EXPECT_FALSE(ac.layer_forced_fp32("fc2"));
  EXPECT_EQ(ac.compute_dtype(OpKind::kLinear, "fc1", DType::kFloat16), DType::kFloat32);  // layer forced
  EXPECT_EQ(ac.compute_dtype(OpKind::kLinear, "fc2", DType::kFloat32), DType::kFloat16);  // working, whatever input
  EXPECT_EQ(ac.compute_dtype(OpKind::kReLU, "act1", DType::kFloat16), DType::kFloat16);   // keep input
  EXPECT_EQ(ac.compute_dtype(OpKind::kReLU, "act2", DType::kFloat16), DType::kFloat32);   // layer forced
  EXPECT_EQ(ac.compute_dtype(OpKind::kGELU, "act1", DType::kBFloat16), DType::kFloat32);  // op kind forced
  EXPECT_EQ(ac.compute_dtype(OpKind::kSoftmax, "fc2", DType::kFloat16), DType::kFloat32);
  const Autocast lin(DType::kBFloat16, {}, {OpKind::kLinear});
  EXPECT_EQ(lin.compute_dtype(OpKind::kLinear, "anything", DType::kBFloat16), DType::kFloat32);
}

TEST(Autocast, LinearComputesInAutocastDtype) {
  const Autocast half_ac(DType::kFloat16);
  Linear fc1("fc1", 4, 3, true, half_ac);
  EXPECT_EQ(fc1.compute_dtype(), DType::kFloat16);
  const Autocast forced(DType::kFloat16, {"fc1"});
  Linear fc1_forced("fc1", 4, 3, true, forced);
  Linear fc2("fc2", 3, 2, true, forced);
  EXPECT_EQ(fc1_forced.compute_dtype(), DType::kFloat32);
  EXPECT_EQ(fc2.compute_dtype(), DType::kFloat16);
  EXPECT_EQ(Linear("x", 2, 2, false, Autocast(DType::kBFloat16)).compute_dtype(), DType::kBFloat16);

  // Forward outputs carry that dtype; an FP32 input to an fp16 layer is cast on the way in.
  std::vector<Parameter*> params;
  fc1.collect_parameters(params);
  fc1_forced.collect_parameters(params);
  EXPECT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0]->name, "fc1.weight");
  EXPECT_EQ(params[1]->name, "fc1.bias");
  EXPECT_EQ(params[0]->shape, (Shape{3, 4}));
  EXPECT_FLOAT_EQ(params[0]->init_bound, 0.5f);  // 1/sqrt(in = 4), as nn.Linear
  auto masters = bind_parameters(params, DType::kFloat16, Device::kCPU, 3);
  MasterWeights& mw = *masters;
  Tensor x = Tensor::zeros({2, 4}, DType::kFloat32);
  x.data_as<float>()[1] = 1.0f;
  const Tensor& y = fc1.forward(x);
  EXPECT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  const Tensor& y32 = fc1_forced.forward(x);
  EXPECT_EQ(y32.dtype(), DType::kFloat32);
  // The FP32 layer reads the FP32 master weights: y = W[:, 1] + b exactly (one product with 1, one add).
  for (int o = 0; o < 3; ++o)
    EXPECT_EQ(y32.item(o), params[2]->master.item(o * 4 + 1) + params[3]->master.item(o)) << o;
  // The fp16 layer reads the fp16 working copy and rounds its output once.
  for (int o = 0; o < 3; ++o)
    EXPECT_EQ(y.item(o), static_cast<float>(half(params[0]->working.item(o * 4 + 1) + params[1]->working.item(o))));
}

TEST(Autocast, ActivationKeepsInputUnlessForced) {
  const Autocast ac(DType::kFloat16, {"act_forced"});
  Activation keep("act", Activation::Kind::kReLU, ac);
  Activation forced("act_forced", Activation::Kind::kGELU, ac);
  Tensor x = Tensor::zeros({2, 2}, DType::kFloat16);
  EXPECT_EQ(keep.forward(x).dtype(), DType::kFloat16);
  EXPECT_EQ(forced.forward(x).dtype(), DType::kFloat32);
  Tensor xb = Tensor::zeros({2, 2}, DType::kBFloat16);
  EXPECT_EQ(keep.forward(xb).dtype(), DType::kBFloat16);
}

}  // namespace
}  // namespace ampdist
