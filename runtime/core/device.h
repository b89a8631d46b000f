// The CUDA device of this process: selection, properties, memory, the compute stream.
//
// No CUDA header is included here, so every translation unit can call these. In a build without the CUDA backend
// (AMPDIST_CUDA=OFF, or no toolkit found) device_count() is 0, built_with_cuda() is false, and every function that
// needs a device throws ampdist::Error("this build has no CUDA backend ...").
//
// One compute stream per device (created on the device's first use, non-blocking with respect to the legacy default
// stream): every kernel, cuBLAS call and host<->device copy of the runtime is ordered on the current device's stream,
// so a training step needs no host synchronisation; the NCCL communicator orders its own stream against it with
// events. Everything else kept per device (cuBLAS handles, reduction scratch, staging buffers) is looked up by the
// current device too, so a process may switch devices (cudaSetDevice semantics) without launching on another
// device's stream. A rank binds its device (bind_device) before any device work, so that it never creates a context
// on a GPU that belongs to another rank.
//
// Memory comes from the device's stream-ordered pool (cudaMallocAsync / cudaFreeAsync on the compute stream, with
// the pool's release threshold at its maximum, so freed blocks are cached instead of handed back at every
// synchronisation): a buffer released while kernels queued on the compute stream still use it is reused only after
// they ran, and a release never synchronises the device (cudaFree does). A buffer handed to a collective on another
// stream must outlive Work::wait() (the communicator's contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
  std::string uuid;          // the GPU's 16-byte UUID (cudaDeviceProp::uuid, as nvidia-smi's GPU-...), raw bytes
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
// Copies `bytes` from src to dst on the compute stream. Host -> device and device -> device return at once: host
// memory that is not page-locked and at most kStagingBytes long is first copied into one of kStagingSlots page-locked
// staging buffers of this device (each with an event that says when the device has read it; the host waits only
// when it comes back to a slot whose copy has not run yet), so the copy is a true asynchronous DMA. Longer pageable
// copies go through the driver's own staging. Device -> host returns when the bytes are on the host, i.e. it
// synchronises the compute stream. Host -> host is a memcpy (in every build), so code written for either device can
// copy a value to the host the same way.
constexpr int kStagingSlots = 8;
constexpr size_t kStagingBytes = size_t{64} << 20;
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Blocks until all work queued on the compute stream is done. Throws Error with the CUDA error, if any.
void synchronize();

// Host reads of values that the training step computes where it runs (the step state, a loss sum, statistics):
// on the GPU each one waits for the compute stream. Every such read, on both backends, goes through read_to_host or
// is counted with note_host_read by the kernel that returns a value to the host, so a test on the CPU counts the
// reads that the same step makes on the GPU. host_reads(): the count since the process started (thread-safe).
void read_to_host(void* dst, const void* src, Device src_device, size_t bytes);
void note_host_read();
int64_t host_reads();

// The current device's compute stream as an opaque handle (a cudaStream_t); created on first use.
void* compute_stream();
// Devices of this process that have a compute stream (were used for device work), in index order; bind_device
// refuses to bind a rank to one device after work ran on another.
std::vector<int> devices_used();

// The current device's instance of T, for state a backend keeps per device (library handles, scratch buffers):
// one default-constructed T per device index, created on first use and never destroyed (static Tensors release
// their memory at exit through it). Main-thread use only, as every launcher of the runtime.
template <typename T> T& per_current_device() {
  static T* table = new T[64];
  return table[current_device()];
}

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
