// MpiCommunicator: Communicator over MPI for host buffers (the CPU backend).
//
// fp16 and bf16 sums use user-defined MPI ops over MPI_UINT16_T that add in FP32 and round to 16 bits after every
// addition. Non-blocking collectives (MPI_Iallreduce, MPI_Ireduce_scatter, MPI_Iallgatherv) back the *_async calls.
#pragma once

#include <mpi.h>

#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace ampdist {

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` (MPI must be initialised; see comm/bootstrap.h). timeout_s: the watchdog's limit per wait.
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, double timeout_s = 600.0);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  std::unique_ptr<Work> allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op,
                                        const std::string& what) override;
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::span<const int64_t> counts,
                                             DType dtype, const std::string& what) override;
  std::unique_ptr<Work> allgather_inplace_async(void* buf, std::span<const int64_t> counts, DType dtype,
                                                const std::string& what) override;
  void allreduce_f64(std::span<double> values, ReduceOp op, const std::string& what) override;
  void allreduce_i64(std::span<int64_t> values, ReduceOp op, const std::string& what) override;
  std::vector<uint64_t> allgather_u64(uint64_t value, const std::string& what) override;
  void barrier(const std::string& what) override;
  [[noreturn]] void abort(int exit_code) override;
  void set_step(int64_t step) override { watchdog_.set_step(step); }
  const CommStats& stats() const override { return stats_; }

  MPI_Comm comm() const { return comm_; }
  void set_timeout(double timeout_s) { watchdog_.set_timeout(timeout_s); }
  // See Watchdog::set_progress_dir: lets a timeout name the ranks that did not arrive.
  void set_progress_dir(const std::string& dir) { watchdog_.set_progress_dir(dir, size_); }

 private:
  // A blocking in-place all-reduce of `count` host values of `type` (SUM or MAX) under the watchdog.
  void allreduce_host(void* values, size_t count, MPI_Datatype type, ReduceOp op, const std::string& what);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  CommStats stats_;
  Watchdog watchdog_;
};

}  // namespace ampdist
