#include "runtime/core/tensor.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "runtime/core/device.h"

namespace ampdist {

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

static void check_shape(const Shape& shape) {
  for (int64_t d : shape)
    if (d < 0) throw Error("tensor shape " + shape_str(shape) + " has a negative dimension");
}

namespace {
std::atomic<int64_t> g_host_bytes{0}, g_host_peak{0};
constexpr size_t kMappedTensorBytes = size_t{1} << 20;  // 1 MiB: below, malloc's heap (no system call per tensor)
}  // namespace

int64_t host_tensor_bytes() { return g_host_bytes.load(); }
int64_t host_tensor_peak_bytes() { return g_host_peak.load(); }
void reset_host_tensor_peak_bytes() { g_host_peak.store(g_host_bytes.load()); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  if (device == Device::kCUDA) {
    // cudaMalloc returns 256-byte aligned memory; device::alloc throws Error on failure or without CUDA.
    const size_t bytes = std::max<size_t>(t.nbytes(), 1);
    void* p = device::alloc(bytes);
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { device::free(q); });
    t.capacity_bytes_ = bytes;
    t.data_ = p;
    return t;
  }
  // 64-byte alignment for vector loads; never a zero-size allocation so data() is non-null. Large buffers are
  // mapped pages of their own, returned to the system when freed: through malloc, glibc would serve them from its
  // heap once its adaptive mmap threshold has grown (up to 32 MiB) and keep them resident after a free, so buffers
  // a model releases between uses (GptModel's per-block buffers) would still count against the process.
  size_t bytes = std::max<size_t>(t.nbytes(), 1);
  size_t rounded = (bytes + 63) / 64 * 64;
  const bool mapped = rounded >= kMappedTensorBytes;
  void* p = nullptr;
  if (mapped) {
    p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = std::aligned_alloc(64, rounded);
  }
  if (!p) throw Error("out of host memory allocating " + std::to_string(rounded) + " bytes");
  const int64_t live = g_host_bytes.fetch_add(static_cast<int64_t>(rounded)) + static_cast<int64_t>(rounded);
  for (int64_t peak = g_host_peak.load(); live > peak && !g_host_peak.compare_exchange_weak(peak, live);) {
  }
  t.storage_ = std::shared_ptr<void>(p, [rounded, mapped](void* q) {
    g_host_bytes.fetch_sub(static_cast<int64_t>(rounded));
    if (mapped) ::munmap(q, rounded);
    else std::free(q);
  });
  t.capacity_bytes_ = rounded;
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device == Device::kCUDA) device::memset_zero(t.data_, t.nbytes());
  else std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

void Tensor::ensure(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  size_t need = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (storage_ && device == device_ && need <= capacity_bytes_ && data_ == storage_.get()) {
    shape_ = shape;
    dtype_ = dtype;
    return;
  }
  *this = empty(shape, dtype, device);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end < begin || end > shape_[0])
    throw Error("Tensor::rows(" + std::to_string(begin) + ", " + std::to_string(end) + ") out of range for " +
                shape_str(shape_));
  Tensor t = *this;
  int64_t row = shape_numel(shape_) / std::max<int64_t>(shape_[0], 1);
  t.data_ = static_cast<char*>(data_) + begin * row * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  t.capacity_bytes_ = 0;  // a row view never grows in place
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel())
    throw Error("Tensor::reshape " + shape_str(shape_) + " -> " + shape_str(shape) + ": element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor out = empty(shape_, dtype_, device);
  copy_to(out);
  return out;
}

void Tensor::copy_to(Tensor& dst) const {
  if (dst.shape_ != shape_ || dst.dtype_ != dtype_)
    throw Error("Tensor::copy_to: " + shape_str(shape_) + " " + dtype_name(dtype_) + " into " + shape_str(dst.shape_) +
                " " + dtype_name(dst.dtype_));
  if (nbytes() == 0) return;
  if (device_ == Device::kCPU && dst.device_ == Device::kCPU) std::memcpy(dst.data_, data_, nbytes());
  else device::copy(dst.data_, dst.device_, data_, device_, nbytes());
}

float Tensor::item(int64_t i) const {
  if (i < 0 || i >= numel()) throw Error("Tensor::item index out of range");
  if (device_ == Device::kCUDA) {  // one element through the host; synchronises the compute stream
    uint32_t bits = 0;
    const size_t es = dtype_size(dtype_);
    device::read_to_host(&bits, static_cast<const char*>(data_) + i * es, Device::kCUDA, es);
    return dispatch_dtype(dtype_, [&](auto tag) {
      using T = decltype(tag);
      T v;
      std::memcpy(static_cast<void*>(&v), &bits, sizeof(T));  // little-endian: the low bytes of bits
      return static_cast<float>(v);
    });
  }
  return dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return static_cast<float>(static_cast<const T*>(data_)[i]);
  });
}

void Tensor::check_type(DType t) const {
  if (t != dtype_)
    throw Error(std::string("tensor holds ") + dtype_name(dtype_) + ", accessed as " + dtype_name(t));
}

}  // namespace ampdist
