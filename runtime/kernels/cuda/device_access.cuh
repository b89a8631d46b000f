// Device-side helpers shared by the CUDA kernel files: element loads and stores in FP32 for every dtype, dtype
// dispatch, grid-stride loops and launch checks. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ampdist::cuda::detail {

// Launch errors become std::runtime_error (no Eigen in device translation units); the Tensor-level callers in
// kernels/cuda/*.cc rethrow them as ampdist::Error.
inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

inline cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks of `threads` for n elements, capped (grid-stride loops cover the rest).
inline int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// Element i of a float, __half or __nv_bfloat16 buffer as float; stores round to nearest even.
template <typename T> __device__ __forceinline__ float ld(const T* p, int64_t i);
template <> __device__ __forceinline__ float ld<float>(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float ld<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <typename T> __device__ __forceinline__ void stf(T* p, int64_t i, float v);
template <> __device__ __forceinline__ void stf<float>(float* p, int64_t i, float v) { p[i] = v; }
template <> __device__ __forceinline__ void stf<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
template <> __device__ __forceinline__ void stf<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// Calls f(T{}) with T the device type of dtype code d (DType's values: 0 float, 1 __half, 2 __nv_bfloat16).
template <typename F> void by_dtype(int d, F&& f) {
  switch (d) {
    case 1: f(__half{}); return;
    case 2: f(__nv_bfloat16{}); return;
    default: f(float{}); return;
  }
}

}  // namespace ampdist::cuda::detail

#define AMPDIST_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
