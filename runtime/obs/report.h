// `ampdist report`: runs' metrics.jsonl laid side by side in one self-contained HTML page (inline SVG and CSS, no
// script, nothing fetched from the network).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ampdist {

struct NumericsLayerRow {
  std::string name;
  double act_max = 0, grad_max = -1, underflow = 0, headroom_bits = 0;  // grad_max -1: no parameters
  bool act_nonfinite = false, grad_nonfinite = false;
};
struct NumericsSnapshot {
  int64_t step = 0;
  std::vector<NumericsLayerRow> layers;
  std::string first_layer, first_pass;  // "" when all finite
};

// What the report reads from one run directory: the records after the last {"type":"start"} of metrics.jsonl.
struct RunData {
  std::string dir, label;                          // label: the directory's base name
  std::string name, dtype;                         // from the start record
  int64_t world_size = 0, global_batch_size = 0;
  std::vector<std::pair<int64_t, double>> loss, lr, scale, grad_norm, samples_per_s, rss_mb;  // per logged step
  std::vector<std::pair<int64_t, int64_t>> skips;  // (log step, steps skipped since the previous log step) > 0
  std::vector<std::pair<int64_t, double>> eval_accuracy, eval_loss;
  bool has_summary = false;
  int64_t steps = 0, skipped_steps = 0;
  double test_accuracy = 0, test_loss = 0, samples_per_s_total = 0, final_scale = 0, peak_rss_mb = 0;
  std::vector<std::pair<std::string, double>> phase_ms;  // whole-run ms per step, in step order
  std::vector<NumericsSnapshot> numerics;
};

// Reads <dir>/metrics.jsonl. Throws Error (bad input) naming the file and line for a missing file, a line that is
// not JSON, or a file without a start record.
RunData load_run(const std::string& dir);

// The HTML page. The FP32 run (the first run whose dtype is fp32) is the baseline of speedup and memory ratios.
std::string render_report(const std::vector<RunData>& runs);

}  // namespace ampdist
