// Device-side helpers shared by the CUDA kernel files: element loads and stores in FP32 for every dtype, dtype
// dispatch, grid-stride loops and launch checks. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
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

// ---- column sums in two fixed-order stages -----------------------------------------------------------------------
// out[j] = sum over rows r of term(r, j), for K sums at once: stage 1 gives each chunk of kColChunk rows of a
// kColTile-column tile to one block (kColLanes row lanes per column, each summing its rows in order, then lane 0
// adding the lanes in order), writing part[k][chunk][j]; stage 2 adds the chunks of each column in order. Chunk,
// tile and lane counts are fixed, so the summation order, and the bits, depend on the shape alone, not on the GPU.
constexpr int kColTile = 32, kColLanes = 8, kColChunk = 64;

__host__ __device__ inline int64_t col_chunks(int64_t rows) { return (rows + kColChunk - 1) / kColChunk; }

// Device scratch of at least `floats` floats on the current device, grown in stream order (never shrinks).
inline float* col_scratch(size_t floats, cudaStream_t s) {
  static float* buf[64] = {};
  static size_t cap[64] = {};
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= 64) throw std::runtime_error("cudaGetDevice failed");
  if (cap[d] < floats) {
    if (buf[d]) cudaFreeAsync(buf[d], s);
    buf[d] = nullptr;
    if (cudaMallocAsync(reinterpret_cast<void**>(&buf[d]), floats * sizeof(float), s) != cudaSuccess)
      throw std::runtime_error("cudaMallocAsync of the column-sum scratch failed");
    cap[d] = floats;
  }
  return buf[d];
}

template <int K, typename Term>
__global__ void k_col_partials(int64_t rows, int64_t cols, Term term, float* part) {
  __shared__ float sh[K][kColLanes][kColTile];
  const int64_t nchunks = col_chunks(rows);
  const int64_t j = blockIdx.x * static_cast<int64_t>(kColTile) + threadIdx.x;
  for (int64_t chunk = blockIdx.y; chunk < nchunks; chunk += gridDim.y) {
    float acc[K];
    for (int k = 0; k < K; ++k) acc[k] = 0.0f;
    const int64_t r1 = min(rows, (chunk + 1) * kColChunk);
    if (j < cols) {
      for (int64_t r = chunk * kColChunk + threadIdx.y; r < r1; r += kColLanes) {
        float v[K];
        term(r, j, v);
        for (int k = 0; k < K; ++k) acc[k] += v[k];
      }
    }
    for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
      for (int k = 0; k < K; ++k) {
        float t = sh[k][0][threadIdx.x];
        for (int l = 1; l < kColLanes; ++l) t += sh[k][l][threadIdx.x];
        part[(k * nchunks + chunk) * cols + j] = t;
      }
    }
    __syncthreads();
  }
}

template <int K, typename Finish>
__global__ void k_col_finish(int64_t rows, int64_t cols, const float* part, Finish finish) {
  const int64_t nchunks = col_chunks(rows);
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    float t[K];
    for (int k = 0; k < K; ++k) {
      t[k] = 0.0f;
      for (int64_t c = 0; c < nchunks; ++c) t[k] += part[(k * nchunks + c) * cols + j];
    }
    finish(j, t);
  }
}

// Runs both stages on stream s (rows may be 0: every column then gets finish(j, {0...})).
template <int K, typename Term, typename Finish>
void column_sums(int64_t rows, int64_t cols, Term term, Finish finish, cudaStream_t s) {
  if (cols == 0) return;
  const int64_t nchunks = col_chunks(rows);
  float* part = col_scratch(static_cast<size_t>(K * std::max<int64_t>(nchunks, 1) * cols), s);
  if (nchunks > 0) {
    const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile),
                    static_cast<unsigned>(nchunks < 65535 ? nchunks : 65535));
    k_col_partials<K><<<grid, dim3(kColTile, kColLanes), 0, s>>>(rows, cols, term, part);
  }
  k_col_finish<K><<<blocks_for(cols, 256), 256, 0, s>>>(rows, cols, part, finish);
}

// ---- warp helpers ----------------------------------------------------------------------------------------------------
// Butterfly sum over the 32 lanes: every lane ends with the same bits (a + b == b + a at each level).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace ampdist::cuda::detail

#define AMPDIST_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
