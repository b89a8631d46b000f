#include "runtime/amp/master_weights.h"

#include <xxhash.h>

#include "runtime/kernels/kernels.h"

namespace ampdist {

MasterWeights::MasterWeights(FlatLayout layout, DType working_dtype, Device device)
    : layout_(std::move(layout)), working_dtype_(working_dtype), device_(device) {
  const int64_t total = layout_.numel();
  master_ = Tensor::zeros({total}, DType::kFloat32, device);
  grads_ = Tensor::zeros({total}, DType::kFloat32, device);
  working_ = working_dtype == DType::kFloat32 ? master_ : Tensor::zeros({total}, working_dtype, device);
}

Tensor MasterWeights::master_view(size_t i) {
  const FlatEntry& e = layout_[i];
  return Tensor::view(master_.data_as<float>() + e.offset, e.shape, DType::kFloat32, device_);
}

Tensor MasterWeights::grad_view(size_t i) {
  const FlatEntry& e = layout_[i];
  return Tensor::view(grads_.data_as<float>() + e.offset, e.shape, DType::kFloat32, device_);
}

Tensor MasterWeights::working_view(size_t i) {
  const FlatEntry& e = layout_[i];
  return Tensor::view(static_cast<char*>(working_.data()) + e.offset * dtype_size(working_dtype_), e.shape,
                      working_dtype_, device_);
}

void MasterWeights::cast_to_working() {
  if (working_dtype_ == DType::kFloat32) return;
  kernels::cast(master_, working_);
}

uint64_t MasterWeights::hash() const {
  if (device_ == Device::kCPU) return XXH3_64bits(master_.data(), master_.nbytes());
  const Tensor host = master_.to(Device::kCPU);
  return XXH3_64bits(host.data(), host.nbytes());
}

}  // namespace ampdist
