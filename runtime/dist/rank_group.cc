#include "runtime/dist/rank_group.h"

#include "runtime/core/tensor.h"

namespace ampdist {

int64_t RankGroup::sum(int64_t value, const std::string& what) {
  comm_->allreduce_i64(std::span<int64_t>(&value, 1), ReduceOp::kSum, what);
  return value;
}

int64_t RankGroup::max(int64_t value, const std::string& what) {
  comm_->allreduce_i64(std::span<int64_t>(&value, 1), ReduceOp::kMax, what);
  return value;
}

void RankGroup::gather_slices(std::span<float> buf, std::span<const int64_t> counts, const std::string& what) {
  if (comm_->world_size() == 1) return;
  Tensor host = Tensor::view(buf.data(), {static_cast<int64_t>(buf.size())}, DType::kFloat32);
  if (comm_->device() == Device::kCPU) {
    comm_->allgather_inplace_async(host.data(), counts, DType::kFloat32, what)->wait();
    return;
  }
  Tensor device = host.to(comm_->device());
  comm_->allgather_inplace_async(device.data(), counts, DType::kFloat32, what)->wait();
  device.copy_to(host);  // device -> host: returns once the bytes are here
}

}  // namespace ampdist
