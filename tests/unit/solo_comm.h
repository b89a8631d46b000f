// A Communicator for one process without MPI, for unit tests of code that takes one: its small collectives are
// identities, and the bucket collectives are not used by those tests (they throw).
#pragma once

#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/error.h"

namespace ampdist::testing {

class SoloComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::unique_ptr<Work> allreduce_async(void*, int64_t, DType, ReduceOp, const std::string&) override {
    throw Error("not used");
  }
  std::unique_ptr<Work> reduce_scatter_async(const void*, void*, std::span<const int64_t>, DType,
                                             const std::string&) override {
    throw Error("not used");
  }
  std::unique_ptr<Work> allgather_inplace_async(void*, std::span<const int64_t>, DType, const std::string&) override {
    throw Error("not used");
  }
  void allreduce_f64(std::span<double>, ReduceOp, const std::string&) override {}
  void allreduce_i64(std::span<int64_t>, ReduceOp, const std::string&) override {}
  std::vector<uint64_t> allgather_u64(uint64_t value, const std::string&) override { return {value}; }
  void barrier(const std::string&) override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  void set_step(int64_t) override {}
  const CommStats& stats() const override { return stats_; }

 private:
  CommStats stats_;
};

}  // namespace ampdist::testing
