// Start-up lint of a run config: settings that run, but not as the user probably meant. Warnings, not errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/core/dtype.h"

namespace ampdist {

// One line per finding, without a "warning: " prefix:
//  - fp16 GEMM dimensions (each Linear layer's in and out features, and the micro-batch size) that are not
//    multiples of 8: fp16 tensor-core GEMMs need every dimension a multiple of 8 to run at full rate (NVIDIA, "Matrix
//    Multiplication Background User's Guide", tensor core requirements); layers forced to FP32 are not checked.
//  - fp16 without loss scaling (precision.none, or a static scale of 1): small gradients underflow to zero.
//  - a loss scale configured with bf16 or fp32: it only changes the numbers (bf16 has fp32's exponent range).
// working: the resolved working dtype; in_features, classes: the model's input width and output classes;
// micro_batch: samples per micro-batch per rank.
std::vector<std::string> lint_config(const RunConfig& cfg, DType working, int64_t in_features, int64_t classes,
                                     int64_t micro_batch);

}  // namespace ampdist
