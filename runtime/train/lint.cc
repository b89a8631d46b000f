#include "runtime/train/lint.h"

#include <algorithm>

namespace ampdist {

std::vector<std::string> lint_config(const RunConfig& cfg, DType working, int64_t in_features, int64_t classes,
                                     int64_t micro_batch) {
  std::vector<std::string> out;
  if (cfg.comm().mode() == REDUCE_SCATTER && !cfg.optimizer().has_zero_stage())
    out.push_back("comm.mode: REDUCE_SCATTER is deprecated: it means optimizer.zero_stage: 1, which this run uses; "
                  "set optimizer.zero_stage instead");
  const PrecisionConfig& p = cfg.precision();
  if (working == DType::kFloat16) {
    const auto& forced = p.fp32_layers();
    const bool linear_fp32 = std::find(p.fp32_ops().begin(), p.fp32_ops().end(), "linear") != p.fp32_ops().end();
    // The MLP's layer widths (the other models' shapes are not the fc chain this names); the GEMMs' rows are the
    // micro-batch, or for the GPT the micro-batch's tokens (micro-batch x seq_len).
    std::vector<int64_t> widths;
    if (cfg.model().has_mlp()) {
      widths.push_back(in_features);
      for (int64_t h : cfg.model().mlp().hidden()) widths.push_back(h);
      widths.push_back(classes);
    }
    if (cfg.model().has_gpt()) micro_batch *= cfg.model().gpt().seq_len();
    std::vector<std::string> bad;
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      const std::string layer = "fc" + std::to_string(i + 1);
      if (linear_fp32 || std::find(forced.begin(), forced.end(), layer) != forced.end()) continue;
      if (widths[i] % 8 != 0) bad.push_back(layer + " in_features " + std::to_string(widths[i]));
      if (widths[i + 1] % 8 != 0) bad.push_back(layer + " out_features " + std::to_string(widths[i + 1]));
    }
    if (micro_batch > 0 && micro_batch % 8 != 0)
      bad.push_back((cfg.model().has_gpt() ? "tokens per micro-batch " : "micro-batch ") + std::to_string(micro_batch));
    if (!bad.empty()) {
      std::string list;
      for (const std::string& b : bad) list += (list.empty() ? "" : ", ") + b;
      out.push_back("fp16 GEMM dimensions not a multiple of 8 (" + list +
                    "): tensor cores run fp16 GEMMs at full rate only when every dimension is; pad them (e.g. "
                    "model.mlp.hidden) or force the layer to FP32 with precision.fp32_layers");
    }
    if (p.has_none() || (p.has_static_scale() && p.static_scale().scale() == 1.0f))
      out.push_back(std::string("fp16 without loss scaling (") +
                    (p.has_none() ? "precision.none" : "precision.static_scale.scale 1") +
                    "): gradients below 2^-24 underflow to zero; use precision.dynamic (the default for fp16)");
  }
  if (working != DType::kFloat16 && (p.has_dynamic() || p.has_static_scale()))
    out.push_back(std::string(p.has_dynamic() ? "precision.dynamic" : "precision.static_scale") + " with " +
                  dtype_name(working) + ": loss scaling only changes the numbers here (it exists for fp16's narrow " +
                  "range; " + dtype_name(working) + " has fp32's exponent range)");
  return out;
}

}  // namespace ampdist
