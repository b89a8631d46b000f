#include "runtime/amp/master_weights.h"

#include <xxhash.h>

#include <cstring>

#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"

namespace ampdist {

MasterWeights::MasterWeights(std::vector<Parameter*> params, DType working_dtype, Device device)
    : params_(std::move(params)), working_dtype_(working_dtype), device_(device) {
  int64_t total = 0;
  for (Parameter* p : params_) total += p->numel();
  master_ = Tensor::zeros({total}, DType::kFloat32, device);
  grads_ = Tensor::zeros({total}, DType::kFloat32, device);
  working_ = working_dtype == DType::kFloat32 ? master_ : Tensor::zeros({total}, working_dtype, device);
  int64_t offset = 0;
  int index = 0;
  for (Parameter* p : params_) {
    p->index = index++;
    p->offset = offset;
    p->master = Tensor::view(master_.data_as<float>() + offset, p->shape, DType::kFloat32, device);
    p->grad = Tensor::view(grads_.data_as<float>() + offset, p->shape, DType::kFloat32, device);
    p->working = Tensor::view(static_cast<char*>(working_.data()) + offset * dtype_size(working_dtype), p->shape,
                              working_dtype, device);
    offset += p->numel();
  }
}

void MasterWeights::initialize(uint64_t seed) {
  // Drawn on the host (the same numbers on either device), then copied to the device.
  Tensor host = device_ == Device::kCPU ? master_ : Tensor::empty(master_.shape(), DType::kFloat32);
  for (Parameter* p : params_) {
    float* w = host.data_as<float>() + p->offset;
    const RngStream rng{seed, {0, 0, static_cast<uint32_t>(p->index)}, RngPurpose::kInit};
    for (int64_t i = 0; i < p->numel(); ++i) {
      w[i] = p->init == ParamInit::kZeros  ? 0.0f
             : p->init == ParamInit::kOnes ? 1.0f
                                           : (2.0f * rng.uniform(i) - 1.0f) * p->init_bound;
    }
  }
  if (device_ != Device::kCPU) host.copy_to(master_);
  cast_to_working();
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
