// The autocast policy: which precision each op runs in, as a table (like torch.autocast's op lists).
//
//   GEMM-like ops (linear)                                  -> the working dtype (fp16/bf16), FP32 accumulation
//   softmax, log-softmax, cross-entropy, layer norm, sums,
//   means over many elements, exp, log                      -> FP32
//   element-wise ops (relu, gelu, add)                      -> keep the input's dtype
//   embedding (a gather from the FP32 master weights)       -> FP32: the residual stream stays FP32, as under
//                                                              torch.autocast, where embedding is not cast
//   attention's q k^T and p v products                       -> the working dtype; its scores and softmax are
//                                                              "softmax" (FP32): q k^T is accumulated and kept in
//                                                              FP32, so logits beyond 65504 never overflow fp16
//
// The config can force single layers (precision.fp32_layers, by layer name) or op kinds everywhere
// (precision.fp32_ops, by the names below) to FP32.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "runtime/core/dtype.h"

namespace ampdist {

enum class OpKind { kLinear, kReLU, kGELU, kSoftmax, kLogSoftmax, kCrossEntropy, kLayerNorm, kSum, kMean, kExp, kLog,
                    kEmbedding, kAttention, kConv2d, kBatchNorm };

enum class OpPrecision {
  kWorking,    // the run's working dtype
  kFP32,       // always FP32
  kKeepInput,  // whatever dtype the input arrives in
};

// The table's entry for `op`.
OpPrecision autocast_rule(OpKind op);
// "linear", "relu", "gelu", "softmax", "log_softmax", "cross_entropy", "layer_norm", "sum", "mean", "exp", "log",
// "embedding", "attention", "conv2d", "batch_norm".
const char* op_kind_name(OpKind op);
// Inverse of op_kind_name; nullopt for an unknown name.
std::optional<OpKind> parse_op_kind(const std::string& name);

class Autocast {
 public:
  // working: the run's working dtype. fp32_layers / fp32_ops: the config's overrides.
  Autocast(DType working, std::set<std::string> fp32_layers = {}, std::set<OpKind> fp32_ops = {});

  DType working() const { return working_; }
  // The dtype op `op` of layer `layer` computes in, given its input's dtype.
  DType compute_dtype(OpKind op, const std::string& layer, DType input) const;
  // True when `layer` was forced to FP32.
  bool layer_forced_fp32(const std::string& layer) const { return fp32_layers_.count(layer) > 0; }

 private:
  DType working_;
  std::set<std::string> fp32_layers_;
  std::set<OpKind> fp32_ops_;
};

}  // namespace ampdist
