// Communicator: the collectives the runtime needs, over MPI (CPU buffers) or NCCL (GPU buffers).
//
// Contract (the same as c10d's ProcessGroup, kept deliberately small):
// - Every rank calls the same collectives in the same order, with the same counts and dtypes. A collective is
//   matched by its position in that order, never by a tag; the caller (Reducer, Consensus, Trainer) guarantees it.
// - The *_async calls return a Work handle at once. The buffer belongs to the collective until wait() returns;
//   the caller that issued a Work waits on it, exactly once, before it reads or writes the buffer. For GPU buffers
//   (device() == kCUDA) wait() orders the compute stream after the collective instead of blocking the host: work
//   queued on the compute stream afterwards sees the result.
// - Sums are plain sums in the buffer's dtype. fp16 and bf16 are added in FP32 and rounded back to 16 bits after
//   every addition (NCCL's behaviour), so a rank count alone never changes the result's precision class.
// - Every wait is watched: a collective not complete within the timeout (config comm.timeout_s) prints one line
//   naming it, the step context and this rank, and ends this process with exit code 1, which makes the launcher
//   (mpirun, srun) stop every other rank. No rank is ever left waiting forever.
// - abort() stops the whole job from any rank, at any time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace ampdist {

enum class ReduceOp { kSum, kMax };

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is complete (watched by the timeout).
  virtual void wait() = 0;
};

// Counts of issued collectives, for tests and metrics.
struct CommStats {
  int64_t allreduce = 0;
  int64_t reduce_scatter = 0;
  int64_t allgather = 0;
  int64_t bytes = 0;  // payload bytes this rank contributed
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;  // rank among the processes on this node
  virtual int local_size() const = 0;  // processes on this node
  // Where the buffers of the *_async collectives live: host memory (MPI) or the current GPU (NCCL). A Trainer runs
  // its step on this device.
  virtual Device device() const { return Device::kCPU; }

  // In-place all-reduce of `count` elements of `dtype`. `what` names the collective in timeout messages.
  virtual std::unique_ptr<Work> allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op,
                                                const std::string& what) = 0;
  // Sum-reduce-scatter: every rank contributes send[0 .. sum(counts)); rank r receives the summed elements
  // [displ(r), displ(r) + counts[r]) into recv (counts[r] elements, recv must not alias send).
  virtual std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::span<const int64_t> counts,
                                                     DType dtype, const std::string& what) = 0;
  // In-place all-gather: rank r's counts[r] elements already sit at displ(r) of buf; afterwards every rank holds
  // every rank's part.
  virtual std::unique_ptr<Work> allgather_inplace_async(void* buf, std::span<const int64_t> counts, DType dtype,
                                                        const std::string& what) = 0;

  // Blocking element-wise reductions of small host vectors.
  virtual void allreduce_f64(std::span<double> values, ReduceOp op, const std::string& what) = 0;
  virtual void allreduce_i64(std::span<int64_t> values, ReduceOp op, const std::string& what) = 0;
  // Every rank's `value`, indexed by rank.
  virtual std::vector<uint64_t> allgather_u64(uint64_t value, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;

  // Ends every process of the job with `exit_code`. Never returns.
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // The optimizer step in progress, named in timeout messages ("step 1200: bucket 2 all-reduce ..."); 0 = none.
  virtual void set_step(int64_t step) = 0;
  virtual const CommStats& stats() const = 0;

  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op, const std::string& what) {
    allreduce_async(buf, count, dtype, op, what)->wait();
  }
};

}  // namespace ampdist
