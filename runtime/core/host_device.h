// AMPDIST_HOST_DEVICE: a function compiled for the host and, under nvcc, for the device too, so that one definition
// of a formula serves the CPU backend and the CUDA kernels (kernels/math.h, core/rng.h, amp/step_state.h).
#pragma once

#if defined(__CUDACC__)
#define AMPDIST_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define AMPDIST_HOST_DEVICE inline
#endif
