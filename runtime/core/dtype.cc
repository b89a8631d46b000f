#include "runtime/core/dtype.h"

#include <limits>

namespace ampdist {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
  }
  return "?";
}

float dtype_max(DType t) {
  switch (t) {
    case DType::kFloat16: return static_cast<float>(Eigen::NumTraits<half>::highest());
    case DType::kBFloat16: return static_cast<float>(Eigen::NumTraits<bfloat16>::highest());
    case DType::kFloat32: break;
  }
  return std::numeric_limits<float>::max();
}

const char* device_name(Device d) { return d == Device::kCUDA ? "cuda" : "cpu"; }

}  // namespace ampdist
