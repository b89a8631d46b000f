#include "runtime/core/device.h"

#include "runtime/core/error.h"

#include <cstring>

#ifdef AMPDIST_HAVE_CUDA
#include <cuda_runtime.h>
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
    return std::string("no usable CUDA device: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
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
  return out;
}

void set_device(int index) {
  const int n = device_count();
  if (index < 0 || index >= n)
    throw Error("CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(n) + " visible)");
  check(cudaSetDevice(index), "cudaSetDevice");
}

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

void* compute_stream() {
  // One stream for the process: created once on the current device. Threads of this process that launch device
  // work (none besides the main thread today) share it.
  static cudaStream_t s = [] {
    cudaStream_t st = nullptr;
    check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate (compute stream)");
    return st;
  }();
  return s;
}

void* alloc(size_t bytes) {
  if (device_count() == 0) throw Error("device memory requested, but " + unavailable_reason());
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
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
  if (p) cudaFree(p);  // errors at exit (driver shutting down) are not actionable
}

void memset_zero(void* dst, size_t bytes) {
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(compute_stream())), "cudaMemsetAsync");
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::kCPU && src_device == Device::kCPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cudaMemcpyKind kind = cudaMemcpyDefault;
  auto s = static_cast<cudaStream_t>(compute_stream());
  if (dst_device == Device::kCUDA && src_device == Device::kCPU) kind = cudaMemcpyHostToDevice;
  else if (dst_device == Device::kCPU && src_device == Device::kCUDA) kind = cudaMemcpyDeviceToHost;
  else if (dst_device == Device::kCUDA && src_device == Device::kCUDA) kind = cudaMemcpyDeviceToDevice;
  check(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
  if (kind == cudaMemcpyDeviceToHost) check(cudaStreamSynchronize(s), "cudaStreamSynchronize (device -> host copy)");
}

void synchronize() {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(compute_stream())), "cudaStreamSynchronize (compute stream)");
}

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
void* alloc_host(size_t) { no_cuda("page-locked host memory"); }
void free_host(void*) {}
void check_last_error(const char*) {}
void* event_create() { no_cuda("CUDA events"); }
void event_destroy(void*) {}
void event_record(void*) { no_cuda("CUDA events"); }
float event_elapsed_ms(void*, void*) { no_cuda("CUDA events"); }

#endif

}  // namespace ampdist::device
