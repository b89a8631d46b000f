#include "runtime/dist/publish.h"

#include <vector>

#include "runtime/core/device.h"

namespace ampdist {

void reduce_slice_sums(Communicator& comm, StepStateBuffer& state, Tensor& rank_sums) {
  const int world = comm.world_size();
  double* sums = static_cast<double*>(rank_sums.data());
  device::copy(sums + comm.rank(), rank_sums.device(), &state.get()->sum_sq, state.device(), sizeof(double));
  const std::vector<int64_t> counts(static_cast<size_t>(world), 4);
  comm.allgather_inplace_async(sums, counts, DType::kFloat16, "sum of squares all-gather")->wait();
  state.sum_rank_sums(sums, world);
}

void publish(MasterWeights& masters, Communicator& comm) {
  masters.update_working_slice();
  comm.allgather_inplace_async(masters.working().data(), masters.slice_counts(), masters.working_dtype(),
                               "working copy all-gather")
      ->wait();
  if (masters.fp32_copy().numel() > 0 && masters.fp32_copy().data())
    comm.allgather_inplace_async(masters.fp32_copy().data(), masters.fp32_counts(), DType::kFloat32,
                                 "FP32 copy all-gather")
        ->wait();
}

}  // namespace ampdist
