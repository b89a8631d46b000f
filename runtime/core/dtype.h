// Element types of tensors and the host 16-bit types.
//
// fp16 is IEEE 754 binary16 and bf16 is the upper half of binary32. On the host they are Eigen::half and
// Eigen::bfloat16, which have the same bit layout as CUDA's __half and __nv_bfloat16; conversions from float round to
// nearest even and keep inf, NaN and subnormals (Eigen's implementation, F16C instructions when enabled).
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ampdist {

using half = Eigen::half;
using bfloat16 = Eigen::bfloat16;

enum class DType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Bytes per element: 4, 2, 2.
constexpr size_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// "fp32", "fp16", "bf16".
const char* dtype_name(DType t);

// Largest finite value of the type: 3.40282e38, 65504, 3.38953e38.
float dtype_max(DType t);

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<bfloat16> { static constexpr DType value = DType::kBFloat16; };

// Calls f(T{}) with T the C++ type of `t`: float, half or bfloat16.
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat16: return f(half{});
    case DType::kBFloat16: return f(bfloat16{});
    case DType::kFloat32: break;
  }
  return f(float{});
}

enum class Device : uint8_t { kCPU = 0, kCUDA = 1 };
const char* device_name(Device d);

}  // namespace ampdist
