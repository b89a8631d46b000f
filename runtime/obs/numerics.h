// The per-layer numerics report (precision.numerics_report_every): how close each layer's values come to the
// working dtype's limits, and which layer produced the first non-finite value of a step.
//
// Per layer, over one optimizer step on this rank (max over micro-batches), then combined over ranks:
//   act_max     max |output| of the layer's forward, in the layer's output dtype
//   grad_max    max |gradient| of the layer's parameters, still multiplied by the loss scale (before unscale);
//               only layers with parameters (others: -1); read from the last micro-batch, when it is complete
//   underflow   the fraction of those gradient elements that are non-zero but would round to zero in the working
//               dtype (|g| <= half its smallest subnormal: 2^-25 for fp16, 2^-134 for bf16; none for fp32)
//   headroom    log2(dtype max / max(act_max, grad_max)) in bits (binades) before overflow to inf
// A non-finite value's position is ordered as the step computes: forward outputs in layer order, then parameter
// gradients in the order backward finishes them (last layer first). The first such position over all ranks names
// the layer and the pass ("forward" or "backward").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/dtype.h"

namespace ampdist {

struct LayerNumerics {
  std::string name;           // "fc1", "act1"
  double act_max = 0.0;       // +inf when non-finite (NaN included)
  double grad_max = -1.0;     // -1: the layer has no parameters; +inf when non-finite
  int64_t grad_elements = 0;  // gradient elements inspected (summed over ranks)
  int64_t grad_underflow = 0; // of which non-zero but below the working dtype's rounding-to-zero threshold
  double underflow_fraction() const {
    return grad_elements ? static_cast<double>(grad_underflow) / static_cast<double>(grad_elements) : 0.0;
  }
};

struct NumericsReport {
  int64_t step = 0;
  std::string dtype;                 // working dtype: "fp32", "fp16", "bf16"
  double dtype_max = 0.0;            // its largest finite value
  std::vector<LayerNumerics> layers; // in forward order
  std::string first_nonfinite_layer; // "" when every value was finite
  std::string first_nonfinite_pass;  // "forward" or "backward"
  // log2(dtype_max / the larger of the layer's maxima); +inf for a layer of zeros, -inf when non-finite.
  double headroom_bits(const LayerNumerics& l) const;
};

// What the monitor records of one tensor, computed where the tensor lives by the caller (kernels::abs_stats).
struct ValueStats {
  double max_abs = 0.0;    // max |x| over the finite elements
  bool nonfinite = false;  // some element is inf or NaN
  int64_t below = 0;       // elements with 0 < |x| <= the threshold the stats were taken with
  int64_t elements = 0;    // elements inspected
};

// Collects the statistics of one step. Layer names in forward order; a parameter belongs to the layer whose name
// is its name before the last '.' ("fc1.weight" -> "fc1").
class NumericsMonitor {
 public:
  NumericsMonitor(std::vector<std::string> layer_names, DType working);

  void begin_step();
  // After layer `index`'s forward: the statistics of its output (any dtype; `below` is not used).
  void on_activation(size_t index, const ValueStats& y);
  // After a parameter's gradient is complete for the step (FP32, before the reduction): its statistics, `below`
  // counted at underflow_threshold(working dtype).
  void on_gradient(const std::string& param_name, const ValueStats& grad);
  // Combines this step's statistics over ranks (collective: every rank calls it at the same step) into a report.
  NumericsReport reduce(Communicator& comm, int64_t step) const;

  // The rounding-to-zero threshold of `t` for gradient values: half the smallest subnormal (0 for fp32).
  static double underflow_threshold(DType t);

 private:
  int layer_of(const std::string& param_name) const;
  std::vector<std::string> names_;
  DType working_;
  std::vector<double> act_max_, grad_max_;
  std::vector<int64_t> grad_elems_, grad_under_;
  int64_t events_ = 0;                        // positions handed out this step
  int64_t first_pos_ = -1;                    // position of the first non-finite value, -1 none
  int first_layer_ = -1;
  bool first_forward_ = true;
};

}  // namespace ampdist
