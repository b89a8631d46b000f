// NcclCommunicator: the Communicator over NCCL for GPU buffers (the CUDA backend).
//
// - One NCCL communicator per job: rank 0 creates the ncclUniqueId, and broadcast_from_rank0 (comm/bootstrap.h)
//   carries it with a status word, so that a failing ncclGetUniqueId becomes an Error on every rank. Every rank
//   then starts joining with ncclCommInitRankConfig in non-blocking mode (config.blocking = 0) on its current
//   device (set by bind_device() before construction), the ranks agree over MPI that every one of them started
//   (a rank that failed before joining stops the others at once), and each polls ncclCommGetAsyncError until the
//   join completes or comm.timeout_s passes; on a timeout or an error it calls ncclCommAbort and throws Error.
//   In non-blocking mode any NCCL call may return ncclInProgress; the communicator then polls until the state is
//   ncclSuccess before its next NCCL call (NCCL documentation, "Fault Tolerance"), bounded the same way.
// - Teardown cannot wait forever: the destructor waits for the communication stream and for ncclCommFinalize at
//   most min(comm.timeout_s, 60 s) each, then destroys the communicator, or aborts it when either wait ran out.
// - Collectives run on a dedicated communication stream. *_async records an event on the compute stream, makes the
//   communication stream wait for it, issues the NCCL call and records a completion event; it never blocks the host.
//   Work::wait() makes the compute stream wait for that event (stream order, like c10d's ProcessGroupNCCL), so a
//   bucket all-reduce issued during backward overlaps the remaining backward kernels, and the host never waits.
// - fp16/bf16 use NCCL's native ncclFloat16/ncclBfloat16 (each addition rounded to 16 bits); FP32 ncclFloat32.
//   Counts that differ between ranks (reduce-scatter/all-gather shards of n % W != 0) are grouped ncclReduce /
//   ncclBroadcast calls, one per root.
// - A monitor thread polls the completion events and ncclCommGetAsyncError every 100 ms. An asynchronous NCCL error,
//   or a collective not complete within the timeout (comm.timeout_s), prints one line naming the collective, the
//   step and this rank, calls ncclCommAbort and ends the process with exit code 1: mpirun/srun then stop every rank.
// - Completion events come from a pool owned jointly by the communicator and its Work handles: no event is created
//   per collective once the pool has grown to the number in flight.
// - Small host vectors (allreduce_f64 / i64 / allgather_u64 / barrier) go over MPI on the host.
// Only built with the CUDA backend (AMPDIST_HAVE_CUDA).
#pragma once

#ifdef AMPDIST_HAVE_CUDA

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/device_binding.h"
#include "comm/mpi_communicator.h"

namespace ampdist {


// A set-up failure to inject on one rank (fault.nccl_setup_error in the config): for the drills and tests that show
// that every rank ends within the deadline.
struct NcclSetupFault {
  enum class Stage { kNone, kUniqueId, kInit };
  Stage stage = Stage::kNone;
  int rank = 0;
};

class NcclCommunicator : public Communicator {
 public:
  // `comm`: the MPI communicator used for bootstrap and host collectives (duplicated). timeout_s bounds every wait,
  // set-up included. Throws Error on NCCL failure: on the rank that failed first-hand, and as a secondary Error on
  // the ranks that only learnt of another's failure.
  explicit NcclCommunicator(MPI_Comm comm = MPI_COMM_WORLD, double timeout_s = 600.0, NcclSetupFault fault = {});
  ~NcclCommunicator() override;

  int rank() const override { return host_.rank(); }
  int world_size() const override { return host_.world_size(); }
  int local_rank() const override { return host_.local_rank(); }
  int local_size() const override { return host_.local_size(); }
  Device device() const override { return Device::kCUDA; }

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
  void set_step(int64_t step) override;
  const CommStats& stats() const override { return stats_; }

  void set_timeout(double timeout_s);
  // NCCL's version as "2.27.3".
  static std::string nccl_version();

  struct State;  // NCCL communicator, streams, monitor thread (nccl_communicator.cc)

 private:
  MpiCommunicator host_;
  CommStats stats_;
  std::unique_ptr<State> state_;
};

}  // namespace ampdist

#endif  // AMPDIST_HAVE_CUDA
