#include "runtime/core/device.h"

#include "runtime/core/error.h"

#include <atomic>
#include <cstring>

#ifdef AMPDIST_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#endif

namespace ampdist::device {

#ifdef AMPDIST_HAVE_CUDA

namespace {

[[noreturn]] void fail(const std::string& what, cudaError_t e) {
  throw Error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, e);
}

// What this process keeps per device, created on the device's first use (with that device current).
constexpr int kMaxDevices = 64;
struct Staging {
  void* host = nullptr;  // page-locked
  size_t capacity = 0;
  cudaEvent_t read = nullptr;  // recorded after the copy out of `host`
  bool pending = false;
};
struct PerDevice {
  std::once_flag once;
  std::atomic<cudaStream_t> stream{nullptr};
  std::mutex staging_mu;
  Staging staging[kStagingSlots];
  int next_slot = 0;
};
PerDevice& per_device(int d) {
  static PerDevice* table = new PerDevice[kMaxDevices];  // never destroyed: static Tensors free into it at exit
  if (d < 0 || d >= kMaxDevices) throw Error("CUDA device " + std::to_string(d) + " is beyond this build's limit of 64");
  return table[d];
}

cudaStream_t stream_of_device(int d) {
  PerDevice& pd = per_device(d);
  std::call_once(pd.once, [&] {
    cudaStream_t st = nullptr;
    check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate (compute stream)");
    // Keep freed blocks in the device's pool (the default threshold, 0, hands them back to the driver at every
    // synchronisation, which makes the next allocation a driver call again).
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, d) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    pd.stream.store(st);
  });
  return pd.stream.load();
}

int current() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

cudaStream_t stream() { return stream_of_device(current()); }

// Host -> device through a page-locked slot of this device (see device.h).
void staged_upload(void* dst, const void* src, size_t bytes, cudaStream_t s, int dev) {
  PerDevice& pd = per_device(dev);
  std::lock_guard<std::mutex> lock(pd.staging_mu);
  Staging& slot = pd.staging[pd.next_slot];
  pd.next_slot = (pd.next_slot + 1) % kStagingSlots;
  if (slot.pending) {
    check(cudaEventSynchronize(slot.read), "cudaEventSynchronize (staging slot)");
    slot.pending = false;
  }
  if (slot.capacity < bytes) {
    if (slot.host) cudaFreeHost(slot.host);
    slot.host = nullptr;
    size_t cap = std::max<size_t>(bytes, size_t{1} << 16);
    check(cudaMallocHost(&slot.host, cap), "cudaMallocHost (staging slot)");
    slot.capacity = cap;
  }
  if (!slot.read) check(cudaEventCreateWithFlags(&slot.read, cudaEventDisableTiming), "cudaEventCreate (staging)");
  std::memcpy(slot.host, src, bytes);
  check(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (staged)");
  check(cudaEventRecord(slot.read, s), "cudaEventRecord (staging slot)");
  slot.pending = true;
}

bool is_pageable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered;
}

}  // namespace

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later checks are not confused by it
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::string why = std::string("no usable CUDA device: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    // The CUDA runtime here is CUDA_VERSION; a driver older than the one it needs reports "insufficient driver".
    if (e == cudaErrorInsufficientDriver) {
      int drv = 0;
      cudaDriverGetVersion(&drv);
      why += "; the CUDA runtime is " + std::to_string(CUDART_VERSION / 1000) + "." +
             std::to_string(CUDART_VERSION % 1000 / 10) + ", the driver supports " +
             (drv ? std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10) : std::string("none (no driver loaded)"));
    }
    return why;
  }
  return n == 0 ? "no CUDA device visible" : "";
}

Properties properties(int index) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, index), ("cudaGetDeviceProperties(" + std::to_string(index) + ")").c_str());
  Properties out;
  out.name = p.name;
  out.major = p.major;
  out.minor = p.minor;
  out.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  out.multiprocessors = p.multiProcessorCount;
  out.bf16 = p.major >= 8;
  out.uuid.assign(p.uuid.bytes, sizeof p.uuid.bytes);
  return out;
}

void set_device(int index) {
  const int n = device_count();
  if (index < 0 || index >= n)
    throw Error("CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(n) + " visible)");
  check(cudaSetDevice(index), "cudaSetDevice");
}

int current_device() { return current(); }

void* compute_stream() { return stream(); }

std::vector<int> devices_used() {
  std::vector<int> out;
  for (int d = 0; d < kMaxDevices; ++d)
    if (per_device(d).stream.load()) out.push_back(d);
  return out;
}

void* alloc(size_t bytes) {
  if (device_count() == 0) throw Error("device memory requested, but " + unavailable_reason());
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes == 0 ? 256 : bytes, stream());
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Error("out of device memory allocating " + std::to_string(bytes) + " bytes on CUDA device " +
                std::to_string(current_device()) + " (" + std::to_string(free_b) + " of " + std::to_string(total_b) +
                " bytes free): " + cudaGetErrorString(e));
  }
  return p;
}

void free(void* p) {
  if (!p) return;
  // Released in the order of the owning device's compute stream: after the kernels queued there that use it.
  cudaPointerAttributes a{};
  int dev = -1;
  if (cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice) dev = a.device;
  cudaStream_t s = dev >= 0 && dev < kMaxDevices ? per_device(dev).stream.load() : nullptr;
  if (s) cudaFreeAsync(p, s);
  else cudaFree(p);
  cudaGetLastError();  // errors at exit (driver shutting down) are not actionable
}

void memset_zero(void* dst, size_t bytes) { check(cudaMemsetAsync(dst, 0, bytes, stream()), "cudaMemsetAsync"); }

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::kCPU && src_device == Device::kCPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cudaMemcpyKind kind = cudaMemcpyDefault;
  const int dev = current();
  cudaStream_t s = stream_of_device(dev);
  if (dst_device == Device::kCUDA && src_device == Device::kCPU) kind = cudaMemcpyHostToDevice;
  else if (dst_device == Device::kCPU && src_device == Device::kCUDA) kind = cudaMemcpyDeviceToHost;
  else if (dst_device == Device::kCUDA && src_device == Device::kCUDA) kind = cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyHostToDevice && bytes <= kStagingBytes && is_pageable(src)) {
    staged_upload(dst, src, bytes, s, dev);
    return;
  }
  check(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
  if (kind == cudaMemcpyDeviceToHost) check(cudaStreamSynchronize(s), "cudaStreamSynchronize (device -> host copy)");
}

void synchronize() { check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (compute stream)"); }

void* alloc_host(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes == 0 ? 64 : bytes), "cudaMallocHost");
  return p;
}

void free_host(void* p) {
  if (p) cudaFreeHost(p);
}

void check_last_error(const char* what) { check(cudaGetLastError(), what); }

void* event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
void event_destroy(void* e) {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}
void event_record(void* e) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(compute_stream())), "cudaEventRecord");
}
float event_elapsed_ms(void* start, void* end) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(end)), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
        "cudaEventElapsedTime");
  return ms;
}

#else  // no CUDA backend in this build

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(std::string(what) + ": this build has no CUDA backend (configure with -DAMPDIST_CUDA=ON on a machine "
              "with the CUDA toolkit and NCCL)");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this build has no CUDA backend (AMPDIST_CUDA=OFF or no toolkit found)"; }
Properties properties(int) { no_cuda("device properties"); }
void set_device(int) { no_cuda("set_device"); }
int current_device() { no_cuda("current_device"); }
void* alloc(size_t) { no_cuda("device memory"); }
void free(void*) {}
void memset_zero(void*, size_t) { no_cuda("device memset"); }
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device == Device::kCUDA || src_device == Device::kCUDA) no_cuda("device copy");
  if (bytes) std::memcpy(dst, src, bytes);
}
void synchronize() {}
void* compute_stream() { return nullptr; }
std::vector<int> devices_used() { return {}; }
void* alloc_host(size_t) { no_cuda("page-locked host memory"); }
void free_host(void*) {}
void check_last_error(const char*) {}
void* event_create() { no_cuda("CUDA events"); }
void event_destroy(void*) {}
void event_record(void*) { no_cuda("CUDA events"); }
float event_elapsed_ms(void*, void*) { no_cuda("CUDA events"); }

#endif

namespace {
std::atomic<int64_t> g_host_reads{0};
}  // namespace

void note_host_read() { g_host_reads.fetch_add(1, std::memory_order_relaxed); }
int64_t host_reads() { return g_host_reads.load(std::memory_order_relaxed); }
void read_to_host(void* dst, const void* src, Device src_device, size_t bytes) {
  note_host_read();
  copy(dst, Device::kCPU, src, src_device, bytes);
}

}  // namespace ampdist::device
