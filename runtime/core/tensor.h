// Tensor: a shape, a dtype, a device and a buffer.
//
// A Tensor either owns its storage (Tensor::empty / zeros) or views memory owned elsewhere (Tensor::view, used for
// parameters inside the flat master, working-copy and gradient buffers). Copies of a Tensor share storage, like
// torch.Tensor. Storage is contiguous and row-major. fp16/bf16 tensors really hold 2 bytes per element.
//
// Buffers are sized once: `ensure()` reuses the storage whenever it is large enough, so steps after the first
// allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace ampdist {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[128, 784]"

// Bytes of host memory owned by tensors now (allocations rounded to 64 bytes), and the most there has been since the
// start or the last reset: what the memory estimate (runtime/train/memory_estimate.h) is tested against.
int64_t host_tensor_bytes();
int64_t host_tensor_peak_bytes();
void reset_host_tensor_peak_bytes();
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // Owning, uninitialised (host memory 64-byte aligned; device memory from cudaMalloc). Throws Error for a negative
  // dimension, a device this build lacks, or an allocation that fails.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::kCPU);
  // Owning, every element 0.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::kCPU);
  // Non-owning view of `data`, which must outlive every copy of the view.
  static Tensor view(void* data, const Shape& shape, DType dtype, Device device = Device::kCPU);

  // Makes this tensor `shape` x `dtype`, reallocating (owning) only when the current storage is too small or not
  // owned. Contents are unspecified afterwards.
  void ensure(const Shape& shape, DType dtype, Device device = Device::kCPU);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* data() { return data_; }
  const void* data() const { return data_; }
  // Typed access; throws Error when T does not match dtype().
  template <typename T> T* data_as() { check_type(DTypeOf<T>::value); return static_cast<T*>(data_); }
  template <typename T> const T* data_as() const { check_type(DTypeOf<T>::value); return static_cast<const T*>(data_); }

  // Rows [begin, end) of dimension 0, as a view sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same storage, another shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;

  // A new owning tensor on `device` with this tensor's contents (see copy_to for when it synchronises).
  Tensor to(Device device) const;
  // dst = this, same shape and dtype, any pair of devices (device -> host blocks until the bytes arrive; the other
  // directions are queued on the compute stream). Throws Error on a shape or dtype mismatch.
  void copy_to(Tensor& dst) const;

  // Element i converted to float (for tests and logs, not hot loops; a device tensor's element is copied to the
  // host, which synchronises the compute stream).
  float item(int64_t i) const;

 private:
  void check_type(DType t) const;

  std::shared_ptr<void> storage_;  // null for views
  size_t capacity_bytes_ = 0;      // usable bytes at data_ when owned
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::kCPU;
};

}  // namespace ampdist
