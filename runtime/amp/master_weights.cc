#include "runtime/amp/master_weights.h"

#include <xxhash.h>

#include <cstring>

#include "runtime/core/rng.h"
#include "runtime/kernels/kernels.h"

namespace ampdist {

MasterWeights::MasterWeights(std::vector<Parameter*> params, DType working_dtype)
    : params_(std::move(params)), working_dtype_(working_dtype) {
  int64_t total = 0;
  for (Parameter* p : params_) total += p->numel();
  master_ = Tensor::zeros({total}, DType::kFloat32);
  grads_ = Tensor::zeros({total}, DType::kFloat32);
  working_ = working_dtype == DType::kFloat32 ? master_ : Tensor::zeros({total}, working_dtype);
  int64_t offset = 0;
  int index = 0;
  for (Parameter* p : params_) {
    p->index = index++;
    p->offset = offset;
    p->master = Tensor::view(master_.data_as<float>() + offset, p->shape, DType::kFloat32);
    p->grad = Tensor::view(grads_.data_as<float>() + offset, p->shape, DType::kFloat32);
    p->working = Tensor::view(static_cast<char*>(working_.data()) + offset * dtype_size(working_dtype), p->shape,
                              working_dtype);
    offset += p->numel();
  }
}

void MasterWeights::initialize(uint64_t seed) {
  for (Parameter* p : params_) {
    float* w = p->master.data_as<float>();
    const RngStream rng{seed, {0, 0, static_cast<uint32_t>(p->index)}, RngPurpose::kInit};
    for (int64_t i = 0; i < p->numel(); ++i) {
      w[i] = p->init == ParamInit::kZeros  ? 0.0f
             : p->init == ParamInit::kOnes ? 1.0f
                                           : (2.0f * rng.uniform(i) - 1.0f) * p->init_bound;
    }
  }
  cast_to_working();
}

void MasterWeights::cast_to_working() {
  if (working_dtype_ == DType::kFloat32) return;
  kernels::cast(master_, working_);
}

uint64_t MasterWeights::hash() const { return XXH3_64bits(master_.data(), master_.nbytes()); }

}  // namespace ampdist
