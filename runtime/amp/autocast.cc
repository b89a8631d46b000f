#include "runtime/amp/autocast.h"

#include <utility>

namespace ampdist {

namespace {
struct Entry {
  OpKind op;
  const char* name;
  OpPrecision rule;
};
constexpr Entry kTable[] = {
    {OpKind::kLinear, "linear", OpPrecision::kWorking},
    {OpKind::kReLU, "relu", OpPrecision::kKeepInput},
    {OpKind::kGELU, "gelu", OpPrecision::kKeepInput},
    {OpKind::kSoftmax, "softmax", OpPrecision::kFP32},
    {OpKind::kLogSoftmax, "log_softmax", OpPrecision::kFP32},
    {OpKind::kCrossEntropy, "cross_entropy", OpPrecision::kFP32},
    {OpKind::kLayerNorm, "layer_norm", OpPrecision::kFP32},
    {OpKind::kSum, "sum", OpPrecision::kFP32},
    {OpKind::kMean, "mean", OpPrecision::kFP32},
    {OpKind::kExp, "exp", OpPrecision::kFP32},
    {OpKind::kLog, "log", OpPrecision::kFP32},
    {OpKind::kEmbedding, "embedding", OpPrecision::kFP32},
    {OpKind::kAttention, "attention", OpPrecision::kWorking},
    {OpKind::kConv2d, "conv2d", OpPrecision::kWorking},
    {OpKind::kBatchNorm, "batch_norm", OpPrecision::kFP32},
};
const Entry& entry(OpKind op) {
  for (const Entry& e : kTable)
    if (e.op == op) return e;
  return kTable[0];
}
}  // namespace

OpPrecision autocast_rule(OpKind op) { return entry(op).rule; }
const char* op_kind_name(OpKind op) { return entry(op).name; }

std::optional<OpKind> parse_op_kind(const std::string& name) {
  for (const Entry& e : kTable)
    if (name == e.name) return e.op;
  return std::nullopt;
}

Autocast::Autocast(DType working, std::set<std::string> fp32_layers, std::set<OpKind> fp32_ops)
    : working_(working), fp32_layers_(std::move(fp32_layers)), fp32_ops_(std::move(fp32_ops)) {}

DType Autocast::compute_dtype(OpKind op, const std::string& layer, DType input) const {
  if (fp32_layers_.count(layer) || fp32_ops_.count(op)) return DType::kFloat32;
  switch (autocast_rule(op)) {
    case OpPrecision::kWorking: return working_;
    case OpPrecision::kFP32: return DType::kFloat32;
    case OpPrecision::kKeepInput: return input;
  }
  return input;
}

}  // namespace ampdist
