// The CUDA device of this process: selection, properties, memory, the compute stream.
//
// No CUDA header is included here, so every translation unit can call these. In a build without the CUDA backend
// (AMPDIST_CUDA=OFF, or no toolkit found) device_count() is 0, built_with_cuda() is false, and every function that
// needs a device throws ampdist::Error("this build has no CUDA backend ...").
//
// One compute stream per process (created on first use, non-blocking with respect to the legacy default stream):
// every kernel, cuBLAS call and host<->device copy of the runtime is ordered on it, so a training step needs no
// host synchronisation; the NCCL communicator orders its own stream against it with events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/dtype.h"

namespace ampdist::device {

bool built_with_cuda();

// Visible CUDA devices; 0 without a driver, without a GPU, or in a build without CUDA (never throws).
int device_count();
// Why device_count() is 0, for skip messages and `ampdist env` ("" when it is not).
std::string unavailable_reason();

struct Properties {
  std::string name;          // "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
  int64_t total_memory = 0;  // bytes
  int multiprocessors = 0;
  bool bf16 = false;         // native bf16 tensor cores: compute capability >= 8.0
};
Properties properties(int index);

// Makes `index` the current device of this process (cudaSetDevice). Throws Error naming the index and count.
void set_device(int index);
int current_device();

// Device memory. alloc throws Error naming the bytes on failure; free(nullptr) is a no-op.
void* alloc(size_t bytes);
void free(void* p);

// On the compute stream, asynchronous to the host: dst = 0 for `bytes` bytes.
void memset_zero(void* dst, size_t bytes);
// Copies `bytes` from src to dst on the compute stream. Host -> device and device -> device return at once (host
// memory that is not page-locked is staged by the driver first); device -> host returns when the bytes are on the
// host, i.e. it synchronises the compute stream. Host -> host is a memcpy (in every build), so code written for
// either device can copy a value to the host the same way.
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Blocks until all work queued on the compute stream is done. Throws Error with the CUDA error, if any.
void synchronize();

// The compute stream as an opaque handle (a cudaStream_t).
void* compute_stream();

// Page-locked host memory for asynchronous device -> host copies (cudaMallocHost); freed with free_host.
void* alloc_host(size_t bytes);
void free_host(void* p);

// Throws Error naming `what` if the last asynchronous CUDA operation failed (cudaGetLastError).
void check_last_error(const char* what);

// Timing events on the compute stream (cudaEvent_t as opaque handles), for phase timing: recording costs no host
// wait; only elapsed_ms() waits, for the later event.
void* event_create();
void event_destroy(void* e);
void event_record(void* e);
// Milliseconds of GPU time between two recorded events (waits until `end` has completed).
float event_elapsed_ms(void* start, void* end);

}  // namespace ampdist::device
